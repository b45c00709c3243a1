package policy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWindowIDs(t *testing.T) {
	t.Parallel()
	day := DayWindowID("2026-09-14")
	assert.Equal(t, "day:2026-09-14", day.String(), "the stored form is the bare string")
	assert.Equal(t, day, DayWindowIDOf(time.Date(2026, 9, 14, 23, 59, 0, 0, time.FixedZone("", -7*3600))))
	assert.Equal(t, WindowDaily, day.Kind())
	assert.Equal(t, WindowPeriod, PeriodWindowID.Kind())
	date, ok := day.Date()
	assert.True(t, ok)
	assert.Equal(t, "2026-09-14", date)
	d, ok := day.Day()
	assert.True(t, ok)
	assert.Equal(t, time.Date(2026, 9, 14, 0, 0, 0, 0, time.UTC), d)
	_, ok = PeriodWindowID.Day()
	assert.False(t, ok)

	ids := []WindowID{day, PeriodWindowID}
	assert.Equal(t, []string{"day:2026-09-14", "period"}, WindowIDStrings(ids))
	assert.Equal(t, ids, WindowIDsOf(WindowIDStrings(ids)))
	assert.Nil(t, WindowIDStrings(nil))
	assert.Nil(t, WindowIDsOf(nil))
}

func TestParseWindowID(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"period", "day:2026-09-14", "day:2024-02-29"} {
		id, err := ParseWindowID(s)
		require.NoError(t, err, s)
		assert.Equal(t, s, string(id))
	}
	for _, s := range []string{"", "Period", "day:", "day:2026-9-14", "day:2026-02-30", "2026-09-14", "period:x"} {
		_, err := ParseWindowID(s)
		assert.Error(t, err, s)
	}
}
