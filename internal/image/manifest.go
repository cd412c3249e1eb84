package image

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Manifest is image.json: what an image is made of, as the API lists it
// (GET /v1/images) and as --from extends it. The JSON shape is a contract
// with the server.
type Manifest struct {
	Name    string    `json:"name"`
	Version string    `json:"version"` // the build's id (versions/<id>)
	BuiltAt time.Time `json:"built_at"`
	// From is the image this one extends, as "name@version".
	From string `json:"from,omitempty"`
	// Recipe is what was asked for, the base's recipe included.
	Recipe    Recipe   `json:"recipe"`
	Languages Versions `json:"languages"`
	// Packages are the exact versions installed, by source.
	Packages Packages `json:"packages"`
}

// Recipe is the packages asked for by name.
type Recipe struct {
	Apt    []string `json:"apt,omitempty"`
	Npm    []string `json:"npm,omitempty"`
	Wheels []string `json:"wheels,omitempty"` // file names of the wheelhouse's wheels
}

// Packages map name to installed version.
type Packages struct {
	Dpkg map[string]string `json:"dpkg"`
	Npm  map[string]string `json:"npm"`
	Pip  map[string]string `json:"pip"`
}

// Package is one main package of an image: one the recipe asked for.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Source  string `json:"source"` // "apt", "npm" or "pip"
}

// Main lists the packages the recipe asked for with their installed
// versions, sorted by source then name: what an agent may import.
func (m Manifest) Main() []Package {
	out := []Package{}
	for _, a := range m.Recipe.Apt {
		name, _, _ := strings.Cut(a, "=")
		out = append(out, Package{Name: name, Version: m.Packages.Dpkg[name], Source: "apt"})
	}
	for _, n := range m.Recipe.Npm {
		name := npmName(n)
		out = append(out, Package{Name: name, Version: m.Packages.Npm[name], Source: "npm"})
	}
	for _, w := range m.Recipe.Wheels {
		name := normalizePip(strings.SplitN(w, "-", 2)[0])
		out = append(out, Package{Name: name, Version: m.Packages.Pip[name], Source: "pip"})
	}
	return out
}

// ReadManifest loads DIR/image.json of an image directory.
func ReadManifest(dir string) (Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return Manifest{}, fmt.Errorf("reading image manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("parsing %s: %w", filepath.Join(dir, ManifestFile), err)
	}
	return m, nil
}

func writeManifest(dir string, m Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileSync(filepath.Join(dir, ManifestFile), append(b, '\n'), 0o644)
}

// installedPackages reads what is installed in rootfs from dpkg's status
// file, npm's global node_modules and pip's dist-info directories.
func installedPackages(rootfs string) (Packages, error) {
	p := Packages{Dpkg: map[string]string{}, Npm: map[string]string{}, Pip: map[string]string{}}
	f, err := os.Open(filepath.Join(rootfs, "var/lib/dpkg/status"))
	if err != nil {
		return p, err
	}
	defer f.Close()
	if p.Dpkg, err = parseDpkgStatus(f); err != nil {
		return p, err
	}
	if p.Npm, err = npmInstalled(filepath.Join(rootfs, npmGlobal)); err != nil {
		return p, err
	}
	dists, _ := filepath.Glob(filepath.Join(rootfs, "usr/local/lib/python3*/dist-packages/*.dist-info"))
	for _, d := range dists {
		name, version := distInfo(filepath.Join(d, "METADATA"))
		if name != "" {
			p.Pip[normalizePip(name)] = version
		}
	}
	return p, nil
}

// parseDpkgStatus returns the installed packages of a dpkg status file.
func parseDpkgStatus(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var name, version, status string
	flush := func() {
		if name != "" && strings.HasSuffix(status, " installed") {
			out[name] = version
		}
		name, version, status = "", "", ""
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "Package: "):
			name = strings.TrimPrefix(line, "Package: ")
		case strings.HasPrefix(line, "Version: "):
			version = strings.TrimPrefix(line, "Version: ")
		case strings.HasPrefix(line, "Status: "):
			status = strings.TrimPrefix(line, "Status: ")
		}
	}
	flush()
	return out, sc.Err()
}

// npmInstalled reads name and version of each package in a node_modules.
func npmInstalled(dir string) (map[string]string, error) {
	out := map[string]string{}
	pkgs, _ := filepath.Glob(filepath.Join(dir, "*", "package.json"))
	scoped, _ := filepath.Glob(filepath.Join(dir, "@*", "*", "package.json"))
	for _, pj := range append(pkgs, scoped...) {
		b, err := os.ReadFile(pj)
		if err != nil {
			return nil, err
		}
		var meta struct{ Name, Version string }
		if err := json.Unmarshal(b, &meta); err != nil {
			return nil, fmt.Errorf("%s: %w", pj, err)
		}
		if meta.Name != "" {
			out[meta.Name] = meta.Version
		}
	}
	return out, nil
}

// distInfo reads Name and Version from a wheel's METADATA.
func distInfo(path string) (name, version string) {
	f, err := os.Open(path)
	if err != nil {
		return "", ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() && (name == "" || version == "") {
		line := sc.Text()
		if line == "" {
			break
		}
		if v, ok := strings.CutPrefix(line, "Name: "); ok {
			name = v
		} else if v, ok := strings.CutPrefix(line, "Version: "); ok {
			version = v
		}
	}
	return name, version
}

var pipNormRe = regexp.MustCompile(`[-_.]+`)

// normalizePip is a distribution name as PEP 503 compares them.
func normalizePip(name string) string { return strings.ToLower(pipNormRe.ReplaceAllString(name, "-")) }

func sortedUnique(in []string) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}
