package api

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// e2bRecorded is one request E2B's JS SDK sent (testdata/e2b/requests.json
// says how they were recorded and how the test fills them in).
type e2bRecorded struct {
	Name    string            `json:"name"`
	Note    string            `json:"note"`
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	// Background is a Connect stream the SDK keeps reading while it makes
	// other calls (commands.run with background: true): the test reads its
	// start event, goes on, and checks the rest at the end.
	Background bool `json:"background"`
}

// e2bWireHeaders are the answer's headers the SDK reads.
var e2bWireHeaders = []string{"Content-Type", "Content-Disposition", "X-Next-Token", "WWW-Authenticate", "Allow"}

// TestE2BWire replays, in order, the requests of E2B's own SDKs (e2b
// 2.51.0, @e2b/code-interpreter 2.8.0) against a server over the sandbox
// fake, and compares each answer (status, the headers the SDK reads, the
// body: Connect envelopes and NDJSON one JSON a line) with
// testdata/e2b/golden/<name>.golden; go test -update rewrites them. The
// env's conformance check judges every /e2b answer by e2bWireProblems, so
// a golden cannot record an answer the SDK would reject.
func TestE2BWire(t *testing.T) {
	raw, err := os.ReadFile("testdata/e2b/requests.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Requests []e2bRecorded `json:"requests"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	env, _ := newSandboxEnv(t)
	answers := map[string]any{} // by request name: status, headers, body, frames
	type background struct {
		name, line string
		res        *http.Response
		first      []byte
		rest       chan []byte
	}
	var backgrounds []background
	for _, rec := range doc.Requests {
		t.Run(rec.Name, func(t *testing.T) {
			res := e2bReplay(t, env, rec, answers)
			line := rec.Method + " " + e2bFill(t, rec.URL, env, answers)
			if !rec.Background {
				body, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				answers[rec.Name] = e2bRecordAnswer(t, res, body)
				e2bWireGolden(t, rec.Name, line, res, body)
				return
			}
			// The start event first, as the SDK waits for it.
			first := make([]byte, 5)
			if _, err := io.ReadFull(res.Body, first); err != nil {
				t.Fatalf("%s: no envelope: %v", rec.Name, err)
			}
			msg := make([]byte, binary.BigEndian.Uint32(first[1:]))
			if _, err := io.ReadFull(res.Body, msg); err != nil {
				t.Fatalf("%s: short envelope: %v", rec.Name, err)
			}
			first = append(first, msg...)
			answers[rec.Name] = e2bRecordAnswer(t, res, first)
			rest := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(res.Body)
				rest <- b
			}()
			backgrounds = append(backgrounds, background{rec.Name, line, res, first, rest})
		})
	}
	for _, bg := range backgrounds {
		t.Run(bg.name, func(t *testing.T) {
			defer bg.res.Body.Close()
			select {
			case rest := <-bg.rest:
				e2bWireGolden(t, bg.name, bg.line, bg.res, append(bg.first, rest...))
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: the stream has not ended", bg.name)
			}
		})
	}
}

var e2bPlaceholder = regexp.MustCompile(`\{\{([^}]+)\}\}`)

// e2bFill replaces {{key}} with the test's key and {{NAME.PATH}} with the
// value at PATH (dot-separated keys and indexes) in the answer to NAME.
func e2bFill(t *testing.T, s string, env *testEnv, answers map[string]any) string {
	t.Helper()
	return e2bPlaceholder.ReplaceAllStringFunc(s, func(m string) string {
		ref := m[2 : len(m)-2]
		if ref == "key" {
			return env.key
		}
		var v any = answers
		for _, k := range strings.Split(ref, ".") {
			switch x := v.(type) {
			case map[string]any:
				v = x[k]
			case []any:
				i, err := strconv.Atoi(k)
				if err != nil || i >= len(x) {
					t.Fatalf("%s: no element %q", ref, k)
				}
				v = x[i]
			default:
				t.Fatalf("%s: nothing at %q", ref, k)
			}
		}
		switch x := v.(type) {
		case string:
			return x
		case float64:
			return strconv.FormatFloat(x, 'f', -1, 64)
		}
		t.Fatalf("%s is %v, not a string or a number", ref, v)
		return ""
	})
}

