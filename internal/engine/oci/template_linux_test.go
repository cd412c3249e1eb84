package oci

import (
	"testing"
)

func TestTemplateHoles(t *testing.T) {
	user := userJSON(uidPlaceholder)
	for _, tc := range []struct {
		name, in string
		want     string // render("exe_1", 2000000001); "" = error expected
	}{
		{"id_then_user", `{"a":"` + idPlaceholder + `",` + user + `}`, `{"a":"exe_1","user":{"uid":2000000001,"gid":2000000001}}`},
		{"user_then_id", `{` + user + `,"a":"/x/` + idPlaceholder + `/y"}`, `{"user":{"uid":2000000001,"gid":2000000001},"a":"/x/exe_1/y"}`},
		{"no_user", `{"a":"` + idPlaceholder + `"}`, ""},
		{"id_twice", `{"a":"` + idPlaceholder + idPlaceholder + `",` + user + `}`, ""},
		{"user_twice", `{` + user + `,` + user + `,"a":"` + idPlaceholder + `"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpl, err := newTemplate([]byte(tc.in))
			if tc.want == "" {
				if err == nil {
					t.Fatalf("newTemplate accepted %s", tc.in)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := string(tpl.render("exe_1", 2_000_000_001)); got != tc.want {
				t.Errorf("render = %s, want %s", got, tc.want)
			}
		})
	}
}
