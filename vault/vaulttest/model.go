package vaulttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// Long reports whether the long variants of the stress tests were asked for.
func Long() bool { return os.Getenv("KEYBRAKE_LONG") == "1" }

// modelIdem is the reference model of one idempotency key. Each worker owns its
// keys, so what Reserve must answer for them is known exactly.
type modelIdem struct {
	keyID   string
	idem    string
	state   vault.RecordState // "" when there is no record
	fresh   bool              // the in_progress claim created the record
	hold    *modelHold
	body    string // stored response body when completed
	settled bool   // a response is stored
	lapsed  bool   // in_progress from an earlier round: its lease has run out
}

type modelHold struct {
	amount    int64
	windowIDs []policy.WindowID
	state     vault.HoldState
}

// modelRun is one model-based run against a store.
type modelRun struct {
	s *Store
	// split, when set, makes every Reserve of the run the broken one of
	// splitReserve, with split called between its two transactions.
	split func()
	keys  []vault.Key
	// budgets are the budgets the keys draw from (a key's chain: the key, its
	// budget, that budget's ancestors).
	budgets map[string]vault.Budget
	workers int
	ops     int

	mu       sync.Mutex
	problems []string
	idems    []*modelIdem
	claims   int
	refusals int
	// Money objects: each is used by one worker only; their live parts and what
	// was committed from parts (per counter key) are in the model too.
	objects       map[string]*modelObject // key id "/" object id
	partCommitted map[string]int64        // counter key → committed from parts
	// raised is, per scope id "/" window kind, the sum of every raise added
	// during the run: a bound on what raises ever added to that cap at once.
	raised map[string]int64
	raises int
}

// modelObject is the model of one money object's exposure: parts, oldest first,
// merged when placed on the same windows (as the store does).
type modelObject struct {
	keyID string
	id    string
	parts []modelPart
}

type modelPart struct {
	windowIDs []policy.WindowID
	amount    int64
}

func (o *modelObject) held() int64 {
	var n int64
	for _, p := range o.parts {
		n += p.amount
	}
	return n
}

// object returns the model of a worker's object, creating it.
func (m *modelRun) object(keyID, id string) *modelObject {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.objects == nil {
		m.objects, m.partCommitted = map[string]*modelObject{}, map[string]int64{}
	}
	k := keyID + "/" + id
	if m.objects[k] == nil {
		m.objects[k] = &modelObject{keyID: keyID, id: id}
	}
	return m.objects[k]
}

// commitParts takes amount from o's parts, oldest first, as committed money.
func (m *modelRun) commitParts(o *modelObject, amount int64) {
	keep := o.parts[:0]
	for _, p := range o.parts {
		take := min(amount, p.amount)
		amount -= take
		p.amount -= take
		m.mu.Lock()
		for _, w := range p.windowIDs {
			m.partCommitted[modelCounterKey(o.keyID, w)] += take
		}
		m.mu.Unlock()
		if p.amount > 0 {
			keep = append(keep, p)
		}
	}
	o.parts = keep
}

// reserve is the run's Reserve: the store's, or the mutant of splitReserve.
func (m *modelRun) reserve(ctx context.Context, req vault.ReserveRequest) (vault.ReserveResult, error) {
	if m.split != nil {
		return engine.ReserveInTwoTransactions(m.s.e, ctx, req, m.split)
	}
	return m.s.Reserve(ctx, req)
}

func (m *modelRun) problem(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.problems) < 50 {
		m.problems = append(m.problems, fmt.Sprintf(format, args...))
	}
}

