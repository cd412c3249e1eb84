package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// Fuzz targets for what the API parses from a request before anything is
// checked against the store. Seeds are the f.Add calls below and the files
// under testdata/fuzz/<Name>/; `scripts/fuzz.sh` runs every target for a
// bounded time in CI.

// decodeBody decodes an execution request body as the handler does once
// it has read it within its caps: the text checks, then the strict decode.
// The fuzz target goes through this one function only.
func decodeBody(body []byte) (execution.Input, bool, error) {
	in, err := DecodeExecutionRequest(body)
	if err != nil {
		return execution.Input{}, false, err
	}
	return toInput(in), in.Async != nil && *in.Async, nil
}

// FuzzDecodeExecutionBody: any body gets either a 400 naming the problem
// or an Input; an accepted body is valid UTF-8 JSON, one object whose
// field names are the documented ones, each once, and its Input encodes
// back to a body that decodes to the same Input.
func FuzzDecodeExecutionBody(f *testing.F) {
	for _, seed := range []string{
		`{"language":"python","code":"print(1)"}`,
		`{"image":"datasci","language":"python","code":"x","timeout_s":2.5,"stdin":"in","env":{"A":"b"},"args":["-v"],` +
			`"return_files":["out/**"],"async":true,"webhook_url":"https://example.com/h"}`,
		`{"code":"x","files":[{"path":"a.txt","content":"aGk=","encoding":"base64"},{"path":"b","content":"h\u00e9"}]}`,
		`{"code":"x","files":[{"path":"a","Path":"b"}]}`,
		`{"code":"x","Code":"y"}`,
		`{"code":"x","code":"y"}`,
		`{"code":"\ud800"}`,
		`{"code":"\ud83d\ude00"}`,
		`{"timeout_s":1e400}`,
		`{"code":"x"} {}`,
		`[]`, `null`, ``, ` `, `{`, "{\"code\":\"\xff\"}",
		`{"files":null,"env":null,"args":null,"return_files":null,"async":null}`,
		`{"async":false,"files":[]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		in, async, err := decodeBody(body)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || kindStatus(e.Kind) != http.StatusBadRequest || e.Msg == "" {
				t.Fatalf("body %q: error %#v, want a 400 with a message", body, err)
			}
			return
		}
		if !utf8.Valid(body) || LoneSurrogateAt(body) >= 0 || !json.Valid(body) {
			t.Fatalf("accepted %q: not valid UTF-8 JSON without lone surrogates", body)
		}
		names, ok := topLevelNames(body)
		if !ok {
			t.Fatalf("accepted %q, which is not one JSON object", body)
		}
		for i, n := range names {
			if !slices.Contains(executionFields, n) || slices.Contains(names[:i], n) {
				t.Fatalf("accepted %q with field %q (fields %q)", body, n, names)
			}
		}
		again, err := json.Marshal(requestOf(in, async))
		if err != nil {
			t.Fatal(err)
		}
		in2, async2, err := decodeBody(again)
		if err != nil {
			t.Fatalf("%q decoded to an Input whose encoding %q is refused: %v", body, again, err)
		}
		if diff := cmp.Diff(in, in2, cmpopts.EquateEmpty()); diff != "" || async != async2 {
			t.Fatalf("round trip of %q through %q (-first +second), async %v %v:\n%s", body, again, async, async2, diff)
		}
	})
}

// topLevelNames are the field names of the JSON object body, in order
// and with repeats, by encoding/json's tokenizer.
func topLevelNames(body []byte) ([]string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	var names []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		names = append(names, t.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
	}
	return names, true
}

// requestOf is the body that sends in (and async when set).
func requestOf(in execution.Input, async bool) wire.ExecutionRequest {
	r := wire.ExecutionRequest{Image: in.Image, Language: in.Language, Code: in.Code, TimeoutS: in.TimeoutS, Stdin: in.Stdin,
		Env: in.Env, Args: in.Args, ReturnFiles: in.ReturnFiles, WebhookURL: in.WebhookURL}
	for _, f := range in.Files {
		r.Files = append(r.Files, wire.File{Path: f.Path, Content: f.Content, Encoding: f.Encoding})
	}
	if async {
		r.Async = &async
	}
	return r
}

// FuzzIdempotencyKey: a present Idempotency-Key header is either refused
// with invalid_idempotency_key or returned unchanged, and what is returned
// is 1 to 255 characters of [A-Za-z0-9._:-]; every such value is accepted.
func FuzzIdempotencyKey(f *testing.F) {
	for _, seed := range []string{"a", "order-42:retry.1_x", "", " a", "a\n", "ключ", strings.Repeat("k", 255), strings.Repeat("k", 256), "a\x00b", "a,b"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r := &http.Request{Header: http.Header{"Idempotency-Key": {v}}}
		got, err := idempotencyKey(r)
		documented := len(v) >= 1 && len(v) <= 255 && strings.Trim(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") == ""
		switch {
		case err != nil:
			var e *Error
			if !errors.As(err, &e) || e.Kind != KindInvalidIdempotencyKey {
				t.Fatalf("%q: error %v, want invalid_idempotency_key", v, err)
			}
			if documented {
				t.Fatalf("%q is within the documented charset and length but refused", v)
			}
		case got != v:
			t.Fatalf("%q: returned %q", v, got)
		case !documented:
			t.Fatalf("%q accepted, outside the documented charset or length", v)
		}
		// The same value given twice is refused, whatever it is.
		if _, err := idempotencyKey(&http.Request{Header: http.Header{"Idempotency-Key": {v, v}}}); err == nil {
			t.Fatalf("%q twice accepted", v)
		}
	})
}

// FuzzAPIKeyFormat: the format check that runs before any store lookup
// accepts only kubo_sk_ and 20 to 120 base62 characters, and the tenant
// check only names that are safe as a path part and a label.
func FuzzAPIKeyFormat(f *testing.F) {
	for _, seed := range []string{NewAPIKey(), "kubo_sk_", "kubo_sk_" + strings.Repeat("A", 19), "kubo_sk_" + strings.Repeat("z", 121),
		"KUBO_SK_" + strings.Repeat("a", 43), "kubo_sk_" + strings.Repeat("a", 42) + "\n", "acme", "a..b", "-a", "a/b", "ä"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if wellFormedKey(s) {
			rest, ok := strings.CutPrefix(s, KeyPrefix)
			if !ok || len(s) > maxKeyLen || len(rest) < 20 || len(rest) > 120 || strings.Trim(rest, base62) != "" {
				t.Fatalf("key %q accepted", s)
			}
		}
		if ValidTenant(s) {
			if len(s) == 0 || len(s) > 63 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789._-") != "" ||
				strings.Trim(s[:1], "abcdefghijklmnopqrstuvwxyz0123456789") != "" || url.PathEscape(s) != s {
				t.Fatalf("tenant %q accepted", s)
			}
		}
	})
}

// FuzzNotice: a ?notice= code shows only the server's own words: any
// query shows one of the fixed messages or nothing, never text from the
// link.
func FuzzNotice(f *testing.F) {
	for _, seed := range []string{"notice=signed-out", "notice=%3Cb%3Ehi", "notice=signed-out&notice=x", "notice=Signed+out.", "notice", "%zz", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, query string) {
		r := &http.Request{URL: &url.URL{Path: "/login", RawQuery: query}}
		got := noticeParam(r)
		if got == "" {
			return
		}
		for _, msg := range notices {
			if got == msg {
				return
			}
		}
		t.Fatalf("?%s shows %q, not one of the server's notices", query, got)
	})
}

// TestDecodeFuzzFindings holds what fuzzing found, as regular cases.
func TestDecodeFuzzFindings(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		// encoding/json decodes null into a struct as nothing, so the body
		// went on as an empty request and was refused for a missing field.
		{`null`, "request body must be a JSON object"},
		{` null `, "request body must be a JSON object"},
	} {
		_, _, err := decodeBody([]byte(tc.body))
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindInvalidRequest || e.Msg != tc.want {
			t.Errorf("%q: error %v, want invalid_request %q", tc.body, err, tc.want)
		}
	}
}
