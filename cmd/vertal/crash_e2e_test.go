package main

import (
	"database/sql"
	"fmt"
	"net/http"
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
	go func() {
		req, _ := http.NewRequest("POST", base+"/v1/executions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", hdr["Idempotency-Key"])
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
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
