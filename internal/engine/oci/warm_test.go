package oci

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
)

// The warm sandbox's own contract; the comparison with the cold path and
// the security suite through the pool are in package pool's tests.

func warmDriver(t *testing.T) (*Driver, *Prestarter) {
	t.Helper()
	if os.Getenv("VERTAL_E2E") != "1" {
		t.Skip("set VERTAL_E2E=1 to run against real OCI runtimes (needs root and the rootfs)")
	}
	dir, err := os.MkdirTemp("/run", "vertal-warmtest-")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(context.Background(), Options{Runtime: "crun", StateDir: dir, CgroupParent: "vertal-warmtest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		os.RemoveAll(dir)
		for _, b := range d.CgroupBases() {
			os.Remove(b) // the driver keeps its (empty) base cgroup
		}
	})
	return d, NewPrestarter(d)
}

func warmLang(name string) engine.Language {
	img := os.Getenv("VERTAL_ROOTFS")
	if img == "" {
		img = "/var/lib/vertal/images/default/rootfs"
	}
	switch name {
	case "python":
		return engine.Language{Name: name, Image: img, File: "main.py", Command: []string{"python3"}}
	case "javascript":
		return engine.Language{Name: name, Image: img, File: "main.js", Command: []string{"node"}}
	}
	return engine.Language{Name: name, Image: img, File: "main.sh", Command: []string{"bash"}}
}

func prestart(t *testing.T, p *Prestarter, lang engine.Language) *warmSandbox {
	t.Helper()
	w, err := p.Prestart(context.Background(), lang, engine.DefaultLimits(time.Second))
	if err != nil {
		t.Fatalf("Prestart(%s): %v", lang.Name, err)
	}
	t.Cleanup(func() { w.Discard(context.Background()) })
	return w.(*warmSandbox)
}

func readShares(t *testing.T, s *warmSandbox) string {
	t.Helper()
	b, err := os.ReadFile(s.cg.cpuWeightFile())
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestWarmCPUWeight: a waiting sandbox yields the CPU; the code runs with
// the cold path's weight.
func TestWarmCPUWeight(t *testing.T) {
	d, p := warmDriver(t)
	// cgroup v1 cpu.shares, v2 cpu.weight: the minimum, then the default.
	waiting, running := strconv.Itoa(prestartShares), strconv.Itoa(defaultShares)
	if d.CgroupMode() == CgroupV2 {
		waiting, running = strconv.Itoa(prestartWeight), strconv.Itoa(defaultWeight)
	}
	s := prestart(t, p, warmLang("bash"))
	if got := readShares(t, s); got != waiting {
		t.Errorf("CPU weight while waiting = %s; want %s", got, waiting)
	}
	done := make(chan engine.Result)
	go func() {
		res, _ := s.Exec(context.Background(), enginetest.Complete(engine.Spec{Language: warmLang("bash"), Code: "echo started; sleep 2", Timeout: 30 * time.Second}))
		done <- res
	}()
	for deadline := time.Now().Add(20 * time.Second); ; {
		if b, _ := os.ReadFile(filepath.Join(s.bundle, "code", "main.sh")); strings.Contains(string(b), "sleep 2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the code never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	if got := readShares(t, s); got != running {
		t.Errorf("CPU weight while the code runs = %s; want %s, the default every cold sandbox has", got, running)
	}
	if res := <-done; res.Status != engine.StatusSucceeded || res.Stdout != "started\n" {
		t.Errorf("result %+v", res)
	}
}

func TestWarmSandboxServesOnce(t *testing.T) {
	_, p := warmDriver(t)
	s := prestart(t, p, warmLang("python"))
	spec := engine.Spec{Language: warmLang("python"), Code: "print(1)", Timeout: 10 * time.Second}
	if res, err := s.Exec(context.Background(), enginetest.Complete(spec)); err != nil || res.Stdout != "1\n" {
		t.Fatalf("first Exec = %+v, %v", res, err)
	}
	if _, err := s.Exec(context.Background(), enginetest.Complete(spec)); err == nil {
		t.Error("second Exec succeeded; a warm sandbox must serve one execution")
	}
	select {
	case <-s.Done():
	default:
		t.Error("Done not closed after Exec")
	}
}

// TestWarmSandboxRefusesEgress: a pre-started sandbox has no egress
// mount and its program no relay, so it refuses an execution with an
// EgressDir before anything runs (the pool runs it cold).
func TestWarmSandboxRefusesEgress(t *testing.T) {
	_, p := warmDriver(t)
	s := prestart(t, p, warmLang("python"))
	spec := engine.Spec{Language: warmLang("python"), Code: "print(1)", EgressDir: t.TempDir(), Agent: "/usr/local/bin/vertal-agent"}
	if _, err := s.Exec(context.Background(), enginetest.Complete(spec)); !errors.Is(err, pool.ErrNotStarted) {
		t.Errorf("Exec with EgressDir: %v; want ErrNotStarted", err)
	}
}

// TestWarmSandboxThatDiedIsNotUsed kills a waiting sandbox: Done closes
// and Exec refuses it without running anything.
func TestWarmSandboxThatDiedIsNotUsed(t *testing.T) {
	d, p := warmDriver(t)
	s := prestart(t, p, warmLang("python"))
	d.kill(s.id, s.cmd.proc)
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("Done not closed after the sandbox was killed")
	}
	_, err := s.Exec(context.Background(), enginetest.Complete(engine.Spec{Language: warmLang("python"), Code: "print(1)"}))
	if !errors.Is(err, pool.ErrNotStarted) {
		t.Errorf("Exec on a dead sandbox: %v; want ErrNotStarted", err)
	}
}

func TestWarmDiscardLeavesNothing(t *testing.T) {
	d, p := warmDriver(t)
	for _, name := range []string{"python", "javascript", "bash"} {
		s := prestart(t, p, warmLang(name))
		if err := s.Discard(context.Background()); err != nil {
			t.Fatalf("Discard: %v", err)
		}
		if _, err := os.Stat(s.bundle); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: bundle left: %v", name, err)
		}
		for _, dir := range d.cg.dirs(s.id) {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: cgroup left: %s", name, dir)
			}
		}
		if ids := stateIDs(d.rt, d.runtimeRoot); len(ids) != 0 {
			t.Errorf("%s: runtime state left: %v", name, ids)
		}
	}
}

func TestWarmUnsupportedLanguage(t *testing.T) {
	_, p := warmDriver(t)
	lang := warmLang("bash")
	lang.Command = []string{"perl"}
	_, err := p.Prestart(context.Background(), lang, engine.DefaultLimits(engine.DefaultTimeout))
	if !errors.Is(err, pool.ErrUnsupported) {
		t.Errorf("Prestart(perl) = %v; want ErrUnsupported", err)
	}
}
