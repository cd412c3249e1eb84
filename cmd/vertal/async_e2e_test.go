package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kuboprotocol/vertal2kubo/client"
)

// receiver is a webhook endpoint on loopback. /ok answers 200, /flaky
// 500 to the first attempt of each execution then 200, /down 503 always.
// It verifies every signature with the tenant's secret.
type receiver struct {
	t      *testing.T
	url    string
	secret string

	mu    sync.Mutex
	got   map[string][]delivery // by execution id
	tries map[string]int
}

type delivery struct {
	id, event string
	valid     bool
	status    int
	body      map[string]any
}

func newReceiver(t *testing.T, addr string) *receiver {
	r := &receiver{t: t, got: map[string][]delivery{}, tries: map[string]int{}}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	r.url = "http://" + ln.Addr().String()
	return r
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	raw, _ := io.ReadAll(req.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	id, _ := body["id"].(string)
	r.mu.Lock()
	defer r.mu.Unlock()
	valid := client.VerifyWebhook(r.secret, req.Header.Get("Vertal-Signature"), raw, 5*time.Minute) == nil
	status := 200
	switch req.URL.Path {
	case "/flaky":
		if r.tries[id]++; r.tries[id] == 1 {
			status = 500
		}
	case "/down":
		status = 503
	}
	r.got[id] = append(r.got[id], delivery{id: req.Header.Get("Vertal-Delivery"), event: req.Header.Get("Vertal-Event"), valid: valid, status: status, body: body})
	w.WriteHeader(status)
}

func (r *receiver) deliveries(id string) []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got[id]...)
}

// submit posts one async execution and returns its id.
func submit(t *testing.T, base, key string, body map[string]any) string {
	t.Helper()
	body["async"] = true
	r := call(t, "POST", base+"/v1/executions", key, body, nil)
	if r.status != 202 || r.body["status"] != "queued" || r.header.Get("Location") != "/api/v1/executions/"+fmt.Sprint(r.body["id"]) {
		t.Fatalf("submit: %d %v %s", r.status, r.header.Get("Location"), r.raw)
	}
	return r.body["id"].(string)
}

