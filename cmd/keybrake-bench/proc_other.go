//go:build !linux

package main

import (
	"errors"
	"os/exec"
)

// errNoProc: memory figures come from Linux's /proc.
var errNoProc = errors.New("memory figures need Linux's /proc")

func setDeathSignal(*exec.Cmd) {}

func readMem(int) (memStats, error) { return memStats{}, errNoProc }

func resetPeak(int) error { return errNoProc }

func loadAverage() string { return "" }

func fsType(string) string { return "" }

func readCPU(int) (float64, error) { return 0, errNoProc }

func readWritten(int) (int64, error) { return 0, errNoProc }

func pressure() string { return "" }
