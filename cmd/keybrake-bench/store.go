package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// chargeAmount is every charge's amount, in minor units of usd.
const chargeAmount = 100

// chargeBody is every charge's form body, as a Stripe SDK sends it.
const chargeBody = "amount=100&currency=usd&source=tok_visa"

// seedWorkers is how many seeding callers share the store's group commit: enough
// to fill its batches.
const seedWorkers = 256

// storeSetup is what prepareStore wrote.
type storeSetup struct {
	// keyIDs are every key's, the budget's keys' last; tokens the
	// independent keys' only.
	keyIDs []string
	tokens []string
	// budgetTokens are the tokens of the keys under the one budget (--budget).
	budgetTokens []string
	// seeded is the amount committed by the seeded records, in minor units.
	seeded int64
	// seedTime is how long seeding took.
	seedTime time.Duration
}

// storeOptions says what prepareStore writes.
type storeOptions struct {
	path      string
	masterKey []byte
	secret    string // the upstream "default"
	keys      int
	records   int
	// budget: mint keys more keys under one budget, after the seeding.
	budget bool
	// body is the stored answer of seeded record n.
	body func(n int64) []byte
	// now is the store's clock (time.Now when nil). It is the hook for measuring
	// growth over simulated time: a later mode can seed with a clock it advances,
	// reap, and compare the file's size with retention × rate × size per request.
	now      func() time.Time
	progress io.Writer
}

// prepareStore opens the store keybrake will serve, offline, and writes through
// its API what the benchmark needs: the upstream, the vault keys (minted as the
// admin API mints them), and opts.records completed charges spread over the keys
// (each a Reserve and a committed Settle with the answer stored, as the proxy
// writes them, so the records, holds, counters and ledger events look like
// production's).
func prepareStore(ctx context.Context, opts storeOptions) (storeSetup, error) {
	s, err := bolt.Open(opts.path, bolt.Options{
		MasterKey: opts.masterKey,
		Now:       opts.now,
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return storeSetup{}, fmt.Errorf("open store: %w", err)
	}
	setup, err := fillStore(ctx, s, opts)
	if cerr := s.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("close store: %w", cerr))
	}
	return setup, err
}

func fillStore(ctx context.Context, s vault.Store, opts storeOptions) (storeSetup, error) {
	var setup storeSetup
	if _, _, err := s.PutUpstream(ctx, "keybrake-bench", "default", "stripe", opts.secret); err != nil {
		return setup, fmt.Errorf("register upstream: %w", err)
	}
	now := time.Now
	if opts.now != nil {
		now = opts.now
	}
	start := time.Now()
	for i := range opts.keys {
		p, err := benchPolicy(now())
		if err != nil {
			return setup, err
		}
		key, token, err := s.MintKey(ctx, "keybrake-bench", vault.MintRequest{
			Name: fmt.Sprintf("bench-%06d", i), Upstream: "default", Policy: p,
			Labels: map[string]string{"purpose": "benchmark"},
		})
		if err != nil {
			return setup, fmt.Errorf("mint key %d: %w", i, err)
		}
		setup.keyIDs = append(setup.keyIDs, key.ID)
		setup.tokens = append(setup.tokens, token)
	}
	if opts.keys > 100 {
		fmt.Fprintf(opts.progress, "minted %d keys in %s\n", opts.keys, time.Since(start).Round(time.Millisecond))
	}
	if opts.records > 0 {
		start = time.Now()
		if err := seedRecords(ctx, s, setup.keyIDs, opts); err != nil {
			return setup, err
		}
		setup.seeded = int64(opts.records) * chargeAmount
		setup.seedTime = time.Since(start)
		fmt.Fprintf(opts.progress, "seeded %d completed records in %s\n", opts.records, setup.seedTime.Round(time.Millisecond))
	}
	if opts.budget {
		if err := mintUnderBudget(ctx, s, now(), opts.keys, &setup); err != nil {
			return setup, err
		}
	}
	return setup, nil
}

