package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// setDeathSignal makes the kernel kill cmd's process if this one dies first, so
// an interrupted benchmark leaves no proxy running.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// readMem reads a process's memory figures from /proc/PID/status.
func readMem(pid int) (memStats, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memStats{}, fmt.Errorf("read memory of %d: %w", pid, err)
	}
	var m memStats
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, rest, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok {
			continue
		}
		var dst *int64
		switch string(name) {
		case "VmHWM":
			dst = &m.PeakRSS
		case "VmRSS":
			dst = &m.RSS
		case "RssAnon":
			dst = &m.RSSAnon
		case "RssFile":
			dst = &m.RSSFile
		default:
			continue
		}
		kb, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte("kB")))), 10, 64)
		if err != nil {
			return memStats{}, fmt.Errorf("read memory of %d: %s: %w", pid, name, err)
		}
		*dst = kb << 10
	}
	if m.PeakRSS == 0 {
		return memStats{}, fmt.Errorf("read memory of %d: no VmHWM", pid)
	}
	return m, nil
}

// resetPeak resets the process's peak RSS (VmHWM) to its current RSS, so that the
// next reading is the peak of one round, not of the process's whole life.
func resetPeak(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("reset peak RSS of %d: %w", pid, err)
	}
	return nil
}

// loadAverage is the 1, 5 and 15 minute load averages ("" if unknown).
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := bytes.Fields(data)
	if len(f) < 3 {
		return ""
	}
	return string(bytes.Join(f[:3], []byte(" ")))
}

// fsType names the file system that holds dir, as far as the benchmark cares: on
// tmpfs an fsync costs nothing, and a durable store looks faster than it is.
func fsType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return ""
	}
	switch uint64(st.Type) {
	case 0xEF53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x01021994:
		return "tmpfs"
	case 0x794C7630:
		return "overlayfs"
	case 0x2FC12FC1:
		return "zfs"
	default:
		return fmt.Sprintf("0x%X", uint64(st.Type))
	}
}

// userHZ is the unit of the CPU times in /proc/PID/stat: fixed at 100 by the
// kernel's ABI on the architectures Go supports.
const userHZ = 100

// readCPU returns the CPU time (user + system) the process has used, in seconds.
func readCPU(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read cpu of %d: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces; utime and
	// stime are fields 14 and 15, the 12th and 13th after it.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("read cpu of %d: malformed stat", pid)
	}
	f := bytes.Fields(data[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("read cpu of %d: malformed stat", pid)
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read cpu of %d: %w", pid, err)
		}
		ticks += n
	}
	return float64(ticks) / userHZ, nil
}

// readWritten returns the bytes the process has caused to be written to storage
// (write_bytes of /proc/PID/io: what reached the block layer, fsynced or not).
func readWritten(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, fmt.Errorf("read io of %d: %w", pid, err)
	}
	for line := range bytes.Lines(data) {
		if v, ok := bytes.CutPrefix(line, []byte("write_bytes:")); ok {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read io of %d: %w", pid, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("read io of %d: no write_bytes", pid)
}

// pressure is the share of the last minute in which some task waited for a CPU
// and for I/O (Linux pressure stall information), e.g. "cpu 12.5%, io 0.8%": on
// a shared machine, how much other work competed with the run ("" if unknown).
func pressure() string {
	var parts []string
	for _, res := range []string{"cpu", "io"} {
		data, err := os.ReadFile("/proc/pressure/" + res)
		if err != nil {
			return ""
		}
		line, _, _ := bytes.Cut(data, []byte("\n")) // "some avg10=… avg60=… avg300=… total=…"
		for _, f := range bytes.Fields(line) {
			if v, ok := bytes.CutPrefix(f, []byte("avg60=")); ok {
				parts = append(parts, res+" "+string(v)+"%")
			}
		}
	}
	return strings.Join(parts, ", ")
}
