package client_test

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client"
)

// TestMain points KUBO_API_URL at a small stand-in for the API so the
// examples below run as written and their output is checked.
func TestMain(m *testing.M) {
	srv := httptest.NewServer(http.HandlerFunc(exampleAPI))
	os.Setenv(client.EnvURL, srv.URL+"/api")
	os.Setenv(client.EnvKey, "kubo_sk_example")
	code := m.Run()
	srv.Close()
	os.Exit(code)
}

func exampleAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	write := func(status int, v any) {
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(v)
	}
	switch r.Method + " " + strings.TrimPrefix(r.URL.Path, "/api") {
	case "POST /v1/executions":
		var req struct {
			Language string  `json:"language"`
			Code     string  `json:"code"`
			TimeoutS float64 `json:"timeout_s"`
			Files    []struct {
				Path, Content string
			} `json:"files"`
			Args        []string `json:"args"`
			ReturnFiles []string `json:"return_files"`
			Async       bool     `json:"async"`
			WebhookURL  string   `json:"webhook_url"`
			Network     *struct {
				Allow []string `json:"allow"`
			} `json:"network"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		if req.Async {
			w.Header().Set("Location", "/api/v1/executions/exe_s")
			write(202, exampleQueued("exe_s", req.WebhookURL))
			return
		}
		if r.Header.Get("Accept") == "text/event-stream" {
			exampleStream(w)
			return
		}
		if len(req.ReturnFiles) > 0 {
			// The program of ExampleWithFiles: it reads data.csv and
			// writes the column's sum to out/sum.txt.
			sum := 0
			for _, line := range strings.Fields(req.Files[0].Content)[1:] {
				n, _ := strconv.Atoi(line)
				sum += n
			}
			content := base64.StdEncoding.EncodeToString([]byte(strconv.Itoa(sum) + "\n"))
			write(200, map[string]any{"id": "exe_f", "status": "succeeded", "stdout": "", "stderr": "", "exit_code": 0, "duration_ms": 80,
				"truncated": false, "usage": map[string]any{"sandbox_seconds": 0.08}, "request_id": "req_f",
				"files": []map[string]any{{"path": "out/sum.txt", "size": len(strconv.Itoa(sum)) + 1, "encoding": "base64", "content": content}}, "files_truncated": false})
			return
		}
		if req.Network != nil {
			// The program of ExampleWithNetwork: one fetch within its
			// allowlist, one beyond it.
			write(200, map[string]any{"id": "exe_n", "status": "failed", "stdout": "200\n", "stderr": "urllib.error.URLError\n", "exit_code": 1,
				"duration_ms": 812, "truncated": false, "request_id": "req_n",
				"usage": map[string]any{"sandbox_seconds": 0.812, "network_bytes_in": 5120, "network_bytes_out": 312},
				"network": map[string]any{"allow": req.Network.Allow, "bytes_in": 5120, "bytes_out": 312, "connections": 1, "refused": 1,
					"attempts": []map[string]any{
						{"host": "pypi.org", "port": 443, "kind": "tls", "allowed": true, "bytes_in": 5120, "bytes_out": 312},
						{"host": "example.com", "port": 443, "kind": "tls", "allowed": false, "reason": "example.com is not in the allowlist", "bytes_in": 0, "bytes_out": 0},
					}}})
			return
		}
		if req.TimeoutS > 60 {
			write(400, map[string]any{"error": map[string]string{"code": "invalid_timeout", "message": "timeout_s must be between 1 and 60"}, "request_id": "req_be05ea1492f949f8a0617a4f3cd738cc"})
			return
		}
		stdout := map[string]string{"print(sum(range(10)))": "45\n", "console.log(6*7)": "42\n"}[req.Code]
		write(200, map[string]any{"id": "exe_9392448a9b514e3f90193963b7d948d0", "status": "succeeded", "stdout": stdout, "stderr": "",
			"exit_code": 0, "duration_ms": 265, "truncated": false, "usage": map[string]any{"sandbox_seconds": 0.265},
			"request_id": "req_1", "idempotent_replay": r.Header.Get("Idempotency-Key") == "job-42"})
	case "GET /v1/executions/exe_s/events":
		exampleStream(w)
	case "POST /v1/executions/batch":
		var req struct {
			Executions []struct {
				WebhookURL string `json:"webhook_url"`
			} `json:"executions"`
			WebhookURL string `json:"webhook_url"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		out := make([]any, len(req.Executions))
		for i, it := range req.Executions {
			out[i] = exampleQueued(fmt.Sprintf("exe_b%d", i), cmp.Or(it.WebhookURL, req.WebhookURL))
		}
		write(202, map[string]any{"executions": out})
	case "GET /v1/usage":
		write(200, map[string]any{"tenant": "kubo-vibe", "plan": "pro", "today": map[string]any{"executions": 3, "sandbox_seconds": 2.635},
			"limits": map[string]any{"executions_per_day": 10000, "requests_per_minute": 120, "max_timeout_s": 60}})
	case "POST /v1/keys/rotate":
		write(200, map[string]any{"api_key": "kubo_sk_rotated", "key_id": "key_2", "revoked_key_id": "key_1", "plan": "pro"})
	case "GET /v1/languages":
		write(200, map[string]any{"languages": []map[string]string{{"name": "python", "version": "3.11.2"}, {"name": "javascript", "version": "22.23.5"}, {"name": "bash", "version": "5.2.15"}}})
	default:
		if strings.HasPrefix(strings.TrimPrefix(r.URL.Path, "/api"), "/v1/sandboxes") {
			exampleSandboxes(w, r, write)
			return
		}
		write(404, map[string]any{"error": map[string]string{"code": "not_found", "message": "not found"}, "request_id": "req_2"})
	}
}

