package launcher

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest"
)

// These tests run the launchers on the host's interpreters, without a
// sandbox, and compare each program's outcome with the interpreter running
// the same file directly. The sandboxed comparison (cold driver against
// the pool) is in package pool's end-to-end tests.

type outcome struct {
	Stdout, Stderr string
	ExitCode       int
}

type interp struct {
	lang string   // language of the programs it runs
	kind string   // launcher kind
	file string   // code file name
	argv []string // cold command line without the file
}

func hostInterpreters(t *testing.T) []interp {
	t.Helper()
	ins := []interp{
		{lang: "python", kind: KindPythonMain, file: "main.py", argv: []string{"/usr/bin/python3"}},
		{lang: "bash", kind: KindShell, file: "main.sh", argv: []string{"/usr/bin/bash"}},
	}
	if os.Geteuid() == 0 {
		// Shadowing sitecustomize takes a mount namespace.
		ins = append(ins, interp{lang: "python", kind: KindPythonSite, file: "main.py", argv: []string{"/usr/bin/python3"}})
	} else if os.Getenv("VERTAL_E2E") == "1" {
		t.Fatal("the python-site launcher test needs root")
	}
	for _, in := range ins {
		if _, err := os.Stat(in.argv[0]); err != nil {
			t.Fatalf("%s interpreter missing: %v", in.lang, err)
		}
	}
	rootfs := os.Getenv("VERTAL_ROOTFS")
	if rootfs == "" {
		rootfs = "/var/lib/vertal/images/default/rootfs"
	}
	node := filepath.Join(rootfs, "usr/local/bin/node")
	if _, err := os.Stat(node); err == nil {
		ins = append(ins, interp{lang: "javascript", kind: KindNode, file: "main.js", argv: []string{node}})
	} else if os.Getenv("VERTAL_E2E") == "1" {
		t.Fatalf("node from the sandbox image missing: %v", err)
	}
	return ins
}

// cleanEnv is what the sandbox gives user code; HOME differs only so the
// host test never writes to /tmp's root.
func cleanEnv(dir string) []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir, "LANG=C.UTF-8"}
}

// runCold runs `interp FILE` with the code in place, as the cold path does.
func runCold(t *testing.T, in interp, dir, code string, stdin *string) outcome {
	t.Helper()
	file := filepath.Join(dir, in.file)
	if err := os.WriteFile(file, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(in.argv[0], append(in.argv[1:], file)...)
	cmd.Args[0] = filepath.Base(in.argv[0])
	cmd.Dir, cmd.Env = dir, cleanEnv(dir)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(*stdin)
	}
	return wait(t, cmd)
}

