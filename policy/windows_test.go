package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDailyWindow(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		zone       string
		now        string
		id         WindowID
		start, end string // RFC 3339, UTC
		hours      float64
	}{
		"utc noon": {"UTC", "2026-09-14T12:00:00Z", "day:2026-09-14", "2026-09-14T00:00:00Z", "2026-09-15T00:00:00Z", 24},
		"utc at midnight belongs to the new day": {
			"UTC", "2026-09-15T00:00:00Z", "day:2026-09-15", "2026-09-15T00:00:00Z", "2026-09-16T00:00:00Z", 24,
		},
		"utc last nanosecond": {
			"UTC", "2026-09-14T23:59:59.999999999Z", "day:2026-09-14", "2026-09-14T00:00:00Z", "2026-09-15T00:00:00Z", 24,
		},
		"new york ordinary day": {
			"America/New_York", "2026-09-14T03:59:59Z", "day:2026-09-13", "2026-09-13T04:00:00Z", "2026-09-14T04:00:00Z", 24,
		},
		"new york spring forward is 23 hours": {
			"America/New_York", "2026-03-08T12:00:00Z", "day:2026-03-08", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23,
		},
		"new york spring forward, before the gap": {
			"America/New_York", "2026-03-08T06:59:59Z", "day:2026-03-08", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23,
		},
		"new york fall back is 25 hours": {
			"America/New_York", "2026-11-01T12:00:00Z", "day:2026-11-01", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25,
		},
		"new york fall back, in the repeated hour": {
			"America/New_York", "2026-11-01T06:30:00Z", "day:2026-11-01", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25,
		},
		"berlin spring forward is 23 hours": {
			"Europe/Berlin", "2026-03-29T10:00:00Z", "day:2026-03-29", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23,
		},
		"berlin fall back is 25 hours": {
			"Europe/Berlin", "2026-10-25T10:00:00Z", "day:2026-10-25", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25,
		},
		"berlin local evening is still that day": {
			"Europe/Berlin", "2026-09-14T21:59:59Z", "day:2026-09-14", "2026-09-13T22:00:00Z", "2026-09-14T22:00:00Z", 24,
		},
		"tokyo": {"Asia/Tokyo", "2026-09-14T15:00:00Z", "day:2026-09-15", "2026-09-14T15:00:00Z", "2026-09-15T15:00:00Z", 24},
		"kathmandu quarter offset": {
			"Asia/Kathmandu", "2026-09-14T18:14:59Z", "day:2026-09-14", "2026-09-13T18:15:00Z", "2026-09-14T18:15:00Z", 24,
		},
		// Chile springs forward at midnight: 2026-09-06 00:00 does not exist; the day
		// starts at 01:00 -03, the transition instant.
		"santiago midnight does not exist": {
			"America/Santiago", "2026-09-06T04:00:00Z", "day:2026-09-06", "2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z", 23,
		},
		"santiago day before the missing midnight": {
			"America/Santiago", "2026-09-06T03:59:59.999999999Z", "day:2026-09-05", "2026-09-05T04:00:00Z", "2026-09-06T04:00:00Z", 24,
		},
		"santiago 24:00 becomes 23:00": {
			"America/Santiago", "2026-04-05T03:30:00Z", "day:2026-04-04", "2026-04-04T03:00:00Z", "2026-04-05T04:00:00Z", 25,
		},
		"beirut midnight does not exist": {
			"Asia/Beirut", "2026-03-29T12:00:00Z", "day:2026-03-29", "2026-03-28T22:00:00Z", "2026-03-29T21:00:00Z", 23,
		},
		"havana midnight does not exist": {
			"America/Havana", "2026-03-08T05:00:00Z", "day:2026-03-08", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23,
		},
		"havana midnight hour repeats": {
			"America/Havana", "2026-11-01T05:30:00Z", "day:2026-11-01", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25,
		},
		// Goose Bay turned clocks back at 00:01 in 2009: the local date went
		// 2009-11-01 (one minute) -> 2009-10-31 (again, 23:01-23:59) -> 2009-11-01.
		"goose bay date goes backwards: first minute": {
			"America/Goose_Bay", "2009-11-01T03:00:30Z", "day:2009-11-01", "2009-11-01T03:00:00Z", "2009-11-01T03:01:00Z", 1.0 / 60,
		},
		"goose bay date goes backwards: repeated evening": {
			"America/Goose_Bay", "2009-11-01T03:30:00Z", "day:2009-10-31", "2009-11-01T03:01:00Z", "2009-11-01T04:00:00Z", 59.0 / 60,
		},
		// Beyond the tzdata's explicit transitions Go computes zones from the rule
		// string, and its ZoneBounds is wrong on 31 December of leap years.
		"new york rule-string leap year end": {
			"America/New_York", "2040-12-31T12:00:00Z", "day:2040-12-31", "2040-12-31T05:00:00Z", "2041-01-01T05:00:00Z", 24,
		},
		"berlin rule-string leap year end": {
			"Europe/Berlin", "2040-12-31T23:30:00Z", "day:2041-01-01", "2040-12-31T23:00:00Z", "2041-01-01T23:00:00Z", 24,
		},
		"goose bay date goes backwards: the day again": {
			"America/Goose_Bay", "2009-11-01T04:00:00Z", "day:2009-11-01", "2009-11-01T04:00:00Z", "2009-11-02T04:00:00Z", 24,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &Policy{Timezone: tc.zone, DailyCap: MustDecimal(t, "99")}
			now := MustTime(t, tc.now)
			ws, err := p.Windows(now)
			require.NoError(t, err)
			require.Len(t, ws, 2)
			d := ws[0]
			assert.Equal(t, WindowDaily, d.Kind)
			assert.Equal(t, tc.id, d.ID)
			assert.Equal(t, tc.start, d.Start.UTC().Format(time.RFC3339Nano), "start")
			assert.Equal(t, tc.end, d.End.UTC().Format(time.RFC3339Nano), "end")
			assert.InDelta(t, tc.hours, d.End.Sub(d.Start).Hours(), 1e-9)
			assert.False(t, d.Start.After(now), "start <= now")
			assert.True(t, now.Before(d.End), "now < end")
			assert.Equal(t, tc.zone, d.Start.Location().String(), "bounds are reported in the policy zone")
			assert.True(t, d.HasCap)
			assert.Equal(t, int64(9900), d.Cap)
		})
	}
}

