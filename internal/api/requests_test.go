package api

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRequestEdges holds the edge cases of a QA pass over the wire
// format: each row is one request as a client might send it, with the
// answer it must get. A refusal must name the problem; an acceptance must
// run the code exactly as sent.
func TestRequestEdges(t *testing.T) {
	env := newEnv(t)
	run := `{"language":"python","code":"print(6 * 7)"}`
	// Within the limits, but heavily escaped: \u0001 is six bytes for one.
	escapedStdin := `{"language":"python","code":"print(6 * 7)","stdin":"` + strings.Repeat(`\u0001`, 1<<20) + `"}`
	escapedCode := `{"language":"python","code":"` + strings.Repeat(`\"`, 512<<10) + `"}`
	for _, tc := range []struct {
		name       string
		req        request
		wantStatus int
		wantCode   string // error code; "" for a 200
		wantMsg    string // part of the error message
		wantCodeIn string // for a 200: the code the driver got
	}{
		{name: "charset utf-8", req: request{method: "POST", path: "/v1/executions", body: run, ctype: ptr("application/json; charset=utf-8")},
			wantStatus: 200, wantCodeIn: "print(6 * 7)"},
		{name: "charset UTF-8 quoted", req: request{method: "POST", path: "/v1/executions", body: run, ctype: ptr(`application/json; charset="UTF-8"`)},
			wantStatus: 200, wantCodeIn: "print(6 * 7)"},
		{name: "stdin at its limit, escaped", req: request{method: "POST", path: "/v1/executions", body: escapedStdin},
			wantStatus: 200, wantCodeIn: "print(6 * 7)"},
		{name: "code at its limit, escaped", req: request{method: "POST", path: "/v1/executions", body: escapedCode},
			wantStatus: 200, wantCodeIn: strings.Repeat(`"`, 512<<10)},
		{name: "base URL with a trailing slash", req: request{method: "POST", path: "/api//v1/executions", body: run},
			wantStatus: 200, wantCodeIn: "print(6 * 7)"},
		{name: "repeated slashes in GET", req: request{path: "//v1///usage"}, wantStatus: 200},
		{name: "dot segments", req: request{path: "/api/v1/../v1/./usage"}, wantStatus: 200},
		{name: "trailing slash stays unknown", req: request{path: "/api//v1/usage/"},
			wantStatus: 404, wantCode: "not_found"},
		{name: "invalid UTF-8 in code", req: request{method: "POST", path: "/v1/executions", body: "{\"language\":\"python\",\"code\":\"print('\xff\xfe')\"}"},
			wantStatus: 400, wantCode: "invalid_json", wantMsg: "not valid UTF-8 (at byte 36)"},
		{name: "lone low surrogate in code", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"print('\udc00')"}`},
			wantStatus: 400, wantCode: "invalid_json", wantMsg: "lone surrogate escape (at byte 36)"},
		{name: "unpaired high surrogate in stdin", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","stdin":"\uD83D!"}`},
			wantStatus: 400, wantCode: "invalid_json", wantMsg: "lone surrogate escape"},
		{name: "surrogate pair is one character", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"print('\ud83d\ude00')"}`},
			wantStatus: 200, wantCodeIn: "print('😀')"},
		{name: "escaped backslash before u is text", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"print('\\udc00')"}`},
			wantStatus: 200, wantCodeIn: `print('\udc00')`},
		{name: "timeout beyond float64", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","timeout_s":1e309}`},
			wantStatus: 400, wantCode: "invalid_timeout", wantMsg: "between 1 and 60 seconds"},
		{name: "timeout rounding to zero", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","timeout_s":1e-400}`},
			wantStatus: 400, wantCode: "invalid_timeout", wantMsg: "between 1 and 60 seconds"},
		{name: "field in another case", req: request{method: "POST", path: "/v1/executions", body: `{"Language":"python","code":"x"}`},
			wantStatus: 400, wantCode: "invalid_request", wantMsg: `unknown field "Language"`},
		{name: "field given twice", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"print(1)","code":"print(2)"}`},
			wantStatus: 400, wantCode: "invalid_request", wantMsg: "field code is given more than once"},
		{name: "field given twice in a file", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","files":[{"path":"a","content":"1","path":"b"}]}`},
			wantStatus: 400, wantCode: "invalid_request", wantMsg: "files[0]: field path is given more than once"},
		{name: "file field in another case", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","files":[{"path":"ok","content":""},{"path":"a","Path":"b"}]}`},
			wantStatus: 400, wantCode: "invalid_request", wantMsg: `files[1]: unknown field "Path"`},
		{name: "code file used as a directory", req: request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","files":[{"path":"main.py/x","content":"1"}]}`},
			wantStatus: 400, wantCode: "invalid_request", wantMsg: `files[0].path: "main.py" is the code file, so it cannot be a directory`},
		{name: "two Authorization headers", req: request{path: "/v1/usage", add: [][2]string{{"Authorization", "Bearer " + NewAPIKey()}}},
			wantStatus: 401, wantCode: "unauthorized", wantMsg: "exactly one Authorization header"},
		{name: "lower-case bearer", req: request{path: "/v1/usage", key: "-", header: map[string]string{"Authorization": "bearer " + env.key}},
			wantStatus: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := env.driver.runs.Load()
			res := env.do(tc.req)
			if res.status != tc.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", res.status, tc.wantStatus, clip(string(res.body), 300))
			}
			if tc.wantCode != "" {
				if got := errCode(t, res); got != tc.wantCode {
					t.Errorf("code = %q, want %q", got, tc.wantCode)
				}
				if msg := decode(t, res)["error"].(map[string]any)["message"].(string); !strings.Contains(msg, tc.wantMsg) {
					t.Errorf("message %q does not contain %q", msg, tc.wantMsg)
				}
			}
			ran := env.driver.runs.Load() > runs
			if ran != (tc.wantCodeIn != "") {
				t.Fatalf("driver ran: %v", ran)
			}
			if ran {
				if got := env.driver.lastSpec().Code; got != tc.wantCodeIn {
					t.Errorf("driver got code %q, want %q", clip(got, 40), clip(tc.wantCodeIn, 40))
				}
			}
		})
	}
}

