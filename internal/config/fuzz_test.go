package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzLoadFile: any config file either loads or is refused with an error
// that names the file; Validate never panics on what loaded; and a loaded
// config written back as a file loads to the same config. Seeds are the
// f.Add calls and testdata/fuzz/FuzzLoadFile/.
func FuzzLoadFile(f *testing.F) {
	for _, seed := range []string{
		`{}`,
		`{"port":8081,"queue_timeout":"45s","idle_timeout":12.5,"plans":{"pro":{"memory_mb":1024},"team":{"max_timeout_s":5}}}`,
		`{"languages":{"python":{"version":"3.12","command":["python3","-u"]}},"images":{"datasci":{"dir":"/srv/ds"}}}`,
		`{"webhook_allow_cidrs":["10.0.0.0/8"],"webhook_retry_for":"1h","max_code_bytes":1}`,
		`{"Port":1}`, `{"port":"x"}`, `{"plans":{"pro":{"memroy_mb":1}}}`, `{"queue_timeout":"forever"}`, `{"queue_timeout":1e300}`,
		`{"plans":null,"languages":null,"images":null}`, `[]`, ``, `{"port":1}{}`, `{"dev":true,"dev":false}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "vertal.json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c := Default()
		if err := c.LoadFile(path); err != nil {
			if !strings.Contains(err.Error(), "config file "+path) {
				t.Fatalf("%q: error %q does not name the file", data, err)
			}
			return
		}
		_ = c.Validate()
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("%q loaded to a config that does not encode: %v", data, err)
		}
		if err := os.WriteFile(path, again, 0o600); err != nil {
			t.Fatal(err)
		}
		c2 := Default()
		if err := c2.LoadFile(path); err != nil {
			t.Fatalf("%q loaded, but its encoding %s does not: %v", data, again, err)
		}
		if diff := cmp.Diff(c, c2, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%q through %s (-first +second):\n%s", data, again, diff)
		}
	})
}

// FuzzImageName: an image name the config accepts is one directory name:
// its default directory sits next to the default image's and is named
// exactly so, never the images' parent or anything beyond it.
func FuzzImageName(f *testing.F) {
	for _, seed := range []string{"datasci", "default", "..", "a/b", "A", "-a", "a_b-1", strings.Repeat("a", 40), "a\x00", ".", "a.b", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		c := Default()
		c.ImageDir = "/var/lib/vertal/images/default"
		c.Images = map[string]ImageConfig{name: {}}
		bad := false
		validateImages(c, func(string, ...any) { bad = true })
		if bad || name == DefaultImage {
			return
		}
		if dir := c.ImageDirOf(name); filepath.Dir(dir) != "/var/lib/vertal/images" || filepath.Base(dir) != name || len(name) > 39 {
			t.Fatalf("image %q accepted, its directory is %q", name, dir)
		}
	})
}
