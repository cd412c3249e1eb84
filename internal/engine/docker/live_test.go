package docker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

func TestLiveConfig(t *testing.T) {
	const inst = "0123456789ab"
	deadline := time.Unix(1_900_000_000, 0)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			d := configDriver(t, rt, inst)
			lim := engine.DefaultLimits(time.Minute)
			spec := engine.LiveSpec{ID: "sbx_1", Limits: lim, HomeBytes: 8 << 20, Agent: "/srv/agent", Deadline: deadline}
			sock := ""
			if rt == "runc" {
				sock = "/run/v/" + inst + "/sbx_1/agent.sock"
			}
			cfg, host := d.liveConfig(spec, 42, 2_000_000_042, sock)
			wantCfg, wantHost := d.walls("sbx_1", "", lim, 42, 2_000_000_042)
			wantCfg.Cmd = []string{"timeout", "-s", "KILL", "65", "/.vertal/agent", "serve", "--deadline", "1900000000"}
			if rt == "runc" {
				// The agent's socket (listen): not the attached stdio.
				wantCfg.Cmd = append(wantCfg.Cmd, "--connect", "/.vertal/agent.sock")
			}
			wantCfg.WorkingDir = "/home/user"
			wantCfg.Env = []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"HOME=/home/user",
				"LANG=C.UTF-8",
				"PWD=/home/user",
				"NODE_OPTIONS=--max-old-space-size=128 --max-semi-space-size=1",
			}
			homeOpts := "rw,noexec,nosuid,nodev,mode=0700,uid=2000000042,gid=2000000042,size=8388608"
			wantHost.Mounts = append(wantHost.Mounts, mount.Mount{Type: mount.TypeBind, Source: "/srv/agent", Target: "/.vertal/agent", ReadOnly: true})
			if rt == "runc" {
				wantHost.Mounts = append(wantHost.Mounts, mount.Mount{Type: mount.TypeBind, Source: sock, Target: "/.vertal/agent.sock", ReadOnly: true})
			}
			if rt == "runsc" {
				wantHost.Mounts = append(wantHost.Mounts, mount.Mount{Type: mount.TypeVolume, Target: "/home/user", VolumeOptions: &mount.VolumeOptions{
					NoCopy:       true,
					Labels:       wantCfg.Labels,
					DriverConfig: &mount.Driver{Name: "local", Options: map[string]string{"type": "tmpfs", "device": "tmpfs", "o": homeOpts}},
				}})
			} else {
				wantHost.Tmpfs["/home/user"] = homeOpts
			}
			if diff := cmp.Diff(wantCfg, cfg); diff != "" {
				t.Errorf("container config (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantHost, host); diff != "" {
				t.Errorf("host config (-want +got):\n%s", diff)
			}
			if cfg.Labels[labelExecution] != "sbx_1" || host.CgroupParent != "/vertal-docker_"+inst+"_sbx_1" {
				t.Errorf("labels %v, cgroup parent %q: want the sandbox's id in both", cfg.Labels, host.CgroupParent)
			}
		})
	}
}

// TestStartRefusesIncompleteSpecs needs no Docker engine: a spec missing
// what the sandbox needs is refused before anything is created.
func TestStartRefusesIncompleteSpecs(t *testing.T) {
	good := engine.LiveSpec{ID: "sbx_1", Limits: engine.DefaultLimits(time.Minute), HomeBytes: 1 << 20,
		Agent: "/bin/sh", Deadline: time.Now().Add(time.Hour)}
	for name, mod := range map[string]func(*engine.LiveSpec){
		"bad id":          func(s *engine.LiveSpec) { s.ID = "../x" },
		"no limits":       func(s *engine.LiveSpec) { s.Limits = engine.Limits{} },
		"no home size":    func(s *engine.LiveSpec) { s.HomeBytes = 0 },
		"no deadline":     func(s *engine.LiveSpec) { s.Deadline = time.Time{} },
		"relative agent":  func(s *engine.LiveSpec) { s.Agent = "agent" },
		"missing agent":   func(s *engine.LiveSpec) { s.Agent = filepath.Join(t.TempDir(), "agent") },
		"agent directory": func(s *engine.LiveSpec) { s.Agent = t.TempDir() },
	} {
		t.Run(name, func(t *testing.T) {
			spec := good
			mod(&spec)
			d := &Driver{inFlight: map[string]bool{}}
			if _, err := d.Start(context.Background(), spec); err == nil {
				t.Fatal("Start succeeded")
			}
			if len(d.inFlight) != 0 {
				t.Errorf("a refused spec left %v in flight", d.inFlight)
			}
		})
	}
}

