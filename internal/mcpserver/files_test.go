package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"maps"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// tinyPNG is a real 2x2 PNG, as a program using the standard library
// would write it.
func tinyPNG(t *testing.T) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 2, 2))
	img.Set(0, 0, color.RGBA{255, 0, 0, 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// fakeRun stands in for the sandbox behind a Backend: the program leaves
// the files in left, and the ones matching the request's return_files
// come back, in path order, as the API sends them.
type fakeRun struct {
	left map[string][]byte

	mu   sync.Mutex
	reqs []execution.Input
}

func (f *fakeRun) RunCode(_ context.Context, req RunRequest) (*client.Execution, error) {
	in := req.Input()
	f.mu.Lock()
	f.reqs = append(f.reqs, in)
	f.mu.Unlock()
	type file struct {
		Path     string `json:"path"`
		Size     int    `json:"size"`
		Encoding string `json:"encoding"`
		Content  string `json:"content"`
	}
	files := []file{}
	for _, name := range []string{"chart.png", "data.csv", "notes.bin", "other.txt"} {
		content, ok := f.left[name]
		if !ok {
			continue
		}
		for _, glob := range in.ReturnFiles {
			if ok, _ := path.Match(glob, name); ok {
				files = append(files, file{name, len(content), "base64", base64.StdEncoding.EncodeToString(content)})
				break
			}
		}
	}
	raw, _ := json.Marshal(map[string]any{
		"id": "exe_f", "status": "succeeded", "stdout": "done\n", "stderr": "", "exit_code": 0, "duration_ms": 12,
		"truncated": false, "usage": map[string]any{"sandbox_seconds": 0.012}, "request_id": "req_f",
		"files": files, "files_truncated": false,
	})
	var ex client.Execution
	if err := json.Unmarshal(raw, &ex); err != nil {
		return nil, err
	}
	ex.Raw = raw
	return &ex, nil
}

func (f *fakeRun) Usage(context.Context) (*client.Usage, error) {
	return nil, fmt.Errorf("not used")
}

// backendServer is an HTTP MCP endpoint whose tools call b, as the API
// server mounts it.
func backendServer(t *testing.T, b Backend) *mcp.ClientSession {
	t.Helper()
	srv := httptest.NewServer(HTTPHandler(HTTPOptions{Options: Options{Languages: testLanguages},
		Backend: func(*http.Request) (Backend, error) { return b, nil }}))
	t.Cleanup(srv.Close)
	cs, err := httpSession(t, srv.URL, "kubo_sk_alice")
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestRunCodeReturnedFiles(t *testing.T) {
	pngBytes := tinyPNG(t)
	csv := "city,temp\nOslo,3\n"
	binary := []byte{0xff, 0x00, 0xfe, 0x01}
	run := &fakeRun{left: map[string][]byte{
		"chart.png": pngBytes, "data.csv": []byte(csv), "notes.bin": binary, "other.txt": []byte("not asked for"),
	}}
	cs := backendServer(t, run)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{
		"language": "python", "code": "make()",
		"files":        []any{map[string]any{"path": "in/a.csv", "content": "x,y\n"}, map[string]any{"path": "b.bin", "content": "AAE=", "encoding": "base64"}},
		"env":          map[string]any{"MODE": "fast"},
		"args":         []any{"--n", "3"},
		"return_files": []any{"*.png", "*.csv", "*.bin"},
	}})
	if err != nil || res.IsError {
		t.Fatalf("run_code: %v %+v", err, res)
	}

	// Every argument reached the service as it was sent.
	lang, code := "python", "make()"
	stdin := ""
	want := execution.Input{Language: &lang, Code: &code, Stdin: &stdin,
		Files:       []execution.InputFile{{Path: "in/a.csv", Content: "x,y\n"}, {Path: "b.bin", Content: "AAE=", Encoding: "base64"}},
		Env:         map[string]string{"MODE": "fast"},
		Args:        []string{"--n", "3"},
		ReturnFiles: []string{"*.png", "*.csv", "*.bin"},
	}
	if diff := cmp.Diff([]execution.Input{want}, run.reqs); diff != "" {
		t.Errorf("service input (-want +got):\n%s", diff)
	}

	if len(res.Content) != 4 {
		t.Fatalf("got %d content items, want text, image, two resources: %+v", len(res.Content), res.Content)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	for _, w := range []string{"status: succeeded", "files: chart.png (" + fmt.Sprint(len(pngBytes)) + " bytes), data.csv (17 bytes), notes.bin (4 bytes)\n", "--- stdout ---\ndone\n"} {
		if !strings.Contains(text, w) {
			t.Errorf("text lacks %q:\n%s", w, text)
		}
	}
	img, ok := res.Content[1].(*mcp.ImageContent)
	if !ok || img.MIMEType != "image/png" || !bytes.Equal(img.Data, pngBytes) {
		t.Errorf("content[1] = %#v, want the PNG as image content", res.Content[1])
	}
	type resource struct{ URI, MIMEType, Text, Blob string }
	var got []resource
	for _, c := range res.Content[2:] {
		er, ok := c.(*mcp.EmbeddedResource)
		if !ok {
			t.Fatalf("content %#v, want an embedded resource", c)
		}
		got = append(got, resource{er.Resource.URI, er.Resource.MIMEType, er.Resource.Text, string(er.Resource.Blob)})
	}
	wantRes := []resource{
		{"vertal://executions/exe_f/files/data.csv", "text/plain; charset=utf-8", csv, ""},
		{"vertal://executions/exe_f/files/notes.bin", "application/octet-stream", "", string(binary)},
	}
	if diff := cmp.Diff(wantRes, got); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}

	// The structured result lists the files without their bytes a second time.
	b, _ := json.Marshal(res.StructuredContent)
	var structured struct {
		Files          []map[string]any `json:"files"`
		FilesTruncated *bool            `json:"files_truncated"`
	}
	json.Unmarshal(b, &structured)
	wantFiles := []map[string]any{{"path": "chart.png", "size": float64(len(pngBytes))}, {"path": "data.csv", "size": 17.0}, {"path": "notes.bin", "size": 4.0}}
	if diff := cmp.Diff(wantFiles, structured.Files); diff != "" || structured.FilesTruncated == nil {
		t.Errorf("structured files (-want +got):\n%s (files_truncated %v)", diff, structured.FilesTruncated)
	}
}

func TestFileContent(t *testing.T) {
	pngBytes := tinyPNG(t)
	gif := []byte("GIF89a\x01\x00\x01\x00\x00\x00\x00;")
	jpeg := []byte("\xff\xd8\xff\xe0\x00\x10JFIF\x00")
	webp := []byte("RIFF\x1a\x00\x00\x00WEBPVP8 ")
	svg := `<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>`
	for _, tc := range []struct {
		name, path string
		data       []byte
		wantImage  string // MIME type of an image; "" for a resource
		wantText   bool
		wantURI    string
	}{
		{"png", "plot.png", pngBytes, "image/png", false, ""},
		{"png named as text", "plot.txt", pngBytes, "image/png", false, ""},
		{"gif", "a.gif", gif, "image/gif", false, ""},
		{"jpeg", "a.jpg", jpeg, "image/jpeg", false, ""},
		{"webp", "a.webp", webp, "image/webp", false, ""},
		{"text named as png", "fake.png", []byte("just text"), "", true, "vertal://executions/exe_1/files/fake.png"},
		{"svg is markup, not an image", "logo.svg", []byte(svg), "", true, "vertal://executions/exe_1/files/logo.svg"},
		{"path parts escaped", "out/a b#?.txt", []byte("x"), "", true, "vertal://executions/exe_1/files/out/a%20b%23%3F.txt"},
		{"invalid utf-8 is a blob", "x.dat", []byte("ok\xffno"), "", false, "vertal://executions/exe_1/files/x.dat"},
		{"empty file", "empty", nil, "", true, "vertal://executions/exe_1/files/empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := returnedFile{Path: tc.path, Size: int64(len(tc.data)), Encoding: "base64", Content: base64.StdEncoding.EncodeToString(tc.data)}
			c, err := fileContent("exe_1", f)
			if err != nil {
				t.Fatal(err)
			}
			switch c := c.(type) {
			case *mcp.ImageContent:
				if tc.wantImage == "" || c.MIMEType != tc.wantImage || !bytes.Equal(c.Data, tc.data) {
					t.Errorf("image %q, want %q", c.MIMEType, tc.wantImage)
				}
			case *mcp.EmbeddedResource:
				r := c.Resource
				if tc.wantImage != "" || r.URI != tc.wantURI {
					t.Errorf("resource %q, want image %q / URI %q", r.URI, tc.wantImage, tc.wantURI)
				}
				if tc.wantText && (r.Text != string(tc.data) || r.Blob != nil || !strings.HasPrefix(r.MIMEType, "text/")) {
					t.Errorf("resource %+v, want text", r)
				}
				if !tc.wantText && (r.Text != "" || !bytes.Equal(r.Blob, tc.data)) {
					t.Errorf("resource %+v, want a blob", r)
				}
			default:
				t.Fatalf("content %T", c)
			}
		})
	}
	if _, err := fileContent("exe_1", returnedFile{Path: "x", Encoding: "base64", Content: "%%%"}); err == nil {
		t.Error("bad base64 from the API accepted")
	}
}

