package storefake

import (
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storetest"
)

// TestBehaviour holds the fake to the suite the real stores pass, so unit
// tests above the seam see the same semantics.
func TestBehaviour(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return New() })
}
