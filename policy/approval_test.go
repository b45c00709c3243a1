package policy

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const approvalBase = `{"vendor":"stripe","daily_cap":"1000.00","expires_at":"2030-01-01T00:00:00Z",`

func TestApprovalJSONRoundTrip(t *testing.T) {
	t.Parallel()
	now := MustTime(t, "2026-09-01T00:00:00Z")
	p := MustPolicy(t, approvalBase+`"approval":{"above":200,"operations":["refunds.create"],"timeout":"2h"}}`, now)
	require.NotNil(t, p.Approval)
	assert.Equal(t, "200", p.Approval.Above.String())
	assert.Equal(t, 2*time.Hour, p.Approval.EffectiveTimeout())
	out, err := json.Marshal(p)
	require.NoError(t, err)
	assert.Contains(t, string(out), `"approval":{"above":"200.00","operations":["refunds.create"],"timeout":"2h"}`)
	var back Policy
	require.NoError(t, json.Unmarshal(out, &back))
	assert.Equal(t, p.Approval.Timeout, back.Approval.Timeout)

	d := MustPolicy(t, approvalBase+`"approval":{"above":"50.00"}}`, now)
	assert.Equal(t, DefaultApprovalTimeout, d.Approval.EffectiveTimeout(), "the default timeout is 30m")
}

func TestApprovalValidation(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ js, field string }{
		"timeout too short":  {`{"above":"1.00","timeout":"59s"}`, "approval.timeout"},
		"timeout too long":   {`{"above":"1.00","timeout":"73h"}`, "approval.timeout"},
		"timeout not a time": {`{"above":"1.00","timeout":"soon"}`, "approval.timeout"},
		"nothing to approve": {`{"timeout":"5m"}`, "approval"},
		"negative threshold": {`{"above":"-1.00"}`, "approval.above"},
		"too many decimals":  {`{"above":"1.001"}`, "approval.above"},
		"bad operation":      {`{"operations":["Refunds"]}`, "approval.operations[0]"},
		"unknown member":     {`{"above":"1.00","after":"5m"}`, "approval.after"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var p Policy
			err := json.Unmarshal([]byte(approvalBase+`"approval":`+c.js+`}`), &p)
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
	for _, ok := range []string{`{"above":"1.00","timeout":"1m"}`, `{"above":"1.00","timeout":"72h"}`, `{"operations":["refunds.*"]}`} {
		var p Policy
		require.NoError(t, json.Unmarshal([]byte(approvalBase+`"approval":`+ok+`}`), &p), ok)
		require.NoError(t, p.Validate(), ok)
	}
}

func TestNeedsApproval(t *testing.T) {
	t.Parallel()
	now := MustTime(t, "2026-09-01T00:00:00Z")
	p := MustPolicy(t, approvalBase+`"operations":["*"],"approval":{"above":"200.00","operations":["refunds.create"]}}`, now)
	cases := map[string]struct {
		req  Request
		want bool
	}{
		"at the threshold":          {Request{Operation: "charges.create", Amount: 20000}, false},
		"a cent above":              {Request{Operation: "charges.create", Amount: 20001}, true},
		"the object's new total":    {Request{Operation: "payment_intents.update", Amount: 5000, ObjectTotal: 25000}, true},
		"a listed operation, small": {Request{Operation: "refunds.create", Amount: 1}, true},
		"another operation, small":  {Request{Operation: "transfers.create", Amount: 1}, false},
	}
	for name, c := range cases {
		assert.Equal(t, c.want, p.NeedsApproval(c.req), name)
	}
	report := *p
	report.Mode = ModeReport
	assert.False(t, report.NeedsApproval(Request{Operation: "refunds.create", Amount: 1}), "report mode asks no one")
	var none Policy
	assert.False(t, none.NeedsApproval(Request{Operation: "refunds.create", Amount: 1}))
}