// waitFinal polls GET until every id is final (and, with webhooks, its
// delivery settled), and returns them. A 429 is waited out (Retry-After),
// so the polling itself cannot hide an execution's state; on time-out it
// says what it last saw of each unsettled one, and what explain adds.
func waitFinal(t *testing.T, base, key string, ids []string, hooks bool, within time.Duration, explain ...func(id string) string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	last := map[string]string{}
	deadline := time.Now().Add(within)
	for len(out) < len(ids) {
	round:
		for _, id := range ids {
			if out[id] != nil {
				continue
			}
			r := call(t, "GET", base+"/v1/executions/"+id, key, nil, nil)
			if r.status == http.StatusTooManyRequests {
				wait, _ := strconv.Atoi(r.header.Get("Retry-After"))
				time.Sleep(time.Duration(max(wait, 1)) * time.Second)
				break round
			}
			last[id] = fmt.Sprintf("%d %s", r.status, r.raw)
			st, _ := r.body["status"].(string)
			if st == "" || st == "queued" || st == "running" {
				continue
			}
			if w, ok := r.body["webhook"].(map[string]any); hooks && ok && w["state"] == "pending" {
				continue
			}
			out[id] = r.body
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, id := range ids {
				if out[id] == nil {
					fmt.Fprintf(&b, "\n%s: last seen %s", id, last[id])
					for _, f := range explain {
						fmt.Fprintf(&b, "\n  %s", f(id))
					}
				}
			}
			t.Fatalf("%d of %d executions settled after %v:%s", len(out), len(ids), within, b.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out
}

// riverJobs describes the queue's jobs for one execution, from River's
// table in the server's SQLite file.
func riverJobs(db *sql.DB) func(id string) string {
	return func(id string) string {
		rows, err := db.Query(`SELECT id, kind, state, attempt, max_attempts, COALESCE(attempted_at, ''), scheduled_at, COALESCE(json(errors), '')
			FROM river_job WHERE json_extract(args, '$.execution_id') = ? ORDER BY id`, id)
		if err != nil {
			return "river_job: " + err.Error()
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var jid, attempt, maxAttempts int64
			var kind, state, attemptedAt, scheduledAt, errs string
			if err := rows.Scan(&jid, &kind, &state, &attempt, &maxAttempts, &attemptedAt, &scheduledAt, &errs); err != nil {
				return "river_job: " + err.Error()
			}
			fmt.Fprintf(&b, "job %d %s %s attempt %d/%d attempted %s scheduled %s errors %s; ", jid, kind, state, attempt, maxAttempts, attemptedAt, scheduledAt, errs)
		}
		if b.Len() == 0 {
			return "no River job"
		}
		return b.String()
	}
}

func todayExecutions(t *testing.T, base, key string) float64 {
	t.Helper()
	return call(t, "GET", base+"/v1/usage", key, nil, nil).body["today"].(map[string]any)["executions"].(float64)
}

// TestAsyncWebhooksAndRestart: one node on SQLite. 30 async executions
// with webhooks to a receiver on loopback (allowed by the flag), every
// third one answered 500 first, and one to a receiver that stays down.
// The server is SIGKILLed mid-queue and started again on the same data:
// every execution ends exactly once (run, or error with a reason if it
// was running at the kill), usage counts exactly the ones that ran, every
// delivery is signed, the 500s are retried until they succeed, and the
// receiver that stays down ends failed.
func TestAsyncWebhooksAndRestart(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	flags := []string{"--webhook-allow-cidr", "127.0.0.0/8", "--webhook-retry-base", "200ms", "--webhook-retry-for", "5s",
		"--queue-rescue-after", "3s", "--async-workers", "2"}
	p := startServer(t, dataDir, nil, append([]string{"--dev"}, flags...)...)
	base, key := p.url+"/api", p.devKey
	rcv := newReceiver(t, "127.0.0.1:0")
	sec := call(t, "GET", base+"/v1/webhook-secret", key, nil, nil)
	rcv.secret, _ = sec.body["secret"].(string)
	if sec.status != 200 || !strings.HasPrefix(rcv.secret, "whsec_") {
		t.Fatalf("webhook secret: %d %s", sec.status, sec.raw)
	}
	var ids []string
	for i := range 30 {
		path := "/ok"
		if i%3 == 0 {
			path = "/flaky"
		}
		ids = append(ids, submit(t, base, key, map[string]any{"language": "python",
			"code": fmt.Sprintf("import time\ntime.sleep(0.3)\nprint(%d)", i), "webhook_url": rcv.url + path}))
	}
	down := submit(t, base, key, map[string]any{"language": "bash", "code": "echo down", "webhook_url": rcv.url + "/down"})

	// Kill it once some have run and others are still waiting.
	db, err := sql.Open("sqlite", filepath.Join(dataDir, "vertal.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var done int
		_ = db.QueryRow(`SELECT COUNT(*) FROM executions WHERE status NOT IN ('queued', 'running')`).Scan(&done)
		if done >= 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no execution ran within 60 s")
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p = startServer(t, dataDir, nil, flags...)
	base = p.url + "/api"

	all := append(ids, down)
	got := waitFinal(t, base, key, all, true, 3*time.Minute, riverJobs(db))
	ran := 0
	for i, id := range ids {
		e := got[id]
		switch e["status"] {
		case "succeeded":
			ran++
			if e["stdout"] != fmt.Sprintf("%d\n", i) {
				t.Errorf("%s: stdout %q", id, e["stdout"])
			}
		case "error":
			if !strings.Contains(fmt.Sprint(e["reason"]), "restarted") {
				t.Errorf("%s ended as error without the restart's reason: %v", id, e["reason"])
			}
		default:
			t.Errorf("%s ended %v", id, e["status"])
		}
		w := e["webhook"].(map[string]any)
		ds := rcv.deliveries(id)
		if w["state"] != "delivered" || len(ds) == 0 || w["last_status"] != 200.0 {
			t.Errorf("%s: webhook %v, %d deliveries", id, w, len(ds))
			continue
		}
		for _, d := range ds {
			if !d.valid || d.id != ds[0].id || !strings.HasPrefix(d.id, "dlv_") || d.event != "execution.finished" || d.body["status"] != e["status"] {
				t.Errorf("%s: delivery %+v", id, d)
			}
		}
		if i%3 == 0 && (w["attempts"].(float64) < 2 || ds[0].status != 500) {
			t.Errorf("%s: the 500 was not retried: %v", id, w)
		}
	}
	if e := got[down]; e["status"] != "succeeded" || e["webhook"].(map[string]any)["state"] != "failed" ||
		e["webhook"].(map[string]any)["last_status"] != 503.0 || e["webhook"].(map[string]any)["attempts"].(float64) < 2 {
		t.Errorf("the receiver that stays down: %v", e["webhook"])
	}
	t.Logf("%d of %d ran to their end; the others were running at the kill and were settled", ran, len(ids))
	if n := todayExecutions(t, base, key); n != float64(ran+1) {
		t.Errorf("usage counts %v executions; want the %d that ran (settled ones are refunded)", n, ran+1)
	}
}

// TestAsyncTwoNodesOnPostgres: 40 async jobs on two nodes sharing one
// PostgreSQL. Both nodes run some; one is SIGKILLed mid-run; every job
// ends exactly once (its running ones as error with a reason, settled by
// the other node; the rest run there), and usage counts exactly the ones
// that ran.
func TestAsyncTwoNodesOnPostgres(t *testing.T) {
	needE2E(t)
	dbURL := newDatabase(t)
	env := []string{"VERTAL_DATABASE_URL=" + dbURL}
	flags := []string{"--async-workers", "2", "--node-timeout", "3s", "--queue-rescue-after", "4s"}
	a := startServer(t, t.TempDir(), env, append([]string{"--dev"}, flags...)...)
	b := startServer(t, t.TempDir(), env, flags...)
	key := a.devKey
	var ids []string
	for i := range 40 {
		ids = append(ids, submit(t, a.url+"/api", key, map[string]any{"language": "python", "code": fmt.Sprintf("import time\ntime.sleep(0.5)\nprint(%d)", i)}))
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	owners := func() map[string]int {
		rows, err := conn.Query(ctx, `SELECT owner, COUNT(*) FROM executions WHERE owner <> '' GROUP BY owner`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var o string
			var n int
			_ = rows.Scan(&o, &n)
			out[o] = n
		}
		return out
	}
	// Kill B while both nodes hold executions.
	for deadline := time.Now().Add(60 * time.Second); len(owners()) < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the two nodes did not both take work: %v", owners())
		}
	}
	_ = b.cmd.Process.Kill()
	<-b.exited
	got := waitFinal(t, a.url+"/api", key, ids, false, 3*time.Minute)
	ran, settled := 0, 0
	for i, id := range ids {
		switch e := got[id]; e["status"] {
		case "succeeded":
			ran++
			if e["stdout"] != fmt.Sprintf("%d\n", i) {
				t.Errorf("%s: stdout %q", id, e["stdout"])
			}
		case "error":
			settled++
			if !strings.Contains(fmt.Sprint(e["reason"]), "stopped") {
				t.Errorf("%s: error without the stopped node's reason: %v", id, e["reason"])
			}
		default:
			t.Errorf("%s ended %v", id, e["status"])
		}
	}
	if o := owners(); len(o) != 2 {
		t.Errorf("owners %v; want both nodes", o)
	}
	t.Logf("%d ran, %d settled after node B was killed", ran, settled)
	if n := todayExecutions(t, a.url+"/api", key); n != float64(ran) {
		t.Errorf("usage counts %v executions; want the %d that ran", n, ran)
	}
}

// TestWebhookSSRF: without the allow flag every loopback target is
// refused at submit, named in the error; with a receiver allowed on
// 127.0.0.2 that redirects to 127.0.0.1, the redirect is not followed.
func TestWebhookSSRF(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil, "--dev")
	rcv := newReceiver(t, "127.0.0.1:0")
	port := rcv.url[strings.LastIndexByte(rcv.url, ':')+1:]
	for _, u := range []string{rcv.url + "/ok", "https://127.0.0.1:" + port + "/ok", "https://[::1]:" + port + "/", "https://127.1.2.3/",
		"https://localhost:" + port + "/", "https://localhost./", "https://ip6-localhost/", "https://0.0.0.0/"} {
		r := call(t, "POST", p.url+"/api/v1/executions", p.devKey, map[string]any{"language": "bash", "code": "echo 1", "async": true, "webhook_url": u}, nil)
		if r.status != 400 || r.code() != "invalid_request" || !strings.Contains(r.raw, "webhook_url") {
			t.Errorf("%s: %d %s", u, r.status, r.raw)
		}
	}
	if rcv.deliveries("") != nil || len(rcv.got) != 0 {
		t.Errorf("the receiver was reached")
	}

	q := startServer(t, t.TempDir(), nil, "--dev", "--webhook-allow-cidr", "127.0.0.2/32", "--webhook-retry-base", "200ms", "--webhook-retry-for", "2s")
	target := newReceiver(t, "127.0.0.1:0")
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	redirector := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.url+"/ok", http.StatusFound)
	})}
	go redirector.Serve(ln)
	defer redirector.Close()
	id := submit(t, q.url+"/api", q.devKey, map[string]any{"language": "bash", "code": "echo 1", "webhook_url": "http://" + ln.Addr().String() + "/hook"})
	e := waitFinal(t, q.url+"/api", q.devKey, []string{id}, true, time.Minute)[id]
	w := e["webhook"].(map[string]any)
	if w["state"] != "failed" || w["last_status"] != 302.0 || len(target.got) != 0 {
		t.Errorf("redirect to loopback: webhook %v, target reached %d times", w, len(target.got))
	}
}

