package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"time"
)

// bench is one benchmark run and what it started.
type bench struct {
	cfg      Config
	progress io.Writer

	dir     string // temporary: the binary, the data directory
	fake    *fakeStripe
	fakeSrv *http.Server
	bare    *bareChild
	kb      *keybrakeChild
	pg      *pgBench // nil without --database-url

	secrets    keybrakeSecrets
	kbSecret   string // keybrake's upstream secret at the fake Stripe
	bareSecret string // the bare proxy's
	runID      string
	dbPath     string
	setup      storeSetup
	tokens     []string // "Bearer vk_…"
	// ok counts 200 answers by target name, warm-up included.
	ok        map[string]int
	peakNoted bool
}

// target is one of the proxies under load: the bare proxy, keybrake, or
// keybrake's replicas on PostgreSQL, which the load reaches in turn.
type target struct {
	name   string
	urls   []string
	pids   []int
	kbs    []*keybrakeChild // keybrake's processes, whose store counters are read
	tokens []string         // "Bearer vk_…" of the store the target serves
}

// run sets everything up, measures, stops keybrake and checks its store.
func (b *bench) run(ctx context.Context) (*Report, error) {
	cfg := b.cfg
	rep := &Report{
		Started: time.Now().UTC().Truncate(time.Second),
		Machine: Machine{
			CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
			Platform: runtime.GOOS + "/" + runtime.GOARCH, LoadAvgStart: loadAverage(), PressureStart: pressure(),
		},
		Config: ReportConfig{
			Concurrency: cfg.Concurrency, DurationSeconds: cfg.Duration.Seconds(), Rounds: cfg.Rounds,
			WarmupSeconds: cfg.Warmup.Seconds(), Keys: cfg.Keys, Budget: cfg.Budget, SeedRecords: cfg.SeedRecords,
			UpstreamLatencyMS: msOf(cfg.UpstreamLatency), ResponseBytes: cfg.ResponseBytes, KeybrakeLogLevel: cfg.LogLevel,
		},
		Check: CheckResult{Problems: []string{}},
	}
	if err := b.start(ctx, rep); err != nil {
		return nil, err
	}
	targets := append([]target{
		{name: "bare", urls: []string{b.bare.url}, pids: []int{b.bare.pid()}, tokens: b.tokens},
		{name: "keybrake", urls: []string{b.kb.url}, pids: []int{b.kb.pid()}, kbs: []*keybrakeChild{b.kb}, tokens: b.tokens},
	}, b.postgresTargets()...)
	boltBudget, pgBudget := b.budgetTokens()
	targets = append(targets, budgetTargets(targets[1:], boltBudget, pgBudget)...)
	b.ok = map[string]int{}
	if cfg.Warmup > 0 {
		fmt.Fprintf(b.progress, "warming up for %s per target…\n", cfg.Warmup)
		for _, t := range targets {
			r := b.load(t, cfg.maxConcurrencyOf(), b.runID+"-warmup-"+t.name).run(ctx, cfg.Warmup)
			b.ok[t.name] += r.ok
			if r.Errors > 0 {
				rep.Check.Problems = append(rep.Check.Problems, fmt.Sprintf("warm-up of %s: %d of %d requests failed (first: %s)",
					t.name, r.Errors, r.Requests, r.FirstError))
			}
		}
	}
	rep.Setup.DBBytesAfterWarmup = fileSize(b.dbPath)
	for _, conns := range cfg.Concurrency {
		cr, err := b.measure(ctx, rep, conns, targets)
		if err != nil {
			return nil, err
		}
		rep.Results = append(rep.Results, cr)
	}
	rep.Machine.LoadAvgEnd, rep.Machine.PressureEnd = loadAverage(), pressure()
	if err := b.check(ctx, &rep.Check); err != nil {
		return nil, err
	}
	if err := b.checkPostgres(ctx, &rep.Check); err != nil {
		return nil, err
	}
	return rep, nil
}

