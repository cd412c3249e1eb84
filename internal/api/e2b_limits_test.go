package api

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// e2bCreate creates a sandbox through the E2B API with key and returns
// its id and access token.
func (e *testEnv) e2bCreate(t *testing.T, key string) (id, token string) {
	t.Helper()
	r := e.do(request{method: "POST", path: "/e2b/v2/sandboxes", key: "-", header: map[string]string{"X-API-KEY": key}, body: `{"templateID":"base"}`})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var sb struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal(r.body, &sb); err != nil || sb.EnvdAccessToken == "" {
		t.Fatalf("create answered %s (%v)", r.body, err)
	}
	return sb.SandboxID, sb.EnvdAccessToken
}

// e2bStat is filesystem.Filesystem/Stat with the sandbox's token.
func (e *testEnv) e2bStat(id, token string, body string, extra map[string]string) response {
	h := map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": token, "Connect-Protocol-Version": "1"}
	for k, v := range extra {
		h[k] = v
	}
	return e.do(request{method: "POST", path: "/e2b/filesystem.Filesystem/Stat", key: "-", header: h, body: body})
}

// TestE2BBoundedMessages: a Connect message is at most 1 MiB, and a
// compressed one is refused, so that a small gzip body cannot inflate to
// gigabytes on the server (a review found 291 kB became 1.4 GB of heap).
func TestE2BBoundedMessages(t *testing.T) {
	env, _ := newSandboxEnv(t)
	id, token := env.e2bCreate(t, env.key)
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	_, _ = zw.Write([]byte(`{"path":"` + strings.Repeat("a", 8<<20) + `"}`))
	_ = zw.Close()
	for _, tc := range []struct {
		name  string
		body  string
		extra map[string]string
		code  string
	}{
		{"gzip", bomb.String(), map[string]string{"Content-Encoding": "gzip"}, "unimplemented"},
		{"over 1 MiB", `{"path":"` + strings.Repeat("a", 2<<20) + `"}`, nil, "resource_exhausted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := env.e2bStat(id, token, tc.body, tc.extra)
			var e struct{ Code, Message string }
			if err := json.Unmarshal(r.body, &e); err != nil || r.status < 400 || e.Code != tc.code {
				t.Errorf("got %d %.200s, want a Connect %s error", r.status, r.body, tc.code)
			}
		})
	}
	if r := env.e2bStat(id, token, `{"path":"/home/user"}`, nil); r.status != http.StatusOK {
		t.Errorf("a plain Stat after them: %d %s", r.status, r.body)
	}
}

// TestE2BTimeoutsClamp: connect and setTimeout past the plan's lifetime
// succeed at the most the plan allows (E2B clamps too), and connect keeps
// handing out the sandbox's token.
func TestE2BTimeoutsClamp(t *testing.T) {
	env, fake := newSandboxEnv(t)
	id, token := env.e2bCreate(t, env.key)
	xkey := map[string]string{"X-API-KEY": env.key}
	r := env.do(request{method: "POST", path: "/e2b/v2/sandboxes/" + id + "/connect", key: "-", header: xkey, body: `{"timeout":999999}`})
	var sb struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal(r.body, &sb); err != nil || r.status != http.StatusOK || sb.SandboxID != id || sb.EnvdAccessToken != token {
		t.Errorf("connect with a long timeout: %d %s", r.status, r.body)
	}
	r = env.do(request{method: "POST", path: "/e2b/sandboxes/" + id + "/timeout", key: "-", header: xkey, body: `{"timeout":7200}`})
	if r.status != http.StatusNoContent {
		t.Fatalf("setTimeout past the lifetime: %d %s", r.status, r.body)
	}
	got, err := fake.Get(context.Background(), execution.Caller{Key: store.Key{Tenant: "acme"}}, id)
	if err != nil {
		t.Fatal(err)
	}
	if want := got.LiveSince.Add(time.Hour); !got.ExpiresAt.Equal(want) {
		t.Errorf("expires at %v, want the plan's lifetime from the live period's start, %v", got.ExpiresAt, want)
	}
}

// TestE2BRefusals: what the E2B API refuses, with a message saying why.
func TestE2BRefusals(t *testing.T) {
	env, _ := newSandboxEnv(t)
	key2, key2ID := env.newKey("acme", "pro")
	id, token := env.e2bCreate(t, key2)
	v1 := env.createSandbox(t, `{}`)
	for _, tc := range []struct {
		name   string
		req    request
		status int
		want   string
	}{
		{"two keys", request{method: "GET", path: "/e2b/v2/sandboxes", header: map[string]string{"X-API-KEY": env.key}}, 401, "not both"},
		{"a /v1 sandbox", request{method: "POST", path: "/e2b/v2/sandboxes/" + v1 + "/connect", key: "-", header: map[string]string{"X-API-KEY": env.key}, body: `{}`}, 400, "/v1/sandboxes"},
		{"an unknown language", request{method: "POST", path: "/e2b/execute", key: "-", header: map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": token}, body: `{"code":"1","language":"r"}`}, 200, `"name":"unsupported_language"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := env.do(tc.req)
			if r.status != tc.status || !strings.Contains(string(r.body), tc.want) {
				t.Errorf("got %d %s, want %d with %q", r.status, r.body, tc.status, tc.want)
			}
		})
	}
	t.Run("the creating key revoked", func(t *testing.T) {
		if err := env.store.RevokeKey(context.Background(), key2ID, env.clock.Now()); err != nil {
			t.Fatal(err)
		}
		if r := env.e2bStat(id, token, `{"path":"/home/user"}`, nil); r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "revoked") {
			t.Errorf("the token after its key's revocation: %d %s", r.status, r.body)
		}
		r := env.do(request{method: "POST", path: "/e2b/v2/sandboxes/" + id + "/connect", key: "-", header: map[string]string{"X-API-KEY": env.key}, body: `{}`})
		if r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "revoked") {
			t.Errorf("connect with another key of the tenant: %d %s", r.status, r.body)
		}
	})
}
