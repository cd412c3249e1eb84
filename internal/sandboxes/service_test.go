package sandboxes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlite"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	s       *Service
	st      Store
	raw     store.Store
	starter *fakeStarter
	clock   *clock
	dir     string
}

func openStore(t *testing.T, path string) store.Store {
	t.Helper()
	st, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	raw := openStore(t, filepath.Join(dir, "vertal.db"))
	return newFixtureOn(t, raw, dir, "node-a")
}

func newFixtureOn(t *testing.T, raw store.Store, dir, node string) *fixture {
	t.Helper()
	f := &fixture{raw: raw, st: raw.(Store), starter: &fakeStarter{}, clock: &clock{t: time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)}, dir: dir}
	s, err := New(Options{
		Store: f.st, Starter: f.starter, Agent: "/usr/libexec/vertal-agent", DataDir: dir, NodeID: node, Now: f.clock.Now,
		Image: func(name string) (string, string, string, error) {
			switch name {
			case "":
				return "/images/default/rootfs", config.DefaultImage, "v7", nil
			case "data":
				return "/images/data/rootfs", "data", "v2", nil
			}
			return "", "", "", errors.New("no such image")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.connect = func(l engine.Live) agentClient { return l.(*fakeLive).ag }
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.s = s
	return f
}

func caller(tenant string, p config.Plan) execution.Caller {
	return execution.Caller{Key: store.Key{ID: "key_" + tenant, Tenant: tenant, Plan: "custom"}, Plan: p}
}

func freePlan() config.Plan { return config.DefaultPlans()["free"] }

func kindOf(err error) (execution.Kind, bool) {
	var xe *execution.Error
	if !errors.As(err, &xe) {
		return 0, false
	}
	return xe.Kind, true
}

func wantKind(t *testing.T, what string, err error, k execution.Kind) {
	t.Helper()
	if got, ok := kindOf(err); !ok || got != k {
		t.Errorf("%s: error %v (kind %v), want kind %v", what, err, got, k)
	}
}

func (f *fixture) create(t *testing.T, c execution.Caller, r CreateRequest) Sandbox {
	t.Helper()
	sb, err := f.s.Create(t.Context(), c, "", r)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return sb
}

// race makes n calls at once and counts those that succeeded and those
// refused with the error kind refused; any other error fails the test.
func race(t *testing.T, n int, what string, refused execution.Kind, call func() error) (ok, refusedN int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = call()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		switch k, _ := kindOf(err); {
		case err == nil:
			ok++
		case k == refused:
			refusedN++
		default:
			t.Errorf("%s: %v", what, err)
		}
	}
	return ok, refusedN
}

func (f *fixture) used(t *testing.T, tenant string) int64 {
	t.Helper()
	u, err := f.raw.Usage(t.Context(), tenant, "2025-03-14")
	if err != nil {
		t.Fatal(err)
	}
	return u.Executions
}

func TestCreate(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", config.DefaultPlans()["pro"])
	sb := f.create(t, c, CreateRequest{TimeoutS: 120, Env: map[string]string{"B": "2", "A": "1"}, Metadata: map[string]string{"job": "x"},
		Files: []File{{Path: "data/in.csv", Content: []byte("a,b\n")}}})
	if sb.Status != StatusRunning || sb.Image != "default" || sb.ImageVersion != "v7" || !sb.ExpiresAt.Equal(f.clock.Now().Add(2*time.Minute)) {
		t.Errorf("Create = %+v", sb)
	}
	if sb.Limits.HomeMB != 256 || sb.Limits.MaxLifetimeS != 3600 || sb.Limits.PausedMB != 1024 || sb.Limits.MemoryMB != 512 {
		t.Errorf("limits %+v, want the pro plan's", sb.Limits)
	}
	spec := f.starter.specs[0]
	if spec.ID != sb.ID || spec.Image != "/images/default/rootfs" || spec.HomeBytes != 256<<20 || spec.Agent != "/usr/libexec/vertal-agent" ||
		fmt.Sprint(f.starter.last().ag.getEnv()) != "map[A:1 B:2]" || spec.Limits.MemoryBytes != (512+256)<<20 || !spec.Deadline.Equal(sb.ExpiresAt.Add(deadlineGrace)) || spec.Limits.Lifetime != time.Hour+deadlineGrace {
		t.Errorf("LiveSpec %+v", spec)
	}
	if got := f.starter.last().ag.files[engine.HomeDir+"/data/in.csv"]; string(got) != "a,b\n" {
		t.Errorf("file in the home = %q", got)
	}
	if n := f.used(t, "acme"); n != 1 {
		t.Errorf("quota used = %d, want 1", n)
	}

	for _, tc := range []struct {
		name string
		r    CreateRequest
		kind execution.Kind
	}{
		{"beyond lifetime", CreateRequest{TimeoutS: 3601}, execution.KindInvalidTimeout},
		{"negative timeout", CreateRequest{TimeoutS: -1}, execution.KindInvalidTimeout},
		{"bad on_timeout", CreateRequest{OnTimeout: "sleep"}, execution.KindInvalidRequest},
		{"unknown image", CreateRequest{Image: "nope"}, execution.KindInvalidRequest},
		{"file outside home", CreateRequest{Files: []File{{Path: "../etc/passwd"}}}, execution.KindInvalidRequest},
		{"absolute file", CreateRequest{Files: []File{{Path: "/etc/passwd"}}}, execution.KindInvalidRequest},
		{"file too large", CreateRequest{Files: []File{{Path: "a", Content: make([]byte, 11<<20)}}}, execution.KindPayloadTooLarge},
		{"too many metadata keys", CreateRequest{Metadata: manyPairs(MaxMetadata + 1)}, execution.KindInvalidRequest},
		{"empty metadata key", CreateRequest{Metadata: map[string]string{"": "x"}}, execution.KindInvalidRequest},
		{"long metadata key", CreateRequest{Metadata: map[string]string{strings.Repeat("k", MaxMetadataKey+1): "x"}}, execution.KindInvalidRequest},
		{"long metadata value", CreateRequest{Metadata: map[string]string{"k": strings.Repeat("v", MaxMetadataValue+1)}}, execution.KindInvalidRequest},
		{"NUL in metadata", CreateRequest{Metadata: map[string]string{"k": "a\x00b"}}, execution.KindInvalidRequest},
		{"control in metadata key", CreateRequest{Metadata: map[string]string{"a\nb": "x"}}, execution.KindInvalidRequest},
		{"bad UTF-8 in metadata", CreateRequest{Metadata: map[string]string{"k": "\xff"}}, execution.KindInvalidRequest},
		{"zero-width key", CreateRequest{Metadata: map[string]string{"\u200b": "x"}}, execution.KindInvalidRequest},
		{"bidi override in metadata", CreateRequest{Metadata: map[string]string{"k": "a\u202eb"}}, execution.KindInvalidRequest},
		{"line separator in metadata", CreateRequest{Metadata: map[string]string{"k": "a\u2028b"}}, execution.KindInvalidRequest},
		{"too many env names", CreateRequest{Env: manyPairs(execution.MaxEnv + 1)}, execution.KindInvalidRequest},
		{"env too large", CreateRequest{Env: map[string]string{"A": strings.Repeat("v", execution.MaxEnvBytes)}}, execution.KindInvalidRequest},
		{"bad env name", CreateRequest{Env: map[string]string{"A=B": "x"}}, execution.KindInvalidRequest},
		{"NUL in env", CreateRequest{Env: map[string]string{"A": "a\x00b"}}, execution.KindInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.s.Create(t.Context(), c, "", tc.r)
			wantKind(t, tc.name, err, tc.kind)
		})
	}
	if n := f.used(t, "acme"); n != 1 {
		t.Errorf("quota used after refusals = %d, want 1", n)
	}
	// At the caps is accepted, and a sandbox's own shell may set the
	// names an execution reserves.
	full := manyPairs(MaxMetadata)
	full["k"] = strings.Repeat("é", MaxMetadataValue/2)
	delete(full, "K0")
	if _, err := f.s.Create(t.Context(), c, "", CreateRequest{Metadata: full, Env: map[string]string{"PATH": "/x", "PYTHONPATH": "/y"}}); err != nil {
		t.Errorf("metadata at the caps and reserved env names: %v", err)
	}
}