// start builds keybrake (unless given), starts the fake Stripe, prepares the
// store and starts both proxies.
func (b *bench) start(ctx context.Context, rep *Report) error {
	cfg := b.cfg
	var err error
	if b.dir, err = os.MkdirTemp(cfg.TempDir, "keybrake-bench-"); err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	rep.Machine.FileSystem = fsType(b.dir)
	if rep.Machine.FileSystem == "tmpfs" {
		rep.Notes = append(rep.Notes, "the database is on tmpfs, where an fsync costs nothing: keybrake looks faster than on a disk (--tmp-dir)")
	}
	bin := cfg.Keybrake
	if bin == "" {
		fmt.Fprintln(b.progress, "building keybrake…")
		if bin, err = BuildKeybrake(ctx, b.dir); err != nil {
			return err
		}
	}

	random := make([]byte, 32+32+8+8+6)
	if _, err := rand.Read(random); err != nil {
		return fmt.Errorf("generate secrets: %w", err)
	}
	b.secrets = keybrakeSecrets{masterKey: random[:32], jwtSecret: []byte(base64.RawURLEncoding.EncodeToString(random[32:64]))}
	b.kbSecret = "sk_test_keybrake_" + hex.EncodeToString(random[64:72])
	b.bareSecret = "sk_test_bare_" + hex.EncodeToString(random[72:80])
	b.runID = "bench-" + hex.EncodeToString(random[80:86])

	b.fake = newFakeStripe(cfg.UpstreamLatency, cfg.ResponseBytes, b.kbSecret, b.bareSecret, b.pgSecret())
	stripeURL, err := b.serveFake(ctx)
	if err != nil {
		return err
	}

	dataDir := filepath.Join(b.dir, "data")
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	b.dbPath = filepath.Join(dataDir, "keybrake.db")
	if cfg.Keys > 100 || cfg.SeedRecords > 0 {
		fmt.Fprintf(b.progress, "writing %d keys and %d records through the store…\n", cfg.Keys, cfg.SeedRecords)
	}
	b.setup, err = prepareStore(ctx, storeOptions{
		path: b.dbPath, masterKey: b.secrets.masterKey, secret: b.kbSecret, keys: cfg.Keys, records: cfg.SeedRecords, budget: cfg.Budget,
		body:     func(n int64) []byte { return []byte(chargeJSON(n, chargeAmount, b.fake.pad)) },
		progress: b.progress,
	})
	if err != nil {
		return fmt.Errorf("prepare the store: %w", err)
	}
	rep.Setup = SetupResult{Keys: cfg.Keys, SeedRecords: cfg.SeedRecords,
		SeedSeconds: round3(b.setup.seedTime.Seconds()), DBBytesAfterSeed: fileSize(b.dbPath)}
	for _, t := range b.setup.tokens {
		b.tokens = append(b.tokens, "Bearer "+t)
	}

	started := time.Now()
	if b.kb, err = startKeybrake(ctx, bin, dataDir, stripeURL, cfg.LogLevel, b.secrets, cfg.CPUProfile != ""); err != nil {
		return err
	}
	rep.Setup.KeybrakeStartSeconds = round3(time.Since(started).Seconds())
	if b.bare, err = startBare(ctx, stripeURL, b.bareSecret, b.progress); err != nil {
		return err
	}
	return b.startPostgres(ctx, rep, bin, stripeURL)
}

