package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
)

// checkErr fails t unless err is what want asks for (none when want is
// empty, one containing want otherwise), and says whether an error ended
// the case.
func checkErr(t *testing.T, err error, want string) bool {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatal(err)
		}
		return false
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v; want one containing %q", err, want)
	}
	return true
}

func TestParsePools(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "off,warm", want: []string{"api, pool off", "api, warm pool"}},
		{in: "warm", want: []string{"api, warm pool"}},
		{in: " warm , off ", want: []string{"api, warm pool", "api, pool off"}},
		{in: "cold", wantErr: `"cold" is not off or warm`},
		{in: "", wantErr: "empty"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parsePools(tc.in)
			if checkErr(t, err, tc.wantErr) {
				return
			}
			var names []string
			for _, p := range got {
				names = append(names, p.name)
				if len(p.env) == 0 {
					t.Errorf("%s: no environment for its server", p.name)
				}
			}
			if diff := cmp.Diff(tc.want, names); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestFirstOCIRuntime(t *testing.T) {
	for _, tc := range []struct {
		pairs []string
		want  string
	}{
		{[]string{"oci/crun", "oci/runc"}, "crun"},
		{[]string{"docker/runc", "oci/bwrap"}, "bwrap"},
		{[]string{"docker/runc", "oci"}, "crun"},
		{nil, "crun"},
	} {
		if got := firstOCIRuntime(tc.pairs); got != tc.want {
			t.Errorf("firstOCIRuntime(%v) = %q; want %q", tc.pairs, got, tc.want)
		}
	}
}

func TestServerIdle(t *testing.T) {
	const head = "# TYPE vertal_sandboxes_in_use gauge\n"
	pool := func(lang string, ready, starting, inUse, target int) string {
		return fmt.Sprintf("vertal_pool_ready{language=%q} %d\nvertal_pool_starting{language=%q} %d\nvertal_pool_in_use{language=%q} %d\nvertal_pool_target{language=%q} %d\n",
			lang, ready, lang, starting, lang, inUse, lang, target)
	}
	types := "# TYPE vertal_pool_ready gauge\n# TYPE vertal_pool_starting gauge\n# TYPE vertal_pool_in_use gauge\n# TYPE vertal_pool_target gauge\n"
	for _, tc := range []struct {
		name    string
		text    string
		want    bool
		wantErr string
	}{
		{name: "pool off, nothing running", text: head + "vertal_sandboxes_in_use 0\n", want: true},
		{name: "pool off, a sandbox in use", text: head + "vertal_sandboxes_in_use 1\n"},
		{name: "pools full", text: head + "vertal_sandboxes_in_use 0\n" + types + pool("bash", 2, 0, 0, 2) + pool("python", 3, 0, 0, 2), want: true},
		{name: "one pool refilling", text: head + "vertal_sandboxes_in_use 0\n" + types + pool("bash", 2, 0, 0, 2) + pool("python", 1, 1, 0, 2)},
		// The refill was asked for but has not begun.
		{name: "one pool short", text: head + "vertal_sandboxes_in_use 0\n" + types + pool("bash", 1, 0, 0, 2) + pool("python", 2, 0, 0, 2)},
		{name: "warm sandbox in use", text: head + "vertal_sandboxes_in_use 0\n" + types + pool("bash", 2, 0, 1, 2)},
		{name: "not our server", text: "# TYPE go_goroutines gauge\ngo_goroutines 7\n", wantErr: "no vertal_sandboxes_in_use"},
		{name: "garbage", text: "vertal_sandboxes_in_use{ 1\n", wantErr: "reading /metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := serverIdle(strings.NewReader(tc.text))
			if checkErr(t, err, tc.wantErr) {
				return
			}
			if got != tc.want {
				t.Errorf("idle = %v; want %v", got, tc.want)
			}
		})
	}
}

// The sandbox bench's plan is a config file the server accepts, with the
// fill's bound as the tenant's cap and no small limit in the way.
func TestSandboxPlan(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(sandboxPlan(150, 3600)), 0o600); err != nil {
		t.Fatal(err)
	}
	c := config.Default()
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	p, ok := c.Plans["bench"]
	if !ok {
		t.Fatalf("no bench plan in %v", c.Plans)
	}
	if p.SandboxLimit() != 150 || p.SandboxLifetime() != time.Hour || p.RequestsPerMinute < 1e6 || p.ExecutionsPerDay < 1e6 {
		t.Errorf("plan %+v", p)
	}
}
