package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
)

// PATCHing a key's time zone never resets usage: at 12:00 UTC it is already the
// next day in Pacific/Kiritimati, and that day starts with what the UTC day used
// (committed and held), so no fresh daily budget opens.
func TestAdminTimeZoneChangeKeepsTheDaysUsage(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("tz", "", nil, seedLegacyPolicy) // daily 99.00, period 110.00, UTC
	env.MustHold(k.ID, "idem-commit", 6000, vault.SettleCommit)
	env.MustHold(k.ID, "idem-held", 3000, "")

	r := env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{"policy":{"timezone":"Pacific/Kiritimati"}}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	u := env.MustUsage(k.ID)
	assert.Equal(t, time.Date(2026, 9, 14, 10, 0, 0, 0, time.UTC), u.Daily.Start.UTC(), "Kiritimati's 15th")
	assert.Equal(t, "90.00", u.Daily.Committed, "60.00 committed and 30.00 held carried")
	assert.Equal(t, "0.00", u.Daily.Held)
	assert.Equal(t, strp("9.00"), u.Daily.Remaining)
	assert.Equal(t, time.Date(2026, 9, 15, 10, 0, 0, 0, time.UTC), u.Daily.ResetAt.UTC(), "the new zone's midnight")

	r = env.Do(http.MethodGet, "/api/v1/keys/"+k.ID+"/events", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	assert.Contains(t, string(r.Body), `"decision":"carried"`)
}
