package main

import (
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// waitRunning waits until the data dir's store shows n executions running.
func waitRunning(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var got int
		_ = db.QueryRow(`SELECT COUNT(*) FROM executions WHERE status = 'running'`).Scan(&got)
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d executions running after 60 s, want %d", got, n)
		}
	}
}

// TestIdempotencyAfterCrash: a sync request with an Idempotency-Key is in
// its sandbox when the server is SIGKILLed. The restarted server settles
// the execution as error; the client's retry with the same key and body
// replays that settled execution at once (not a wait for the claim to be
// abandoned, then 409 idempotency_in_progress), and usage does not count
// it.
func TestIdempotencyAfterCrash(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	p := startServer(t, dataDir, nil, "--dev")
	base, key := p.url+"/api", p.devKey
	body := `{"language":"bash","code":"sleep 30; echo done"}`
	hdr := map[string]string{"Idempotency-Key": "crash-1"}

	// The first attempt: its connection dies with the server.
	postInBackground(base+"/v1/executions", key, body, hdr)
	db, err := sql.Open("sqlite", filepath.Join(dataDir, "vertal.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	waitRunning(t, db, 1)
	var id string
	if err := db.QueryRow(`SELECT id FROM executions WHERE status = 'running'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Process.Kill()
	<-p.exited

	p = startServer(t, dataDir, nil)
	base = p.url + "/api"
	r := callRaw(t, "POST", base+"/v1/executions", key, body, hdr)
	if r.status != 200 || r.body["id"] != id || r.body["status"] != "error" || r.body["idempotent_replay"] != true {
		t.Fatalf("retry after the crash: %d %s; want 200, a replay of %s settled as error", r.status, clipE2E(r.raw, 400), id)
	}
	if !strings.Contains(fmt.Sprint(r.body["reason"]), "restarted") {
		t.Errorf("settled execution's reason %v does not say the server restarted", r.body["reason"])
	}
	if n := todayExecutions(t, base, key); n != 0 {
		t.Errorf("usage counts %v executions; the settled one is refunded, so want 0", n)
	}
}

// postInBackground POSTs body (JSON, exactly as given) from a goroutine, for
// a call that outlives what the test does meanwhile; its answer arrives on
// the channel (status -1 when the connection failed).
func postInBackground(u, key, body string, header map[string]string) <-chan httpResult {
	answer := make(chan httpResult, 1)
	go func() {
		req, _ := http.NewRequest("POST", u, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		r, err := send(req)
		if err != nil {
			r = httpResult{status: -1, raw: err.Error()}
		}
		answer <- r
	}()
	return answer
}

// callRaw is call with a body sent exactly as given.
func callRaw(t *testing.T, method, u, key, body string, header map[string]string) httpResult {
	t.Helper()
	return call(t, method, u, key, rawJSON(body), header)
}

// rawJSON marshals as itself.
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

func clipE2E(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// TestDiskFullDuringARun: the data dir (a small tmpfs) fills up while a
// sync run with an Idempotency-Key is in its sandbox, so its result cannot
// be stored. The client still gets the result of the code that ran (not
// 503 "not run"), the quota counts it once, and once space returns the
// execution is stored as it ended and the key replays it.
func TestDiskFullDuringARun(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", dataDir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dataDir).Run() })
	p := startServer(t, dataDir, nil, "--dev")
	base, key := p.url+"/api", p.devKey
	hdr := map[string]string{"Idempotency-Key": "full-1"}
	// The result (a 1 MiB returned file) needs more room than the store
	// has spare once the disk is full.
	body := `{"language":"python","code":"import os, time\ntime.sleep(4)\nopen('big.bin', 'wb').write(os.urandom(1 << 20))\nprint('ran')","return_files":["big.bin"]}`
	answer := postInBackground(base+"/v1/executions", key, body, hdr)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "vertal.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	waitRunning(t, db, 1)
	fill := filepath.Join(dataDir, "fill")
	f, err := os.Create(fill)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			break // ENOSPC: the disk is full
		}
	}
	f.Close()

	r := <-answer
	if r.status != 200 || r.body["stdout"] != "ran\n" || r.body["status"] != "succeeded" {
		t.Fatalf("answer with a full disk: %d %s; want 200 with the result of the code that ran", r.status, clipE2E(r.raw, 400))
	}
	id := fmt.Sprint(r.body["id"])
	// Every request writes its rate window, so the API cannot answer while
	// the disk is full; the store can still be read.
	var used int
	if err := db.QueryRow(`SELECT COALESCE(SUM(executions), 0) FROM usage_days`).Scan(&used); err != nil || used != 1 {
		t.Errorf("usage counts %d executions while the disk is full (%v), want 1", used, err)
	}

	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		g := call(t, "GET", base+"/v1/executions/"+id, key, nil, nil)
		if g.status == 200 && g.body["status"] == "succeeded" {
			if g.body["stdout"] != "ran\n" || len(g.body["files"].([]any)) != 1 {
				t.Errorf("stored execution: %s", clipE2E(g.raw, 400))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the execution was not stored within 60 s of space returning: %d %s", g.status, clipE2E(g.raw, 400))
		}
	}
	again := callRaw(t, "POST", base+"/v1/executions", key, body, hdr)
	if again.status != 200 || again.body["id"] != id || again.body["idempotent_replay"] != true || again.body["status"] != "succeeded" {
		t.Errorf("retry with the key: %d %s; want a replay of %s", again.status, clipE2E(again.raw, 400), id)
	}
	if n := todayExecutions(t, base, key); n != 1 {
		t.Errorf("usage counts %v executions, want the one that ran, once", n)
	}
}
