package proxy

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
)

// settleClasses are the status classes of the settle table, each with the
// statuses it stands for (all of them are decided). Status 0 is no usable
// answer.
var settleClasses = map[string]struct {
	statuses []int
	sent     bool
}{
	"no answer, not sent": {[]int{0}, false},
	"no answer, sent":     {[]int{0}, true},
	"2xx":                 {[]int{200, 201, 202, 204}, true},
	"3xx":                 {[]int{301, 302, 304}, true},
	"401":                 {[]int{401}, true},
	"403":                 {[]int{403}, true},
	"409":                 {[]int{409}, true},
	"429":                 {[]int{429}, true},
	"other 4xx":           {[]int{400, 402, 404, 422}, true},
	"5xx":                 {[]int{500, 502, 503, 504}, true},
}

// settleShapes are the body shapes, in the columns' order.
var settleShapes = [...]bodyShape{0, bodyIdempotencyError, bodyCreatedObject, bodyIdempotencyError | bodyCreatedObject}

// settleTable is the settle decision, row by row: status class × the
// idempotency outcomes that forward ("" keeps no record) × body shape (plain,
// idempotency_error, a created money object, both). Changing one cell fails
// TestDecideSettle.
var settleTable = []struct {
	class string
	idem  idemOutcome
	// plain, idempotency_error, created object, both
	want [len(settleShapes)]settleDecision
}{
	{"no answer, not sent", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"no answer, not sent", idemClaimed, [4]settleDecision{settleAbandon, settleAbandon, settleAbandon, settleAbandon}},
	{"no answer, not sent", idemResume, [4]settleDecision{settleAbandon, settleAbandon, settleAbandon, settleAbandon}},

	{"no answer, sent", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"no answer, sent", idemClaimed, [4]settleDecision{settleUnknown, settleUnknown, settleUnknown, settleUnknown}},
	{"no answer, sent", idemResume, [4]settleDecision{settleUnknown, settleUnknown, settleUnknown, settleUnknown}},

	{"2xx", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"2xx", idemClaimed, [4]settleDecision{settleCommit, settleCommit, settleCommit, settleCommit}},
	{"2xx", idemResume, [4]settleDecision{settleCommit, settleCommit, settleCommit, settleCommit}},

	{"3xx", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"3xx", idemClaimed, [4]settleDecision{settleUnknownKept, settleUnknownKept, settleUnknownKept, settleUnknownKept}},
	{"3xx", idemResume, [4]settleDecision{settleUnknownKept, settleUnknownKept, settleUnknownKept, settleUnknownKept}},

	{"401", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"401", idemClaimed, [4]settleDecision{settleAbandon, settleAbandon, settleAbandon, settleAbandon}},
	{"401", idemResume, [4]settleDecision{settleAbandon, settleAbandon, settleAbandon, settleAbandon}},

	{"403", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"403", idemClaimed, [4]settleDecision{settleAbandon, settleAbandon, settleAbandon, settleAbandon}},
	{"403", idemResume, [4]settleDecision{settleAbandon, settleAbandon, settleAbandon, settleAbandon}},

	{"409", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"409", idemClaimed, [4]settleDecision{settleUnknown, settleUnknown, settleUnknown, settleUnknown}},
	{"409", idemResume, [4]settleDecision{settleUnknown, settleUnknown, settleUnknown, settleUnknown}},

	{"429", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"429", idemClaimed, [4]settleDecision{settleAbandon, settleAbandon, settleAbandon, settleAbandon}},
	{"429", idemResume, [4]settleDecision{settleAbandon, settleAbandon, settleAbandon, settleAbandon}},

	{"other 4xx", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"other 4xx", idemClaimed, [4]settleDecision{settleRelease, settleRelease, settleKeepCreated, settleKeepCreated}},
	{"other 4xx", idemResume, [4]settleDecision{settleRelease, settleUnknownKept, settleKeepCreated, settleUnknownKept}},

	{"5xx", "", [4]settleDecision{settleNone, settleNone, settleNone, settleNone}},
	{"5xx", idemClaimed, [4]settleDecision{settleUnknownKept, settleUnknownKept, settleUnknownKept, settleUnknownKept}},
	{"5xx", idemResume, [4]settleDecision{settleUnknownKept, settleUnknownKept, settleUnknownKept, settleUnknownKept}},
}

