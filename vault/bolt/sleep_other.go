//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package bolt

import "time"

// sleepInKernel sleeps for about d; where no nanosleep is at hand, on the
// runtime's timers.
func sleepInKernel(d time.Duration) { time.Sleep(d) }
