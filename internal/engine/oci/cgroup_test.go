//go:build linux

package oci

import (
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPlaceV2(t *testing.T) {
	// A cgroup namespace's root is a non-root cgroup: it has cgroup.type.
	hostRoot := fstest.MapFS{"cgroup.controllers": {Data: []byte("cpu memory pids")}}
	nsRoot := fstest.MapFS{"cgroup.controllers": {}, "cgroup.type": {Data: []byte("domain\n")}}
	const unit = "/system.slice/vertal.service"
	delegatedUnit := func(cg string) bool { return cg == unit }
	noneDelegated := func(string) bool { return false }

	for _, tc := range []struct {
		name      string
		self      string
		mount     fstest.MapFS
		delegated func(string) bool
		parent    string
		want      v2Placement
		wantErr   bool
	}{
		{
			name: "no systemd, root cgroup", self: "0::/\n", mount: hostRoot, delegated: noneDelegated, parent: "vertal",
			want: v2Placement{Owned: "/", Base: "/vertal"},
		},
		{
			name: "systemd unit with Delegate=yes", self: "0::" + unit + "\n", mount: hostRoot, delegated: delegatedUnit, parent: "vertal",
			want: v2Placement{Delegated: true, Owned: unit, Supervisor: unit + "/supervisor", Base: unit + "/vertal"},
		},
		{
			name: "second driver, already in the supervisor leaf", self: "0::" + unit + "/supervisor\n", mount: hostRoot, delegated: delegatedUnit, parent: "vertal-test",
			want: v2Placement{Delegated: true, Owned: unit, Supervisor: unit + "/supervisor", Base: unit + "/vertal-test"},
		},
		{
			name: "systemd unit without Delegate", self: "0::/system.slice/vertal.service\n", mount: hostRoot, delegated: noneDelegated, parent: "vertal",
			want: v2Placement{Owned: "/", Base: "/vertal"},
		},
		{
			name: "shell session scope", self: "0::/user.slice/user-0.slice/session-3.scope\n", mount: hostRoot, delegated: noneDelegated, parent: "vertal",
			want: v2Placement{Owned: "/", Base: "/vertal"},
		},
		{
			// A "supervisor" leaf whose parent is not delegated is not ours.
			name: "foreign supervisor leaf", self: "0::/system.slice/other.service/supervisor\n", mount: hostRoot, delegated: delegatedUnit, parent: "vertal",
			want: v2Placement{Owned: "/", Base: "/vertal"},
		},
		{
			name: "container at its cgroup namespace's root", self: "0::/\n", mount: nsRoot, delegated: noneDelegated, parent: "vertal",
			want: v2Placement{Delegated: true, Owned: "/", Supervisor: "/supervisor", Base: "/vertal"},
		},
		{
			name: "container, second driver", self: "0::/supervisor\n", mount: nsRoot, delegated: noneDelegated, parent: "vertal",
			want: v2Placement{Delegated: true, Owned: "/", Supervisor: "/supervisor", Base: "/vertal"},
		},
		{
			name: "hybrid-style file with v1 lines too", self: "12:pids:/x\n1:name=systemd:" + unit + "\n0::" + unit + "\n", mount: hostRoot, delegated: delegatedUnit, parent: "vertal",
			want: v2Placement{Delegated: true, Owned: unit, Supervisor: unit + "/supervisor", Base: unit + "/vertal"},
		},
		{name: "no v2 line", self: "4:memory:/x\n", mount: hostRoot, delegated: noneDelegated, parent: "vertal", wantErr: true},
		{name: "garbage", self: "garbage\n", mount: hostRoot, delegated: noneDelegated, parent: "vertal", wantErr: true},
		{name: "parent is a path", self: "0::/\n", mount: hostRoot, delegated: noneDelegated, parent: "a/b", wantErr: true},
		{name: "parent is the supervisor leaf", self: "0::/\n", mount: hostRoot, delegated: noneDelegated, parent: "supervisor", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := placeV2([]byte(tc.self), tc.mount, tc.delegated, tc.parent)
			if (err != nil) != tc.wantErr {
				t.Fatalf("placeV2 error = %v; want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("placeV2 (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRuntimePath(t *testing.T) {
	for _, tc := range []struct {
		base, want string
	}{
		{"vertal", "/vertal/exe_1/sandbox"},  // v1: each hierarchy's root
		{"/vertal", "/vertal/exe_1/sandbox"}, // v2, root of the hierarchy
		{"/system.slice/vertal.service/vertal", "/system.slice/vertal.service/vertal/exe_1/sandbox"}, // v2, delegated
	} {
		if got := (&cgroups{base: tc.base}).runtimePath("exe_1"); got != tc.want {
			t.Errorf("runtimePath with base %q = %q; want %q", tc.base, got, tc.want)
		}
	}
}

// TestPeakPoll: without memory.peak (kernels before 5.19) the peak is the
// highest memory.current seen, and a reset starts over from now.
func TestPeakPoll(t *testing.T) {
	file := filepath.Join(t.TempDir(), "memory.current")
	set := func(v string) {
		t.Helper()
		if err := os.WriteFile(file+".tmp", []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	set("100")
	p := startPeakPoll(file, time.Millisecond)
	defer p.stop()
	for _, step := range []struct {
		set   string
		reset bool
		want  int64
	}{
		{set: "500", want: 500},
		{set: "200", want: 500}, // the peak stays
		{set: "300", reset: true, want: 300},
		{set: "250", want: 300},
	} {
		set(step.set)
		if step.reset {
			p.reset()
		}
		if got := p.max(); got != step.want {
			t.Errorf("after memory.current=%s (reset %v): peak %d; want %d", step.set, step.reset, got, step.want)
		}
	}
	p.stop()
	p.stop() // idempotent, as close may run twice
}