func TestPeriodWindow(t *testing.T) {
	t.Parallel()
	p := MustPolicy(t, `{"vendor":"stripe","daily_usd_cap":99,"period_usd_cap":110,"period_start":"2026-09-01T00:00:00Z","expires_at":"2026-10-01T00:00:00Z"}`, mintTime)
	ws, err := p.Windows(MustTime(t, "2026-09-14T12:00:00Z"))
	require.NoError(t, err)
	require.Len(t, ws, 2)
	assert.Equal(t, Window{
		Kind: WindowPeriod, ID: "period",
		Start: MustTime(t, "2026-09-01T00:00:00Z"), End: MustTime(t, "2026-10-01T00:00:00Z"),
		Cap: 11000, HasCap: true,
	}, ws[1])
	assert.Equal(t, DayWindowID("2026-09-14"), ws[0].ID)
	assert.Equal(t, int64(9900), ws[0].Cap)

	t.Run("no caps: windows still counted", func(t *testing.T) {
		p := &Policy{PerRequestCap: MustDecimal(t, "5"), ExpiresAt: MustTime(t, "2026-10-01T00:00:00Z")}
		ws, err := p.Windows(MustTime(t, "2026-09-14T12:00:00Z"))
		require.NoError(t, err)
		require.Len(t, ws, 2)
		assert.False(t, ws[0].HasCap)
		assert.False(t, ws[1].HasCap)
		assert.Zero(t, Remaining(ws[0], Counter{Committed: 5}))
	})
	t.Run("invalid cap is an error", func(t *testing.T) {
		p := &Policy{DailyCap: MustDecimal(t, "5.001")}
		_, err := p.Windows(mintTime)
		assert.ErrorIs(t, err, ErrPrecision)
		p = &Policy{Currency: "zzz", PeriodCap: MustDecimal(t, "5")}
		_, err = p.Windows(mintTime)
		assert.ErrorIs(t, err, ErrCurrency)
	})
}

func TestRemaining(t *testing.T) {
	t.Parallel()
	w := Window{Cap: 9900, HasCap: true}
	tests := map[string]struct {
		c    Counter
		want int64
	}{
		"untouched":                            {Counter{}, 9900},
		"partly used":                          {Counter{Committed: 9500, Held: 100}, 300},
		"exactly full":                         {Counter{Committed: 9900}, 0},
		"over (report mode) is never negative": {Counter{Committed: 9900, Held: 5000}, 0},
		"overflowing counters":                 {Counter{Committed: 1 << 62, Held: 1 << 62}, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { assert.Equal(t, tc.want, Remaining(w, tc.c)) })
	}
}

