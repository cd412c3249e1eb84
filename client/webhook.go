package client

import (
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// Headers of a webhook delivery. A receiver reads the signature from
// HeaderWebhookSignature and dedupes by HeaderWebhookDelivery: delivery is
// at least once, and a retry carries the same delivery id.
const (
	HeaderWebhookDelivery  = webhook.HeaderDelivery
	HeaderWebhookEvent     = webhook.HeaderEvent
	HeaderWebhookSignature = webhook.HeaderSignature
)

// DefaultWebhookTolerance is the tolerance VerifyWebhook uses when given 0.
const DefaultWebhookTolerance = webhook.DefaultTolerance

// Errors of VerifyWebhook, matched with errors.Is. ErrWebhookTooOld and
// ErrWebhookTooNew are only returned for a correctly signed body.
var (
	ErrWebhookMalformed = webhook.ErrMalformedSignature
	ErrWebhookSignature = webhook.ErrSignatureMismatch
	ErrWebhookTooOld    = webhook.ErrTooOld
	ErrWebhookTooNew    = webhook.ErrTooNew
)

// VerifyWebhook checks that body, the raw bytes of a webhook request, was
// signed by Vertal Run with secret (the whsec_ value of GET
// /v1/webhook-secret) less than tolerance ago (0 means
// DefaultWebhookTolerance). header is the Vertal-Signature header. The
// comparison is in constant time. Several v1= signatures may be present;
// one matching is enough.
//
// Verify the raw body before decoding it: re-encoded JSON is not the bytes
// that were signed.
func VerifyWebhook(secret string, header string, body []byte, tolerance time.Duration) error {
	return verifyWebhookAt(secret, header, body, tolerance, time.Now())
}

// verifyWebhookAt is VerifyWebhook with the clock given, for the tests.
func verifyWebhookAt(secret, header string, body []byte, tolerance time.Duration, now time.Time) error {
	return webhook.Verify(secret, header, body, tolerance, now)
}
