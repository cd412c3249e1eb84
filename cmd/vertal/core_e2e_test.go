package main

import (
	"bytes"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image/png"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// checkCore proves the execution core through a real server and driver:
// live output over SSE while GET still says running, a CSV in and a PNG
// out byte for byte, returned files that never follow a symlink to the
// host (the server's own database, the host's /root), hostile input
// refused in the error shape, and a queued execution canceled before it
// ran. TestServeE2E runs it on oci, TestServeDockerE2E on docker.
func checkCore(t *testing.T, p *serverProc, key string) {
	base := p.url + "/api"
	t.Run("StreamFilesInAndOut", func(t *testing.T) {
		csv := "x,y\n1,10\n2,20\n3,30\n"
		code := `import csv, struct, time, zlib
rows = list(csv.DictReader(open("data.csv")))
print("marker", flush=True)
time.sleep(1.5)
def chunk(kind, data):
    c = struct.pack(">I", len(data)) + kind + data
    return c + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
raw = b"".join(b"\x00" + bytes(int(r["y"]) for r in rows) for _ in range(2))
open("chart.png", "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", len(rows), 2, 8, 0, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
print("done")
`
		res := postStream(t, base+"/v1/executions", key, map[string]any{"language": "python", "code": code,
			"files":        []any{map[string]any{"path": "data.csv", "content": csv}},
			"return_files": []string{"*.png", "*.csv"}})
		defer res.Body.Close()
		if ct := res.Header.Get("Content-Type"); res.StatusCode != 200 || !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("%d %s", res.StatusCode, ct)
		}
		var id, stateAtMarker string
		var order []string
		var result map[string]any
		for typ, ev := range sseEvents(res.Body) {
			order = append(order, typ)
			switch typ {
			case "started":
				id, _ = ev["id"].(string)
			case "stdout":
				if strings.Contains(ev["text"].(string), "marker") && stateAtMarker == "" {
					r := call(t, "GET", base+"/v1/executions/"+id, key, nil, nil)
					stateAtMarker, _ = r.body["status"].(string)
				}
			case "result":
				result = ev
			}
		}
		if len(order) < 3 || order[0] != "started" || order[len(order)-1] != "result" || order[1] != "stdout" {
			t.Fatalf("events in order %v", order)
		}
		if stateAtMarker != "running" {
			t.Errorf("GET when the marker arrived said %q; want running", stateAtMarker)
		}
		if result["status"] != "succeeded" || result["stdout"] != "marker\ndone\n" {
			t.Fatalf("result %v", result)
		}
		got := map[string][]byte{}
		for _, f := range result["files"].([]any) {
			m := f.(map[string]any)
			b, err := base64.StdEncoding.DecodeString(m["content"].(string))
			if err != nil || m["encoding"] != "base64" || int(m["size"].(float64)) != len(b) {
				t.Errorf("file %v: %v", m["path"], err)
			}
			got[m["path"].(string)] = b
		}
		if string(got["data.csv"]) != csv {
			t.Errorf("data.csv came back as %q", got["data.csv"])
		}
		img, err := png.Decode(bytes.NewReader(got["chart.png"]))
		if err != nil || img.Bounds().Dx() != 3 || img.Bounds().Dy() != 2 {
			t.Fatalf("chart.png: %v %v", err, img)
		}
		// GET returns the same bytes, from the store.
		r := call(t, "GET", base+"/v1/executions/"+id, key, nil, nil)
		stored, _ := json.Marshal(r.body["files"])
		sent, _ := json.Marshal(result["files"])
		if !bytes.Equal(stored, sent) {
			t.Errorf("GET's files differ from the streamed result's")
		}
	})

	t.Run("ReturnedFilesNeverReadTheHost", func(t *testing.T) {
		db := filepath.Join(p.dataDir, "vertal.db")
		code := `import os
os.symlink("` + db + `", "db")
os.symlink("/root", "root")
os.symlink("` + p.dataDir + `", "data")
os.mkfifo("fifo")
open("ok.txt", "w").write("fine")
`
		r := call(t, "POST", base+"/v1/executions", key, map[string]any{"language": "python", "code": code, "return_files": []string{"**"}}, nil)
		if r.status != 200 || r.body["status"] != "succeeded" {
			t.Fatalf("%d %s", r.status, r.raw)
		}
		var paths []string
		for _, f := range r.body["files"].([]any) {
			paths = append(paths, f.(map[string]any)["path"].(string))
		}
		if !slices.Equal(paths, []string{"main.py", "ok.txt"}) {
			t.Errorf("returned %v; want only the program's regular files", paths)
		}
		if strings.Contains(r.raw, base64.StdEncoding.EncodeToString([]byte("SQLite format 3"))[:16]) {
			t.Errorf("ATTACK SUCCEEDED: the server's database came back")
		}
	})

	t.Run("HostileInput", func(t *testing.T) {
		file := func(p string) map[string]any { return map[string]any{"path": p, "content": "x"} }
		many := make([]any, 60)
		for i := range many {
			many[i] = file("f" + string(rune('a'+i%26)) + string(rune('a'+i/26)))
		}
		for _, tc := range []struct {
			name   string
			extra  map[string]any
			status int
			field  string
		}{
			{"dotdot", map[string]any{"files": []any{file("../etc/passwd")}}, 400, "files[0].path"},
			{"absolute", map[string]any{"files": []any{file("/etc/passwd")}}, 400, "files[0].path"},
			{"duplicate", map[string]any{"files": []any{file("a"), file("a")}}, 400, "files[1].path"},
			{"code file", map[string]any{"files": []any{file("main.py")}}, 400, "files[0].path"},
			{"bad base64", map[string]any{"files": []any{map[string]any{"path": "a", "content": "!!", "encoding": "base64"}}}, 400, "files[0]"},
			{"too many", map[string]any{"files": many}, 413, "files"},
			{"env name", map[string]any{"env": map[string]any{"1X": "y"}}, 400, "env"},
			{"env reserved", map[string]any{"env": map[string]any{"PATH": "/tmp"}}, 400, "env"},
			{"arg NUL", map[string]any{"args": []any{"a\x00b"}}, 400, "args[0]"},
			{"glob escape", map[string]any{"return_files": []any{"../*"}}, 400, "return_files[0]"},
		} {
			body := map[string]any{"language": "python", "code": "print(1)"}
			for k, v := range tc.extra {
				body[k] = v
			}
			r := call(t, "POST", base+"/v1/executions", key, body, nil)
			msg, _ := r.body["error"].(map[string]any)["message"].(string)
			if r.status != tc.status || !strings.Contains(msg, tc.field) {
				t.Errorf("%s: %d %s; want %d naming %s", tc.name, r.status, r.raw, tc.status, tc.field)
			}
		}
	})

	t.Run("CancelQueued", func(t *testing.T) {
		// A free key holds one sandbox at a time: the second run queues.
		out, _, err := p.vertal(t, nil, "create-key", "queuer", "--plan", "free")
		if err != nil {
			t.Fatal(err)
		}
		free := strings.TrimSpace(out)
		first := make(chan httpResult, 1)
		go func() {
			first <- call(t, "POST", base+"/v1/executions", free, map[string]any{"language": "bash", "code": "sleep 5; echo first"}, nil)
		}()
		waitStatus(t, p, "queuer", "running", 1)
		second := make(chan httpResult, 1)
		go func() {
			second <- call(t, "POST", base+"/v1/executions", free, map[string]any{"language": "bash", "code": "echo SECOND-RAN"}, nil)
		}()
		id := waitStatus(t, p, "queuer", "queued", 1)
		if r := call(t, "POST", base+"/v1/executions/"+id+"/cancel", free, nil, nil); r.status != 200 || r.body["status"] != "canceled" {
			t.Errorf("cancel queued: %d %s", r.status, r.raw)
		}
		r := <-second
		if r.status != 200 || r.body["status"] != "canceled" || strings.Contains(r.raw, "SECOND-RAN") || r.body["started_at"] != nil {
			t.Errorf("the canceled queued run answered %d %s", r.status, r.raw)
		}
		if r := <-first; r.body["stdout"] != "first\n" {
			t.Errorf("the running one: %d %s", r.status, r.raw)
		}
		u := call(t, "GET", base+"/v1/usage", free, nil, nil)
		if n := u.body["today"].(map[string]any)["executions"]; n != 1.0 {
			t.Errorf("usage counts %v executions; want 1 (the canceled queued one is refunded)", n)
		}
	})
}

// waitStatus waits until tenant has n executions in status and returns
// the newest one's id.
func waitStatus(t *testing.T, p *serverProc, tenant, status string, n int) string {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(p.dataDir, "vertal.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var count int
		var id sql.NullString
		err := db.QueryRow(`SELECT COUNT(*), MAX(id) FROM executions WHERE tenant = ? AND status = ?`, tenant, status).Scan(&count, &id)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		if count == n {
			return id.String
		}
	}
	t.Fatalf("no %d %s executions of %s after 30 s", n, status, tenant)
	return ""
}
