package main

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image/png"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// runCell runs code in a sandbox's context (cid, or lang's default) and
// returns the outcome, which must be a 200.
func runCell(t *testing.T, p *serverProc, key, id string, body map[string]any) map[string]any {
	t.Helper()
	r := sbxCall(t, p, key, "POST", id, "/run", body)
	if r.status != 200 {
		t.Fatalf("run %v: %d %s", body, r.status, tail(r.raw, 1000))
	}
	return r.body
}

// mainText is the text/plain of a cell's main result, or "".
func mainText(res map[string]any) string {
	results, _ := res["results"].([]any)
	for _, o := range results {
		if m := o.(map[string]any); m["main"] == true {
			return m["data"].(map[string]any)["text/plain"].(string)
		}
	}
	return ""
}

func errName(res map[string]any) string {
	if e, ok := res["error"].(map[string]any); ok {
		return e["name"].(string)
	}
	return ""
}

// TestSandboxContextsE2E: Python and JavaScript contexts on the default
// runtime keep state across cells, return values and errors, survive an
// interrupt with their state, restart without it, and end with a pause.
func TestSandboxContextsE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil)
	key := tenantKey(t, p, "notebook", "pro")
	id := createSandbox(t, p, key, map[string]any{"timeout_s": 300})

	// Python's default context: state, stdout beside the value, a
	// subprocess's raw output, stdin that is empty.
	r := runCell(t, p, key, id, map[string]any{"code": "import os, subprocess\nx = 41\nprint('hello')\nsubprocess.run(['echo', 'from a child'])\nx + 1"})
	if r["status"] != "succeeded" || mainText(r) != "42" || r["stdout"] != "hello\nfrom a child\n" || r["execution_count"] != 1.0 {
		t.Fatalf("first cell: %v", r)
	}
	pyCtx := r["context_id"].(string)
	r = runCell(t, p, key, id, map[string]any{"code": "x", "language": "python"})
	if mainText(r) != "41" || r["context_id"] != pyCtx || r["execution_count"] != 2.0 {
		t.Fatalf("state across cells: %v", r)
	}
	r = runCell(t, p, key, id, map[string]any{"code": "def f(n):\n    return 10 / n\nf(0)", "context_id": pyCtx})
	e, _ := r["error"].(map[string]any)
	if r["status"] != "failed" || errName(r) != "ZeroDivisionError" || !strings.Contains(e["traceback"].(string), "line 2, in f") || strings.Contains(e["traceback"].(string), "kernel") {
		t.Fatalf("error: %v", r)
	}
	r = runCell(t, p, key, id, map[string]any{"code": "import sys\nsys.stdout.buffer.write('bytes ✓\\n'.encode())\nsys.stdout.encoding"})
	if r["stdout"] != "bytes ✓\n" || mainText(r) != "'utf-8'" {
		t.Fatalf("sys.stdout.buffer: %v", r)
	}
	if r = runCell(t, p, key, id, map[string]any{"code": "import asyncio\nawait asyncio.sleep(0.01)\nx + 1"}); mainText(r) != "42" {
		t.Fatalf("top-level await: %v", r)
	}
	// IPython's _repr_json_ returns a dict: it comes back as JSON text,
	// and a repr method returning something else drops only its type.
	r = runCell(t, p, key, id, map[string]any{"code": "class M:\n    def _repr_json_(self): return {'a': [1, 2]}\n    def _repr_html_(self): return 42\nM()"})
	if res, _ := r["results"].([]any); len(res) != 1 || r["stdout"] != "" {
		t.Fatalf("_repr_json_ with a dict: %v", r)
	} else if data := res[0].(map[string]any)["data"].(map[string]any); data["application/json"] != `{"a": [1, 2]}` || data["text/html"] != nil || data["text/plain"] == nil {
		t.Fatalf("_repr_json_ with a dict gave the bundle %v", data)
	}
	r = runCell(t, p, key, id, map[string]any{"code": "input()"})
	if errName(r) != "EOFError" {
		t.Fatalf("stdin of a cell: %v", r)
	}
	r = runCell(t, p, key, id, map[string]any{"code": "import os\nos.environ.get('CELL_ONLY')", "env": map[string]string{"CELL_ONLY": "yes"}})
	if mainText(r) != "'yes'" {
		t.Fatalf("env of a cell: %v", r)
	}
	if r = runCell(t, p, key, id, map[string]any{"code": "os.environ.get('CELL_ONLY')"}); len(r["results"].([]any)) != 0 {
		t.Fatalf("a cell's env outlived it: %v", r)
	}

	// A timeout interrupts the cell and keeps the context.
	start := time.Now()
	r = runCell(t, p, key, id, map[string]any{"code": "import time\ny = 7\nwhile True:\n    time.sleep(0.1)", "timeout_s": 2})
	if r["status"] != "timed_out" || errName(r) != "KeyboardInterrupt" || time.Since(start) > 20*time.Second {
		t.Fatalf("interrupted cell: %v after %s", r, time.Since(start))
	}
	if r = runCell(t, p, key, id, map[string]any{"code": "(x, y)"}); mainText(r) != "(41, 7)" {
		t.Fatalf("state after the interrupt: %v", r)
	}
	// A cell that swallows the interrupt costs the context its state, and
	// says so.
	r = runCell(t, p, key, id, map[string]any{"code": "while True:\n    try:\n        time.sleep(1)\n    except KeyboardInterrupt:\n        pass", "timeout_s": 1})
	if r["status"] != "timed_out" || errName(r) != "ContextRestarted" {
		t.Fatalf("stubborn cell: %v", r)
	}
	if r = runCell(t, p, key, id, map[string]any{"code": "'x' in dir()"}); mainText(r) != "False" || r["context_id"] != pyCtx {
		t.Fatalf("after the restart: %v", r)
	}
	// A kernel that exits (os._exit) is reported, and the next cell runs.
	r = runCell(t, p, key, id, map[string]any{"code": "import os\nos._exit(3)"})
	if errName(r) != "ContextDied" {
		t.Fatalf("exited kernel: %v", r)
	}
	if r = runCell(t, p, key, id, map[string]any{"code": "1 + 1"}); mainText(r) != "2" {
		t.Fatalf("after the kernel exited: %v", r)
	}

	// JavaScript: let/const across cells and re-run, functions, classes,
	// top-level await, an interrupted synchronous loop.
	c := sbxCall(t, p, key, "POST", id, "/contexts", map[string]any{"language": "javascript"})
	if c.status != 201 || c.body["language"] != "javascript" {
		t.Fatalf("create a js context: %d %s", c.status, c.raw)
	}
	js := c.body["id"].(string)
	for _, step := range []struct{ code, want string }{
		{"const a = 20\nlet b = 1\nfunction twice(n) { return 2 * n }\nclass K { v() { return a + b } }\nconsole.log('logged')\ntwice(a) + b", "41"},
		{"const a = 5\na", "5"}, // a cell run again redeclares
		{"new K().v()", "6"},
		{"const r = await new Promise(res => setTimeout(() => res(b + 1), 10))\nr", "2"},
		{"[typeof require, r]", "[ 'function', 2 ]"},
	} {
		r = runCell(t, p, key, id, map[string]any{"code": step.code, "context_id": js})
		if r["status"] != "succeeded" || mainText(r) != step.want {
			t.Fatalf("js %q: %v", step.code, r)
		}
	}
	r = runCell(t, p, key, id, map[string]any{"code": "let spin = 1\nwhile (true) {}", "context_id": js, "timeout_s": 1})
	if r["status"] != "timed_out" {
		t.Fatalf("js loop: %v", r)
	}
	if r = runCell(t, p, key, id, map[string]any{"code": "a + spin", "context_id": js}); mainText(r) != "6" {
		t.Fatalf("js state after the interrupt: %v", r)
	}
	r = runCell(t, p, key, id, map[string]any{"code": "null.x", "context_id": js})
	if errName(r) != "TypeError" {
		t.Fatalf("js error: %v", r)
	}

	// Listing, restart, delete.
	l := sbxCall(t, p, key, "GET", id, "/contexts", nil)
	if l.status != 200 || len(l.body["contexts"].([]any)) != 2 {
		t.Fatalf("contexts: %d %s", l.status, l.raw)
	}
	if rs := sbxCall(t, p, key, "POST", id, "/contexts/"+js+"/restart", nil); rs.status != 200 {
		t.Fatalf("restart: %d %s", rs.status, rs.raw)
	}
	if r = runCell(t, p, key, id, map[string]any{"code": "typeof a", "context_id": js}); mainText(r) != "'undefined'" {
		t.Fatalf("after restart: %v", r)
	}
	if d := sbxCall(t, p, key, "DELETE", id, "/contexts/"+js, nil); d.status != 200 {
		t.Fatalf("delete: %d %s", d.status, d.raw)
	}
	if r := sbxCall(t, p, key, "POST", id, "/run", map[string]any{"code": "1", "context_id": js}); r.status != 404 {
		t.Fatalf("run in a deleted context: %d %s", r.status, r.raw)
	}
	// The kernel processes are the sandbox's: none is left of the deleted one.
	ps := sbxRun(t, p, key, id, "ps -eo args | grep -c '[e]xpose-internals' || true")
	if strings.TrimSpace(ps["stdout"].(string)) != "0" {
		t.Fatalf("js kernels left: %v", ps)
	}
	// A pause ends the contexts.
	if r := sbxCall(t, p, key, "POST", id, "/pause", nil); r.status != 200 {
		t.Fatalf("pause: %d %s", r.status, r.raw)
	}
	if r := sbxCall(t, p, key, "POST", id, "/run", map[string]any{"code": "1", "context_id": pyCtx}); r.status != 404 {
		t.Fatalf("a context after a pause: %d %s", r.status, r.raw)
	}
	if r = runCell(t, p, key, id, map[string]any{"code": "'x' in dir()"}); mainText(r) != "False" {
		t.Fatalf("the default context after a resume: %v", r)
	}
}

