//go:build !race

package main

// raceEnabled says the tests run with -race, so binaries they build use it too.
const raceEnabled = false
