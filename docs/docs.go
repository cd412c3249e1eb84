// Package docs carries the project's Markdown documentation into the binary.
//
// The Markdown files in this directory are the documentation: they read
// well on GitHub, and internal/web renders the same files as the /docs/
// pages of every server. go:embed cannot reach files outside the embedding
// package's directory, so this package sits beside them and does nothing
// but embed them; a new *.md file here becomes a page with no other change.
package docs

import (
	"embed"
	"io/fs"
)

//go:embed *.md
var files embed.FS

// FS returns the Markdown files, at the root of the file system
// (QUICKSTART.md, ARCHITECTURE.md, ...).
func FS() fs.FS { return files }