// newModelStore opens a store with nKeys keys whose caps the load reaches: they
// grow with the number of operations per worker, so claims and refusals both stay
// frequent. The keys draw from a tree of budgets whose caps the load reaches
// too: an organisation (a period cap) over two teams (daily caps); key i is
// under team a, team b, the organisation directly, or no budget, in turn.
func newModelStore(t *testing.T, clock *Clock, nKeys, ops int) (*Store, []vault.Key, map[string]vault.Budget) {
	t.Helper()
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	scale := max(1, ops/15)
	org := MustBudget(t, s, "org", "", "", fmt.Sprintf("%d.00", 900*scale))
	teamA := MustBudget(t, s, "team-a", org.ID, fmt.Sprintf("%d.00", 220*scale), "")
	teamB := MustBudget(t, s, "team-b", org.ID, fmt.Sprintf("%d.00", 260*scale), "")
	budgets := map[string]vault.Budget{org.ID: org, teamA.ID: teamA, teamB.ID: teamB}
	under := []string{teamA.ID, teamB.ID, org.ID, ""}
	var keys []vault.Key
	for i := range nKeys {
		p := Policy(t, fmt.Sprintf("%d.00", (200+50*i)*scale), fmt.Sprintf("%d.00", (300+60*i)*scale), "30.00")
		p.Budget = under[i%len(under)]
		k, _ := MustMint(t, s, fmt.Sprintf("model-%d", i), p, nil)
		keys = append(keys, k)
	}
	return s, keys, budgets
}

// modelCounterKey is the counter a hold on windowID of keyID counts on: a
// budget's window (a scoped id) is one counter whichever key holds on it.
func modelCounterKey(keyID string, windowID policy.WindowID) string {
	if strings.HasPrefix(string(windowID), policy.BudgetIDPrefix) {
		return string(windowID)
	}
	return keyID + "/" + string(windowID)
}

