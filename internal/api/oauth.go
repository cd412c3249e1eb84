package api

import (
	"net/http"
	"strings"
)

// MCP clients such as MCP Inspector treat any 401 from an MCP server as the
// start of an OAuth flow (RFC 9728 discovery, then the authorization
// server's metadata, then dynamic client registration) and show only what
// the last step answered. This server takes API keys, not OAuth, so every
// step of that discovery answers with how to pass a key: the 401 carries
// the message in an RFC 6750 challenge, the protected-resource metadata
// names no authorization server, and the authorization server's endpoints
// answer 404 with the same advice.

// mcpDocs is where the metadata points a client for how to authenticate.
const mcpDocs = "/docs/clients#remote-agents-streamable-http"

// errNotOAuth is the answer of the OAuth endpoints a client probes.
var errNotOAuth = errorf(KindNotFound, "this server takes API keys, not OAuth: send the header Authorization: Bearer kubo_sk_... (in MCP Inspector: --header \"Authorization: Bearer kubo_sk_...\")")

// isMCPPath reports whether p is an MCP endpoint, after cleanAPIPath.
func isMCPPath(p string) bool { return p == "/mcp" || p == "/api/mcp" }

// mcpChallenge is the WWW-Authenticate value of a 401 on an MCP endpoint.
func (s *Server) mcpChallenge(r *http.Request, msg string) string {
	return `Bearer realm="vertal", error="invalid_token", error_description="` + quotable(msg) +
		`", resource_metadata="` + s.publicBase(r) + "/.well-known/oauth-protected-resource" + r.URL.Path + `"`
}

// quotable drops what may not appear in an RFC 6750 quoted attribute.
func quotable(s string) string {
	return strings.Map(func(c rune) rune {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return -1
		}
		return c
	}, s)
}

// protectedResource serves RFC 9728 metadata for the MCP endpoint at
// resource (a path of this origin).
func (s *Server) protectedResource(resource string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		base := s.publicBase(r)
		return s.writeJSON(w, r, http.StatusOK, map[string]any{
			"resource":                 base + resource,
			"authorization_servers":    []string{},
			"bearer_methods_supported": []string{"header"},
			"resource_name":            "Vertal Run MCP (API key: Authorization: Bearer kubo_sk_...)",
			"resource_documentation":   base + mcpDocs,
		})
	}
}

func notOAuth(http.ResponseWriter, *http.Request) error { return errNotOAuth }
