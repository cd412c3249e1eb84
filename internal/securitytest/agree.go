package securitytest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// agreeTimeout is each behaviour's timeout, and agreeLimits are a pro
// plan's: 512 MiB, and the engine's fixed CPU, process and file limits.
const agreeTimeout = 30 * time.Second

var agreeLimits = func() engine.Limits {
	l := engine.DefaultLimits(agreeTimeout)
	l.MemoryBytes = 512 << 20
	return l
}()

// behaviour is one program of the agreement table and the one outcome
// every driver and runtime must give it.
type behaviour struct {
	name, lang, code string
	stdin            string
	status           engine.Status
	exit             int
	// check asserts more of the outcome; nil for none.
	check func(t *testing.T, res engine.Result)
}

// behaviours keep the drivers in step: each program runs with the same
// limits on every driver/runtime pair, cold and warm, and must end the same
// way everywhere. Programs sit well clear of a limit unless crossing it is
// the point, so the sentry's memory under gVisor (about 15 MiB) or a busy
// host cannot tip one pair over.
func behaviours() []behaviour {
	lim := agreeLimits
	return []behaviour{
		{
			// Issue 20: the standard streams by name. Under bwrap the
			// pipes belonged to the host's root, which the sandbox's
			// user namespace does not map, so opening them was EACCES.
			name: "dev_stdio_bash", lang: "bash", stdin: "21\n", status: engine.StatusSucceeded,
			code:  "read n < /dev/stdin\necho err > /dev/stderr\necho $((n * 2)) > /dev/stdout\n",
			check: func(t *testing.T, res engine.Result) { wantEqual(t, res, "42\n", "err\n") },
		},
		{
			// The usual competitive-programming reader.
			name: "dev_stdio_javascript", lang: "javascript", stdin: "20 22\n", status: engine.StatusSucceeded,
			code: `const fs = require('fs');
const [a, b] = fs.readFileSync('/dev/stdin', 'utf8').trim().split(' ').map(Number);
fs.writeFileSync('/dev/stderr', 'err\n');
fs.writeFileSync('/dev/stdout', String(a + b) + '\n');
`,
			check: func(t *testing.T, res engine.Result) { wantEqual(t, res, "42\n", "err\n") },
		},
		{
			name: "dev_stdio_python", lang: "python", stdin: "6 7\n", status: engine.StatusSucceeded,
			code: `import math
a = open('/dev/stdin').read().split()
open('/dev/stderr', 'w').write('err\n')
with open('/dev/stdout', 'w') as f:
    f.write(str(math.prod(map(int, a))) + '\n')
`,
			check: func(t *testing.T, res engine.Result) { wantEqual(t, res, "42\n", "err\n") },
		},
		{
			// Issue 20: no /dev/shm, so multiprocessing's locks (SemLock)
			// failed with FileNotFoundError. Pool is Python's own first
			// example, here with the default start method (fork); under
			// runsc a semaphore that another process opens by name (the
			// spawn and forkserver methods) is not shared (docs/SECURITY.md).
			name: "multiprocessing_pool", lang: "python", status: engine.StatusSucceeded,
			code: `
import multiprocessing as mp
def sq(x):
    return x * x
if __name__ == "__main__":
    with mp.Pool(2) as p:
        print(mp.get_start_method(), sum(p.map(sq, range(100))))
    q = mp.Queue()
    q.put("queued")
    print(q.get())
`,
			check: func(t *testing.T, res engine.Result) {
				wantEqual(t, res, "fork 328350\nqueued\n", "")
			},
		},
		{
			// /dev/shm is the sandbox's own tmpfs: capped, and what is
			// written there counts against the sandbox's memory. (That
			// nothing written there runs is the noexec probes'.)
			name: "dev_shm_capped_and_charged", lang: "python", status: engine.StatusSucceeded,
			code: `
import errno
n, chunk = 0, b"\1" * (1 << 20)  # RLIMIT_FSIZE: one MiB a file
try:
    for i in range(1024):
        with open("/dev/shm/fill%d" % i, "wb") as f:
            f.write(chunk)
        n += 1
except OSError as e:
    print("stopped", errno.errorcode[e.errno])
print("MiB", n)
`,
			check: func(t *testing.T, res engine.Result) {
				shm := sandbox.ShmBytes(lim)
				wantEqual(t, res, fmt.Sprintf("stopped ENOSPC\nMiB %d\n", shm>>20), "")
				if res.Usage.PeakMemoryBytes < shm {
					t.Errorf("peak memory %d MiB; want at least /dev/shm's %d MiB", res.Usage.PeakMemoryBytes>>20, shm>>20)
				}
			},
		},
		{
			// Issue 9: ran on oci+crun, "memory_exceeded" elsewhere.
			name: "worker_threads_arithmetic", lang: "javascript", status: engine.StatusSucceeded,
			code: `
const { Worker, isMainThread, parentPort } = require('worker_threads');
if (isMainThread) {
  let done = 0;
  for (let i = 0; i < 4; i++) {
    const w = new Worker(__filename);
    w.on('message', () => { if (++done === 4) console.log('done', done); });
    w.on('error', (e) => { console.log('worker error', e.code, e.message); process.exitCode = 1; });
  }
} else {
  let x = 0; const end = Date.now() + 1500;
  while (Date.now() < end) for (let i = 0; i < 1e6; i++) x = (x * 31 + i) % 1000003;
  parentPort.postMessage(x);
}
`,
			check: func(t *testing.T, res engine.Result) { wantContains(t, res.Stdout, "done 4\n") },
		},
		{
			// Each worker builds and drops arrays that outlive the young
			// generation. V8 sizes every isolate's heap from the memory it
			// sees: 4 GiB heaps (host RAM) let five isolates grow past
			// 512 MiB on oci, where docker's (cgroup-sized) did not.
			name: "worker_threads_garbage", lang: "javascript", status: engine.StatusSucceeded,
			code: `
const { Worker, isMainThread, parentPort } = require('worker_threads');
if (isMainThread) {
  let done = 0;
  for (let i = 0; i < 4; i++) {
    const w = new Worker(__filename);
    w.on('message', (m) => { if (++done === 4) console.log('done', done, m); });
    w.on('error', (e) => { console.log('worker error', e.code, e.message); process.exitCode = 1; });
  }
} else {
  const end = Date.now() + 4000; let r = 0;
  while (Date.now() < end) {
    const n = 2e6, s = [];
    for (let i = 0; i < n; i++) s.push(true);
    let c = 0;
    for (let i = 2; i < n; i++) if (s[i]) { c++; for (let j = i * 2; j < n; j += i) s[j] = false; }
    r = c;
  }
  parentPort.postMessage(r);
}
`,
			check: func(t *testing.T, res engine.Result) { wantContains(t, res.Stdout, "done 4 148933\n") },
		},
		{
			// Threads count against the process limit like processes, and
			// the limit is the sandbox's own: pid 1 (init), the main thread
			// and Pids-2 more.
			name: "threads_up_to_pids_limit", lang: "python", status: engine.StatusSucceeded,
			code: `
import threading
ev = threading.Event()
n, err = 0, None
try:
    for _ in range(1000):
        threading.Thread(target=ev.wait).start()
        n += 1
except RuntimeError as e:
    err = e
ev.set()
print("threads", n, "refused", err is not None)
`,
			check: func(t *testing.T, res engine.Result) {
				wantContains(t, res.Stdout, fmt.Sprintf("threads %d refused True\n", lim.Pids-2))
			},
		},
		{
			name: "memory_just_under_limit", lang: "python", status: engine.StatusSucceeded,
			code: fmt.Sprintf("data = bytearray(%d)\nfor i in range(0, len(data), 4096):\n    data[i] = 1\nprint('ok', len(data) >> 20)\n", lim.MemoryBytes-112<<20),
			check: func(t *testing.T, res engine.Result) {
				if want := lim.MemoryBytes - 112<<20; res.Usage.PeakMemoryBytes < want {
					t.Errorf("peak memory %d; want >= %d", res.Usage.PeakMemoryBytes, want)
				}
			},
		},
		{
			// Buffers live outside V8's heap: only the sandbox's limit
			// bounds them.
			name: "node_buffers_under_limit", lang: "javascript", status: engine.StatusSucceeded,
			code: fmt.Sprintf("const bs = []; for (let i = 0; i < %d; i++) bs.push(Buffer.alloc(16 << 20, 1));\nconsole.log('ok', bs.length * 16);\n", (lim.MemoryBytes-128<<20)>>24),
		},
		{
			// V8's own heap limit is the same on every pair, so a heap that
			// outgrows it ends in V8's "heap out of memory" abort
			// everywhere, not in the kernel's OOM kill on some pairs.
			name: "node_heap_over_its_limit", lang: "javascript", status: engine.StatusFailed, exit: 128 + 6,
			code: "const a = []; for (;;) a.push(new Array(1 << 16).fill(1.5));\n",
			check: func(t *testing.T, res engine.Result) {
				wantContains(t, res.Stderr, "heap out of memory")
			},
		},
	}
}

// agree runs the behaviour table.
func agree(t *testing.T, e *env) {
	for _, b := range behaviours() {
		t.Run(b.name, func(t *testing.T) {
			res, err := e.run(t, Case{Lang: b.lang, Code: b.code, Stdin: b.stdin, Limits: agreeLimits, Timeout: agreeTimeout})
			wantStatus(t, res, err, b.status, b.exit)
			if b.check != nil && err == nil {
				b.check(t, res)
			}
			if t.Failed() {
				t.Logf("result: status=%s exit=%d peak=%d MiB stdout=%q stderr=%q", res.Status, res.ExitCode,
					res.Usage.PeakMemoryBytes>>20, clip(res.Stdout), clip(lastLines(res.Stderr, 5)))
			}
		})
	}
}

// wantEqual checks a result's whole stdout and stderr.
func wantEqual(t *testing.T, res engine.Result, stdout, stderr string) {
	t.Helper()
	if res.Stdout != stdout || res.Stderr != stderr {
		t.Errorf("stdout, stderr = %q, %q; want %q, %q", res.Stdout, res.Stderr, stdout, stderr)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
