package policy

import (
	"fmt"
	"strings"
	"time"
)

// WindowID names one counted window of a key; it is what storage keys the
// window's counter, its holds and its ledger deltas on. A daily window's id is
// "day:" and the calendar date in the policy's time zone ("day:2026-09-14"), so
// the stretches of a repeated local day share one counter; the period window's
// id is "period" for the key's whole life.
//
// It is a defined string type so an id cannot be confused with a key id, a
// date or a kind, while its stored form stays the bare string: a bbolt file or
// a PostgreSQL row written before the type existed reads unchanged.
type WindowID string

// PeriodWindowID is the id of the period window.
const PeriodWindowID WindowID = "period"

// dayWindowPrefix starts every daily window id.
const dayWindowPrefix = "day:"

// DayWindowID returns the id of the daily window of date, a calendar date as
// YYYY-MM-DD (see DayWindowIDOf for one from a time).
func DayWindowID(date string) WindowID {
	return WindowID(dayWindowPrefix + date)
}

// DayWindowIDOf returns the id of the daily window containing t's calendar
// date in t's location.
func DayWindowIDOf(t time.Time) WindowID {
	return DayWindowID(t.Format(time.DateOnly))
}

// ParseWindowID checks that s is a window id keybrake writes: "period" or
// "day:" followed by a valid YYYY-MM-DD date.
func ParseWindowID(s string) (WindowID, error) {
	id := WindowID(s)
	if id == PeriodWindowID {
		return id, nil
	}
	if _, ok := id.Day(); ok {
		return id, nil
	}
	return "", fmt.Errorf("window id %q: want %q or %qYYYY-MM-DD", s, PeriodWindowID, dayWindowPrefix)
}

// Date returns the YYYY-MM-DD date of a daily window id, and false for any
// other id.
func (id WindowID) Date() (string, bool) {
	return strings.CutPrefix(string(id), dayWindowPrefix)
}

// Day returns the date of a daily window id as midnight UTC of that date, and
// false for any other id or a date that does not parse.
func (id WindowID) Day() (time.Time, bool) {
	date, ok := id.Date()
	if !ok {
		return time.Time{}, false
	}
	day, err := time.Parse(time.DateOnly, date)
	return day, err == nil
}

// Kind returns the kind of window the id names: WindowDaily for a daily id,
// WindowPeriod for anything else.
func (id WindowID) Kind() WindowKind {
	if strings.HasPrefix(string(id), dayWindowPrefix) {
		return WindowDaily
	}
	return WindowPeriod
}

// String returns the id as stored.
func (id WindowID) String() string { return string(id) }

// WindowIDStrings returns ids as the bare strings they are stored as.
func WindowIDStrings(ids []WindowID) []string {
	if ids == nil {
		return nil
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = string(id)
	}
	return out
}

// WindowIDsOf returns stored strings as window ids, unchanged: what a store
// wrote is read back as it was, whatever kinds a later version adds.
func WindowIDsOf(ss []string) []WindowID {
	if ss == nil {
		return nil
	}
	out := make([]WindowID, len(ss))
	for i, s := range ss {
		out[i] = WindowID(s)
	}
	return out
}
