package postgres

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault/vaulttest"
)

// TestByteaArrayEncoding: what byteaArrayCodec writes is the array pgx's own
// encoding writes — every element's bytes, an empty element as an empty
// bytea, a nil one as NULL, an empty array as one, a nil one as NULL — as
// the server reads it.
func TestByteaArrayEncoding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpenURL(t, migrated.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey})
	conn, err := s.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, a := range [][][]byte{
		{[]byte("a"), {0, 1, 2, 0xff}, {}},
		{[]byte("x"), nil, []byte("y")},
		{},
		nil,
	} {
		var mine, pgxs []string
		require.NoError(t, conn.QueryRow(ctx, "SELECT array(SELECT coalesce(encode(e, 'hex'), 'NULL') FROM unnest($1::bytea[]) AS e)",
			byteaArray(a)).Scan(&mine))
		require.NoError(t, conn.QueryRow(ctx, "SELECT array(SELECT coalesce(encode(e, 'hex'), 'NULL') FROM unnest($1::bytea[]) AS e)",
			a).Scan(&pgxs))
		assert.Equal(t, pgxs, mine)
		assert.Len(t, mine, len(a))
	}
}
