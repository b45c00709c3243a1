//go:build !linux

package main

import "testing"

// MustSmallFileSystem skips: mounting a small file system is done on Linux only.
func MustSmallFileSystem(tb testing.TB, size int64) string {
	tb.Skip("a small file system to fill up is mounted on Linux only")
	return ""
}

// fillFileSystem is never reached off Linux.
func fillFileSystem(tb testing.TB, dir string) string { return "" }