// TestSandboxContextsDatasciE2E: in the datasci image a DataFrame comes
// back as HTML beside its text, and an open matplotlib figure as a PNG.
func TestSandboxContextsDatasciE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil, "--image", "datasci="+e2etest.DatasciDir())
	key := tenantKey(t, p, "notebook", "pro")
	id := createSandbox(t, p, key, map[string]any{"timeout_s": 300, "image": "datasci"})
	r := runCell(t, p, key, id, map[string]any{"code": "import pandas as pd\ndf = pd.DataFrame({'month': ['jan', 'feb'], 'units': [10, 25]})\ndf", "timeout_s": 60})
	results := r["results"].([]any)
	if r["status"] != "succeeded" || len(results) != 1 {
		t.Fatalf("dataframe: %v", r)
	}
	data := results[0].(map[string]any)["data"].(map[string]any)
	if !strings.Contains(data["text/html"].(string), "<table") || !strings.Contains(data["text/plain"].(string), "units") {
		t.Fatalf("dataframe bundle: %v", data)
	}
	r = runCell(t, p, key, id, map[string]any{"code": "ax = df.plot(x='month', y='units', kind='bar', figsize=(4, 3))\nint(df.units.sum())", "timeout_s": 60})
	results = r["results"].([]any)
	if r["status"] != "succeeded" || len(results) != 2 || mainText(r) != "35" || r["stderr"] != "" {
		t.Fatalf("chart: %v", r)
	}
	fig := results[1].(map[string]any)
	b, err := base64.StdEncoding.DecodeString(fig["data"].(map[string]any)["image/png"].(string))
	if fig["main"] != false || err != nil {
		t.Fatalf("figure: %v %v", fig["main"], err)
	}
	if _, err := png.DecodeConfig(bytes.NewReader(b)); err != nil {
		t.Fatalf("the figure is not a PNG: %v", err)
	}
	// Shown figures are closed: the next cell has none.
	if r = runCell(t, p, key, id, map[string]any{"code": "1"}); len(r["results"].([]any)) != 1 {
		t.Fatalf("figures after they were shown: %v", r)
	}
}

