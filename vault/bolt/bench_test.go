package bolt

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/vaulttest"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// benchStore opens a store with durable commits and one key with room for every
// benchmark iteration.
func benchStore(b *testing.B) (*Store, string) {
	b.Helper()
	s, _ := MustOpen(b, vaulttest.NewClock(vaulttest.T0))
	vaulttest.MustUpstream(b, s, "sk_test_abcdef1234")
	k, _ := vaulttest.MustMint(b, s, "bench", vaulttest.Policy(b, "", "1000000000", ""), nil)
	return s, k.ID
}

// BenchmarkCommitterVersusBatch compares the store's group committer (commit.go)
// with bbolt's own DB.Batch on the same write — the durable Reserve of one
// charge — at 1 and 64 concurrent callers. DB.Batch waits up to its
// MaxBatchDelay (10 ms by default) for more callers before it commits; the
// committer commits at once and batches what arrives during the commit. The
// figures are in docs/decisions/0001-own-group-committer.md.
func BenchmarkCommitterVersusBatch(b *testing.B) {
	for _, callers := range []int{1, 64} {
		for _, via := range []string{"committer", "batch"} {
			b.Run(fmt.Sprintf("%s/callers=%d", via, callers), func(b *testing.B) {
				s, keyID := benchStore(b)
				ctx := context.Background()
				reserve := func(req vault.ReserveRequest) (vault.ReserveResult, error) { return s.Reserve(ctx, req) }
				if via == "batch" {
					reserve = func(req vault.ReserveRequest) (vault.ReserveResult, error) {
						var (
							res        vault.ReserveResult
							turnedDown error
						)
						err := s.db.Batch(func(btx *bbolt.Tx) error {
							var err error
							res, turnedDown, err = engine.ReserveTx(s.Engine, newTx(btx), s.now(), req) // a re-run starts over
							return err
						})
						if err == nil {
							err = turnedDown
						}
						return res, err
					}
				}
				vaulttest.RunConcurrent(b, callers, func(i int64) error {
					res, err := reserve(vaulttest.Charge(keyID, fmt.Sprintf("bench-%d", i), 100))
					if err == nil && res.Outcome != vault.ReserveClaimed {
						err = fmt.Errorf("outcome %d", res.Outcome)
					}
					return err
				})
			})
		}
	}
}

// BenchmarkSummarizeUsage is the store's share of a /metrics scrape: the walk over
// every key and its current windows' counters, here 10,000 active keys.
func BenchmarkSummarizeUsage(b *testing.B) {
	// Counters are written directly, without the ledger that would explain them:
	// so not MustOpen, whose cleanup checks the ledger against them.
	s, err := Open(filepath.Join(b.TempDir(), "keybrake.db"), Options{MasterKey: vaulttest.MasterKey, Now: vaulttest.NewClock(vaulttest.T0).Now, Logger: vaulttest.QuietLogger()})
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, s.Close()) })
	p := vaulttest.Policy(b, "100.00", "1000.00", "")
	windows, err := p.Windows(vaulttest.T0)
	require.NoError(b, err)
	const keys = 10000
	require.NoError(b, engine.Update(s.Engine, context.Background(), func(tx engine.Tx, now time.Time) error {
		for i := range keys {
			id := fmt.Sprintf("key_bench%06d", i)
			if err := engine.PutKey(tx, &engine.KeyRec{ID: id, Name: id, Upstream: "default", Policy: p, Status: vault.KeyActive,
				CreatedAt: now, UpdatedAt: now}); err != nil {
				return err
			}
			for _, w := range windows {
				if err := engine.PutCounter(tx, id, w.ID, engine.Counter{Committed: int64(i % 10000), CapPeak: w.Cap}); err != nil {
					return err
				}
			}
		}
		return nil
	}))
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		sum, err := s.SummarizeUsage(ctx, 90)
		if err != nil || sum.ActiveKeys != keys {
			b.Fatalf("summary %+v, %v", sum.ActiveKeys, err)
		}
	}
}

// openForBenchmark opens a store in a temporary directory with durable commits.
func openForBenchmark(b *testing.B) vault.Store {
	s, err := Open(filepath.Join(b.TempDir(), "keybrake.db"), Options{MasterKey: vaulttest.MasterKey,
		Now: vaulttest.NewClock(vaulttest.T0).Now, Logger: vaulttest.QuietLogger()})
	require.NoError(b, err)
	return s
}

// BenchmarkReserve measures hold + claim (one durable, group-committed write
// transaction per batch) at 1, 8 and 64 concurrent callers.
func BenchmarkReserve(b *testing.B) { vaulttest.BenchmarkReserve(b, openForBenchmark) }

// BenchmarkReserveManyKeys measures Reserve at 64 callers over 64 keys.
func BenchmarkReserveManyKeys(b *testing.B) { vaulttest.BenchmarkReserveManyKeys(b, openForBenchmark) }

// BenchmarkReserveSettle measures a whole metered request: Reserve then Settle.
func BenchmarkReserveSettle(b *testing.B) { vaulttest.BenchmarkReserveSettle(b, openForBenchmark) }

// BenchmarkSettle measures the settle alone.
func BenchmarkSettle(b *testing.B) { vaulttest.BenchmarkSettle(b, openForBenchmark) }

// BenchmarkReserveSettleUnderBudget compares 64 keys under one budget with 64
// independent keys.
func BenchmarkReserveSettleUnderBudget(b *testing.B) {
	vaulttest.BenchmarkReserveSettleUnderBudget(b, openForBenchmark)
}
