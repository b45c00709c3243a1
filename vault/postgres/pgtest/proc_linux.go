package pgtest

import (
	"errors"
	"syscall"
)

// sysProcAttr runs a server program as u (nil: as the current user) and asks the
// kernel to send it deathSig when the thread that started it ends. Programs are
// started from one locked thread that lives as long as the test binary (see
// startProgram), so the signal comes when the test binary exits in any way: a
// panic, os.Exit, a timeout or SIGKILL. Go sets the signal after switching to
// u, which would otherwise clear it.
func sysProcAttr(u *serverUser, deathSig syscall.Signal) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Pdeathsig: deathSig}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return a
}

// canSwitchUser says whether the server programs can run as another user.
const canSwitchUser = true

// processAlive reports whether a process with this PID exists.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// memoryDir returns /dev/shm when it is a tmpfs this process may write with
// memoryNeed bytes free, else "" (see clusterRoot).
func memoryDir() string {
	const dir, tmpfsMagic = "/dev/shm", 0x01021994
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil || st.Type != tmpfsMagic ||
		st.Bavail*uint64(st.Bsize) < memoryNeed || syscall.Access(dir, 2 /* W_OK */) != nil {
		return ""
	}
	return dir
}