// measure runs cfg.Rounds rounds of each target in turn (bare, keybrake, and
// keybrake on PostgreSQL) at conns connections and pools them.
func (b *bench) measure(ctx context.Context, rep *Report, conns int, targets []target) (ConcResult, error) {
	cfg := b.cfg
	cr := ConcResult{Concurrency: conns}
	dbBefore := fileSize(b.dbPath)
	kb := targets[1]
	rounds := make([][]roundResult, len(targets))
	mems := make([]memStats, len(targets))
	peaks := make([]int64, len(targets))
	for round := 1; round <= cfg.Rounds; round++ {
		for i, t := range targets {
			fmt.Fprintf(b.progress, "%d connections, round %d of %d: %s…\n", conns, round, cfg.Rounds, t.name)
			b.fake.forget()
			for _, pid := range t.pids {
				if err := resetPeak(pid); err != nil && !b.peakNoted {
					b.peakNoted = true
					rep.Notes = append(rep.Notes, "peak RSS is since the process started: "+err.Error())
				}
			}
			var profiled chan error
			if cfg.CPUProfile != "" && conns == cfg.maxConcurrencyOf() && round == 1 {
				// keybrake on bbolt to the file named; a PostgreSQL target's
				// first replica to the name with the target's after it.
				child, path := b.kb, cfg.CPUProfile
				if t.name != kb.name {
					child, path = nil, cfg.CPUProfile+"."+t.name
					if len(t.kbs) > 0 && t.kbs[0].pprofURL != "" {
						child = t.kbs[0]
					}
				}
				if child != nil {
					profiled = make(chan error, 1)
					go func() { profiled <- child.cpuProfile(ctx, cfg.Duration, path) }()
				}
			}
			before := b.sample(ctx, t, false)
			r := b.load(t, conns, fmt.Sprintf("%s-%s-c%d-r%d", b.runID, t.name, conns, round)).run(ctx, cfg.Duration)
			b.sample(ctx, t, true).since(before, &r)
			if profiled != nil {
				if err := <-profiled; err != nil {
					return cr, err
				}
				rep.Profile = cfg.CPUProfile
			}
			if err := ctx.Err(); err != nil {
				return cr, err
			}
			b.ok[t.name] += r.ok
			rounds[i] = append(rounds[i], r)
			if m, err := readMems(t.pids); err == nil {
				peaks[i], mems[i] = max(peaks[i], m.PeakRSS), m
			}
		}
	}
	results := make([]TargetResult, len(targets))
	for i, t := range targets {
		results[i] = pool(rounds[i])
		results[i].PeakRSS, results[i].Mem = peaks[i], mems[i]
		if res := results[i]; res.Errors > 0 {
			rep.Check.Problems = append(rep.Check.Problems, fmt.Sprintf("%s at %d connections: %d of %d requests failed (first: %s)",
				t.name, conns, res.Errors, res.Requests, firstError(res.Rounds)))
		}
	}
	cr.Bare, cr.Keybrake = results[0], results[1]
	npg := len(b.postgresTargets())
	cr.Postgres = postgresResults(targets[2:2+npg], results[2:2+npg], cr.Bare, cr.Keybrake)
	cr.Budget = budgetResults(targets[2+npg:], results[1:2+npg], results[2+npg:])
	cr.DBBytes = fileSize(b.dbPath)
	if cr.Keybrake.Requests > 0 {
		cr.DBGrowthPerRequest = round3(float64(cr.DBBytes-dbBefore) / float64(cr.Keybrake.Requests))
	}
	cr.compare()
	return cr, nil
}

// counters are a target's cumulative counters at one moment; each is valid only
// if it could be read.
type counters struct {
	cpu               float64
	written           int64
	commits, ops      int64
	cpuOK, wOK, opsOK bool
}

// sample reads t's counters, summed over its processes: their CPU time and,
// for keybrake, their stores'. The scrape of /metrics costs keybrake CPU (it
// counts the unknown holds), so a round's CPU time is read inside the scrapes:
// after the one before the round (cpuFirst false), before the one after it
// (cpuFirst true).
func (b *bench) sample(ctx context.Context, t target, cpuFirst bool) counters {
	c := counters{cpuOK: true, wOK: true, opsOK: len(t.kbs) > 0}
	readCPUTime := func() {
		for _, pid := range t.pids {
			cpu, err := readCPU(pid)
			c.cpu, c.cpuOK = c.cpu+cpu, c.cpuOK && err == nil
			written, err := readWritten(pid)
			c.written, c.wOK = c.written+written, c.wOK && err == nil
		}
	}
	if cpuFirst {
		readCPUTime()
	}
	for _, kb := range t.kbs {
		commits, ops, err := kb.storeCounters(ctx)
		c.commits, c.ops, c.opsOK = c.commits+commits, c.ops+ops, c.opsOK && err == nil
	}
	if !cpuFirst {
		readCPUTime()
	}
	return c
}

