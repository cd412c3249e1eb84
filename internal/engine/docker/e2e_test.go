package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest"
)

// runtimes are the Docker runtimes every end-to-end test runs on.
var runtimes = []string{"runc", "runsc"}

func requireE2E(t *testing.T) { e2etest.Require(t, "a running Docker engine (scripts/dockerd.sh)") }

func testImage() string {
	if img := os.Getenv("VERTAL_DOCKER_IMAGE"); img != "" {
		return img
	}
	return DefaultImage
}

// newTestDriver returns a driver on rt with a state directory of its own.
// When the test ends it checks that the driver left no container and
// closes it.
func newTestDriver(t *testing.T, rt string) *Driver {
	t.Helper()
	return newTestDriverIn(t, rt, t.TempDir())
}

func newTestDriverIn(t *testing.T, rt, stateDir string) *Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := New(ctx, Options{Runtime: rt, StateDir: stateDir, Image: testImage()})
	if err != nil {
		t.Fatalf("New(%s): %v", rt, err)
	}
	t.Cleanup(func() {
		list, err := d.cli.ContainerList(context.Background(), byLabel(labelInstance, d.instance))
		if err != nil || len(list) != 0 {
			t.Errorf("at the end of the test the driver has %d containers (err %v); want none", len(list), err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if !isNotExist(filepath.Join(stateDir, d.instance)) || !isNotExist(d.lockPath()) {
			t.Errorf("after Close the instance directory or lock remains in %s", stateDir)
		}
	})
	return d
}

// byLabel lists containers (running or not) with label k=v.
func byLabel(k, v string) container.ListOptions {
	return container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", k+"="+v))}
}

func newID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	rand.Read(b)
	return "exe_" + hex.EncodeToString(b)
}

var languages = map[string]engine.Language{
	"python":     {Name: "python", File: "main.py", Command: []string{"python3", engine.CodeDir + "/main.py"}},
	"javascript": {Name: "javascript", File: "main.js", Command: []string{"node", engine.CodeDir + "/main.js"}},
	"bash":       {Name: "bash", File: "main.sh", Command: []string{"bash", engine.CodeDir + "/main.sh"}},
}

func run(t *testing.T, d *Driver, lang, code string, mod ...func(*engine.Spec)) engine.Result {
	t.Helper()
	spec := engine.Spec{ID: newID(t), Language: languages[lang], Code: code, Timeout: 20 * time.Second}
	for _, m := range mod {
		m(&spec)
	}
	res, err := d.Run(context.Background(), enginetest.Complete(spec))
	if err != nil {
		t.Fatalf("Run(%s %q): %v", lang, code, err)
	}
	assertNothingLeft(t, d, spec.ID)
	return res
}

// assertNothingLeft checks that execution id left no container, code
// directory or cgroup behind.
func assertNothingLeft(t *testing.T, d *Driver, id string) {
	t.Helper()
	assertNothingLeftOf(t, d, d.instance, id)
}

// assertNothingLeftOf checks for the leftovers of instance inst.
func assertNothingLeftOf(t *testing.T, d *Driver, inst, id string) {
	t.Helper()
	list, err := d.cli.ContainerList(context.Background(), byLabel(labelExecution, id))
	if err != nil {
		t.Fatalf("listing containers: %v", err)
	}
	if len(list) != 0 {
		t.Errorf("execution %s left %d container(s): %s", id, len(list), list[0].ID)
	}
	if dir := filepath.Join(d.opts.StateDir, inst, id); !isNotExist(dir) {
		t.Errorf("execution %s left its code directory %s", id, dir)
	}
	if d.acct != nil {
		for _, left := range d.acct.leftovers(inst) {
			if left == id {
				t.Errorf("execution %s left its parent cgroup", id)
			}
		}
	}
}

func isNotExist(path string) bool {
	_, err := os.Stat(path)
	return os.IsNotExist(err)
}

// TestSecuritySuite runs the shared security suite (internal/securitytest)
// on docker+runc and docker+runsc.
func TestSecuritySuite(t *testing.T) {
	requireE2E(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			langs := map[string]engine.Language{}
			for name, l := range languages {
				l.Image = testImage()
				langs[name] = l
			}
			securitytest.Run(t, d, langs)
		})
	}
}

