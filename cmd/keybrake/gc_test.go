package main

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestTuneGC: serve lets the heap grow further between collections, under a
// soft limit, unless the operator set GOGC or GOMEMLIMIT.
func TestTuneGC(t *testing.T) {
	prevPercent := debug.SetGCPercent(100)
	prevLimit := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(prevPercent)
		debug.SetMemoryLimit(prevLimit)
	})

	tuneGC(func(string) string { return "" })
	assert.Equal(t, serveGCPercent, debug.SetGCPercent(100), "applied")
	assert.Equal(t, int64(serveMemoryGoal), debug.SetMemoryLimit(math.MaxInt64), "applied")

	set := map[string]string{"GOGC": "150", "GOMEMLIMIT": "1GiB"}
	tuneGC(func(k string) string { return set[k] })
	assert.Equal(t, 100, debug.SetGCPercent(100), "the operator's GOGC stands")
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(math.MaxInt64), "the operator's GOMEMLIMIT stands")
}
