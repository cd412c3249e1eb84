package sandboxes

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// The warm pool keeps sandboxes pre-started for Create, as package pool
// does for executions: a create whose image and plan limits match one
// takes it, and a fresh one starts behind it. A pre-started sandbox is a
// cold one (Service.launch) whose agent runs with no tenant, no
// environment and a short deadline; the hand-over (adopt) sets the
// environment and the sandbox's deadline through the agent. Nothing runs
// in it before the hand-over but the agent, so nothing of it is anyone's.
//
// Which sandboxes wait: Options.Warm for each (image, plan limits) that a
// create asked for in the last warmKeyTTL, and for the default image on
// Options.WarmPlans from the start. They hold their memory limits of
// Options.MemoryBudget; a create that needs the room discards them first.

// warmMaxIdle is how long a pre-started sandbox waits to be taken; then
// the pool discards it and starts the key's next. Its agent's own
// deadline is warmMargin (plus deadlineGrace) later, so one the service
// lost track of (a SIGKILLed server's) never outlives its wait by much,
// and one taken at the end of its wait still gets its new deadline in
// time. Its hard lifetime is the plan's maximum lifetime plus this, so the
// sandbox taken at the end of its wait still has the whole of the plan's
// lifetime.
const warmMaxIdle = 2 * time.Minute

// warmMargin is how long before its agent's deadline a waiting sandbox
// stops being handed over: the hand-over must move the deadline first.
const warmMargin = 15 * time.Second

// warmKeyTTL is how long a key is kept warm after its last create.
const warmKeyTTL = 10 * time.Minute

type warmKey struct {
	image   string // the driver's image
	version string // its version: a rebuilt image's waiting sandboxes are dropped
	lim     Limits
}

// warmBox is one pre-started sandbox.
type warmBox struct {
	id    string // its host-side name, and the id of the sandbox that takes it
	key   warmKey
	b     *box
	until time.Time     // when the pool retires it; its agent's deadline is later
	taken chan struct{} // closed at the hand-over
}

type warmPool struct {
	s    *Service
	size int
	sem  chan struct{} // one pre-start at a time: the host's CPU is the users'

	mu       sync.Mutex
	closed   bool
	ready    map[warmKey][]*warmBox
	starting map[warmKey]int
	asked    map[warmKey]time.Time // the last create; the zero time pins a key (WarmPlans)
	wg       sync.WaitGroup

	hits, misses atomic.Int64
}

func newWarmPool(s *Service, size int) *warmPool {
	return &warmPool{s: s, size: size, sem: make(chan struct{}, 1),
		ready: map[warmKey][]*warmBox{}, starting: map[warmKey]int{}, asked: map[warmKey]time.Time{}}
}

// pin keeps key warm for as long as the service runs.
func (p *warmPool) pin(key warmKey) {
	p.mu.Lock()
	p.asked[key] = time.Time{}
	p.mu.Unlock()
	p.fill(key)
}

// take hands out a pre-started sandbox for key, or nil. The caller starts
// the one behind it (fill) once its own sandbox has its memory, so that a
// pre-start never takes the room a create needs.
func (p *warmPool) take(key warmKey) *warmBox {
	if p.size == 0 {
		return nil
	}
	now := p.s.now()
	var wb *warmBox
	var stale []*warmBox
	p.mu.Lock()
	// The image was rebuilt since its sandboxes started: drop them (a
	// pinned key stays pinned at the new version).
	for k, t := range p.asked {
		if k.image == key.image && k.version != key.version {
			if t.IsZero() && k.lim == key.lim {
				p.asked[key] = t
			}
			delete(p.asked, k)
			stale = append(stale, p.ready[k]...)
			delete(p.ready, k)
		}
	}
	if t, ok := p.asked[key]; !ok || !t.IsZero() {
		p.asked[key] = now
	}
	q := p.ready[key]
	for len(q) > 0 && wb == nil {
		// The oldest first: the newer ones have longer to wait. One past
		// its wait (its retirement is due) is discarded.
		if next := q[0]; now.Before(next.until) {
			wb = next
		} else {
			stale = append(stale, next)
		}
		q = q[1:]
	}
	p.ready[key] = q
	p.mu.Unlock()
	for _, x := range stale {
		p.s.discard(x.b)
	}
	if wb != nil {
		close(wb.taken)
		p.hits.Add(1)
	} else {
		p.misses.Add(1)
	}
	return wb
}

// fill starts pre-started sandboxes until key has its size, if a create
// asked for key lately.
func (p *warmPool) fill(key warmKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.asked[key]
	if p.closed || !ok || (!t.IsZero() && p.s.now().Sub(t) > warmKeyTTL) {
		return
	}
	for n := p.size - len(p.ready[key]) - p.starting[key]; n > 0; n-- {
		p.starting[key]++
		p.wg.Add(1)
		go p.prestart(key)
	}
}

