package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// VersionsFile is the name, inside an image directory, of the file that
// records each language's interpreter version. The API reports these.
const VersionsFile = "versions.json"

// RootfsDir is the name of the root filesystem inside an image directory.
const RootfsDir = "rootfs"

// Versions are the interpreter versions found by running them inside the
// built root filesystem. The JSON shape is a contract with the API server.
type Versions struct {
	Python     string `json:"python"`
	JavaScript string `json:"javascript"`
	Bash       string `json:"bash"`
}

// ByLanguage returns the version of a language by its canonical name.
func (v Versions) ByLanguage(name string) string {
	switch name {
	case "python":
		return v.Python
	case "javascript":
		return v.JavaScript
	case "bash":
		return v.Bash
	}
	return ""
}

var (
	pythonVersionRe = regexp.MustCompile(`^Python (\d+\.\d+\.\d+)\S*\s*$`)
	nodeVersionRe   = regexp.MustCompile(`^v(\d+\.\d+\.\d+)\s*$`)
	bashVersionRe   = regexp.MustCompile(`^GNU bash, version (\d+\.\d+\.\d+)`)
)

// ParsePythonVersion reads the output of `python3 --version`.
func ParsePythonVersion(out string) (string, error) {
	return parseVersion("python3 --version", pythonVersionRe, out)
}

// ParseNodeVersion reads the output of `node --version`.
func ParseNodeVersion(out string) (string, error) {
	return parseVersion("node --version", nodeVersionRe, out)
}

// ParseBashVersion reads the output of `bash --version`; only the first
// line matters (the rest is the licence).
func ParseBashVersion(out string) (string, error) {
	return parseVersion("bash --version", bashVersionRe, out)
}

// ErrBadVersion means an interpreter printed something that is not the
// version line we expect, which usually means it did not run properly.
var ErrBadVersion = errors.New("unrecognised version output")

func parseVersion(what string, re *regexp.Regexp, out string) (string, error) {
	first, _, _ := strings.Cut(strings.TrimLeft(out, "\r\n\t "), "\n")
	m := re.FindStringSubmatch(strings.TrimRight(first, "\r"))
	if m == nil {
		return "", fmt.Errorf("%s printed %q: %w", what, truncate(out, 120), ErrBadVersion)
	}
	return m[1], nil
}

// ReadVersions loads DIR/versions.json of an image directory.
func ReadVersions(dir string) (Versions, error) {
	b, err := os.ReadFile(filepath.Join(dir, VersionsFile))
	if err != nil {
		return Versions{}, fmt.Errorf("reading image versions: %w", err)
	}
	var v Versions
	if err := json.Unmarshal(b, &v); err != nil {
		return Versions{}, fmt.Errorf("parsing %s: %w", filepath.Join(dir, VersionsFile), err)
	}
	return v, nil
}

// writeVersions writes versions.json durably (it is read by the server).
func writeVersions(dir string, v Versions) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeFileSync(filepath.Join(dir, VersionsFile), append(b, '\n'), 0o644)
}

func writeFileSync(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
