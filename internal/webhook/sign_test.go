package webhook_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook/webhooktest"
)

const vectorsPath = "../../sdk/testdata/webhook_vectors.json"

func TestVerifyVectors(t *testing.T) {
	for _, v := range webhooktest.Load(t, vectorsPath) {
		t.Run(v.Name, func(t *testing.T) {
			err := webhook.Verify(v.Secret, v.Header, []byte(v.Body), v.ToleranceDuration(), v.NowTime())
			if got, want := webhooktest.Code(err), v.WantCode(); got != want {
				t.Fatalf("Verify = %q (%v), want %q", got, err, want)
			}
		})
	}
}

// TestSignMatchesVectors: Sign writes exactly the header of the plain valid
// cases (the vectors were computed by another implementation).
func TestSignMatchesVectors(t *testing.T) {
	n := 0
	for _, v := range webhooktest.Load(t, vectorsPath) {
		if !v.Valid || strings.Count(v.Header, ",") != 1 || strings.ContainsAny(v.Header, " \t") || !strings.HasPrefix(v.Header, "t=") {
			continue
		}
		n++
		if got := webhook.Sign([]byte(v.Secret), time.Unix(v.Timestamp, 0), []byte(v.Body)); got != v.Header {
			t.Errorf("%s: Sign = %q, want %q", v.Name, got, v.Header)
		}
	}
	if n == 0 {
		t.Fatal("no plain valid vector to compare Sign with")
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	secret := "whsec_" + strings.Repeat("ab", 32)
	body := []byte(`{"id":"exe_1"}`)
	at := time.Unix(1750000000, 0)
	h := webhook.Sign([]byte(secret), at, body)
	for _, tc := range []struct {
		name   string
		secret string
		body   []byte
		now    time.Time
		tol    time.Duration
		want   error
	}{
		{"same", secret, body, at, time.Minute, nil},
		{"later within", secret, body, at.Add(59 * time.Second), time.Minute, nil},
		{"later beyond", secret, body, at.Add(61 * time.Second), time.Minute, webhook.ErrTooOld},
		{"earlier beyond", secret, body, at.Add(-61 * time.Second), time.Minute, webhook.ErrTooNew},
		{"default tolerance", secret, body, at.Add(4 * time.Minute), 0, nil},
		{"rotated secret", "whsec_" + strings.Repeat("cd", 32), body, at, time.Minute, webhook.ErrSignatureMismatch},
		{"one byte more", secret, append(body, ' '), at, time.Minute, webhook.ErrSignatureMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := webhook.Verify(tc.secret, h, tc.body, tc.tol, tc.now)
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
			if err != nil && err.Error() == "" {
				t.Fatal("an error without a message")
			}
		})
	}
}