// capOf is the highest cap counter key ck can have had during the run: its
// key's or budget's base cap plus every raise of that window added meanwhile;
// ok is false for a window without a cap.
func (m *modelRun) capOf(keyByID map[string]vault.Key, ck string) (limit int64, ok bool) {
	scope, windowID, _ := cutSlash(ck)
	var daily, period *decimal.Decimal
	if b, found := m.budgets[scope]; found {
		daily, period = b.DailyCap, b.PeriodCap
	} else {
		k := keyByID[scope]
		daily, period = k.Policy.DailyCap, k.Policy.PeriodCap
	}
	c, kind := daily, policy.WindowDaily
	if windowID == string(policy.PeriodWindowID) {
		c, kind = period, policy.WindowPeriod
	}
	if c == nil {
		return 0, false
	}
	v, err := policy.ToMinor("usd", *c)
	if err != nil {
		panic(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return v + m.raised[scope+"/"+string(kind)], true
}

// raise adds a raise of a random window of a random key or budget, ending
// within the round (the next round is hours later), so caps both grow and
// come back by themselves under the load.
func (m *modelRun) raise(ctx context.Context, clock *Clock, rng *rand.Rand) {
	scope := vault.RaiseScope{Kind: policy.ScopeKey, ID: m.keys[rng.IntN(len(m.keys))].ID}
	kind := []policy.WindowKind{policy.WindowDaily, policy.WindowPeriod}[rng.IntN(2)]
	if rng.IntN(2) == 0 {
		var ids []string
		for id := range m.budgets {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		scope = vault.RaiseScope{Kind: policy.ScopeBudget, ID: ids[rng.IntN(len(ids))]}
		kind = policy.WindowPeriod
		if m.budgets[scope.ID].DailyCap != nil {
			kind = policy.WindowDaily
		}
	}
	amount := 1 + rng.Int64N(2000)
	// Counted before it is added: a hold placed under the raise may be
	// checked before AddRaise returns.
	m.mu.Lock()
	if m.raised == nil {
		m.raised = map[string]int64{}
	}
	m.raised[scope.ID+"/"+string(kind)] += amount
	m.mu.Unlock()
	_, err := m.s.AddRaise(ctx, "model", scope, vault.NewRaise{Window: kind, Amount: amount,
		Until: clock.Now().Add(time.Duration(1+rng.IntN(60)) * time.Minute), Reason: "model"})
	switch {
	case err == nil:
		m.mu.Lock()
		m.raises++
		m.mu.Unlock()
	case errors.Is(err, vault.ErrConflict): // MaxActiveRaises active already
	default:
		m.problem("raise %s %s: %v", scope.ID, kind, err)
	}
}

// worker runs one goroutine's sequence of operations.
func (m *modelRun) worker(ctx context.Context, clock *Clock, w, round int, mine []*modelIdem, rng *rand.Rand) []*modelIdem {
	settle := func(mi *modelIdem) {
		out := []vault.SettleOutcome{vault.SettleCommit, vault.SettleCommit, vault.SettleRelease, vault.SettleUnknown, vault.SettleAbandon, ""}[rng.IntN(6)]
		if out == "" {
			return // left in flight for a later retry
		}
		req := vault.SettleRequest{KeyID: mi.keyID, IdempotencyKey: mi.idem, Outcome: out, UpstreamStatus: 200}
		var obj *modelObject
		switch out {
		case vault.SettleCommit:
			if mi.hold != nil {
				req.Amount = rng.Int64N(mi.hold.amount + 1) // at most what was held
				if rng.IntN(2) == 0 {
					// Against one of this worker's two money objects: at most what
					// was held plus its exposure; the rest of the hold stays
					// exposure, unless the answer is terminal. (Often enough that
					// commits draw on exposure in every run.)
					obj = m.object(mi.keyID, fmt.Sprintf("obj-w%02d-%d", w, rng.IntN(2)))
					req.Amount = rng.Int64N(mi.hold.amount + obj.held() + 1)
					req.ObjectID = obj.id
					req.Object = vault.ObjectSettle{Expose: true, Terminal: rng.IntN(5) == 0}
				}
			}
			req.Response = &vault.StoredResponse{Status: 200, Body: []byte("ok " + mi.idem)}
		case vault.SettleRelease:
			req.UpstreamStatus = 402
			req.Response = &vault.StoredResponse{Status: 402, Body: []byte("declined " + mi.idem)}
		case vault.SettleUnknown:
			req.UpstreamStatus = 500
		}
		if err := m.s.Settle(ctx, req); err != nil {
			m.problem("settle %s %s: %v", mi.idem, out, err)
			return
		}
		switch out {
		case vault.SettleCommit, vault.SettleRelease:
			mi.state, mi.body, mi.settled = vault.RecordCompleted, string(req.Response.Body), true
			if mi.hold != nil {
				mi.hold.state = vault.HoldReleased
				switch {
				case out == vault.SettleCommit && obj != nil:
					fromParts := min(req.Amount, obj.held())
					m.commitParts(obj, fromParts)
					fromHold := req.Amount - fromParts
					if req.Object.Terminal {
						obj.parts = nil
					} else if rest := mi.hold.amount - fromHold; rest > 0 {
						i := slices.IndexFunc(obj.parts, func(p modelPart) bool { return slices.Equal(p.windowIDs, mi.hold.windowIDs) })
						if i >= 0 {
							obj.parts[i].amount += rest
						} else {
							obj.parts = append(obj.parts, modelPart{windowIDs: mi.hold.windowIDs, amount: rest})
						}
					}
					mi.hold.state, mi.hold.amount = vault.HoldCommitted, fromHold
				case out == vault.SettleCommit:
					mi.hold.state, mi.hold.amount = vault.HoldCommitted, req.Amount
				}
			}
		case vault.SettleUnknown:
			mi.state = vault.RecordUnknown
			if mi.hold != nil {
				mi.hold.state = vault.HoldUnknown
			}
		case vault.SettleAbandon:
			if mi.fresh {
				mi.state, mi.hold = "", nil
			} else {
				mi.state = vault.RecordUnknown
				if mi.hold != nil {
					mi.hold.state = vault.HoldUnknown
				}
			}
		}
		mi.fresh, mi.lapsed = false, false
	}

	claim := func(mi *modelIdem, amount int64) {
		res, err := m.reserve(ctx, Charge(mi.keyID, mi.idem, amount))
		if err != nil {
			m.problem("reserve %s: %v", mi.idem, err)
			return
		}
		switch res.Outcome {
		case vault.ReserveRefused:
			m.mu.Lock()
			m.refusals++
			m.mu.Unlock()
			d := res.Decision
			if d.Reason != policy.ReasonCapExceeded {
				m.problem("reserve %s refused for %s", mi.idem, d.Reason)
			} else if d.Cap != policy.WindowPerRequest && d.Committed+d.Held+d.Requested <= d.Limit {
				m.problem("reserve %s refused with room: %+v", mi.idem, d)
			}
		case vault.ReserveClaimed:
			m.mu.Lock()
			m.claims++
			m.mu.Unlock()
			if res.Hold == nil || res.Hold.Amount != amount {
				m.problem("claimed %s without the right hold: %+v", mi.idem, res.Hold)
				return
			}
			mi.state, mi.fresh = vault.RecordInProgress, true
			mi.hold = &modelHold{amount: amount, windowIDs: res.Hold.WindowIDs, state: vault.HoldHeld}
			settle(mi)
		default:
			m.problem("new request %s: outcome %d", mi.idem, res.Outcome)
		}
	}

	for i := range m.ops {
		if m.split == nil && rng.IntN(25) == 0 {
			// (Not in the mutant's runs: a raise widens the bound the cap check
			// has to allow, and the mutant's excess is what they look for.)
			m.raise(ctx, clock, rng)
			continue
		}
		if rng.IntN(10) == 0 {
			// Stripe shows one of this worker's objects cancelled: its exposure goes.
			k := m.keys[rng.IntN(len(m.keys))]
			obj := m.object(k.ID, fmt.Sprintf("obj-w%02d-%d", w, rng.IntN(2)))
			changed, err := m.s.ObserveObject(ctx, k.ID, obj.id, vault.Observation{Terminal: true})
			if err != nil || changed != (len(obj.parts) > 0) {
				m.problem("observe %s: changed %v with %d parts, err %v", obj.id, changed, len(obj.parts), err)
			}
			obj.parts = nil
			continue
		}
		// Mostly new requests; sometimes a retry of one of ours.
		if len(mine) == 0 || rng.IntN(3) > 0 {
			k := m.keys[rng.IntN(len(m.keys))]
			mi := &modelIdem{keyID: k.ID, idem: fmt.Sprintf("w%02d-r%d-%04d", w, round, i)}
			mine = append(mine, mi)
			claim(mi, 1+rng.Int64N(3200)) // above the 30.00 per-request cap now and then
			runtime.Gosched()
			continue
		}
		mi := mine[rng.IntN(len(mine))]
		amount := int64(0)
		if mi.hold != nil {
			amount = mi.hold.amount
		}
		if mi.state == "" {
			claim(mi, 1+rng.Int64N(3200))
			continue
		}
		if rng.IntN(8) == 0 { // same key, different request
			req := Charge(mi.keyID, mi.idem, amount)
			req.Fingerprint = "other"
			res, err := m.reserve(ctx, req)
			if err != nil || res.Outcome != vault.ReserveMismatch {
				m.problem("mismatch %s: outcome %d err %v", mi.idem, res.Outcome, err)
			}
			continue
		}
		res, err := m.reserve(ctx, Charge(mi.keyID, mi.idem, amount))
		if err != nil {
			m.problem("retry %s: %v", mi.idem, err)
			continue
		}
		switch mi.state {
		case vault.RecordCompleted:
			if res.Outcome != vault.ReserveReplay || res.Record.Response == nil || string(res.Record.Response.Body) != mi.body {
				m.problem("retry of completed %s: outcome %d", mi.idem, res.Outcome)
			}
		case vault.RecordInProgress:
			if mi.lapsed {
				if res.Outcome != vault.ReserveResume {
					m.problem("retry of lapsed %s: outcome %d", mi.idem, res.Outcome)
					continue
				}
				mi.fresh, mi.lapsed = false, false
				settle(mi)
			} else if res.Outcome != vault.ReserveInFlight {
				m.problem("retry of in-flight %s: outcome %d", mi.idem, res.Outcome)
			} else {
				settle(mi)
			}
		case vault.RecordUnknown:
			if res.Outcome != vault.ReserveResume {
				m.problem("retry of unknown %s: outcome %d", mi.idem, res.Outcome)
				continue
			}
			if mi.hold != nil {
				if res.Hold == nil || res.Hold.Amount != mi.hold.amount {
					m.problem("resume %s with another hold: %+v", mi.idem, res.Hold)
				}
				mi.hold.state = vault.HoldHeld
			}
			mi.state, mi.fresh = vault.RecordInProgress, false
			settle(mi)
		}
	}
	return mine
}

// run runs the workers in two rounds, the second three hours later on the next
// day, so holds placed on one day settle on the next and leases have lapsed.
func (m *modelRun) run(clock *Clock, seed uint64) {
	ctx := context.Background()
	mine := make([][]*modelIdem, m.workers)
	for round := range 2 {
		var wg sync.WaitGroup
		for w := range m.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mine[w] = m.worker(ctx, clock, w, round, mine[w], rand.New(rand.NewPCG(seed, uint64(w+100*round))))
			}()
		}
		wg.Wait()
		for _, list := range mine {
			for _, mi := range list {
				if mi.state == vault.RecordInProgress {
					mi.lapsed = true
				}
			}
		}
		clock.Advance(3 * time.Hour)
	}
	for _, list := range mine {
		m.idems = append(m.idems, list...)
	}
}

// check compares the store with the model: every counter equals the model's sums,
// committed + held ≤ cap everywhere, and the store's own invariant check passes.
// It returns the cap violations separately: they are what the mutation test expects.
func (m *modelRun) check(t *testing.T) (capViolations []string) {
	t.Helper()
	type sums struct{ held, committed int64 }
	want := map[string]sums{}
	keyByID := map[string]vault.Key{}
	for _, k := range m.keys {
		keyByID[k.ID] = k
	}
	for _, o := range m.objects {
		for _, p := range o.parts {
			for _, w := range p.windowIDs {
				ck := modelCounterKey(o.keyID, w)
				sm := want[ck]
				sm.held += p.amount
				want[ck] = sm
			}
		}
	}
	for ck, n := range m.partCommitted {
		sm := want[ck]
		sm.committed += n
		want[ck] = sm
	}
	for _, mi := range m.idems {
		if mi.hold == nil {
			continue
		}
		for _, w := range mi.hold.windowIDs {
			ck := modelCounterKey(mi.keyID, w)
			sm := want[ck]
			switch mi.hold.state {
			case vault.HoldHeld, vault.HoldUnknown:
				sm.held += mi.hold.amount
			case vault.HoldCommitted:
				sm.committed += mi.hold.amount
			}
			want[ck] = sm
		}
	}
	got, err := engine.AllCounters(m.s.e, context.Background())
	require.NoError(t, err)
	var names []string
	for ck := range got {
		names = append(names, ck)
	}
	sort.Strings(names)
	for _, ck := range names {
		c := got[ck]
		if w := want[ck]; c.Held != w.held || c.Committed != w.committed {
			m.problem("counter %s: store committed %d held %d, model committed %d held %d", ck, c.Committed, c.Held, w.committed, w.held)
		}
		if limit, ok := m.capOf(keyByID, ck); ok && c.Committed+c.Held > limit {
			capViolations = append(capViolations, fmt.Sprintf("%s: committed %d + held %d > cap %d", ck, c.Committed, c.Held, limit))
		}
	}
	for ck, w := range want {
		if _, ok := got[ck]; !ok && (w.held != 0 || w.committed != 0) {
			m.problem("model has %s (%+v) but the store has no counter", ck, w)
		}
	}
	if err := m.s.CheckInvariant(context.Background()); err != nil {
		m.problem("store invariant: %v", err)
	}
	return capViolations
}

func cutSlash(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func modelSize() (workers, ops int) {
	if Long() {
		return 64, 400
	}
	return 32, 30
}

func testModelConcurrency(t *testing.T) {
	clock := NewClock(time.Date(2026, 9, 14, 22, 0, 0, 0, time.UTC))
	workers, ops := modelSize()
	s, keys, budgets := newModelStore(t, clock, 4, ops)
	m := &modelRun{s: s, keys: keys, budgets: budgets, workers: workers, ops: ops}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	m.run(clock, seed)
	violations := m.check(t)
	assert.Empty(t, violations, "committed + held ≤ cap on every window")
	assert.Empty(t, m.problems)
	var fromParts int64
	for _, n := range m.partCommitted {
		fromParts += n
	}
	t.Logf("%d claims, %d refusals, %d idempotency keys, %d money objects (%d committed from exposure), %d raises",
		m.claims, m.refusals, len(m.idems), len(m.objects), fromParts, m.raises)
	assert.Positive(t, fromParts, "commits drew on money objects' exposure")
	assert.Positive(t, m.refusals, "the load reaches the caps, so the caps are tested")
	assert.Positive(t, m.claims)
	assert.Positive(t, m.raises, "caps were raised under the load")
	onBudgets := 0
	for _, mi := range m.idems {
		if mi.hold != nil && slices.ContainsFunc(mi.hold.windowIDs, func(w policy.WindowID) bool {
			return strings.HasPrefix(string(w), policy.BudgetIDPrefix)
		}) {
			onBudgets++
		}
	}
	assert.Positive(t, onBudgets, "holds were placed on budget windows")
}

// testMutationSplitReserveIsCaught proves the concurrency check bites: a store that
// checks the cap in one transaction and places the hold in another must be caught
// exceeding a cap.
func testMutationSplitReserveIsCaught(t *testing.T) {
	for attempt := range 10 {
		clock := NewClock(time.Date(2026, 9, 14, 22, 0, 0, 0, time.UTC))
		workers, ops := modelSize()
		s, keys, budgets := newModelStore(t, clock, 4, ops)
		m := &modelRun{s: s, keys: keys, budgets: budgets, workers: workers, ops: ops, split: rendezvous(8, 50*time.Millisecond)}
		m.run(clock, uint64(attempt+1))
		violations := m.check(t)
		err := s.CheckInvariant(context.Background())
		require.NoError(t, s.Close()) // the cleanup's invariant check would fail, as it should
		if len(violations) > 0 {
			assert.ErrorIs(t, err, vault.ErrInvariant, "the store's own check sees it too")
			t.Logf("attempt %d: caught %d cap violations, e.g. %s", attempt, len(violations), violations[0])
			return
		}
	}
	t.Fatal("a check-then-write race in Reserve went undetected")
}

// rendezvous returns a split for the mutant's Reserve that holds each caller
// between its two transactions until n callers are there together, so that
// all n checked the caps before any of them places its hold: the race the
// mutant has, made to happen at once rather than hoped for from a sleep. wait
// bounds the hold, for the last callers of a round, which no n others join.
func rendezvous(n int, wait time.Duration) func() {
	var mu sync.Mutex
	gate, waiting := make(chan struct{}), 0
	return func() {
		mu.Lock()
		g := gate
		if waiting++; waiting == n {
			close(gate)
			gate, waiting = make(chan struct{}), 0
		}
		mu.Unlock()
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-g:
		case <-timer.C:
		}
	}
}

// testSameIdempotencyKeyConcurrently: 50 goroutines send the same request at once;
// exactly one claims (one hold), the others are in flight or get the replay.
func testSameIdempotencyKeyConcurrently(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	const n = 50
	start := make(chan struct{})
	results := make([]vault.ReserveOutcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := f.s.Reserve(ctx, Charge(f.key.ID, "same", 2500))
			if !assert.NoError(t, err) {
				return
			}
			results[i] = res.Outcome
			if res.Outcome == vault.ReserveClaimed {
				assert.NoError(t, f.s.Settle(ctx, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: "same",
					Outcome: vault.SettleCommit, Amount: 2500, Response: &vault.StoredResponse{Status: 200, Body: []byte("ok")}}))
			}
		}()
	}
	close(start)
	wg.Wait()
	count := map[vault.ReserveOutcome]int{}
	for _, o := range results {
		count[o]++
	}
	assert.Equal(t, 1, count[vault.ReserveClaimed], "exactly one claim: %v", count)
	assert.Equal(t, n-1, count[vault.ReserveInFlight]+count[vault.ReserveReplay], "the rest are in flight or replayed: %v", count)
	assert.Len(t, allHolds(t, f.s), 1)
	daily, period := usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{Committed: 2500}, daily, "money moved once")
	assert.Equal(t, policy.Counter{Committed: 2500}, period)
}
