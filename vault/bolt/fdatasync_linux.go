package bolt

import (
	"os"
	"syscall"
)

// fdatasync makes f's data durable without its timestamps, as bbolt does on
// Linux.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