func TestFilesLine(t *testing.T) {
	for _, tc := range []struct {
		files     []returnedFile
		truncated bool
		want      string
	}{
		{nil, false, ""},
		{[]returnedFile{{Path: "a.png", Size: 10}}, false, "files: a.png (10 bytes)\n"},
		{nil, true, "files: (none); files_truncated: true (the plan's caps on count or size left some matching files out)\n"},
	} {
		if got := filesLine(tc.files, tc.truncated); got != tc.want {
			t.Errorf("filesLine(%v, %v) = %q, want %q", tc.files, tc.truncated, got, tc.want)
		}
	}
}

func TestRunCodeFileArguments(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     map[string]any
		wantText string
	}{
		{"unknown file field", map[string]any{"language": "python", "code": "1", "files": []any{map[string]any{"path": "a", "content": "x", "mode": 7}}}, `unknown field "mode"`},
		{"missing path", map[string]any{"language": "python", "code": "1", "files": []any{map[string]any{"content": "x"}}}, "files[0].path is required"},
		{"bad encoding", map[string]any{"language": "python", "code": "1", "files": []any{map[string]any{"path": "a", "content": "x"}, map[string]any{"path": "b", "content": "x", "encoding": "hex"}}}, `files[1].encoding must be utf8 or base64, not "hex"`},
		{"env not strings", map[string]any{"language": "python", "code": "1", "env": map[string]any{"N": 3}}, "invalid arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := &fakeRun{}
			cs := backendServer(t, run)
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: tc.args})
			if err != nil {
				t.Fatal(err)
			}
			if text := res.Content[0].(*mcp.TextContent).Text; !res.IsError || !strings.Contains(text, tc.wantText) {
				t.Errorf("IsError %v, text %q; want a tool error with %q", res.IsError, text, tc.wantText)
			}
			if len(run.reqs) != 0 {
				t.Errorf("refused arguments reached the service: %+v", run.reqs)
			}
		})
	}
}

