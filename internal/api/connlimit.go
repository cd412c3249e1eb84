package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// ConnLimits bound the connections the API listener keeps open. Without
// them, idle keep-alive connections that never send a key, or connections
// that never finish their request header, can use up the server's file
// descriptors and the places of callers that have a key.
//
// A connection is unauthenticated until a request on it has passed the
// key check (or a session's, or the edge secret's); from then on it is
// the caller's until it closes. Unauthenticated connections are bounded
// per network prefix (an IPv4 /24, an IPv6 /64: what one client can
// cheaply hold) and in total. A new connection over one of those caps, or
// over Max, takes the place of the oldest unauthenticated one that is not
// running a request (in its own prefix when that prefix is full, else in
// the prefix holding the most; within the prefix, of the address holding
// the most), which is closed. So a flood can only push its own
// connections out.
//
// An authenticated connection belongs to the tenant whose key (or
// session) authenticated it; one tenant holds at most PerTenant of them,
// so a tenant's newest connection takes the place of its own idle one, or
// its request is refused. When the total is reached and no idle
// unauthenticated connection is left, a newcomer takes the place of an
// idle authenticated connection of the biggest holder (the tenant or
// address group holding the most connections): one tenant, or one
// attacker with a /64 of addresses, cannot hold every place. Only when
// there is none of either is the newcomer refused.
type ConnLimits struct {
	// Max is the most connections open at once, from all clients.
	Max int
	// PerAddr is the most open at once from one client address group
	// (an IPv4 address, an IPv6 /64: a host is given a /64, so its
	// addresses are one client; IPv4-mapped IPv6 counts as IPv4); 0
	// means no per-address cap.
	PerAddr int
	// PerTenant is the most authenticated connections one tenant holds
	// at once; 0 means no per-tenant cap.
	PerTenant int
	// MaxUnauth is the most unauthenticated connections open at once; 0
	// turns this cap off, and with it the eviction at Max.
	MaxUnauth int
	// UnauthPerPrefix is the most unauthenticated connections open at once
	// from one IPv4 /24 or IPv6 /64; 0 means no per-prefix cap.
	UnauthPerPrefix int
	// Proxies are the peers (a reverse proxy's addresses) whose
	// connections carry many clients: they are exempt from PerAddr and
	// from the unauthenticated caps, and count only against Max.
	Proxies []netip.Prefix
	// Logger receives one line per burst of refusals; nil discards.
	Logger *slog.Logger
	// Metrics counts refusals and open connections; may be nil.
	Metrics *Metrics
}

// maxRefusing bounds the goroutines that answer refused connections;
// beyond it a refused connection is closed without an answer.
const maxRefusing = 64

// ConnLimiter applies ConnLimits to a listener. Its Listener counts the
// connections; ConnContext and Handler, set on the http.Server that serves
// that listener, let the API mark a connection authenticated and tell
// which connections are running a request.
type ConnLimiter struct {
	o        ConnLimits
	refusing chan struct{}

	mu         sync.Mutex
	open       int
	accepted   uint64               // connections so far, to order them
	byAddr     map[netip.Prefix]int // by address group (groupOf)
	unauth     int
	authed     map[*limitedConn]struct{}       // authenticated, not a proxy's
	byTenant   map[string]int                  // authenticated, by tenant
	byPrefix   map[netip.Prefix][]*limitedConn // unauthenticated, oldest first
	refused    int                             // since the last log line
	evicted    int                             // since the last log line
	lastLogged time.Time                       // of a refusal or eviction
	// stall is how long an unauthenticated connection's request may run
	// before the connection may be taken for a newcomer anyway: a form
	// whose body never comes (POST /login with a Content-Length it never
	// sends) must not hold its place until the read timeout.
	stall time.Duration
}

// unauthStall is ConnLimiter.stall: unauthenticated requests (pages,
// sign-in forms, /health) answer in well under it.
const unauthStall = 5 * time.Second

// NewConnLimiter returns a limiter for o.
func NewConnLimiter(o ConnLimits) *ConnLimiter {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &ConnLimiter{o: o, byAddr: map[netip.Prefix]int{}, byPrefix: map[netip.Prefix][]*limitedConn{},
		authed: map[*limitedConn]struct{}{}, byTenant: map[string]int{},
		refusing: make(chan struct{}, maxRefusing), stall: unauthStall}
}

