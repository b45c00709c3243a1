package main

import (
	"runtime/debug"
)

// The garbage collector's settings for serve, unless the operator set GOGC or
// GOMEMLIMIT. serve's live heap is small (tens of MiB) and it allocates per
// request, so Go's default (collect each time the heap doubles) spends about a
// fifth of its CPU collecting. Letting the heap grow to five times what is live
// gave 20–25 % more requests per second in keybrake-bench for 10–20 MiB more
// heap (docs/decisions/0024); the soft limit makes the collector work harder
// again before the heap passes it.
const (
	serveGCPercent  = 400
	serveMemoryGoal = 256 << 20
)

// tuneGC applies serveGCPercent and serveMemoryGoal where getenv shows that
// the operator chose neither.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(serveGCPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(serveMemoryGoal)
	}
}
