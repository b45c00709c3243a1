package policy

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestObjectsJSONRoundTrip(t *testing.T) {
	t.Parallel()
	now := MustTime(t, "2026-09-01T00:00:00Z")
	p := MustPolicy(t, approvalBase+`"objects":{"cancel_unconfirmed_after":"24h"}}`, now)
	assert.Equal(t, 24*time.Hour, p.CancelUnconfirmedAfter())
	out, err := json.Marshal(p)
	require.NoError(t, err)
	assert.Contains(t, string(out), `"objects":{"cancel_unconfirmed_after":"24h"}`)
	var back Policy
	require.NoError(t, json.Unmarshal(out, &back))
	assert.Equal(t, 24*time.Hour, back.CancelUnconfirmedAfter())

	none := MustPolicy(t, approvalBase+`"mode":"enforce"}`, now)
	assert.Zero(t, none.CancelUnconfirmedAfter(), "opt-in: a policy without objects never cancels")
	out, err = json.Marshal(none)
	require.NoError(t, err)
	assert.NotContains(t, string(out), `"objects"`)
}

func TestObjectsValidation(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ js, field string }{
		"too short":      {`{"cancel_unconfirmed_after":"9m"}`, "objects.cancel_unconfirmed_after"},
		"too long":       {`{"cancel_unconfirmed_after":"721h"}`, "objects.cancel_unconfirmed_after"},
		"not a duration": {`{"cancel_unconfirmed_after":"tomorrow"}`, "objects.cancel_unconfirmed_after"},
		"negative":       {`{"cancel_unconfirmed_after":"-24h"}`, "objects.cancel_unconfirmed_after"},
		"a number":       {`{"cancel_unconfirmed_after":86400}`, "objects.cancel_unconfirmed_after"},
		"unknown member": {`{"cancel_after":"24h"}`, "objects.cancel_after"},
		"not an object":  {`"24h"`, "objects"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var p Policy
			err := json.Unmarshal([]byte(approvalBase+`"objects":`+c.js+`}`), &p)
			if err == nil {
				err = p.Validate()
			}
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			fields := []string{}
			for _, e := range ve.Errors {
				fields = append(fields, e.Field)
			}
			assert.Contains(t, fields, c.field)
		})
	}
	for _, ok := range []string{`{"cancel_unconfirmed_after":"10m"}`, `{"cancel_unconfirmed_after":"720h"}`, `{}`} {
		var p Policy
		require.NoError(t, json.Unmarshal([]byte(approvalBase+`"objects":`+ok+`}`), &p), ok)
		require.NoError(t, p.Validate(), ok)
	}
}
