package api

import (
	"net/http"
	"strings"
	"testing"
)

// TestMCPOAuthDiscovery: an MCP client that meets the 401 and starts OAuth
// discovery (as MCP Inspector does) finds at every step how to pass an API
// key: in the 401's RFC 6750 challenge, in RFC 9728 metadata naming no
// authorization server, and in the 404s of the authorization server's
// endpoints.
func TestMCPOAuthDiscovery(t *testing.T) {
	env := newEnv(t, withOptions(func(o *Options) {
		o.PublicURL = "https://vertal.example/"
		o.MCP = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	}))
	for _, tc := range []struct {
		name string
		req  request
	}{
		{"mcp_unauthorized", request{method: "POST", path: "/mcp", key: "-", body: "{}"}},
		{"mcp_unauthorized_api", request{method: "POST", path: "/api/mcp", key: "-", body: "{}"}},
		{"mcp_invalid_key", request{method: "POST", path: "/mcp", key: "nope", body: "{}"}},
		{"mcp_protected_resource", request{path: "/.well-known/oauth-protected-resource/mcp", key: "-"}},
		{"mcp_protected_resource", request{path: "/.well-known/oauth-protected-resource", key: "-"}},
		{"mcp_protected_resource_api", request{path: "/.well-known/oauth-protected-resource/api/mcp", key: "-"}},
		{"mcp_protected_resource_api", request{path: "/api/.well-known/oauth-protected-resource/mcp", key: "-"}},
		{"mcp_protected_resource_api", request{path: "/api/.well-known/oauth-protected-resource", key: "-"}},
		{"mcp_not_oauth", request{path: "/.well-known/oauth-authorization-server", key: "-"}},
		{"mcp_not_oauth", request{path: "/.well-known/openid-configuration", key: "-"}},
		{"mcp_not_oauth", request{path: "/api/.well-known/oauth-authorization-server", key: "-"}},
		{"mcp_not_oauth", request{method: "POST", path: "/register", key: "-", body: `{"redirect_uris":["http://localhost/cb"]}`}},
	} {
		t.Run(tc.req.method+" "+tc.req.path, func(t *testing.T) {
			golden(t, tc.name, env.do(tc.req), "Content-Type", "WWW-Authenticate")
		})
	}
	// The 401 of the REST API keeps its plain challenge.
	if got := env.do(request{path: "/v1/usage", key: "-"}).header.Get("WWW-Authenticate"); got != `Bearer realm="vertal"` {
		t.Errorf("/v1/usage challenge %q", got)
	}
}

func TestQuotable(t *testing.T) {
	for in, want := range map[string]string{
		"missing API key: send Authorization: Bearer kubo_sk_...": "missing API key: send Authorization: Bearer kubo_sk_...",
		`say "hi"\ now` + "\n\x00é":                               "say hi now",
	} {
		if got := quotable(in); got != want {
			t.Errorf("quotable(%q) = %q, want %q", in, got, want)
		}
	}
	if strings.ContainsAny(quotable("\"\\\r"), "\"\\\r") {
		t.Error("quotable kept a forbidden byte")
	}
}
