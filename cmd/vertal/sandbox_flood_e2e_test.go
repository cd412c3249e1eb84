package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpuSeconds is the user and system CPU time of process pid so far.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's name, which is in parentheses.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// TestSandboxOutputFloodE2E: background commands that write output as
// fast as they can, with nobody reading it, cost the server little CPU:
// it reads a sandbox's output at its output rate, and the writers wait on
// their pipes. Unpaced, two yes kept one of this host's cores busy in the
// server alone; paced by bytes only, a writer of single bytes still cost
// it 2.5 CPU-s in 5 s, hence frameCost.
func TestSandboxOutputFloodE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil)
	key := tenantKey(t, p, "attacker", "pro")
	// In one sandbox bulk writes; in another single bytes, one write each
	// (a frame each, were they relayed as they come).
	bulk := createSandbox(t, p, key, map[string]any{"timeout_s": 120})
	tiny := createSandbox(t, p, key, map[string]any{"timeout_s": 120})
	for _, c := range []struct{ id, cmd string }{
		{bulk, "yes flood-flood-flood-flood"}, {bulk, "yes flood-flood-flood-flood >&2"},
		{tiny, `python3 -c "import os
while True: os.write(1, b'x')"`},
	} {
		if r := sbxCall(t, p, key, "POST", c.id, "/commands", map[string]any{"cmd": c.cmd, "background": true}); r.status != 201 {
			t.Fatalf("background: %d %s", r.status, r.raw)
		}
	}
	id := tiny
	time.Sleep(3 * time.Second) // past the burst
	pid := p.cmd.Process.Pid
	before := cpuSeconds(t, pid)
	const window = 5 * time.Second
	time.Sleep(window)
	used := cpuSeconds(t, pid) - before
	t.Logf("server CPU over %s of flood: %.2f s", window, used)
	if used > 1.5 {
		t.Errorf("the server spent %.2f CPU seconds in %s relaying output nobody reads; want at most 1.5", used, window)
	}
	// The sandbox still answers, and its commands' logs hold the newest output.
	if out := sbxRun(t, p, key, id, "echo still-here"); out["stdout"] != "still-here\n" {
		t.Errorf("a command beside the flood: %v", out)
	}
	for _, id := range []string{bulk, tiny} {
		if r := sbxCall(t, p, key, "DELETE", id, "", nil); r.status != 200 {
			t.Fatalf("delete: %d %s", r.status, r.raw)
		}
	}
}
