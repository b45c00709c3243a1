package engine

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keybrake/keybrake/vault"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReachedPercent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		used, limit int64
		pct         int
		want        bool
	}{
		{90, 100, 90, true},
		{89, 100, 90, false},
		{9, 10, 90, true},
		{8, 9, 90, false}, // 90 % of 9 is 8.1
		{9, 9, 90, true},
		{0, 0, 90, true},
		{1, 1, 100, true},
		{0, 1, 100, false},
		{math.MaxInt64 / 10 * 9, math.MaxInt64, 90, false},
		{math.MaxInt64/100*90 + 7, math.MaxInt64, 90, true}, // no overflow near the top
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, reachedPercent(tc.used, tc.limit, tc.pct), "%d of %d at %d %%", tc.used, tc.limit, tc.pct)
	}
}

func TestSealer(t *testing.T) {
	t.Parallel()
	sl, err := NewSealer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	other, err := NewSealer(bytes.Repeat([]byte{1}, 32))
	require.NoError(t, err)
	sealed, err := sl.seal([]byte("sk_live_secret"), upstreamAD("default"))
	require.NoError(t, err)
	again, err := sl.seal([]byte("sk_live_secret"), upstreamAD("default"))
	require.NoError(t, err)
	assert.NotEqual(t, sealed, again, "random nonce")
	assert.NotContains(t, string(sealed), "sk_live_secret")

	pt, err := sl.open(sealed, upstreamAD("default"))
	require.NoError(t, err)
	assert.Equal(t, "sk_live_secret", string(pt))

	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	cases := map[string]struct {
		s      *Sealer
		sealed []byte
		ad     []byte
	}{
		"wrong key":        {other, sealed, upstreamAD("default")},
		"other place":      {sl, sealed, upstreamAD("other")},
		"tampered":         {sl, tampered, upstreamAD("default")},
		"truncated":        {sl, sealed[:10], upstreamAD("default")},
		"unknown version":  {sl, append([]byte{9}, sealed[1:]...), upstreamAD("default")},
		"empty ciphertext": {sl, nil, upstreamAD("default")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := tc.s.open(tc.sealed, tc.ad)
			assert.ErrorIs(t, err, vault.ErrSealed)
		})
	}
}

func TestUsedPercent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		used, cap int64
		want      int
	}{
		{0, 1000, 0}, {799, 1000, 79}, {800, 1000, 80}, {1000, 1000, 100}, {1500, 1000, 150},
		{5, 0, 100}, {1 << 62, 3, 1 << 30}, {-5, 100, 0},
	} {
		assert.Equal(t, c.want, usedPercent(c.used, c.cap), "%d of %d", c.used, c.cap)
	}
}

func TestEnvFingerprint(t *testing.T) {
	t.Parallel()
	a := envFingerprint("sk_test_x", []byte("0123456789abcdef"))
	assert.True(t, envFingerprintMatches(a, "sk_test_x"))
	assert.False(t, envFingerprintMatches(a, "sk_test_y"))
	assert.False(t, envFingerprintMatches(nil, "sk_test_x"))
	assert.False(t, envFingerprintMatches(a[:20], "sk_test_x"))
	b := envFingerprint("sk_test_x", []byte("fedcba9876543210"))
	assert.NotEqual(t, a, b, "salted: the same value fingerprints differently")
}

// TestEverySealedValueIsRekeyed holds Reseal and the package's sealing
// together: every call that seals a value names its associated data with one
// of the functions Reseal knows. A new kind of sealed value must be taught to
// Reseal, or a rekey would leave it unreadable.
func TestEverySealedValueIsRekeyed(t *testing.T) {
	t.Parallel()
	known := map[string]bool{"checkAD": true, "upstreamAD": true, "responseAD": true, "claimAD": true, "webhookAD": true, "webhookSecretAD": true}
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "seal.go" {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "seal" || len(call.Args) != 2 {
				return true
			}
			ad := ""
			switch a := call.Args[1].(type) {
			case *ast.Ident:
				ad = a.Name
			case *ast.CallExpr:
				if id, ok := a.Fun.(*ast.Ident); ok {
					ad = id.Name
				}
			}
			assert.True(t, known[ad], "%s: a value sealed with %q: teach Reseal to seal it again",
				fset.Position(call.Pos()), ad)
			seen[ad] = true
			return true
		})
	}
	assert.Equal(t, known, seen, "every kind Reseal handles is still sealed somewhere")
}

// TestMemoKeepsNothingReadBeforeAChange: a read that began before a change (its
// generation taken before the change emptied the memo) must not put back what
// it read, or a revoked key would stay usable from memory.
func TestMemoKeepsNothingReadBeforeAChange(t *testing.T) {
	t.Parallel()
	m := &memo{}
	rec := authRec{key: &keyRec{ID: "key_1"}, upstreamVersion: 3}
	gen := m.generation()
	m.forget() // a key change committed meanwhile
	m.keepKey(gen, "hash", rec)
	m.keepSecret(gen, "default", "sk_old")
	_, ok := m.key("hash")
	assert.False(t, ok, "a key read before the change is not kept")
	_, ok = m.secret("default")
	assert.False(t, ok, "a secret read before the change is not kept")

	gen = m.generation()
	m.keepKey(gen, "hash", rec)
	got, ok := m.key("hash")
	assert.True(t, ok)
	assert.Same(t, rec.key, got.key)
	assert.Equal(t, uint64(3), got.upstreamVersion)
	m.forget()
	_, ok = m.key("hash")
	assert.False(t, ok, "a change empties the memo")

	var none *memo // a store shared by replicas keeps nothing
	none.keepKey(none.generation(), "hash", rec)
	_, ok = none.key("hash")
	assert.False(t, ok)
}