// TestDailyWindowInvariant walks every zone transition and every local midnight of
// the years below (plus a 7-hour grid) in a set of zones and checks that the daily windows tile time: Start <= now <
// End, the local date is the window's date right after Start and right before End and
// different on the other side of each bound. With KEYBRAKE_LONG=1 it checks every zone
// of the system's tzdata from 1970 to 2040.
func TestDailyWindowInvariant(t *testing.T) {
	t.Parallel()
	zones := []string{
		"UTC", "America/New_York", "Europe/Berlin", "America/Santiago", "Asia/Beirut",
		"America/Havana", "America/Goose_Bay", "America/Sao_Paulo", "Asia/Gaza", "Australia/Lord_Howe",
		"Pacific/Apia", "Pacific/Kiritimati", "Asia/Kathmandu", "Africa/Casablanca", "America/St_Johns",
	}
	// 7 h is coprime with 24, so over a few weeks every hour of the day is probed.
	step := 7 * time.Hour
	// A stretch of past years full of odd transitions, a year in use, and a leap
	// year beyond the tzdata's explicit transitions (rule-string territory).
	years := [][2]int{{2009, 2009}, {2018, 2018}, {2026, 2026}, {2040, 2040}}
	if os.Getenv("KEYBRAKE_LONG") != "" {
		zones = allZones(t)
		years, step = [][2]int{{1970, 2040}}, 0
	}
	for _, zone := range zones {
		t.Run(zone, func(t *testing.T) {
			loc := MustLocation(t, zone)
			p := &Policy{Timezone: zone}
			var probes []time.Time
			for _, span := range years {
				begin := time.Date(span[0], 1, 1, 0, 0, 0, 0, time.UTC)
				end := time.Date(span[1]+1, 1, 1, 0, 0, 0, 0, time.UTC)
				for tr := begin.In(loc); ; {
					_, ze := zoneBounds(tr)
					if ze.IsZero() || !ze.Before(end) {
						break
					}
					require.True(t, ze.After(tr), "zoneBounds makes progress at %s", tr)
					probes = append(probes, ze.Add(-time.Nanosecond), ze, ze.Add(time.Nanosecond))
					tr = ze.In(loc)
				}
				// Local midnights, found independently of zoneBounds.
				for day := begin.In(loc); day.Before(end); day = day.AddDate(0, 0, 1) {
					y, m, d := day.Date()
					mid := time.Date(y, m, d, 0, 0, 0, 0, loc)
					probes = append(probes, mid.Add(-time.Nanosecond), mid, mid.Add(time.Nanosecond))
				}
				for h := begin; step > 0 && h.Before(end); h = h.Add(step) {
					probes = append(probes, h)
				}
			}
			failures := 0
			for _, now := range probes {
				ws, err := p.Windows(now)
				require.NoError(t, err)
				d := ws[0]
				ok := !d.Start.After(now) && now.Before(d.End) &&
					d.ID == DayWindowIDOf(now.In(loc)) &&
					d.ID == DayWindowIDOf(d.Start.In(loc)) &&
					d.ID == DayWindowIDOf(d.End.Add(-time.Nanosecond).In(loc)) &&
					d.ID != DayWindowIDOf(d.End.In(loc)) &&
					d.ID != DayWindowIDOf(d.Start.Add(-time.Nanosecond).In(loc))
				if !ok {
					failures++
					if failures <= 5 {
						t.Errorf("now %s (%s): window %s [%s, %s)", now.UTC().Format(time.RFC3339Nano),
							now.In(loc).Format(time.RFC3339), d.ID, d.Start.Format(time.RFC3339Nano), d.End.Format(time.RFC3339Nano))
					}
				}
				// The next window starts where this one ends.
				next, err := p.Windows(d.End)
				require.NoError(t, err)
				if !next[0].Start.Equal(d.End) {
					failures++
					if failures <= 5 {
						t.Errorf("window %s ends at %s but the next starts at %s", d.ID, d.End, next[0].Start)
					}
				}
			}
			assert.Zero(t, failures)
		})
	}
}

// allZones lists the zones of the system tzdata.
func allZones(tb testing.TB) []string {
	tb.Helper()
	root := "/usr/share/zoneinfo"
	if r := os.Getenv("ZONEINFO_DIR"); r != "" {
		root = r
	}
	if _, err := os.Stat(root); err != nil {
		tb.Skipf("no tzdata directory at %s (set ZONEINFO_DIR): %v", root, err)
	}
	var zones []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "posix" || rel == "right" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.Contains(rel, ".") || !strings.ContainsRune(rel, '/') && rel != "UTC" {
			return nil
		}
		if _, err := time.LoadLocation(rel); err == nil {
			zones = append(zones, rel)
		}
		return nil
	})
	require.NoError(tb, err)
	require.NotEmpty(tb, zones)
	return zones
}
