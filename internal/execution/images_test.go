package execution

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
)

// TestImageSelection: a request runs on the image it names (the
// language's Image is that image's), the default when it names none; an
// unknown image is a bad request and one the plan leaves out forbidden,
// both naming the images the caller may use. The default image does not
// change a request's hash.
func TestImageSelection(t *testing.T) {
	dir := t.TempDir()
	manifest := `{"name":"datasci","version":"v1","built_at":"2026-01-02T03:04:05Z","recipe":{"apt":["python3-pandas"]},
		"languages":{"python":"3.11.2"},"packages":{"dpkg":{"python3-pandas":"1.5.3"},"npm":{},"pip":{}}}`
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	plans := config.DefaultPlans()
	free := plans["free"]
	free.Images = []string{"datasci"}
	plans["free"] = free
	plans["locked"] = config.Plan{MaxTimeoutS: 10, MemoryMB: 256, MaxConcurrent: 1, Images: []string{config.DefaultImage}}
	s, err := New(Options{
		Store:  storefake.New(),
		Engine: enginetest.New(t, newFakeDriver(), enginetest.Options(1)),
		Images: []config.Image{
			{Name: "default", Languages: []engine.Language{{Name: "python", File: "main.py", Image: "/img/default/rootfs"}}},
			{Name: "datasci", Dir: dir, Languages: []engine.Language{{Name: "python", File: "main.py", Image: "/img/datasci/rootfs"}}},
			{Name: "other", Languages: []engine.Language{{Name: "python", File: "main.py", Image: "/img/other/rootfs"}}},
		},
		Plans: plans,
	})
	if err != nil {
		t.Fatal(err)
	}
	freeC := Caller{Key: store.Key{Tenant: "t", Plan: "free"}, Plan: plans["free"]}
	locked := Caller{Key: store.Key{Tenant: "t", Plan: "locked"}, Plan: plans["locked"]}
	for _, tc := range []struct {
		name      string
		c         Caller
		image     *string
		wantImage string
		wantKind  Kind
		wantMsg   string
	}{
		{"default", freeC, nil, "/img/default/rootfs", 0, ""},
		{"named", freeC, ptr("datasci"), "/img/datasci/rootfs", 0, ""},
		{"explicit default", locked, ptr("default"), "/img/default/rootfs", 0, ""},
		{"unknown", freeC, ptr("nope"), "", KindInvalidRequest, `image "nope" does not exist; use one of default, datasci`},
		{"not on plan", freeC, ptr("other"), "", KindForbidden, `image "other" is not available on plan free; use one of default, datasci`},
		{"locked plan", locked, ptr("datasci"), "", KindForbidden, "use one of default (see"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput()
			in.Image = tc.image
			p, err := s.prepare(tc.c, in)
			var e *Error
			switch {
			case tc.wantKind == 0 && err != nil:
				t.Fatalf("prepare: %v", err)
			case tc.wantKind == 0:
				if p.spec.Language.Image != tc.wantImage {
					t.Errorf("runs on %q, want %q", p.spec.Language.Image, tc.wantImage)
				}
			case !errors.As(err, &e) || e.Kind != tc.wantKind || !strings.Contains(e.Msg, tc.wantMsg):
				t.Errorf("prepare = %v; want kind %d with %q", err, tc.wantKind, tc.wantMsg)
			}
		})
	}
	h1, _ := s.RequestHash(freeC, baseInput())
	in := baseInput()
	in.Image = ptr("default")
	h2, _ := s.RequestHash(freeC, in)
	in.Image = ptr("datasci")
	h3, _ := s.RequestHash(freeC, in)
	if h1 != h2 || h1 == h3 {
		t.Errorf("hashes: none %s, default %s, datasci %s; the default image must not change it, another must", h1, h2, h3)
	}

	got := s.Images(freeC)
	var names []string
	for _, i := range got {
		names = append(names, i.Name)
	}
	if diff := cmp.Diff([]string{"default", "datasci"}, names); diff != "" {
		t.Errorf("listed images (-want +got):\n%s", diff)
	}
	ds := got[1]
	if ds.Version == nil || *ds.Version != "v1" || len(ds.Packages) != 1 || ds.Packages[0].Version != "1.5.3" ||
		ds.Languages[0].Version == nil || *ds.Languages[0].Version != "3.11.2" {
		t.Errorf("datasci listed as %+v", ds)
	}
}

// writeBuild lays out a build of an image in dir as vertal image build
// does (versions/<id>/image.json, current -> versions/<id>, image.json ->
// current/image.json) and switches the image to it with one rename.
func writeBuild(t *testing.T, dir, id string) {
	t.Helper()
	vdir := filepath.Join(dir, "versions", id)
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := `{"name":"datasci","version":"` + id + `","built_at":"2026-01-02T03:04:05Z","languages":{},"packages":{}}`
	if err := os.WriteFile(filepath.Join(vdir, "image.json"), []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, ".current.new")
	if err := os.Symlink(filepath.Join("versions", id), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "current")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("current", "image.json"), filepath.Join(dir, "image.json")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
}

