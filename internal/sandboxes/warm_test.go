package sandboxes

import (
	"fmt"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// warmFixture is a fixture whose service keeps size sandboxes warm.
func warmFixture(t *testing.T, size int) *fixture {
	t.Helper()
	f := newFixture(t)
	f.s.opts.Warm = size
	f.s.warm = newWarmPool(f.s, size)
	t.Cleanup(f.s.warm.close)
	return f
}

// waitWarm waits until the pool has ready sandboxes waiting and none
// starting.
func waitWarm(t *testing.T, f *fixture, ready int) {
	t.Helper()
	for range 500 {
		if st := f.s.warm.stats(); st.Ready == ready && st.Starting == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("the pool has %+v; want %d ready", f.s.warm.stats(), ready)
}

// TestWarmCreate: the first create of a key starts cold and one behind
// it; the next takes that one, under its name, with its own environment,
// deadline and metering, and another starts behind it.
func TestWarmCreate(t *testing.T) {
	f := warmFixture(t, 1)
	specs := func() []engine.LiveSpec { s, _ := f.starter.all(); return s }
	lives := func() []*fakeLive { _, l := f.starter.all(); return l }
	pro := config.DefaultPlans()["pro"]
	first := f.create(t, caller("acme", pro), CreateRequest{TimeoutS: 60})
	waitWarm(t, f, 1)
	if n := f.starter.count(); n != 2 {
		t.Fatalf("%d sandboxes started; want the cold one and one pre-started", n)
	}
	// The pre-start may begin before the cold start: they race.
	w := 0
	if specs()[0].ID == first.ID {
		w = 1
	}
	warm := specs()[w]
	if warm.ID == first.ID || warm.Limits.Lifetime != time.Hour+deadlineGrace+warmMaxIdle ||
		!warm.Deadline.Equal(f.clock.Now().Add(warmMaxIdle+warmMargin+deadlineGrace)) {
		t.Errorf("pre-started spec %+v", warm)
	}
	if env := lives()[w].ag.getEnv(); env != nil {
		t.Errorf("a pre-started sandbox has an environment before the hand-over: %v", env)
	}

	f.clock.Add(30 * time.Second)
	sb := f.create(t, caller("globex", pro), CreateRequest{TimeoutS: 120, Env: map[string]string{"K": "v", "HOME": "/elsewhere"},
		Files: []File{{Path: "in.txt", Content: []byte("x")}}})
	if sb.ID != warm.ID {
		t.Fatalf("the second create is %s; want the pre-started %s", sb.ID, warm.ID)
	}
	ag := lives()[w].ag
	if fmt.Sprint(ag.getEnv()) != "map[K:v]" || !ag.getDeadline().Equal(sb.ExpiresAt.Add(deadlineGrace)) || string(ag.files["/home/user/in.txt"]) != "x" {
		t.Errorf("hand-over: env %v, deadline %v (want %v), files %v", ag.getEnv(), ag.getDeadline(), sb.ExpiresAt.Add(deadlineGrace), ag.files)
	}
	if !sb.ExpiresAt.Equal(f.clock.Now().Add(2 * time.Minute)) {
		t.Errorf("expires_at %v; want two minutes from the create", sb.ExpiresAt)
	}
	// The pre-start's CPU (the fake's 0.5 s) is not the tenant's.
	got, err := f.s.Get(t.Context(), caller("globex", pro), sb.ID)
	if err != nil || got.CPUSeconds != 0 || got.AliveSeconds != 0 {
		t.Errorf("Get = %+v, %v; want no CPU or alive time yet", got, err)
	}
	waitWarm(t, f, 1)
	if st := f.s.warm.stats(); st.Hits != 1 || st.Misses != 1 {
		t.Errorf("stats %+v; want one hit and one miss", st)
	}
	// Another tenant never gets the same one: the third create takes the
	// third sandbox.
	third := f.create(t, caller("initech", pro), CreateRequest{})
	if third.ID != specs()[2].ID || third.ID == sb.ID {
		t.Errorf("third create %s; specs %v", third.ID, specs())
	}
}

// TestWarmKeys: a pre-started sandbox serves only its own image and plan
// limits; a sandbox that dies while it waits is replaced; one too close
// to its deadline is not handed over.
func TestWarmKeys(t *testing.T) {
	f := warmFixture(t, 1)
	specs := func() []engine.LiveSpec { s, _ := f.starter.all(); return s }
	lives := func() []*fakeLive { _, l := f.starter.all(); return l }
	pro, free := config.DefaultPlans()["pro"], freePlan()
	first := f.create(t, caller("acme", pro), CreateRequest{})
	waitWarm(t, f, 1)
	sb := f.create(t, caller("globex", free), CreateRequest{})
	for _, sp := range specs()[:2] {
		if sp.ID != first.ID && sb.ID == sp.ID {
			t.Fatal("a free plan's create took the pro plan's pre-started sandbox")
		}
	}
	waitWarm(t, f, 2)
	sb = f.create(t, caller("initech", pro), CreateRequest{Image: "data"})
	for _, sp := range specs()[:3] {
		if sb.ID == sp.ID {
			t.Fatal("a data-image create took a default-image sandbox")
		}
	}
	waitWarm(t, f, 3)

	// The pro one dies waiting: it is discarded and replaced.
	n := f.starter.count()
	var dead *fakeLive
	for i, sp := range specs() {
		if sp.ID != first.ID && sp.Limits.MemoryBytes == (512+256)<<20 && sp.Image == "/images/default/rootfs" {
			dead = lives()[i]
		}
	}
	dead.die()
	for range 500 {
		if f.starter.count() > n {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	waitWarm(t, f, 3)
	if !dead.discarded.Load() {
		t.Error("a pre-started sandbox that died was not discarded")
	}

	// At the end of their wait they are not handed over, and are
	// discarded, not only forgotten: they hold memory and mounts.
	f.clock.Add(warmMaxIdle)
	before, old := specs(), lives()
	sb = f.create(t, caller("umbrella", pro), CreateRequest{})
	for i, sp := range before {
		if sb.ID == sp.ID {
			t.Errorf("a sandbox at the end of its wait was handed over")
		}
		if sp.Image == "/images/default/rootfs" && sp.Limits.MemoryBytes == (512+256)<<20 && sp.ID != first.ID && !old[i].discarded.Load() {
			t.Errorf("the pro sandbox past its wait (%s) was not discarded", sp.ID)
		}
	}
}

// TestWarmPlansAndBudget: WarmPlans are warm before any create; a create
// that needs the memory of waiting sandboxes gets it; Shutdown discards
// what waits.
func TestWarmPlansAndBudget(t *testing.T) {
	f := warmFixture(t, 1)
	specs := func() []engine.LiveSpec { s, _ := f.starter.all(); return s }
	lives := func() []*fakeLive { _, l := f.starter.all(); return l }
	free, pro := freePlan(), config.DefaultPlans()["pro"]
	f.s.opts.WarmPlans = []config.Plan{free}
	// Room for a waiting free sandbox and a create of its size, not for a
	// pro create beside it: a pre-start always leaves room for one create
	// of its own size.
	f.s.opts.MemoryBudget = 800 << 20
	if err := f.s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, f, 1)
	if got := specs()[0].Limits.MemoryBytes; got != limitsFor(free).cgroupBytes() {
		t.Fatalf("pre-started %+v; want the free plan's", specs()[0].Limits)
	}
	// A pro sandbox needs the room the free one holds: it gets it.
	sb := f.create(t, caller("acme", pro), CreateRequest{})
	if !lives()[0].discarded.Load() || sb.ID == specs()[0].ID {
		t.Errorf("the waiting free sandbox was not discarded for a pro create")
	}
	if _, err := f.s.Kill(t.Context(), caller("acme", pro), sb.ID); err != nil {
		t.Fatal(err)
	}
	// The pinned key refills at its next create, or here by hand.
	f.s.warm.fill(warmKey{image: "/images/default/rootfs", version: "v7", lim: limitsFor(free)})
	waitWarm(t, f, 1)
	last := f.starter.last()
	if err := f.s.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !last.discarded.Load() || f.s.warm.stats().Ready != 0 {
		t.Error("Shutdown left a pre-started sandbox")
	}
}

// TestWarmImageRebuilt: sandboxes pre-started on an image that has since
// been rebuilt are never handed over; they are dropped, and a pinned key
// stays pinned at the new version.
func TestWarmImageRebuilt(t *testing.T) {
	f := warmFixture(t, 1)
	specs := func() []engine.LiveSpec { s, _ := f.starter.all(); return s }
	pro := config.DefaultPlans()["pro"]
	f.s.opts.WarmPlans = []config.Plan{pro}
	if err := f.s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, f, 1)
	old := f.starter.last()
	f.s.opts.Image = func(name string) (string, string, string, error) {
		return "/images/default/rootfs", config.DefaultImage, "v8", nil
	}
	sb := f.create(t, caller("acme", pro), CreateRequest{})
	if sb.ID == specs()[0].ID || sb.ImageVersion != "v8" {
		t.Fatalf("a create of v8 took the sandbox pre-started on v7: %+v", sb)
	}
	if !old.discarded.Load() {
		t.Error("the v7 sandbox still waits")
	}
	waitWarm(t, f, 1)
	// Long after the last create the key is still kept warm: it is pinned.
	f.clock.Add(warmKeyTTL + time.Minute)
	n := f.starter.count()
	f.starter.last().die()
	for range 500 {
		if f.starter.count() > n {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	waitWarm(t, f, 1)
}

// TestWarmNeverTurnsACreateAway: a pre-start leaves room for a create of
// its size, so with the budget for two sandboxes and one held, a tenant
// that kills and creates again is never refused, however the pool
// refills behind it, even while a pre-start is under way (and so cannot
// be discarded to make room).
func TestWarmNeverTurnsACreateAway(t *testing.T) {
	f := warmFixture(t, 1)
	pro := config.DefaultPlans()["pro"]
	f.s.opts.MemoryBudget = 2 * (512 + 256) << 20
	f.create(t, caller("bob", pro), CreateRequest{})

	// Pro starts from here on are pre-starts (bob's is done): held.
	gate := make(chan struct{})
	f.starter.gate = func(s engine.LiveSpec) <-chan struct{} {
		if s.Limits.MemoryBytes == limitsFor(pro).cgroupBytes() {
			return gate
		}
		return nil
	}
	f.s.warm.pin(warmKey{image: "/images/default/rootfs", version: "v7", lim: limitsFor(pro)})
	for range 500 {
		f.s.memMu.Lock()
		held := f.s.memCommitted
		f.s.memMu.Unlock()
		if f.s.warm.stats().Starting == 0 || held == f.s.opts.MemoryBudget {
			break // the pre-start was refused, or holds the room (the bug)
		}
		time.Sleep(2 * time.Millisecond)
	}
	free, err := f.s.Create(t.Context(), caller("carol", freePlan()), "", CreateRequest{})
	close(gate)
	if err != nil {
		t.Fatalf("a create while the pool pre-starts: %v", err)
	}
	if _, err := f.s.Kill(t.Context(), caller("carol", freePlan()), free.ID); err != nil {
		t.Fatal(err)
	}
	sb := f.create(t, caller("alice", pro), CreateRequest{})
	for range 10 {
		if _, err := f.s.Kill(t.Context(), caller("alice", pro), sb.ID); err != nil {
			t.Fatal(err)
		}
		var err error
		if sb, err = f.s.Create(t.Context(), caller("alice", pro), "", CreateRequest{}); err != nil {
			t.Fatalf("create with a slot free: %v", err)
		}
	}
}

// TestWarmNotBurnedByRefusals: a tenant at its cap is refused before a
// pre-started sandbox is taken.
func TestWarmNotBurnedByRefusals(t *testing.T) {
	f := warmFixture(t, 1)
	free := freePlan() // one sandbox at once
	f.create(t, caller("acme", free), CreateRequest{})
	waitWarm(t, f, 1)
	n, hits := f.starter.count(), f.s.warm.stats().Hits
	for range 5 {
		_, err := f.s.Create(t.Context(), caller("acme", free), "", CreateRequest{})
		wantKind(t, "a create past the cap", err, execution.KindSandboxLimit)
	}
	if st := f.s.warm.stats(); st.Ready != 1 || st.Hits != hits || f.starter.count() != n {
		t.Errorf("refused creates used the pool: %+v, %d started (was %d)", st, f.starter.count(), n)
	}
}
