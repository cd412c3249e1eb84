package client

import (
	"errors"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/webhook/webhooktest"
)

// TestVerifyWebhookVectors runs the vectors the Python SDK is tested with,
// so both verifiers agree on every case.
func TestVerifyWebhookVectors(t *testing.T) {
	sentinel := map[string]error{
		"malformed_header":   ErrWebhookMalformed,
		"signature_mismatch": ErrWebhookSignature,
		"timestamp_too_old":  ErrWebhookTooOld,
		"timestamp_too_new":  ErrWebhookTooNew,
	}
	for _, v := range webhooktest.Load(t, "../sdk/testdata/webhook_vectors.json") {
		t.Run(v.Name, func(t *testing.T) {
			err := verifyWebhookAt(v.Secret, v.Header, []byte(v.Body), v.ToleranceDuration(), v.NowTime())
			if v.Valid {
				if err != nil {
					t.Fatalf("VerifyWebhook = %v, want nil", err)
				}
				return
			}
			want, ok := sentinel[v.WantCode()]
			if !ok {
				t.Fatalf("the vector's error %q has no SDK sentinel", v.WantCode())
			}
			if !errors.Is(err, want) {
				t.Fatalf("VerifyWebhook = %v, want %v", err, want)
			}
		})
	}
}
