package pgtest

// SweepLeftovers removes the directories that dead test binaries left, as the
// next cluster start would.
func SweepLeftovers() { sweepAllLeftovers() }
