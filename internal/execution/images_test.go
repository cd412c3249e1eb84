package execution

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
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
		Engine: engine.New(newFakeDriver(), engine.Options{MaxConcurrent: 1}),
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
