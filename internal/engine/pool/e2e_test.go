package pool_test

import (
	"context"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/oci"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/launcher"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest"
)

// These tests run real sandboxes: root, crun, runc, runsc and the root
// filesystem (VERTAL_E2E=1, as CI sets).

func e2e(t testing.TB) {
	e2etest.Require(t, "real OCI runtimes, root and the rootfs, to run warm sandboxes")
}

func rootfs() string {
	if p := os.Getenv("VERTAL_ROOTFS"); p != "" {
		return p
	}
	return "/var/lib/vertal/images/default/rootfs"
}

// languages of the default image, as the oci driver's own tests use them.
func languages() map[string]engine.Language {
	img := rootfs()
	return map[string]engine.Language{
		"python":     {Name: "python", Image: img, File: "main.py", Command: []string{"python3"}},
		"javascript": {Name: "javascript", Image: img, File: "main.js", Command: []string{"node"}},
		"bash":       {Name: "bash", Image: img, File: "main.sh", Command: []string{"bash"}},
	}
}

var runtimes = []string{"crun", "runc", "runsc", "bwrap"}

// stateDir returns a fresh directory on /run (a tmpfs, like the driver's
// default state dir): on a disk, unlinking the runtime's state files alone
// costs milliseconds.
func stateDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/run", "vertal-pooltest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// newOCI returns a cold driver on a state dir of its own.
func newOCI(t testing.TB, runtime string) *oci.Driver {
	t.Helper()
	d, err := oci.New(context.Background(), oci.Options{Runtime: runtime, StateDir: stateDir(t), CgroupParent: "vertal-pooltest"})
	if err != nil {
		t.Fatalf("oci.New(%s): %v", runtime, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("oci Close: %v", err)
		}
		removeBaseCgroups(d)
	})
	return d
}

// removeBaseCgroups removes a test driver's (empty) base cgroups, which a
// driver keeps for its next start.
func removeBaseCgroups(d *oci.Driver) {
	for _, b := range d.CgroupBases() {
		os.Remove(b)
	}
}

// testLog writes a logger's lines to the test's log.
type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// newWarmOnly returns a pool over d that runs every execution warm: it
// waits for a sandbox rather than going cold, and the test fails if any
// execution missed.
func newWarmOnly(t testing.TB, d *oci.Driver) *pool.Pool {
	t.Helper()
	var langs []engine.Language
	for _, l := range languages() {
		langs = append(langs, l)
	}
	// The pool's warnings (a warm sandbox that could not take an
	// execution, and why) go to the test's log.
	logger := slog.New(slog.NewTextHandler(testLog{t}, nil))
	p := pool.New(d, oci.NewPrestarter(d), pool.Options{Languages: langs, Min: 1, Max: 2, MemoryBytes: 1 << 30, Limits: engine.DefaultLimits(0), WaitReady: 2 * time.Minute, Logger: logger})
	t.Cleanup(func() {
		var misses uint64
		for _, s := range p.Stats() {
			misses += s.Misses
		}
		if misses != 0 {
			t.Errorf("%d executions took the cold path; want every one warm (stats %+v)", misses, p.Stats())
		}
		if err := p.Close(); err != nil {
			t.Errorf("pool Close: %v", err)
		}
	})
	return p
}

type program struct {
	name, lang, code string
	stdin            string
	timeout          time.Duration
	limits           engine.Limits
}

