//go:build linux

package oci

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
)

var (
	liveAgentOnce sync.Once
	liveAgentPath string
	liveAgentErr  error
)

// liveAgent builds the stand-in agent (testdata/liveagent), static, once.
func liveAgent(t *testing.T) string {
	t.Helper()
	liveAgentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "liveagent")
		if err != nil {
			liveAgentErr = err
			return
		}
		liveAgentPath = filepath.Join(dir, "agent")
		cmd := exec.Command("go", "build", "-o", liveAgentPath, "./testdata/liveagent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			liveAgentErr = fmt.Errorf("building the stand-in agent: %v\n%s", err, out)
		}
	})
	if liveAgentErr != nil {
		t.Fatal(liveAgentErr)
	}
	return liveAgentPath
}

func liveID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sbx_" + hex.EncodeToString(b[:])
}

// liveSpecFor is a live sandbox of the default image with the stand-in
// agent and the default limits, a 1 MiB home and a 10 minute lifetime.
func liveSpecFor(t *testing.T) engine.LiveSpec {
	l := enginetest.Complete(engine.Spec{}).Limits
	l.Lifetime = 10 * time.Minute
	return engine.LiveSpec{
		ID: liveID(), Image: rootfs(), Limits: l, HomeBytes: 1 << 20,
		Agent:    liveAgent(t),
		Deadline: time.Now().Add(10 * time.Minute),
	}
}

// agentClient speaks the stand-in agent's line protocol.
type agentClient struct {
	t    *testing.T
	conn io.ReadWriteCloser
	in   *bufio.Scanner
}

func newAgentClient(t *testing.T, l engine.Live) *agentClient {
	in := bufio.NewScanner(l.Conn())
	in.Buffer(make([]byte, 1<<20), 4<<20)
	return &agentClient{t: t, conn: l.Conn(), in: in}
}

// do sends one command; it returns the output and the error text.
func (c *agentClient) do(cmd string) (string, string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, cmd+"\n"); err != nil {
		c.t.Fatalf("%s: writing to the agent: %v", cmd, err)
	}
	if !c.in.Scan() {
		c.t.Fatalf("%s: the agent ended: %v", cmd, c.in.Err())
	}
	var r struct{ Out, Err string }
	if err := json.Unmarshal(c.in.Bytes(), &r); err != nil {
		c.t.Fatalf("%s: %q: %v", cmd, c.in.Bytes(), err)
	}
	return r.Out, r.Err
}

// ok is do that fails the test on an error.
func (c *agentClient) ok(cmd string) string {
	c.t.Helper()
	out, e := c.do(cmd)
	if e != "" {
		c.t.Fatalf("%s: %s (output %q)", cmd, e, out)
	}
	return out
}

func startLive(t *testing.T, d *Driver, spec engine.LiveSpec) *liveSandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s := l.(*liveSandbox)
	t.Cleanup(func() { _ = s.Discard(context.Background()) })
	return s
}

// waitDone waits for a live sandbox to end, generously.
func waitDone(t *testing.T, l engine.Live, what string) {
	t.Helper()
	enginetest.WaitDone(t, l, what, 90*time.Second)
}

// rootMountOptions are the mount options of the last mount at / in a
// mountinfo.
func rootMountOptions(mountinfo string) string {
	opts := ""
	for _, line := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == "/" {
			opts = f[5]
		}
	}
	return opts
}