// exampleSandboxes answers the sandbox calls of the examples: one
// sandbox, whose files are kept and whose commands print a line count.
func exampleSandboxes(w http.ResponseWriter, r *http.Request, write func(int, any)) {
	const id = "sbx_0123456789abcdef0123456789abcdef"
	sandbox := func(status string) map[string]any {
		return map[string]any{"id": id, "status": status, "reason": nil, "message": nil, "image": "default", "image_version": "",
			"created_at": "2026-03-14T15:09:26Z", "expires_at": "2026-03-14T15:19:26Z", "ended_at": nil, "on_timeout": "kill",
			"limits": map[string]any{"memory_mb": 512, "max_file_mb": 10}, "metadata": map[string]string{}, "alive_seconds": 0, "cpu_seconds": 0, "request_id": "req_x"}
	}
	switch r.Method + " " + strings.TrimPrefix(r.URL.Path, "/api") {
	case "POST /v1/sandboxes":
		write(201, sandbox("running"))
	case "PUT /v1/sandboxes/" + id + "/files":
		b, _ := io.ReadAll(r.Body)
		write(200, map[string]any{"name": "data.csv", "path": "/home/user/" + r.URL.Query().Get("path"), "type": "file", "size": len(b), "mode": "0644", "mtime": "2026-03-14T15:09:27Z"})
	case "POST /v1/sandboxes/" + id + "/commands":
		write(200, map[string]any{"pid": 7, "status": "succeeded", "stdout": "3\n", "stderr": "", "exit_code": 0, "duration_ms": 4, "truncated": false,
			"usage": map[string]any{"cpu_seconds": 0.001}, "request_id": "req_x"})
	case "DELETE /v1/sandboxes/" + id:
		ended := sandbox("ended")
		ended["reason"], ended["ended_at"] = "killed", "2026-03-14T15:10:00Z"
		write(200, ended)
	default:
		write(404, map[string]any{"error": map[string]string{"code": "not_found", "message": "no such sandbox"}, "request_id": "req_2"})
	}
}

// exampleQueued is an execution as an async submit answers it.
func exampleQueued(id, webhookURL string) map[string]any {
	var webhook any
	if webhookURL != "" {
		webhook = map[string]any{"url": webhookURL, "state": "pending", "attempts": 0, "last_status": nil, "last_error": nil}
	}
	return map[string]any{"id": id, "status": "queued", "stdout": "", "stderr": "", "exit_code": 0, "duration_ms": 0,
		"truncated": false, "usage": map[string]any{"sandbox_seconds": 0}, "request_id": "req_q", "language": "python",
		"files": []any{}, "files_truncated": false, "reason": nil, "webhook": webhook}
}

// exampleStream is the event stream of a program printing two lines with
// a pause between them.
func exampleStream(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range []string{
		"id: 0-0\nevent: started\ndata: {\"id\":\"exe_s\",\"language\":\"python\"}\n\n",
		"id: 9-0\nevent: stdout\ndata: {\"text\":\"step one\\n\"}\n\n",
		": heartbeat\n\n",
		"id: 18-0\nevent: stdout\ndata: {\"text\":\"step two\\n\"}\n\n",
		"id: end\nevent: result\ndata: {\"id\":\"exe_s\",\"status\":\"succeeded\",\"stdout\":\"step one\\nstep two\\n\",\"stderr\":\"\",\"exit_code\":0,\"duration_ms\":1012,\"truncated\":false,\"usage\":{\"sandbox_seconds\":1.012},\"request_id\":\"req_s\",\"files\":[],\"files_truncated\":false}\n\n",
	} {
		io.WriteString(w, ev)
		w.(http.Flusher).Flush()
	}
}

