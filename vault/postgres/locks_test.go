package postgres

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// withParams returns the database URL raw with the query parameters kv set.
func withParams(t *testing.T, raw string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// holdKeyRow opens a session of its own on dbURL that locks keyID's row in a
// transaction and does nothing more, as a replica frozen inside its
// transaction does; the test closes it to let go (or cleanup does).
func holdKeyRow(t *testing.T, dbURL, keyID string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	_, err = holder.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = holder.Exec(ctx, lockKeySQL, []byte(keyID))
	require.NoError(t, err)
	return holder
}

// TestFrozenLockHolderCostsOthersLockTimeout: a session that holds a key's
// row lock and does nothing more — a replica frozen inside its transaction
// (SIGSTOP) — makes a Reserve of that key on another replica wait
// lock_timeout, then fail as ErrStorage, which the proxy answers 503
// store_unavailable (retryable); other keys are not held up. Once the
// holder's session is gone its lock is free and the key works again.
func TestFrozenLockHolderCostsOthersLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	clock := vaulttest.NewClock(vaulttest.T0)
	s := mustOpenURL(t, dbURL, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: clock.Now}) // lock_timeout 10s
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	held, _ := vaulttest.MustMint(t, s, "held", vaulttest.Policy(t, "50.00", "", ""), nil)
	free, _ := vaulttest.MustMint(t, s, "free", vaulttest.Policy(t, "50.00", "", ""), nil)

	holder := holdKeyRow(t, dbURL, held.ID)

	start := time.Now()
	_, err := s.Reserve(ctx, vaulttest.Charge(held.ID, "while-held", 100))
	waited := time.Since(start)
	require.ErrorIs(t, err, vault.ErrStorage, "a lock wait is the store being unavailable")
	assert.Contains(t, err.Error(), "lock_timeout")
	assert.GreaterOrEqual(t, waited, 10*time.Second, "it waited lock_timeout")
	// A bound, not a measurement: without lock_timeout the Reserve waits for
	// its 30 s deadline.
	assert.Less(t, waited, submitTimeout, "the wait ends at lock_timeout")

	res, err := s.Reserve(ctx, vaulttest.Charge(free.ID, "other-key", 100))
	require.NoError(t, err)
	assert.Equal(t, vault.ReserveClaimed, res.Outcome, "another key is not held up")

	require.NoError(t, holder.Close(ctx)) // the frozen session ends; its transaction rolls back
	res, err = s.Reserve(ctx, vaulttest.Charge(held.ID, "after", 100))
	require.NoError(t, err)
	assert.Equal(t, vault.ReserveClaimed, res.Outcome)
}

// TestSessionDefaults: every session keybrake opens has lock_timeout,
// statement_timeout, idle_in_transaction_session_timeout and enable_seqscan
// set, unless the URL sets them.
func TestSessionDefaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	show := func(s *Store, name string) string {
		var v string
		require.NoError(t, s.pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v))
		return v
	}
	s := mustOpenURL(t, dbURL, vaulttest.Options{MasterKey: vaulttest.MasterKey})
	assert.Equal(t, "10s", show(s, "lock_timeout"))
	assert.Equal(t, "30s", show(s, "statement_timeout"))
	assert.Equal(t, "30s", show(s, "idle_in_transaction_session_timeout"))
	assert.Equal(t, "off", show(s, "enable_seqscan"))
	mine := mustOpenURL(t, withParams(t, dbURL, "lock_timeout", "250ms"), vaulttest.Options{MasterKey: vaulttest.MasterKey})
	assert.Equal(t, "250ms", show(mine, "lock_timeout"), "the URL's setting wins")
}

// TestFrozenLockCostsEachWaiterOneLockTimeout: while a frozen session holds a
// key's row, several Reserves of that key, on one store and on another, each
// wait on the server at once — the second waiter in PostgreSQL's queue for a
// row waits first for the first waiter's place (its tuple lock), then for the
// holder, and lock_timeout bounds each of those waits, not their sum. Each
// Reserve still waits lock_timeout and fails as ErrStorage, but none waits
// much beyond it; the other key is served meanwhile. The same holds for a
// transaction of its own that locks the key (tx.LockKey: what claims, events
// and approvals take), outside the batches.
func TestFrozenLockCostsEachWaiterOneLockTimeout(t *testing.T) {
	t.Parallel()
	for name, wait := range map[string]func(s *Store, keyID string, i int) error{
		"reserve": func(s *Store, keyID string, i int) error {
			_, err := s.Reserve(context.Background(), vaulttest.Charge(keyID, fmt.Sprintf("while-held-%d", i), 100))
			return err
		},
		"lock": func(s *Store, keyID string, _ int) error {
			return translate((*backend)(s).Update(context.Background(), func(tx engine.Tx, _ time.Time) error {
				return tx.LockKey(keyID)
			}))
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			frozenLockCostsEachWaiterOneLockTimeout(t, wait)
		})
	}
}