// capEff is the CapEff line of a /proc/<pid>/status.
func capEff(status string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestLiveSandbox(t *testing.T) {
	e2e(t)
	for _, rt := range allRuntimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			spec := liveSpecFor(t)
			s := startLive(t, d, spec)
			c := newAgentClient(t, s)

			uid := strconv.FormatUint(uint64(s.uid.UID), 10)
			if got := c.ok("id"); got != uid+" "+uid || uid == "0" {
				t.Errorf("id = %q; want the sandbox's uid %s", got, uid)
			}
			// Idle: the agent has answered once and waits.
			time.Sleep(500 * time.Millisecond)
			t.Logf("%s: fresh idle sandbox: memory %d KiB (cgroup memory usage)", rt, s.MemoryBytes()>>10)
			if got := capEff(c.ok("read /proc/self/status")); got != "0000000000000000" {
				t.Errorf("CapEff = %q; want none", got)
			}
			if got := c.ok("deadline"); got != strconv.FormatInt(spec.Deadline.Unix(), 10) {
				t.Errorf("deadline = %q; want %d", got, spec.Deadline.Unix())
			}
			// Network: only lo.
			var ifaces []string
			for _, line := range strings.Split(c.ok("read /proc/net/dev"), "\n") {
				if name, _, ok := strings.Cut(line, ":"); ok {
					ifaces = append(ifaces, strings.TrimSpace(name))
				}
			}
			if diff := cmp.Diff([]string{"lo"}, ifaces); diff != "" {
				t.Errorf("network interfaces (-want +got):\n%s", diff)
			}
			// The root is read-only: the mount says so, and a write fails
			// (EROFS under the host kernel; gVisor checks permissions
			// first, and the image's /etc belongs to root).
			if opts := rootMountOptions(c.ok("read /proc/self/mountinfo")); !strings.Contains(","+opts+",", ",ro,") {
				t.Errorf("the root is mounted %q; want ro", opts)
			}
			want := "read-only file system"
			if rt == "runsc" {
				want = "permission denied"
			}
			if _, e := c.do("write /etc/vertal-live-probe x"); !strings.Contains(e, want) {
				t.Errorf("writing /etc: %q; want %s", e, want)
			}
			// Environment and working directory.
			env := c.ok("env")
			for _, want := range []string{"HOME=/home/user", "PWD=/home/user", "LANG=C.UTF-8"} {
				if !strings.Contains("\n"+env+"\n", "\n"+want+"\n") {
					t.Errorf("env lacks %s:\n%s", want, env)
				}
			}
			if got := c.ok("pwd"); got != engine.HomeDir {
				t.Errorf("pwd = %q; want %s", got, engine.HomeDir)
			}
			// The home: the sandbox's, 0700, writable, noexec, bounded.
			if got := c.ok("stat /home/user"); got != uid+" "+uid+" 700" {
				t.Errorf("home owner and mode = %q; want %s %s 700", got, uid, uid)
			}
			c.ok("write /home/user/note kept across requests")
			c.ok("write /tmp/note in tmp")
			for _, dir := range []string{"/home/user", "/tmp"} {
				out, e := c.do("sh cp /bin/true " + dir + "/t && " + dir + "/t")
				if e == "" || !strings.Contains(out, "Permission denied") {
					t.Errorf("running a program from %s: %q, %q; want Permission denied (noexec)", dir, out, e)
				}
			}
			if _, e := c.do("fill /home/user " + strconv.FormatInt(2*spec.HomeBytes, 10)); !strings.Contains(e, "no space left on device") {
				t.Errorf("writing twice HomeBytes to the home: %q; want no space left on device", e)
			}
			c.ok("sh rm -f /home/user/fill*")
			if got := c.ok("read /home/user/note"); got != "kept across requests" {
				t.Errorf("home note = %q", got)
			}
			if got := c.ok("read /tmp/note"); got != "in tmp" {
				t.Errorf("tmp note = %q", got)
			}
			// A background process outlives the request that started it.
			pid := c.ok("sleep-child 1000")
			if out, e := c.do("sh kill -0 " + pid + " && echo alive"); !strings.Contains(out, "alive") {
				t.Errorf("the background process is gone: %q %q", out, e)
			}

			// Usage and memory, from the cgroup.
			time.Sleep(time.Second)
			mem := s.MemoryBytes()
			u := s.Usage()
			t.Logf("%s: idle memory %d KiB (cgroup), usage %+v", rt, mem>>10, u)
			if mem <= 0 || u.PeakMemoryBytes < mem/2 || u.CPUSeconds <= 0 || u.SandboxSeconds < 1 {
				t.Errorf("MemoryBytes %d, Usage %+v; want all set", mem, u)
			}

			// Closing the connection ends the sandbox.
			if err := s.Conn().Close(); err != nil {
				t.Fatal(err)
			}
			waitDone(t, s, "after Conn().Close")
			if err := s.Discard(context.Background()); err != nil {
				t.Fatalf("Discard: %v", err)
			}
			if err := s.Discard(context.Background()); err != nil {
				t.Fatalf("second Discard: %v", err)
			}
			if diff := cmp.Diff([]string(nil), leftovers(d, d.instance, d.rt, spec.ID)); diff != "" {
				t.Errorf("left behind after Discard (-want +got):\n%s", diff)
			}
			if after := s.Usage(); after.CPUSeconds < u.CPUSeconds || after.SandboxSeconds < u.SandboxSeconds {
				t.Errorf("Usage after Discard %+v; want at least %+v", after, u)
			}
		})
	}
}