// contextsWork checks, on whatever runtime p serves, that a Python and a
// JavaScript context keep state across cells and that a timeout
// interrupts a cell without losing it.
func contextsWork(t *testing.T, p *serverProc, key, id string) {
	t.Helper()
	if r := runCell(t, p, key, id, map[string]any{"code": "n = 6", "timeout_s": 60}); r["status"] != "succeeded" {
		t.Fatalf("python cell: %v", r)
	}
	r := runCell(t, p, key, id, map[string]any{"code": "import time\nwhile True: time.sleep(0.1)", "timeout_s": 2})
	if r["status"] != "timed_out" || errName(r) != "KeyboardInterrupt" {
		t.Fatalf("interrupt: %v", r)
	}
	if r := runCell(t, p, key, id, map[string]any{"code": "n * 7"}); mainText(r) != "42" {
		t.Fatalf("python state: %v", r)
	}
	if r := runCell(t, p, key, id, map[string]any{"code": "let m = 6", "language": "javascript", "timeout_s": 60}); r["status"] != "succeeded" {
		t.Fatalf("js cell: %v", r)
	}
	if r := runCell(t, p, key, id, map[string]any{"code": "m * 7", "language": "javascript"}); mainText(r) != "42" {
		t.Fatalf("js state: %v", r)
	}
}

