// Package securitytest is the security and behaviour suite every sandbox
// driver must pass. Each case runs a small program (often a hostile one)
// through the driver and asserts what the platform promises: the attack
// fails, the limit holds, the status and exit code are right.
//
// Drivers call Run from their own end-to-end tests:
//
//	securitytest.Run(t, driver, languages)
//
// The suite talks to the driver only through engine.Driver, so the same
// cases prove the oci driver (crun, runc, runsc) and the docker driver
// (runc, runsc). Driver-specific checks are passed in Options.Extra.
//
// The attacks on each protection the doctor also proves (network,
// read-only root, /tmp, identity, capabilities, seccomp, namespaces,
// masked paths, environment, limits, timeout, fresh state) are the probes
// of package probes, run here as cases that must pass; this package adds
// the functional cases and the attacks only a test runs (files, per-user
// limits, a fork bomb, an output flood, warm/cold agreement).
//
// Network attacks only ever aim at addresses of the machine running the
// test: its loopback, its own interface addresses and, when it has one,
// the Docker bridge gateway.
package securitytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

// Case is one program the suite runs and what it must observe.
type Case struct {
	Name    string
	Lang    string // key into the languages map: "python", "javascript", "bash"
	Code    string
	Stdin   string
	Timeout time.Duration // default 20s
	Limits  engine.Limits // zero fields take the defaults
	// Files, Env, Args and ReturnFiles go into the Spec as they are.
	Files       []engine.File
	Env         map[string]string
	Args        []string
	ReturnFiles []string
	// Output, if set, is the Spec's live output sink.
	Output func(engine.Stream, []byte)
	// Check asserts on the outcome. err is the driver's error (nil for
	// every outcome of user code, including timeouts and OOM kills).
	Check func(t *testing.T, res engine.Result, err error)
}

// Options adjust the suite to a driver.
type Options struct {
	// Extra cases run after the common ones (e.g. docker-only checks).
	Extra []Case
}

// env is what a case may need from the suite's host-side fixtures.
type env struct {
	d     engine.Driver
	langs map[string]engine.Language
	// probe is the host as the probes see it: listeners the network
	// probe aims at, the planted variable, the host's namespaces.
	probe probes.Env
}

// Run runs the whole suite against d. langs must hold "python",
// "javascript" and "bash".
func Run(t *testing.T, d engine.Driver, langs map[string]engine.Language, opts ...Options) {
	t.Helper()
	for _, l := range []string{"python", "javascript", "bash"} {
		if _, ok := langs[l]; !ok {
			t.Fatalf("securitytest: language %q missing", l)
		}
	}
	var o Options
	for _, x := range opts {
		o.Extra = append(o.Extra, x.Extra...)
	}

	e := &env{d: d, langs: langs}
	// A secret in the server's environment must never reach user code.
	// t.Setenv cannot be used: callers may run suites in parallel, so the
	// variable's name is random.
	var err error
	e.probe, err = probes.HostEnv("VERTAL_SECURITYTEST_SECRET")
	t.Cleanup(e.probe.Close)
	if err != nil {
		t.Fatalf("securitytest: %v", err)
	}

	// Runtimes chown the sandbox's stdio; a driver that passes host files
	// as stdio hands them to the sandbox user. /dev/null is the usual one.
	devNull := ownerOf("/dev/null")
	t.Cleanup(func() {
		if got := ownerOf("/dev/null"); got != devNull {
			t.Errorf("host /dev/null changed from %s to %s during the suite: a runtime was given the host's /dev/null "+
				"as stdio and chowned it to the sandbox user (runsc does; e.g. a container without stdin attached)", devNull, got)
		}
	})

	for _, c := range functionalCases(e) {
		t.Run(c.Name, func(t *testing.T) { e.runCase(t, c) })
	}
	// The probes, which vertal doctor also runs on operators' hosts: each
	// must hold on every driver and runtime.
	for _, p := range probes.All(e.probe) {
		t.Run(p.Name, func(t *testing.T) { e.runProbe(t, p) })
	}
	cases := append(attackCases(e), fileCases(t, e)...)
	cases = append(cases, hostWallCases(e)...)
	cases = append(cases, o.Extra...)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) { e.runCase(t, c) })
	}
	// Multi-step cases need more than one execution.
	t.Run("output_flood_memory_flat", func(t *testing.T) { outputFlood(t, e) })
	t.Run("fork_bomb_then_healthy", func(t *testing.T) { forkBombThenHealthy(t, e) })
	for _, a := range perUserAttacks() {
		t.Run(a.name, func(t *testing.T) { perUserLimits(t, e, a) })
	}
	t.Run("agree", func(t *testing.T) { agree(t, e) })
}