// LimitListener wraps ln so that a connection over the limits is answered
// with a 503 in the API's error shape and closed, instead of being
// served. Accepted connections count until they are closed. Without the
// limiter's ConnContext on the server, no connection is ever authenticated.
func LimitListener(ln net.Listener, o ConnLimits) net.Listener {
	return NewConnLimiter(o).Listener(ln)
}

// Listener wraps ln with the limits.
func (l *ConnLimiter) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, l: l}
}

type connKey struct{}

// ConnContext is the http.Server hook that makes the connection reachable
// from its requests.
func (l *ConnLimiter) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitedConn); ok && lc.l == l {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// Handler wraps h so that a connection running a request is never taken
// for a newcomer: its answer is under way.
func (l *ConnLimiter) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(connKey{}).(*limitedConn); ok {
			l.mu.Lock()
			if c.busy == 0 {
				c.busySince = time.Now()
			}
			c.busy++
			l.mu.Unlock()
			defer func() {
				l.mu.Lock()
				if c.busy--; c.busy == 0 {
					c.idleSince = time.Now()
				}
				l.mu.Unlock()
			}()
		}
		h.ServeHTTP(w, r)
	})
}

// authenticatedConn marks the connection of a request that passed the
// edge secret's check: it leaves the unauthenticated caps and belongs to
// no tenant (the edge carries many).
func authenticatedConn(ctx context.Context) {
	if c, ok := ctx.Value(connKey{}).(*limitedConn); ok {
		_ = c.l.authenticate(c, "")
	}
}

// tenantConn marks the connection of a request that passed the key check
// (or a session's) for tenant: it leaves the unauthenticated caps and
// counts against the tenant's. Over PerTenant, it takes the place of the
// tenant's own idle connection that has been idle longest; with none, the
// request is refused with KindOverloaded and the connection closes after
// the answer. A connection belongs to the first tenant that authenticated
// on it.
func tenantConn(w http.ResponseWriter, r *http.Request, tenant string) error {
	c, ok := r.Context().Value(connKey{}).(*limitedConn)
	if !ok {
		return nil
	}
	if err := c.l.authenticate(c, tenant); err != nil {
		w.Header().Set("Connection", "close")
		return err
	}
	return nil
}

type limitListener struct {
	net.Listener
	l *ConnLimiter
}

func (ll *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ll.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := ll.l.newConn(c)
		why, victims := ll.l.admit(lc)
		for _, v := range victims {
			v.Conn.Close()
		}
		if why != "" {
			ll.l.refuse(c, why)
			continue
		}
		return lc, nil
	}
}

// newConn is c, accepted, before admit counts it.
func (l *ConnLimiter) newConn(c net.Conn) *limitedConn {
	a := remoteAddr(c)
	return &limitedConn{Conn: c, l: l, addr: a, prefix: prefixOf(a), group: groupOf(a), idleSince: time.Now()}
}

// prefixOf is the network a client holds addresses in cheaply.
func prefixOf(a netip.Addr) netip.Prefix { return network(a, 24) }

// groupOf is the address group the per-address cap counts: an IPv4
// address, or the IPv6 /64 it is in (a host is routinely given a whole
// /64, so its addresses are one client's). a is unmapped: IPv4-mapped
// IPv6 is IPv4.
func groupOf(a netip.Addr) netip.Prefix { return network(a, 32) }

// network is a's IPv4 /v4bits, or its IPv6 /64.
func network(a netip.Addr, v4bits int) netip.Prefix {
	bits := 64
	if a.Is4() {
		bits = v4bits
	}
	p, _ := a.Prefix(bits)
	return p
}

