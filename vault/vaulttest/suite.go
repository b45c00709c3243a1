// Package vaulttest is the conformance suite of vault.Store: the tests every
// store must pass, run by each implementation's own tests against a real
// instance of its engine (a bbolt file in a temporary directory, a PostgreSQL
// database of vault/postgres/pgtest):
//
//	func TestConformance(t *testing.T) {
//		vaulttest.Run(t, func(tb testing.TB, o vaulttest.Options) (vault.Store, *engine.Engine) {
//			s, err := bolt.Open(filepath.Join(tb.TempDir(), "keybrake.db"), bolt.Options{MasterKey: o.MasterKey, Now: o.Now, …})
//			require.NoError(tb, err)
//			return s, s.Engine
//		})
//	}
//
// The suite covers the contract: keys, upstreams, the metering of holds and
// money objects with their caps and windows (time zones, daylight saving, the
// time-zone carry), idempotency records, the claims API with leases and
// fencing, the reaper (retention and clock jumps), the recovery of in-flight
// records whose lease lapsed, the dashboard's queries, the ledger and the
// invariant check, and a model-based concurrency test against an in-memory
// model. Each test's store is checked by CheckInvariant at cleanup. A backend
// keeps what only it has (a file format, a group committer, crash loops,
// restarts of a server) in its own tests.
//
// Some tests look below the contract, or corrupt a store on purpose, through
// the engine's test hooks (vault/internal/engine), which read and write the
// same records whatever the backend.
package vaulttest

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// Options are what a test asks of the store it opens. Zero durations take the
// store's defaults.
type Options struct {
	// MasterKey seals the store's secrets (the suite's test key unless a test
	// sets another).
	MasterKey []byte
	// Now is the store's clock: every test drives time through it. A store
	// whose production clock is not the process's (PostgreSQL's is the
	// database's) must still use this one under test.
	Now               func() time.Time
	IdempotencyTTL    time.Duration
	UnknownRetryLimit time.Duration
	Lease             time.Duration
	LedgerRetention   time.Duration
}

// Opener opens a new, empty store for tb with o and returns it with the engine
// it runs on. The suite closes the store (after checking its invariant); the
// opener cleans up whatever else it made.
type Opener func(tb testing.TB, o Options) (vault.Store, *engine.Engine)

// Store is a store under test: the contract, and the engine below it for the
// test hooks.
type Store struct {
	vault.Store
	e      *engine.Engine
	closed bool
}

// Close closes the store once; the cleanup does not check a closed store.
func (s *Store) Close() error {
	s.closed = true
	return s.Store.Close()
}

// openers maps each running Run's test name to its opener, so that the
// tests' helpers open stores of the backend under test.
var openers = struct {
	sync.Mutex
	m map[string]Opener
}{m: map[string]Opener{}}

// openerOf returns the opener of the Run that tb runs under.
func openerOf(tb testing.TB) Opener {
	tb.Helper()
	root, _, _ := strings.Cut(tb.Name(), "/")
	openers.Lock()
	defer openers.Unlock()
	open, ok := openers.m[root]
	if !ok {
		tb.Fatalf("vaulttest: %s does not run under vaulttest.Run", tb.Name())
	}
	return open
}

// Run runs the conformance suite against the stores open opens, one subtest
// per test, in parallel with each other (each has a store of its own, and a
// suite test shares nothing else: no environment, no global, no fixed port),
// so that the waits of one on its store's disk overlap another's work. Call it
// from a top-level test.
func Run(t *testing.T, open Opener) {
	if strings.Contains(t.Name(), "/") {
		t.Fatal("vaulttest.Run must be called from a top-level test")
	}
	openers.Lock()
	openers.m[t.Name()] = open
	openers.Unlock()
	t.Cleanup(func() {
		openers.Lock()
		delete(openers.m, t.Name())
		openers.Unlock()
	})
	for _, tc := range suite {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t)
		})
	}
}
