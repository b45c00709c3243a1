//go:build race

package main

// raceEnabled says whether the tests run with the race detector.
const raceEnabled = true
