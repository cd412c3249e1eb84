package account

import (
	"context"
	"fmt"
	"net"
	"net/smtp"
	"net/url"
	"strings"
	"time"
)

// Mailer sends one plain-text email.
type Mailer interface {
	Send(ctx context.Context, to, subject, body string) error
}

// SMTP is a Mailer over net/smtp: the standard library speaks enough SMTP
// (STARTTLS when offered, PLAIN auth) for a relay, and a verification
// email needs nothing more.
type SMTP struct {
	Addr string // host:port
	From string
	Auth smtp.Auth // nil: no authentication
}

// ParseSMTPURL reads smtp://[user:pass@]host:port?from=addr. Auth is only
// used over TLS or to localhost (net/smtp refuses it otherwise).
func ParseSMTPURL(raw string) (*SMTP, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "smtp" || u.Host == "" {
		return nil, fmt.Errorf("smtp url must look like smtp://[user:pass@]host:port?from=noreply@example.com")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || port == "" {
		return nil, fmt.Errorf("smtp url %q needs host:port", u.Redacted())
	}
	from := u.Query().Get("from")
	if from == "" || !strings.Contains(from, "@") {
		return nil, fmt.Errorf("smtp url %q needs ?from=ADDRESS", u.Redacted())
	}
	m := &SMTP{Addr: net.JoinHostPort(host, port), From: from}
	if u.User != nil {
		pass, _ := u.User.Password()
		m.Auth = smtp.PlainAuth("", u.User.Username(), pass, host)
	}
	return m, nil
}

// Send implements Mailer.
func (m *SMTP) Send(ctx context.Context, to, subject, body string) error {
	if strings.ContainsAny(to+subject, "\r\n") {
		return fmt.Errorf("smtp: header with a line break")
	}
	msg := "From: " + m.From + "\r\nTo: " + to + "\r\nSubject: " + subject +
		"\r\nDate: " + time.Now().UTC().Format(time.RFC1123Z) +
		"\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n" +
		strings.ReplaceAll(body, "\n", "\r\n")
	done := make(chan error, 1)
	go func() { done <- smtp.SendMail(m.Addr, m.Auth, m.From, []string{to}, []byte(msg)) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("smtp: sending to %s: %w", to, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
