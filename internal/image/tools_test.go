package image

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestToolsInstalled: debootstrap's --include names every tool's package,
// for every build (whatever else it asks for), so scripts find bc, jq,
// file, procps's commands and curl.
func TestToolsInstalled(t *testing.T) {
	for _, o := range []Options{{}, {Apt: []string{"python3-numpy"}, Wheelhouse: "w"}} {
		args := debootstrapArgs(o, "/target")
		var include []string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--include="); ok {
				include = strings.Split(v, ",")
			}
		}
		for _, p := range []string{"bc", "jq", "file", "procps", "curl", "python3", "libstdc++6"} {
			if !slices.Contains(include, p) {
				t.Errorf("debootstrap %v: --include lacks %s", args, p)
			}
		}
	}
}

func TestManifestTools(t *testing.T) {
	for _, tc := range []struct {
		name string
		dpkg map[string]string
		want []Tool
	}{
		{"before the tools were added", map[string]string{"bash": "5.2.15-2+b13"}, []Tool{}},
		{"before curl was added", map[string]string{"bc": "1", "jq": "2", "file": "3", "procps": "4"}, []Tool{
			{Package: "bc", Version: "1", Commands: []string{"bc"}},
			{Package: "jq", Version: "2", Commands: []string{"jq"}},
			{Package: "file", Version: "3", Commands: []string{"file"}},
			{Package: "procps", Version: "4", Commands: []string{"ps", "free", "top", "pgrep", "pkill", "watch"}},
		}},
		{"all", map[string]string{"bc": "1", "jq": "2", "file": "3", "procps": "4", "curl": "5"}, []Tool{
			{Package: "bc", Version: "1", Commands: []string{"bc"}},
			{Package: "jq", Version: "2", Commands: []string{"jq"}},
			{Package: "file", Version: "3", Commands: []string{"file"}},
			{Package: "procps", Version: "4", Commands: []string{"ps", "free", "top", "pgrep", "pkill", "watch"}},
			{Package: "curl", Version: "5", Commands: []string{"curl"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Manifest{Packages: Packages{Dpkg: tc.dpkg}}.Tools()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Tools (-want +got):\n%s", diff)
			}
		})
	}
}