func (p *warmPool) prestart(key warmKey) {
	defer p.wg.Done()
	p.sem <- struct{}{}
	wb, err := p.s.prestart(key)
	<-p.sem
	p.mu.Lock()
	p.starting[key]--
	if err != nil {
		p.mu.Unlock()
		p.s.log.Debug("pre-starting a sandbox", "error", err)
		return
	}
	if _, wanted := p.asked[key]; p.closed || !wanted {
		p.mu.Unlock()
		p.s.discard(wb.b)
		return
	}
	p.ready[key] = append(p.ready[key], wb)
	p.mu.Unlock()
	go p.watch(wb)
}

// watch retires a pre-started sandbox at the end of its wait, or when it
// ends while it waits (a crash), and starts the next.
func (p *warmPool) watch(wb *warmBox) {
	t := time.NewTimer(max(0, wb.until.Sub(p.s.now())))
	defer t.Stop()
	select {
	case <-wb.taken:
		return
	case <-wb.b.live.Done():
	case <-t.C:
	}
	if p.remove(wb) {
		p.s.discard(wb.b)
		p.fill(wb.key)
	}
}

// remove takes wb out of the ready list; false if it was taken.
func (p *warmPool) remove(wb *warmBox) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.ready[wb.key]
	for i, x := range q {
		if x == wb {
			p.ready[wb.key] = append(q[:i:i], q[i+1:]...)
			return true
		}
	}
	return false
}

// drain discards every waiting sandbox, giving their memory back; it
// reports whether there was any.
func (p *warmPool) drain() bool {
	p.mu.Lock()
	var all []*warmBox
	for k, q := range p.ready {
		all = append(all, q...)
		delete(p.ready, k)
	}
	p.mu.Unlock()
	for _, wb := range all {
		p.s.discard(wb.b)
	}
	return len(all) > 0
}

// close discards every waiting sandbox and those still starting.
func (p *warmPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	p.drain()
}

// warmStats is the pool's state, for tests and the bench.
type warmStats struct {
	Ready, Starting int
	Hits, Misses    int64
}

func (p *warmPool) stats() warmStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := warmStats{Hits: p.hits.Load(), Misses: p.misses.Load()}
	for _, q := range p.ready {
		st.Ready += len(q)
	}
	for _, n := range p.starting {
		st.Starting += n
	}
	return st
}

// WriteMetrics writes the warm pool's series in the Prometheus text
// format (api.MetricsWriter).
func (s *Service) WriteMetrics(w io.Writer) {
	st := s.warm.stats()
	for _, m := range []struct {
		name, typ, help string
		val             any
	}{
		{"vertal_sandbox_pool_ready", "gauge", "Sandboxes that stay, pre-started and waiting for a create.", st.Ready},
		{"vertal_sandbox_pool_starting", "gauge", "Sandboxes that stay being pre-started.", st.Starting},
		{"vertal_sandbox_pool_hits_total", "counter", "Creates that took a pre-started sandbox.", st.Hits},
		{"vertal_sandbox_pool_misses_total", "counter", "Creates that started their sandbox cold.", st.Misses},
	} {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %v\n", m.name, m.help, m.name, m.typ, m.name, m.val)
	}
}

// prestart starts one sandbox for key: no tenant, no environment, its
// agent ending it at warmMaxIdle unless a create takes it.
func (s *Service) prestart(key warmKey) (*warmBox, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := newID()
	until := s.now().Add(warmMaxIdle)
	b, err := s.launch(ctx, id, key.lim, key.image, until.Add(warmMargin), warmMaxIdle)
	if err != nil {
		return nil, err
	}
	return &warmBox{id: id, key: key, b: b, until: until, taken: make(chan struct{})}, nil
}

// adopt hands a pre-started sandbox over to rec (whose id is wb.id): its
// environment and deadline, and its metering from now.
func (s *Service) adopt(ctx context.Context, wb *warmBox, rec store.Sandbox) (*box, error) {
	b := wb.b
	if err := s.handOver(ctx, b, rec, parseLimits(rec)); err != nil {
		return nil, err
	}
	if err := b.ag.SetDeadline(ctx, rec.ExpiresAt.Add(deadlineGrace)); err != nil {
		return nil, err
	}
	b.tenant = rec.Tenant
	b.since = s.now()
	b.cpuBase = b.live.Usage().CPUSeconds
	s.log.Debug("handed a pre-started sandbox over", "sandbox_id", rec.ID)
	return b, nil
}