func TestRunOutcomes(t *testing.T) {
	requireE2E(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			for _, tc := range []struct {
				name string
				lang string
				code string
				mod  func(*engine.Spec)
				want engine.Result // Duration and Usage are not compared
			}{
				{name: "python", lang: "python", code: "print(6*7)",
					want: engine.Result{Status: engine.StatusSucceeded, Stdout: "42\n"}},
				{name: "javascript", lang: "javascript", code: "console.log(6*7)",
					want: engine.Result{Status: engine.StatusSucceeded, Stdout: "42\n"}},
				{name: "bash", lang: "bash", code: "echo 42; echo oops >&2; exit 3",
					want: engine.Result{Status: engine.StatusFailed, Stdout: "42\n", Stderr: "oops\n", ExitCode: 3}},
				{name: "stdin", lang: "python", code: "import sys; print(sys.stdin.read().upper(), end='')",
					mod:  func(s *engine.Spec) { s.Stdin = "hello\nworld\n" },
					want: engine.Result{Status: engine.StatusSucceeded, Stdout: "HELLO\nWORLD\n"}},
				{name: "no stdin reads EOF", lang: "python", code: "import sys; print(repr(sys.stdin.read()))",
					want: engine.Result{Status: engine.StatusSucceeded, Stdout: "''\n"}},
				{name: "memory exceeded", lang: "python", code: "print('start', flush=True)\nb = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')",
					mod:  func(s *engine.Spec) { s.Limits.MemoryBytes = 64 << 20 },
					want: engine.Result{Status: engine.StatusMemoryExceeded, Stdout: "start\n", ExitCode: 128 + 9}},
				{name: "timeout", lang: "bash", code: "echo started; sleep 60",
					mod:  func(s *engine.Spec) { s.Timeout = time.Second },
					want: engine.Result{Status: engine.StatusTimedOut, Stdout: "started\n", ExitCode: 128 + 9}},
				{name: "truncated", lang: "python", code: "import sys\nsys.stdout.write('x'*100000)\nsys.stderr.write('e'*10)",
					mod:  func(s *engine.Spec) { s.Limits.OutputBytes = 1000 },
					want: engine.Result{Status: engine.StatusSucceeded, Stdout: strings.Repeat("x", 1000), Stderr: "eeeeeeeeee", Truncated: true}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					got := run(t, d, tc.lang, tc.code, func(s *engine.Spec) {
						if tc.mod != nil {
							tc.mod(s)
						}
					})
					got.Duration, got.Usage = 0, engine.Usage{}
					if diff := cmp.Diff(tc.want, got); diff != "" {
						t.Errorf("result (-want +got):\n%s", diff)
					}
				})
			}
		})
	}
}

func TestUsage(t *testing.T) {
	requireE2E(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			if d.acct == nil {
				t.Fatal("cgroup accounting unavailable; the engine's cgroups should be visible on this host")
			}
			// 100 MiB touched, and a second of busy CPU.
			res := run(t, d, "python", "import time\nb = bytearray(100 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nt = time.process_time()\nwhile time.process_time() - t < 1: pass\nprint('ok')")
			if res.Status != engine.StatusSucceeded {
				t.Fatalf("status %s, stderr %q", res.Status, res.Stderr)
			}
			t.Logf("%s: duration %v, cpu %.3fs, peak %d MiB", rt, res.Duration, res.Usage.CPUSeconds, res.Usage.PeakMemoryBytes>>20)
			if res.Usage.PeakMemoryBytes < 100<<20 {
				t.Errorf("peak memory %d, want at least the 100 MiB touched", res.Usage.PeakMemoryBytes)
			}
			// gVisor's sentry keeps the guest's CPU clock itself; the host
			// cgroup's count of the same second comes out under it: a few
			// percent on an idle host (0.97-0.999 s seen), and more on a
			// loaded one, where the sentry's clock runs on while its
			// threads wait for a CPU (CI failed here with every package's
			// tests running at once). runsc gets a margin wide enough for
			// that, and still fails on a count that is missing or wrong.
			want := 1.0
			if rt == "runsc" {
				want = 0.5
			}
			if res.Usage.CPUSeconds < want {
				t.Errorf("cpu %.3fs, want at least %.1fs for the 1s spent busy", res.Usage.CPUSeconds, want)
			}
			if res.Usage.SandboxSeconds < res.Usage.CPUSeconds/2 {
				t.Errorf("sandbox seconds %.3f less than half the cpu seconds %.3f on a 1-CPU limit", res.Usage.SandboxSeconds, res.Usage.CPUSeconds)
			}
		})
	}
}

// reapHelperEnv makes the test binary, re-executed by TestReapAfterSIGKILL,
// start one long execution and wait to be killed.
const reapHelperEnv = "VERTAL_DOCKER_REAP_HELPER"