// e2bReplay sends rec as the SDK did: its body's bytes (Latin-1 in the
// file), enveloped for a Connect stream, chunked where the SDK chunked it.
func e2bReplay(t *testing.T, env *testEnv, rec e2bRecorded, answers map[string]any) *http.Response {
	t.Helper()
	var body []byte
	for _, r := range e2bFill(t, rec.Body, env, answers) {
		if r > 0xff {
			t.Fatalf("%s: body rune %q is not Latin-1", rec.Name, r)
		}
		body = append(body, byte(r))
	}
	if rec.Headers["content-type"] == "application/connect+json" {
		body = append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body))), body...)
	}
	var r io.Reader
	switch {
	case rec.Headers["transfer-encoding"] == "chunked":
		r = io.MultiReader(bytes.NewReader(body)) // no length: sent chunked
	case len(body) > 0 || rec.Method == http.MethodPost:
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(rec.Method, env.http.URL+e2bFill(t, rec.URL, env, answers), r)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range rec.Headers {
		if k != "transfer-encoding" {
			req.Header.Set(k, e2bFill(t, v, env, answers))
		}
	}
	res, err := env.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// e2bFrame is one Connect envelope.
type e2bFrame struct {
	flags byte
	msg   []byte
}

// e2bFrames splits a Connect stream's body into its envelopes.
func e2bFrames(body []byte) ([]e2bFrame, error) {
	var out []e2bFrame
	for len(body) > 0 {
		if len(body) < 5 {
			return out, fmt.Errorf("%d bytes left, not an envelope", len(body))
		}
		n := int(binary.BigEndian.Uint32(body[1:5]))
		if len(body) < 5+n {
			return out, fmt.Errorf("an envelope of %d bytes has %d", n, len(body)-5)
		}
		out = append(out, e2bFrame{body[0], body[5 : 5+n]})
		body = body[5+n:]
	}
	return out, nil
}

// e2bRecordAnswer is an answer as later requests refer to it.
func e2bRecordAnswer(t *testing.T, res *http.Response, body []byte) map[string]any {
	t.Helper()
	headers := map[string]any{}
	for k := range res.Header {
		headers[k] = res.Header.Get(k)
	}
	a := map[string]any{"status": float64(res.StatusCode), "headers": headers, "body": string(body)}
	var v any
	switch ct := res.Header.Get("Content-Type"); {
	case strings.HasPrefix(ct, "application/json"):
		if json.Unmarshal(body, &v) == nil {
			a["body"] = v
		}
	case ct == "application/connect+json":
		frames, _ := e2bFrames(body)
		var msgs []any
		for _, f := range frames {
			var m any
			_ = json.Unmarshal(f.msg, &m)
			msgs = append(msgs, m)
		}
		a["frames"] = msgs
	}
	return a
}

// e2bWireGolden checks an answer against what the SDK accepts and
// compares it with its golden file.
func e2bWireGolden(t *testing.T, name, line string, res *http.Response, body []byte) {
	t.Helper()
	h := map[string]string{}
	for _, k := range e2bWireHeaders {
		if v := res.Header.Get(k); v != "" {
			h[k] = v
		}
	}
	hj, _ := json.MarshalIndent(h, "", "  ")
	var out bytes.Buffer
	fmt.Fprintf(&out, "%s\nstatus: %d\nheaders: %s\n", line, res.StatusCode, hj)
	switch ct := res.Header.Get("Content-Type"); {
	case len(body) == 0:
	case ct == "application/connect+json":
		// One envelope a line: its flags and its message.
		frames, _ := e2bFrames(body)
		for _, f := range frames {
			var m any
			_ = json.Unmarshal(f.msg, &m)
			b, _ := json.Marshal(map[string]any{"flags": f.flags, "message": m})
			out.Write(append(b, '\n'))
		}
	case ct == "application/x-ndjson":
		out.Write(body)
	case strings.HasPrefix(ct, "application/json"):
		if err := json.Indent(&out, body, "", "  "); err != nil {
			t.Errorf("%s: body is not JSON: %s", name, body)
		}
		out.WriteByte('\n')
	default:
		out.WriteString(strconv.Quote(string(body)) + "\n")
	}
	goldenFile(t, "e2b/golden/"+name, out.Bytes())
}

// e2bWireProblems are the ways an answer to path breaks what E2B's JS SDK
// (e2b 2.51.0) expects, read from its code:
//   - an E2B error ({code, message}, code the HTTP status: the SDK tells a
//     missing sandbox by code 404 in the body) in JSON;
//   - a Connect unary error in JSON with a code name (else connect-es
//     guesses the code from the status);
//   - a Connect stream as application/connect+json envelopes, uncompressed,
//     ending with one end-stream envelope;
//   - NDJSON whose every line is JSON.
func e2bWireProblems(path string, status int, h http.Header, body []byte) []string {
	var errs []string
	ct := h.Get("Content-Type")
	stream := ct == "application/connect+json"
	switch {
	case e2bConnectPath(path) && stream:
		frames, err := e2bFrames(body)
		if err != nil {
			errs = append(errs, err.Error())
		}
		for i, f := range frames {
			var m map[string]any
			if err := json.Unmarshal(f.msg, &m); err != nil {
				errs = append(errs, fmt.Sprintf("envelope %d is not a JSON message", i))
			}
			switch {
			case f.flags&1 != 0:
				errs = append(errs, fmt.Sprintf("envelope %d is compressed", i))
			case f.flags == 2 && i != len(frames)-1:
				errs = append(errs, fmt.Sprintf("end-stream envelope %d is not the last", i))
			}
		}
		if len(frames) == 0 || frames[len(frames)-1].flags != 2 {
			errs = append(errs, "missing EndStreamResponse")
		}
	case e2bConnectPath(path) && status != http.StatusOK:
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if !strings.HasPrefix(ct, "application/json") || json.Unmarshal(body, &e) != nil || e.Code == "" {
			errs = append(errs, "a Connect error must be JSON with a code name")
		}
	case status >= 400:
		var e struct {
			Code    *int    `json:"code"`
			Message *string `json:"message"`
		}
		if !strings.HasPrefix(ct, "application/json") || json.Unmarshal(body, &e) != nil || e.Code == nil || e.Message == nil {
			errs = append(errs, `an error must be JSON {"code", "message"}`)
		} else if *e.Code != status {
			errs = append(errs, fmt.Sprintf("error code %d is not the status %d", *e.Code, status))
		}
	case ct == "application/x-ndjson":
		for _, l := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
			if !json.Valid([]byte(l)) {
				errs = append(errs, fmt.Sprintf("NDJSON line %q is not JSON", l))
			}
		}
	}
	return errs
}
