package main

// End-to-end tests of sandboxes that stay, through a real `vertal serve`
// with its default driver: state across commands, files, the attacks on
// the files API, another tenant, pause and resume, expiry with the server
// SIGKILLed, and what a restart leaves.

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// sbxCall is call against /v1/sandboxes/{id}/rest.
func sbxCall(t *testing.T, p *serverProc, key, method, id, rest string, body any) httpResult {
	t.Helper()
	u := p.url + "/v1/sandboxes"
	if id != "" {
		u += "/" + id
	}
	return call(t, method, u+rest, key, body, nil)
}

// sbxRaw sends a raw body (or none) and returns status and raw answer.
func sbxRaw(t *testing.T, p *serverProc, key, method, id, path string, body []byte) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, p.url+"/v1/sandboxes/"+id+"/files?path="+url.QueryEscape(path), rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, raw
}

// sbxRun runs a foreground shell line and fails the test unless it
// answered 200.
func sbxRun(t *testing.T, p *serverProc, key, id, cmd string) map[string]any {
	t.Helper()
	r := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{"cmd": cmd})
	if r.status != 200 {
		t.Fatalf("command %q: %d %s", cmd, r.status, r.raw)
	}
	return r.body
}

func createSandbox(t *testing.T, p *serverProc, key string, body map[string]any) string {
	t.Helper()
	r := sbxCall(t, p, key, "POST", "", "", body)
	if r.status != 201 || r.body["status"] != "running" || !strings.HasPrefix(r.body["id"].(string), "sbx_") {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	return r.body["id"].(string)
}

func TestSandboxE2E(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	p := startServer(t, dataDir, nil)
	key, other := tenantKey(t, p, "agent-author", "pro"), tenantKey(t, p, "someone-else", "pro")
	id := createSandbox(t, p, key, map[string]any{"timeout_s": 300, "metadata": map[string]string{"step": "one"}})

	t.Run("StateAcrossCommands", func(t *testing.T) {
		sbxRun(t, p, key, id, "echo remembered > note.txt; pwd > where.txt")
		out := sbxRun(t, p, key, id, "cat note.txt where.txt; id -u")
		lines := strings.Split(strings.TrimSpace(out["stdout"].(string)), "\n")
		if len(lines) != 3 || lines[0] != "remembered" || lines[1] != "/home/user" || lines[2] == "0" {
			t.Fatalf("stdout %q", out["stdout"])
		}
		if out["exit_code"] != 0.0 {
			t.Fatalf("exit %v", out)
		}
		fail := sbxRun(t, p, key, id, "echo oops >&2; exit 3")
		if fail["exit_code"] != 3.0 || fail["stderr"] != "oops\n" {
			t.Fatalf("failing command %v", fail)
		}
	})

	t.Run("OOMTakesTheCodeFirst", func(t *testing.T) { oomOrder(t, p, key, id) })

	// The agent runs as the sandbox's uid; its stdio is the host's
	// protocol. Code must not reach it through /proc/<agent>/fd (to forge
	// or steal frames, or break the connection) nor ptrace it.
	t.Run("AgentStdioClosedToCode", func(t *testing.T) {
		out := sbxRun(t, p, key, id, `a=$PPID; for f in 0 1; do if [ -e /proc/$a/fd/$f ] || ls /proc/$a/fd >/dev/null 2>&1; then echo "open $f"; fi; done; `+
			`printf '\377\377\377\377garbage' 2>/dev/null >/proc/$a/fd/1 && echo wrote; grep -c . /proc/$a/environ 2>/dev/null || echo closed`)
		if got := strings.TrimSpace(out["stdout"].(string)); got != "closed" {
			t.Fatalf("code reached the agent's stdio: %q", got)
		}
		if again := sbxRun(t, p, key, id, "echo served"); again["stdout"] != "served\n" {
			t.Fatalf("after the attempt: %v", again)
		}
	})

	t.Run("Stdin", func(t *testing.T) {
		r := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{"cmd": "tr a-z A-Z", "stdin": "judge input\n"})
		if r.status != 200 || r.body["stdout"] != "JUDGE INPUT\n" {
			t.Fatalf("%d %s", r.status, r.raw)
		}
	})

	t.Run("BackgroundProcessStays", func(t *testing.T) {
		r := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{"cmd": "sleep 120", "background": true})
		if r.status/100 != 2 {
			t.Fatalf("background: %d %s", r.status, r.raw)
		}
		pid := int(r.body["pid"].(float64))
		l := sbxCall(t, p, key, "GET", id, "/commands", nil)
		if l.status != 200 || !strings.Contains(l.raw, `"running":true`) {
			t.Fatalf("list: %d %s", l.status, l.raw)
		}
		s := sbxCall(t, p, key, "POST", id, "/commands/"+strconv.Itoa(pid)+"/signal", map[string]any{"signal": "KILL"})
		if s.status/100 != 2 {
			t.Fatalf("signal: %d %s", s.status, s.raw)
		}
		waitFor(t, func() bool {
			l := sbxCall(t, p, key, "GET", id, "/commands", nil)
			return !strings.Contains(l.raw, `"running":true`)
		})
		again := sbxCall(t, p, key, "POST", id, "/commands/"+strconv.Itoa(pid)+"/signal", map[string]any{"signal": "KILL"})
		if again.status != 409 || again.code() != "process_finished" {
			t.Fatalf("signal to a finished pid: %d %s", again.status, again.raw)
		}
	})

	data := make([]byte, 200<<10)
	_, _ = rand.Read(data)
	t.Run("Files", func(t *testing.T) {
		if st, raw := sbxRaw(t, p, key, "PUT", id, "/home/user/deep/dir/data.bin", data); st/100 != 2 {
			t.Fatalf("upload: %d %s", st, raw)
		}
		st, got := sbxRaw(t, p, key, "GET", id, "/home/user/deep/dir/data.bin", nil)
		if st != 200 || !bytes.Equal(got, data) {
			t.Fatalf("download: %d, %d bytes, equal %v", st, len(got), bytes.Equal(got, data))
		}
		st, listing := sbxRaw(t, p, key, "GET", id, "/home/user/deep/dir", nil)
		if st != 200 || !strings.Contains(string(listing), `"data.bin"`) {
			t.Fatalf("listing: %d %s", st, listing)
		}
		// The code sees what the API wrote, as the sandbox's user.
		out := sbxRun(t, p, key, id, "stat -c '%s %U' deep/dir/data.bin")
		if !strings.HasPrefix(out["stdout"].(string), "204800 ") || strings.Contains(out["stdout"].(string), "root") {
			t.Fatalf("stat: %q", out["stdout"])
		}
		if st, raw := sbxRaw(t, p, key, "DELETE", id, "/home/user/deep", nil); st/100 != 2 {
			t.Fatalf("delete: %d %s", st, raw)
		}
		if st, _ := sbxRaw(t, p, key, "GET", id, "/home/user/deep/dir/data.bin", nil); st != 404 {
			t.Fatalf("after delete: %d", st)
		}
	})

	t.Run("FilesNeverReachTheHost", func(t *testing.T) {
		secret := []byte("host secret " + id)
		hostFile := filepath.Join(dataDir, "host-secret.txt")
		if err := os.WriteFile(hostFile, secret, 0o644); err != nil {
			t.Fatal(err)
		}
		sbxRun(t, p, key, id, "ln -sf "+hostFile+" planted; ln -sf /etc/shadow shadow; ln -sf / root; mkfifo fifo")
		for _, path := range []string{"/home/user/planted", hostFile, "/home/user/root" + hostFile, "/home/user/../../.." + hostFile} {
			st, got := sbxRaw(t, p, key, "GET", id, path, nil)
			if bytes.Contains(got, secret) || st == 200 {
				t.Errorf("GET %s: %d %q", path, st, got)
			}
		}
		for _, path := range []string{"/home/user/shadow", "/etc/shadow"} {
			st, got := sbxRaw(t, p, key, "GET", id, path, nil)
			if st == 200 || bytes.Contains(got, []byte("root:")) {
				t.Errorf("GET %s: %d %q", path, st, got)
			}
		}
		if st, _ := sbxRaw(t, p, key, "GET", id, "/home/user/fifo", nil); st/100 != 4 {
			t.Errorf("GET a FIFO: %d", st)
		}
		// The root filesystem stays read-only through the API too, and a
		// write through a planted link lands nowhere on the host.
		if st, _ := sbxRaw(t, p, key, "PUT", id, "/etc/passwd", []byte("x")); st/100 != 4 {
			t.Errorf("PUT /etc/passwd: %d", st)
		}
		if st, _ := sbxRaw(t, p, key, "PUT", id, "/home/user/planted", []byte("overwritten")); st == 200 || st == 201 {
			if b, _ := os.ReadFile(hostFile); !bytes.Equal(b, secret) {
				t.Errorf("a write through a planted link changed the host file: %q", b)
			}
		}
	})

	t.Run("AnotherTenantSeesNothing", func(t *testing.T) {
		for _, c := range []struct {
			method, rest string
			body         any
		}{
			{"GET", "", nil}, {"DELETE", "", nil}, {"POST", "/pause", nil}, {"POST", "/resume", nil},
			{"POST", "/timeout", map[string]any{"timeout_s": 60}},
			{"POST", "/commands", map[string]any{"cmd": "id"}}, {"GET", "/commands", nil},
			{"POST", "/files/mkdir", map[string]any{"path": "/home/user/x"}},
		} {
			if r := sbxCall(t, p, other, c.method, id, c.rest, c.body); r.status != 404 || r.code() != "not_found" {
				t.Errorf("%s %s as another tenant: %d %s", c.method, c.rest, r.status, r.raw)
			}
		}
		if st, _ := sbxRaw(t, p, other, "GET", id, "/home/user/note.txt", nil); st != 404 {
			t.Errorf("files as another tenant: %d", st)
		}
		if l := sbxCall(t, p, other, "GET", "", "", nil); l.status != 200 || strings.Contains(l.raw, id) {
			t.Errorf("list as another tenant: %d %s", l.status, l.raw)
		}
	})

	t.Run("PauseResumeKeepsFiles", func(t *testing.T) {
		if st, raw := sbxRaw(t, p, key, "PUT", id, "/home/user/keep.bin", data); st/100 != 2 {
			t.Fatalf("upload: %d %s", st, raw)
		}
		if r := sbxCall(t, p, key, "POST", id, "/pause", nil); r.status != 200 || r.body["status"] != "paused" {
			t.Fatalf("pause: %d %s", r.status, r.raw)
		}
		if r := sbxCall(t, p, key, "GET", id, "", nil); r.body["status"] != "paused" {
			t.Fatalf("get after pause: %s", r.raw)
		}
		if r := sbxCall(t, p, key, "POST", id, "/resume", nil); r.status != 200 || r.body["status"] != "running" {
			t.Fatalf("resume: %d %s", r.status, r.raw)
		}
		st, got := sbxRaw(t, p, key, "GET", id, "/home/user/keep.bin", nil)
		if st != 200 || !bytes.Equal(got, data) {
			t.Fatalf("after resume: %d, equal %v", st, bytes.Equal(got, data))
		}
		// A command to a paused sandbox resumes it.
		sbxCall(t, p, key, "POST", id, "/pause", nil)
		if out := sbxRun(t, p, key, id, "cat note.txt"); out["stdout"] != "remembered\n" {
			t.Fatalf("command on a paused sandbox: %v", out)
		}
	})

	t.Run("Kill", func(t *testing.T) {
		if r := sbxCall(t, p, key, "DELETE", id, "", nil); r.status != 200 || r.body["status"] != "ended" || r.body["reason"] != "killed" {
			t.Fatalf("delete: %d %s", r.status, r.raw)
		}
		if r := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{"cmd": "true"}); r.status != 409 || r.code() != "sandbox_not_running" {
			t.Fatalf("command on an ended sandbox: %d %s", r.status, r.raw)
		}
		if r := sbxCall(t, p, key, "GET", id, "", nil); r.status != 200 || r.body["status"] != "ended" {
			t.Fatalf("an ended sandbox stays readable: %d %s", r.status, r.raw)
		}
	})
}