func TestMain(m *testing.M) {
	if v := os.Getenv(reapHelperEnv); v != "" {
		os.Exit(reapHelper(v))
	}
	os.Exit(m.Run())
}

func reapHelper(arg string) int {
	parts := strings.SplitN(arg, ",", 4) // runtime, state dir, execution ID, code
	ctx := context.Background()
	d, err := New(ctx, Options{Runtime: parts[0], StateDir: parts[1], Image: testImage()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	timeout := time.Minute
	if v := os.Getenv(reapTimeoutEnv); v != "" {
		timeout, _ = time.ParseDuration(v)
	}
	spec := engine.Spec{ID: parts[2], Language: languages["bash"], Code: parts[3], Timeout: timeout}
	if dir := os.Getenv(reapEgressEnv); dir != "" {
		spec.EgressDir, spec.Agent = dir, os.Getenv(reapAgentEnv)
	}
	_, err = d.Run(ctx, enginetest.Complete(spec))
	fmt.Fprintln(os.Stderr, "helper: Run returned, it should have been killed:", err)
	return 3
}

// reapTimeoutEnv sets the helper's execution timeout (default 1m).
const reapTimeoutEnv = "VERTAL_DOCKER_REAP_TIMEOUT"

// TestDeadlineOutlivesServer kills a server mid-run: with nothing on the
// host left to time the container out, it still stops by itself at its
// own deadline (timeout + engine.LifetimeGrace), before any Reap. The
// server is killed once the container's setsid daemon runs, which it says
// with a file in the code directory (the host sees it under runsc too);
// the timeout leaves a loaded host seconds to start the container before
// the server's own timer would stop it.
func TestDeadlineOutlivesServer(t *testing.T) {
	requireE2E(t)
	const timeout, ready = 10 * time.Second, "daemon-runs"
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			stateDir, id := t.TempDir(), newID(t)
			code := "(setsid sh -c 'echo > " + engine.CodeDir + "/" + ready + "; exec sleep 600' &); trap '' TERM; sleep 600"
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), reapTimeoutEnv+"="+timeout.String(),
				reapHelperEnv+"="+strings.Join([]string{rt, stateDir, id, code}, ","))
			cmd.Stderr = os.Stderr
			started := time.Now()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			ctx := context.Background()
			cli := newTestDriver(t, rt).cli
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
				_, _ = newTestDriverIn(t, rt, stateDir).Reap(ctx)
			})
			for {
				if m, _ := filepath.Glob(filepath.Join(stateDir, "*", id, ready)); len(m) == 1 {
					break
				}
				select {
				case <-exited:
					t.Fatalf("the server ended (%v) before the container's daemon ran; its stderr is above", cmd.ProcessState)
				case <-time.After(20 * time.Millisecond):
				}
				if time.Since(started) > time.Minute {
					t.Fatal("the container's daemon did not run within a minute")
				}
			}
			t.Logf("the container's daemon ran %v after the server started", time.Since(started).Round(10*time.Millisecond))
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-exited
			killed := time.Now()
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the server ended by itself (%v) before it was killed; its stderr is above", cmd.ProcessState)
			}
			running := func() bool {
				list, err := cli.ContainerList(ctx, byLabel(labelExecution, id))
				return err == nil && len(list) == 1 && list[0].State == "running"
			}
			if !running() {
				t.Fatal("the container was gone at once; the test proves nothing")
			}
			for running() {
				if time.Since(killed) > timeout+engine.LifetimeGrace+15*time.Second {
					t.Fatal("the container outlived its own deadline by 15 s")
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("the container stopped by itself %v after its server was killed", time.Since(killed).Round(100*time.Millisecond))
		})
	}
}