// programs cover what must be identical on both paths: exit codes,
// exceptions and tracebacks, stdin, identity of the main module, output
// caps and timeouts.
func programs() []program {
	var children []program
	for _, c := range securitytest.ChildPrograms() {
		children = append(children, program{name: c.Name, lang: c.Lang, code: c.Code})
	}
	return append(children, []program{
		{name: "hello", lang: "python", code: "print(6*7)"},
		{name: "sys_exit_3", lang: "python", code: "import sys\nprint('before')\nsys.exit(3)\n"},
		{name: "system_exit_message", lang: "python", code: "raise SystemExit('bye')\n"},
		{name: "traceback", lang: "python", code: "def f(x):\n    return 1 / x\n\n\ndef g():\n    return f(0)\n\nprint('start')\ng()\n"},
		{name: "chained_exception", lang: "python", code: "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('v') from e\n"},
		{name: "syntax_error", lang: "python", code: "print('a')\nprint(\n"},
		{name: "keyboard_interrupt", lang: "python", code: "raise KeyboardInterrupt\n"},
		{name: "stdin_echo", lang: "python", code: "import sys\nprint(repr(sys.stdin.read()))\n", stdin: "line one\nline two\n"},
		{name: "input", lang: "python", code: "a = input()\nb = input()\nprint(b, a)\n", stdin: "x\ny\n"},
		{name: "no_stdin", lang: "python", code: "import os, stat, sys\nprint(repr(sys.stdin.read()), stat.S_ISCHR(os.fstat(0).st_mode))\n"},
		{name: "main_module", lang: "python", code: "import sys\nprint(__name__, __file__, sys.argv, sys.path[0], sys.orig_argv, repr(__doc__), __spec__, type(__loader__).__name__)\n"},
		{name: "frames", lang: "python", code: "import sys, traceback, warnings\ndef f(n):\n    try:\n        return f(n + 1)\n    except RecursionError:\n        return n\nprint(f(0), sys._getframe().f_back, len(traceback.format_stack()))\nwarnings.warn('w', stacklevel=2)\n"},
		{name: "child_python", lang: "python", code: "import subprocess, sys\nr = subprocess.run([sys.executable, '-c', 'import sys; print(6*7, sys.stdin.read())'], input='in', capture_output=True, text=True)\nprint(repr(r.stdout), repr(r.stderr), r.returncode)\n"},
		{name: "output_cap", lang: "python", code: "import sys\nsys.stdout.write('x' * 200000)\nsys.stderr.write('y' * 10)\n"},
		{name: "timeout", lang: "python", code: "import time\nprint('started', flush=True)\ntime.sleep(60)\n", timeout: 2 * time.Second},
		{name: "memory_exceeded", lang: "python", code: "b = bytearray(400 << 20)\nprint(len(b))\n"},

		{name: "hello", lang: "javascript", code: "console.log(6*7)"},
		{name: "exit_3", lang: "javascript", code: "console.log('before'); process.exit(3)\n"},
		{name: "throw", lang: "javascript", code: "function f(x) {\n  if (!x) throw new Error('boom');\n}\nconsole.log('start');\nf(0);\n"},
		{name: "syntax_error", lang: "javascript", code: "console.log('a');\nlet x = ;\n"},
		{name: "unhandled_rejection", lang: "javascript", code: "Promise.reject(new Error('rej'));\n"},
		{name: "stdin_echo", lang: "javascript", code: "process.stdout.write(require('fs').readFileSync(0, 'utf8').toUpperCase())\n", stdin: "hello\nworld\n"},
		{name: "no_stdin", lang: "javascript", code: "const fs = require('fs');\nconsole.log(fs.fstatSync(0).isCharacterDevice(), fs.readFileSync(0, 'utf8').length)\n"},
		{name: "main_module", lang: "javascript", code: "console.log(JSON.stringify([process.argv, process.execArgv, require.main === module, __filename, Object.keys(require.cache)]))\n"},
		{name: "child_node", lang: "javascript", code: "const cp = require('child_process');\nif (process.env.CHILD) {\n  console.log('child', JSON.stringify(process.execArgv));\n} else {\n  cp.fork(__filename, [], {env: {...process.env, CHILD: '1'}});\n}\n"},
		{name: "timeout", lang: "javascript", code: "console.log('started'); setInterval(() => {}, 1000)\n", timeout: 2 * time.Second},

		{name: "hello", lang: "bash", code: "echo $((6*7))"},
		{name: "exit_3", lang: "bash", code: "echo before; exit 3\n"},
		{name: "command_not_found", lang: "bash", code: "echo a\nnosuchcommand_x\n"},
		{name: "stdin_echo", lang: "bash", code: "tr a-z A-Z\n", stdin: "hello\nworld\n"},
		{name: "no_stdin", lang: "bash", code: "[ -c /dev/stdin ] && echo chr; cat; echo end\n"},
		// $$ is 6 or 7 on runc depending on how its init's helpers were
		// numbered (seen on cold and warm alike), so only its order of
		// magnitude is compared: the launcher adds no process layers.
		{name: "identity", lang: "bash", code: "echo \"$0\" \"$BASH_SOURCE\" \"$SHLVL\"; [ $$ -le 10 ] && echo low-pid\nexport -p\ntr '\\0' ' ' < /proc/$$/cmdline\n"},
	}...)
}

