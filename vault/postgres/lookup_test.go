package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// TestLookupsShareAStatement: lookups taken together are read in one
// statement, each answered with its own token's key and the upstream it
// named, in their order; a token nobody minted reads nothing, an upstream
// nobody registered reads nil.
func TestLookupsShareAStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := withKeys(t, migrated.URL(t), "k0", "k1", "k2")
	hashes := map[string][]byte{} // key id → its token's hash, as stored
	rows, err := s.pool.Query(ctx, "SELECT k, v FROM "+table(engine.BucketTokens))
	require.NoError(t, err)
	for rows.Next() {
		var hash, id []byte
		require.NoError(t, rows.Scan(&hash, &id))
		hashes[string(id)] = hash
	}
	require.NoError(t, rows.Err())
	require.Len(t, hashes, 3)

	type want struct{ id, upstream string }
	var (
		batch []*lookup
		wants []want
	)
	ask := func(hash []byte, upstream string, w want) {
		batch = append(batch, &lookup{buckets: [3]engine.Bucket{engine.BucketTokens, engine.BucketKeys, engine.BucketUpstreams},
			k: hash, with: []byte(upstream), done: make(chan struct{}), ctx: ctx})
		wants = append(wants, w)
	}
	for id, hash := range hashes {
		ask(hash, "default", want{id, "default"})
		ask([]byte("no such token"), "default", want{})
		ask(hash, "nope", want{id: id})
	}
	before := s.roundTrips.Load()
	(*backend)(s).runLookups(batch)
	assert.Equal(t, int64(1), s.roundTrips.Load()-before, "one statement for %d lookups", len(batch))
	for i, l := range batch {
		<-l.done
		require.NoError(t, l.err)
		w := wants[i]
		assert.Equal(t, w.id, string(l.ref), "lookup %d: the token's key id", i)
		if w.id == "" {
			assert.Nil(t, l.v, "lookup %d", i)
		} else {
			assert.Contains(t, string(l.v), w.id, "lookup %d: the key's record", i)
		}
		if w.upstream == "" {
			assert.Nil(t, l.withV, "lookup %d", i)
		} else {
			assert.Contains(t, string(l.withV), w.upstream, "lookup %d: the upstream's entry", i)
		}
	}
}

// TestConcurrentAuthenticationsShareStatements: requests authenticating at
// once each get their own token's key, in fewer statements than requests.
func TestConcurrentAuthenticationsShareStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpenURL(t, migrated.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: vaulttest.NewClock(vaulttest.T0).Now})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	var ids, toks []string
	for i := range 4 {
		k, tok := vaulttest.MustMint(t, s, fmt.Sprintf("k%d", i), vaulttest.Policy(t, "10.00", "", ""), nil)
		ids, toks = append(ids, k.ID), append(toks, tok)
		_, err := s.Authenticate(ctx, tok) // the replica learns which upstream the token's key names
		require.NoError(t, err)
	}
	const workers, each = 64, 20
	before := s.roundTrips.Load()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				n := (w + i) % len(toks)
				got, err := s.Authenticate(ctx, toks[n])
				if assert.NoError(t, err) {
					assert.Equal(t, ids[n], got.ID)
				}
			}
		})
	}
	wg.Wait()
	statements := s.roundTrips.Load() - before
	t.Logf("%d authentications in %d statements", workers*each, statements)
	assert.Less(t, statements, int64(workers*each))
}

// TestLookupStatementEndsWhenNobodyWaits: a lookups' statement is given up
// once every asker has stopped waiting, not before.
func TestLookupStatementEndsWhenNobodyWaits(t *testing.T) {
	t.Parallel()
	a, cancelA := context.WithCancel(context.Background())
	b, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	ctx, cancel := whileAnyWaits([]*lookup{{ctx: a}, {ctx: b}})
	defer cancel()
	cancelA()
	select {
	case <-ctx.Done():
		t.Fatal("ended while one asker still waits")
	case <-time.After(50 * time.Millisecond):
	}
	cancelB()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("still running when nobody waits")
	}
}
