package postgres

import (
	"net/url"
	"strings"
)

// redacted replaces every secret of a database URL that RedactURL removes.
const redacted = "xxxxx"

// secretParams are the connection parameters whose values are secrets, or
// name where one is kept: the password (also as a query parameter), the
// password of the TLS client key, and the password file.
var secretParams = map[string]bool{"password": true, "sslpassword": true, "passfile": true}

// RedactURL returns the database URL raw with every secret-bearing part
// replaced by "xxxxx" — the password of its user information and the query
// parameters password, sslpassword and passfile — for logs, errors and pages.
// A URL that does not parse is "(unparsable URL)": its text could hold a
// password anywhere.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), redacted)
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return "(unparsable URL)"
		}
		for name := range q {
			if secretParams[strings.ToLower(name)] {
				q[name] = []string{redacted}
			}
		}
		u.RawQuery = q.Encode()
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}