// TestReapAfterSIGKILL kills a server mid-run and checks that the next
// server's Reap removes the container, the processes in it, the code
// directory, the dead instance's lock and its cgroups.
func TestReapAfterSIGKILL(t *testing.T) {
	requireE2E(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			stateDir, id := t.TempDir(), newID(t)
			marker := "vertal-marker-" + newID(t)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), reapHelperEnv+"="+strings.Join([]string{rt, stateDir, id, "exec -a " + marker + " sleep 600"}, ","))
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			cli := newTestDriver(t, rt).cli

			// Wait until the helper's sandbox runs the code, then kill the
			// helper the way a crash or the OOM killer would.
			var running container.Summary
			waitFor(t, func() bool {
				list, err := cli.ContainerList(ctx, byLabel(labelExecution, id))
				if err == nil && len(list) == 1 && list[0].State == "running" && (rt == "runsc" || len(hostProcesses(t, marker)) == 1) {
					running = list[0]
					return true
				}
				return false
			})
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			inst := running.Labels[labelInstance]
			ours := map[string]string{}
			for _, k := range []string{labelSandbox, labelInstance, labelOwner, labelExecution, labelPID} {
				ours[k] = running.Labels[k]
			}
			want := map[string]string{
				labelSandbox: "1", labelInstance: inst, labelOwner: filepath.Join(stateDir, inst+".lock"),
				labelExecution: id, labelPID: strconv.Itoa(cmd.Process.Pid),
			}
			if diff := cmp.Diff(want, ours); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}

			// The crash left the container running, its code directory,
			// the instance's lock and cgroups.
			if list, _ := cli.ContainerList(ctx, byLabel(labelExecution, id)); len(list) != 1 {
				t.Fatalf("after SIGKILL, %d containers of the execution; want the 1 leftover", len(list))
			}
			if len(hostProcesses(t, marker, running.ID)) == 0 {
				t.Fatal("after SIGKILL, no host process of the sandbox found; the check after Reap would prove nothing")
			}
			if isNotExist(filepath.Join(stateDir, inst, id)) || isNotExist(filepath.Join(stateDir, inst+".lock")) {
				t.Fatal("after SIGKILL, the code directory or lock is already gone; the check after Reap would prove nothing")
			}

			// A restarted server (a new driver on the same state directory)
			// reaps it.
			d := newTestDriverIn(t, rt, stateDir)
			n, err := d.Reap(ctx)
			if err != nil || n < 1 {
				t.Fatalf("Reap() = %d, %v; want at least the 1 leftover, nil", n, err)
			}
			assertNothingLeftOf(t, d, inst, id)
			if left := hostProcesses(t, marker, running.ID); len(left) != 0 {
				t.Errorf("after Reap, processes of the sandbox remain on the host: %v", left)
			}
			if !isNotExist(filepath.Join(stateDir, inst)) || !isNotExist(filepath.Join(stateDir, inst+".lock")) {
				t.Errorf("after Reap, the dead instance's directory or lock remains")
			}
		})
	}
}

// TestReapSparesLiveInstances runs a sandbox on one driver and reaps with
// another: a live server's executions must survive a second server's
// start-up, and the first driver's own Reap must spare its running ones.
func TestReapSparesLiveInstances(t *testing.T) {
	requireE2E(t)
	stateDir := t.TempDir()
	a := newTestDriverIn(t, "runc", stateDir)
	b := newTestDriverIn(t, "runc", stateDir)
	other := newTestDriver(t, "runc") // another state directory

	spec := engine.Spec{ID: newID(t), Language: languages["bash"], Code: "sleep 3; echo done", Timeout: time.Minute}
	done := make(chan engine.Result, 1)
	go func() {
		res, err := a.Run(context.Background(), enginetest.Complete(spec))
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		done <- res
	}()
	waitFor(t, func() bool {
		list, err := a.cli.ContainerList(context.Background(), byLabel(labelExecution, spec.ID))
		return err == nil && len(list) == 1 && list[0].State == "running"
	})
	// Counts are not compared: other test binaries may leave dead
	// instances for these Reaps to remove.
	for name, d := range map[string]*Driver{"same driver": a, "same state dir": b, "other state dir": other} {
		if _, err := d.Reap(context.Background()); err != nil {
			t.Errorf("Reap on %s: %v", name, err)
		}
		list, err := a.cli.ContainerList(context.Background(), byLabel(labelExecution, spec.ID))
		if err != nil || len(list) != 1 || list[0].State != "running" {
			t.Fatalf("after Reap on %s the live execution's container is gone or stopped: %+v, %v", name, list, err)
		}
	}
	if res := <-done; res.Status != engine.StatusSucceeded || res.Stdout != "done\n" {
		t.Errorf("the execution did not survive the other Reaps: %+v", res)
	}
}

// hostProcesses lists host processes whose command line contains any of
// needles (a marker from the user's code, a container ID in runsc's
// arguments).
func hostProcesses(t *testing.T, needles ...string) []string {
	t.Helper()
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmdline := strings.ReplaceAll(string(b), "\x00", " ")
		for _, n := range needles {
			if strings.Contains(cmdline, n) {
				found = append(found, filepath.Base(filepath.Dir(p))+": "+cmdline)
				break
			}
		}
	}
	return found
}

