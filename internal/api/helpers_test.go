package api

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
)

func jsonBody(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

var requestIDRe = regexp.MustCompile(`^req_[0-9a-f]{32}$`)

// decode unmarshals a response body into a generic map.
func decode(t *testing.T, r response) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return m
}

// decodeOK decodes the JSON object of a 200 response; any other status
// fails the test, named by what.
func decodeOK(t *testing.T, what string, r response) map[string]any {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("%s: %d %s", what, r.status, r.body)
	}
	return decode(t, r)
}

// errCode checks the error shape strictly and returns the code.
func errCode(t *testing.T, r response) string {
	t.Helper()
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		RequestID string `json:"request_id"`
	}
	if err := decodeStrict(r.body, &e); err != nil {
		t.Fatalf("error body %s is not the error shape: %v", r.body, err)
	}
	if e.Error.Code == "" || e.Error.Message == "" {
		t.Errorf("error body %s lacks code or message", r.body)
	}
	if !requestIDRe.MatchString(e.RequestID) || e.RequestID != r.header.Get("X-Request-ID") {
		t.Errorf("request_id %q vs X-Request-ID %q", e.RequestID, r.header.Get("X-Request-ID"))
	}
	return e.Error.Code
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

func planPro() config.Plan { return config.DefaultPlans()["pro"] }
