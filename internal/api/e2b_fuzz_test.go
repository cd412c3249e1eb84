package api

import (
	"encoding/base64"
	"net/http"
	"testing"
)

// FuzzE2BRequestParts feeds the E2B API's own parsers of client input:
// the list's metadata filter and the user named in a Basic header. They
// must never panic, and what they accept must be what was sent.
func FuzzE2BRequestParts(f *testing.F) {
	f.Add("k%252520y%3Dv%2525261", "user:")
	f.Add("suite=e2b%20sdk%26%3D1&a=b", "root:")
	f.Add("%zz=1", "dXNlcjo=")
	f.Add("a=1&a=2", "")
	f.Fuzz(func(t *testing.T, query, user string) {
		md, err := e2bMetadataQuery(query)
		if err == nil {
			if query == "" && md != nil {
				t.Errorf("an empty filter gave %v", md)
			}
		} else if asError(err).Kind != KindInvalidRequest {
			t.Errorf("metadata %q: %v, want an invalid_request", query, err)
		}
		h := http.Header{}
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user)))
		err = e2bUserOf(h)
		switch user {
		case "", ":", "user", "user:":
			if err != nil {
				t.Errorf("user %q refused: %v", user, err)
			}
		default:
			if err == nil {
				t.Errorf("user %q accepted", user)
			}
		}
	})
}