func TestCancelLeavesNothing(t *testing.T) {
	requireE2E(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			marker := "vertal-marker-" + newID(t)
			spec := engine.Spec{ID: newID(t), Language: languages["bash"], Code: "exec -a " + marker + " sleep 600", Timeout: time.Minute}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := d.Run(ctx, enginetest.Complete(spec))
				done <- err
			}()
			byID := container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", labelExecution+"="+spec.ID), filters.Arg("status", "running"))}
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if list, err := d.cli.ContainerList(context.Background(), byID); err == nil && len(list) == 1 {
					break
				}
				if time.Now().After(deadline) {
					cancel()
					t.Fatal("the sandbox did not start running")
				}
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run after cancel: err %v, want context.Canceled", err)
			}
			assertNothingLeft(t, d, spec.ID)
			if left := hostProcesses(t, marker); len(left) != 0 {
				t.Errorf("processes of the cancelled sandbox remain: %v", left)
			}
		})
	}
}

func TestNewUnavailable(t *testing.T) {
	requireE2E(t)
	for name, opts := range map[string]Options{
		"no such runtime": {Runtime: "nosuchruntime"},
		"no such image":   {Image: "vertal/no-such-image:latest"},
	} {
		t.Run(name, func(t *testing.T) {
			opts.StateDir = t.TempDir()
			d, err := New(context.Background(), opts)
			if !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), "scripts/dockerd.sh") {
				t.Errorf("New: %v; want ErrUnavailable saying what to do", err)
			}
			if d != nil {
				d.Close()
			}
		})
	}
}

func TestPlatformErrorLeavesNothing(t *testing.T) {
	requireE2E(t)
	d := newTestDriver(t, "runc")
	lang := languages["python"]
	lang.Image = "vertal/no-such-image:latest"
	spec := engine.Spec{ID: newID(t), Language: lang, Code: "print(1)", Timeout: time.Minute}
	if _, err := d.Run(context.Background(), enginetest.Complete(spec)); err == nil {
		t.Fatal("Run with a missing image succeeded; want an error")
	}
	assertNothingLeft(t, d, spec.ID)
}

