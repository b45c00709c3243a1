package pgtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFindServer(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	install := func(dir string, programs ...string) string {
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for _, p := range programs {
			require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755))
		}
		return dir
	}
	debian := filepath.Join(root, "lib", "*", "bin")
	install(filepath.Join(root, "lib", "9.6", "bin"), "initdb", "postgres")
	v10 := install(filepath.Join(root, "lib", "10", "bin"), "initdb", "postgres")
	v15 := install(filepath.Join(root, "lib", "15", "bin"), "initdb", "postgres")
	install(filepath.Join(root, "lib", "17", "bin"), "initdb") // half installed
	// A PATH directory with links, as /usr/local/bin may have.
	linked := install(filepath.Join(root, "linked"))
	require.NoError(t, os.Symlink(filepath.Join(v10, "initdb"), filepath.Join(linked, "initdb")))
	lonely := install(filepath.Join(root, "lonely"), "initdb") // no postgres next to it

	for name, c := range map[string]struct {
		path string
		want string
	}{
		"the newest complete Debian version":   {path: "", want: v15},
		"PATH first, links resolved":           {path: lonely + string(filepath.ListSeparator) + linked, want: v10},
		"an initdb without postgres is passed": {path: lonely, want: v15},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := findServer(c.path, debian)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}

	t.Run("none", func(t *testing.T) {
		_, err := findServer(lonely, filepath.Join(root, "nowhere", "*", "bin"))
		require.ErrorIs(t, err, errUnavailable)
		assert.Contains(t, err.Error(), "apt-get install postgresql")
		assert.Contains(t, err.Error(), EnvDatabaseURL)
	})
}

func TestUnavailableSkipsUnlessCI(t *testing.T) {
	noServer := fmt.Errorf("%w: no initdb", errUnavailable)
	for name, c := range map[string]struct {
		ci       string
		err      error
		wantSkip bool
	}{
		"no server":            {ci: "", err: noServer, wantSkip: true},
		"no server, CI":        {ci: "true", err: noServer, wantSkip: false},
		"a server that failed": {ci: "", err: errors.New("initdb: exit status 1"), wantSkip: false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("CI", c.ci)
			r := &recordingTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				unavailable(r, c.err)
			}()
			<-done
			assert.Equal(t, c.wantSkip, r.skipped, r.msg)
			assert.Equal(t, !c.wantSkip, r.failed, r.msg)
			assert.Contains(t, r.msg, c.err.Error())
		})
	}
}

// recordingTB records a Skipf or Fatalf and ends the goroutine as they would.
type recordingTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestDatabaseName(t *testing.T) {
	t.Parallel()
	t.Run("A very long name, with Spaces/and/slashes, longer than forty bytes", func(t *testing.T) {
		a, b := databaseName(t), databaseName(t)
		assert.NotEqual(t, a, b)
		assert.Regexp(t, `^kbtest_testdatabasename_a_very_long_name_[0-9a-f]{8}$`, a)
		assert.LessOrEqual(t, len(a), 63, "PostgreSQL's identifier limit")
	})
}

func TestMajorVersion(t *testing.T) {
	t.Parallel()
	for version, want := range map[string]int{
		"PostgreSQL 15.18 (Debian 15.18-0+deb12u1)": 15,
		"PostgreSQL 9.6.24":                         9,
		"PostgreSQL 17beta1":                        17,
		"PostgreSQL ?":                              0,
		"":                                          0,
	} {
		assert.Equal(t, want, majorVersion(version), version)
	}
}

func TestCreateFromCopiesFilesOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	assert.Equal(t, `CREATE DATABASE "a" TEMPLATE "tpl"`, createFrom("a", "tpl", false))
	assert.Equal(t, `CREATE DATABASE "a" TEMPLATE "tpl" STRATEGY FILE_COPY`, createFrom("a", "tpl", true))
	assert.NotContains(t, createFrom("a", "", true), "STRATEGY", "a database from template0 is not a copy")
}

// Creating and dropping the tests' databases reuses the server's admin
// sessions: one new session for statements run one after another, not one
// per statement.
func TestAdminStatementsShareASession(t *testing.T) {
	c := sharedCluster(t)
	pool, err := admins.pool(c.socketURL())
	require.NoError(t, err)
	require.NoError(t, c.admin("SELECT 1"))
	before := pool.Stat().NewConnsCount()
	for range 5 {
		name := databaseName(t)
		require.NoError(t, c.admin(createDatabase(name)))
		require.NoError(t, c.admin(dropDatabase(name)))
	}
	assert.LessOrEqual(t, pool.Stat().NewConnsCount()-before, int64(1), "ten statements, one after another")
}

// BenchmarkStartCluster measures a cluster's start (initdb, start, password)
// and stop: what the first test of a binary that needs PostgreSQL waits for.
func BenchmarkStartCluster(b *testing.B) {
	for b.Loop() {
		c, err := startCluster()
		if err != nil {
			unavailable(b, err)
		}
		if err := c.close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDatabase measures creating and dropping one test's database: what
// every other test waits for.
func BenchmarkDatabase(b *testing.B) {
	c := NewCluster(b)
	for b.Loop() {
		name := databaseName(b)
		if err := c.admin(createDatabase(name)); err != nil {
			b.Fatal(err)
		}
		if err := c.admin(dropDatabase(name)); err != nil {
			b.Fatal(err)
		}
	}
}
