package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"regexp"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// KeyPrefix starts every API key.
const KeyPrefix = "kubo_sk_"

const (
	base62    = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	keyChars  = 43 // 43 base62 characters carry 256 bits
	maxKeyLen = 128
)

var (
	keyPattern    = regexp.MustCompile(`^kubo_sk_[0-9A-Za-z]{20,120}$`)
	tenantPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
)

// NewAPIKey returns a new secret key: KeyPrefix and 43 characters drawn
// uniformly from base62 by rejection sampling (about 256 random bits).
func NewAPIKey() string {
	out := make([]byte, 0, len(KeyPrefix)+keyChars)
	out = append(out, KeyPrefix...)
	buf := make([]byte, 64)
	for len(out) < cap(out) {
		_, _ = rand.Read(buf)
		for _, b := range buf {
			// 248 = 4×62: bytes above it would bias the first characters.
			if b < 248 && len(out) < cap(out) {
				out = append(out, base62[b%62])
			}
		}
	}
	return string(out)
}

// HashAPIKey is what the store keeps: SHA-256 of the whole key string.
// Keys carry 256 random bits, so a fast unsalted hash is enough.
func HashAPIKey(secret string) [32]byte { return sha256.Sum256([]byte(secret)) }

// wellFormedKey rejects garbage before it costs a database lookup.
func wellFormedKey(secret string) bool {
	return len(secret) <= maxKeyLen && keyPattern.MatchString(secret)
}

// ValidTenant reports whether name is usable as a tenant name.
func ValidTenant(name string) bool { return tenantPattern.MatchString(name) }

// CreateKey makes a new key for tenant on plan and returns the secret,
// which exists nowhere else afterwards. The plan is not checked here.
func CreateKey(ctx context.Context, st store.Keys, tenant, plan string, now time.Time) (string, store.Key, error) {
	if !ValidTenant(tenant) {
		return "", store.Key{}, fmt.Errorf("tenant name %q must be 1-63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", tenant)
	}
	secret := NewAPIKey()
	k, err := st.CreateKey(ctx, store.NewKey{ID: NewKeyID(), Tenant: tenant, Plan: plan, Hash: HashAPIKey(secret), CreatedAt: now.UTC()})
	if err != nil {
		return "", store.Key{}, fmt.Errorf("creating key for tenant %s: %w", tenant, err)
	}
	return secret, k, nil
}