// TestHostUnreachable proves the sandbox reaches neither the Docker bridge
// gateway nor any of the host's addresses, on TCP or UDP, while the same
// probe run on the host does reach them.
func TestHostUnreachable(t *testing.T) {
	requireE2E(t)
	ctx := context.Background()

	tcp, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	udp, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	var accepted, received atomic.Int64
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			if _, _, err := udp.ReadFrom(buf); err != nil {
				return
			}
			received.Add(1)
		}
	}()

	d := newTestDriver(t, "runc")
	bridge, err := d.cli.NetworkInspect(ctx, "bridge", network.InspectOptions{})
	if err != nil {
		t.Fatalf("inspecting Docker's bridge network: %v", err)
	}
	targets := []string{"127.0.0.1"}
	for _, c := range bridge.IPAM.Config {
		if c.Gateway != "" {
			targets = append(targets, c.Gateway)
		}
	}
	// The default bridge often lists no gateway: it is the bridge
	// interface's own address (172.17.0.1 on docker0).
	if ifi, err := net.InterfaceByName(bridge.Options["com.docker.network.bridge.name"]); err == nil {
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !slices.Contains(targets, ip.IP.String()) {
				targets = append(targets, ip.IP.String())
			}
		}
	}
	if len(targets) < 2 {
		t.Fatal("Docker's bridge network has no gateway to probe")
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() && !slices.Contains(targets, ip.IP.String()) {
			targets = append(targets, ip.IP.String())
		}
	}
	tcpPort := tcp.Addr().(*net.TCPAddr).Port
	udpPort := udp.LocalAddr().(*net.UDPAddr).Port
	probe := fmt.Sprintf(`import socket
for host in [%s]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, %d))
        print("tcp", host, "open")
    except OSError as e:
        print("tcp", host, "blocked", type(e).__name__)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.sendto(b"x", (host, %d))
        print("udp", host, "sent")
    except OSError as e:
        print("udp", host, "blocked", type(e).__name__)
`, `"`+strings.Join(targets, `", "`)+`"`, tcpPort, udpPort)

	// The probe itself works: from the host it reaches every target.
	out, err := exec.Command("/usr/bin/python3", "-c", probe).CombinedOutput()
	if err != nil {
		t.Fatalf("probe on the host: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "blocked") {
		t.Fatalf("probe on the host could not reach a target, so it proves nothing:\n%s", out)
	}
	waitFor(t, func() bool { return accepted.Load() >= int64(len(targets)) && received.Load() >= int64(len(targets)) })
	accepted.Store(0)
	received.Store(0)

	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			res := run(t, d, "python", probe)
			if res.Status != engine.StatusSucceeded {
				t.Fatalf("probe: status %s, stderr %q", res.Status, res.Stderr)
			}
			t.Logf("probe in the sandbox (targets %v):\n%s", targets, res.Stdout)
			lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
			if len(lines) != 2*len(targets) {
				t.Fatalf("probe printed %d lines, want %d", len(lines), 2*len(targets))
			}
			for _, l := range lines {
				// 127.0.0.1 is the sandbox's own loopback; sending to it
				// works but reaches nothing of the host (checked below).
				if !strings.Contains(l, "blocked") && l != "udp 127.0.0.1 sent" {
					t.Errorf("sandbox reached the host: %s", l)
				}
			}
			time.Sleep(200 * time.Millisecond) // let stray packets arrive before counting
			if n, m := accepted.Load(), received.Load(); n != 0 || m != 0 {
				t.Errorf("host listeners got %d TCP connections and %d UDP datagrams from the sandbox", n, m)
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}

// TestEngineAppliesPolicy reads the OCI spec Docker hands the runtime and
// checks that every hardening item we asked for is in it: Docker silently
// drops some HostConfig fields on older API versions.
func TestEngineAppliesPolicy(t *testing.T) {
	requireE2E(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			spec := enginetest.Complete(engine.Spec{ID: newID(t), Language: languages["bash"], Code: "sleep 600", Timeout: time.Minute})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := d.Run(ctx, spec)
				done <- err
			}()
			defer func() {
				cancel()
				<-done
				assertNothingLeft(t, d, spec.ID)
			}()
			byID := container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", labelExecution+"="+spec.ID), filters.Arg("status", "running"))}
			var cid string
			waitFor(t, func() bool {
				list, err := d.cli.ContainerList(context.Background(), byID)
				if err == nil && len(list) == 1 {
					cid = list[0].ID
				}
				return cid != ""
			})
			paths, _ := filepath.Glob("/run/docker/containerd/daemon/io.containerd.runtime.v*/moby/" + cid + "/config.json")
			if len(paths) != 1 {
				t.Fatalf("found %d OCI specs for container %s, want 1", len(paths), cid)
			}
			b, err := os.ReadFile(paths[0])
			if err != nil {
				t.Fatal(err)
			}
			var s specs.Spec
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatal(err)
			}
			pol := d.policy

			// Docker lists the primary gid among the additional ones.
			if u := s.Process.User; u.UID != u.GID || u.UID < uidpool.DefaultFirst || u.UID >= uidpool.DefaultFirst+uidpool.DefaultCount ||
				slices.ContainsFunc(u.AdditionalGids, func(g uint32) bool { return g != u.GID }) {
				t.Errorf("user %d:%d %v, want a leased uid = gid and no other group", u.UID, u.GID, u.AdditionalGids)
			}
			if !s.Process.NoNewPrivileges {
				t.Error("noNewPrivileges is off")
			}
			if c := s.Process.Capabilities; c != nil && len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable)+len(c.Ambient) != 0 {
				t.Errorf("capabilities left: %+v", c)
			}
			wantRlimits := []specs.POSIXRlimit{{Type: "RLIMIT_FSIZE", Hard: 1 << 20, Soft: 1 << 20}, {Type: "RLIMIT_CORE"}, {Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}}
			// The program's 64, plus the deadline's timeout process.
			wantPids := int64(engine.DefaultPids + 1)
			if rt == "runsc" {
				wantRlimits = append(wantRlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(wantPids), Soft: uint64(wantPids)})
				wantPids *= gvisorThreadsPerTask
			}
			if diff := cmp.Diff(wantRlimits, s.Process.Rlimits); diff != "" {
				t.Errorf("rlimits (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(sandbox.EnvFor(spec.Limits), envWithout(s.Process.Env, "HOSTNAME")); diff != "" {
				t.Errorf("environment (-want +got):\n%s", diff)
			}
			if !s.Root.Readonly {
				t.Error("root is writable")
			}
			var nss []string
			for _, ns := range s.Linux.Namespaces {
				if ns.Path != "" {
					t.Errorf("namespace %s joins %s instead of being new", ns.Type, ns.Path)
				}
				nss = append(nss, string(ns.Type))
			}
			slices.Sort(nss)
			if diff := cmp.Diff([]string{"cgroup", "ipc", "mount", "network", "pid", "uts"}, nss); diff != "" {
				t.Errorf("namespaces (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(pol.MaskedPaths, s.Linux.MaskedPaths); diff != "" {
				t.Errorf("masked paths (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(pol.ReadonlyPaths, s.Linux.ReadonlyPaths); diff != "" {
				t.Errorf("read-only paths (-want +got):\n%s", diff)
			}
			r := s.Linux.Resources
			wantMem := int64(engine.DefaultMemoryBytes)
			if d.acct != nil && !d.acct.v2 {
				// cgroup v1: the parent cgroup holds the limit itself, the
				// container a margin more (accounting.limitParent).
				wantMem += oomMargin
				if got, err := sandbox.ReadCgroupInt(filepath.Join(d.acct.root, "memory", d.acct.parent(d.instance, spec.ID), "memory.limit_in_bytes")); err != nil || got != engine.DefaultMemoryBytes {
					t.Errorf("parent memory limit %d, %v; want %d", got, err, engine.DefaultMemoryBytes)
				}
			}
			if r == nil || r.Memory == nil || r.Memory.Limit == nil || *r.Memory.Limit != wantMem ||
				r.Memory.Swap == nil || *r.Memory.Swap != wantMem {
				t.Errorf("memory limits %+v, want limit = swap = %d", r.Memory, wantMem)
			}
			if r.Pids == nil || r.Pids.Limit == nil || *r.Pids.Limit != wantPids {
				t.Errorf("pids limit %+v, want %d", r.Pids, wantPids)
			}
			if r.CPU == nil || r.CPU.Quota == nil || r.CPU.Period == nil || *r.CPU.Quota != int64(*r.CPU.Period) {
				t.Errorf("cpu %+v, want a quota of one period (1 CPU)", r.CPU)
			}
			if s.Linux.Seccomp == nil {
				t.Fatal("no seccomp profile")
			}
			if pol.Seccomp != "" {
				var want specs.LinuxSeccomp
				if err := json.Unmarshal([]byte(pol.Seccomp), &want); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want.DefaultAction, s.Linux.Seccomp.DefaultAction); diff != "" {
					t.Errorf("seccomp default action (-want +got):\n%s", diff)
				}
			}
			for _, sc := range s.Linux.Seccomp.Syscalls {
				for _, n := range sc.Names {
					if sc.Action == specs.ActAllow && slices.Contains([]string{"io_uring_setup", "bpf", "userfaultfd", "perf_event_open", "keyctl", "ptrace", "mount", "unshare", "setns"}, n) && len(sc.Args) == 0 {
						t.Errorf("seccomp allows %s unconditionally", n)
					}
				}
			}
			mounts := map[string]specs.Mount{}
			for _, m := range s.Mounts {
				mounts[m.Destination] = m
			}
			// The working directory is a bind of a host tmpfs: noexec,
			// nosuid and nodev are on the host mount (the bind keeps them),
			// and the security suite proves them by attack.
			wantMounts := map[string][]string{
				"/tmp":     {"noexec", "nosuid", "nodev", "size=16777216"},
				"/dev/shm": {"noexec", "nosuid", "nodev", "size=67108864"},
				"/code":    {"rbind"},
			}
			if rt == "runsc" {
				// Host tmpfs volumes: their options are on the host mount,
				// and the security suite proves them by attack.
				wantMounts["/tmp"] = []string{"rbind"}
				wantMounts["/dev/shm"] = []string{"rbind"}
			}
			for dest, want := range wantMounts {
				m, ok := mounts[dest]
				if !ok {
					t.Errorf("no mount at %s", dest)
					continue
				}
				for _, o := range want {
					if !slices.Contains(m.Options, o) {
						t.Errorf("mount %s options %v lack %s", dest, m.Options, o)
					}
				}
			}
		})
	}
}

