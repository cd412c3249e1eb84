package migrations

import (
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

func TestLoad(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	for _, tc := range []struct {
		name    string
		fsys    fstest.MapFS
		want    []Migration
		wantErr bool
	}{
		{
			name: "ordered by version, not by name",
			fsys: fstest.MapFS{"10_c.sql": file("C"), "2_b.sql": file("B"), "0001_a.sql": file("A"), "README": file("x")},
			want: []Migration{{1, "0001_a.sql", "A"}, {2, "2_b.sql", "B"}, {10, "10_c.sql", "C"}},
		},
		{name: "duplicate version", fsys: fstest.MapFS{"0001_a.sql": file(""), "1_b.sql": file("")}, wantErr: true},
		{name: "no version", fsys: fstest.MapFS{"init.sql": file("")}, wantErr: true},
		{name: "version zero", fsys: fstest.MapFS{"0000_a.sql": file("")}, wantErr: true},
		{name: "non-numeric version", fsys: fstest.MapFS{"v1_a.sql": file("")}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Load(tc.fsys)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Load error = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Load (-want +got):\n%s", diff)
			}
		})
	}
}
