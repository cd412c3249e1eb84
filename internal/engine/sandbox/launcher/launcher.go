// Package launcher holds the small programs that wait inside a pre-started
// sandbox for the code of one execution.
//
// A warm sandbox is created like a cold one, with the cold path's command
// line, limits and mounts, plus what its launcher needs. The launcher lets
// the interpreter start, writes Ready to stdout and blocks reading one line
// from stdin. At hand-over the host writes the user's code to
// engine.CodeDir/File from the host side (through the read-only bind
// mount), then the go line (GoLine), then the user's stdin, and closes
// stdin. From there the interpreter runs the file as the cold path would:
//
//   - python: the image's sitecustomize module, which the interpreter
//     imports at the end of start-up, is shadowed by a copy with a hook
//     appended (one read-only file mount). The hook waits, then returns;
//     the interpreter goes on to run /code/main.py itself, so argv,
//     sys.path, __main__, tracebacks, exit codes and frame depth are the
//     cold path's. Images without sitecustomize.py get the main-script
//     launcher instead (see python_main.py and its documented differences).
//   - javascript: node preloads the launcher (--require NodePreload, a
//     read-only file of its own); after the go line node loads the user's
//     file as the main module through its ordinary path, so stack traces
//     are identical. Node gives every worker thread the process's preload
//     too: there the launcher only removes itself, so a worker runs its
//     own code alone, as on the cold path.
//   - bash (any POSIX shell): the launcher reads the go line and execs the
//     cold path's command line; the saving is the sandbox, not the shell.
//
// The protocol is private between this package and the drivers' warm
// sandboxes; user code only runs after the go line was consumed.
package launcher

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// Ready is what a launcher writes to stdout once the interpreter is up.
// Nothing precedes it, and the host consumes exactly these bytes before
// it captures output.
const Ready = "\x00vertal-ready\x00"

// ExitNoGo is the exit status of a launcher whose stdin closed before the
// go line: the host discarded the sandbox.
const ExitNoGo = 111

// GoLine is what the host writes to start the code. Its stdin stays the
// pipe the go line came through, followed by the user's stdin and EOF,
// unless devNull is set: then the launcher reopens fd 0 on /dev/null
// first, for drivers whose cold path gives code without stdin /dev/null
// (the oci driver always gives a pipe; Docker gives /dev/null).
func GoLine(devNull bool) []byte {
	if devNull {
		return []byte("0\n")
	}
	return []byte("1\n")
}

// ErrUnsupported means no launcher fits the language's command line or
// image; the language runs on the cold path only.
var ErrUnsupported = errors.New("launcher: no launcher for this interpreter")

var (
	//go:embed python_site.py
	pythonSiteHook []byte
	//go:embed python_main.py
	pythonMain []byte
	//go:embed node.js
	nodePreload []byte
)

// Kinds of launcher.
const (
	KindPythonSite = "python-site" // hook in a shadowed sitecustomize
	KindPythonMain = "python-main" // launcher as the main script
	KindNode       = "node"        // --require preload
	KindShell      = "shell"       // read, then exec
)

// NodePreload is where node's launcher is mounted. It is not the main
// module's path: node preloads it again in every worker thread, where the
// main module's path holds the user's code by then (which then ran once
// more in each worker). /dev is a tmpfs of the sandbox's own under every
// runtime but bwrap, whose shared /dev has an empty file there for the
// mount (see package oci).
const NodePreload = "/dev/vertal-launcher.js"

// Launcher is how one language starts in a warm sandbox.
type Launcher struct {
	Kind string
	// Program is the content of engine.CodeDir/File while the sandbox
	// waits, or nil when the file must not exist until hand-over. The
	// host replaces it with the user's code (atomically: write and
	// rename) before it writes the go line.
	Program []byte
	// Args is the sandbox's command line.
	Args []string
	// Files are bind-mounted read-only over files of the image (or, for
	// NodePreload, into /dev).
	Files []File
}

// File replaces one file of the image inside a warm sandbox.
type File struct {
	Target  string // absolute path in the image, symlinks resolved
	Content []byte
}

// For returns the launcher for a language whose cold-path command line is
// argv (interpreter first, the code file engine.CodeDir/File last). image
// is the language's root filesystem, or nil when the driver cannot read it
// (the python launcher then cannot shadow sitecustomize).
func For(lang engine.Language, argv []string, image fs.FS) (Launcher, error) {
	file := path.Join(engine.CodeDir, lang.File)
	if len(argv) < 2 || argv[len(argv)-1] != file || !plainPath.MatchString(file) {
		return Launcher{}, ErrUnsupported
	}
	base := path.Base(argv[0])
	switch {
	case strings.HasPrefix(base, "python") && plainPythonOptions(argv[1:len(argv)-1]):
		if image != nil {
			if target, orig, err := siteCustomize(image, argv[0]); err == nil {
				content := append(append(append([]byte(nil), orig...), '\n'), siteHook(file)...)
				return Launcher{Kind: KindPythonSite, Args: clone(argv), Files: []File{{Target: target, Content: content}}}, nil
			}
		}
		return Launcher{Kind: KindPythonMain, Program: pythonMain, Args: clone(argv)}, nil
	case (base == "node" || base == "nodejs") && len(argv) == 2:
		return Launcher{Kind: KindNode, Args: []string{argv[0], "--require", NodePreload, file},
			Files: []File{{Target: NodePreload, Content: nodePreload}}}, nil
	case base == "bash" || base == "sh" || base == "dash":
		return Launcher{Kind: KindShell, Program: shellLauncher(argv), Args: clone(argv)}, nil
	}
	return Launcher{}, ErrUnsupported
}