// TestSandboxContextsMoreE2E: a cell's stdout is streamed while it runs,
// two contexts share nothing, the output cap holds in a cell, a context
// outlives an idle spell, and a context sees nothing of another tenant's
// sandbox.
func TestSandboxContextsMoreE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil)
	key := tenantKey(t, p, "notebook", "pro")
	other := tenantKey(t, p, "neighbour", "pro")
	created := sbxCall(t, p, key, "POST", "", "", map[string]any{"timeout_s": 300})
	if created.status != 201 {
		t.Fatalf("create: %d %s", created.status, created.raw)
	}
	id := created.body["id"].(string)
	outputCap := int(created.body["limits"].(map[string]any)["output_bytes"].(float64))

	// Streamed: the cell waits for a file the test writes only once the
	// first line has arrived, so a stream held to the end would time out.
	res := postStream(t, p.url+"/v1/sandboxes/"+id+"/run", key, map[string]any{"timeout_s": 30, "code": "import os, time\nprint('marker', flush=True)\n" +
		"while not os.path.exists('/home/user/go'):\n    time.sleep(0.05)\nprint('done')\n'end'"})
	var order []string
	var end map[string]any
	for typ, ev := range sseEvents(res.Body) {
		order = append(order, typ)
		if typ == "stdout" && strings.Contains(fmt.Sprint(ev["text"]), "marker") {
			if st, raw := sbxRaw(t, p, key, "PUT", id, "/home/user/go", []byte("1")); st/100 != 2 {
				t.Fatalf("writing the go file: %d %s", st, raw)
			}
		}
		if typ == "end" {
			end = ev
		}
	}
	res.Body.Close()
	if end == nil || end["status"] != "succeeded" || end["stdout"] != "marker\ndone\n" || order[0] != "stdout" || order[len(order)-1] != "end" {
		t.Fatalf("streamed cell: events %v, end %v", order, end)
	}

	// Two contexts of one sandbox share no variables.
	mk := func() string {
		c := sbxCall(t, p, key, "POST", id, "/contexts", map[string]any{"language": "python"})
		if c.status != 201 {
			t.Fatalf("create a context: %d %s", c.status, c.raw)
		}
		return c.body["id"].(string)
	}
	a, b := mk(), mk()
	runCell(t, p, key, id, map[string]any{"code": "secret = 'only in a'", "context_id": a})
	if r := runCell(t, p, key, id, map[string]any{"code": "'secret' in dir()", "context_id": b}); mainText(r) != "False" {
		t.Fatalf("context b sees a's variable: %v", r)
	}

	// The plan's output cap holds inside a cell.
	r := runCell(t, p, key, id, map[string]any{"code": fmt.Sprintf("print('x' * %d)\n'after'", outputCap+5000), "context_id": a})
	if r["truncated"] != true || len(r["stdout"].(string)) != outputCap || mainText(r) != "'after'" {
		t.Fatalf("output over the cap: truncated %v, %d bytes (cap %d), result %q", r["truncated"], len(r["stdout"].(string)), outputCap, mainText(r))
	}

	// An idle spell, well inside the sandbox's lifetime, keeps the state.
	time.Sleep(3 * time.Second)
	if r := runCell(t, p, key, id, map[string]any{"code": "secret", "context_id": a}); mainText(r) != "'only in a'" {
		t.Fatalf("after an idle spell: %v", r)
	}

	// Another tenant's sandbox, with a file and a process of its own, is
	// invisible from a context: no process of it in /proc, no path to its
	// home.
	theirs := createSandbox(t, p, other, map[string]any{"timeout_s": 120})
	if st, raw := sbxRaw(t, p, other, "PUT", theirs, "/home/user/their-secret.txt", []byte("s3cr3t")); st/100 != 2 {
		t.Fatalf("their upload: %d %s", st, raw)
	}
	if r := sbxCall(t, p, other, "POST", theirs, "/commands", map[string]any{"cmd": "sleep 4321", "background": true}); r.status != 201 {
		t.Fatalf("their command: %d %s", r.status, r.raw)
	}
	probe := `import glob, os
seen = []
for d in glob.glob('/proc/[0-9]*'):
    try:
        seen.append(open(d + '/cmdline', 'rb').read().replace(b'\0', b' ').decode())
    except OSError:
        pass
found = [p for p in glob.glob('/proc/*/root/home/user/*') + glob.glob('/home/*/*') + glob.glob('/tmp/**', recursive=True) if 'their-secret' in p]
(any('sleep 4321' in c for c in seen), found, len(seen) > 0)`
	if r := runCell(t, p, key, id, map[string]any{"code": probe, "context_id": a}); mainText(r) != "(False, [], True)" {
		t.Fatalf("from a context, the other tenant's sandbox shows: %v", r)
	}
	if r := sbxCall(t, p, key, "POST", theirs, "/run", map[string]any{"code": "1"}); r.status != 404 {
		t.Fatalf("running a cell in another tenant's sandbox: %d %s", r.status, r.raw)
	}
}