func TestLogWriterIsBounded(t *testing.T) {
	var buf bytes.Buffer
	w := &logWriter{log: slog.New(slog.NewTextHandler(&buf, nil)), id: "sbx_1", max: 100}
	fmt.Fprintf(w, "first\nsec")
	fmt.Fprintf(w, "ond\n%s\n", strings.Repeat("x", 5000))
	fmt.Fprintf(w, "%s\nlast", strings.Repeat("y", 50))
	w.flush()
	out := buf.String()
	for _, want := range []string{"line=first", "line=second", "dropped_bytes="} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "xxx") || len(out) > 2000 {
		t.Errorf("log holds the line over the budget (%d bytes):\n%s", len(out), out)
	}
}

// buildLiveAgent builds the stand-in agent (testdata/liveagent) as a
// static executable.
func buildLiveAgent(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "agent")
	cmd := exec.Command("go", "build", "-o", out, "./testdata/liveagent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the stand-in agent: %v\n%s", err, b)
	}
	return out
}

func newSandboxID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "sbx_" + hex.EncodeToString(b)
}

func liveSpec(agent string) engine.LiveSpec {
	lim := engine.DefaultLimits(10 * time.Minute)
	return engine.LiveSpec{
		ID: newSandboxID(), Image: testImage(), Limits: lim, HomeBytes: 4 << 20,
		Agent: agent, Deadline: time.Now().Add(time.Hour),
	}
}

// startLive starts a live sandbox; when the test ends it discards it and
// checks that nothing of it is left.
func startLive(t *testing.T, d *Driver, spec engine.LiveSpec) (*liveContainer, *agentClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	live, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start(%s): %v", spec.ID, err)
	}
	l := live.(*liveContainer)
	t.Cleanup(func() {
		if err := l.Discard(context.Background()); err != nil {
			t.Errorf("Discard: %v", err)
		}
		assertNothingLeft(t, d, spec.ID)
	})
	return l, &agentClient{t: t, r: bufio.NewReader(live.Conn()), w: live.Conn()}
}

// agentClient speaks the stand-in agent's line protocol.
type agentClient struct {
	t *testing.T
	r *bufio.Reader
	w io.Writer
}

type reply struct {
	ok   bool
	text string
	err  error // the transport's
}

// do sends one request and returns the answer's text, and whether the
// agent answered "ok".
func (c *agentClient) do(req string) (string, bool) {
	c.t.Helper()
	r := c.try(req)
	if r.err != nil {
		c.t.Fatalf("agent request %q: %v", req, r.err)
	}
	return r.text, r.ok
}

// try is do that returns a transport failure instead of failing.
func (c *agentClient) try(req string) reply {
	got := make(chan reply, 1)
	go func() {
		if _, err := io.WriteString(c.w, req+"\n"); err != nil {
			got <- reply{err: err}
			return
		}
		line, err := c.r.ReadString('\n')
		if err != nil {
			got <- reply{err: err}
			return
		}
		status, quoted, _ := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
		text, err := strconv.Unquote(quoted)
		if err != nil {
			got <- reply{err: fmt.Errorf("bad answer %q", line)}
			return
		}
		got <- reply{ok: status == "ok", text: text}
	}()
	select {
	case r := <-got:
		return r
	case <-time.After(2 * time.Minute):
		return reply{err: errors.New("no answer within 2 minutes")}
	}
}

// ok sends a request that must succeed.
func (c *agentClient) ok(req string) string {
	c.t.Helper()
	text, ok := c.do(req)
	if !ok {
		c.t.Fatalf("agent request %q failed: %s", req, text)
	}
	return text
}

// fails sends a request that must fail with an error containing want.
func (c *agentClient) fails(req, want string) {
	c.t.Helper()
	text, ok := c.do(req)
	if ok || !strings.Contains(text, want) {
		c.t.Errorf("agent request %q = %v %q; want a failure with %q", req, ok, text, want)
	}
}

func waitDone(t *testing.T, l engine.Live, what string) {
	t.Helper()
	enginetest.WaitDone(t, l, what, 2*time.Minute)
}

// containersNamed lists every container (running or not) whose name
// contains name.
func containersNamed(t *testing.T, d *Driver, name string) []container.Summary {
	t.Helper()
	list, err := d.cli.ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("name", name))})
	if err != nil {
		t.Fatalf("listing containers: %v", err)
	}
	return list
}

