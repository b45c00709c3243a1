package policy

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestEffectiveCap(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 9, 14, 12, 0, 0, 0, time.UTC)
	later, earlier := now.Add(time.Hour), now.Add(-time.Hour)
	cases := map[string]struct {
		base   int64
		raises []Raise
		kind   WindowKind
		want   int64
	}{
		"no raises":             {base: 1000, kind: WindowDaily, want: 1000},
		"one active":            {base: 1000, raises: []Raise{{WindowDaily, 500, later}}, kind: WindowDaily, want: 1500},
		"two active add":        {base: 1000, raises: []Raise{{WindowDaily, 500, later}, {WindowDaily, 250, later}}, kind: WindowDaily, want: 1750},
		"ended is back to base": {base: 1000, raises: []Raise{{WindowDaily, 500, earlier}}, kind: WindowDaily, want: 1000},
		"ends exactly now":      {base: 1000, raises: []Raise{{WindowDaily, 500, now}}, kind: WindowDaily, want: 1000},
		"one nanosecond before": {base: 1000, raises: []Raise{{WindowDaily, 500, now.Add(time.Nanosecond)}}, kind: WindowDaily, want: 1500},
		"other window ignored":  {base: 1000, raises: []Raise{{WindowPeriod, 500, later}}, kind: WindowDaily, want: 1000},
		"per request":           {base: 200, raises: []Raise{{WindowPerRequest, 300, later}, {WindowDaily, 9, later}}, kind: WindowPerRequest, want: 500},
		"mixed active and ended": {base: 1000, raises: []Raise{{WindowPeriod, 500, earlier}, {WindowPeriod, 700, later}},
			kind: WindowPeriod, want: 1700},
		"non-positive amount ignored": {base: 1000, raises: []Raise{{WindowDaily, -500, later}, {WindowDaily, 0, later}}, kind: WindowDaily, want: 1000},
		"saturates":                   {base: math.MaxInt64 - 1, raises: []Raise{{WindowDaily, 5, later}}, kind: WindowDaily, want: math.MaxInt64},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, EffectiveCap(tc.base, tc.raises, tc.kind, now))
		})
	}
}

func TestRaiseWindowsKeepsUncappedWindows(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 9, 14, 12, 0, 0, 0, time.UTC)
	in := []Window{{Kind: WindowDaily, ID: "day:2026-09-14", Cap: 1000, HasCap: true}, {Kind: WindowPeriod, ID: "period"}}
	out := RaiseWindows(in, []Raise{{WindowDaily, 500, now.Add(time.Hour)}, {WindowPeriod, 500, now.Add(time.Hour)}}, now)
	assert.Equal(t, int64(1500), out[0].Cap)
	assert.False(t, out[1].HasCap, "a raise does not create a cap")
	assert.Equal(t, int64(1000), in[0].Cap, "the input is not modified")
}