// listAll follows r's pages to the end: the ids, and the calls it took.
func (f *fixture) listAll(t *testing.T, c execution.Caller, r ListRequest) (ids []string, calls int) {
	t.Helper()
	for {
		calls++
		page, err := f.s.List(t.Context(), c, r)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page.Sandboxes {
			ids = append(ids, sb.ID)
		}
		if page.Next == "" {
			return ids, calls
		}
		r.Cursor = page.Next
	}
}

// manyPairs is n pairs K0=v … K(n-1)=v.
func manyPairs(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("K%d", i)] = "v"
	}
	return m
}

func TestTenantIsolation(t *testing.T) {
	f := newFixture(t)
	p := config.DefaultPlans()["pro"]
	owner, other := caller("acme", p), caller("mallory", p)
	sb := f.create(t, owner, CreateRequest{Files: []File{{Path: "secret", Content: []byte("s3cret")}}})
	ctx := t.Context()
	var buf bytes.Buffer
	calls := map[string]func() error{
		"Get":          func() error { _, err := f.s.Get(ctx, other, sb.ID); return err },
		"Kill":         func() error { _, err := f.s.Kill(ctx, other, sb.ID); return err },
		"SetTimeout":   func() error { _, err := f.s.SetTimeout(ctx, other, sb.ID, time.Minute); return err },
		"Pause":        func() error { _, err := f.s.Pause(ctx, other, sb.ID); return err },
		"Resume":       func() error { _, err := f.s.Resume(ctx, other, sb.ID); return err },
		"Run":          func() error { _, err := f.s.Run(ctx, other, sb.ID, CommandRequest{Cmd: "echo hi"}, nil); return err },
		"StartCommand": func() error { _, err := f.s.StartCommand(ctx, other, sb.ID, CommandRequest{Cmd: "sleep"}); return err },
		"Commands":     func() error { _, err := f.s.Commands(ctx, other, sb.ID); return err },
		"SendStdin":    func() error { return f.s.SendStdin(ctx, other, sb.ID, 101, []byte("x"), true) },
		"Signal":       func() error { return f.s.Signal(ctx, other, sb.ID, 101, "KILL") },
		"Events":       func() error { return f.s.Events(ctx, other, sb.ID, 101, 0, func(Event) error { return nil }) },
		"Stat":         func() error { _, err := f.s.Stat(ctx, other, sb.ID, "secret"); return err },
		"ListDir":      func() error { _, err := f.s.ListDir(ctx, other, sb.ID, "."); return err },
		"ReadFile":     func() error { _, err := f.s.ReadFile(ctx, other, sb.ID, "secret", &buf); return err },
		"WriteFile":    func() error { _, err := f.s.WriteFile(ctx, other, sb.ID, "x", bytes.NewReader(nil)); return err },
		"Remove":       func() error { return f.s.Remove(ctx, other, sb.ID, "secret") },
		"Mkdir":        func() error { _, err := f.s.Mkdir(ctx, other, sb.ID, "d"); return err },
		"Move":         func() error { _, err := f.s.Move(ctx, other, sb.ID, "secret", "mine"); return err },
	}
	for name, call := range calls {
		wantKind(t, name+" by another tenant", call(), execution.KindNotFound)
	}
	if buf.Len() != 0 {
		t.Errorf("another tenant read %q", buf.String())
	}
	page, err := f.s.List(ctx, other, ListRequest{})
	if err != nil || len(page.Sandboxes) != 0 {
		t.Errorf("List by another tenant = %+v, %v", page, err)
	}
	got, err := f.s.Get(ctx, owner, sb.ID)
	if err != nil || got.Status != StatusRunning {
		t.Errorf("owner's Get after the other tenant's calls = %+v, %v", got, err)
	}
	if n := f.used(t, "mallory"); n != 0 {
		t.Errorf("another tenant's refused calls counted %d executions", n)
	}
}

func TestCapRace(t *testing.T) {
	f := newFixture(t)
	p := freePlan()
	p.MaxSandboxes = 3
	c := caller("acme", p)
	const n = 12
	created, limited := race(t, n, "Create", execution.KindSandboxLimit, func() error {
		_, err := f.s.Create(context.Background(), c, "", CreateRequest{})
		return err
	})
	if created != 3 || limited != n-3 {
		t.Errorf("%d parallel creates under a cap of 3: %d created, %d refused", n, created, limited)
	}
	if got := f.starter.count(); got != 3 {
		t.Errorf("%d live sandboxes started, want 3", got)
	}
	if u := f.used(t, "acme"); u != 3 {
		t.Errorf("quota used = %d, want 3 (the refused ones given back)", u)
	}
}

func TestExpiry(t *testing.T) {
	for _, tc := range []struct {
		onTimeout  string
		wantStatus Status
		wantReason string
	}{
		{"kill", StatusEnded, ReasonExpired},
		{"pause", StatusPaused, ""},
	} {
		t.Run(tc.onTimeout, func(t *testing.T) {
			f := newFixture(t)
			c := caller("acme", freePlan())
			sb := f.create(t, c, CreateRequest{TimeoutS: 60, OnTimeout: tc.onTimeout})
			live := f.starter.last()
			live.addCPU(500)
			f.clock.Add(59 * time.Second)
			f.s.expireDue(t.Context())()
			if got, _ := f.s.Get(t.Context(), c, sb.ID); got.Status != StatusRunning {
				t.Fatalf("before expires_at: status %s", got.Status)
			}
			f.clock.Add(time.Second)
			f.s.expireDue(t.Context())()
			got, err := f.s.Get(t.Context(), c, sb.ID)
			if err != nil || got.Status != tc.wantStatus || got.Reason != tc.wantReason {
				t.Errorf("after expires_at: %+v, %v; want %s %q", got, err, tc.wantStatus, tc.wantReason)
			}
			if !live.discarded.Load() {
				t.Error("the live sandbox was not discarded")
			}
			if got.AliveSeconds != 60 || got.CPUSeconds != 0.5 {
				t.Errorf("metered %v s alive, %v s CPU; want 60, 0.5", got.AliveSeconds, got.CPUSeconds)
			}
			u, _ := f.s.Usage(t.Context(), c)
			if u.SandboxSeconds != 60 || u.SandboxCPUSeconds != 0.5 {
				t.Errorf("Usage %+v", u)
			}
		})
	}
}

