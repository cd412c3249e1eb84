package api

import (
	"strings"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// TestDecodeExecutionRequest pins the strict decoding of a request body:
// each refusal with its kind and exact message.
func TestDecodeExecutionRequest(t *testing.T) {
	allowed := strings.Join(executionFields, ", ")
	for _, tc := range []struct {
		name, body string
		kind       Kind
		msg        string
	}{
		{"unknown field", `{"language":"python","code":"x","lang":"y"}`, KindInvalidRequest,
			`unknown field "lang"; allowed: ` + allowed + ` (and path, content, encoding in a file; allow in network)`},
		{"unknown file field", `{"code":"x","files":[{"path":"a","mode":7}]}`, KindInvalidRequest,
			`unknown field "mode"; allowed: ` + allowed + ` (and path, content, encoding in a file; allow in network)`},
		{"field in another case", `{"Language":"python","code":"x"}`, KindInvalidRequest,
			`unknown field "Language"; allowed: ` + allowed + ` (lower case)`},
		{"file field in another case", `{"files":[{"path":"ok"},{"Path":"b"}]}`, KindInvalidRequest,
			`files[1]: unknown field "Path"; allowed: path, content, encoding (lower case)`},
		{"a wrong type wins over a later case", `{"Language":"python","timeout_s":"9"}`, KindInvalidRequest,
			"field timeout_s must be a number, not string"},
		{"duplicate key", `{"code":"a","code":"b"}`, KindInvalidRequest, "field code is given more than once"},
		{"duplicate key in a file", `{"files":[{"path":"a","path":"b"}]}`, KindInvalidRequest, "files[0]: field path is given more than once"},
		{"duplicate env name", `{"code":"x","env":{"A":"1","A":"2"}}`, KindInvalidRequest, "env: field A is given more than once"},
		{"trailing object", `{"code":"x"} {}`, KindInvalidJSON, "request body has data after the JSON object"},
		{"trailing brace", `{"code":"x"}}`, KindInvalidJSON, "request body has data after the JSON object"},
		{"trailing text", "{\"code\":\"x\"}\n x", KindInvalidJSON, "request body has data after the JSON object"},
		{"lone low surrogate", `{"code":"\udc00"}`, KindInvalidJSON,
			"request body has a lone surrogate escape (at byte 9); a string must be valid Unicode"},
		{"unpaired high surrogate", `{"code":"\ud83d!"}`, KindInvalidJSON,
			"request body has a lone surrogate escape (at byte 9); a string must be valid Unicode"},
		{"invalid UTF-8", "{\"code\":\"\xff\"}", KindInvalidJSON, "request body is not valid UTF-8 (at byte 9)"},
		{"empty", " \n", KindInvalidJSON, "request body is empty; send a JSON object"},
		{"ends too early", `{"code":"x"`, KindInvalidJSON, "request body is not valid JSON (it ends too early)"},
		{"syntax", `{"code" 1}`, KindInvalidJSON, "request body is not valid JSON (at byte 8)"},
		{"not an object", `[1]`, KindInvalidRequest, "request body must be a JSON object"},
		{"nested type", `{"files":[{"path":1}]}`, KindInvalidRequest, "field files.path must be a string, not number"},
		{"env value", `{"env":{"A":1}}`, KindInvalidRequest, "field env must be a string, not number"},
		{"env type", `{"env":[]}`, KindInvalidRequest, "field env must be an object of strings, not array"},
		{"timeout beyond float64", `{"timeout_s":1e309}`, KindInvalidTimeout, "timeout_s is out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeExecutionRequest([]byte(tc.body))
			e, ok := err.(*Error)
			if !ok {
				t.Fatalf("err = %v, want an *Error", err)
			}
			if e.Kind != tc.kind || e.Msg != tc.msg {
				t.Errorf("got %v %q\nwant %v %q", e.Kind, e.Msg, tc.kind, tc.msg)
			}
		})
	}
	in, err := DecodeExecutionRequest([]byte(`{"language":"python","code":"print(1)","files":[{"path":"a","content":"x"}],"env":{"A":"1"}}`))
	if err != nil || *in.Code != "print(1)" || in.Files[0] != (wire.File{Path: "a", Content: "x"}) || in.Env["A"] != "1" {
		t.Errorf("valid request: %+v, %v", in, err)
	}
}

// TestDecodeBatch: a batch item's refusal is named by its index.
func TestDecodeBatch(t *testing.T) {
	item := `{"language":"python","code":"x"}`
	for _, tc := range []struct{ body, msg string }{
		{`{"executions":[` + item + `],"Executions":[]}`, `unknown field "Executions"; allowed: executions, webhook_url (lower case)`},
		{`{"executions":[` + item + `,{"code":"a","code":"b"}]}`, "executions[1]: field code is given more than once"},
		{`{"executions":[{"files":[{"Path":"a"}]}]}`, `executions[0]: files[0]: unknown field "Path"; allowed: path, content, encoding (lower case)`},
		{`{"executions":[1]}`, "executions[0]: request body must be a JSON object"},
		{`{"executions":[{"timeout_s":1e999}]}`, "executions[0]: timeout_s is out of range"},
	} {
		var br wire.BatchRequest
		err := decodeRequest([]byte(tc.body), &br, errTimeoutRange)
		if e, ok := err.(*Error); !ok || e.Msg != tc.msg {
			t.Errorf("%s: got %v, want %q", tc.body, err, tc.msg)
		}
	}
}
