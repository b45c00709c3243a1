package main

import (
	"os"
	"regexp"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProcReadersOnThisProcess(t *testing.T) {
	pid := os.Getpid()
	m, err := readMem(pid)
	require.NoError(t, err)
	assert.Positive(t, m.PeakRSS)
	assert.GreaterOrEqual(t, m.PeakRSS, m.RSS)
	assert.Positive(t, m.RSSAnon)
	assert.LessOrEqual(t, m.RSSAnon+m.RSSFile, m.RSS)

	before, err := readCPU(pid)
	require.NoError(t, err)
	for i := 0; ; i++ { // burn a little CPU: at least one 10 ms tick
		if now, err := readCPU(pid); err == nil && now > before {
			break
		}
		require.Less(t, i, 1<<30, "the CPU time never grew")
	}

	if _, err := os.Stat("/proc/self/io"); err == nil {
		_, err := readWritten(pid)
		assert.NoError(t, err)
	}
	if _, err := os.Stat("/proc/pressure/cpu"); err == nil {
		assert.Regexp(t, regexp.MustCompile(`^cpu [0-9.]+%, io [0-9.]+%$`), pressure())
	}
	assert.Regexp(t, regexp.MustCompile(`^[0-9.]+ [0-9.]+ [0-9.]+$`), loadAverage())
	assert.NotEmpty(t, fsType(t.TempDir()))

	// Raise the peak by 64 MiB, give the memory back, and reset: the peak falls.
	// The memory is mapped and unmapped directly, so neither the garbage
	// collector nor the race detector's shadow memory decides when it is gone.
	high := func() memStats {
		big, err := syscall.Mmap(-1, 0, 64<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		require.NoError(t, err)
		defer func() { require.NoError(t, syscall.Munmap(big)) }()
		for i := 0; i < len(big); i += os.Getpagesize() {
			big[i] = 1
		}
		high, err := readMem(pid)
		require.NoError(t, err)
		return high
	}()
	require.GreaterOrEqual(t, high.PeakRSS, m.RSS+(48<<20))
	require.NoError(t, resetPeak(pid))
	after, err := readMem(pid)
	require.NoError(t, err)
	assert.Less(t, after.PeakRSS, high.PeakRSS-(32<<20), "the peak of the next round only")
}
