package main

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// forgeScript is code in a sandbox attacking its own agent's channel:
// it opens the protocol pipes through the first process that holds them
// and that /proc lets it open (the sandbox's init, or the deadline's
// timeout), reads the host's requests off them, and answers each file
// download itself with a stream far past the plan's file cap. What it
// did goes to forge.log.
const forgeScript = `
import base64, json, os, struct, time
me = os.getpid()
log = open('/home/user/forge.log', 'a', buffering=1)
r = w = None
for pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):
    if pid in (me, os.getppid()):
        continue
    try:
        kind = os.readlink('/proc/%d/fd/0' % pid)
    except OSError as e:
        log.write('closed %d %s\n' % (pid, e.strerror))
        continue
    if kind.startswith('/'):
        continue  # a file (/dev/null), not a channel
    try:
        r = os.open('/proc/%d/fd/0' % pid, os.O_RDONLY)
        w = os.open('/proc/%d/fd/1' % pid, os.O_WRONLY)
        log.write('holder %d %s\n' % (pid, kind))
        break
    except OSError as e:
        log.write('refused %d %s %s\n' % (pid, kind, e.strerror))
        r = w = None
if r is None:
    log.write('no holder\n')
if len(os.sys.argv) > 1 or r is None:
    log.close()
    print(open('/home/user/forge.log').read(), end='')
    raise SystemExit(0)
blob = base64.b64encode(b'F' * (512 << 10)).decode()
def send(m):
    f = json.dumps(m).encode()
    os.write(w, struct.pack('>I', len(f)) + f)
buf = b''
while True:
    d = os.read(r, 1 << 16)
    if not d:
        break
    buf += d
    while len(buf) >= 4:
        n = struct.unpack('>I', buf[:4])[0]
        if len(buf) < 4 + n:
            break
        body, buf = buf[4:4 + n], buf[4 + n:]
        try:
            m = json.loads(body)
        except ValueError:
            buf = b''
            break
        if m.get('op') == 'readfile':
            log.write('stole readfile %d\n' % m['id'])
            for _ in range(48):
                send({'id': m['id'], 'op': 'data', 'data': blob})
                time.sleep(0.005)
            send({'id': m['id'], 'op': 'done'})
`

// forgeAttack runs forgeScript in a new sandbox of key's tenant (a pro
// plan: 10 MiB per file). First it only probes: closed says whether the
// agent's channel must be out of the code's reach on this driver (a
// process holding it whose /proc/<pid>/fd/0 and 1 open is a failure).
// Where it is reachable, the script then answers file downloads in the
// agent's place, and however a download ends, the host never sends more
// than the plan's cap. Either way the server goes on serving a fresh
// sandbox afterwards.
func forgeAttack(t *testing.T, p *serverProc, key string, closed bool) {
	t.Helper()
	const capBytes = 10 << 20
	id := createSandbox(t, p, key, map[string]any{"timeout_s": 120})
	if st, raw := sbxRaw(t, p, key, "PUT", id, "/home/user/forge.py", []byte(forgeScript)); st/100 != 2 {
		t.Fatalf("upload: %d %s", st, raw)
	}
	if st, raw := sbxRaw(t, p, key, "PUT", id, "/home/user/small.txt", []byte("small file\n")); st/100 != 2 {
		t.Fatalf("upload: %d %s", st, raw)
	}
	probe := sbxRun(t, p, key, id, "python3 forge.py probe")["stdout"].(string)
	t.Logf("probe: %q", probe)
	// A holder is a process whose fds 0 and 1 opened: the channel, or
	// under runc the stdio that runc proxies, which carries nothing (the
	// agent's socket is its fd 3); the attack below tells them apart.
	reachable := strings.Contains(probe, "holder ")
	if !strings.Contains(probe, "no holder") && !reachable {
		t.Fatalf("the probe did not run: %q", probe)
	}
	if reachable {
		if r := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{"cmd": "python3 forge.py", "background": true}); r.status/100 != 2 {
			t.Fatalf("background: %d %s", r.status, r.raw)
		}
		time.Sleep(500 * time.Millisecond) // the script opens its pipes
		client := &http.Client{Timeout: 4 * time.Second}
		forged, stolen := 0, 0
		for i := 0; i < 10 && forged == 0 && stolen < 5; i++ {
			req, _ := http.NewRequest("GET", p.url+"/v1/sandboxes/"+id+"/files?path="+url.QueryEscape("/home/user/small.txt"), nil)
			req.Header.Set("Authorization", "Bearer "+key)
			res, err := client.Do(req)
			if err != nil {
				stolen++
				t.Logf("download %d: %v (a stolen request: nobody answers it)", i, err)
				continue
			}
			n, err := io.Copy(io.Discard, io.LimitReader(res.Body, capBytes+1<<20))
			res.Body.Close()
			if n > capBytes {
				t.Fatalf("download %d: the host sent %d bytes, past the plan's cap of %d, on a forged stream", i, n, capBytes)
			}
			if res.StatusCode != 200 || n != int64(len("small file\n")) || err != nil {
				forged++
				t.Logf("download %d: %d, %d bytes, %v (forged)", i, res.StatusCode, n, err)
			}
			if res.StatusCode == 404 || res.StatusCode == 409 {
				break // the attack broke its own sandbox's channel, which ended it
			}
		}
		if closed && forged+stolen > 0 {
			t.Fatalf("the channel must be out of the code's reach here, yet %d downloads were forged and %d taken (probe %q)", forged, stolen, probe)
		}
		if !closed && forged == 0 {
			// Under docker/runsc the script takes the host's requests but
			// its writes do not reach the host: the sandbox only stops
			// answering, which is the code's to do to itself.
			t.Logf("the channel was reachable; no forged stream reached the host, %d requests were taken", stolen)
		}
	}
	sbxCall(t, p, key, "DELETE", id, "", nil)
	fresh := createSandbox(t, p, key, map[string]any{"timeout_s": 60})
	if out := sbxRun(t, p, key, fresh, "echo served"); out["stdout"] != "served\n" {
		t.Fatalf("a fresh sandbox after the attack: %v", out)
	}
	sbxCall(t, p, key, "DELETE", fresh, "", nil)
}