// TestPurgedExecution: after an operator purge, GET says the output was
// purged instead of passing the empty strings off as the program's output.
func TestPurgedExecution(t *testing.T) {
	env := newEnv(t)
	id := decode(t, env.run("python", "print(6 * 7)", nil))["id"].(string)
	for _, tc := range []struct {
		name       string
		purge      bool
		wantStdout any
		wantPurged any
	}{
		{name: "before purge", wantStdout: "42\n", wantPurged: nil},
		{name: "after purge", purge: true, wantStdout: "", wantPurged: true},
	} {
		if tc.purge {
			if _, err := env.store.Purge(context.Background(), env.clock.Now().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		got := decodeOK(t, tc.name, env.do(request{path: "/v1/executions/" + id}))
		if got["stdout"] != tc.wantStdout || got["output_purged"] != tc.wantPurged {
			t.Errorf("%s: stdout %q, output_purged %v; want %q, %v", tc.name, got["stdout"], got["output_purged"], tc.wantStdout, tc.wantPurged)
		}
	}
}

func TestLoneSurrogateAt(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{`{"a":"plain"}`, -1},
		{`{"a":"\u00e9 \uD83D\uDE00"}`, -1},
		{`{"a":"\\uDC00"}`, -1},
		{`{"a":"\\\uDC00"}`, 8},
		{`{"a":"\uDC00"}`, 6},
		{`{"a":"\uD800"}`, 6},
		{`{"a":"\uD800\u0041"}`, 6},
		{`{"a":"\uD800\uD800\uDC00"}`, 6},
		{`{"a":"x\uD800`, 7},
		{`{"\udfff":1}`, 2},
		{`{"a":"\u12"}`, -1},
		{`{"a":"x"} \uDC00`, -1},
	} {
		if got := LoneSurrogateAt([]byte(tc.in)); got != tc.want {
			t.Errorf("LoneSurrogateAt(%s) = %d, want %d", tc.in, got, tc.want)
		}
	}
}
