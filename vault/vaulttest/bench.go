package vaulttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/keybrake/keybrake/vault"
)

// The hot path's benchmarks, which each store runs on itself with
//
//	func BenchmarkReserve(b *testing.B) { vaulttest.BenchmarkReserve(b, openForBenchmark) }

// BenchOpener opens a new, empty store for one benchmark run, with durable
// commits; the benchmark closes it.
type BenchOpener func(b *testing.B) vault.Store

// benchStore opens a store and mints one key with room for every iteration.
func benchStore(b *testing.B, open BenchOpener) (vault.Store, string) {
	b.Helper()
	s := open(b)
	b.Cleanup(func() {
		if err := s.Close(); err != nil {
			b.Error(err)
		}
	})
	MustUpstream(b, s, "sk_test_abcdef1234")
	k, _ := MustMint(b, s, "bench", Policy(b, "", "1000000000", ""), nil)
	return s, k.ID
}

// BenchmarkReserve measures hold + claim (one durable write transaction) at
// 1, 8 and 64 concurrent callers.
func BenchmarkReserve(b *testing.B, open BenchOpener) {
	for _, callers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			s, keyID := benchStore(b, open)
			ctx := context.Background()
			RunConcurrent(b, callers, func(i int64) error {
				res, err := s.Reserve(ctx, Charge(keyID, fmt.Sprintf("bench-%d", i), 100))
				if err == nil && res.Outcome != vault.ReserveClaimed {
					err = fmt.Errorf("outcome %d", res.Outcome)
				}
				return err
			})
		})
	}
}

// BenchmarkReserveManyKeys measures Reserve at 64 concurrent callers spread
// over 64 keys, one each: a store that orders the writes under one key (a
// PostgreSQL row lock) runs different keys' writes side by side.
func BenchmarkReserveManyKeys(b *testing.B, open BenchOpener) {
	s, first := benchStore(b, open)
	const callers = 64
	keys := []string{first}
	for i := 1; i < callers; i++ {
		k, _ := MustMint(b, s, fmt.Sprintf("bench-%d", i), Policy(b, "", "1000000000", ""), nil)
		keys = append(keys, k.ID)
	}
	ctx := context.Background()
	RunConcurrent(b, callers, func(i int64) error {
		res, err := s.Reserve(ctx, Charge(keys[i%callers], fmt.Sprintf("bench-%d", i), 100))
		if err == nil && res.Outcome != vault.ReserveClaimed {
			err = fmt.Errorf("outcome %d", res.Outcome)
		}
		return err
	})
}

// BenchmarkReserveSettle measures a whole metered request: Reserve then Settle
// (commit), two durable write transactions, at 1, 8 and 64 concurrent callers.
func BenchmarkReserveSettle(b *testing.B, open BenchOpener) {
	for _, callers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			s, keyID := benchStore(b, open)
			ctx := context.Background()
			RunConcurrent(b, callers, func(i int64) error {
				key := fmt.Sprintf("bench-%d", i)
				if _, err := s.Reserve(ctx, Charge(keyID, key, 100)); err != nil {
					return err
				}
				return s.Settle(ctx, vault.SettleRequest{KeyID: keyID, IdempotencyKey: key, Outcome: vault.SettleCommit, Amount: 100,
					Response: &vault.StoredResponse{Status: 200, Body: []byte(`{"id":"ch_123","object":"charge","amount":100}`)}})
			})
		})
	}
}

// BenchmarkSettle measures the settle alone (commit, the answer stored for
// replay: one durable write transaction per batch) at 1, 8 and 64 concurrent
// callers; the records it settles are reserved before the timer starts.
func BenchmarkSettle(b *testing.B, open BenchOpener) {
	for _, callers := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			s, keyID := benchStore(b, open)
			ctx := context.Background()
			var reserved atomic.Int64
			fill := make([]error, 64)
			var wg sync.WaitGroup
			for w := range fill {
				wg.Go(func() {
					for i := reserved.Add(1) - 1; i < int64(b.N); i = reserved.Add(1) - 1 {
						if _, err := s.Reserve(ctx, Charge(keyID, fmt.Sprintf("bench-%d", i), 100)); err != nil {
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
			RunConcurrent(b, callers, func(i int64) error {
				return s.Settle(ctx, vault.SettleRequest{KeyID: keyID, IdempotencyKey: fmt.Sprintf("bench-%d", i), Outcome: vault.SettleCommit, Amount: 100,
					Response: &vault.StoredResponse{Status: 200, Body: []byte(`{"id":"ch_123","object":"charge","amount":100}`)}})
			})
		})
	}
}

// RunConcurrent runs op b.N times spread over exactly callers goroutines.
func RunConcurrent(b *testing.B, callers int, op func(i int64) error) {
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

// BenchmarkReserveSettleUnderBudget measures whole metered requests (Reserve
// then Settle) at 64 concurrent callers over 64 keys, the keys independent or
// all under one budget: what one shared, hot set of budget counters costs.
func BenchmarkReserveSettleUnderBudget(b *testing.B, open BenchOpener) {
	for _, shared := range []bool{false, true} {
		name := "independent"
		if shared {
			name = "budget"
		}
		b.Run(name, func(b *testing.B) {
			s, _ := benchStore(b, open)
			budget := ""
			if shared {
				budget = MustBudget(b, s, "bench", "", "1000000000", "1000000000").ID
			}
			const callers = 64
			var keys []string
			for i := range callers {
				p := Policy(b, "", "1000000000", "")
				p.Budget = budget
				k, _ := MustMint(b, s, fmt.Sprintf("bench-%s-%d", name, i), p, nil)
				keys = append(keys, k.ID)
			}
			ctx := context.Background()
			RunConcurrent(b, callers, func(i int64) error {
				keyID, idem := keys[i%callers], fmt.Sprintf("bench-%d", i)
				res, err := s.Reserve(ctx, Charge(keyID, idem, 100))
				if err == nil && res.Outcome != vault.ReserveClaimed {
					err = fmt.Errorf("outcome %d", res.Outcome)
				}
				if err != nil {
					return err
				}
				return s.Settle(ctx, vault.SettleRequest{KeyID: keyID, IdempotencyKey: idem, Outcome: vault.SettleCommit, Amount: 100,
					Response: &vault.StoredResponse{Status: 200, Body: []byte(`{"id":"ch_123","object":"charge","amount":100}`)}})
			})
		})
	}
}
