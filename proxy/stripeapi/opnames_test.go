package stripeapi_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/keybrake/keybrake/proxy/stripeapi"
)

func TestCheckOperation(t *testing.T) {
	t.Parallel()
	known := []string{
		"*", "*.*", "*.read", "*.create", "*.delete", "charges.*", "charges.create", "charges.read",
		"checkout.sessions.*", "checkout.sessions.create", "refunds.create", "customers.delete",
		"unknown.read", "v2.core.accounts.read", "v2.*", "v2.core.events.*", "payment_intents.increment_authorization",
	}
	for _, g := range known {
		ok, sugg := stripeapi.CheckOperation(g)
		assert.True(t, ok, g)
		assert.Empty(t, sugg, g)
	}
	for _, op := range stripeapi.Operations() {
		ok, _ := stripeapi.CheckOperation(op)
		assert.True(t, ok, "every catalogue operation is known: %s", op)
	}

	unknown := map[string][]string{
		"charges.creat":          {"charges.create"},
		"charge.create":          {"charges.create"},
		"payment_intent.create":  {"payment_intents.create"},
		"*.raed":                 {"*.read"},
		"chargez.*":              {"charges.*"},
		"refund.create":          {"refunds.create"},
		"zzzzzz.qqqqqqqqqq":      nil, // nothing close
		"unknown.write":          {"unknown.read"},
		"v2.core.accounts.write": nil,
	}
	for g, want := range unknown {
		ok, sugg := stripeapi.CheckOperation(g)
		assert.False(t, ok, g)
		if want == nil {
			assert.Empty(t, sugg, g)
			continue
		}
		assert.LessOrEqual(t, len(sugg), 3, g)
		if assert.NotEmpty(t, sugg, g) {
			assert.Equal(t, want[0], sugg[0], "%s: the closest first; got %v", g, sugg)
		}
	}
}