// TestLiveLimits: the memory and pids limits hold over every process of
// the sandbox, and the agent keeps serving.
func TestLiveLimits(t *testing.T) {
	e2e(t)
	for _, rt := range allRuntimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			spec := liveSpecFor(t)
			spec.Limits.MemoryBytes = 128 << 20
			s := startLive(t, d, spec)
			c := newAgentClient(t, s)

			// A fork bomb: far more processes than the limit.
			out, _ := c.do(`sh i=0; while [ $i -lt 300 ]; do sleep 1000 </dev/null >/dev/null 2>&1 & i=$((i+1)); done 2>&1 | head -3; echo started`)
			if !strings.Contains(strings.ToLower(out), "fork") {
				t.Errorf("300 processes under a limit of %d: %q; want fork failures", spec.Limits.Pids, out)
			}
			if n := len(d.cg.procs(s.id)); int64(n) > d.cgLimitsFor(spec.Limits).pids {
				t.Errorf("%d processes in the cgroup; limit %d", n, d.cgLimitsFor(spec.Limits).pids)
			}
			c.ok("killkids")
			// Killed processes may take a moment to leave the count.
			var got string
			for range 50 {
				if got, _ = c.do("id"); got != "" {
					if o, _ := c.do("sh echo forks"); strings.Contains(o, "forks") {
						break
					}
				}
				time.Sleep(200 * time.Millisecond)
			}
			if o, e := c.do("sh echo forks again"); !strings.Contains(o, "forks again") {
				t.Errorf("after the bomb was killed the sandbox cannot fork: %q %q", o, e)
			}

			// A memory hog in a child: the kernel kills it, not the host.
			hog := `sh python3 -c 'a = bytearray(400 << 20); print("allocated")'`
			if rt == "runsc" {
				// The limit is on the whole gVisor sandbox, which is
				// killed over it (see enforced).
				if _, err := io.WriteString(s.Conn(), hog+"\n"); err != nil {
					t.Fatal(err)
				}
				waitDone(t, s, "over the memory limit under runsc")
				if !s.cg.oomKilled() {
					t.Errorf("the cgroup saw no OOM kill")
				}
				return
			}
			out, e := c.do(hog)
			if strings.Contains(out, "allocated") || e == "" {
				t.Errorf("400 MiB under a 128 MiB limit: %q %q; want killed", out, e)
			}
			if !s.cg.oomKilled() {
				t.Errorf("the cgroup saw no OOM kill")
			}
			if got := c.ok("id"); got == "" {
				t.Errorf("the agent stopped answering")
			}
		})
	}
}

// TestLiveLifetime: the sandbox's own deadline ends it though the host
// never discards it.
func TestLiveLifetime(t *testing.T) {
	e2e(t)
	for _, rt := range allRuntimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			spec := liveSpecFor(t)
			spec.Limits.Lifetime = 3 * time.Second
			s := startLive(t, d, spec)
			c := newAgentClient(t, s)
			c.ok("sleep-child 1000")
			waitDone(t, s, "past Limits.Lifetime")
			if ps := d.cg.procs(s.id); len(ps) > 0 {
				var desc []string
				for _, p := range ps {
					b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
					st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
					desc = append(desc, fmt.Sprintf("%d %q %q", p, b, st))
				}
				t.Errorf("processes left in the cgroup after the deadline: %v", desc)
			}
			if err := s.Discard(context.Background()); err != nil {
				t.Fatalf("Discard: %v", err)
			}
			if diff := cmp.Diff([]string(nil), leftovers(d, d.instance, d.rt, spec.ID)); diff != "" {
				t.Errorf("left behind (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLiveReapAfterCrash: a driver that forgot its live sandbox (a crash,
// simulated by dropping the instance lock) leaves nothing once another
// driver on the same state dir reaps.
func TestLiveReapAfterCrash(t *testing.T) {
	e2e(t)
	for _, rt := range allRuntimes {
		t.Run(rt, func(t *testing.T) {
			stateDir := testStateDir(t)
			crashed, err := New(context.Background(), Options{Runtime: rt, StateDir: stateDir, CgroupParent: "vertal-test"})
			if err != nil {
				t.Fatal(err)
			}
			spec := liveSpecFor(t)
			l, err := crashed.Start(context.Background(), spec)
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			c := newAgentClient(t, l)
			c.ok("sleep-child 1000")
			inst := crashed.instance
			crashed.lock.Close() // the crash: the lock goes, nothing is cleaned
			crashed.lock = nil
			before := leftovers(crashed, inst, crashed.rt, spec.ID)
			if len(before) == 0 {
				t.Fatal("the forgotten sandbox left nothing; the test proves nothing")
			}

			d2 := reapAfterCrash(t, rt, stateDir)
			waitDone(t, l, "after Reap")
			if diff := cmp.Diff([]string(nil), leftovers(d2, inst, d2.rt, spec.ID)); diff != "" {
				t.Errorf("left behind after Reap (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLiveIsolation: two live sandboxes have different uids and see
// neither each other's files nor processes.
func TestLiveIsolation(t *testing.T) {
	e2e(t)
	for _, rt := range allRuntimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			a, b := startLive(t, d, liveSpecFor(t)), startLive(t, d, liveSpecFor(t))
			ca, cb := newAgentClient(t, a), newAgentClient(t, b)
			if ia, ib := ca.ok("id"), cb.ok("id"); ia == ib {
				t.Errorf("both sandboxes run as %s", ia)
			}
			ca.ok("write /home/user/secret a's")
			ca.ok("write /tmp/secret a's")
			marker := uniqueSleepArg(70000)
			pid := ca.ok("sleep-child " + marker)
			for _, path := range []string{"/home/user/secret", "/tmp/secret"} {
				if out, e := cb.do("read " + path); e == "" {
					t.Errorf("b reads a's %s: %q", path, out)
				}
			}
			if out := cb.ok("sh cat /proc/[0-9]*/cmdline | tr '\\0' ' '"); strings.Contains(out, marker) {
				t.Errorf("b sees a's process: %q", out)
			}
			if out, e := cb.do("sh kill -0 " + pid + " 2>&1 && ls -l /proc/" + pid + "/root/"); e == "" && strings.Contains(out, "secret") {
				t.Errorf("b reaches a's files through /proc: %q", out)
			}
		})
	}
}
