package bolt

import (
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/vault/vaulttest"
)

// TestLogCrashRecovery kills the crash child (TestCrashChild) at every step of
// the log and the fold: tearing a record in the middle of its write, after the
// write and before its fdatasync, after the fdatasync and before anyone is
// told, before a fold's commit, after it and before its segment is removed,
// and after the removal. Each run's store is opened again and checked as
// after a kill at a random moment (checkAfterCrash): the invariant holds on
// every window, no acknowledged write is lost, no record is applied twice
// (the counters are the sum of the holds). A torn record is found at the end
// of the log and discarded; a segment already folded is found and skipped.
func TestLogCrashRecovery(t *testing.T) {
	t.Parallel()
	if os.Getenv(crashEnvPath) != "" {
		t.Skip("inside a crash child")
	}
	counts := []int{1, 7}
	if vaulttest.Long() {
		counts = []int{1, 2, 5, 13, 40, 111}
	}
	clock, path := crashStore(t)

	iter := 0
	for _, step := range []string{"write", "sync", "synced", "fold", "folded", "removed"} {
		for _, after := range counts {
			iter++
			lines := runCrashChild(t, path, iter, -1, crashEnvStep+"="+step, crashEnvAfter+"="+strconv.Itoa(after))
			st := logStateOf(t, path)
			switch step {
			case "write":
				assert.NotEmpty(t, st.torn, "%s #%d: the torn record is found at the end of the log", step, after)
			case "folded":
				assert.GreaterOrEqual(t, len(st.segments), 2, "%s #%d: the folded segment is still there beside the current one", step, after)
			}
			checkAfterCrash(t, path, clock, parseCrashLog(lines), iter)
			if t.Failed() {
				t.Fatalf("%s #%d failed; the child printed %d lines", step, after, len(lines))
			}
			segs, err := listSegments(path)
			require.NoError(t, err)
			assert.Empty(t, segs, "%s #%d: a clean close leaves no log", step, after)
		}
	}
}

// logStateOf reads the log a killed child left beside path, as Open would.
func logStateOf(t *testing.T, path string) logState {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	var folded uint64
	require.NoError(t, db.View(func(btx *bbolt.Tx) error { folded = readFolded(btx); return nil }))
	st, err := readLog(path, folded)
	require.NoError(t, err)
	return st
}
