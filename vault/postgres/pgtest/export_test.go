package pgtest

import "os"

// SweepLeftovers removes the directories that dead test binaries left in
// os.TempDir(), as the next cluster start would.
func SweepLeftovers() { sweepLeftovers(os.TempDir()) }
