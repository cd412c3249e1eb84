package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Shared by the tests of the client commands: a fake API on a local
// listener, the request bodies it saw, and one command run in memory.

// startAPI serves h for the length of the test and returns it with the
// environment a client command reads to reach it (key "k").
func startAPI(t *testing.T, h http.Handler) (*httptest.Server, map[string]string) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, map[string]string{"KUBO_API_URL": srv.URL, "KUBO_API_KEY": "k"}
}

// bodyLog records the JSON request bodies a fake API was sent.
type bodyLog struct {
	mu     sync.Mutex
	bodies []map[string]any
}

// record decodes r's body, keeps it and returns it.
func (l *bodyLog) record(r *http.Request) map[string]any {
	var body map[string]any
	json.NewDecoder(r.Body).Decode(&body)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bodies = append(l.bodies, body)
	return body
}

// take returns the bodies recorded so far and forgets them.
func (l *bodyLog) take() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bodies
	l.bodies = nil
	return b
}

type cliResult struct {
	Stdout, Stderr string
	Exit           int
}

func runCLI(t *testing.T, cmd func(context.Context, *env, []string) error, environ map[string]string, stdin string, args ...string) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return environ[k] }}
	err := cmd(context.Background(), e, args)
	res := cliResult{Stdout: out.String(), Stderr: errOut.String()}
	var code exitCode
	switch {
	case err == nil:
	case errors.As(err, &code):
		res.Exit = int(code)
	default:
		t.Fatalf("unexpected error: %v", err)
	}
	return res
}

// checkRequest runs cmd and compares what it printed with want, and what
// it sent with wantBody (nil: no request).
func checkRequest(t *testing.T, log *bodyLog, cmd func(context.Context, *env, []string) error, environ map[string]string, stdin string, args []string, want cliResult, wantBody map[string]any) {
	t.Helper()
	log.take()
	got := runCLI(t, cmd, environ, stdin, args...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	var wantBodies []map[string]any
	if wantBody != nil {
		wantBodies = []map[string]any{wantBody}
	}
	if diff := cmp.Diff(wantBodies, log.take()); diff != "" {
		t.Errorf("request bodies (-want +got):\n%s", diff)
	}
}