// TestDecideSettle holds decideSettle to settleTable, every status of every
// class, and checks that the table covers every class × forwarding
// idempotency outcome exactly once.
func TestDecideSettle(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, row := range settleTable {
		cls, ok := settleClasses[row.class]
		require.True(t, ok, "unknown class %q", row.class)
		key := row.class + "/" + string(row.idem)
		require.False(t, seen[key], "row %s twice", key)
		seen[key] = true
		for i, shape := range settleShapes {
			for _, status := range cls.statuses {
				got := decideSettle(answerFacts{status: status, sent: cls.sent, idem: row.idem, body: shape})
				assert.Equal(t, row.want[i].String(), got.String(), "%s (status %d), idempotency %q, body shape %d", row.class, status, row.idem, shape)
			}
		}
	}
	for class := range settleClasses {
		for _, idem := range []idemOutcome{"", idemClaimed, idemResume} {
			assert.True(t, seen[class+"/"+string(idem)], "no row for %s, idempotency %q", class, idem)
		}
	}
}

// TestDecideSettleNoRecord checks that the idempotency outcomes that never
// reach Stripe keep no record, so nothing is settled whatever the answer.
func TestDecideSettleNoRecord(t *testing.T) {
	t.Parallel()
	for _, idem := range []idemOutcome{idemDerived, idemReplay, idemInFlight, idemMismatch, idemStale, idemRefused} {
		for class, cls := range settleClasses {
			for _, shape := range settleShapes {
				for _, status := range cls.statuses {
					assert.Equal(t, settleNone, decideSettle(answerFacts{status: status, sent: cls.sent, idem: idem, body: shape}),
						"%s (status %d), idempotency %q", class, status, idem)
				}
			}
		}
	}
}

// TestSettleDecisionOutcomes pins what each decision asks of Store.Settle: the
// outcome, and whether Stripe's answer is stored for replay.
func TestSettleDecisionOutcomes(t *testing.T) {
	t.Parallel()
	cases := map[settleDecision]struct {
		outcome vault.SettleOutcome
		kept    bool
	}{
		settleNone:        {"", false},
		settleCommit:      {vault.SettleCommit, true},
		settleKeepCreated: {vault.SettleCommit, true},
		settleRelease:     {vault.SettleRelease, true},
		settleUnknownKept: {vault.SettleUnknown, true},
		settleUnknown:     {vault.SettleUnknown, false},
		settleAbandon:     {vault.SettleAbandon, false},
	}
	for d, want := range cases {
		t.Run(fmt.Sprint(d), func(t *testing.T) {
			assert.Equal(t, want.outcome, d.outcome())
			assert.Equal(t, want.kept, d.keepsAnswer())
		})
	}
	assert.Equal(t, "invalid", settleDecision(len(cases)).String(), "a decision without a case above")
}

// TestIdemOutcomeOf checks that every Store.Reserve outcome has its own word
// on the canonical line, and that the words keepsRecord reads are Reserve's.
func TestIdemOutcomeOf(t *testing.T) {
	t.Parallel()
	words := map[idemOutcome]vault.ReserveOutcome{}
	for o := vault.ReserveClaimed; o <= vault.ReserveRefused; o++ {
		w := idemOutcomeOf(o)
		require.NotEmpty(t, w, "Reserve outcome %d has no word", o)
		require.NotContains(t, words, w, "Reserve outcomes %d and %d share the word %q", words[w], o, w)
		words[w] = o
	}
	assert.Empty(t, idemOutcomeOf(vault.ReserveRefused+1))
	assert.Equal(t, vault.ReserveClaimed, words[idemClaimed])
	assert.Equal(t, vault.ReserveResume, words[idemResume])
}
