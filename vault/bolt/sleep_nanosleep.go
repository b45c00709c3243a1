//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package bolt

import (
	"syscall"
	"time"
)

// sleepInKernel blocks the calling thread for about d (the kernel's timer
// slack adds some tens of microseconds), without the runtime's timers.
func sleepInKernel(d time.Duration) {
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	_ = syscall.Nanosleep(&ts, nil) // interrupted early: the caller looks again
}
