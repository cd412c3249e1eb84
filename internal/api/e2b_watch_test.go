package api

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

func TestE2BDiff(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	file := func(size int64, at time.Time, mode string) sandboxes.FileInfo {
		return sandboxes.FileInfo{Type: "file", Size: size, ModTime: at, Mode: mode}
	}
	for _, tc := range []struct {
		name      string
		prev, cur map[string]sandboxes.FileInfo
		want      []string
	}{
		{"nothing changed", map[string]sandboxes.FileInfo{"a": file(1, t0, "0644")}, map[string]sandboxes.FileInfo{"a": file(1, t0, "0644")}, nil},
		{"created", nil, map[string]sandboxes.FileInfo{"b": file(1, t0, "0644"), "a": file(1, t0, "0644")},
			[]string{"EVENT_TYPE_CREATE a", "EVENT_TYPE_CREATE b"}},
		{"written: size", map[string]sandboxes.FileInfo{"a": file(1, t0, "0644")}, map[string]sandboxes.FileInfo{"a": file(2, t0, "0644")}, []string{"EVENT_TYPE_WRITE a"}},
		{"written: time", map[string]sandboxes.FileInfo{"a": file(1, t0, "0644")}, map[string]sandboxes.FileInfo{"a": file(1, t0.Add(time.Second), "0644")}, []string{"EVENT_TYPE_WRITE a"}},
		{"chmod", map[string]sandboxes.FileInfo{"a": file(1, t0, "0644")}, map[string]sandboxes.FileInfo{"a": file(1, t0, "0600")}, []string{"EVENT_TYPE_CHMOD a"}},
		{"removed", map[string]sandboxes.FileInfo{"d/x": file(1, t0, "0644")}, nil, []string{"EVENT_TYPE_REMOVE d/x"}},
		{"renamed", map[string]sandboxes.FileInfo{"old": file(1, t0, "0644")}, map[string]sandboxes.FileInfo{"new": file(1, t0, "0644")},
			[]string{"EVENT_TYPE_CREATE new", "EVENT_TYPE_REMOVE old"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, ev := range e2bDiff(tc.prev, tc.cur, true) {
				got = append(got, ev.GetType().String()+" "+ev.GetName())
				if (ev.GetEntry() == nil) != (ev.GetType().String() == "EVENT_TYPE_REMOVE") {
					t.Errorf("%s %s: entry %v", ev.GetType(), ev.GetName(), ev.GetEntry())
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}
