package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
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
		}
		json.NewDecoder(r.Body).Decode(&req)
		if req.TimeoutS > 60 {
			write(400, map[string]any{"error": map[string]string{"code": "invalid_timeout", "message": "timeout_s must be between 1 and 60"}, "request_id": "req_be05ea1492f949f8a0617a4f3cd738cc"})
			return
		}
		stdout := map[string]string{"print(sum(range(10)))": "45\n", "console.log(6*7)": "42\n"}[req.Code]
		write(200, map[string]any{"id": "exe_9392448a9b514e3f90193963b7d948d0", "status": "succeeded", "stdout": stdout, "stderr": "",
			"exit_code": 0, "duration_ms": 265, "truncated": false, "usage": map[string]any{"sandbox_seconds": 0.265},
			"request_id": "req_1", "idempotent_replay": r.Header.Get("Idempotency-Key") == "job-42"})
	case "GET /v1/usage":
		write(200, map[string]any{"tenant": "kubo-vibe", "plan": "pro", "today": map[string]any{"executions": 3, "sandbox_seconds": 2.635},
			"limits": map[string]any{"executions_per_day": 10000, "requests_per_minute": 120, "max_timeout_s": 60}})
	case "POST /v1/keys/rotate":
		write(200, map[string]any{"api_key": "kubo_sk_rotated", "key_id": "key_2", "revoked_key_id": "key_1", "plan": "pro"})
	case "GET /v1/languages":
		write(200, map[string]any{"languages": []map[string]string{{"name": "python", "version": "3.11.2"}, {"name": "javascript", "version": "22.23.5"}, {"name": "bash", "version": "5.2.15"}}})
	default:
		write(404, map[string]any{"error": map[string]string{"code": "not_found", "message": "not found"}, "request_id": "req_2"})
	}
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
