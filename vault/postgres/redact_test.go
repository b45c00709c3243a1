package postgres

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestRedactURL: no secret of a database URL survives RedactURL, wherever in
// the URL it is; what locates the database stays.
func TestRedactURL(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ in, want string }{
		"userinfo":         {"postgres://kb:s3cret@db:5432/kb", "postgres://kb:xxxxx@db:5432/kb"},
		"query password":   {"postgres://kb@db/kb?password=s3cret&sslmode=require", "postgres://kb@db/kb?password=xxxxx&sslmode=require"},
		"sslpassword":      {"postgres://db/kb?sslpassword=s3cret&sslkey=/etc/k.pem", "postgres://db/kb?sslkey=%2Fetc%2Fk.pem&sslpassword=xxxxx"},
		"passfile":         {"postgres://db/kb?passfile=/run/s3cret", "postgres://db/kb?passfile=xxxxx"},
		"upper case":       {"postgres://db/kb?PASSWORD=s3cret", "postgres://db/kb?PASSWORD=xxxxx"},
		"both":             {"postgresql://kb:s3cret@db/kb?password=s3cret", "postgresql://kb:xxxxx@db/kb?password=xxxxx"},
		"twice":            {"postgres://db/kb?password=s3cret&password=s3cret", "postgres://db/kb?password=xxxxx"},
		"fragment":         {"postgres://db/kb#s3cret", "postgres://db/kb"},
		"nothing secret":   {"postgres://kb@db:5432/kb?sslmode=verify-full", "postgres://kb@db:5432/kb?sslmode=verify-full"},
		"unparsable":       {"postgres://kb:s3cret@db:port/kb", "(unparsable URL)"},
		"unparsable query": {"postgres://db/kb?password=s3cret%zz", "(unparsable URL)"},
	} {
		t.Run(name, func(t *testing.T) {
			got := RedactURL(tc.in)
			assert.Equal(t, tc.want, got)
			assert.NotContains(t, got, "s3cret")
		})
	}
}
