package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
)

// LanguageOverride replaces parts of a built-in language definition, for
// operators who point a language at another image. Empty fields keep the
// built-in value.
type LanguageOverride struct {
	Image   string   `json:"image"`
	Version string   `json:"version"`
	File    string   `json:"file"`
	Command []string `json:"command"`
}

// builtins are the languages the default image provides (package lang).
// The code file's path is the command's last argument, as engine.Language
// requires.
var builtins = func() []engine.Language {
	out := make([]engine.Language, len(lang.All))
	for i, d := range lang.All {
		out[i] = engine.Language{Name: d.Name, File: d.File, Command: []string{d.Interpreter, engine.CodeDir + "/" + d.File}}
	}
	return out
}()

func builtinLanguage(name string) (engine.Language, bool) {
	for _, l := range builtins {
		if l.Name == name {
			l.Command = append([]string(nil), l.Command...)
			return l, true
		}
	}
	return engine.Language{}, false
}

// VersionsFile is written by `vertal image build` next to rootfs/.
const VersionsFile = "versions.json"

// RootFS is the root filesystem directory the oci driver uses.
func (c Config) RootFS() string { return filepath.Join(c.ImageDir, "rootfs") }

// ResolveLanguages returns the runnable languages for c's driver: the image
// is the rootfs directory for oci and the Docker image for docker, and the
// version comes from ImageDir/versions.json (empty when that file is
// missing, which is not an error: the image may have been built by hand).
func (c Config) ResolveLanguages() ([]engine.Language, error) {
	versions, err := readVersions(filepath.Join(c.ImageDir, VersionsFile))
	if err != nil {
		return nil, err
	}
	image := c.RootFS()
	if c.Driver == "docker" {
		image = c.DockerImage
	}
	out := make([]engine.Language, 0, len(builtins))
	for _, b := range builtins {
		l, _ := builtinLanguage(b.Name)
		l.Image = image
		l.Version = versions[l.Name]
		if o, ok := c.Languages[l.Name]; ok {
			if o.Image != "" {
				l.Image = o.Image
			}
			if o.Version != "" {
				l.Version = o.Version
			}
			if o.File != "" {
				l.File = o.File
			}
			if len(o.Command) > 0 {
				l.Command = append([]string(nil), o.Command...)
			}
			if o.File != "" && len(o.Command) == 0 {
				l.Command[len(l.Command)-1] = engine.CodeDir + "/" + l.File
			}
		}
		out = append(out, l)
	}
	return out, nil
}

func readVersions(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading image versions: %w", err)
	}
	var v map[string]string
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("image versions file %s: %w", path, err)
	}
	return v, nil
}