func runProgram(t *testing.T, d engine.Driver, p program) engine.Result {
	t.Helper()
	timeout := p.timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	res, err := d.Run(context.Background(), enginetest.Complete(engine.Spec{
		ID: "exe_" + strings.ReplaceAll(p.lang+p.name, "_", ""), Language: languages()[p.lang],
		Code: p.code, Stdin: p.stdin, Timeout: timeout, Limits: p.limits,
	}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func TestWarmMatchesCold(t *testing.T) {
	e2e(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newOCI(t, rt)
			warm := newWarmOnly(t, d)
			for _, p := range programs() {
				t.Run(p.lang+"/"+p.name, func(t *testing.T) {
					cold := runProgram(t, d, p)
					got := runProgram(t, warm, p)
					if diff := cmp.Diff(enginetest.OutcomeOf(cold), enginetest.OutcomeOf(got)); diff != "" {
						t.Errorf("warm result differs from cold (-cold +warm):\n%s", diff)
					}
					if got.Duration <= 0 || got.Usage.CPUSeconds <= 0 || got.Usage.PeakMemoryBytes <= 0 {
						t.Errorf("warm usage not measured: duration %v, usage %+v", got.Duration, got.Usage)
					}
				})
			}
		})
	}
}

// TestNothingOfThePrestartLeaks compares what user code can see of its
// process and interpreter on both paths: loaded modules, globals, open
// files, environment, limits and identity (not the pid: runc's is not the
// same from one run to the next). Only the mount table differs
// (python's shadowed sitecustomize), and the mount is read-only.
func TestNothingOfThePrestartLeaks(t *testing.T) {
	e2e(t)
	// Each probe names the program's parent (the sandbox's deadline,
	// timeout) rather than printing its pid, which depends on how many
	// processes the runtime's own set-up made in the namespace first
	// (runc: 6 or 7).
	probes := []program{
		{name: "python", lang: "python", code: `import os, sys, resource, gc
print(sorted(sys.modules))
print(sorted(globals()))
print(sorted(os.listdir('/proc/self/fd')), [os.readlink('/proc/self/fd/%d' % i) for i in (0, 1, 2)])
print(sorted(os.environ.items()))
print(open('/proc/self/cmdline', 'rb').read())
print(open('/proc/%d/comm' % os.getppid()).read().strip(), os.getuid(), os.getgid(), os.getgroups(), os.getcwd())
print([resource.getrlimit(getattr(resource, r)) for r in dir(resource) if r.startswith('RLIMIT_')])
print(open('/proc/self/status').read().split('CapInh')[1].split('voluntary')[0].replace('\t', ' '))
print(sorted(os.listdir('/tmp')), sorted(os.listdir('/code')))
print(sys.flags, sys.warnoptions, sys.path, sys.path_hooks)
print(sorted(k for k in sys.path_importer_cache if not k.startswith('/code')))
import sitecustomize
print(sorted(vars(sitecustomize)))
print(type(sys.stdin).__name__, sys.stdin.encoding, sys.stdin.buffer.raw.name, sys.stdin.isatty())
`},
		{name: "javascript", lang: "javascript", code: `const fs = require('fs');
console.log(JSON.stringify({
  argv: process.argv, execArgv: process.execArgv, main: require.main === module, cache: Object.keys(require.cache),
  modules: process.moduleLoadList, fds: fs.readdirSync('/proc/self/fd').sort(), env: Object.entries(process.env).sort(),
  cmdline: fs.readFileSync('/proc/self/cmdline', 'latin1'), parent: fs.readFileSync('/proc/' + process.ppid + '/comm', 'utf8'),
  uid: process.getuid(), cwd: process.cwd(), globals: Object.keys(globalThis).sort(),
  tmp: fs.readdirSync('/tmp'), code: fs.readdirSync('/code'), paths: module.paths, parent: module.parent,
}));
`},
		{name: "bash", lang: "bash", code: "ls /proc/self/fd; env | sort; export -p; set | grep -v '^PPID=' | sed -E 's/\\b2000[0-9]{6}\\b/UID/g' | md5sum; ls -A /tmp /code; ulimit -a; id; pwd; cat /proc/$PPID/comm\n"},
	}
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newOCI(t, rt)
			warm := newWarmOnly(t, d)
			for _, p := range probes {
				t.Run(p.name, func(t *testing.T) {
					cold := runProgram(t, d, p)
					got := runProgram(t, warm, p)
					if cold.Status != engine.StatusSucceeded {
						t.Fatalf("cold probe failed: %+v", cold)
					}
					if diff := cmp.Diff(normalise(cold.Stdout+cold.Stderr), normalise(knownDifferences(got.Stdout+got.Stderr))); diff != "" {
						t.Errorf("the warm sandbox shows user code something the cold one does not (-cold +warm):\n%s", diff)
					}
				})
			}
		})
	}
}

