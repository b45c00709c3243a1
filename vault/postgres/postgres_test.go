package postgres

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// migrated is a database with the schema's migrations applied, prepared once
// per test binary: the tests that do not test migrating itself start from a
// copy of it.
var migrated = pgtest.NewTemplate("schema", func(ctx context.Context, url string) error {
	_, err := Migrate(ctx, url)
	return err
})

// TestConformance runs the store contract's conformance suite on PostgreSQL,
// each test on a database of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	vaulttest.Run(t, func(tb testing.TB, o vaulttest.Options) (vault.Store, *engine.Engine) {
		s := mustOpenURL(tb, migrated.URL(tb), o)
		return s, s.Engine
	})
}

// mustOpenURL opens a store on the database at url with the test's options;
// the caller closes it (the conformance suite does), and the cleanup closes
// it if nobody did.
func mustOpenURL(tb testing.TB, url string, o vaulttest.Options) *Store {
	tb.Helper()
	s, err := Open(context.Background(), url, Options{
		MasterKey: o.MasterKey, UnsafeNow: o.Now, IdempotencyTTL: o.IdempotencyTTL,
		UnknownRetryLimit: o.UnknownRetryLimit, Lease: o.Lease, LedgerRetention: o.LedgerRetention,
		Logger: vaulttest.QuietLogger(),
	})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	return s
}
