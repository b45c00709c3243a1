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
}

// target is one of the two proxies under load.
type target struct {
	name string
	url  string
	pid  int
}

// run sets everything up, measures, stops keybrake and checks its store.
func (b *bench) run(ctx context.Context) (*Report, error) {
	cfg := b.cfg
	rep := &Report{
		Started: time.Now().UTC().Truncate(time.Second),
		Machine: Machine{
			CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
			Platform: runtime.GOOS + "/" + runtime.GOARCH, LoadAvgStart: loadAverage(),
		},
		Config: ReportConfig{
			Concurrency: cfg.Concurrency, DurationSeconds: cfg.Duration.Seconds(), Rounds: cfg.Rounds,
			WarmupSeconds: cfg.Warmup.Seconds(), Keys: cfg.Keys, SeedRecords: cfg.SeedRecords,
			UpstreamLatencyMS: msOf(cfg.UpstreamLatency), ResponseBytes: cfg.ResponseBytes, KeybrakeLogLevel: cfg.LogLevel,
		},
		Check: CheckResult{Problems: []string{}},
	}
	var err error
	if b.dir, err = os.MkdirTemp("", "keybrake-bench-"); err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	bin := cfg.Keybrake
	if bin == "" {
		fmt.Fprintln(b.progress, "building keybrake…")
		if bin, err = BuildKeybrake(ctx, b.dir); err != nil {
			return nil, err
		}
	}

	random := make([]byte, 32+32+8+8)
	if _, err := rand.Read(random); err != nil {
		return nil, fmt.Errorf("generate secrets: %w", err)
	}
	secrets := keybrakeSecrets{masterKey: random[:32], jwtSecret: []byte(base64.RawURLEncoding.EncodeToString(random[32:64]))}
	kbSecret, bareSecret := "sk_test_keybrake_"+hex.EncodeToString(random[64:72]), "sk_test_bare_"+hex.EncodeToString(random[72:80])
	runID := "bench-" + hex.EncodeToString(random[64:70])

	b.fake = newFakeStripe(cfg.UpstreamLatency, cfg.ResponseBytes, kbSecret, bareSecret)
	stripeURL, err := b.serveFake(ctx)
	if err != nil {
		return nil, err
	}

	dataDir := filepath.Join(b.dir, "data")
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	dbPath := filepath.Join(dataDir, "keybrake.db")
	if cfg.Keys > 100 || cfg.SeedRecords > 0 {
		fmt.Fprintf(b.progress, "writing %d keys and %d records through the store…\n", cfg.Keys, cfg.SeedRecords)
	}
	setup, err := prepareStore(ctx, storeOptions{
		path: dbPath, masterKey: secrets.masterKey, secret: kbSecret, keys: cfg.Keys, records: cfg.SeedRecords,
		body:     func(n int64) []byte { return []byte(chargeJSON(n, chargeAmount, b.fake.pad)) },
		progress: b.progress,
	})
	if err != nil {
		return nil, fmt.Errorf("prepare the store: %w", err)
	}
	rep.Setup = SetupResult{Keys: cfg.Keys, SeedRecords: cfg.SeedRecords, SeedSeconds: round3(setup.seedTime.Seconds()), DBBytesAfterSeed: fileSize(dbPath)}
	tokens := make([]string, len(setup.tokens))
	for i, t := range setup.tokens {
		tokens[i] = "Bearer " + t
	}

	b.kb, err = startKeybrake(ctx, bin, dataDir, stripeURL, cfg.LogLevel, secrets, cfg.CPUProfile != "")
	if err != nil {
		return nil, err
	}
	b.bare, err = startBare(ctx, stripeURL, bareSecret, b.progress)
	if err != nil {
		return nil, err
	}
	bare := target{name: "bare", url: b.bare.url, pid: b.bare.pid()}
	kb := target{name: "keybrake", url: b.kb.url, pid: b.kb.pid()}
	ok := map[string]int{} // 200 answers by target, warm-up included

	if cfg.Warmup > 0 {
		fmt.Fprintf(b.progress, "warming up for %s per target…\n", cfg.Warmup)
		for _, t := range []target{bare, kb} {
			r := b.load(t, tokens, cfg.maxConcurrencyOf(), runID+"-warmup-"+t.name).run(ctx, cfg.Warmup)
			ok[t.name] += r.ok
			if r.Errors > 0 {
				rep.Check.Problems = append(rep.Check.Problems, fmt.Sprintf("warm-up of %s: %d of %d requests failed (first: %s)", t.name, r.Errors, r.Requests, r.FirstError))
			}
		}
	}
	rep.Setup.DBBytesAfterWarmup = fileSize(dbPath)

	peakNote := false
	for _, conns := range cfg.Concurrency {
		cr := ConcResult{Concurrency: conns}
		dbBefore := fileSize(dbPath)
		var rounds [2][]roundResult
		var peaks [2]int64
		var mems [2]memStats
		for round := 1; round <= cfg.Rounds; round++ {
			for i, t := range []target{bare, kb} {
				fmt.Fprintf(b.progress, "%d connections, round %d of %d: %s…\n", conns, round, cfg.Rounds, t.name)
				b.fake.forget()
				if err := resetPeak(t.pid); err != nil && !peakNote {
					peakNote = true
					rep.Notes = append(rep.Notes, "peak RSS is since the process started: "+err.Error())
				}
				var profiled chan error
				if t.name == kb.name && cfg.CPUProfile != "" && conns == cfg.maxConcurrencyOf() && round == 1 {
					profiled = make(chan error, 1)
					go func() { profiled <- b.kb.cpuProfile(ctx, cfg.Duration, cfg.CPUProfile) }()
				}
				r := b.load(t, tokens, conns, fmt.Sprintf("%s-%s-c%d-r%d", runID, t.name, conns, round)).run(ctx, cfg.Duration)
				if profiled != nil {
					if err := <-profiled; err != nil {
						return nil, err
					}
					rep.Profile = cfg.CPUProfile
				}
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				ok[t.name] += r.ok
				rounds[i] = append(rounds[i], r)
				if m, err := readMem(t.pid); err == nil {
					peaks[i], mems[i] = max(peaks[i], m.PeakRSS), m
				}
			}
		}
		cr.Bare, cr.Keybrake = pool(rounds[0]), pool(rounds[1])
		cr.Bare.PeakRSS, cr.Bare.Mem = peaks[0], mems[0]
		cr.Keybrake.PeakRSS, cr.Keybrake.Mem = peaks[1], mems[1]
		cr.DBBytes = fileSize(dbPath)
		if cr.Keybrake.Requests > 0 {
			cr.DBGrowthPerRequest = round3(float64(cr.DBBytes-dbBefore) / float64(cr.Keybrake.Requests))
		}
		cr.compare()
		for _, t := range []struct {
			name string
			res  TargetResult
		}{{"bare", cr.Bare}, {"keybrake", cr.Keybrake}} {
			if t.res.Errors > 0 {
				rep.Check.Problems = append(rep.Check.Problems, fmt.Sprintf("%s at %d connections: %d of %d requests failed (first: %s)",
					t.name, conns, t.res.Errors, t.res.Requests, firstError(t.res.Rounds)))
			}
		}
		rep.Results = append(rep.Results, cr)
	}
	rep.Machine.LoadAvgEnd = loadAverage()

	// Stop keybrake (gracefully: the store is closed) and read what it committed.
	err = b.kb.stop()
	b.kb = nil
	if err != nil {
		return nil, err
	}
	totals, err := readTotals(ctx, dbPath, secrets.masterKey, setup.keyIDs)
	if err != nil {
		return nil, fmt.Errorf("read keybrake's totals: %w", err)
	}
	kt, bt := b.fake.tally(kbSecret), b.fake.tally(bareSecret)
	k := &rep.Check
	k.StripeCharges, k.StripeAmount, k.Answered200 = kt.charges.Load(), kt.amount.Load(), ok[kb.name]
	k.SeededAmount, k.Committed, k.Held = setup.seeded, totals.Committed, totals.Held
	k.BareCharges, k.Bare200 = bt.charges.Load(), ok[bare.name]
	k.Problems = append(k.Problems, k.consistency()...)
	return rep, nil
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

// load is a round of cfg's kind against t.
func (b *bench) load(t target, tokens []string, conns int, runID string) *load {
	return &load{url: t.url + "/v1/charges", tokens: tokens, conns: conns, runID: runID, timeout: b.cfg.Timeout}
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
