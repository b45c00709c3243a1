//go:build !linux

package pgtest

import "syscall"

// sysProcAttr is the portable fallback: the programs run as the current user,
// and only Main and the tests' cleanups stop the server (there is no parent-death
// signal outside Linux).
func sysProcAttr(*serverUser, syscall.Signal) *syscall.SysProcAttr { return nil }

// canSwitchUser says whether the server programs can run as another user.
const canSwitchUser = false

// processAlive cannot tell here, so leftover directories are never swept.
func processAlive(int) bool { return true }

// memoryDir is not looked for here: clusters live in os.TempDir().
func memoryDir() string { return "" }
