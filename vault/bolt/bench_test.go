package bolt

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
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

// runConcurrent runs op b.N times spread over exactly callers goroutines.
func runConcurrent(b *testing.B, callers int, op func(i int64) error) {
	b.Helper()
	var next atomic.Int64
	errs := make(chan error, callers)
	b.ResetTimer()
	for range callers {
		go func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					errs <- nil
					return
				}
				if err := op(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range callers {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(b.Elapsed().Seconds()*1e3*float64(callers)/float64(b.N), "ms/call")
}

// BenchmarkReserve measures hold + claim (one durable, group-committed write
// transaction per batch) at 1, 8 and 64 concurrent callers.
func BenchmarkReserve(b *testing.B) {
	for _, callers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			s, keyID := benchStore(b)
			ctx := context.Background()
			runConcurrent(b, callers, func(i int64) error {
				res, err := s.Reserve(ctx, vaulttest.Charge(keyID, fmt.Sprintf("bench-%d", i), 100))
				if err == nil && res.Outcome != vault.ReserveClaimed {
					err = fmt.Errorf("outcome %d", res.Outcome)
				}
				return err
			})
		})
	}
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
				runConcurrent(b, callers, func(i int64) error {
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

// BenchmarkReserveSettle measures a whole metered request: Reserve then Settle
// (commit), two durable write transactions, at 1, 8 and 64 concurrent callers.
func BenchmarkReserveSettle(b *testing.B) {
	for _, callers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			s, keyID := benchStore(b)
			ctx := context.Background()
			runConcurrent(b, callers, func(i int64) error {
				key := fmt.Sprintf("bench-%d", i)
				if _, err := s.Reserve(ctx, vaulttest.Charge(keyID, key, 100)); err != nil {
					return err
				}
				return s.Settle(ctx, vault.SettleRequest{KeyID: keyID, IdempotencyKey: key, Outcome: vault.SettleCommit, Amount: 100,
					Response: &vault.StoredResponse{Status: 200, Body: []byte(`{"id":"ch_123","object":"charge","amount":100}`)}})
			})
		})
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

// BenchmarkSettle measures the settle alone (commit, the answer stored for
// replay: one durable write transaction per batch) at 1, 8 and 64 concurrent
// callers; the records it settles are reserved before the timer starts.
func BenchmarkSettle(b *testing.B) {
	for _, callers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			s, keyID := benchStore(b)
			ctx := context.Background()
			var reserved atomic.Int64
			fill := make([]error, 64)
			var wg sync.WaitGroup
			for w := range fill {
				wg.Go(func() {
					for i := reserved.Add(1) - 1; i < int64(b.N); i = reserved.Add(1) - 1 {
						if _, err := s.Reserve(ctx, vaulttest.Charge(keyID, fmt.Sprintf("bench-%d", i), 100)); err != nil {
							fill[w] = err
							return
						}
					}
				})
			}
			wg.Wait()
			if err := errors.Join(fill...); err != nil {
				b.Fatal(err)
			}
			runConcurrent(b, callers, func(i int64) error {
				return s.Settle(ctx, vault.SettleRequest{KeyID: keyID, IdempotencyKey: fmt.Sprintf("bench-%d", i), Outcome: vault.SettleCommit, Amount: 100,
					Response: &vault.StoredResponse{Status: 200, Body: []byte(`{"id":"ch_123","object":"charge","amount":100}`)}})
			})
		})
	}
}
