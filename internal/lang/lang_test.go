package lang

import (
	"slices"
	"strings"
	"testing"
)

func TestTableIsConsistent(t *testing.T) {
	names := map[string]string{} // every name and alias -> its language
	for _, d := range All {
		if d.Name == "" || d.Label == "" || d.File == "" || d.Interpreter == "" || d.Path == "" || d.Eval == "" || d.Hello == "" {
			t.Errorf("%+v: every field but Runtime and Aliases is required", d)
		}
		for _, n := range append([]string{d.Name}, d.Aliases...) {
			if n != strings.ToLower(n) {
				t.Errorf("%s: name %q is not lower case (lookups are)", d.Name, n)
			}
			if other, dup := names[n]; dup {
				t.Errorf("name %q is both %s and %s", n, other, d.Name)
			}
			names[n] = d.Name
		}
		if !slices.ContainsFunc(d.Exts, func(e string) bool { return strings.HasSuffix(d.File, e) }) {
			t.Errorf("%s: code file %q has none of its extensions %v", d.Name, d.File, d.Exts)
		}
	}
}

func TestLookups(t *testing.T) {
	tests := []struct {
		ext, want string
		ok        bool
	}{
		{".py", "python", true}, {".mjs", "javascript", true}, {".bash", "bash", true}, {".rb", "", false}, {"", "", false},
	}
	for _, tt := range tests {
		if got, ok := ByExt(tt.ext); got != tt.want || ok != tt.ok {
			t.Errorf("ByExt(%q) = %q, %v; want %q, %v", tt.ext, got, ok, tt.want, tt.ok)
		}
	}
	if _, ok := Get("py"); ok {
		t.Error(`Get("py") found a language: Get takes canonical names only`)
	}
	if got := Aliases("javascript"); !slices.Equal(got, []string{"js", "node", "nodejs"}) {
		t.Errorf("Aliases(javascript) = %v", got)
	}
	got := Aliases("javascript")
	got[0] = "changed"
	if All[1].Aliases[0] != "js" {
		t.Error("Aliases returned the table's own slice")
	}
	if got := Names(); !slices.Equal(got, []string{"python", "javascript", "bash"}) {
		t.Errorf("Names() = %v", got)
	}
	if d, _ := Get("bash"); !slices.Equal(d.EvalArgv("", d.Hello), []string{"/bin/bash", "-c", "echo 42"}) {
		t.Errorf("EvalArgv = %v", d.EvalArgv("", d.Hello))
	}
}
