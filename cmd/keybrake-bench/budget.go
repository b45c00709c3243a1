package main

// Keys under one budget (--budget): the store gets as many keys again as
// --keys, all drawing from one shared budget, and every keybrake target (bbolt,
// PostgreSQL through one replica and through all) is driven a second time
// with those keys' tokens, in the same rounds, so the two figures of a store
// are taken side by side on the same processes and the same machine load. A
// shared budget makes one counter hot for every key under it; the ratio of
// the two is what it costs.

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/shopspring/decimal"

	"github.com/keybrake/keybrake/vault"
)

// budgetSuffix names a target's twin driven with the budget's keys.
const budgetSuffix = "-budget"

// mintUnderBudget creates one budget with caps that never refuse and mints n
// keys under it, as fillStore mints the independent ones.
func mintUnderBudget(ctx context.Context, s vault.Store, now time.Time, n int, setup *storeSetup) error {
	huge := decimal.NewFromInt(1_000_000_000)
	b, err := s.CreateBudget(ctx, "keybrake-bench", vault.BudgetSpec{Name: "bench", Currency: "usd", Timezone: "UTC",
		DailyCap: &huge, PeriodCap: &huge, PeriodStart: now.UTC().Truncate(time.Second)})
	if err != nil {
		return fmt.Errorf("create the budget: %w", err)
	}
	for i := range n {
		p, err := benchPolicy(now)
		if err != nil {
			return err
		}
		p.Budget = b.ID
		key, token, err := s.MintKey(ctx, "keybrake-bench", vault.MintRequest{
			Name: fmt.Sprintf("bench-budget-%06d", i), Upstream: "default", Policy: p,
			Labels: map[string]string{"purpose": "benchmark"},
		})
		if err != nil {
			return fmt.Errorf("mint key %d under the budget: %w", i, err)
		}
		setup.keyIDs = append(setup.keyIDs, key.ID)
		setup.budgetTokens = append(setup.budgetTokens, token)
	}
	return nil
}

// budgetTargets are the twins of the keybrake targets kbs (bbolt first, then
// PostgreSQL's) with the budget's keys' tokens; none without --budget.
func budgetTargets(kbs []target, boltTokens, pgTokens []string) []target {
	if len(boltTokens) == 0 {
		return nil
	}
	var out []target
	for i, t := range kbs {
		twin := t
		twin.name, twin.tokens = t.name+budgetSuffix, boltTokens
		if i > 0 {
			twin.tokens = pgTokens
		}
		out = append(out, twin)
	}
	return out
}

// BudgetResult is keys under one budget through one keybrake target, beside
// the same number of independent keys through the same target in the same
// rounds.
type BudgetResult struct {
	Store    string `json:"store"` // bbolt or postgres
	Replicas int    `json:"replicas"`
	TargetResult
	// Independent is the independent keys' req/s; VersusIndependent the
	// budget's keys' over it.
	Independent       float64 `json:"independent_rps"`
	VersusIndependent float64 `json:"throughput_vs_independent"`
}

// budgetResults pairs each twin's pooled rounds with its target's.
func budgetResults(twins []target, independent, budget []TargetResult) []BudgetResult {
	var out []BudgetResult
	for i, t := range twins {
		r := BudgetResult{Store: "bbolt", Replicas: len(t.pids), TargetResult: budget[i], Independent: independent[i].RPS}
		if i > 0 {
			r.Store = "postgres"
		}
		if r.Independent > 0 {
			r.VersusIndependent = round3(r.RPS / r.Independent)
		}
		out = append(out, r)
	}
	return out
}

// writeBudgetText prints the keys under one budget beside the independent
// keys.
func (r *Report) writeBudgetText(w io.Writer) error {
	if !r.Config.Budget {
		return nil
	}
	fmt.Fprintf(w, "%d keys under one budget beside %d independent keys, same processes, same rounds\n", r.Config.Keys, r.Config.Keys)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conns\tstore\treq/s independent\treq/s budget\tbudget/independent\tp50\tp99\terrors\tcommits/s\treq/s by round\t")
	for _, cr := range r.Results {
		for _, b := range cr.Budget {
			fmt.Fprintf(tw, "%d\t%s ×%d\t%.0f\t%.0f\t%.3f\t%s\t%s\t%d\t%.0f\t%s\t\n", cr.Concurrency, b.Store, b.Replicas,
				b.Independent, b.RPS, b.VersusIndependent, fmtMS(b.P50MS), fmtMS(b.P99MS), b.Errors, b.CommitsPerSecond, roundRates(b.Rounds))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w)
	return err
}
