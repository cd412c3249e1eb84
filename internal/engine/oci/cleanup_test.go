//go:build linux

package oci

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// TestMain lets the crash test re-execute this binary as a server that
// gets SIGKILLed mid-execution.
func TestMain(m *testing.M) {
	if rt := os.Getenv(crashChildEnv); rt != "" {
		crashChild(rt, os.Getenv(crashStateEnv))
		return
	}
	os.Exit(m.Run())
}

// leftovers lists what execution id of the driver instance inst (run by
// rt) left on this machine: bundle, runtime state, cgroups, mounts,
// processes.
func leftovers(d *Driver, inst string, rt runtimeKind, id string) []string {
	var out []string
	if _, err := os.Stat(filepath.Join(inst, "bundles", id)); err == nil {
		out = append(out, "bundle dir")
	}
	if _, err := os.Stat(statePath(rt, filepath.Join(inst, rt.name), id)); err == nil {
		out = append(out, "runtime state")
	}
	for _, dir := range d.cg.dirs(id) {
		if _, err := os.Stat(dir); err == nil {
			out = append(out, "cgroup "+dir)
		}
	}
	ms, _ := sandbox.MountsUnder(inst)
	// The driver's own /dev for bwrap is shared by its sandboxes and
	// removed by Close (or Reap), not by an execution.
	ms = slices.DeleteFunc(ms, func(m string) bool { return d.rt.bwrap && m == filepath.Join(inst, "dev") })
	if len(ms) > 0 {
		out = append(out, fmt.Sprintf("mounts %v", ms))
	}
	if ps := processesMentioning(id); len(ps) > 0 {
		out = append(out, fmt.Sprintf("processes %v", ps))
	}
	return out
}

// processesMentioning describes the processes whose command line holds s.
func processesMentioning(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(s)) {
			out = append(out, e.Name()+":"+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return out
}

// TestNothingLeftBehind runs one execution per kind of outcome and checks
// that none leaves a trace.
func TestNothingLeftBehind(t *testing.T) {
	e2e(t)
	langs := testLanguages()
	// A root filesystem the runtime cannot set up: /proc is a file.
	broken := t.TempDir()
	for _, dir := range []string{"tmp", "code", "dev"} {
		if err := os.Mkdir(filepath.Join(broken, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(broken, "proc"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	brokenLang := langs["python"]
	brokenLang.Image = broken

	cases := []struct {
		name    string
		lang    engine.Language
		code    string
		timeout time.Duration
		cancel  time.Duration // cancel the context after this long
		want    engine.Status // "" = the driver returns an error
		// broken: runc and crun fail to set the sandbox up (an error);
		// runsc builds /proc in its own kernel and runs, without python.
		broken bool
	}{
		{name: "succeeded", lang: langs["python"], code: "print(1)", want: engine.StatusSucceeded},
		{name: "failed", lang: langs["bash"], code: "exit 1", want: engine.StatusFailed},
		{name: "timed_out", lang: langs["python"], code: "import os\nos.fork()\nwhile True: pass", timeout: 2 * time.Second, want: engine.StatusTimedOut},
		{name: "memory_exceeded", lang: langs["python"], code: "x = [b'x' * (64 << 20) for _ in range(20)]", want: engine.StatusMemoryExceeded},
		{name: "truncated", lang: langs["python"], code: "print('x' * (1 << 20))", want: engine.StatusSucceeded},
		{name: "cancelled", lang: langs["python"], code: "import time\ntime.sleep(60)", cancel: 1500 * time.Millisecond},
		{name: "runtime_error", lang: brokenLang, code: "print(1)", broken: true},
	}
	for _, rtName := range allRuntimes {
		t.Run(rtName, func(t *testing.T) {
			d := newTestDriver(t, rtName)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					ctx := context.Background()
					if tc.cancel > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, tc.cancel)
						defer cancel()
					}
					timeout := tc.timeout
					if timeout == 0 {
						timeout = 20 * time.Second
					}
					id := enginetest.NewID()
					res, err := d.Run(ctx, enginetest.Complete(engine.Spec{ID: id, Language: tc.lang, Code: tc.code, Timeout: timeout}))
					if tc.broken {
						if err == nil && res.Status == engine.StatusSucceeded {
							t.Errorf("Run on a broken root filesystem succeeded")
						}
						t.Logf("outcome: %s, %v", res.Status, err)
					} else if tc.want == "" {
						if err == nil {
							t.Errorf("Run succeeded with status %s; want an error", res.Status)
						}
					} else if err != nil || res.Status != tc.want {
						t.Errorf("Run = %s, %v; want %s", res.Status, err, tc.want)
					}
					if diff := cmp.Diff([]string(nil), leftovers(d, d.instance, d.rt, id)); diff != "" {
						t.Errorf("left behind (-want +got):\n%s", diff)
					}
				})
			}
			t.Run("parallel", func(t *testing.T) {
				const n = 4
				ids := make([]string, n)
				errs := make(chan error, n)
				for i := range ids {
					ids[i] = enginetest.NewID()
					go func(id string) {
						res, err := d.Run(context.Background(), enginetest.Complete(engine.Spec{ID: id, Language: langs["python"], Code: "print(6*7)", Timeout: time.Minute}))
						if err == nil && res.Stdout != "42\n" {
							err = fmt.Errorf("stdout %q", res.Stdout)
						}
						errs <- err
					}(ids[i])
				}
				for range ids {
					if err := <-errs; err != nil {
						t.Error(err)
					}
				}
				for _, id := range ids {
					if diff := cmp.Diff([]string(nil), leftovers(d, d.instance, d.rt, id)); diff != "" {
						t.Errorf("left behind (-want +got):\n%s", diff)
					}
				}
			})
			for _, dir := range []string{d.bundlesDir, d.runtimeRoot} {
				if ents, _ := os.ReadDir(dir); len(ents) > 0 {
					t.Errorf("%s not empty: %v", dir, ents)
				}
			}
		})
	}
}

