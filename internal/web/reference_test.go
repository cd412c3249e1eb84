package web_test

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/web"
)

// TestReferenceCoversTheAPIDocument renders the API's own OpenAPI document
// and checks that every operation, and every field of every schema, is on
// the reference page.
func TestReferenceCoversTheAPIDocument(t *testing.T) {
	spec, err := api.OpenAPIDocument("test", "/api")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Webhooks   map[string]map[string]json.RawMessage `json:"webhooks"`
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(spec, &doc); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	web.Handler(web.Options{OpenAPI: spec}).ServeHTTP(rec, httptest.NewRequest("GET", "/docs/reference", nil))
	body, _ := io.ReadAll(rec.Result().Body)
	page := string(body)
	if rec.Code != 200 || strings.Contains(page, "could not be rendered") {
		t.Fatalf("reference page: %d\n%s", rec.Code, page)
	}
	if len(doc.Webhooks) == 0 {
		t.Errorf("the document has no webhooks; the walk below checks nothing of them")
	}
	for path, methods := range merge(doc.Paths, doc.Webhooks) {
		for method, raw := range methods {
			if method == "parameters" {
				continue
			}
			var op struct {
				OperationID string `json:"operationId"`
			}
			_ = json.Unmarshal(raw, &op)
			if !strings.Contains(page, `<code class="path">`+path+`</code>`) {
				t.Errorf("%s %s missing", strings.ToUpper(method), path)
			}
			if op.OperationID != "" && !strings.Contains(page, "<code>"+op.OperationID+"</code>") {
				t.Errorf("operationId %s missing", op.OperationID)
			}
		}
	}
	for name, s := range doc.Components.Schemas {
		for field := range s.Properties {
			if !strings.Contains(page, "<code>"+field+"</code>") && !strings.Contains(page, "."+field+"</code>") {
				t.Errorf("field %s.%s missing", name, field)
			}
		}
	}
}

// merge puts the webhooks (named, not paths) beside the paths: the page
// shows both the same way.
func merge(paths, webhooks map[string]map[string]json.RawMessage) map[string]map[string]json.RawMessage {
	all := map[string]map[string]json.RawMessage{}
	for _, m := range []map[string]map[string]json.RawMessage{paths, webhooks} {
		for k, v := range m {
			all[k] = v
		}
	}
	return all
}