// TestExecutionRecordsImage: every entry point records the image a
// request resolved (the default's name when it named none) and that
// image's build id when it was accepted ("" for an image not built by
// vertal image build), in what it answers and in the store, before and
// after the run. After an update, new requests record the new build, and
// a queued async execution the build it ran on.
func TestExecutionRecordsImage(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeBuild(t, dir, "20260101T000000Z-1")
	q := &fakeQueue{}
	st := storefake.New()
	d := newFakeDriver()
	d.started = make(chan string, 64) // more runs than the usual buffer, none waited for
	s, err := New(Options{
		Store:  st,
		Engine: enginetest.New(t, d, engine.Options{MaxConcurrent: 4, MaxQueue: 16, QueueTimeout: time.Minute}),
		Images: []config.Image{
			{Name: "default", Languages: []engine.Language{{Name: "python", File: "main.py", Image: "/img/default/rootfs"}}},
			{Name: "datasci", Dir: dir, Languages: []engine.Language{{Name: "python", File: "main.py", Image: "/img/datasci/rootfs"}}},
		},
		Queue:  q,
		NodeID: "node-a",
	})
	if err != nil {
		t.Fatal(err)
	}
	c := caller("acme", 4)
	type image struct{ Name, Version string }
	// run submits in through one entry point and returns the accepted
	// executions, run to their end for the async ones.
	entries := []struct {
		name string
		run  func(t *testing.T, in Input) []store.Execution
	}{
		{"sync", func(t *testing.T, in Input) []store.Execution {
			out, err := s.Run(ctx, c, Request{Input: in})
			if err != nil {
				t.Fatal(err)
			}
			return []store.Execution{out.Execution}
		}},
		{"async", func(t *testing.T, in Input) []store.Execution {
			out, err := s.Submit(ctx, c, Request{Input: in})
			if err != nil {
				t.Fatal(err)
			}
			return []store.Execution{out.Execution}
		}},
		{"batch", func(t *testing.T, in Input) []store.Execution {
			out, err := s.SubmitBatch(ctx, c, Request{}, []Input{in, in}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return out.Executions
		}},
	}
	check := func(t *testing.T, what string, want image, exes []store.Execution) {
		t.Helper()
		for _, e := range exes {
			if diff := cmp.Diff(want, image{e.Image, e.ImageVersion}); diff != "" {
				t.Errorf("%s %s: image (-want +got):\n%s", what, e.ID, diff)
			}
		}
	}
	stored := func(t *testing.T, exes []store.Execution) []store.Execution {
		t.Helper()
		var out []store.Execution
		for _, e := range exes {
			if e.Async {
				if err := s.RunQueued(ctx, "acme", e.ID); err != nil {
					t.Fatal(err)
				}
			}
			got, err := st.Execution(ctx, "acme", e.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !store.Final(got.Status) {
				t.Fatalf("%s is %s, want final", e.ID, got.Status)
			}
			out = append(out, got)
		}
		return out
	}
	for _, entry := range entries {
		for _, tc := range []struct {
			name  string
			image *string
			want  image
		}{
			{"default named by omission", nil, image{"default", ""}},
			{"default named", ptr("default"), image{"default", ""}},
			{"built image", ptr("datasci"), image{"datasci", "20260101T000000Z-1"}},
		} {
			t.Run(entry.name+"/"+tc.name, func(t *testing.T) {
				in := baseInput()
				in.Image = tc.image
				exes := entry.run(t, in)
				check(t, "answered", tc.want, exes)
				check(t, "stored", tc.want, stored(t, exes))
			})
		}
	}

	// An update: an async execution accepted before it records the build it
	// ran on once it ran; requests after it record the new one.
	in := baseInput()
	in.Image = ptr("datasci")
	waiting, err := s.Submit(ctx, c, Request{Input: in})
	if err != nil {
		t.Fatal(err)
	}
	writeBuild(t, dir, "20260102T000000Z-2")
	check(t, "queued across the update", image{"datasci", "20260101T000000Z-1"}, []store.Execution{waiting.Execution})
	check(t, "run after the update", image{"datasci", "20260102T000000Z-2"}, stored(t, []store.Execution{waiting.Execution}))
	for _, entry := range entries {
		exes := entry.run(t, in)
		check(t, entry.name+" after the update", image{"datasci", "20260102T000000Z-2"}, stored(t, exes))
	}
}

// TestBuildIDs: the build id is image.json's version, "" when the image
// has none or it cannot be read; a file replaced in place is read again.
func TestBuildIDs(t *testing.T) {
	b := &buildIDs{byDir: map[string]buildID{}}
	write := func(t *testing.T, dir, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"no directory configured", nil, ""},
		{"no image.json", func(*testing.T, string) {}, ""},
		{"not JSON", func(t *testing.T, dir string) { write(t, dir, "{") }, ""},
		{"flat file", func(t *testing.T, dir string) { write(t, dir, `{"version":"v1"}`) }, "v1"},
		{"versioned layout", func(t *testing.T, dir string) { writeBuild(t, dir, "20260101T000000Z-1") }, "20260101T000000Z-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := ""
			if tc.setup != nil {
				dir = t.TempDir()
				tc.setup(t, dir)
			}
			if got := b.of(dir); got != tc.want {
				t.Errorf("build id %q, want %q", got, tc.want)
			}
		})
	}
	dir := t.TempDir()
	write(t, dir, `{"version":"v1"}`)
	if got := b.of(dir); got != "v1" {
		t.Fatalf("build id %q, want v1", got)
	}
	write(t, dir, `{"version":"v22"}`) // rewritten in place: same file, new size and time
	if got := b.of(dir); got != "v22" {
		t.Errorf("after rewriting image.json: build id %q, want v22", got)
	}
}
