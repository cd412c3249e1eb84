package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

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
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v; want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
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
