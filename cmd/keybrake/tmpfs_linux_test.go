//go:build linux

package main

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// MustSmallFileSystem mounts a tmpfs of size bytes in a temporary directory
// and unmounts it in tb.Cleanup: a file system that really fills up. It
// skips the test where mounting is not allowed (not root, no CAP_SYS_ADMIN).
func MustSmallFileSystem(tb testing.TB, size int64) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "small")
	require.NoError(tb, os.Mkdir(dir, 0o700))
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)+",mode=0700"); err != nil {
		tb.Skipf("mount a tmpfs to fill up (needs root): %v", err)
	}
	tb.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fillFileSystem writes the file filler on dir's file system until it
// refuses another byte (ENOSPC), and returns the file's path: removing it
// gives the space back.
func fillFileSystem(tb testing.TB, dir string) string {
	tb.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(tb, err)
	defer f.Close()
	for _, chunk := range []int{1 << 20, 4 << 10, 1} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				require.True(tb, errors.Is(err, syscall.ENOSPC), "filling the file system: %v", err)
				break
			}
		}
	}
	return path
}