// A sandbox that stays: load a file once, then run commands on it; files
// and background processes persist between commands until Kill.
func ExampleClient_CreateSandbox() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, client.SandboxParams{Timeout: 10 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(ctx)
	if _, err := sb.Files.Write(ctx, "data.csv", []byte("a\n1\n2\n")); err != nil {
		log.Fatal(err)
	}
	res, err := sb.Commands.Run(ctx, "wc -l < data.csv")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	// Output: 3
}

// Run code with the URL and key from KUBO_API_URL and KUBO_API_KEY.
func Example() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ex, err := c.Run(context.Background(), "print(sum(range(10)))", client.WithTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(ex.Status, " ", ex.Stdout)
	// Output: succeeded 45
}

func ExampleClient_Run() {
	c, err := client.New(os.Getenv("KUBO_API_URL"), os.Getenv("KUBO_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	ex, err := c.Run(context.Background(), "console.log(6*7)", client.WithLanguage("javascript"), client.WithTimeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// A program that fails or times out is still a result: look at Status.
	if ex.Status != client.StatusSucceeded {
		fmt.Println("program", ex.Status, "with exit code", ex.ExitCode)
		return
	}
	fmt.Print(ex.Stdout)
	// Output: 42
}

// A caller-chosen idempotency key makes a run safe to repeat, even from
// another process: the server answers with the first result.
func ExampleWithIdempotencyKey() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ex, err := c.Run(context.Background(), "print(1)", client.WithIdempotencyKey("job-42"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("replayed:", ex.IdempotentReplay)
	// Output: replayed: true
}

func ExampleError() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Run(context.Background(), "x", client.WithTimeout(999*time.Second))
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.StatusCode, apiErr.Code, apiErr.RequestID)
	}
	if errors.Is(err, client.ErrQuotaExceeded) {
		fmt.Println("come back tomorrow (UTC)")
	}
	// Output: 400 invalid_timeout req_be05ea1492f949f8a0617a4f3cd738cc
}

func ExampleClient_Usage() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	u, err := c.Usage(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s on %s: %d of %d executions today\n", u.Tenant, u.Plan, u.Today.Executions, u.Limits.ExecutionsPerDay)
	// Output: kubo-vibe on pro: 3 of 10000 executions today
}

func ExampleClient_RotateKey() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	kr, err := c.RotateKey(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	// The old key no longer works and c now uses the new one. It is shown
	// only once: store kr.APIKey in your secrets manager.
	fmt.Println("revoked", kr.RevokedKeyID, "now using", kr.KeyID)
	// Output: revoked key_1 now using key_2
}

func ExampleClient_Languages() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	langs, err := c.Languages(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range langs {
		fmt.Println(l.Name, l.Version)
	}
	// Output:
	// python 3.11.2
	// javascript 22.23.5
	// bash 5.2.15
}

// Stream shows the program's output while it runs; the result event ends
// the stream with what Run would have returned.
func ExampleClient_Stream() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	code := "import time\nprint('step one', flush=True)\ntime.sleep(1)\nprint('step two')"
	for ev, err := range c.Stream(context.Background(), code) {
		if err != nil {
			log.Fatal(err) // a refusal (*client.Error), an error event or a lost connection
		}
		switch ev.Type {
		case client.EventStarted:
			fmt.Println("started", ev.ExecutionID)
		case client.EventStdout:
			fmt.Print(ev.Text)
		case client.EventStderr:
			fmt.Fprint(os.Stderr, ev.Text)
		case client.EventResult:
			fmt.Println(ev.Execution.Status, "after", ev.Execution.DurationMS, "ms")
		}
	}
	// Output:
	// started exe_s
	// step one
	// step two
	// succeeded after 1012 ms
}

// Attach follows an execution started elsewhere, from the start or after
// the last event id seen (here: after the first line).
func ExampleClient_Attach() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	for ev, err := range c.Attach(context.Background(), "exe_s", "") {
		if err != nil {
			log.Fatal(err)
		}
		if ev.Type == client.EventStdout {
			fmt.Printf("%s %q\n", ev.ID, ev.Text)
		}
	}
	// Output:
	// 9-0 "step one\n"
	// 18-0 "step two\n"
}