const (
	crashChildEnv = "VERTAL_OCI_CRASH_CHILD"
	crashStateEnv = "VERTAL_OCI_CRASH_STATE"
	crashSleepEnv = "VERTAL_OCI_CRASH_SLEEP"
)

// crashProgram keeps the sandbox busy with a daemonized, SIGTERM-ignoring
// grandchild, `sleep <arg>`, and an endless loop. The daemon creates
// crashReady in the working directory right before it becomes sleep: the
// host sees the file in the bundle under every runtime, gVisor's too,
// whose processes are not the host's.
func crashProgram(arg string) string {
	return `
import os, signal
if os.fork() == 0:
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open("` + crashReady + `", "w").close()
    os.execv("/bin/sleep", ["sleep", "` + arg + `"])
while True:
    pass
`
}

// crashReady is the file crashProgram's daemon creates once it runs.
const crashReady = "daemon-runs"

// crashChild is the server that gets killed: it starts one long execution
// and waits to be SIGKILLed.
func crashChild(rt, stateDir string) {
	d, err := New(context.Background(), Options{Runtime: rt, StateDir: stateDir, CgroupParent: "vertal-test"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(2)
	}
	timeout := 10 * time.Minute
	if v := os.Getenv(crashTimeoutEnv); v != "" {
		timeout, _ = time.ParseDuration(v)
	}
	spec := engine.Spec{Language: testLanguages()["python"], Code: crashProgram(os.Getenv(crashSleepEnv)), Timeout: timeout}
	if dir := os.Getenv(crashEgressEnv); dir != "" {
		spec.EgressDir, spec.Agent = dir, os.Getenv(crashAgentEnv)
	}
	res, err := d.Run(context.Background(), enginetest.Complete(spec))
	fmt.Fprintf(os.Stderr, "crash child: Run returned (status %q), it should have been killed: %v\n", res.Status, err)
	os.Exit(3)
}

// crashTimeoutEnv sets the crash child's execution timeout (default 10m,
// also when empty).
const crashTimeoutEnv = "VERTAL_OCI_CRASH_TIMEOUT"

// crashEgressEnv and crashAgentEnv, when set, give the crash child's
// execution an EgressDir and the agent.
const (
	crashEgressEnv = "VERTAL_OCI_CRASH_EGRESS"
	crashAgentEnv  = "VERTAL_OCI_CRASH_AGENT"
)

// startCrashChild runs this test binary as a server that starts one
// execution (a busy loop and a setsid, double-forked, SIGTERM-ignoring
// sleep) and waits to be SIGKILLed; it returns once the sandbox's daemon
// runs (crashReady), with the instance directory and execution id.
// Whatever happens after, the sandbox does not outlive the test.
func startCrashChild(t *testing.T, rtName, stateDir, sleepArg, timeout string) (*exec.Cmd, string, string) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), crashChildEnv+"="+rtName, crashStateEnv+"="+stateDir, crashSleepEnv+"="+sleepArg, crashTimeoutEnv+"="+timeout)
	var stderr bytes.Buffer
	child.Stderr = &stderr
	started := time.Now()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = child.Process.Kill()
		_ = child.Wait()
		if d, err := New(context.Background(), Options{Runtime: rtName, StateDir: stateDir, CgroupParent: "vertal-test"}); err == nil {
			_, _ = d.Reap(context.Background())
			d.Close()
		}
	})
	for deadline := started.Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ready, _ := filepath.Glob(filepath.Join(stateDir, "*", "bundles", "*", "code", crashReady))
		if len(ready) == 1 {
			bundle := filepath.Dir(filepath.Dir(ready[0]))
			t.Logf("the sandbox's daemon ran %v after the server started", time.Since(started).Round(10*time.Millisecond))
			return child, filepath.Dir(filepath.Dir(bundle)), filepath.Base(bundle)
		}
		var info unix.Siginfo
		// WNOWAIT: the server stays to be waited for, and so its stderr.
		ended := unix.Waitid(unix.P_PID, child.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil) == nil && info.Signo != 0
		if ended || time.Now().After(deadline) {
			_ = child.Process.Kill()
			_ = child.Wait()
			t.Fatalf("the sandbox's daemon did not run (server: %v after %v); server's stderr: %s", child.ProcessState, time.Since(started).Round(time.Second), stderr.String())
		}
	}
}