// TestSandboxServerKilledE2E: a sandbox's own deadline ends it when the
// server that started it was SIGKILLed, and the restarted server reports
// it ended and leaves nothing behind.
func TestSandboxServerKilledE2E(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	p := startServer(t, dataDir, nil)
	key := tenantKey(t, p, "agent-author", "pro")
	id := createSandbox(t, p, key, map[string]any{"timeout_s": 300})
	marker := "sleep 4242"
	if r := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{"cmd": marker, "background": true}); r.status/100 != 2 {
		t.Fatalf("background: %d %s", r.status, r.raw)
	}
	if !processRunning(marker) {
		t.Fatal("the background command is not running on the host")
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	p.exited <- nil
	waitFor(t, func() bool { return !processRunning(marker) })

	q := startServer(t, dataDir, nil)
	r := sbxCall(t, q, key, "GET", id, "", nil)
	if r.status != 200 || r.body["status"] != "ended" || r.body["reason"] != "node_lost" {
		t.Fatalf("after a crash: %d %s", r.status, r.raw)
	}
}

// processRunning reports whether some process on the host has cmdline
// containing s (NUL bytes read as spaces).
func processRunning(s string) bool {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err == nil && strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			return true
		}
	}
	return false
}

// TestSandboxEveryRuntimeE2E: the same sandbox, through a real server, on
// every driver and runtime pair besides the default (oci/bwrap, above):
// state across commands, the walls, files, pause and resume, and nothing
// left after the kill.
func TestSandboxEveryRuntimeE2E(t *testing.T) {
	needE2E(t)
	img := os.Getenv("VERTAL_DOCKER_IMAGE")
	if img == "" {
		img = "vertal/default:latest"
	}
	for i, c := range []struct {
		name string
		args []string
	}{
		{"oci/crun", []string{"--runtime", "crun"}},
		{"oci/runc", []string{"--runtime", "runc"}},
		{"oci/runsc", []string{"--runtime", "runsc"}},
		{"docker/runc", []string{"--driver", "docker", "--runtime", "runc", "--docker-image", img}},
		{"docker/runsc", []string{"--driver", "docker", "--runtime", "runsc", "--docker-image", img}},
	} {
		t.Run(strings.ReplaceAll(c.name, "/", "_"), func(t *testing.T) {
			p := startServer(t, t.TempDir(), nil, append(c.args, "--metrics-addr", "127.0.0.1:0")...)
			waitFor(t, func() bool { return strings.Contains(p.stdout.String(), "sandboxes: "+c.name) })
			key := tenantKey(t, p, "agent-author", "pro")
			// The create takes the sandbox pre-started for the pro plan.
			before := prestarted(t, metricsOf(t, p), "")
			id := createSandbox(t, p, key, map[string]any{"timeout_s": 120})
			if !before[id] {
				t.Errorf("the create got %s, which was not running before it: not a pre-started sandbox", id)
			}
			marker := "sleep " + strconv.Itoa(4300+i)
			sbxRun(t, p, key, id, "echo kept > kept.txt")
			if r := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{"argv": []string{"sh", "-c", marker}, "background": true}); r.status/100 != 2 {
				t.Fatalf("background: %d %s", r.status, r.raw)
			}
			out := sbxRun(t, p, key, id, "id -u; cat kept.txt; grep -c : /proc/net/dev; touch /etc/x 2>/dev/null && echo rootfs-writable; "+
				"ls /proc/$PPID/fd >/dev/null 2>&1 && echo agent-stdio-open; cat /proc/self/status | grep CapEff")
			lines := strings.Split(strings.TrimSpace(out["stdout"].(string)), "\n")
			// /proc/net/dev: its two header lines hold no colon; lo does.
			if len(lines) != 4 || lines[0] == "0" || lines[1] != "kept" || lines[2] != "1" || !strings.HasSuffix(lines[3], "0000000000000000") {
				t.Fatalf("inside the sandbox: %q (stderr %q)", out["stdout"], out["stderr"])
			}
			homeFullStillRuns(t, p, key, id)
			oomOrder(t, p, key, id)
			contextsWork(t, p, key, id)
			data := make([]byte, 64<<10)
			_, _ = rand.Read(data)
			if st, raw := sbxRaw(t, p, key, "PUT", id, "/home/user/blob", data); st/100 != 2 {
				t.Fatalf("upload: %d %s", st, raw)
			}
			if r := sbxCall(t, p, key, "POST", id, "/pause", nil); r.status != 200 || r.body["status"] != "paused" {
				t.Fatalf("pause: %d %s", r.status, r.raw)
			}
			if st, got := sbxRaw(t, p, key, "GET", id, "/home/user/blob", nil); st != 200 || !bytes.Equal(got, data) {
				t.Fatalf("after pause and resume: %d, equal %v", st, bytes.Equal(got, data))
			}
			if r := sbxCall(t, p, key, "DELETE", id, "", nil); r.status != 200 || r.body["status"] != "ended" {
				t.Fatalf("delete: %d %s", r.status, r.raw)
			}
			waitFor(t, func() bool { return !processRunning(marker) })
			if strings.HasPrefix(c.name, "docker/") {
				out, err := exec.Command("docker", "ps", "-aq", "--filter", "name="+id).Output()
				if err != nil || strings.TrimSpace(string(out)) != "" {
					t.Errorf("containers left for %s: %q %v", id, out, err)
				}
			}
			// The agent's channel is a socket but under docker/runsc, where
			// it is the container's attached stdio, which its init and
			// timeout hold too (docs/SANDBOXES.md).
			forgeAttack(t, p, key, c.name != "docker/runsc")
		})
	}
}