// since puts the growth of the counters from before to c into r.
func (c counters) since(before counters, r *roundResult) {
	if c.cpuOK && before.cpuOK {
		r.CPUSeconds = round3(c.cpu - before.cpu)
	}
	if c.wOK && before.wOK {
		r.Written = c.written - before.written
	}
	if c.opsOK && before.opsOK {
		r.Commits, r.Ops = c.commits-before.commits, c.ops-before.ops
	}
}

// check stops keybrake (gracefully: the store is closed), reads what it
// committed and compares it with what the fake Stripe executed.
func (b *bench) check(ctx context.Context, k *CheckResult) error {
	err := b.kb.stop()
	b.kb = nil
	if err != nil {
		return err
	}
	totals, err := readTotals(ctx, b.dbPath, b.secrets.masterKey, b.setup.keyIDs)
	if err != nil {
		return fmt.Errorf("read keybrake's totals: %w", err)
	}
	kt, bt := b.fake.tally(b.kbSecret), b.fake.tally(b.bareSecret)
	k.StripeCharges, k.StripeAmount, k.Answered200 = kt.charges.Load(), kt.amount.Load(), b.ok["keybrake"]+b.ok["keybrake"+budgetSuffix]
	k.SeededAmount, k.Committed, k.Held = b.setup.seeded, totals.Committed, totals.Held
	k.BareCharges, k.Bare200 = bt.charges.Load(), b.ok["bare"]
	k.Problems = append(k.Problems, k.consistency()...)
	return nil
}

// consistency lists where the store does not account for what the fake Stripe
// executed.
func (k *CheckResult) consistency() []string {
	var p []string
	if k.Committed != k.SeededAmount+k.StripeAmount {
		p = append(p, fmt.Sprintf("keybrake committed %s usd; the fake Stripe executed %s usd for it, plus %s usd seeded",
			usd(k.Committed), usd(k.StripeAmount), usd(k.SeededAmount)))
	}
	if k.Held != 0 {
		p = append(p, fmt.Sprintf("%s usd is still held after every request was answered", usd(k.Held)))
	}
	if k.StripeCharges != int64(k.Answered200) {
		p = append(p, fmt.Sprintf("the fake Stripe executed %d charges for keybrake, which answered %d with 200", k.StripeCharges, k.Answered200))
	}
	if k.BareCharges != int64(k.Bare200) {
		p = append(p, fmt.Sprintf("the fake Stripe executed %d charges for the bare proxy, which answered %d with 200", k.BareCharges, k.Bare200))
	}
	return p
}

// load is a round against t with conns connections.
func (b *bench) load(t target, conns int, runID string) *load {
	urls := make([]string, len(t.urls))
	for i, u := range t.urls {
		urls[i] = u + "/v1/charges"
	}
	return &load{urls: urls, tokens: t.tokens, conns: conns, runID: runID, timeout: b.cfg.Timeout}
}

// serveFake serves the fake Stripe on 127.0.0.1 and returns its URL.
func (b *bench) serveFake(ctx context.Context) (string, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("fake stripe: %w", err)
	}
	b.fakeSrv = &http.Server{
		Handler:           b.fake,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() { _ = b.fakeSrv.Serve(ln) }() // ErrServerClosed once close shuts it
	return "http://" + ln.Addr().String(), nil
}

// close stops the children and the fake Stripe and removes the temporary
// directory.
func (b *bench) close() error {
	var errs []error
	if b.kb != nil {
		if err := b.kb.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if b.bare != nil {
		if err := b.bare.stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop bare proxy: %w", err))
		}
	}
	if b.pg != nil {
		errs = append(errs, b.pg.close())
	}
	if b.fakeSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := b.fakeSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop fake stripe: %w", err))
		}
		cancel()
	}
	if b.dir != "" {
		if err := os.RemoveAll(b.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", b.dir, err))
		}
	}
	return errors.Join(errs...)
}

// fileSize is the size of the file at path (0 if it cannot be read).
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func firstError(rounds []roundResult) string {
	for _, r := range rounds {
		if r.FirstError != "" {
			return r.FirstError
		}
	}
	return ""
}