func (l *ConnLimiter) proxy(a netip.Addr) bool {
	for _, p := range l.o.Proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// admit counts c, after making room by taking the places of idle
// unauthenticated connections (returned, to be closed outside the lock),
// or says why it is refused.
func (l *ConnLimiter) admit(c *limitedConn) (why string, victims []*limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.trusted = l.proxy(c.addr)
	l.accepted++
	c.seq = l.accepted
	// evict makes room under a cap: from prefix p, or when p is invalid
	// from the prefix holding the most (of those, the one whose idle
	// connection is oldest).
	evict := func(p netip.Prefix) bool {
		var v *limitedConn
		if p.IsValid() {
			v = l.idle(p)
		} else {
			most := 0
			for q, cs := range l.byPrefix {
				if w := l.idle(q); w != nil && (len(cs) > most || len(cs) == most && w.seq < v.seq) {
					v, most = w, len(cs)
				}
			}
		}
		if v == nil {
			return false
		}
		l.forget(v)
		victims = append(victims, v)
		return true
	}
	switch {
	case !c.trusted && l.o.PerAddr > 0 && l.byAddr[c.group] >= l.o.PerAddr:
		why = "per_address"
	case !c.trusted && l.o.UnauthPerPrefix > 0 && len(l.byPrefix[c.prefix]) >= l.o.UnauthPerPrefix && !evict(c.prefix):
		why = "per_prefix"
	case !c.trusted && l.o.MaxUnauth > 0 && l.unauth >= l.o.MaxUnauth && !evict(netip.Prefix{}):
		why = "unauthenticated"
	case l.open >= l.o.Max && (l.o.MaxUnauth == 0 || !evict(netip.Prefix{})) && !l.evictHolder(&victims):
		why = "total"
	}
	if n := len(victims); n > 0 {
		l.evicted += n
		l.o.Metrics.observeEvictedConnections(n)
	}
	if why == "" {
		l.open++
		c.counted = true
		if !c.trusted {
			l.byAddr[c.group]++
			l.unauth++
			l.byPrefix[c.prefix] = append(l.byPrefix[c.prefix], c)
		}
		l.o.Metrics.setOpenConnections(l.open)
	} else {
		l.refused++
		l.o.Metrics.observeRefusedConnection(why)
	}
	if now := time.Now(); (l.refused > 0 || l.evicted > 0) && now.Sub(l.lastLogged) >= 10*time.Second {
		l.o.Logger.Warn("connections over the limits", "refused", l.refused, "evicted", l.evicted, "last_refusal", why,
			"open", l.open, "unauthenticated", l.unauth, "max_conns", l.o.Max, "max_conns_per_ip", l.o.PerAddr, "max_conns_per_tenant", l.o.PerTenant,
			"max_unauth_conns", l.o.MaxUnauth, "max_unauth_conns_per_prefix", l.o.UnauthPerPrefix)
		l.refused, l.evicted, l.lastLogged = 0, 0, now
	}
	return why, victims
}

// idle is the unauthenticated connection of p to close for a newcomer,
// or nil: one not running a request, from the address of p holding the
// most, the oldest of those. So the neighbours of a flood in its prefix
// keep their few connections while the flood's addresses hold more. With
// none idle, the one whose request has run longest past stall.
func (l *ConnLimiter) idle(p netip.Prefix) *limitedConn {
	cs := l.byPrefix[p]
	held := make(map[netip.Addr]int, len(cs))
	for _, c := range cs {
		held[c.addr]++
	}
	var v *limitedConn
	for _, c := range cs { // oldest first
		if c.busy == 0 && (v == nil || held[c.addr] > held[v.addr]) {
			v = c
		}
	}
	if v != nil {
		return v
	}
	// None idle: a request that has run past stall without passing a
	// check is a stalled form or page, not an answer under way.
	now := time.Now()
	for _, c := range cs {
		if now.Sub(c.busySince) >= l.stall && (v == nil || c.busySince.Before(v.busySince)) {
			v = c
		}
	}
	return v
}

// evictHolder makes room at the total by taking the place of an
// authenticated connection not running a request, of the biggest holder:
// the tenant or the address group holding the most connections (of
// those, the connection idle longest). It reports whether it found one.
func (l *ConnLimiter) evictHolder(victims *[]*limitedConn) bool {
	var v *limitedConn
	most := 0
	for c := range l.authed {
		if c.busy > 0 {
			continue
		}
		held := l.byAddr[c.group]
		if c.tenant != "" {
			held = max(held, l.byTenant[c.tenant])
		}
		if v == nil || held > most || held == most && c.idleSince.Before(v.idleSince) {
			v, most = c, held
		}
	}
	if v == nil {
		return false
	}
	l.forget(v)
	*victims = append(*victims, v)
	return true
}

// forget gives c's places back; it is called once per connection, when
// it closes or is taken for a newcomer.
func (l *ConnLimiter) forget(c *limitedConn) {
	if !c.counted {
		return
	}
	c.counted = false
	l.open--
	if !c.trusted {
		if l.byAddr[c.group]--; l.byAddr[c.group] <= 0 {
			delete(l.byAddr, c.group)
		}
		if c.authed {
			delete(l.authed, c)
			if c.tenant != "" {
				if l.byTenant[c.tenant]--; l.byTenant[c.tenant] <= 0 {
					delete(l.byTenant, c.tenant)
				}
			}
		} else {
			l.leaveUnauth(c)
		}
	}
	l.o.Metrics.setOpenConnections(l.open)
}

// authenticate takes c out of the unauthenticated caps, for tenant (""
// for none), after making room under PerTenant; it closes the connection
// it takes the place of.
func (l *ConnLimiter) authenticate(c *limitedConn, tenant string) error {
	var victim *limitedConn
	defer func() {
		if victim != nil {
			victim.Conn.Close()
		}
	}()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.counted || c.authed || c.trusted {
		return nil
	}
	if tenant != "" && l.o.PerTenant > 0 && l.byTenant[tenant] >= l.o.PerTenant {
		for o := range l.authed {
			if o.tenant == tenant && o.busy == 0 && (victim == nil || o.idleSince.Before(victim.idleSince)) {
				victim = o
			}
		}
		if victim == nil {
			l.refused++
			l.o.Metrics.observeRefusedConnection("per_tenant")
			return errorf(KindOverloaded, "too many open connections for your account (at most %d); reuse or close them", l.o.PerTenant)
		}
		l.forget(victim)
		l.evicted++
		l.o.Metrics.observeEvictedConnections(1)
	}
	l.leaveUnauth(c)
	c.authed, c.tenant = true, tenant
	l.authed[c] = struct{}{}
	if tenant != "" {
		l.byTenant[tenant]++
	}
	return nil
}

// leaveUnauth takes c out of the unauthenticated caps.
func (l *ConnLimiter) leaveUnauth(c *limitedConn) {
	l.unauth--
	cs := l.byPrefix[c.prefix]
	for i, x := range cs {
		if x == c {
			cs = append(cs[:i:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(l.byPrefix, c.prefix)
	} else {
		l.byPrefix[c.prefix] = cs
	}
}

func (l *ConnLimiter) release(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forget(c)
}

// refuse answers c with a 503 and closes it, off the accept loop. The
// request is read briefly after the answer so that closing does not reset
// the connection before the client has read it.
func (l *ConnLimiter) refuse(c net.Conn, why string) {
	select {
	case l.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	go func() {
		defer func() { <-l.refusing }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		msg := "the server has too many open connections; try again shortly"
		if why == "per_address" {
			msg = fmt.Sprintf("too many open connections from your address (at most %d); reuse or close them", l.o.PerAddr)
		}
		if _, err := io.WriteString(c, overloadedResponse(msg)); err != nil {
			return
		}
		if tc, ok := c.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}()
}

// overloadedResponse is a whole HTTP/1.1 503 answer in the error shape.
func overloadedResponse(msg string) string {
	id := newRequestID()
	body, _ := json.Marshal(wire.Error{Error: wire.ErrorDetail{Code: kinds[KindOverloaded].code, Message: msg}, RequestID: id})
	return fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nX-Request-ID: %s\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s\n",
		http.StatusServiceUnavailable, http.StatusText(http.StatusServiceUnavailable), id, len(body)+1, body)
}

// remoteAddr is c's peer address, IPv4-mapped IPv6 unmapped.
func remoteAddr(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	return ap.Addr().Unmap()
}

// limitedConn gives its places back once, on the first Close. Its other
// fields are guarded by its limiter's mutex.
type limitedConn struct {
	net.Conn
	l       *ConnLimiter
	addr    netip.Addr
	prefix  netip.Prefix // for the unauthenticated caps
	group   netip.Prefix // for the per-address cap
	seq     uint64       // order of acceptance
	trusted bool         // a proxy's: never unauthenticated
	counted bool         // holds its places
	authed  bool         // out of the unauthenticated caps
	tenant  string       // whose it is, once authed ("" for none)
	busy    int          // requests running on it
	// busySince is when its running requests began (busy went from 0);
	// idleSince when they last ended (or it was accepted).
	busySince time.Time
	idleSince time.Time
	once      sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}