// killCrashChild SIGKILLs the server startCrashChild started and waits for
// it. A server that had already ended (its execution timed out, or failed)
// fails t: what follows would not be about a killed server.
func killCrashChild(t *testing.T, child *exec.Cmd) {
	t.Helper()
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	if ws, ok := child.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the server ended by itself (%v) before it was killed; its stderr: %s", child.ProcessState, child.Stderr)
	}
}

// uniqueSleepArg is a sleep length, from base seconds up, unique to this
// run: it names a sandbox's daemon among the host's processes.
func uniqueSleepArg(base int64) string {
	return fmt.Sprintf("%d.%d", base+time.Now().UnixNano()%9000, os.Getpid()%1000)
}

// reapAfterCrash opens a driver on the state dir of one that crashed, as
// the next server does, and reaps: it must remove the one sandbox left.
// The driver is closed when the test ends.
func reapAfterCrash(t *testing.T, rt, stateDir string) *Driver {
	t.Helper()
	d, err := New(context.Background(), Options{Runtime: rt, StateDir: stateDir, CgroupParent: "vertal-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	removed, err := d.Reap(context.Background())
	if err != nil {
		t.Errorf("Reap: %v", err)
	}
	if removed != 1 {
		t.Errorf("Reap removed %d sandboxes; want 1", removed)
	}
	return d
}

// TestDeadlineOutlivesServer SIGKILLs the server while its sandbox runs a
// busy loop and a daemon that escaped with setsid: with nothing left on
// the host to time it out, the sandbox still ends at its own deadline
// (timeout + engine.LifetimeGrace), before any Reap.
func TestDeadlineOutlivesServer(t *testing.T) {
	e2e(t)
	for _, rtName := range allRuntimes {
		t.Run(rtName, func(t *testing.T) {
			stateDir := testStateDir(t)
			sleepArg := uniqueSleepArg(70000)
			child, _, id := startCrashChild(t, rtName, stateDir, sleepArg, crashDeadlineTimeout.String())
			killCrashChild(t, child)
			killed := time.Now()
			probe := newTestDriver(t, rtName)
			alive := func() []string {
				out := processesMentioning("sleep\x00" + sleepArg)
				for _, p := range probe.cg.procs(id) {
					out = append(out, fmt.Sprintf("cgroup pid %d", p))
				}
				return out
			}
			if len(alive()) == 0 {
				if rtName == "bwrap" {
					// bwrap's --die-with-parent (PR_SET_PDEATHSIG) ends the
					// sandbox with the server, before its own deadline: the
					// property holds, sooner.
					t.Log("the sandbox ended with its server (bwrap --die-with-parent)")
					return
				}
				t.Fatal("the sandbox was gone at once; the test proves nothing")
			}
			// The deadline started inside the sandbox before its daemon
			// ran, so before the kill.
			for time.Since(killed) < crashDeadlineTimeout+engine.LifetimeGrace+15*time.Second {
				if len(alive()) == 0 {
					t.Logf("the sandbox ended by itself %v after its server was killed", time.Since(killed).Round(100*time.Millisecond))
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Fatalf("the sandbox outlived its own deadline by 15 s: %v", alive())
		})
	}
}

// crashDeadlineTimeout is the execution timeout of the server
// TestDeadlineOutlivesServer kills: the server's own timer must not fire
// first, even when a loaded host takes seconds to start the sandbox
// (runsc took more than 2 s with three other tests running).
const crashDeadlineTimeout = 10 * time.Second

// TestReapAfterCrash SIGKILLs a process running the driver mid-execution,
// then checks that Reap on a new driver removes everything it left.
func TestReapAfterCrash(t *testing.T) {
	e2e(t)
	for _, rtName := range allRuntimes {
		t.Run(rtName, func(t *testing.T) {
			stateDir := testStateDir(t)
			// A sleep length unique to this run names the sandbox's daemon.
			sleepArg := uniqueSleepArg(80000)
			daemon := "sleep\x00" + sleepArg
			child, inst, id := startCrashChild(t, rtName, stateDir, sleepArg, "")
			probe := newTestDriver(t, rtName)
			killCrashChild(t, child)

			rt := runtimes[rtName]
			before := leftovers(probe, inst, rt, id)
			if len(before) == 0 {
				t.Fatalf("the killed server left nothing behind; the test proves nothing")
			}
			var kinds []string
			for _, l := range before {
				kinds = append(kinds, strings.Fields(l)[0])
			}
			t.Logf("left by the killed server: %d items (%s)", len(before), strings.Join(slices.Compact(kinds), ", "))

			d := reapAfterCrash(t, rtName, stateDir)
			if diff := cmp.Diff([]string(nil), leftovers(d, inst, rt, id)); diff != "" {
				t.Errorf("left behind after Reap (-want +got):\n%s", diff)
			}
			if ps := processesMentioning(daemon); len(ps) > 0 {
				t.Errorf("the sandbox's daemon survived: %v", ps)
			}
			if ps := processesMentioning(inst); len(ps) > 0 {
				t.Errorf("runtime processes survived: %v", ps)
			}
			ents, _ := os.ReadDir(stateDir)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			own := filepath.Base(d.instance)
			if diff := cmp.Diff([]string{own, own + lockSuffix}, names); diff != "" {
				t.Errorf("state dir after Reap (-want +got):\n%s", diff)
			}
			// Reaping again finds nothing, and the live driver still works.
			if n, err := d.Reap(context.Background()); n != 0 || err != nil {
				t.Errorf("second Reap = %d, %v; want 0, nil", n, err)
			}
			res, err := d.Run(context.Background(), enginetest.Complete(engine.Spec{Language: testLanguages()["python"], Code: "print(6*7)", Timeout: 20 * time.Second}))
			if err != nil || res.Stdout != "42\n" {
				t.Errorf("Run after Reap = %q, %v", res.Stdout, err)
			}
		})
	}
}