// TestSandboxContextRestartRaceE2E: restarts racing each other and a
// queued cell leave one interpreter per context, never an orphan the
// server no longer reads.
func TestSandboxContextRestartRaceE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil)
	key := tenantKey(t, p, "notebook", "pro")
	id := createSandbox(t, p, key, map[string]any{"timeout_s": 300})
	c := sbxCall(t, p, key, "POST", id, "/contexts", map[string]any{"language": "python"})
	if c.status != 201 {
		t.Fatalf("create a context: %d %s", c.status, c.raw)
	}
	cid := c.body["id"].(string)
	done := make(chan int, 8)
	go func() {
		done <- sbxCall(t, p, key, "POST", id, "/run", map[string]any{"code": "import time\ntime.sleep(2)", "context_id": cid}).status
	}()
	time.Sleep(300 * time.Millisecond)
	go func() {
		done <- sbxCall(t, p, key, "POST", id, "/run", map[string]any{"code": "1", "context_id": cid}).status
	}()
	for i := 0; i < 3; i++ {
		go func() { done <- sbxCall(t, p, key, "POST", id, "/contexts/"+cid+"/restart", nil).status }()
	}
	for i := 0; i < 5; i++ {
		if st := <-done; st != 200 {
			t.Errorf("a call of the race answered %d", st)
		}
	}
	if r := runCell(t, p, key, id, map[string]any{"code": "2 + 2", "context_id": cid}); mainText(r) != "4" {
		t.Fatalf("after the race: %v", r)
	}
	// The replaced interpreters are killed a moment after their
	// replacement is ready.
	var kernels string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out := sbxRun(t, p, key, id, "ps -eo args | grep -c '^python3 -u -c' || true")
		if kernels = strings.TrimSpace(out["stdout"].(string)); kernels == "1" {
			return
		}
	}
	t.Fatalf("%s Python interpreters for one context", kernels)
}
