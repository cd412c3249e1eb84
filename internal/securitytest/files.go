package securitytest

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// fileCases prove the working directory: files in, env and args, files
// out byte for byte, live output, and that collecting returned files
// never reads anything of the host's however the program lays its
// working directory out (symlinks to host paths, FIFOs, huge sparse
// files).
func fileCases(t *testing.T, e *env) []Case {
	// A file only the host has: a symlink the program makes to it must
	// never bring it back.
	hostDir := t.TempDir()
	secret := "host-only-" + randHex(12)
	hostFile := filepath.Join(hostDir, "secret.txt")
	if err := os.WriteFile(hostFile, []byte(secret), 0o644); err != nil {
		t.Fatalf("securitytest: %v", err)
	}
	binary := make([]byte, 3*256)
	for i := range binary {
		binary[i] = byte(i)
	}
	var live liveOutput

	cs := []Case{
		{Name: "files_csv_in_png_out", Lang: "python",
			Files: []engine.File{
				{Path: "data.csv", Content: []byte("x,y\n1,10\n2,20\n3,30\n")},
				{Path: "in/blob.bin", Content: binary},
			},
			ReturnFiles: []string{"*.png", "out/**"},
			Code: `
import csv, os, struct, zlib
rows = list(csv.DictReader(open("data.csv")))
w, h = len(rows), 2
def chunk(kind, data):
    c = struct.pack(">I", len(data)) + kind + data
    return c + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
raw = b"".join(b"\x00" + bytes(int(r["y"]) for r in rows) for _ in range(h))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
open("chart.png", "wb").write(png)
os.makedirs("out/deep", exist_ok=True)
open("out/deep/copy.bin", "wb").write(open("in/blob.bin", "rb").read())
print("cwd", os.getcwd(), "rows", len(rows))
`,
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				wantContains(t, res.Stdout, "cwd "+engine.CodeDir+" rows 3")
				got := files(res)
				if want := []string{"chart.png", "out/deep/copy.bin"}; !slices.Equal(paths(res), want) {
					t.Fatalf("returned %v; want %v", paths(res), want)
				}
				img, err := png.Decode(bytes.NewReader(got["chart.png"]))
				if err != nil {
					t.Fatalf("chart.png does not decode: %v", err)
				}
				if b := img.Bounds(); b.Dx() != 3 || b.Dy() != 2 {
					t.Errorf("chart.png is %dx%d; want 3x2", b.Dx(), b.Dy())
				}
				if !bytes.Equal(got["out/deep/copy.bin"], binary) {
					t.Errorf("binary file changed on the round trip")
				}
				if res.FilesTruncated {
					t.Errorf("files_truncated set for two small files")
				}
			}},
		{Name: "files_sibling_module", Lang: "python",
			Files: []engine.File{{Path: "helper.py", Content: []byte("X = 42\n")}},
			Code:  "import helper\nprint('helper', helper.X)",
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				wantContains(t, res.Stdout, "helper 42")
			}},
		{Name: "files_sibling_module/javascript", Lang: "javascript",
			Files: []engine.File{{Path: "lib/helper.js", Content: []byte("module.exports = 42;\n")}},
			Code:  "console.log('helper', require('./lib/helper.js'))",
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				wantContains(t, res.Stdout, "helper 42")
			}},
		{Name: "files_return_never_reads_the_host", Lang: "python",
			ReturnFiles: []string{"**"},
			// Less than the sparse file's size, which is then left out.
			Limits: engine.Limits{ReturnBytes: 64 << 10},
			Code: strings.NewReplacer("@FILE@", hostFile, "@DIR@", hostDir).Replace(`
import os
os.symlink("@FILE@", "leak")
os.symlink("@DIR@", "dir")
os.makedirs("sub")
os.symlink("../" * 12 + "@FILE@".lstrip("/"), "sub/relative")
os.symlink("/proc/self/root@FILE@", "proc")
os.mkfifo("pipe")
with open("sparse", "wb") as f:
    try:
        f.truncate(1 << 40)
    except OSError as e:
        print("1 TiB refused", e.errno)  # RLIMIT_FSIZE
    f.truncate((1 << 20) - 1)
open("ok.txt", "w").write("fine")
print("laid out")
`),
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				for _, f := range res.Files {
					if bytes.Contains(f.Content, []byte(secret)) {
						t.Errorf("ATTACK SUCCEEDED: %s returned the host's file", f.Path)
					}
				}
				if want := []string{"main.py", "ok.txt"}; !slices.Equal(paths(res), want) {
					t.Errorf("returned %v; want only the regular files %v", paths(res), want)
				}
				if !res.FilesTruncated {
					t.Errorf("a sparse file over the cap was left out, but files_truncated is false")
				}
			}},
		{Name: "files_return_caps", Lang: "bash", ReturnFiles: []string{"*.txt"},
			Code: "for i in $(seq 10 34); do echo $i > f$i.txt; done; echo made",
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				if len(res.Files) != engine.DefaultReturnFiles || !res.FilesTruncated {
					t.Errorf("returned %d files, truncated=%v; want %d and true", len(res.Files), res.FilesTruncated, engine.DefaultReturnFiles)
				}
			}},
		{Name: "live_output", Lang: "python", Output: live.record,
			Code: "import time\nprint('marker', flush=True)\ntime.sleep(1.5)\nprint('end', flush=True)",
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				first, all := live.result()
				if !strings.Contains(first, "marker") || strings.Contains(first, "end") {
					t.Errorf("first live chunk %q; want the marker alone, before the program ended", first)
				}
				if all != res.Stdout {
					t.Errorf("live output %q differs from the result's stdout %q", all, res.Stdout)
				}
			}},
	}
	env := map[string]string{"GREETING": "héllo wörld", "EMPTY": ""}
	args := []string{"a b", "", "c'd"}
	for _, c := range []struct{ lang, code string }{
		{"python", "import os, sys\nprint(repr(sys.argv[1:]), repr(os.environ['GREETING']), repr(os.environ['EMPTY']), os.environ['HOME'])"},
		{"javascript", "console.log(JSON.stringify(process.argv.slice(2)), JSON.stringify(process.env.GREETING), JSON.stringify(process.env.EMPTY), process.env.HOME)"},
		{"bash", `printf '[%s]' "$@"; echo " $# [$GREETING] [$EMPTY] $HOME"`},
	} {
		want := map[string]string{
			"python":     `['a b', '', "c'd"] 'héllo wörld' '' /tmp`,
			"javascript": `["a b","","c'd"] "héllo wörld" "" /tmp`,
			"bash":       `[a b][][c'd] 3 [héllo wörld] [] /tmp`,
		}[c.lang]
		cs = append(cs, Case{Name: "env_and_args/" + c.lang, Lang: c.lang, Env: env, Args: args, Code: c.code,
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				wantContains(t, res.Stdout, want)
			}})
	}
	return cs
}

func paths(res engine.Result) []string {
	var out []string
	for _, f := range res.Files {
		out = append(out, f.Path)
	}
	return out
}

func files(res engine.Result) map[string][]byte {
	out := map[string][]byte{}
	for _, f := range res.Files {
		out[f.Path] = f.Content
	}
	return out
}

// liveOutput records what a Spec's Output sink got.
type liveOutput struct {
	mu     sync.Mutex
	chunks []string
}

func (l *liveOutput) record(s engine.Stream, p []byte) {
	if s != engine.Stdout {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.chunks = append(l.chunks, string(p))
}

func (l *liveOutput) result() (first, all string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.chunks) > 0 {
		first = l.chunks[0]
	}
	return first, strings.Join(l.chunks, "")
}
