package main

import (
	"strings"
	"testing"
)

// homeFullStillRuns fills most of a pro sandbox's 256 MB home, then has a
// process use most of its 512 MB of memory: the home's tmpfs is charged
// to the sandbox's memory cgroup, so unless the limit holds both, the
// process is killed out of memory.
func homeFullStillRuns(t *testing.T, p *serverProc, key, id string) {
	t.Helper()
	fill := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{
		"cmd": "head -c 230M /dev/zero > /home/user/fill && du -m /home/user/fill | cut -f1", "timeout_s": 60})
	if fill.status != 200 || fill.body["exit_code"] != 0.0 || strings.TrimSpace(fill.body["stdout"].(string)) != "230" {
		t.Fatalf("filling the home: %d %s", fill.status, tail(fill.raw, 500))
	}
	// 400 MB written, so every page is touched and charged.
	use := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{
		"cmd": `python3 -c "b = b'x' * (400 << 20); print(len(b) >> 20)"`, "timeout_s": 60})
	if use.status != 200 || use.body["exit_code"] != 0.0 || use.body["stdout"] != "400\n" {
		t.Fatalf("400 MB of memory beside a full home: %d %s", use.status, tail(use.raw, 500))
	}
	if rm := sbxRun(t, p, key, id, "rm /home/user/fill && echo gone"); rm["stdout"] != "gone\n" {
		t.Fatalf("rm: %v", rm)
	}
}

// TestSandboxHomeBesideMemoryE2E: on the default runtime (bwrap), a full
// home leaves the processes their plan's memory.
func TestSandboxHomeBesideMemoryE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil)
	key := tenantKey(t, p, "agent-author", "pro")
	id := createSandbox(t, p, key, map[string]any{"timeout_s": 120})
	homeFullStillRuns(t, p, key, id)
}