func TestPauseResumeRoundTrip(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", config.DefaultPlans()["pro"])
	ctx := t.Context()
	blob := make([]byte, 70000)
	for i := range blob {
		blob[i] = byte(i * 7)
	}
	sb := f.create(t, c, CreateRequest{Files: []File{{Path: "a.txt", Content: []byte("alpha")}}})
	if _, err := f.s.WriteFile(ctx, c, sb.ID, "bin/blob", bytes.NewReader(blob)); err != nil {
		t.Fatal(err)
	}
	first := f.starter.last()
	paused, err := f.s.Pause(ctx, c, sb.ID)
	if err != nil || paused.Status != StatusPaused {
		t.Fatalf("Pause = %+v, %v", paused, err)
	}
	archive := filepath.Join(f.dir, "sandboxes", sb.ID, "home.tar")
	onDisk, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, first.ag.saved) || len(onDisk) == 0 {
		t.Errorf("the archive on disk (%d bytes) is not what the agent saved (%d bytes)", len(onDisk), len(first.ag.saved))
	}
	if !first.discarded.Load() {
		t.Error("pause left the live sandbox")
	}
	if entries, _ := os.ReadDir(filepath.Dir(archive)); len(entries) != 1 {
		t.Errorf("the sandbox dir holds %d entries, want just home.tar", len(entries))
	}
	// Pausing again is a no-op.
	if again, err := f.s.Pause(ctx, c, sb.ID); err != nil || again.Status != StatusPaused {
		t.Errorf("second Pause = %+v, %v", again, err)
	}
	resumed, err := f.s.Resume(ctx, c, sb.ID)
	if err != nil || resumed.Status != StatusRunning {
		t.Fatalf("Resume = %+v, %v", resumed, err)
	}
	second := f.starter.last()
	if second == first {
		t.Fatal("resume did not start a fresh sandbox")
	}
	if !bytes.Equal(second.ag.restored, onDisk) {
		t.Error("RestoreHome did not get the saved archive byte for byte")
	}
	var got bytes.Buffer
	if _, err := f.s.ReadFile(ctx, c, sb.ID, "bin/blob", &got); err != nil || !bytes.Equal(got.Bytes(), blob) {
		t.Errorf("blob after resume: %d bytes, %v; want the %d written", got.Len(), err, len(blob))
	}
	if _, err := os.Stat(archive); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the archive stays after resume: %v", err)
	}
}

func TestPausedCommandResumes(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	ctx := t.Context()
	sb := f.create(t, c, CreateRequest{Files: []File{{Path: "keep", Content: []byte("kept")}}})
	if _, err := f.s.Pause(ctx, c, sb.ID); err != nil {
		t.Fatal(err)
	}
	// Calls about processes do not resume it: those ended with the pause.
	wantKind(t, "Commands on a paused sandbox", func() error { _, err := f.s.Commands(ctx, c, sb.ID); return err }(), execution.KindSandboxNotRunning)
	res, err := f.s.Run(ctx, c, sb.ID, CommandRequest{Cmd: "echo back"}, nil)
	if err != nil || res.Stdout != "back\n" || res.Status != "succeeded" {
		t.Fatalf("Run on a paused sandbox = %+v, %v", res, err)
	}
	if got, _ := f.s.Get(ctx, c, sb.ID); got.Status != StatusRunning {
		t.Errorf("status after the command: %s", got.Status)
	}
	var buf bytes.Buffer
	if _, err := f.s.ReadFile(ctx, c, sb.ID, "keep", &buf); err != nil || buf.String() != "kept" {
		t.Errorf("file after the resume = %q, %v", buf.String(), err)
	}
	// An ended sandbox refuses.
	if _, err := f.s.Kill(ctx, c, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = f.s.Run(ctx, c, sb.ID, CommandRequest{Cmd: "echo x"}, nil)
	wantKind(t, "Run on an ended sandbox", err, execution.KindSandboxNotRunning)
	_, err = f.s.Pause(ctx, c, sb.ID)
	wantKind(t, "Pause on an ended sandbox", err, execution.KindSandboxNotRunning)
	if got, _ := f.s.Get(ctx, c, sb.ID); got.Status != StatusEnded || got.Reason != ReasonKilled || got.EndedAt == nil {
		t.Errorf("after Kill: %+v", got)
	}
}

func TestSetTimeout(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan()) // lifetime 10 min
	ctx := t.Context()
	sb := f.create(t, c, CreateRequest{TimeoutS: 60})
	ag := f.starter.last().ag
	f.clock.Add(2 * time.Minute)
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		kind    execution.Kind // 0: accepted
	}{
		{"within the lifetime", 8 * time.Minute, 0},
		{"to the end of the lifetime", 8 * time.Minute, 0},
		{"beyond the lifetime", 8*time.Minute + time.Second, execution.KindInvalidTimeout},
		{"zero", 0, execution.KindInvalidTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := f.s.Get(ctx, c, sb.ID)
			got, err := f.s.SetTimeout(ctx, c, sb.ID, tc.timeout)
			if tc.kind != 0 {
				wantKind(t, "SetTimeout", err, tc.kind)
				after, _ := f.s.Get(ctx, c, sb.ID)
				if !after.ExpiresAt.Equal(before.ExpiresAt) {
					t.Errorf("a refused extension moved expires_at to %s", after.ExpiresAt)
				}
				return
			}
			want := f.clock.Now().Add(tc.timeout)
			if err != nil || !got.ExpiresAt.Equal(want) {
				t.Fatalf("SetTimeout = %+v, %v; want expires_at %s", got, err, want)
			}
			if d := ag.getDeadline(); !d.Equal(want.Add(deadlineGrace)) {
				t.Errorf("agent deadline %s, want %s", d, want.Add(deadlineGrace))
			}
		})
	}
}

func TestQuota(t *testing.T) {
	f := newFixture(t)
	p := freePlan()
	p.ExecutionsPerDay = 6
	c := caller("acme", p)
	sb := f.create(t, c, CreateRequest{}) // 1
	const n = 12
	ok, over := race(t, n, "Run", execution.KindQuotaExceeded, func() error {
		_, err := f.s.Run(context.Background(), c, sb.ID, CommandRequest{Cmd: "echo hi"}, nil)
		return err
	})
	if ok != 5 || over != n-5 {
		t.Errorf("%d parallel commands with 5 left: %d ran, %d refused", n, ok, over)
	}
	if u := f.used(t, "acme"); u != 6 {
		t.Errorf("quota used %d, want 6", u)
	}
}

func TestQuotaRefundedOnPlatformFailure(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	ctx := t.Context()
	f.starter.fail.Store(true)
	_, err := f.s.Create(ctx, c, "", CreateRequest{})
	wantKind(t, "Create on a failing runtime", err, execution.KindSandboxError)
	if u := f.used(t, "acme"); u != 0 {
		t.Errorf("quota used after a failed create = %d, want 0", u)
	}
	page, _ := f.s.List(ctx, c, ListRequest{})
	if len(page.Sandboxes) != 1 || page.Sandboxes[0].Status != StatusEnded || page.Sandboxes[0].Reason != ReasonError {
		t.Errorf("the failed sandbox's record: %+v", page.Sandboxes)
	}
	f.starter.fail.Store(false)
	sb := f.create(t, c, CreateRequest{}) // the failed one does not hold the free plan's one place
	_, err = f.s.Run(ctx, c, sb.ID, CommandRequest{Cmd: "die"}, nil)
	wantKind(t, "Run when the agent goes away", err, execution.KindSandboxError)
	if _, err := f.s.Run(ctx, c, sb.ID, CommandRequest{Cmd: "exit 3"}, nil); err != nil {
		t.Fatal(err)
	}
	if u := f.used(t, "acme"); u != 2 {
		t.Errorf("quota used = %d, want 2 (create and the command that ran; not the platform's failure)", u)
	}
}