// runCase runs one case and asserts on its outcome.
func (e *env) runCase(t *testing.T, c Case) {
	res, err := e.run(t, c)
	c.Check(t, res, err)
	if t.Failed() {
		logResult(t, res, err)
	}
}

// runProbe runs one probe: its judgement is the case's.
func (e *env) runProbe(t *testing.T, p probes.Probe) {
	if p.Skip != "" {
		t.Skip(p.Skip)
	}
	lang, ok := e.langs[p.Language]
	if !ok {
		t.Fatalf("unknown language %q", p.Language)
	}
	o := p.Run(context.Background(), e.d, lang, probes.RunOptions{})
	switch {
	case o.Err != nil:
		t.Errorf("%s: %v", p.Protection, o.Err)
	case p.GVisorGap && probes.OnGVisor(e.d.Name()):
		if o.OK {
			t.Errorf("%s now holds on %s (%s): drop the probe's GVisorGap and update docs/SECURITY.md", p.Protection, e.d.Name(), o.Detail)
		} else {
			t.Logf("known gVisor gap, as expected: %s: %s", p.Protection, o.Detail)
		}
	case !o.OK:
		t.Errorf("%s: %s", p.Protection, o.Detail)
	default:
		t.Logf("%s: %s", p.Protection, o.Detail)
	}
	if t.Failed() {
		logResult(t, o.Result, o.Err)
	}
}

func logResult(t *testing.T, res engine.Result, err error) {
	t.Helper()
	t.Logf("result: status=%s exit=%d truncated=%v stdout=%q stderr=%q err=%v",
		res.Status, res.ExitCode, res.Truncated, clip(res.Stdout), clip(res.Stderr), err)
}

// run executes one case through the driver.
func (e *env) run(t *testing.T, c Case) (engine.Result, error) {
	t.Helper()
	lang, ok := e.langs[c.Lang]
	if !ok {
		t.Fatalf("unknown language %q", c.Lang)
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 20 * time.Second
	}
	spec := enginetest.Complete(engine.Spec{
		ID:       "exe_" + randHex(16),
		Language: lang,
		Code:     c.Code,
		Stdin:    c.Stdin,
		Timeout:  timeout,
		Limits:   c.Limits,

		Files:       c.Files,
		Env:         c.Env,
		Args:        c.Args,
		ReturnFiles: c.ReturnFiles,
		Output:      c.Output,
	})
	ctx, cancel := context.WithTimeout(context.Background(), timeout+2*time.Minute)
	defer cancel()
	return e.d.Run(ctx, spec)
}

// ownerOf describes a host file's owner and mode.
func ownerOf(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("uid %d gid %d mode %o", st.Uid, st.Gid, st.Mode&0o7777)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func clip(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "…"
	}
	return s
}

// Assertions shared by cases.

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("driver error: %v", err)
	}
}

func wantStatus(t *testing.T, res engine.Result, err error, status engine.Status, exit int) {
	t.Helper()
	noErr(t, err)
	if res.Status != status || res.ExitCode != exit {
		t.Errorf("status, exit = %s, %d; want %s, %d", res.Status, res.ExitCode, status, exit)
	}
}

func wantContains(t *testing.T, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Errorf("output does not contain %q", sub)
	}
}

// wantNoMarker fails for every output line starting with a marker word
// the hostile programs print when an attack succeeded.
func wantNoMarker(t *testing.T, res engine.Result, markers ...string) {
	t.Helper()
	for _, line := range strings.Split(res.Stdout+"\n"+res.Stderr, "\n") {
		for _, m := range markers {
			if strings.HasPrefix(strings.TrimSpace(line), m) {
				t.Errorf("attack succeeded: %s", line)
			}
		}
	}
}

// heapSampler records the peak of the test process's live heap while a
// case runs, to show a flood of output is discarded as it arrives.
type heapSampler struct {
	stop chan struct{}
	done chan struct{}
	peak atomic.Uint64
}

func sampleHeap() *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), done: make(chan struct{})}
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > h.peak.Load() {
				h.peak.Store(v)
			}
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) Stop() uint64 {
	close(h.stop)
	<-h.done
	return h.peak.Load()
}

func heapNow() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