// normalise drops what differs between any two runs: pipe inodes (gVisor
// numbers them in creation order), object addresses and the sandbox's uid
// (each sandbox leases its own from the uid pool).
func normalise(s string) string {
	s = regexp.MustCompile(`(pipe|host):\[\d+\]`).ReplaceAllString(s, "$1:[]")
	s = regexp.MustCompile(`\b2000\d{6}\b`).ReplaceAllString(s, "UID")
	return regexp.MustCompile(`0x[0-9a-f]+`).ReplaceAllString(s, "0x")
}

// knownDifferences removes what docs/POOL.md lists as visible: node's
// command line carries the preload option (process.argv and
// process.execArgv do not).
func knownDifferences(s string) string {
	return strings.Replace(s, `node\u0000--require\u0000`+launcher.NodePreload+`\u0000`, `node\u0000`, 1)
}

// TestTimeoutCountsFromHandOver runs, with a 1 s timeout, code that takes
// no time in a sandbox that has waited longer than that: only the code's
// time counts.
func TestTimeoutCountsFromHandOver(t *testing.T) {
	e2e(t)
	d := newOCI(t, "crun")
	warm := newWarmOnly(t, d)
	for _, s := range warm.Stats() {
		for s.Ready == 0 {
			time.Sleep(10 * time.Millisecond)
			s = statsFor(warm, s.Language)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	for _, lang := range []string{"python", "javascript", "bash"} {
		res := runProgram(t, warm, program{lang: lang, name: "quick", code: map[string]string{
			"python": "print('ok')", "javascript": "console.log('ok')", "bash": "echo ok",
		}[lang], timeout: time.Second})
		if res.Status != engine.StatusSucceeded || res.Stdout != "ok\n" {
			t.Errorf("%s: %s %q; want succeeded: the wait before the hand-over must not count", lang, res.Status, res.Stdout)
		}
		if res.Duration >= time.Second {
			t.Errorf("%s: duration %v includes the time the sandbox waited", lang, res.Duration)
		}
	}
}

func statsFor(p *pool.Pool, lang string) pool.Stats {
	for _, s := range p.Stats() {
		if s.Language == lang {
			return s
		}
	}
	return pool.Stats{Language: lang}
}

// TestSecuritySuiteThroughPool runs every attack of the security suite in
// warm sandboxes.
func TestSecuritySuiteThroughPool(t *testing.T) {
	e2e(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newOCI(t, rt)
			securitytest.Run(t, newWarmOnly(t, d), languages())
		})
	}
}

// TestNoLeftovers checks that after Close no bundle, cgroup or process of
// a warm sandbox remains.
func TestNoLeftovers(t *testing.T) {
	e2e(t)
	state := stateDir(t)
	d, err := oci.New(context.Background(), oci.Options{Runtime: "crun", StateDir: state, CgroupParent: "vertal-pooltest-leftovers"})
	if err != nil {
		t.Fatal(err)
	}
	var langs []engine.Language
	for _, l := range languages() {
		langs = append(langs, l)
	}
	p := pool.New(d, oci.NewPrestarter(d), pool.Options{Languages: langs, Min: 2, Max: 2, MemoryBytes: 1 << 30, Limits: engine.DefaultLimits(0), Parallel: 2, WaitReady: time.Minute})
	for range 3 {
		runProgram(t, p, program{lang: "python", code: "print(1)"})
	}
	for _, l := range []string{"python", "javascript", "bash"} {
		for statsFor(p, l).Ready < 2 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	defer removeBaseCgroups(d)
	if ents, _ := os.ReadDir(state); len(ents) != 0 {
		t.Errorf("state dir not empty after Close: %v", ents)
	}
	for _, dir := range d.CgroupBases() {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Errorf("base cgroup: %v", err)
		}
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cgroup left behind: %s/%s", dir, e.Name())
			}
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if regexp.MustCompile(regexp.QuoteMeta(state)).Match(mounts) {
		t.Errorf("mounts left under %s", state)
	}
}