func frozenLockCostsEachWaiterOneLockTimeout(t *testing.T, wait func(s *Store, keyID string, i int) error) {
	ctx := context.Background()
	const lockTimeout = 2 * time.Second
	dbURL := migrated.URL(t)
	short := withParams(t, dbURL, "lock_timeout", lockTimeout.String())
	clock := vaulttest.NewClock(vaulttest.T0)
	stores := []*Store{
		mustOpenURL(t, short, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: clock.Now}),
		mustOpenURL(t, short, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: clock.Now}),
	}
	vaulttest.MustUpstream(t, stores[0], "sk_test_abcdef1234")
	held, _ := vaulttest.MustMint(t, stores[0], "held", vaulttest.Policy(t, "50.00", "", ""), nil)
	free, _ := vaulttest.MustMint(t, stores[0], "free", vaulttest.Policy(t, "50.00", "", ""), nil)

	holder := holdKeyRow(t, dbURL, held.ID)
	// waiting is how many sessions wait for a lock in the test's database.
	monitor, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(monitor.Close)
	waiting := func() int {
		var n int
		if err := monitor.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			return -1
		}
		return n
	}

	// Each Reserve starts once the ones before it wait on the server (or
	// have given up), so that each one's wait queues behind theirs: three on
	// each store.
	const each = 3
	var ended atomic.Int64
	type outcome struct {
		store  int
		err    error
		waited time.Duration
	}
	out := make(chan outcome, 2*each)
	for i := range 2 * each {
		go func() {
			start := time.Now()
			err := wait(stores[i%2], held.ID, i)
			out <- outcome{i % 2, err, time.Since(start)}
			ended.Add(1)
		}()
		require.Eventually(t, func() bool { return waiting()+int(ended.Load()) > i }, 10*time.Second, time.Millisecond,
			"Reserve %d waits on the server", i)
	}
	for i := range stores {
		res, err := stores[i].Reserve(ctx, vaulttest.Charge(free.ID, fmt.Sprintf("other-key-%d", i), 100))
		require.NoError(t, err)
		assert.Equal(t, vault.ReserveClaimed, res.Outcome, "another key is not held up")
	}
	for range 2 * each {
		o := <-out
		t.Logf("store %d: %s: %v", o.store, o.waited.Round(time.Millisecond), o.err)
		require.ErrorIs(t, o.err, vault.ErrStorage, "store %d: a lock wait is the store being unavailable", o.store)
		assert.Contains(t, o.err.Error(), "lock_timeout")
		assert.GreaterOrEqual(t, o.waited, lockTimeout, "store %d: it waited lock_timeout", o.store)
		// A bound, not a measurement: a waiter behind another waited two
		// lock_timeouts.
		assert.Less(t, o.waited, lockTimeout*3/2, "store %d: the wait ends at about lock_timeout", o.store)
	}

	require.NoError(t, holder.Close(ctx)) // the frozen session ends
	for i := range stores {
		res, err := stores[i].Reserve(ctx, vaulttest.Charge(held.ID, fmt.Sprintf("after-%d", i), 100))
		require.NoError(t, err)
		assert.Equal(t, vault.ReserveClaimed, res.Outcome)
	}
	require.NoError(t, stores[0].CheckInvariant(ctx))
}

// TestBatchReadsFindRowsByKey: a batch's read finds the rows it names
// through each table's primary key. PostgreSQL's planner, left to itself,
// reads a table of a few thousand rows whole for a read of thirty keys — a
// young database's records and objects, at every commit — and compares
// every row with every key, which costs three times the index's lookups.
func TestBatchReadsFindRowsByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpenURL(t, migrated.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey})
	for _, b := range []engine.Bucket{engine.BucketIdem, engine.BucketObjects} {
		_, err := s.pool.Exec(ctx, "INSERT INTO "+table(b)+" (k, v) SELECT convert_to('key_0123456789/ch_' || i, 'UTF8'), '\\x00' FROM generate_series(1, 3000) AS i")
		require.NoError(t, err)
		_, err = s.pool.Exec(ctx, "ANALYZE "+table(b))
		require.NoError(t, err)
	}
	var keys [][]byte
	for i := range 30 {
		keys = append(keys, fmt.Appendf(nil, "key_0123456789/ch_%d", 97*(i+1)))
	}
	rows, err := s.pool.Query(ctx, "EXPLAIN "+readSQL(1<<engine.BucketIdem|1<<engine.BucketObjects), keys, keys)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, line := range plan {
		assert.NotContains(t, line, "Seq Scan", "plan:\n%s", strings.Join(plan, "\n"))
	}
}
