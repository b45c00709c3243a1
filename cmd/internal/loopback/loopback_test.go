package loopback_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/keybrake/keybrake/cmd/internal/loopback"
)

func TestHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"localhost": true, "127.0.0.1": true, "127.8.9.10": true, "::1": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "example.com": false,
		"localhost.example.com": false, "LOCALHOST.": false, "[::1]": false,
	} {
		assert.Equal(t, want, loopback.Host(host), "%q", host)
	}
}