// runWarm starts the launcher, waits for Ready, swaps the file and hands
// over, as a driver's warm sandbox does.
func runWarm(t *testing.T, in interp, dir, code string, stdin *string) outcome {
	t.Helper()
	file := filepath.Join(dir, in.file)
	cold := append(append([]string(nil), in.argv...), file)
	var l Launcher
	switch in.kind {
	case KindPythonMain:
		l = Launcher{Program: pythonMain, Args: cold}
	case KindPythonSite:
		target, orig, err := siteCustomize(os.DirFS("/"), "python3")
		if err != nil {
			t.Fatalf("host sitecustomize: %v", err)
		}
		hook := filepath.Join(t.TempDir(), "sitecustomize.py")
		if err := os.WriteFile(hook, append(append(orig, '\n'), siteHook(file)...), 0o644); err != nil {
			t.Fatal(err)
		}
		// What the runtime's file mount does, in a mount namespace of
		// the test's own; exec keeps the interpreter's argv.
		l = Launcher{Args: append([]string{"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
			`mount --bind "$1" "$2" && shift 2 && unset PWD && exec "$@"`, "sh", hook, target, "python3"}, cold[1:]...)}
	case KindNode:
		// The preload is a file of its own (NodePreload in a sandbox).
		preload := filepath.Join(t.TempDir(), "launcher.js")
		if err := os.WriteFile(preload, nodePreload, 0o644); err != nil {
			t.Fatal(err)
		}
		l = Launcher{Args: []string{cold[0], "--require", preload, file}}
	case KindShell:
		// The shell finds the interpreter on PATH, as tini does.
		l = Launcher{Program: shellLauncher([]string{filepath.Base(cold[0]), file}), Args: cold}
	}
	os.Remove(file)
	if l.Program != nil {
		if err := os.WriteFile(file, l.Program, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(l.Args[0], l.Args[1:]...)
	cmd.Args[0] = filepath.Base(l.Args[0])
	cmd.Dir, cmd.Env = dir, cleanEnv(dir)
	stdinW, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdoutR, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make([]byte, len(Ready))
	if _, err := io.ReadFull(stdoutR, ready); err != nil || string(ready) != Ready {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("launcher not ready: read %q, %v; stderr %q", ready, err, stderr.String())
	}
	if err := os.WriteFile(file+".new", []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".new", file); err != nil {
		t.Fatal(err)
	}
	in2 := append(GoLine(stdin == nil), []byte(deref(stdin))...)
	go func() {
		stdinW.Write(in2)
		stdinW.Close()
	}()
	var stdout bytes.Buffer
	io.Copy(&stdout, stdoutR)
	o := wait(t, cmd)
	o.Stdout = stdout.String()
	o.Stderr = stderr.String()
	return o
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func wait(t *testing.T, cmd *exec.Cmd) outcome {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if cmd.Stdout == nil {
		cmd.Stdout = &stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = &stderr
	}
	if cmd.Process == nil {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("program did not finish")
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
	} else if err != nil {
		t.Fatal(err)
	}
	return outcome{Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: code}
}

func str(s string) *string { return &s }

// program is one case: the same source must give the same outcome warm
// and cold.
type program struct {
	name, lang, code string
	stdin            *string
	// frames marks programs that look at the call stack above the main
	// module, which the python-main launcher adds a frame to.
	frames bool
}

func programs() []program {
	return []program{
		{name: "hello", lang: "python", code: "print(6*7)\n"},
		{name: "exit3", lang: "python", code: "import sys\nprint('before')\nsys.exit(3)\n"},
		{name: "exit_message", lang: "python", code: "raise SystemExit('bye')\n"},
		{name: "exit_none", lang: "python", code: "import sys\nsys.exit()\n"},
		{name: "traceback", lang: "python", code: "import json\n\ndef f(x):\n    return 1 / x\n\ndef g():\n    return f(0)\n\nprint('start')\ng()\n"},
		{name: "chained", lang: "python", code: "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('v') from e\n"},
		{name: "syntax_error", lang: "python", code: "print('a')\nprint(\n"},
		{name: "indentation_error", lang: "python", code: "if True:\nprint(1)\n"},
		{name: "keyboard_interrupt", lang: "python", code: "raise KeyboardInterrupt\n"},
		{name: "excepthook", lang: "python", code: "import sys\ndef h(t, v, tb):\n    import traceback\n    print('hook', t.__name__, [f.lineno for f in traceback.extract_tb(tb)])\nsys.excepthook = h\ndef f():\n    raise RuntimeError('x')\nf()\n"},
		{name: "last_traceback_atexit", lang: "python", code: "import atexit, sys, traceback\natexit.register(lambda: print('atexit', [f.lineno for f in traceback.extract_tb(sys.last_traceback)]))\n1/0\n"},
		{name: "stdin_echo", lang: "python", code: "import sys\ndata = sys.stdin.read()\nprint(repr(data))\n", stdin: str("line one\nline two\n\x00bin")},
		{name: "stdin_input", lang: "python", code: "a = input()\nb = input()\nprint(a[::-1], b)\n", stdin: str("abc\ndef\n")},
		{name: "no_stdin", lang: "python", code: "import os, stat, sys\nprint(repr(sys.stdin.read()), stat.S_ISCHR(os.fstat(0).st_mode), os.readlink('/proc/self/fd/0'))\n"},
		{name: "empty_stdin", lang: "python", code: "import os, stat, sys\nprint(repr(sys.stdin.read()), stat.S_ISFIFO(os.fstat(0).st_mode))\n", stdin: str("")},
		{name: "identity", lang: "python", code: `import sys, os
print(__name__, __file__, repr(__doc__), __spec__, __package__, type(__loader__).__name__, __loader__.path, __cached__)
print(sys.argv, sys.path[0], sys.orig_argv[1:], sys.flags)
print(sorted(globals()))
print(sorted(sys.modules))
print(sorted(os.listdir('/proc/self/fd')))
print(open('/proc/self/cmdline','rb').read().split(b'\0')[1:])
print(sorted(os.environ.items()))
print(__loader__.get_source('__main__') == open(__file__).read())
`},
		{name: "docstring_and_annotations", lang: "python", code: "'''doc'''\nx: int = 1\nprint(__doc__, __annotations__)\n"},
		{name: "threads_and_atexit", lang: "python", code: "import atexit, threading\natexit.register(print, 'bye')\nt = threading.Thread(target=lambda: print('thread'))\nt.start()\nprint('main')\n"},
		{name: "coding_cookie", lang: "python", code: "# -*- coding: latin-1 -*-\nprint(len('\xe9'))\n"},
		{name: "nul_byte", lang: "python", code: "print(1)\x00\n"},
		{name: "signal_self", lang: "python", code: "import os, signal\nprint('x', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)\n"},
		{name: "frames", lang: "python", frames: true, code: "import sys, traceback, warnings\ndef f(n):\n    try:\n        return f(n + 1)\n    except RecursionError:\n        return n\nprint(f(0), sys._getframe().f_back, len(traceback.format_stack()))\nwarnings.warn('w', stacklevel=2)\n"},
		{name: "child_python", lang: "python", code: "import subprocess, sys\nr = subprocess.run([sys.executable, '-c', 'import sys; print(6*7, sys.stdin.read())'], input='in', capture_output=True, text=True)\nprint(repr(r.stdout), repr(r.stderr), r.returncode)\n"},
		{name: "child_main_again", lang: "python", code: "import os, subprocess, sys\nif os.environ.get('CHILD'):\n    print('child', sys.argv)\nelse:\n    print(subprocess.run([sys.executable, __file__], env={**os.environ, 'CHILD': '1'}, capture_output=True, text=True).stdout, end='')\n"},
		{name: "globals_redefined", lang: "python", code: "__vertal_launch = 1\nprint(sorted(k for k in globals() if 'vertal' in k))\nraise ValueError(__vertal_launch)\n"},

		{name: "hello", lang: "javascript", code: "console.log(6*7)\n"},
		{name: "child_node", lang: "javascript", code: "const cp = require('child_process');\nif (process.env.CHILD) {\n  console.log('child', JSON.stringify(process.execArgv));\n} else {\n  console.log(JSON.stringify(cp.execFileSync(process.execPath, ['-e', 'console.log(process.execArgv.length, 6*7)'], {input: 'x'}).toString()));\n  cp.fork(__filename, [], {env: {...process.env, CHILD: '1'}});\n}\n"},
		{name: "exit3", lang: "javascript", code: "console.log('before'); process.exit(3)\n"},
		{name: "exit_code_prop", lang: "javascript", code: "process.exitCode = 4\n"},
		{name: "throw", lang: "javascript", code: "function f(x) {\n  if (!x) throw new Error('boom');\n}\nconsole.log('start');\nf(0);\n"},
		{name: "throw_string", lang: "javascript", code: "throw 'plain'\n"},
		{name: "syntax_error", lang: "javascript", code: "console.log('a');\nlet x = ;\n"},
		{name: "esm_syntax", lang: "javascript", code: "import fs from 'node:fs';\nconsole.log(typeof fs.readFileSync, typeof require);\n"},
		{name: "unhandled_rejection", lang: "javascript", code: "Promise.reject(new Error('rej'));\n"},
		{name: "async_throw", lang: "javascript", code: "setTimeout(() => { throw new TypeError('later') }, 1);\n"},
		{name: "stdin_echo", lang: "javascript", code: "process.stdout.write(require('fs').readFileSync(0, 'utf8').toUpperCase())\n", stdin: str("hello\nworld\n")},
		{name: "stdin_stream", lang: "javascript", code: "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>console.log(JSON.stringify(s), process.stdin.constructor.name))\n", stdin: str("abc\n")},
		{name: "no_stdin", lang: "javascript", code: "const fs=require('fs');console.log(fs.fstatSync(0).isCharacterDevice(), fs.readlinkSync('/proc/self/fd/0'), fs.readFileSync(0,'utf8').length);process.stdin.on('end',()=>console.log('end', process.stdin.constructor.name)).resume()\n"},
		{name: "identity", lang: "javascript", code: `const fs = require('fs');
console.log(JSON.stringify({argv: process.argv.slice(1), execArgv: process.execArgv, main: require.main === module,
  cache: Object.keys(require.cache), fn: __filename, dir: __dirname, parent: module.parent, id: module.id,
  paths: module.paths, mll: process.moduleLoadList, fds: fs.readdirSync('/proc/self/fd').sort(),
  env: process.env, title: process.title, mainModule: process.mainModule === module, loaded: module.loaded,
  children: module.children.length}));
`},

		{name: "hello", lang: "bash", code: "echo $((6*7))\n"},
		{name: "child_shell", lang: "bash", code: "echo in | bash -c 'read x; echo got $x'; bash -c 'echo $SHLVL'\n"},
		{name: "exit3", lang: "bash", code: "echo before; exit 3\n"},
		{name: "errexit", lang: "bash", code: "set -e\necho a\nfalse\necho b\n"},
		{name: "command_not_found", lang: "bash", code: "echo a\nnosuchcommand_x\n"},
		{name: "syntax_error", lang: "bash", code: "echo a\nif then fi\n"},
		{name: "stdin_echo", lang: "bash", code: "tr a-z A-Z\n", stdin: str("hello\nworld\n")},
		{name: "stdin_read", lang: "bash", code: "read -r a; read -r b; echo \"$b $a\"; cat\n", stdin: str("one\ntwo\nthree\n")},
		{name: "no_stdin", lang: "bash", code: "[ -c /dev/stdin ] && echo chr; readlink /proc/self/fd/0; cat; echo end\n"},
		{name: "identity", lang: "bash", code: "echo \"$0\" \"$BASH_SOURCE\" \"$SHLVL\" \"$$\" \"$#\"\nexport -p\nset | grep -v -e '^BASHPID=' -e '^PPID=' -e '^_=' -e '^BASH_ARGV' -e '^RANDOM=' -e '^SRANDOM=' -e '^EPOCH' -e '^SECONDS=' -e '^LINENO=' | md5sum\nls /proc/self/fd\ntr '\\0' ' ' < /proc/$$/cmdline; echo\nenv | sort\n"},
	}
}

func TestLaunchersMatchDirectRun(t *testing.T) {
	dir := t.TempDir()
	all := programs()
	for _, c := range securitytest.ChildPrograms() {
		all = append(all, program{name: c.Name, lang: c.Lang, code: c.Code})
	}
	for _, in := range hostInterpreters(t) {
		for _, p := range all {
			if p.lang != in.lang || p.frames && in.kind == KindPythonMain {
				continue
			}
			t.Run(in.kind+"/"+p.name, func(t *testing.T) {
				want := runCold(t, in, dir, p.code, p.stdin)
				got := runWarm(t, in, dir, p.code, p.stdin)
				if p.lang == "bash" && p.name == "identity" {
					// $$ and the cmdline differ by pid only.
					want.Stdout = dropFirstLine(want.Stdout)
					got.Stdout = dropFirstLine(got.Stdout)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("warm run differs from the direct run (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func dropFirstLine(s string) string {
	_, rest, _ := strings.Cut(s, "\n")
	return rest
}

func TestFor(t *testing.T) {
	py := engine.Language{Name: "python", File: "main.py"}
	js := engine.Language{Name: "javascript", File: "main.js"}
	sh := engine.Language{Name: "bash", File: "main.sh"}
	for _, tc := range []struct {
		lang     engine.Language
		argv     []string
		wantKind string
		wantArgs []string
	}{
		{py, []string{"python3", "/code/main.py"}, KindPythonMain, []string{"python3", "/code/main.py"}},
		{py, []string{"/usr/bin/python3.11", "-u", "/code/main.py"}, KindPythonMain, []string{"/usr/bin/python3.11", "-u", "/code/main.py"}},
		{py, []string{"python3", "-m", "/code/main.py"}, "", nil},
		{py, []string{"python3", "-c", "/code/main.py"}, "", nil},
		{py, []string{"python3", "/code/other.py"}, "", nil},
		{js, []string{"node", "/code/main.js"}, KindNode, []string{"node", "--require", NodePreload, "/code/main.js"}},
		{js, []string{"node", "--max-old-space-size=100", "/code/main.js"}, "", nil},
		{sh, []string{"bash", "/code/main.sh"}, KindShell, []string{"bash", "/code/main.sh"}},
		{sh, []string{"ruby", "/code/main.sh"}, "", nil},
	} {
		l, err := For(tc.lang, tc.argv, nil)
		if tc.wantKind == "" {
			if !errors.Is(err, ErrUnsupported) {
				t.Errorf("For(%v) = %v, %v; want ErrUnsupported", tc.argv, l.Kind, err)
			}
			continue
		}
		if err != nil || l.Kind != tc.wantKind || !cmp.Equal(l.Args, tc.wantArgs) || len(l.Program)+len(l.Files) == 0 {
			t.Errorf("For(%v) = %q %v, %v; want %q %v", tc.argv, l.Kind, l.Args, err, tc.wantKind, tc.wantArgs)
		}
	}
}
