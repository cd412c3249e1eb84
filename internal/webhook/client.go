package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// Delivery headers and their fixed values.
const (
	HeaderDelivery  = "Vertal-Delivery"
	HeaderEvent     = "Vertal-Event"
	HeaderSignature = "Vertal-Signature"
	EventFinished   = "execution.finished"
	UserAgent       = "VertalRun-Webhook/1"
)

const (
	// DefaultTimeout bounds one attempt: resolving, connecting, sending and
	// reading the answer.
	DefaultTimeout = 10 * time.Second
	// maxResponseBytes of a receiver's answer are read, then discarded; the
	// status is all a delivery keeps.
	maxResponseBytes = 64 << 10
)

// Options configure a Client. The zero value of every field but Guard is a
// usable default.
type Options struct {
	// Guard is the address policy; required.
	Guard *Guard
	// Timeout bounds one attempt; 0 means DefaultTimeout.
	Timeout time.Duration
	// TLSConfig is the base TLS configuration (tests set RootCAs to trust
	// an httptest server); nil means the system roots. ServerName is always
	// set to the URL's host.
	TLSConfig *tls.Config
	// Now is the clock for the signature's timestamp; nil means time.Now.
	Now func() time.Time
}

// Client makes delivery attempts. It is safe for concurrent use.
type Client struct {
	guard   *Guard
	timeout time.Duration
	tls     *tls.Config
	now     func() time.Time
	// dial connects to the pinned address; a net.Dialer with the guard's
	// Control hook. Tests in this package replace it to watch which
	// address is dialed without sending traffic anywhere.
	dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// NewClient returns a Client. It panics without a Guard: delivering without
// the address policy is never what the caller wants.
func NewClient(opts Options) *Client {
	if opts.Guard == nil {
		panic("webhook.NewClient: Options.Guard is nil")
	}
	c := &Client{guard: opts.Guard, timeout: opts.Timeout, tls: opts.TLSConfig, now: opts.Now}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.tls == nil {
		c.tls = &tls.Config{}
	}
	return c
}

// Deliver makes one attempt to POST body to rawURL, signed with secret at
// the attempt's time. It resolves the host once, checks every address,
// and connects to the first one only (so a second DNS answer cannot
// redirect it); redirects are not followed.
//
// status is the receiver's HTTP status, or 0 when no answer came. err is
// nil only for a 2xx answer; otherwise it is an *Error of kind
// ErrInvalidURL, ErrRefused or ErrUnresolvable (nothing was sent) or
// ErrDelivery (a non-2xx answer, a timeout, a connection error), and its
// message can be shown to the tenant as the delivery's last_error.
func (c *Client) Deliver(ctx context.Context, rawURL, deliveryID string, secret, body []byte) (status int, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	target, err := c.guard.CheckURL(ctx, rawURL)
	if err != nil {
		return 0, err
	}
	pinned := target.Addrs[0]

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.URL.String(), bytes.NewReader(body))
	if err != nil {
		return 0, newError(ErrInvalidURL, err, "cannot build a request for this URL")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set(HeaderDelivery, deliveryID)
	req.Header.Set(HeaderEvent, EventFinished)
	req.Header.Set(HeaderSignature, Sign(secret, c.now(), body))

	tlsConf := c.tls.Clone()
	tlsConf.ServerName = target.Host
	transport := &http.Transport{
		// No proxy: a proxy would connect to the host by name, after its
		// own resolution, and the pin would mean nothing.
		Proxy: nil,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			// Whatever address the transport asks for, the pinned one
			// is dialed: the URL's host is never resolved again.
			return c.dialPinned(ctx, network, pinned)
		},
		TLSClientConfig:        tlsConf,
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: maxResponseBytes,
		ResponseHeaderTimeout:  c.timeout,
	}
	defer transport.CloseIdleConnections()
	hc := &http.Client{
		Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}

	resp, err := hc.Do(req)
	if err != nil {
		return 0, c.attemptError(ctx, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
	_ = resp.Body.Close()

	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return resp.StatusCode, nil
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return resp.StatusCode, newError(ErrDelivery, nil, "the receiver answered %d, a redirect, which webhooks do not follow", resp.StatusCode)
	default:
		return resp.StatusCode, newError(ErrDelivery, nil, "the receiver answered %d", resp.StatusCode)
	}
}

// dialPinned connects to addr, refusing it again (in the Control hook,
// before connect) if the guard refuses it or it is not the pinned address.
func (c *Client) dialPinned(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error) {
	if c.dial != nil {
		return c.dial(ctx, network, addr.String())
	}
	d := &net.Dialer{
		Control: func(network, address string, raw syscall.RawConn) error {
			if ap, err := netip.ParseAddrPort(address); err != nil || ap != addr {
				return newError(ErrRefused, err, "the connection went to %s, not the checked address %s", address, addr)
			}
			return c.guard.Control(network, address, raw)
		},
	}
	return d.DialContext(ctx, network, addr.String())
}

// attemptError turns a transport error into the delivery's error.
func (c *Client) attemptError(ctx context.Context, err error) error {
	var we *Error
	if errors.As(err, &we) {
		return we // the guard refused the connection
	}
	// The attempt's context and the transport's header timeout are both
	// the client's timeout; whichever fires first, it is the same answer.
	var ne net.Error
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return newError(ErrDelivery, err, "no answer within %s", c.timeout)
	}
	cause := err
	if ue, ok := err.(*url.Error); ok {
		// *url.Error repeats the method and the URL; the tenant knows both.
		cause = ue.Err
	}
	return newError(ErrDelivery, err, "%v", cause)
}
