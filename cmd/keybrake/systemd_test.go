package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The systemd unit shipped in docs/ must be one systemd accepts without a
// warning, and stay hardened. systemd-analyze checks it where it is installed (any
// systemd distribution); elsewhere the test is skipped, except in CI.
func TestSystemdUnitVerifies(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze is not installed: CI needs it (the systemd package) to check docs/systemd/keybrake.service")
		}
		t.Skip("systemd-analyze is not installed: the unit file is not checked here")
	}
	unit, err := os.ReadFile(filepath.Join("..", "..", "docs", "systemd", "keybrake.service"))
	require.NoError(t, err)
	for _, want := range []string{"DynamicUser=yes", "StateDirectory=keybrake", "ProtectSystem=strict", "NoNewPrivileges=yes",
		"ExecStart=/usr/local/bin/keybrake serve", "ExecReload=/bin/kill -HUP $MAINPID"} {
		assert.Contains(t, string(unit), want+"\n")
	}

	// verify checks that ExecStart is executable: point it at one that is.
	self, err := os.Executable()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "keybrake.service")
	require.NoError(t, os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/keybrake", self)), 0o600))

	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	require.NoError(t, err, "systemd-analyze verify: %s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify has no warning")

	// The exposure score of `systemd-analyze security` (0 best … 10 worst) stays
	// at 2.0 or below. Older systemd has no --offline: then only verify applies.
	if out, err := exec.Command(analyze, "security", "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "--offline") {
		t.Log("this systemd-analyze cannot score a unit file offline")
		return
	}
	out, err = exec.Command(analyze, "security", "--offline=true", "--threshold=20", path).CombinedOutput()
	require.NoError(t, err, "exposure above 2.0:\n%s", out)
	assert.Contains(t, string(out), "Overall exposure level for keybrake.service")
}
