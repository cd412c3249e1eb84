package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// NewSandboxes returns an empty store of sandboxes for one test.
type NewSandboxes func(t *testing.T) store.Sandboxes

// RunSandboxes runs the store.Sandboxes cases, each on a fresh store.
func RunSandboxes(t *testing.T, newStore NewSandboxes) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, s store.Sandboxes)
	}{
		{"RoundTrip", testSandboxRoundTrip},
		{"TenantIsolation", testSandboxTenantIsolation},
		{"Limit", testSandboxLimit},
		{"LimitConcurrent", testSandboxLimitConcurrent},
		{"Update", testSandboxUpdate},
		{"List", testSandboxList},
		{"NodeAndCount", testSandboxNodeAndCount},
		{"Usage", testSandboxUsage},
		{"Purge", testSandboxPurge},
		{"ByID", testSandboxByID},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newStore(t)) })
	}
}

var sbxT0 = time.Date(2025, 3, 14, 12, 0, 0, 123456000, time.UTC)

func newSandbox(tenant, id string, at time.Time) store.Sandbox {
	return store.Sandbox{
		ID: id, Tenant: tenant, KeyID: "key_1", Status: "running", Image: "default", ImageVersion: "v1",
		Limits: []byte(`{"memory_mb":256}`), Metadata: map[string]string{"k": "v"}, Env: map[string]string{"A": "1"},
		OnTimeout: "kill", TimeoutS: 300, Node: "node-a", CreatedAt: at, StartedAt: at, ExpiresAt: at.Add(5 * time.Minute),
	}
}

func testSandboxRoundTrip(t *testing.T, s store.Sandboxes) {
	ctx := t.Context()
	want := newSandbox("acme", "sbx_1", sbxT0)
	if err := s.CreateSandbox(ctx, want, 5); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	got, err := s.Sandbox(ctx, "acme", "sbx_1")
	if err != nil {
		t.Fatalf("Sandbox: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Sandbox (-want +got):\n%s", diff)
	}
	if err := s.CreateSandbox(ctx, want, 5); err == nil {
		t.Error("CreateSandbox of a duplicate id succeeded")
	}
}

func testSandboxTenantIsolation(t *testing.T, s store.Sandboxes) {
	ctx := t.Context()
	sb := newSandbox("acme", "sbx_1", sbxT0)
	if err := s.CreateSandbox(ctx, sb, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sandbox(ctx, "other", "sbx_1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Sandbox of another tenant: %v, want ErrNotFound", err)
	}
	other := sb
	other.Tenant, other.Status = "other", "ended"
	if err := s.UpdateSandbox(ctx, other, "running"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateSandbox of another tenant: %v, want ErrNotFound", err)
	}
	if got, _ := s.Sandbox(ctx, "acme", "sbx_1"); got.Status != "running" {
		t.Errorf("after another tenant's update: status %q", got.Status)
	}
	list, err := s.ListSandboxes(ctx, "other", store.SandboxPage{Limit: 10})
	if err != nil || len(list) != 0 {
		t.Errorf("ListSandboxes of another tenant = %d, %v; want none", len(list), err)
	}
	if r, p, err := s.CountSandboxes(ctx, "other"); r != 0 || p != 0 || err != nil {
		t.Errorf("CountSandboxes of another tenant = %d, %d, %v", r, p, err)
	}
}

