package vault_test

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/vaulttest"
	"github.com/stretchr/testify/assert"
)

func TestKeyStatusAt(t *testing.T) {
	t.Parallel()
	k := vault.Key{Status: vault.KeyActive, Policy: vaulttest.Policy(t, "1", "", "")}
	assert.Equal(t, vault.KeyActive, k.StatusAt(vaulttest.T0))
	assert.Equal(t, vault.KeyExpired, k.StatusAt(k.Policy.ExpiresAt))
	k.Status = vault.KeyRevoked
	assert.Equal(t, vault.KeyRevoked, k.StatusAt(k.Policy.ExpiresAt))
}

func TestDerivedIDs(t *testing.T) {
	t.Parallel()
	assert.Equal(t, vault.HoldID("key_a", "x"), vault.HoldID("key_a", "x"))
	assert.NotEqual(t, vault.HoldID("key_a", "bc"), vault.HoldID("key_ab", "c"))
	assert.NotEqual(t, vault.UpstreamKey("key_a", "x"), vault.UpstreamKey("key_b", "x"))
	assert.LessOrEqual(t, len(vault.UpstreamKey("key_a", strings.Repeat("x", 255))), 255)
	assert.True(t, strings.HasPrefix(vault.HoldID("k", "i"), "hold_"))
	assert.Len(t, vault.HoldID("k", "i"), 5+26)
	// Both are stored and sent to Stripe: their derivation never changes.
	assert.Equal(t, "hold_i57cqiq2gidjvg23rn1je1hv98", vault.HoldID("key_a", "x"))
	assert.Equal(t, "keybrake_LIZ4vlXJ1W-xxl4-h_cuN2gXjkqsxX9g-Qy1U7rDAQ8", vault.UpstreamKey("key_a", "x"))
	h := vault.HoldHash("key_a", "x")
	assert.Equal(t, "914ecd4b42849b3fc043ddc337063f4a", hex.EncodeToString(h[:]), "what the hold id encodes")
}