// TestClientBackendForwardsNewFields: over stdio, files, env, args and
// return_files reach the API through the Go SDK (a base64 file with its
// bytes intact), and a file that is not valid base64 is refused before
// any call.
func TestClientBackendForwardsNewFields(t *testing.T) {
	f, srv := newFakeAPI(t)
	cs := connect(t, stdioServer(t, srv.URL, "kubo_sk_alice", testLanguages))
	for _, tc := range []struct {
		extra map[string]any
		key   string
		want  any
	}{
		{map[string]any{"files": []any{map[string]any{"path": "a.txt", "content": "x"}}}, "files",
			[]any{map[string]any{"path": "a.txt", "content": "x", "encoding": "utf8"}}},
		{map[string]any{"files": []any{map[string]any{"path": "b.bin", "content": "AAE=", "encoding": "base64"}}}, "files",
			[]any{map[string]any{"path": "b.bin", "content": "AAE=", "encoding": "base64"}}},
		{map[string]any{"env": map[string]any{"A": "1"}}, "env", map[string]any{"A": "1"}},
		{map[string]any{"args": []any{"x"}}, "args", []any{"x"}},
		{map[string]any{"return_files": []any{"*.png"}}, "return_files", []any{"*.png"}},
	} {
		args := map[string]any{"language": "python", "code": "print(6*7)"}
		maps.Copy(args, tc.extra)
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("%v: %q", tc.extra, res.Content[0].(*mcp.TextContent).Text)
		}
		got := f.runs[len(f.runs)-1][tc.key]
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%v: the API got (-want +got):\n%s", tc.extra, diff)
		}
	}
	calls := len(f.runs)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{
		"language": "python", "code": "print(1)", "files": []any{map[string]any{"path": "a", "content": "!!", "encoding": "base64"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; !res.IsError || !strings.Contains(text, "files[0].content is not valid base64") {
		t.Errorf("bad base64: IsError %v %q", res.IsError, text)
	}
	if len(f.runs) != calls {
		t.Errorf("the API was called for a refused file")
	}
}