func testSandboxLimit(t *testing.T, s store.Sandboxes) {
	ctx := t.Context()
	for i := range 2 {
		if err := s.CreateSandbox(ctx, newSandbox("acme", fmt.Sprintf("sbx_%d", i), sbxT0), 2); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateSandbox(ctx, newSandbox("acme", "sbx_x", sbxT0), 2); !errors.Is(err, store.ErrSandboxLimit) {
		t.Fatalf("third create: %v, want ErrSandboxLimit", err)
	}
	// A paused one still counts; an ended one does not.
	sb, _ := s.Sandbox(ctx, "acme", "sbx_0")
	sb.Status = "paused"
	if err := s.UpdateSandbox(ctx, sb, "running"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, newSandbox("acme", "sbx_x", sbxT0), 2); !errors.Is(err, store.ErrSandboxLimit) {
		t.Fatalf("create with one paused: %v, want ErrSandboxLimit", err)
	}
	sb.Status, sb.Reason, sb.EndedAt = "ended", "killed", sbxT0.Add(time.Minute)
	if err := s.UpdateSandbox(ctx, sb, "paused"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, newSandbox("acme", "sbx_x", sbxT0), 2); err != nil {
		t.Fatalf("create after one ended: %v", err)
	}
	// Another tenant has its own count.
	if err := s.CreateSandbox(ctx, newSandbox("other", "sbx_o", sbxT0), 1); err != nil {
		t.Fatalf("another tenant's create: %v", err)
	}
}

func testSandboxLimitConcurrent(t *testing.T, s store.Sandboxes) {
	const n, max = 16, 3
	errs := Parallel(n, func(i int) error {
		return s.CreateSandbox(t.Context(), newSandbox("acme", fmt.Sprintf("sbx_%02d", i), sbxT0), max)
	})
	ok, limited := CountErrs(t, errs, store.ErrSandboxLimit)
	if ok != max || limited != n-max {
		t.Errorf("%d parallel creates under a cap of %d: %d created, %d refused", n, max, ok, limited)
	}
	if r, _, _ := s.CountSandboxes(t.Context(), "acme"); r != max {
		t.Errorf("CountSandboxes running = %d, want %d", r, max)
	}
}

func testSandboxUpdate(t *testing.T, s store.Sandboxes) {
	ctx := t.Context()
	sb := newSandbox("acme", "sbx_1", sbxT0)
	if err := s.CreateSandbox(ctx, sb, 5); err != nil {
		t.Fatal(err)
	}
	sb.Status, sb.ArchivePath, sb.ArchiveBytes = "paused", "/data/sandboxes/sbx_1/home.tar", 10240
	sb.AliveSeconds, sb.CPUSeconds, sb.TimeoutS = 12.5, 1.25, 600
	sb.ExpiresAt = sbxT0.Add(10 * time.Minute)
	if err := s.UpdateSandbox(ctx, sb, "running"); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	got, err := s.Sandbox(ctx, "acme", "sbx_1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sb, got); diff != "" {
		t.Errorf("after UpdateSandbox (-want +got):\n%s", diff)
	}
	sb.Status = "ended"
	if err := s.UpdateSandbox(ctx, sb, "running"); !errors.Is(err, store.ErrSandboxState) {
		t.Errorf("UpdateSandbox from a status it is not in: %v, want ErrSandboxState", err)
	}
	if err := s.UpdateSandbox(ctx, store.Sandbox{Tenant: "acme", ID: "sbx_none"}, "running"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateSandbox of an unknown id: %v, want ErrNotFound", err)
	}
	// Two updates from the same status: exactly one wins.
	sb.Status = "running"
	errs := Parallel(8, func(i int) error {
		u := sb
		u.Status, u.Reason = "ended", fmt.Sprint(i)
		return s.UpdateSandbox(ctx, u, "paused")
	})
	if ok, lost := CountErrs(t, errs, store.ErrSandboxState); ok != 1 || lost != 7 {
		t.Errorf("parallel updates: %d won, %d lost; want 1, 7", ok, lost)
	}
}

func testSandboxList(t *testing.T, s store.Sandboxes) {
	ctx := t.Context()
	var ids []string
	for i := range 5 {
		id := fmt.Sprintf("sbx_%d", i)
		sb := newSandbox("acme", id, sbxT0.Add(time.Duration(i/2)*time.Second)) // pairs share a created_at
		if i == 1 {
			sb.Status = "paused"
		}
		if err := s.CreateSandbox(ctx, sb, 10); err != nil {
			t.Fatal(err)
		}
		ids = append([]string{id}, ids...)
	}
	var got []string
	p := store.SandboxPage{Limit: 2}
	for {
		page, err := s.ListSandboxes(ctx, "acme", p)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page {
			got = append(got, sb.ID)
		}
		if len(page) < p.Limit {
			break
		}
		last := page[len(page)-1]
		p.Before, p.BeforeID = last.CreatedAt, last.ID
	}
	if diff := cmp.Diff(ids, got); diff != "" {
		t.Errorf("pages, newest first (-want +got):\n%s", diff)
	}
	paused, err := s.ListSandboxes(ctx, "acme", store.SandboxPage{Status: "paused", Limit: 10})
	if err != nil || len(paused) != 1 || paused[0].ID != "sbx_1" {
		t.Errorf("ListSandboxes paused = %v, %v", paused, err)
	}
}

func testSandboxNodeAndCount(t *testing.T, s store.Sandboxes) {
	ctx := t.Context()
	for i, st := range []string{"running", "running", "paused"} {
		sb := newSandbox(fmt.Sprintf("t%d", i%2), fmt.Sprintf("sbx_%d", i), sbxT0)
		sb.Status = st
		if err := s.CreateSandbox(ctx, sb, 10); err != nil {
			t.Fatal(err)
		}
	}
	sb := newSandbox("t0", "sbx_b", sbxT0)
	sb.Node = "node-b"
	if err := s.CreateSandbox(ctx, sb, 10); err != nil {
		t.Fatal(err)
	}
	got, err := s.NodeSandboxes(ctx, "node-a", "running")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range got {
		ids = append(ids, sb.ID)
	}
	if diff := cmp.Diff([]string{"sbx_0", "sbx_1"}, ids); diff != "" {
		t.Errorf("NodeSandboxes (-want +got):\n%s", diff)
	}
	if r, p, err := s.CountSandboxes(ctx, "t0"); r != 2 || p != 1 || err != nil {
		t.Errorf("CountSandboxes(t0) = %d, %d, %v; want 2, 1", r, p, err)
	}
}

func testSandboxUsage(t *testing.T, s store.Sandboxes) {
	ctx := t.Context()
	for range 2 {
		if err := s.AddSandboxUsage(ctx, "acme", "2025-03-14", store.SandboxUsage{AliveSeconds: 1.5, CPUSeconds: 0.25, NetworkBytesIn: 5 << 30, NetworkBytesOut: 7}); err != nil {
			t.Fatal(err)
		}
	}
	want := store.SandboxUsage{AliveSeconds: 3, CPUSeconds: 0.5, NetworkBytesIn: 10 << 30, NetworkBytesOut: 14}
	if u, err := s.SandboxUsage(ctx, "acme", "2025-03-14"); u != want || err != nil {
		t.Errorf("SandboxUsage = %+v, %v; want %+v", u, err, want)
	}
	if u, err := s.SandboxUsage(ctx, "acme", "2025-03-15"); u != (store.SandboxUsage{}) || err != nil {
		t.Errorf("SandboxUsage of another day = %+v, %v", u, err)
	}
	if err := s.AddSandboxUsage(ctx, "acme", "14/03/2025", store.SandboxUsage{AliveSeconds: 1, CPUSeconds: 1}); err == nil {
		t.Error("AddSandboxUsage of an invalid day succeeded")
	}
}

func testSandboxPurge(t *testing.T, s store.Sandboxes) {
	ctx := t.Context()
	for i, ended := range []time.Duration{time.Minute, 3 * time.Minute, 0} {
		sb := newSandbox("acme", fmt.Sprintf("sbx_%d", i), sbxT0)
		if err := s.CreateSandbox(ctx, sb, 10); err != nil {
			t.Fatal(err)
		}
		if ended > 0 {
			sb.Status, sb.Reason, sb.EndedAt = "ended", "killed", sbxT0.Add(ended)
			if err := s.UpdateSandbox(ctx, sb, "running"); err != nil {
				t.Fatal(err)
			}
		}
	}
	n, err := s.PurgeSandboxes(ctx, sbxT0.Add(2*time.Minute))
	if err != nil || n != 1 {
		t.Fatalf("PurgeSandboxes = %d, %v; want 1", n, err)
	}
	if _, err := s.Sandbox(ctx, "acme", "sbx_0"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("purged sandbox: %v, want ErrNotFound", err)
	}
	for _, id := range []string{"sbx_1", "sbx_2"} {
		if _, err := s.Sandbox(ctx, "acme", id); err != nil {
			t.Errorf("%s after purge: %v", id, err)
		}
	}
}

// testSandboxByID: the E2B data plane finds a sandbox by its id alone,
// with the access token stored at create, and nothing that does not exist.
func testSandboxByID(t *testing.T, s store.Sandboxes) {
	ctx := t.Context()
	want := newSandbox("acme", "sbx_1", sbxT0)
	want.AccessToken = "tok_0123"
	if err := s.CreateSandbox(ctx, want, 5); err != nil {
		t.Fatal(err)
	}
	got, err := s.SandboxByID(ctx, "sbx_1")
	if err != nil {
		t.Fatalf("SandboxByID: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SandboxByID (-want +got):\n%s", diff)
	}
	if _, err := s.SandboxByID(ctx, "sbx_2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SandboxByID of no sandbox: %v, want ErrNotFound", err)
	}
}