// TestSandboxForgedFramesE2E: code that forges its agent's frames gets
// no more from the host than the plan gives (see docs/SANDBOXES.md,
// "What the host trusts"), on the default driver; the every-runtime test
// runs the same attack on the other pairs.
func TestSandboxForgedFramesE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil)
	forgeAttack(t, p, tenantKey(t, p, "forger", "pro"), true)
}

// TestSandboxStoppedAgentE2E: code can stop its own agent (SIGSTOP; same
// uid). A foreground command past its timeout then gives its slot back
// within the kill grace and its sandbox ends as error; a stopped agent at
// expiry (on_timeout pause) ends as error once its save times out,
// without holding up another tenant's sandbox, which is paused on time
// with its files.
func TestSandboxStoppedAgentE2E(t *testing.T) {
	needE2E(t)
	p, attacker, victim, stopped, _ := twoSandboxes(t, "stopper", "pro", "bystander", "pro")

	// A foreground command that stops its agent.
	start := time.Now()
	r := sbxCall(t, p, attacker, "POST", stopped, "/commands", map[string]any{"cmd": "kill -STOP $PPID; sleep 60", "timeout_s": 2})
	took := time.Since(start)
	// The code may stop the agent before its reply to the spawn (the
	// spawn's reply times out) or after (the exit never comes): either
	// way a 500 that says the sandbox was ended.
	if r.status != 500 || !(strings.Contains(r.raw, "stopped answering") || strings.Contains(r.raw, "did not answer in time")) {
		t.Errorf("command that stopped its agent: %d %s after %v", r.status, r.raw, took)
	}
	waitPolling(t, func() bool {
		g := sbxCall(t, p, attacker, "GET", stopped, "", nil)
		return g.body["status"] == "ended" && g.body["reason"] == "error"
	})
	t.Logf("the command answered after %v; its sandbox ended as error", took)

	// At expiry: the attacker's sandbox stops its agent and expires in 2 s;
	// the bystander's expires in 4 s, to be paused.
	frozen := createSandbox(t, p, attacker, map[string]any{"timeout_s": 2, "on_timeout": "pause"})
	kept := createSandbox(t, p, victim, map[string]any{"timeout_s": 4, "on_timeout": "pause"})
	sbxRun(t, p, victim, kept, "echo survives > kept.txt")
	if r := sbxCall(t, p, attacker, "POST", frozen, "/commands", map[string]any{"cmd": "sleep 1; kill -STOP $PPID", "background": true}); r.status/100 != 2 {
		t.Fatalf("background: %d %s", r.status, r.raw)
	}
	waitPolling(t, func() bool {
		return sbxCall(t, p, victim, "GET", kept, "", nil).body["status"] == "paused"
	})
	if st, got := sbxRaw(t, p, victim, "GET", kept, "/home/user/kept.txt", nil); st != 200 || string(got) != "survives\n" {
		t.Errorf("the bystander's file after its pause and resume: %d %q", st, got)
	}
	waitPolling(t, func() bool {
		g := sbxCall(t, p, attacker, "GET", frozen, "", nil)
		return g.body["status"] == "ended" && g.body["reason"] == "error"
	})
}

// waitPolling is waitFor at a pace a plan's rate limit allows (2 calls a
// second), for up to 90 s.
func waitPolling(t *testing.T, cond func() bool) {
	t.Helper()
	e2etest.WaitFor(t, 90*time.Second, 500*time.Millisecond, cond)
}