// TestBatches: a batch of 20 runs in order; a 21st item, or a batch that
// does not fit in the day's quota, is refused with nothing stored or run.
func TestBatches(t *testing.T) {
	needE2E(t)
	cfgFile := filepath.Join(t.TempDir(), "vertal.json")
	if err := os.WriteFile(cfgFile, []byte(`{"plans": {"tiny": {"executions_per_day": 25, "requests_per_minute": 100, "max_timeout_s": 10, "memory_mb": 256, "max_concurrent": 4}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServer(t, t.TempDir(), []string{"VERTAL_CONFIG=" + cfgFile}, "--dev")
	out, _, err := p.vertal(t, []string{"VERTAL_CONFIG=" + cfgFile}, "create-key", "batcher", "--plan", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	key, base := strings.TrimSpace(out), p.url+"/api"
	item := func(i int) map[string]any {
		return map[string]any{"language": "bash", "code": fmt.Sprintf("echo %d", i)}
	}
	items := func(n int) []any {
		var xs []any
		for i := range n {
			xs = append(xs, item(i))
		}
		return xs
	}
	stored := func() int {
		db, err := sql.Open("sqlite", filepath.Join(p.dataDir, "vertal.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var n int
		_ = db.QueryRow(`SELECT COUNT(*) FROM executions WHERE tenant = 'batcher'`).Scan(&n)
		return n
	}
	if r := call(t, "POST", base+"/v1/executions/batch", key, map[string]any{"executions": items(21)}, nil); r.status != 400 || !strings.Contains(r.raw, "at most 20") {
		t.Errorf("21 items: %d %s", r.status, r.raw)
	}
	bad := items(3)
	bad[2] = map[string]any{"language": "cobol", "code": "x"}
	if r := call(t, "POST", base+"/v1/executions/batch", key, map[string]any{"executions": bad}, nil); r.status != 400 || !strings.Contains(r.raw, "executions[2]") {
		t.Errorf("a bad item: %d %s", r.status, r.raw)
	}
	if n := stored(); n != 0 {
		t.Fatalf("refused batches stored %d executions", n)
	}
	r := call(t, "POST", base+"/v1/executions/batch", key, map[string]any{"executions": items(20)}, nil)
	if r.status != 202 {
		t.Fatalf("batch of 20: %d %s", r.status, r.raw)
	}
	var ids []string
	for _, e := range r.body["executions"].([]any) {
		ids = append(ids, e.(map[string]any)["id"].(string))
	}
	got := waitFinal(t, base, key, ids, false, 2*time.Minute)
	for i, id := range ids {
		if got[id]["status"] != "succeeded" || got[id]["stdout"] != fmt.Sprintf("%d\n", i) {
			t.Errorf("item %d: %v %q", i, got[id]["status"], got[id]["stdout"])
		}
	}
	if r := call(t, "POST", base+"/v1/executions/batch", key, map[string]any{"executions": items(6)}, nil); r.status != 429 || r.code() != "quota_exceeded" {
		t.Errorf("a batch over the quota: %d %s", r.status, r.raw)
	}
	if n := stored(); n != 20 {
		t.Errorf("%d executions stored; want the 20 of the batch that fit", n)
	}
	if n := todayExecutions(t, base, key); n != 20 {
		t.Errorf("usage %v; want 20", n)
	}
}

// TestBatchRetriedWithKey: a real server on SQLite. A batch sent twice
// with one Idempotency-Key (as a client does when the first answer is
// lost) runs once: the second answer is 202 with the same executions in
// order, as they are now and marked as a replay, usage counts the batch
// once, and other items under the key are a conflict.
func TestBatchRetriedWithKey(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil, "--dev")
	base, key := p.url+"/api", p.devKey
	hdr := map[string]string{"Idempotency-Key": "nightly-1"}
	batch := map[string]any{"executions": []any{
		map[string]any{"language": "bash", "code": "echo 0"},
		map[string]any{"language": "python", "code": "print(1)"},
		map[string]any{"language": "bash", "code": "echo 2"},
	}}
	answer := func(r httpResult) (ids []string, replays []any) {
		t.Helper()
		if r.status != 202 {
			t.Fatalf("batch: %d %s", r.status, r.raw)
		}
		for _, e := range r.body["executions"].([]any) {
			ids = append(ids, e.(map[string]any)["id"].(string))
			replays = append(replays, e.(map[string]any)["idempotent_replay"])
		}
		return ids, replays
	}
	ids, replays := answer(call(t, "POST", base+"/v1/executions/batch", key, batch, hdr))
	if len(ids) != 3 || replays[0] != nil {
		t.Fatalf("first answer: ids %v, replay marks %v", ids, replays)
	}
	got := waitFinal(t, base, key, ids, false, 2*time.Minute)
	for i, id := range ids {
		if got[id]["stdout"] != fmt.Sprintf("%d\n", i) {
			t.Errorf("item %d: %v %q", i, got[id]["status"], got[id]["stdout"])
		}
	}
	r := call(t, "POST", base+"/v1/executions/batch", key, batch, hdr)
	again, replays := answer(r)
	if strings.Join(again, ",") != strings.Join(ids, ",") {
		t.Errorf("replayed ids %v; want %v", again, ids)
	}
	for i, e := range r.body["executions"].([]any) {
		if replays[i] != true || e.(map[string]any)["status"] != "succeeded" {
			t.Errorf("replayed item %d: status %v, idempotent_replay %v", i, e.(map[string]any)["status"], replays[i])
		}
	}
	if n := todayExecutions(t, base, key); n != 3 {
		t.Errorf("usage %v; want the batch counted once (3)", n)
	}
	other := map[string]any{"executions": []any{map[string]any{"language": "bash", "code": "echo 0"}}}
	if r := call(t, "POST", base+"/v1/executions/batch", key, other, hdr); r.status != 409 || r.code() != "idempotency_conflict" {
		t.Errorf("other items under the key: %d %s", r.status, r.raw)
	}
	if n := todayExecutions(t, base, key); n != 3 {
		t.Errorf("usage %v after the conflict; want 3", n)
	}
}
