package vaulttest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// setLabel is a KeyChange that sets one label and keeps everything else as
// the key has it.
func setLabel(name, value string) vault.KeyChange {
	return vault.KeyChange{Apply: func(k vault.Key, _ time.Time) (policy.Policy, map[string]string, error) {
		labels := maps.Clone(k.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[name] = value
		return k.Policy, labels, nil
	}}
}

// testPatchKeyConcurrentChangesAllApply: patches of different fields of one
// key, sent at once, each computed from the key as the store holds it, all
// apply: none is written over by another that read the key before it.
func testPatchKeyConcurrentChangesAllApply(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := MustMint(t, s, "patched", Policy(t, "50", "", ""), nil)

	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := s.PatchKey(ctx, "tester", k.ID, setLabel(fmt.Sprintf("l%d", i), "v"))
			assert.NoError(t, err)
		})
	}
	// One more lowers the cap while the labels change.
	wg.Go(func() {
		_, err := s.PatchKey(ctx, "tester", k.ID, vault.KeyChange{Apply: func(k vault.Key, _ time.Time) (policy.Policy, map[string]string, error) {
			p := k.Policy
			p.DailyCap = MustDec(t, "5")
			return p, k.Labels, nil
		}})
		assert.NoError(t, err)
	})
	wg.Wait()

	got, err := s.GetKey(ctx, k.ID)
	require.NoError(t, err)
	assert.Len(t, got.Labels, n, "every label patch applied")
	assert.True(t, got.Policy.DailyCap.Equal(*MustDec(t, "5")), "the cap patch applied: %s", got.Policy.DailyCap)
	assert.Equal(t, k.Version+n+1, got.Version, "one version per change")
}

// testPatchKeyVersions: a change made against another version than the key's
// is refused with ErrPrecondition and writes nothing; Apply's own error comes
// back as it is; every write of a key, a revocation and a rotation too, raises
// its version.
func testPatchKeyVersions(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := MustMint(t, s, "versioned", Policy(t, "50", "", ""), map[string]string{"a": "1"})
	require.EqualValues(t, 1, k.Version, "a new key is at version 1")

	change := setLabel("b", "2")
	change.IfVersion = k.Version
	v2, err := s.PatchKey(ctx, "tester", k.ID, change)
	require.NoError(t, err)
	assert.Equal(t, k.Version+1, v2.Version)
	assert.Equal(t, map[string]string{"a": "1", "b": "2"}, v2.Labels)

	stale := setLabel("c", "3")
	stale.IfVersion = k.Version
	_, err = s.PatchKey(ctx, "tester", k.ID, stale)
	require.ErrorIs(t, err, vault.ErrPrecondition)
	got, err := s.GetKey(ctx, k.ID)
	require.NoError(t, err)
	assert.Equal(t, v2, got, "a change against a stale version writes nothing")

	mine := errors.New("the patch does not apply")
	_, err = s.PatchKey(ctx, "tester", k.ID, vault.KeyChange{Apply: func(vault.Key, time.Time) (policy.Policy, map[string]string, error) {
		return policy.Policy{}, nil, mine
	}})
	require.ErrorIs(t, err, mine)
	got, err = s.GetKey(ctx, k.ID)
	require.NoError(t, err)
	assert.Equal(t, v2, got, "a refused change writes nothing")

	// Apply sees the store's clock.
	clock.Advance(time.Hour)
	var seen time.Time
	_, err = s.PatchKey(ctx, "tester", k.ID, vault.KeyChange{Apply: func(k vault.Key, now time.Time) (policy.Policy, map[string]string, error) {
		seen = now
		return k.Policy, k.Labels, nil
	}})
	require.NoError(t, err)
	assert.True(t, seen.Equal(T0.Add(time.Hour)), "Apply is given the store's clock, got %s", seen)

	rotated, _, err := s.RotateKey(ctx, "tester", k.ID)
	require.NoError(t, err)
	assert.Equal(t, v2.Version+2, rotated.Version)
	revoked, err := s.RevokeKey(ctx, "tester", k.ID)
	require.NoError(t, err)
	assert.Equal(t, rotated.Version+1, revoked.Version)
	_, err = s.PatchKey(ctx, "tester", k.ID, setLabel("d", "4"))
	assert.ErrorIs(t, err, vault.ErrConflict, "a revoked key cannot be changed")
	_, err = s.PatchKey(ctx, "tester", "key_nope", setLabel("d", "4"))
	assert.ErrorIs(t, err, vault.ErrNotFound)
}
