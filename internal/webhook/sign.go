package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// DefaultTolerance is how far a signature's timestamp may be from the
// receiver's clock when Verify is given no tolerance.
const DefaultTolerance = 5 * time.Minute

// maxTimestampDigits bounds t= so that every verifier (Go, Python) reads
// the same number: 12 digits last until the year 33658.
const maxTimestampDigits = 12

// Sign returns the Vertal-Signature header value for body sent at t:
// "t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>". The key
// is the tenant's secret exactly as GET /v1/webhook-secret shows it, the
// whsec_ prefix included.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + signature(secret, ts, body)
}

func signature(secret []byte, ts string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Verify checks a Vertal-Signature header against the raw body: the header
// must parse, one of its v1= values must be the signature (several are
// accepted, so that a receiver can be sent both while a secret rotates),
// and its timestamp must be within tolerance of now either way (<= 0 means
// DefaultTolerance). The signature is checked before the time, so ErrTooOld
// and ErrTooNew only ever describe an authentic message.
//
// The error is an *Error of kind ErrMalformedSignature,
// ErrSignatureMismatch, ErrTooOld or ErrTooNew.
func Verify(secret, header string, body []byte, tolerance time.Duration, now time.Time) error {
	ts, sigs, err := parseSignature(header)
	if err != nil {
		return err
	}
	want := []byte(signature([]byte(secret), ts, body))
	match := false
	for _, s := range sigs {
		// Every value is compared, in constant time, so the time taken
		// says nothing about which one matched or how much of it.
		if hmac.Equal(want, []byte(s)) {
			match = true
		}
	}
	if !match {
		return newError(ErrSignatureMismatch, nil, "no v1 signature in the Vertal-Signature header matches the body for this secret")
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	sec, _ := strconv.ParseInt(ts, 10, 64) // parseSignature checked the digits
	age := now.Sub(time.Unix(sec, 0))
	switch {
	case age > tolerance:
		return newError(ErrTooOld, nil, "the signature's timestamp %s is %s old, more than the tolerance of %s", ts, age.Round(time.Second), tolerance)
	case age < -tolerance:
		return newError(ErrTooNew, nil, "the signature's timestamp %s is %s in the future, more than the tolerance of %s", ts, (-age).Round(time.Second), tolerance)
	}
	return nil
}

// parseSignature reads "t=<digits>,v1=<hex>[,v1=<hex>...]": items are
// separated by commas, spaces and tabs around an item are ignored, t must
// appear once, at least one v1 must appear, and other schemes (v0=...)
// are skipped so that a later scheme can be added beside v1.
func parseSignature(header string) (ts string, sigs []string, err error) {
	malformed := func(why string) (string, []string, error) {
		return "", nil, newError(ErrMalformedSignature, nil, "malformed Vertal-Signature header: %s", why)
	}
	if strings.TrimSpace(header) == "" {
		return malformed("it is empty")
	}
	seenT := false
	for item := range strings.SplitSeq(header, ",") {
		key, value, ok := strings.Cut(strings.Trim(item, " \t"), "=")
		if !ok || key == "" {
			return malformed("every item must be key=value")
		}
		switch key {
		case "t":
			if seenT {
				return malformed("t appears more than once")
			}
			if !isDigits(value) {
				return malformed("t must be unix seconds, 1 to 12 digits")
			}
			seenT, ts = true, value
		case "v1":
			sigs = append(sigs, value)
		}
	}
	switch {
	case !seenT:
		return malformed("no t= timestamp")
	case len(sigs) == 0:
		return malformed("no v1= signature")
	}
	return ts, sigs, nil
}

func isDigits(s string) bool {
	if s == "" || len(s) > maxTimestampDigits {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