// BenchmarkDriverVsDockerRun alternates one execution of print(6*7)
// through the driver with one `docker run` of the same container (flags
// derived from the driver's own container config), and reports both and
// their ratio: the target is driver <= 1.1 x docker run.
//
//	VERTAL_E2E=1 go test -run '^$' -bench DriverVsDockerRun -benchtime 40x ./internal/engine/docker
func BenchmarkDriverVsDockerRun(b *testing.B) {
	if os.Getenv("VERTAL_E2E") != "1" {
		b.Skip("set VERTAL_E2E=1")
	}
	for _, rt := range runtimes {
		b.Run(rt, func(b *testing.B) {
			ctx := context.Background()
			d, err := New(ctx, Options{Runtime: rt, StateDir: b.TempDir(), Image: testImage()})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			lang := languages["python"]
			args, cleanup := dockerRunArgs(b, d, lang, "print(6*7)")
			defer cleanup()

			var driver, cli time.Duration
			for i := 0; b.Loop(); i++ {
				t0 := time.Now()
				res, err := d.Run(ctx, enginetest.Complete(engine.Spec{ID: fmt.Sprintf("exe_bench%d", i), Language: lang, Code: "print(6*7)", Timeout: 20 * time.Second}))
				driver += time.Since(t0)
				if err != nil || res.Stdout != "42\n" {
					b.Fatalf("driver run: %v, %+v", err, res)
				}
				t0 = time.Now()
				out, err := exec.Command("docker", args...).Output()
				cli += time.Since(t0)
				if err != nil || string(out) != "42\n" {
					b.Fatalf("docker run: %v, %q", err, out)
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(driver.Milliseconds())/n, "driver-ms/run")
			b.ReportMetric(float64(cli.Milliseconds())/n, "docker-run-ms/run")
			b.ReportMetric(float64(driver)/float64(cli), "ratio")
		})
	}
}

// dockerRunArgs translates the driver's container config into `docker run`
// flags, so the baseline runs exactly the container the driver creates
// (Docker's default masked paths stand in for ours: the CLI has no flag).
func dockerRunArgs(b *testing.B, d *Driver, lang engine.Language, code string) ([]string, func()) {
	dir := b.TempDir()
	codeDir := filepath.Join(dir, "code")
	if err := os.Mkdir(codeDir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(codeDir, lang.File), []byte(code), 0o644); err != nil {
		b.Fatal(err)
	}
	profile := filepath.Join(dir, "seccomp.json")
	if err := os.WriteFile(profile, []byte(d.policy.Seccomp), 0o644); err != nil {
		b.Fatal(err)
	}
	cfg, host := d.containerConfig(enginetest.Complete(engine.Spec{ID: "exe_cli", Language: lang}), codeDir, os.Getpid(), sandbox.UID)
	r := host.Resources
	args := []string{"run", "--rm", "--runtime", host.Runtime, "--init", "--network", string(host.NetworkMode),
		"--ipc", string(host.IpcMode), "--cgroupns", string(host.CgroupnsMode), "--read-only",
		"--oom-score-adj", strconv.Itoa(host.OomScoreAdj), "--cap-drop", "ALL",
		"--security-opt", "no-new-privileges", "--security-opt", "seccomp=" + profile,
		"--log-driver", host.LogConfig.Type, "--cgroup-parent", "/vertal-bench",
		"--memory", strconv.FormatInt(r.Memory, 10), "--memory-swap", strconv.FormatInt(r.MemorySwap, 10),
		"--cpus", strconv.FormatFloat(float64(r.NanoCPUs)/1e9, 'f', -1, 64), "--pids-limit", strconv.FormatInt(*r.PidsLimit, 10),
		"--user", cfg.User, "--workdir", cfg.WorkingDir, "--hostname", cfg.Hostname, "--entrypoint", "",
		"--label", labelSandbox + "=bench",
	}
	for _, u := range r.Ulimits {
		args = append(args, "--ulimit", fmt.Sprintf("%s=%d:%d", u.Name, u.Soft, u.Hard))
	}
	for _, e := range cfg.Env {
		args = append(args, "--env", e)
	}
	for _, m := range host.Mounts {
		switch m.Type {
		case mount.TypeBind:
			args = append(args, "--mount", fmt.Sprintf("type=bind,src=%s,dst=%s,readonly", m.Source, m.Target))
		case mount.TypeVolume:
			o := m.VolumeOptions.DriverConfig.Options
			args = append(args, "--mount", fmt.Sprintf(`type=volume,dst=%s,volume-driver=local,volume-opt=type=%s,volume-opt=device=%s,"volume-opt=o=%s"`,
				m.Target, o["type"], o["device"], o["o"]))
		}
	}
	for dst, opts := range host.Tmpfs {
		args = append(args, "--tmpfs", dst+":"+opts)
	}
	args = append(args, cfg.Image)
	args = append(args, cfg.Cmd...)
	return args, func() {
		a := &accounting{root: "/sys/fs/cgroup"}
		for _, h := range a.hierarchies() {
			_ = sandbox.RemoveCgroup(filepath.Join(h, "vertal-bench"), nil)
		}
	}
}

func envWithout(env []string, name string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, name+"=") })
}