// TestLive runs live sandboxes with the stand-in agent on each runtime and
// checks their walls and lifecycle by attacking them from the inside.
func TestLive(t *testing.T) {
	requireE2E(t)
	agent := buildLiveAgent(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			if d.acct == nil {
				t.Fatal("cgroup accounting unavailable; the engine's cgroups should be visible on this host")
			}

			t.Run("walls", func(t *testing.T) {
				spec := liveSpec(agent)
				spec.Limits.FileSizeBytes = 64 << 20 // the home's size is the limit hit
				l, c := startLive(t, d, spec)
				uid := strconv.FormatUint(uint64(l.uid.UID), 10)
				if got, want := c.ok("id"), "uid="+uid+" gid="+uid; got != want || l.uid.UID == 0 {
					t.Errorf("agent runs as %q, want %q (the sandbox's own uid)", got, want)
				}
				t.Logf("%s: idle live sandbox: %.1f MiB (cgroup memory)", rt, float64(l.MemoryBytes())/(1<<20))
				want := fmt.Sprintf("/.vertal/agent serve --deadline %d", spec.Deadline.Unix())
				if rt == "runc" {
					want += " --connect /.vertal/agent.sock" // the driver's socket, not the attached stdio
				}
				if got := c.ok("args"); got != want {
					t.Errorf("agent's command line %q, want %q", got, want)
				}
				if got := c.ok("caps"); got != "0000000000000000" {
					t.Errorf("CapEff %s, want none", got)
				}
				if got := c.ok("ifaces"); got != "lo" {
					t.Errorf("network interfaces %q, want lo only", got)
				}
				// The root and the agent are mounted read-only (gVisor
				// answers a write there EACCES before EROFS).
				for _, p := range []string{"/etc/vertal-probe", "/vertal-probe", "/.vertal/agent"} {
					if text, ok := c.do("write " + p + " x"); ok || !strings.Contains(text, "read-only file system") && !(rt == "runsc" && strings.Contains(text, "permission denied")) {
						t.Errorf("writing %s: %v %q; want it refused", p, ok, text)
					}
				}
				mounts := map[string]string{} // mount point: its options
				for _, line := range strings.Split(c.ok("read /proc/self/mountinfo"), "\n") {
					if f := strings.Fields(line); len(f) > 5 {
						mounts[f[4]] = f[5]
					}
				}
				for _, p := range []string{"/", engine.AgentPath} {
					if !slices.Contains(strings.Split(mounts[p], ","), "ro") {
						t.Errorf("%s is mounted %q; want ro", p, mounts[p])
					}
				}
				c.ok("write /tmp/probe x") // /tmp stays as it is
				// The home is the sandbox uid's, writable by it alone: runc
				// gives a tmpfs the mode of its mount point (0755, made by
				// Docker), whatever its mode option says.
				home := c.ok("stat /home/user")
				if mode, owner, _ := strings.Cut(home, " "); owner != "uid="+uid+" gid="+uid || (mode != "mode=700" && mode != "mode=755") {
					t.Errorf("home: %s, want mode=700 (or 755) uid=%s gid=%s", home, uid, uid)
				}
				if got := c.ok("cwd"); got != engine.HomeDir {
					t.Errorf("working directory %q, want %s", got, engine.HomeDir)
				}
				env := strings.Split(c.ok("env"), "\n")
				for _, want := range []string{"HOME=/home/user", "PWD=/home/user", "LANG=C.UTF-8"} {
					if !slices.Contains(env, want) {
						t.Errorf("environment %q lacks %s", env, want)
					}
				}
				// Docker adds HOSTNAME.
				if env = envWithout(env, "HOSTNAME"); len(env) != len(sandbox.LiveEnvFor(spec.Limits)) {
					t.Errorf("environment %q: want the fixed one only (the sandbox's own comes through the agent)", env)
				}

				// State persists across requests on one connection.
				c.ok("write /home/user/note hello")
				c.ok("sh echo ' world' >> note")
				if got := c.ok("read note"); got != "hello world\n" {
					t.Errorf("home file reads %q after two requests wrote it", got)
				}
				if got := c.ok("sh cat note; pwd"); got != "exit 0: hello world\n/home/user\n" {
					t.Errorf("a command sees %q", got)
				}
				// noexec, as /tmp: a binary copied to the home does not
				// run; a script runs as one in /tmp does (refused under
				// runc; gVisor checks no noexec on a script's execve);
				// an interpreter runs it anyway.
				for _, dir := range []string{"/tmp", "/home/user"} {
					c.ok("sh cp /bin/echo " + dir + "/e && chmod 755 " + dir + "/e")
					if got := c.ok("sh " + dir + "/e vertal-ran"); strings.Contains(got, "vertal-ran") || strings.HasPrefix(got, "exit 0:") {
						t.Errorf("a binary copied to %s ran: %q", dir, got)
					}
					c.ok("sh printf '#!/bin/sh\\necho ran\\n' > " + dir + "/s.sh && chmod 755 " + dir + "/s.sh")
				}
				inTmp, inHome := c.ok("sh /tmp/s.sh"), c.ok("sh /home/user/s.sh")
				if exit := func(s string) string { e, _, _ := strings.Cut(s, ":"); return e }; exit(inHome) != exit(inTmp) || rt == "runc" && !strings.HasPrefix(inHome, "exit 126:") {
					t.Errorf("executing a script: in the home %q, in /tmp %q; want the same (exit 126 under runc)", inHome, inTmp)
				}
				if got := c.ok("sh sh s.sh"); got != "exit 0: ran\n" {
					t.Errorf("interpreting a script in the home: %q", got)
				}
				// The home's size cap.
				c.fails(fmt.Sprintf("fill /home/user/big %d", 2*spec.HomeBytes), "no space left on device")
				c.ok("sh rm big")
				c.ok(fmt.Sprintf("fill /home/user/fits %d", spec.HomeBytes/2))

				c.ok("sh i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done")
				u := l.Usage()
				t.Logf("%s: usage %+v, memory now %.1f MiB", rt, u, float64(l.MemoryBytes())/(1<<20))
				if u.CPUSeconds <= 0 || u.PeakMemoryBytes <= 0 || u.SandboxSeconds <= 0 || l.MemoryBytes() <= 0 {
					t.Errorf("usage %+v, memory %d: want all above zero", u, l.MemoryBytes())
				}
			})

			t.Run("two sandboxes are apart", func(t *testing.T) {
				a, ca := startLive(t, d, liveSpec(agent))
				b, cb := startLive(t, d, liveSpec(agent))
				if a.uid.UID == b.uid.UID {
					t.Errorf("both sandboxes run as uid %d", a.uid.UID)
				}
				ca.ok("write /home/user/secret a's")
				ca.ok("write /tmp/secret a's")
				ca.ok("sh bash -c 'exec -a vertal-live-marker sleep 600' >/dev/null 2>&1 &")
				cb.fails("read /home/user/secret", "no such file")
				cb.fails("read /tmp/secret", "no such file")
				if got := cb.ok("sh cat /proc/[0-9]*/cmdline | tr '\\0' ' '"); strings.Contains(got, "vertal-live-marker") || !strings.Contains(got, "/.vertal/agent") {
					t.Errorf("b's processes: %q; want its own agent and nothing of a's", got)
				}
				if got := ca.ok("sh cat /proc/[0-9]*/cmdline | tr '\\0' ' '"); !strings.Contains(got, "vertal-live-marker") {
					t.Errorf("a's processes: %q; want its marker (else the check on b proves nothing)", got)
				}
			})

			t.Run("fork bomb", func(t *testing.T) {
				spec := liveSpec(agent)
				spec.Limits.Pids, spec.Limits.CPUs = 32, 0.5
				l, c := startLive(t, d, spec)
				_, other := startLive(t, d, liveSpec(agent))
				c.ok("sh bash -c ':(){ :|:& };:' >/dev/null 2>&1 &")
				most := 0
				for range 20 {
					r := c.try("procs")
					if r.err != nil {
						t.Fatalf("the bombed sandbox's agent stopped answering: %v", r.err)
					}
					n, _ := strconv.Atoi(r.text)
					most = max(most, n)
					if n > int(sandbox.Pids(spec.Limits)) {
						t.Fatalf("%d processes in the sandbox, over its limit of %d", n, sandbox.Pids(spec.Limits))
					}
					time.Sleep(200 * time.Millisecond)
				}
				t.Logf("%s: at most %d processes seen under a limit of %d", rt, most, sandbox.Pids(spec.Limits))
				if most < int(spec.Limits.Pids)/2 {
					t.Errorf("at most %d processes seen; the bomb did not run, the check proves nothing", most)
				}
				if got := other.ok("sh echo served"); got != "exit 0: served\n" {
					t.Errorf("a second sandbox beside the bomb: %q", got)
				}
				if err := l.Discard(context.Background()); err != nil {
					t.Fatalf("Discard: %v", err)
				}
				if list := containersNamed(t, d, spec.ID); len(list) != 0 {
					t.Errorf("the bombed sandbox's container remains: %+v", list)
				}
			})

			t.Run("memory limit", func(t *testing.T) {
				spec := liveSpec(agent)
				spec.Limits.MemoryBytes = 64 << 20
				l, c := startLive(t, d, spec)
				r := c.try(`sh python3 -c 'b = bytearray(200 << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; print("survived")'`)
				// runc kills the hog (exit 137) and the agent answers;
				// gVisor's whole sandbox goes over the cgroup limit and ends.
				switch {
				case r.err == nil && strings.HasPrefix(r.text, "exit 137:"):
				case r.err != nil:
					waitDone(t, l, "over its memory limit")
				default:
					t.Errorf("200 MiB touched under a 64 MiB limit: %+v", r)
				}
				if peak := l.Usage().PeakMemoryBytes; peak > spec.Limits.MemoryBytes+oomMargin {
					t.Errorf("peak memory %d MiB over the 64 MiB limit", peak>>20)
				}
				t.Logf("%s: memory hog: answer %q, transport %v", rt, r.text, r.err)
			})

			t.Run("lifetime ends it", func(t *testing.T) {
				spec := liveSpec(agent)
				spec.Limits.Lifetime = 3 * time.Second
				l, c := startLive(t, d, spec)
				c.ok("id")
				waitDone(t, l, "Lifetime 3s")
				if r := c.try("id"); r.err == nil {
					t.Errorf("the agent still answers after the deadline: %+v", r)
				}
			})

			t.Run("closing the connection ends it", func(t *testing.T) {
				l, c := startLive(t, d, liveSpec(agent))
				c.ok("id")
				if err := l.Conn().Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				waitDone(t, l, "Conn closed")
				if _, err := l.Conn().Read(make([]byte, 1)); err == nil {
					t.Error("Read after Close succeeded")
				}
			})

			t.Run("discard removes it", func(t *testing.T) {
				spec := liveSpec(agent)
				l, c := startLive(t, d, spec)
				c.ok("sh sleep 600 >/dev/null 2>&1 &")
				if list := containersNamed(t, d, spec.ID); len(list) != 1 || list[0].State != "running" {
					t.Fatalf("before Discard, containers named %s: %+v; want the 1 running", spec.ID, list)
				}
				// The driver's own Reap spares it while it lives.
				if _, err := d.Reap(context.Background()); err != nil {
					t.Errorf("Reap: %v", err)
				}
				if got := c.ok("read /proc/self/cmdline"); !strings.HasPrefix(got, engine.AgentPath) {
					t.Errorf("after Reap the agent answers %q", got)
				}
				for i := range 2 {
					if err := l.Discard(context.Background()); err != nil {
						t.Fatalf("Discard #%d: %v", i+1, err)
					}
				}
				waitDone(t, l, "Discard")
				if list := containersNamed(t, d, spec.ID); len(list) != 0 {
					t.Errorf("after Discard, containers named %s: %+v", spec.ID, list)
				}
				if u := l.Usage(); u.SandboxSeconds <= 0 || u.CPUSeconds <= 0 {
					t.Errorf("usage after Discard %+v: want what the sandbox used", u)
				}
				if r := c.try("id"); r.err == nil {
					t.Errorf("the agent still answers after Discard: %+v", r)
				}
			})

			t.Run("reap removes a forgotten one", func(t *testing.T) {
				stateDir := t.TempDir()
				ctx := context.Background()
				gone, err := New(ctx, Options{Runtime: rt, StateDir: stateDir, Image: testImage()})
				if err != nil {
					t.Fatal(err)
				}
				spec := liveSpec(agent)
				live, err := gone.Start(ctx, spec)
				if err != nil {
					t.Fatal(err)
				}
				l := live.(*liveContainer)
				// The server is gone without a Discard: its instance lock
				// and uid lease go as at a crash.
				l.uid.Abandon()
				gone.lock.Close()
				gone.cli.Close()
				if list := containersNamed(t, d, spec.ID); len(list) != 1 {
					t.Fatalf("the forgotten sandbox has %d containers; want 1", len(list))
				}
				next := newTestDriverIn(t, rt, stateDir)
				if n, err := next.Reap(ctx); err != nil || n < 1 {
					t.Fatalf("Reap() = %d, %v; want at least the forgotten sandbox", n, err)
				}
				assertNothingLeftOf(t, next, gone.instance, spec.ID)
				if list := containersNamed(t, d, spec.ID); len(list) != 0 {
					t.Errorf("after Reap, containers named %s: %+v", spec.ID, list)
				}
			})
		})
	}
}