func TestIdempotentCreate(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", config.DefaultPlans()["pro"])
	ctx := t.Context()
	r := CreateRequest{Metadata: map[string]string{"a": "b"}}
	first, err := f.s.Create(ctx, c, "k1", r)
	if err != nil {
		t.Fatal(err)
	}
	again, err := f.s.Create(ctx, c, "k1", r)
	if err != nil || again.ID != first.ID {
		t.Errorf("replay = %s, %v; want %s", again.ID, err, first.ID)
	}
	_, err = f.s.Create(ctx, c, "k1", CreateRequest{})
	wantKind(t, "same key, other body", err, execution.KindIdempotencyConflict)
	if f.starter.count() != 1 || f.used(t, "acme") != 1 {
		t.Errorf("%d started, %d counted; want 1, 1", f.starter.count(), f.used(t, "acme"))
	}
}

func TestNodeLostAtStartUp(t *testing.T) {
	dir := t.TempDir()
	raw := openStore(t, filepath.Join(dir, "vertal.db"))
	f := newFixtureOn(t, raw, dir, "node-a")
	c := caller("acme", config.DefaultPlans()["pro"])
	running := f.create(t, c, CreateRequest{})
	paused := f.create(t, c, CreateRequest{})
	if _, err := f.s.Pause(t.Context(), c, paused.ID); err != nil {
		t.Fatal(err)
	}
	other := newFixtureOn(t, raw, dir, "node-b") // another node leaves node-a's alone
	if got, _ := other.s.Get(t.Context(), c, running.ID); got.Status != StatusRunning {
		t.Errorf("another node's start-up ended node-a's sandbox: %+v", got)
	}
	// node-a restarts: a new process with none of its live sandboxes.
	again := newFixtureOn(t, raw, dir, "node-a")
	got, err := again.s.Get(t.Context(), c, running.ID)
	if err != nil || got.Status != StatusEnded || got.Reason != ReasonNodeLost {
		t.Errorf("running sandbox after a restart: %+v, %v; want ended node_lost", got, err)
	}
	if got, _ := again.s.Get(t.Context(), c, paused.ID); got.Status != StatusPaused {
		t.Errorf("paused sandbox after a restart: %s, want paused", got.Status)
	}
	if sb, err := again.s.Resume(t.Context(), c, paused.ID); err != nil || sb.Status != StatusRunning {
		t.Errorf("resume after a restart = %+v, %v", sb, err)
	}
}

func TestShutdownPauses(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", config.DefaultPlans()["pro"])
	a := f.create(t, c, CreateRequest{Files: []File{{Path: "f", Content: []byte("x")}}})
	b := f.create(t, c, CreateRequest{})
	if err := f.s.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a.ID, b.ID} {
		if got, _ := f.s.Get(t.Context(), c, id); got.Status != StatusPaused {
			t.Errorf("%s after Shutdown: %s, want paused", id, got.Status)
		}
		if _, err := os.Stat(filepath.Join(f.dir, "sandboxes", id, "home.tar")); err != nil {
			t.Errorf("%s's archive: %v", id, err)
		}
	}
}

func TestLiveDiesOnItsOwn(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	sb := f.create(t, c, CreateRequest{TimeoutS: 60})
	f.starter.last().die() // an OOM kill, a crash
	got := f.waitEnded(t, c, sb.ID, "a dead sandbox is still recorded running")
	if got.Reason != ReasonError || got.Message == "" {
		t.Errorf("ended as %q %q, want error with a message", got.Reason, got.Message)
	}
}