// A run reaches only the hosts it names, within its plan's egress
// allowlist; Network tells what it reached and why the rest was refused.
func ExampleWithNetwork() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	code := `import urllib.request
print(urllib.request.urlopen("https://pypi.org/simple/").status)
urllib.request.urlopen("https://example.com/")`
	ex, err := c.Run(context.Background(), code, client.WithNetwork("pypi.org", "*.pythonhosted.org"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(ex.Stdout)
	for _, a := range ex.Network.Attempts {
		if !a.Allowed {
			fmt.Printf("refused %s:%d: %s\n", a.Host, a.Port, a.Reason)
		}
	}
	fmt.Println(*ex.Usage.NetworkBytesIn, "bytes in,", *ex.Usage.NetworkBytesOut, "out")
	// Output:
	// 200
	// refused example.com:443: example.com is not in the allowlist
	// 5120 bytes in, 312 out
}

// Files go into the program's working directory; the ones matching
// WithReturnFiles come back decoded.
func ExampleWithFiles() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	code := `import os, sys
total = sum(int(line) for line in open("data.csv").read().split()[1:])
os.makedirs("out", exist_ok=True)
open("out/sum.txt", "w").write(f"{total}\n")`
	ex, err := c.Run(context.Background(), code,
		client.WithFiles(client.File{Path: "data.csv", Content: []byte("n\n1\n2\n39\n")}),
		client.WithEnv(map[string]string{"MODE": "report"}),
		client.WithArgs("--verbose"),
		client.WithReturnFiles("out/*.txt"))
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range ex.Files {
		fmt.Printf("%s (%d bytes): %s", f.Path, f.Size, f.Content)
	}
	if ex.FilesTruncated {
		fmt.Println("some files were left out by the plan's limits")
	}
	// Output: out/sum.txt (3 bytes): 42
}

// A webhook receiver checks the signature on the raw body before it decodes
// it, and dedupes by the delivery id (a retry carries the same one).
func ExampleVerifyWebhook() {
	secret := os.Getenv("VERTAL_WEBHOOK_SECRET") // whsec_..., from GET /v1/webhook-secret
	http.HandleFunc("POST /hooks/vertal", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 100<<20))
		if err != nil {
			http.Error(w, "cannot read the body", http.StatusBadRequest)
			return
		}
		if err := client.VerifyWebhook(secret, r.Header.Get(client.HeaderWebhookSignature), body, 5*time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var exe client.Execution
		if err := json.Unmarshal(body, &exe); err != nil {
			http.Error(w, "not an execution", http.StatusBadRequest)
			return
		}
		log.Printf("delivery %s: %s finished %s", r.Header.Get(client.HeaderWebhookDelivery), exe.ID, exe.Status)
		w.WriteHeader(http.StatusNoContent)
	})
}

// Submit queues a run and returns at once; Wait follows it to its end.
func ExampleClient_Submit() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	ex, err := c.Submit(ctx, "import time\nprint('step one', flush=True)\ntime.sleep(1)\nprint('step two')",
		client.WithWebhook("https://hooks.example.com/vertal"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ex.ID, ex.Status, "webhook", ex.Webhook.State)
	// Output: exe_s queued webhook pending
}

// Wait returns once the execution is final, however it was started.
func ExampleClient_Wait() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ex, err := c.Wait(context.Background(), "exe_s")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(ex.Status, "\n", ex.Stdout)
	if ex.Reason != "" {
		fmt.Println("ended early:", ex.Reason)
	}
	// Output:
	// succeeded
	// step one
	// step two
}

// Batch queues up to 20 executions at once, all or none; the answer
// lists them in the order given.
func ExampleClient_Batch() {
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	exs, err := c.Batch(context.Background(), []client.BatchItem{
		{Code: "print(1)"},
		{Code: "echo $1", Language: "bash", Args: []string{"hi"}, WebhookURL: "https://hooks.example.com/bash"},
	}, client.WithBatchWebhook("https://hooks.example.com/all"))
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		log.Fatal(apiErr.Message) // e.g. "executions[1].language: ..."
	} else if err != nil {
		log.Fatal(err)
	}
	for _, ex := range exs {
		fmt.Println(ex.ID, ex.Status, ex.Webhook.URL)
	}
	// Output:
	// exe_b0 queued https://hooks.example.com/all
	// exe_b1 queued https://hooks.example.com/bash
}