// oomOrder: a command runs at engine.CodeOOMScore and its parent, the
// agent, below it, so the memory cgroup's OOM killer takes the code first.
func oomOrder(t *testing.T, p *serverProc, key, id string) {
	t.Helper()
	out := sbxRun(t, p, key, id, `i=0; while [ "$(cat /proc/$$/oom_score_adj)" != 1000 ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; `+
		`cat /proc/$$/oom_score_adj /proc/$PPID/oom_score_adj /proc/$PPID/comm`)
	// Under gVisor the runtime's score is on the host's sandbox process and
	// the agent is at 0 inside; elsewhere it has engine.SandboxOOMScore.
	got := strings.Fields(out["stdout"].(string))
	if len(got) != 3 || got[0] != strconv.Itoa(engine.CodeOOMScore) || got[2] != "agent" ||
		!slices.Contains([]string{"0", strconv.Itoa(engine.SandboxOOMScore)}, got[1]) {
		t.Fatalf("oom_score_adj of the code, of the agent, and the agent's name: %q (stderr %q)", got, out["stderr"])
	}
}

// TestSandboxBombsE2E: a fork bomb and a memory bomb in one tenant's
// sandbox leave another tenant's sandbox served, and the bombed sandbox
// itself still answers afterwards (its agent survives a full pids limit).
func TestSandboxBombsE2E(t *testing.T) {
	needE2E(t)
	p, attacker, victim, bombed, served := twoSandboxes(t, "attacker", "pro", "victim", "pro")
	for _, bomb := range []string{
		// The shell outlives its timeout, so the fork bomb ends by the
		// timeout's SIGKILL to the whole process group. A bomb that ran
		// to its end would leave children forking until they die out,
		// which takes longer the busier the host is.
		"bomb() { bomb | bomb & }; bomb; sleep 30",
		`python3 -c "x = []
while True: x.append(bytearray(16 << 20))"`,
	} {
		done := make(chan httpResult, 1)
		go func() {
			done <- call(t, "POST", p.url+"/v1/sandboxes/"+bombed+"/commands", attacker, map[string]any{"cmd": bomb, "timeout_s": 10}, nil)
		}()
		time.Sleep(2 * time.Second)
		for i := range 3 {
			if out := sbxRun(t, p, victim, served, "echo served"); out["stdout"] != "served\n" {
				t.Fatalf("the other tenant's sandbox, during %q (try %d): %v", bomb, i, out)
			}
		}
		// The fork bomb's shell goes on to its sleep once forks fail and
		// is killed at its timeout; the memory bomb is killed.
		r := <-done
		if fork := strings.HasPrefix(bomb, "bomb"); r.status != 200 || (fork && r.body["status"] != "timed_out") ||
			(!fork && r.body["exit_code"] == 0.0) {
			t.Errorf("the bomb %q answered %d %s", bomb, r.status, tail(r.raw, 500))
		}
		// Whatever the bomb left is gone with its process group; the
		// sandbox answers again (a bomb that ended a gVisor sandbox would
		// show here as sandbox_not_running).
		waitFor(t, func() bool {
			r := sbxCall(t, p, attacker, "POST", bombed, "/commands", map[string]any{"cmd": "echo alive"})
			return r.status == 200 && r.body["stdout"] == "alive\n"
		})
	}
}