// waitEnded polls until the sandbox is recorded ended and returns it; if
// it is not within 10 seconds, the test fails with what.
func (f *fixture) waitEnded(t *testing.T, c execution.Caller, id, what string) Sandbox {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := f.s.Get(t.Context(), c, id)
		if got.Status == StatusEnded {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRun(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan()) // 64 KiB output per stream
	ctx := t.Context()
	sb := f.create(t, c, CreateRequest{})
	for _, tc := range []struct {
		name       string
		r          CommandRequest
		wantStatus string
		wantCode   int
		wantOut    int // stdout length; -1 skips
		truncated  bool
		kind       execution.Kind
	}{
		{"shell line", CommandRequest{Cmd: "echo hi"}, "succeeded", 0, 3, false, 0},
		{"argv", CommandRequest{Argv: []string{"exit", "3"}}, "failed", 3, 0, false, 0},
		{"stdin", CommandRequest{Argv: []string{"cat"}, Stdin: "in put"}, "succeeded", 0, 6, false, 0},
		{"truncated", CommandRequest{Cmd: "big 100000"}, "succeeded", 0, 64 << 10, true, 0},
		{"timeout", CommandRequest{Cmd: "sleep", TimeoutS: 1}, "timed_out", 128 + 9, 0, false, 0},
		{"both cmd and argv", CommandRequest{Cmd: "echo", Argv: []string{"echo"}}, "", 0, 0, false, execution.KindInvalidRequest},
		{"neither", CommandRequest{}, "", 0, 0, false, execution.KindInvalidRequest},
		{"cwd outside home", CommandRequest{Cmd: "echo", Cwd: "../.."}, "", 0, 0, false, execution.KindInvalidRequest},
		{"not found", CommandRequest{Argv: []string{"nope"}}, "", 0, 0, false, execution.KindNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var events []Event
			res, err := f.s.Run(ctx, c, sb.ID, tc.r, func(e Event) { events = append(events, e) })
			if tc.kind != 0 {
				wantKind(t, "Run", err, tc.kind)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.wantStatus || res.ExitCode != tc.wantCode || len(res.Stdout) != tc.wantOut || res.Truncated != tc.truncated {
				t.Errorf("Run = status %s, exit %d, %d bytes out, truncated %v", res.Status, res.ExitCode, len(res.Stdout), res.Truncated)
			}
			if len(events) == 0 || events[len(events)-1].Type != "exit" {
				t.Errorf("events end with %+v, want exit", events)
			}
			var streamed int
			var last int64
			for i, e := range events {
				// Output past the cap is not streamed, so seqs may skip.
				if e.Seq <= last {
					t.Errorf("event %d has seq %d after %d", i, e.Seq, last)
				}
				last = e.Seq
				if e.Type == "stdout" {
					streamed += len(e.Data)
				}
			}
			if streamed != len(res.Stdout) {
				t.Errorf("streamed %d bytes of stdout, the result has %d", streamed, len(res.Stdout))
			}
		})
	}
}

func TestBackground(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	ctx := t.Context()
	sb := f.create(t, c, CreateRequest{})
	cat, err := f.s.StartCommand(ctx, c, sb.ID, CommandRequest{Argv: []string{"cat"}, Background: true})
	if err != nil || cat.PID == 0 || !cat.Running {
		t.Fatalf("StartCommand = %+v, %v", cat, err)
	}
	sleep, err := f.s.StartCommand(ctx, c, sb.ID, CommandRequest{Cmd: "sleep", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := f.s.Commands(ctx, c, sb.ID)
	if err != nil || len(cmds) != 2 || !cmds[0].Running || !cmds[1].Running {
		t.Fatalf("Commands = %+v, %v", cmds, err)
	}
	if err := f.s.SendStdin(ctx, c, sb.ID, cat.PID, []byte("hello "), false); err != nil {
		t.Fatal(err)
	}
	if err := f.s.SendStdin(ctx, c, sb.ID, cat.PID, []byte("world"), true); err != nil {
		t.Fatal(err)
	}
	var got []Event
	if err := f.s.Events(ctx, c, sb.ID, cat.PID, 0, func(e Event) error { got = append(got, e); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Data != "hello world" || got[1].Type != "exit" || got[1].ExitCode != 0 {
		t.Errorf("Events = %+v", got)
	}
	// Replay after the first event: only the exit.
	got = nil
	if err := f.s.Events(ctx, c, sb.ID, cat.PID, 1, func(e Event) error { got = append(got, e); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Seq != 2 || got[0].Type != "exit" {
		t.Errorf("Events after 1 = %+v", got)
	}
	wantKind(t, "stdin to a finished command", f.s.SendStdin(ctx, c, sb.ID, cat.PID, []byte("x"), false), execution.KindProcessFinished)
	wantKind(t, "signal to a finished command", f.s.Signal(ctx, c, sb.ID, cat.PID, "TERM"), execution.KindProcessFinished)
	wantKind(t, "unknown pid", f.s.Signal(ctx, c, sb.ID, 9999, "TERM"), execution.KindNotFound)
	before := f.used(t, "acme")
	for _, tc := range []struct {
		r   CommandRequest
		msg string
	}{
		{CommandRequest{Cmd: "echo a\x00b"}, "cmd must not contain a NUL"},
		{CommandRequest{Argv: []string{"echo", "a\x00b"}}, "argv[1] must not contain a NUL"},
		{CommandRequest{Argv: []string{""}}, "argv[0], the program, must not be empty"},
		{CommandRequest{Cmd: "echo " + strings.Repeat("x", 140000)}, "cmd is 140005 bytes"},
		{CommandRequest{Argv: []string{"echo", strings.Repeat("x", 100000), strings.Repeat("x", 100000), strings.Repeat("x", 100000),
			strings.Repeat("x", 100000), strings.Repeat("x", 100000), strings.Repeat("x", 100000)}}, "arguments are 600011 bytes"},
		{CommandRequest{Argv: make([]string, maxArgs+1)}, "argv has 4097 entries"},
	} {
		_, err := f.s.StartCommand(ctx, c, sb.ID, CommandRequest{Cmd: tc.r.Cmd, Argv: tc.r.Argv, Background: true})
		wantKind(t, tc.msg, err, execution.KindInvalidRequest)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("error %v, want it to say %q", err, tc.msg)
		}
	}
	_, err = f.s.Run(ctx, c, sb.ID, CommandRequest{Argv: []string{""}}, nil)
	wantKind(t, "a foreground command with an empty program", err, execution.KindInvalidRequest)
	if n := f.used(t, "acme"); n != before {
		t.Errorf("refused commands were counted: %d executions, %d before", n, before)
	}
	_, err = f.s.StartCommand(ctx, c, sb.ID, CommandRequest{Cmd: "env", Env: map[string]string{"A": "a\x00b"}, Background: true})
	wantKind(t, "NUL in a command's env", err, execution.KindInvalidRequest)
	_, err = f.s.StartCommand(ctx, c, sb.ID, CommandRequest{Cmd: "env", Env: manyPairs(execution.MaxEnv + 1), Background: true})
	wantKind(t, "too many env names in a command", err, execution.KindInvalidRequest)
	wantKind(t, "unknown signal", f.s.Signal(ctx, c, sb.ID, sleep.PID, "BOOM"), execution.KindInvalidRequest)

	// Follow a running one, then signal it.
	done := make(chan []Event)
	go func() {
		var evs []Event
		_ = f.s.Events(context.Background(), c, sb.ID, sleep.PID, 0, func(e Event) error { evs = append(evs, e); return nil })
		done <- evs
	}()
	if err := f.s.Signal(ctx, c, sb.ID, sleep.PID, "sigterm"); err != nil {
		t.Fatal(err)
	}
	select {
	case evs := <-done:
		if len(evs) != 1 || evs[0].Type != "exit" || evs[0].ExitCode != 128+int(syscall.SIGTERM) {
			t.Errorf("followed events = %+v", evs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Events did not return at the exit")
	}
	cmds, _ = f.s.Commands(ctx, c, sb.ID)
	for _, cmd := range cmds {
		if cmd.Running || cmd.ExitCode == nil || cmd.EndedAt == nil {
			t.Errorf("finished command listed as %+v", cmd)
		}
	}
}

func TestFiles(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan()) // 1 MB per file
	ctx := t.Context()
	sb := f.create(t, c, CreateRequest{})
	fi, err := f.s.WriteFile(ctx, c, sb.ID, "dir/a.txt", bytes.NewReader([]byte("abc")))
	if err != nil || fi.Path != engine.HomeDir+"/dir/a.txt" || fi.Size != 3 || fi.Mode != "0644" || fi.Name != "a.txt" {
		t.Fatalf("WriteFile = %+v, %v", fi, err)
	}
	_, err = f.s.WriteFile(ctx, c, sb.ID, "big", bytes.NewReader(make([]byte, 1<<20+1)))
	wantKind(t, "upload over the plan's file size", err, execution.KindPayloadTooLarge)
	list, err := f.s.ListDir(ctx, c, sb.ID, "dir")
	if err != nil || len(list) != 1 || list[0].Path != engine.HomeDir+"/dir/a.txt" {
		t.Errorf("ListDir = %+v, %v", list, err)
	}
	if fi, err := f.s.Move(ctx, c, sb.ID, "dir/a.txt", "/home/user/b.txt"); err != nil || fi.Name != "b.txt" {
		t.Errorf("Move = %+v, %v", fi, err)
	}
	_, err = f.s.Stat(ctx, c, sb.ID, "dir/a.txt")
	wantKind(t, "Stat of a moved file", err, execution.KindNotFound)
	_, err = f.s.Mkdir(ctx, c, sb.ID, "/etc/x")
	wantKind(t, "Mkdir the agent refuses", err, execution.KindForbidden)
	_, err = f.s.Stat(ctx, c, sb.ID, "../../etc/shadow")
	wantKind(t, "a relative path out of the home", err, execution.KindInvalidRequest)
	if err := f.s.Remove(ctx, c, sb.ID, "b.txt"); err != nil {
		t.Error(err)
	}
	for _, home := range []string{".", "/home/user", "/home/user/"} {
		err := f.s.Remove(ctx, c, sb.ID, home)
		wantKind(t, "Remove "+home, err, execution.KindInvalidRequest)
		if err == nil || !strings.Contains(err.Error(), "home directory") {
			t.Errorf("Remove %q: %v, want it to name the home directory", home, err)
		}
	}
}

func TestList(t *testing.T) {
	f := newFixture(t)
	p := config.DefaultPlans()["enterprise"]
	c := caller("acme", p)
	ctx := t.Context()
	var ids []string
	for i := range 7 {
		f.clock.Add(time.Second)
		sb := f.create(t, c, CreateRequest{Metadata: map[string]string{"parity": fmt.Sprint(i % 2)}})
		ids = append([]string{sb.ID}, ids...)
	}
	if _, err := f.s.Pause(ctx, c, ids[0]); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.listAll(t, c, ListRequest{Limit: 3}); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Errorf("pages = %v, want %v", got, ids)
	}
	page, err := f.s.List(ctx, c, ListRequest{Metadata: map[string]string{"parity": "0"}, Limit: 2})
	if err != nil || len(page.Sandboxes) != 2 || page.Next == "" {
		t.Fatalf("metadata page = %+v, %v", page, err)
	}
	page2, err := f.s.List(ctx, c, ListRequest{Metadata: map[string]string{"parity": "0"}, Limit: 2, Cursor: page.Next})
	if err != nil || len(page2.Sandboxes) != 2 || page2.Next != "" {
		t.Errorf("second metadata page = %+v, %v", page2, err)
	}
	paused, err := f.s.List(ctx, c, ListRequest{Status: StatusPaused})
	if err != nil || len(paused.Sandboxes) != 1 || paused.Sandboxes[0].ID != ids[0] {
		t.Errorf("paused = %+v, %v", paused, err)
	}
	_, err = f.s.List(ctx, c, ListRequest{Cursor: "!!"})
	wantKind(t, "bad cursor", err, execution.KindInvalidRequest)
	_, err = f.s.List(ctx, c, ListRequest{Metadata: manyPairs(MaxListFilters + 1)})
	wantKind(t, "too many filters", err, execution.KindInvalidRequest)
}

// TestListSparseFilterBounded: a filter that matches one sandbox among
// thousands reads at most maxListScan records a call, answering short
// pages whose cursors still reach every match.
func TestListSparseFilterBounded(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", config.DefaultPlans()["pro"])
	ctx := t.Context()
	base := f.clock.Now()
	const total = 2*maxListScan + 50
	var want []string
	for i := range total {
		rec := store.Sandbox{ID: fmt.Sprintf("sbx_%032x", i), Tenant: "acme", KeyID: "key_acme", Status: "ended", Reason: "killed",
			Image: "default", Limits: []byte("{}"), OnTimeout: "kill", CreatedAt: base.Add(time.Duration(i) * time.Millisecond),
			Metadata: map[string]string{"n": fmt.Sprint(i)}}
		if i == 10 || i == total-10 {
			rec.Metadata["rare"] = "yes"
			want = append([]string{rec.ID}, want...)
		}
		if err := f.st.CreateSandbox(ctx, rec, 1); err != nil {
			t.Fatal(err)
		}
	}
	got, calls := f.listAll(t, c, ListRequest{Metadata: map[string]string{"rare": "yes"}, Limit: 100})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("matches = %v, want %v", got, want)
	}
	if calls != 3 {
		t.Errorf("%d calls for %d records, want 3 (at most %d records read per call)", calls, total, maxListScan)
	}
}

func TestPauseOverStorage(t *testing.T) {
	f := newFixture(t)
	p := freePlan()
	p.PausedStorageMB = 1
	c := caller("acme", p)
	ctx := t.Context()
	sb := f.create(t, c, CreateRequest{})
	for i := range 2 {
		if _, err := f.s.WriteFile(ctx, c, sb.ID, fmt.Sprint(i), bytes.NewReader(make([]byte, 900<<10))); err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.s.Pause(ctx, c, sb.ID)
	wantKind(t, "Pause over the paused storage", err, execution.KindPayloadTooLarge)
	if got, _ := f.s.Get(ctx, c, sb.ID); got.Status != StatusRunning {
		t.Errorf("after a refused pause: %s, want running", got.Status)
	}
	if entries, _ := os.ReadDir(filepath.Join(f.dir, "sandboxes", sb.ID)); len(entries) != 0 {
		t.Errorf("a refused pause left %d files", len(entries))
	}
}

func TestExpiryPauseOverStorageEnds(t *testing.T) {
	f := newFixture(t)
	p := freePlan()
	p.PausedStorageMB = 1
	c := caller("acme", p)
	ctx := t.Context()
	sb := f.create(t, c, CreateRequest{TimeoutS: 60, OnTimeout: "pause"})
	for i := range 2 {
		if _, err := f.s.WriteFile(ctx, c, sb.ID, fmt.Sprint(i), bytes.NewReader(make([]byte, 900<<10))); err != nil {
			t.Fatal(err)
		}
	}
	f.clock.Add(time.Minute)
	f.s.expireDue(ctx)()
	got, err := f.s.Get(ctx, c, sb.ID)
	if err != nil || got.Status != StatusEnded || got.Reason != ReasonError || got.Message == "" {
		t.Errorf("a sandbox too large to pause at expiry: %+v, %v; want ended error with a message", got, err)
	}
	if !f.starter.last().discarded.Load() {
		t.Error("its live sandbox was left")
	}
}

func TestLiveDiesAtItsDeadline(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	sb := f.create(t, c, CreateRequest{TimeoutS: 60})
	f.clock.Add(time.Minute + deadlineGrace) // the agent's deadline, before the service looked
	f.starter.last().die()
	got := f.waitEnded(t, c, sb.ID, "a sandbox past its deadline is still recorded running")
	if got.Reason != ReasonExpired {
		t.Errorf("ended as %q, want expired", got.Reason)
	}
}

// TestMemoryBudget: the node's live sandboxes never hold more memory
// limits than its budget; the next create or resume gets 503 overloaded
// with Retry-After, counts nothing, and fits again once one is gone.
func TestMemoryBudget(t *testing.T) {
	f := newFixture(t)
	p := config.DefaultPlans()["pro"] // 512 MB of memory and a 256 MB home each
	f.s.opts.MemoryBudget = 2 * (512 + 256) << 20
	a, b := caller("a", p), caller("b", p)
	first := f.create(t, a, CreateRequest{})
	f.create(t, b, CreateRequest{})
	_, err := f.s.Create(t.Context(), a, "", CreateRequest{})
	wantKind(t, "a third create over the budget", err, execution.KindOverloaded)
	var xe *execution.Error
	if errors.As(err, &xe) && xe.RetryAfter <= 0 {
		t.Errorf("no Retry-After: %+v", xe)
	}
	if n := f.used(t, "a"); n != 1 {
		t.Errorf("quota used = %d, want 1 (the refused create is not counted)", n)
	}
	if _, err := f.s.Pause(t.Context(), a, first.ID); err != nil {
		t.Fatal(err)
	}
	third := f.create(t, a, CreateRequest{}) // the paused one holds no memory
	_, err = f.s.Resume(t.Context(), a, first.ID)
	wantKind(t, "a resume over the budget", err, execution.KindOverloaded)
	if _, err := f.s.Kill(t.Context(), a, third.ID); err != nil {
		t.Fatal(err)
	}
	if sb, err := f.s.Resume(t.Context(), a, first.ID); err != nil || sb.Status != StatusRunning {
		t.Fatalf("resume after a kill freed the budget: %+v %v", sb, err)
	}
}

// TestRunMissingProgramNamed: a program that is not there is named in the
// error, not blamed on the cwd (which exists).
func TestRunMissingProgramNamed(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	sb := f.create(t, c, CreateRequest{})
	_, err := f.s.Run(t.Context(), c, sb.ID, CommandRequest{Argv: []string{"nope"}}, nil)
	wantKind(t, "Run", err, execution.KindNotFound)
	if err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("Run of a missing program: %v, want the program named", err)
	}
}

// TestRunEndedByKill: a foreground command in flight when its sandbox is
// killed (or paused) answers that the sandbox is not running, a 409, not
// a platform failure.
func TestRunEndedByKill(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	sb := f.create(t, c, CreateRequest{})
	errc := make(chan error, 1)
	go func() {
		_, err := f.s.Run(t.Context(), c, sb.ID, CommandRequest{Cmd: "hang"}, nil)
		errc <- err
	}()
	waitUntil(t, func() bool {
		cmds, err := f.s.Commands(t.Context(), c, sb.ID)
		return err == nil && len(cmds) == 1
	})
	if _, err := f.s.Kill(t.Context(), c, sb.ID); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	wantKind(t, "a command whose sandbox was killed", <-errc, execution.KindSandboxNotRunning)
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}

// TestRunAtProcessLimit: a command the sandbox has no process left for
// is the sandbox's limit (429), not a platform failure.
func TestRunAtProcessLimit(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	sb := f.create(t, c, CreateRequest{})
	_, err := f.s.Run(t.Context(), c, sb.ID, CommandRequest{Argv: []string{"forkfail"}}, nil)
	wantKind(t, "Run at the pids limit", err, execution.KindSandboxLimit)
}

// TestFilesLongPath: a path over PATH_MAX is refused before the agent,
// and the error does not echo it back.
func TestFilesLongPath(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	sb := f.create(t, c, CreateRequest{})
	long := strings.Repeat("a/", 3000)
	_, err := f.s.Stat(t.Context(), c, sb.ID, long)
	wantKind(t, "a 6000-byte path", err, execution.KindInvalidRequest)
	if err != nil && len(err.Error()) > 200 {
		t.Errorf("the error echoes the path: %d bytes", len(err.Error()))
	}
}

// A node that finds another stopped ends that node's running sandboxes
// as node_lost; its paused ones, its own sandboxes and a second call are
// left as they are.
func TestEndNodeSandboxes(t *testing.T) {
	dir := t.TempDir()
	raw := openStore(t, filepath.Join(dir, "vertal.db"))
	a := newFixtureOn(t, raw, dir, "node-a")
	c := caller("acme", config.DefaultPlans()["pro"])
	lost := a.create(t, c, CreateRequest{})
	paused := a.create(t, c, CreateRequest{})
	if _, err := a.s.Pause(t.Context(), c, paused.ID); err != nil {
		t.Fatal(err)
	}
	b := newFixtureOn(t, raw, dir, "node-b")
	own := b.create(t, c, CreateRequest{})
	b.s.EndNodeSandboxes(t.Context(), "node-b") // itself: nothing
	b.s.EndNodeSandboxes(t.Context(), "node-a")
	b.s.EndNodeSandboxes(t.Context(), "node-a") // again: nothing more
	for id, want := range map[string]string{lost.ID: "ended node_lost", paused.ID: "paused ", own.ID: "running "} {
		got, err := b.s.Get(t.Context(), c, id)
		if err != nil || string(got.Status)+" "+got.Reason != want {
			t.Errorf("%s: %s %q, %v; want %s", id, got.Status, got.Reason, err, want)
		}
	}
	if out, err := b.s.Run(t.Context(), c, own.ID, CommandRequest{Cmd: "echo ok"}, nil); err != nil || out.ExitCode != 0 {
		t.Errorf("node-b's own sandbox after: %+v, %v", out, err)
	}
}

// Owner names the node to forward a call to: the one a sandbox runs on,
// or the one that paused it when this node does not see its saved home;
// nobody for this node's own, ended or unseen ones. A holder without an
// address is 503.
func TestOwner(t *testing.T) {
	dir := t.TempDir()
	raw := openStore(t, filepath.Join(dir, "vertal.db"))
	a := newFixtureOn(t, raw, dir, "node-a")
	b := newFixtureOn(t, raw, t.TempDir(), "node-b") // its own data dir
	ctx := t.Context()
	c := caller("acme", config.DefaultPlans()["pro"])
	running := a.create(t, c, CreateRequest{})
	paused := a.create(t, c, CreateRequest{})
	if _, err := a.s.Pause(ctx, c, paused.ID); err != nil {
		t.Fatal(err)
	}
	own := b.create(t, c, CreateRequest{})
	_, err := b.s.Owner(ctx, c, running.ID)
	wantKind(t, "holder without an address", err, execution.KindUnavailable)
	if err := raw.Heartbeat(ctx, "node-a", "http://10.0.0.1:8080", time.Now()); err != nil {
		t.Fatal(err)
	}
	other := caller("globex", config.DefaultPlans()["pro"])
	// Both nodes run on this machine: b not seeing the home is the
	// archive moved away while b is asked.
	rec, err := raw.(Store).Sandbox(ctx, "acme", paused.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(rec.ArchivePath, rec.ArchivePath+".away"); err != nil {
		t.Fatal(err)
	}
	if got, err := b.s.Owner(ctx, c, paused.ID); got != "http://10.0.0.1:8080" || err != nil {
		t.Errorf("paused by a, home out of b's reach: %q, %v", got, err)
	}
	if err := os.Rename(rec.ArchivePath+".away", rec.ArchivePath); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		f    *fixture
		c    execution.Caller
		id   string
		want string
	}{
		{"running on a, asked on b", b, c, running.ID, "http://10.0.0.1:8080"},
		{"paused by a, home in b's reach (a shared data dir)", b, c, paused.ID, ""},
		{"b's own", b, c, own.ID, ""},
		{"live on a, asked on a", a, c, running.ID, ""},
		{"paused, home in a's reach", a, c, paused.ID, ""},
		{"another tenant's", b, other, running.ID, ""},
		{"unknown", b, c, "sbx_00000000000000000000000000000000", ""},
	} {
		if got, err := tc.f.s.Owner(ctx, tc.c, tc.id); got != tc.want || err != nil {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := a.s.Kill(ctx, c, running.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := b.s.Owner(ctx, c, running.ID); got != "" || err != nil {
		t.Errorf("ended: %q, %v; want this node to answer", got, err)
	}
}

// TestOutputPaced: the server relays a sandbox's output at its output
// rate; a command that writes as fast as it can is read no faster, so it
// cannot spend the server's CPU for it.
func TestOutputPaced(t *testing.T) {
	f := newFixture(t)
	f.s.opts.OutputRate = 4000 // bytes a second; the burst (4 s of it) is below one agent chunk, so one chunk
	c := caller("acme", freePlan())
	sb := f.create(t, c, CreateRequest{})
	const total = 2 * 200000
	cmd, err := f.s.StartCommand(t.Context(), c, sb.ID, CommandRequest{Cmd: "big 200000", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	relayed := 0
	_ = f.s.Events(ctx, c, sb.ID, cmd.PID, 0, func(e Event) error { relayed += len(e.Data); return nil })
	// At most the burst, the rate over the time waited and one frame.
	if most := 32<<10 + 4000*2 + 1000; relayed == 0 || relayed > most {
		t.Errorf("relayed %d of %d bytes in a second, want 1..%d", relayed, total, most)
	}
	if _, err := f.s.Kill(t.Context(), c, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestUnresponsiveAgentEnds: a reply that times out, on any call, ends
// the sandbox as error, and gives its memory back.
func TestUnresponsiveAgentEnds(t *testing.T) {
	f := newFixture(t)
	f.s.opts.MemoryBudget = (512 + 256) << 20 // one pro sandbox
	c := caller("acme", config.DefaultPlans()["pro"])
	sb := f.create(t, c, CreateRequest{})
	f.starter.last().ag.stall()
	waitUntil(t, func() bool {
		got, err := f.s.Get(t.Context(), c, sb.ID)
		return err == nil && got.Status == StatusEnded && got.Reason == ReasonError
	})
	if got, _ := f.s.Get(t.Context(), c, sb.ID); !strings.Contains(got.Message, "stopped answering") {
		t.Errorf("message %q", got.Message)
	}
	if _, err := f.s.Create(t.Context(), c, "", CreateRequest{}); err != nil {
		t.Errorf("a create after it ended (its memory given back): %v", err)
	}
}

// TestLogsBoundedPerSandbox: the commands' logs of one sandbox stay
// within maxBoxLogBytes taken together, however many commands log.
func TestLogsBoundedPerSandbox(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", config.DefaultPlans()["pro"])
	ctx := t.Context()
	f.s.opts.OutputRate = 1 << 40 // the fake's frames are small; the pace is not what this tests
	sb := f.create(t, c, CreateRequest{})
	b := f.s.liveBox(sb.ID)
	var last Command
	for range 20 {
		cmd, err := f.s.StartCommand(ctx, c, sb.ID, CommandRequest{Cmd: "big 600000", Background: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.s.Events(ctx, c, sb.ID, cmd.PID, 0, func(Event) error { return nil }); err != nil {
			t.Fatal(err)
		}
		last = cmd
		if n := b.logBytes.Load(); n > maxBoxLogBytes+maxLogBytes {
			t.Fatalf("the sandbox's logs hold %d bytes, over %d", n, maxBoxLogBytes+maxLogBytes)
		}
	}
	cmds, err := f.s.Commands(ctx, c, sb.ID)
	if err != nil || len(cmds) >= 20 || len(cmds) < 2 {
		t.Errorf("%d commands remembered (%v), want fewer than 20 and at least 2", len(cmds), err)
	}
	// The newest keeps its whole log (1 MiB): the finished ones' went first.
	got := 0
	if err := f.s.Events(ctx, c, sb.ID, last.PID, 0, func(e Event) error { got += len(e.Data); return nil }); err != nil || got < 1000*1000 {
		t.Errorf("the newest command's log: %d bytes, %v", got, err)
	}
}

// TestFollowersBounded: a sandbox serves at most maxFollowers event
// streams at once; one more is refused with Retry-After until one closes.
func TestFollowersBounded(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", config.DefaultPlans()["pro"])
	sb := f.create(t, c, CreateRequest{})
	cmd, err := f.s.StartCommand(t.Context(), c, sb.ID, CommandRequest{Cmd: "sleep", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range maxFollowers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = f.s.Events(ctx, c, sb.ID, cmd.PID, 0, func(Event) error { return nil })
		}()
	}
	b := f.s.liveBox(sb.ID)
	waitUntil(t, func() bool { return b.followers.Load() == maxFollowers })
	err = f.s.Events(t.Context(), c, sb.ID, cmd.PID, 0, func(Event) error { return nil })
	wantKind(t, "one stream too many", err, execution.KindRateLimited)
	cancel()
	wg.Wait()
	if n := b.followers.Load(); n != 0 {
		t.Errorf("%d followers counted after all closed", n)
	}
	short, stop := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer stop()
	if err := f.s.Events(short, c, sb.ID, cmd.PID, 0, func(Event) error { return nil }); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a stream after the others closed: %v", err)
	}
}

// TestForegroundTimeoutWithinPlan: a foreground command or a cell holds
// one of the node's slots while it runs, so the plan's max_timeout_s
// bounds it as it bounds an execution: more is refused before anything
// runs or is counted, and the default is the plan's maximum when that is
// lower than 60 s.
func TestForegroundTimeoutWithinPlan(t *testing.T) {
	f := newFixture(t)
	p := freePlan()
	p.MaxTimeoutS = 1
	c := caller("acme", p)
	ctx := t.Context()
	sb := f.create(t, c, CreateRequest{})
	created := f.used(t, "acme") // the create counts one
	_, err := f.s.Run(ctx, c, sb.ID, CommandRequest{Cmd: "echo hi", TimeoutS: 2}, nil)
	wantKind(t, "a command's timeout_s past the plan's", err, execution.KindInvalidTimeout)
	_, err = f.s.RunCode(ctx, c, sb.ID, RunCodeRequest{Code: "1", Language: "python", TimeoutS: 2}, nil)
	wantKind(t, "a cell's timeout_s past the plan's", err, execution.KindInvalidTimeout)
	if n := f.used(t, "acme"); n != created {
		t.Errorf("refused runs were counted: %d executions after the create's %d", n, created)
	}
	// No timeout_s: the plan's 1 s, not 60.
	res, err := f.s.Run(ctx, c, sb.ID, CommandRequest{Cmd: "sleep"}, nil)
	if err != nil || res.Status != "timed_out" {
		t.Fatalf("a command with no timeout_s on a 1 s plan = %+v, %v; want timed_out", res, err)
	}
	// A background command is not bounded by it.
	if _, err := f.s.StartCommand(ctx, c, sb.ID, CommandRequest{Cmd: "sleep", TimeoutS: 30}); err != nil {
		t.Errorf("a background command with timeout_s 30 on a 1 s plan: %v", err)
	}
}

// TestRunCutShortByOwnerCounts: a command the tenant's own pause or kill
// cuts short stays counted (else pausing in the middle of every run makes
// every run free); one cut short by the server stopping is given back.
func TestRunCutShortByOwnerCounts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		end     func(f *fixture, c execution.Caller, id string) error
		counted bool
	}{
		{"pause", func(f *fixture, c execution.Caller, id string) error {
			_, err := f.s.Pause(t.Context(), c, id)
			return err
		}, true},
		{"kill", func(f *fixture, c execution.Caller, id string) error {
			_, err := f.s.Kill(t.Context(), c, id)
			return err
		}, true},
		{"server stop", func(f *fixture, c execution.Caller, id string) error { return f.s.Shutdown(t.Context()) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			c := caller("acme", freePlan())
			sb := f.create(t, c, CreateRequest{})
			before := f.used(t, "acme")
			done := make(chan error, 1)
			go func() {
				_, err := f.s.Run(t.Context(), c, sb.ID, CommandRequest{Cmd: "hang", TimeoutS: 10}, nil)
				done <- err
			}()
			for f.used(t, "acme") == before { // reserved: the command is under way
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
			if err := tc.end(f, c, sb.ID); err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the command did not end with its sandbox")
			}
			wantKind(t, "the command cut short", err, execution.KindSandboxNotRunning)
			want := before
			if tc.counted {
				want++
			}
			if got := f.used(t, "acme"); got != want {
				t.Errorf("executions after the command = %d, want %d (counted: %v); error %v", got, want, tc.counted, err)
			}
		})
	}
}