// benchPolicy is the policy of every benchmark key: daily and period caps so
// large that nothing is refused, but both windows counted, as in production. It
// is built from JSON and checked as the admin API does.
func benchPolicy(now time.Time) (policy.Policy, error) {
	var p policy.Policy
	doc := `{"vendor": "stripe", "currency": "usd", "daily_cap": "1000000000.00", "period_cap": "1000000000.00",
		"expires_at": "` + now.Add(30*24*time.Hour).UTC().Format(time.RFC3339) + `"}`
	if err := json.Unmarshal([]byte(doc), &p); err != nil {
		return p, fmt.Errorf("benchmark policy: %w", err)
	}
	p.Normalize(now.Truncate(time.Second))
	if err := p.ValidateNew(now); err != nil {
		return p, fmt.Errorf("benchmark policy: %w", err)
	}
	return p, nil
}

// seedRecords writes opts.records completed charges, record n under key n mod
// len(keyIDs), from seedWorkers callers.
func seedRecords(ctx context.Context, s vault.Store, keyIDs []string, opts storeOptions) error {
	params, err := stripeapi.ParseForm([]byte(chargeBody))
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	fingerprint := proxy.Fingerprint(http.MethodPost, "/v1/charges", "", "", params.Canonical())
	var (
		next     atomic.Int64
		mu       sync.Mutex // orders the progress lines
		done     int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	total := int64(opts.records)
	report := max(total/10, 1)
	for range min(seedWorkers, opts.records) {
		wg.Go(func() {
			for ctx.Err() == nil {
				n := next.Add(1)
				if n > total {
					return
				}
				if err := seedOne(ctx, s, keyIDs[(n-1)%int64(len(keyIDs))], n, fingerprint, opts.body(n)); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				mu.Lock()
				if done++; total >= 10_000 && done%report == 0 {
					fmt.Fprintf(opts.progress, "seeding: %d of %d records\n", done, total)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// seedOne writes one completed charge as the proxy would: the claim and hold,
// then the commit with Stripe's answer.
func seedOne(ctx context.Context, s vault.Store, keyID string, n int64, fingerprint string, body []byte) error {
	idem := "bench-seed-" + strconv.FormatInt(n, 10)
	res, err := s.Reserve(ctx, vault.ReserveRequest{
		KeyID: keyID, IdempotencyKey: idem, Fingerprint: fingerprint, Metered: true,
		Request: policy.Request{Operation: "charges.create", Amount: chargeAmount, Currency: "usd"},
	})
	if err != nil {
		return fmt.Errorf("seed record %d: %w", n, err)
	}
	if res.Outcome != vault.ReserveClaimed {
		return fmt.Errorf("seed record %d: reserve outcome %d, want claimed", n, res.Outcome)
	}
	reqID := "req_seed" + strconv.FormatInt(n, 10)
	err = s.Settle(ctx, vault.SettleRequest{
		KeyID: keyID, IdempotencyKey: idem, Outcome: vault.SettleCommit, Amount: chargeAmount,
		Response: &vault.StoredResponse{Status: http.StatusOK, Header: http.Header{
			"Content-Type": {"application/json"}, "Request-Id": {reqID},
		}, Body: body},
		UpstreamStatus: http.StatusOK, StripeRequestID: reqID, ObjectID: "ch_seed" + strconv.FormatInt(n, 10),
	})
	if err != nil {
		return fmt.Errorf("seed record %d: %w", n, err)
	}
	return nil
}

// storeTotals is what the store metered over every key's period window.
type storeTotals struct {
	Committed int64 `json:"committed"`
	Held      int64 `json:"held"`
}

// readTotals opens the store after keybrake stopped and sums the period windows
// of keyIDs.
func readTotals(ctx context.Context, path string, masterKey []byte, keyIDs []string) (storeTotals, error) {
	s, err := bolt.Open(path, bolt.Options{MasterKey: masterKey, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return storeTotals{}, fmt.Errorf("open store: %w", err)
	}
	t, err := sumTotals(ctx, s, keyIDs)
	if cerr := s.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("close store: %w", cerr))
	}
	return t, err
}

// sumTotals sums the period windows of keyIDs in s.
func sumTotals(ctx context.Context, s vault.Store, keyIDs []string) (storeTotals, error) {
	var t storeTotals
	for _, id := range keyIDs {
		_, windows, usage, err := s.KeyUsage(ctx, id)
		if err != nil {
			return t, fmt.Errorf("usage of %s: %w", id, err)
		}
		for _, w := range windows {
			if w.Kind == policy.WindowPeriod {
				t.Committed += usage[w.ID].Committed
				t.Held += usage[w.ID].Held
			}
		}
	}
	return t, nil
}
