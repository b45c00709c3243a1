package api

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// The admin API's read-only summaries, made for the dashboard and usable by any
// client: the usage of many keys in one call, a key's spend per day, the overview.

// keyUsageView is one key's usage in GET /api/v1/usage.
type keyUsageView struct {
	KeyID  string `json:"key_id"`
	Status string `json:"status"`
	*usageView
}

// usageListView is the answer of GET /api/v1/usage.
type usageListView struct {
	Usage []keyUsageView `json:"usage"`
}

// listUsage handles GET /api/v1/usage?ids=key_a,key_b: the usage of up to 500 keys,
// read together, in the order asked (a repeated id is answered once).
func (a *admin) listUsage(c echo.Context) error {
	q, err := query(c, "ids")
	if err != nil {
		return err
	}
	var ids []string
	for id := range strings.SplitSeq(q.Get("ids"), ",") {
		if id = strings.TrimSpace(id); id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 || len(ids) > vault.MaxKeysUsage {
		return validationProblem("the request is not valid",
			fieldError("ids", fmt.Sprintf("must list 1 to %d key ids, separated by commas", vault.MaxKeysUsage)))
	}
	keys, err := a.store.KeysUsage(c.Request().Context(), ids)
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	now := a.now()
	return c.JSON(http.StatusOK, usageListView{Usage: viewsOf(keys, func(k vault.KeyWindows) keyUsageView {
		return keyUsageView{
			KeyID:     k.Key.ID,
			Status:    string(k.Key.StatusAt(now)),
			usageView: newUsageView(k.Key, k.Windows, k.Usage, now),
		}
	})})
}

// daySpendView is one day of GET /api/v1/keys/{id}/spend.
type daySpendView struct {
	Date      string    `json:"date"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	Committed string    `json:"committed"`
	Held      string    `json:"held"`
}

// spendView is the answer of GET /api/v1/keys/{id}/spend.
type spendView struct {
	KeyID       string         `json:"key_id"`
	Currency    string         `json:"currency"`
	Timezone    string         `json:"timezone"`
	DailyCap    *string        `json:"daily_cap"`
	PeriodStart time.Time      `json:"period_start"`
	ExpiresAt   time.Time      `json:"expires_at"`
	Days        []daySpendView `json:"days"`
	Truncated   bool           `json:"truncated"`
}

// keySpend handles GET /api/v1/keys/{id}/spend: what the key committed and holds on
// each day of its billing period, with today's daily cap.
func (a *admin) keySpend(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	if _, err := query(c); err != nil {
		return err
	}
	rep, err := a.store.DailySpend(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("key spend %s: %w", id, err)
	}
	p := rep.Key.Policy
	cur := p.EffectiveCurrency()
	var dailyCap *string
	if m, ok := dailyCapMinor(&p); ok {
		s := policy.FormatMinor(cur, m)
		dailyCap = &s
	}
	v := spendView{
		KeyID:       rep.Key.ID,
		Currency:    cur,
		Timezone:    p.Location().String(),
		DailyCap:    dailyCap,
		PeriodStart: p.PeriodStart.UTC(),
		ExpiresAt:   p.ExpiresAt.UTC(),
		Days: viewsOf(rep.Days, func(d vault.DaySpend) daySpendView {
			return daySpendView{
				Date:      d.Date,
				Start:     d.Start.UTC(),
				End:       d.End.UTC(),
				Committed: policy.FormatMinor(cur, d.Committed),
				Held:      policy.FormatMinor(cur, d.Held),
			}
		}),
		Truncated: rep.Truncated,
	}
	return c.JSON(http.StatusOK, v)
}

// dailyCapMinor returns p's daily cap in minor units, if it has one.
func dailyCapMinor(p *policy.Policy) (int64, bool) {
	if p.DailyCap == nil {
		return 0, false
	}
	m, err := policy.ToMinor(p.EffectiveCurrency(), *p.DailyCap)
	return m, err == nil
}

// moneyPairView is committed and held money.
type moneyPairView struct {
	Committed string `json:"committed"`
	Held      string `json:"held"`
}

// currencySpendView is one currency's totals in the overview.
type currencySpendView struct {
	Currency string        `json:"currency"`
	Keys     int           `json:"keys"`
	Today    moneyPairView `json:"today"`
	Period   moneyPairView `json:"period"`
}

// nearCapView is one window near its cap in the overview.
type nearCapView struct {
	KeyID       string    `json:"key_id"`
	Name        string    `json:"name"`
	Window      string    `json:"window"`
	Currency    string    `json:"currency"`
	Timezone    string    `json:"timezone"`
	Cap         string    `json:"cap"`
	Committed   string    `json:"committed"`
	Held        string    `json:"held"`
	UsedPercent int       `json:"used_percent"`
	ResetAt     time.Time `json:"reset_at"`
	// Mode is the key's policy mode: a report-mode key past its cap was let
	// through, and would have been refused.
	Mode string `json:"mode"`
}

// refusalCountView counts one kind of refusal.
type refusalCountView struct {
	Decision string `json:"decision"`
	Reason   string `json:"reason"`
	Count    int    `json:"count"`
}

// refusalsView is the overview's recent refusals.
type refusalsView struct {
	Since     time.Time          `json:"since"`
	Total     int                `json:"total"`
	Truncated bool               `json:"truncated"`
	ByReason  []refusalCountView `json:"by_reason"`
}

// unknownHoldsView is the overview's outcome-unknown holds.
type unknownHoldsView struct {
	Count  int        `json:"count"`
	Oldest []holdView `json:"oldest"`
}

// keyCountsView counts keys by status.
type keyCountsView struct {
	Active  int `json:"active"`
	Revoked int `json:"revoked"`
	Expired int `json:"expired"`
}

// overviewView is the answer of GET /api/v1/overview.
type overviewView struct {
	Time           time.Time           `json:"time"`
	Keys           keyCountsView       `json:"keys"`
	Spend          []currencySpendView `json:"spend"`
	NearCapPercent int                 `json:"near_cap_percent"`
	NearCap        []nearCapView       `json:"near_cap"`
	NearCapTotal   int                 `json:"near_cap_total"`
	Refusals       refusalsView        `json:"refusals"`
	UnknownHolds   unknownHoldsView    `json:"unknown_holds"`
	RefusedKeys    refusedKeysView     `json:"refused_keys"`
	// UnknownKeys counts this process's refusals of tokens that are no key's.
	UnknownKeys unknownKeysView `json:"unknown_keys"`
	// Demo is set when the upstream is keybrake's built-in fake Stripe (serve --demo).
	Demo bool `json:"demo"`
}

// refusedKeyView is a revoked or expired key that requests still use.
type refusedKeyView struct {
	KeyID   string      `json:"key_id"`
	Name    string      `json:"name"`
	Status  string      `json:"status"`
	Refused refusedView `json:"refused"`
}

// refusedKeysView lists the revoked or expired keys refused since Since.
type refusedKeysView struct {
	Since time.Time        `json:"since"`
	Total int              `json:"total"`
	Keys  []refusedKeyView `json:"keys"`
}

// unknownKeysView counts refused credentials that are no key's, in this process.
type unknownKeysView struct {
	Count      int64      `json:"count"`
	Since      time.Time  `json:"since"`
	Last       *time.Time `json:"last,omitempty"`
	RemoteAddr string     `json:"remote_addr,omitempty"`
	Path       string     `json:"path,omitempty"`
}

// Overview parameters: what counts as near a cap, and how much is listed.
const (
	overviewNearCapPercent = 80
	overviewNearCapLimit   = 50
	overviewRefusalWindow  = time.Hour
	overviewOldestUnknown  = 10
	overviewRefusedKeys    = 10
	overviewRefusedWindow  = 24 * time.Hour
)

// overview handles GET /api/v1/overview: what an operator opens first.
func (a *admin) overview(c echo.Context) error {
	if _, err := query(c); err != nil {
		return err
	}
	ov, err := a.store.Overview(c.Request().Context(), vault.OverviewOptions{
		NearCapPercent:    overviewNearCapPercent,
		NearCapLimit:      overviewNearCapLimit,
		RefusalWindow:     overviewRefusalWindow,
		OldestUnknown:     overviewOldestUnknown,
		RefusedKeysWindow: overviewRefusedWindow,
		RefusedKeysLimit:  overviewRefusedKeys,
	})
	if err != nil {
		return fmt.Errorf("overview: %w", err)
	}
	v := overviewView{
		Time:           ov.Time.UTC(),
		Keys:           keyCountsView{Active: ov.Keys.Active, Revoked: ov.Keys.Revoked, Expired: ov.Keys.Expired},
		NearCapPercent: overviewNearCapPercent,
		NearCapTotal:   ov.NearCapTotal,
		Spend: viewsOf(ov.Spend, func(s vault.CurrencySpend) currencySpendView {
			return currencySpendView{
				Currency: s.Currency,
				Keys:     s.Keys,
				Today:    moneyPairView{Committed: formatAmount(s.Currency, s.TodayCommitted), Held: formatAmount(s.Currency, s.TodayHeld)},
				Period:   moneyPairView{Committed: formatAmount(s.Currency, s.PeriodCommitted), Held: formatAmount(s.Currency, s.PeriodHeld)},
			}
		}),
		NearCap: viewsOf(ov.NearCap, func(n vault.NearCap) nearCapView {
			cur := n.Key.Policy.EffectiveCurrency()
			return nearCapView{
				KeyID:       n.Key.ID,
				Name:        n.Key.Name,
				Window:      string(n.Window.Kind),
				Currency:    cur,
				Timezone:    n.Key.Policy.Location().String(),
				Cap:         policy.FormatMinor(cur, n.Window.Cap),
				Committed:   policy.FormatMinor(cur, n.Counter.Committed),
				Held:        policy.FormatMinor(cur, n.Counter.Held),
				UsedPercent: n.Percent,
				ResetAt:     n.Window.End.UTC(),
				Mode:        string(n.Key.Policy.EffectiveMode()),
			}
		}),
		Refusals: refusalsView{
			Since:     ov.RefusalsSince.UTC(),
			Truncated: ov.RefusalsTruncated,
			ByReason: viewsOf(ov.Refusals, func(r vault.RefusalCount) refusalCountView {
				return refusalCountView{Decision: string(r.Decision), Reason: r.Reason, Count: r.Count}
			}),
		},
		UnknownHolds: unknownHoldsView{Count: ov.UnknownHolds, Oldest: viewsOf(ov.OldestUnknown, newHoldView)},
		RefusedKeys: refusedKeysView{
			Since: ov.RefusedKeysSince.UTC(),
			Total: ov.RefusedKeysTotal,
			Keys: viewsOf(ov.RefusedKeys, func(k vault.Key) refusedKeyView {
				return refusedKeyView{KeyID: k.ID, Name: k.Name, Status: string(k.StatusAt(ov.Time)), Refused: *newRefusedView(k.Refused)}
			}),
		},
		Demo: a.demo,
	}
	if err := nameHolds(c.Request().Context(), a.store, v.UnknownHolds.Oldest); err != nil {
		return err
	}
	if a.stripe != nil {
		u := a.stripe.UnknownKeyRefusals()
		v.UnknownKeys = unknownKeysView{Count: u.Count, Since: u.Since.UTC(), Last: optionalTime(u.Last), RemoteAddr: u.RemoteAddr, Path: u.Path}
	}
	for _, r := range ov.Refusals {
		v.Refusals.Total += r.Count
	}
	return c.JSON(http.StatusOK, v)
}
