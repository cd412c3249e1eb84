package sandboxes

import (
	"fmt"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
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
		!warm.Deadline.Equal(f.clock.Now().Add(warmMaxIdle+deadlineGrace)) {
		t.Errorf("pre-started spec %+v", warm)
	}
	if env := lives()[w].ag.getEnv(); env != nil {
		t.Errorf("a pre-started sandbox has an environment before the hand-over: %v", env)
	}

	f.clock.Add(30 * time.Second)
	sb := f.create(t, caller("globex", pro), CreateRequest{TimeoutS: 120, Env: map[string]string{"K": "v"},
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

	// Near their deadline they are not handed over.
	f.clock.Add(warmMaxIdle - warmMargin)
	before := f.starter.count()
	sb = f.create(t, caller("umbrella", pro), CreateRequest{})
	for _, sp := range specs()[:before] {
		if sb.ID == sp.ID {
			t.Errorf("a sandbox %v from its deadline was handed over", warmMargin)
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
	pro := config.DefaultPlans()["pro"]
	f.s.opts.WarmPlans = []config.Plan{pro}
	f.s.opts.MemoryBudget = (512 + 256) << 20 // one pro sandbox
	if err := f.s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, f, 1)
	if specs()[0].Limits.MemoryBytes != (512+256)<<20 {
		t.Fatalf("pre-started %+v; want the pro plan's", specs()[0].Limits)
	}
	// A free sandbox needs the room the pro one holds: it gets it.
	sb := f.create(t, caller("acme", freePlan()), CreateRequest{})
	if !lives()[0].discarded.Load() || sb.ID == specs()[0].ID {
		t.Errorf("the waiting pro sandbox was not discarded for a free create")
	}
	if _, err := f.s.Kill(t.Context(), caller("acme", freePlan()), sb.ID); err != nil {
		t.Fatal(err)
	}
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
