package main

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// assertNoTempFiles checks that dir holds no temporary file of writeTemp.
func assertNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	leftovers, err := filepath.Glob(filepath.Join(dir, ".*.tmp-*"))
	require.NoError(t, err)
	assert.Empty(t, leftovers, "no temporary file left")
}

// The generated secrets (writeFileExclusive) and the backup copy (writeFileAtomic)
// share writeTemp: both must end as a complete file of mode 0600 or leave nothing.
func TestWriteFileExclusive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, jwtSecretFile)

	created, err := writeFileExclusive(path, []byte("first\n"))
	require.NoError(t, err)
	assert.True(t, created)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	created, err = writeFileExclusive(path, []byte("second\n"))
	require.NoError(t, err)
	assert.False(t, created, "an existing file is kept")
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "first\n", string(got), "an existing file is never overwritten")
	assertNoTempFiles(t, dir)
}

func TestWriteFileAtomic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "copy.db")
	fill := func(s string) func(io.Writer) (int64, error) {
		return func(w io.Writer) (int64, error) { return io.Copy(w, strings.NewReader(s)) }
	}

	n, err := writeFileAtomic(path, fill("old copy"))
	require.NoError(t, err)
	assert.EqualValues(t, len("old copy"), n)
	n, err = writeFileAtomic(path, fill("new copy"))
	require.NoError(t, err)
	assert.EqualValues(t, len("new copy"), n)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "new copy", string(got), "a later copy replaces the file")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	boom := errors.New("boom")
	_, err = writeFileAtomic(path, func(w io.Writer) (int64, error) {
		_, _ = io.WriteString(w, "half a co")
		return 9, boom
	})
	require.ErrorIs(t, err, boom)
	got, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "new copy", string(got), "a failed copy leaves the file untouched")
	assertNoTempFiles(t, dir)
}

func TestDialableURL(t *testing.T) {
	t.Parallel()
	tests := map[string]struct{ addr, want string }{
		"ipv4 unspecified": {"0.0.0.0:8080", "http://127.0.0.1:8080"},
		"ipv6 unspecified": {"[::]:8080", "http://127.0.0.1:8080"},
		"loopback":         {"127.0.0.1:8081", "http://127.0.0.1:8081"},
		"ipv6 loopback":    {"[::1]:8081", "http://[::1]:8081"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			addr, err := net.ResolveTCPAddr("tcp", tc.addr)
			require.NoError(t, err)
			assert.Equal(t, tc.want, dialableURL(addr, false))
			assert.Equal(t, "https"+strings.TrimPrefix(tc.want, "http"), dialableURL(addr, true))
		})
	}
}