// siteHook is the sitecustomize hook for a main file at path (absolute,
// of plain characters, so a Python bytes literal needs no escaping).
func siteHook(path string) []byte {
	return bytes.Replace(pythonSiteHook, []byte("@@CODE_FILE@@"), []byte(`b"`+path+`"`), 1)
}

// plainPythonOptions accepts interpreter flags such as -u or -B, but not
// those that change what runs (-c, -m, -i), skip site (-S, so no hook), or
// take a separate argument the launcher cannot tell from the file.
func plainPythonOptions(opts []string) bool {
	for _, o := range opts {
		if !strings.HasPrefix(o, "-") || o == "-" || o == "--" || strings.HasPrefix(o, "--") {
			return false
		}
		if strings.ContainsAny(o[1:], "cmiSXW") {
			return false
		}
	}
	return true
}

// plainPath is what a code file's path may contain, so the launchers can
// embed it without quoting.
var plainPath = regexp.MustCompile(`^/[A-Za-z0-9_./-]+$`)

var pythonVersion = regexp.MustCompile(`^python(\d+\.\d+)$`)

// siteCustomize finds the sitecustomize.py the interpreter argv0 imports
// from its standard library in image, and returns its resolved path and
// content. Debian and Ubuntu ship one; most other images do not.
func siteCustomize(image fs.FS, argv0 string) (string, []byte, error) {
	bin, err := lookPath(image, argv0)
	if err != nil {
		return "", nil, err
	}
	m := pythonVersion.FindStringSubmatch(path.Base(bin))
	if m == nil {
		return "", nil, fmt.Errorf("interpreter %s: no version in its name", bin)
	}
	prefix := path.Dir(path.Dir(bin))
	target, err := resolve(image, path.Join(prefix, "lib", "python"+m[1], "sitecustomize.py"))
	if err != nil {
		return "", nil, err
	}
	fi, err := fs.Stat(image, target[1:])
	if err != nil || !fi.Mode().IsRegular() {
		return "", nil, fmt.Errorf("sitecustomize %s: not a regular file", target)
	}
	b, err := fs.ReadFile(image, target[1:])
	return target, b, err
}

// lookPath finds a command in the image as the sandbox's PATH would, and
// resolves symlinks.
func lookPath(image fs.FS, name string) (string, error) {
	if strings.Contains(name, "/") {
		return resolve(image, path.Clean("/"+name))
	}
	for _, kv := range sandbox.Env() {
		if dirs, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, dir := range strings.Split(dirs, ":") {
				p, err := resolve(image, path.Join(dir, name))
				if err != nil {
					continue
				}
				if fi, err := fs.Stat(image, p[1:]); err == nil && fi.Mode().IsRegular() {
					return p, nil
				}
			}
		}
	}
	return "", fmt.Errorf("%s: not found in the image", name)
}

// resolve follows symlinks in p (absolute, within image) component by
// component, as the kernel would with image as its root.
func resolve(image fs.FS, p string) (string, error) {
	parts := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
	cur := "/"
	for hops := 0; len(parts) > 0; {
		next := path.Join(cur, parts[0])
		parts = parts[1:]
		if next == "/" {
			continue
		}
		target, err := fs.ReadLink(image, next[1:])
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) && !errors.Is(err, fs.ErrNotExist) {
				// Not a symlink.
				cur = next
				continue
			}
			return "", err
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", p)
		}
		if strings.HasPrefix(target, "/") {
			cur = "/"
		}
		parts = append(strings.Split(strings.Trim(path.Clean(target), "/"), "/"), parts...)
	}
	return cur, nil
}

// shellLauncher waits for the go line, then execs the cold path's command.
// `read` takes one byte at a time from a pipe, so the user's stdin stays
// untouched; exec keeps the pid, and bash lowers SHLVL again before it
// execs, so the environment is the cold path's.
func shellLauncher(argv []string) []byte {
	var b strings.Builder
	b.WriteString("printf '\\000vertal-ready\\000'\n")
	b.WriteString("IFS= read -r __vertal_go || exit 111\n")
	b.WriteString("[ \"$__vertal_go\" = 0 ] && exec </dev/null\n")
	b.WriteString("exec")
	for _, a := range argv {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString("\n")
	return []byte(b.String())
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func clone(s []string) []string { return append([]string(nil), s...) }
