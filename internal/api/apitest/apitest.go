// Package apitest starts the real API handlers over fakes, for the unit
// tests of the clients (the Go SDK, the CLI): storefake for the store, a
// driver that runs nothing, and the given sandboxes service (a
// sandboxfake, usually).
package apitest

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
)

// Server is an API server on a local port.
type Server struct {
	URL string // base URL, without a trailing slash
	Key string // a pro key of tenant "acme"
	// NewKey makes another key, of another tenant if asked.
	NewKey func(tenant, plan string) string
}

// driver succeeds at once with the code as stdout; executions are not
// what these servers are for.
type driver struct{}

func (driver) Name() string                      { return "apitest" }
func (driver) Reap(context.Context) (int, error) { return 0, nil }
func (driver) Run(_ context.Context, spec engine.Spec) (engine.Result, error) {
	return engine.Result{Status: engine.StatusSucceeded, Stdout: spec.Code}, nil
}

// New starts a server whose sandboxes are sbx (nil: none); it stops with
// the test.
func New(t testing.TB, sbx api.Sandboxes) *Server {
	t.Helper()
	st := storefake.New()
	eng := enginetest.New(t, driver{}, engine.Options{MaxConcurrent: 4, MaxQueue: 16, QueueTimeout: time.Second})
	svc, err := execution.New(execution.Options{Store: st, Engine: eng, Render: api.RenderExecution,
		Languages: []engine.Language{{Name: "python", Image: "/img/rootfs", File: "main.py", Command: []string{"python3", "/code/main.py"}, Version: "3.11.2"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Options{Service: svc, Store: st, Sandboxes: sbx, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	newKey := func(tenant, plan string) string {
		secret, _, err := api.CreateKey(context.Background(), st, tenant, plan, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return secret
	}
	return &Server{URL: hs.URL, Key: newKey("acme", "pro"), NewKey: newKey}
}
