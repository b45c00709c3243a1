package vault

import (
	"time"

	"github.com/keybrake/keybrake/policy"
)

// RaiseScope is the key or budget a raise belongs to.
type RaiseScope struct {
	Kind policy.ScopeKind
	ID   string
}

// MaxRaiseReasonLen bounds a raise's (and a raise request's) reason, in bytes.
const MaxRaiseReasonLen = 500

// MaxActiveRaises is the most raises one scope may have active at once.
const MaxActiveRaises = 20

// MaxPendingRaiseRequests is the most raise requests one vault key may have
// pending at once.
const MaxPendingRaiseRequests = 5

// RaiseRetention is how long a raise that has ended is still listed with its
// scope before a later change of the scope's raises drops it. Its audit entries
// stay.
const RaiseRetention = 35 * 24 * time.Hour

// NewRaise is what AddRaise and RequestRaise take: Amount in minor units of the
// scope's currency, added to the cap of Window until Until.
type NewRaise struct {
	Window policy.WindowKind
	Amount int64
	Until  time.Time
	Reason string
}

// Raise is a time-boxed addition to one cap window of a key or a budget. It
// adds Amount to the window's cap while the store clock is before End(); then
// the cap is what it was, by itself. What was committed or held meanwhile stays
// counted.
type Raise struct {
	ID       string // "raise_" + 26 characters
	Scope    RaiseScope
	Window   policy.WindowKind
	Amount   int64 // minor units of Currency
	Currency string
	Until    time.Time
	Reason   string
	// CreatedBy is the admin who added the raise, or who approved the raise
	// request (RequestID) it came from.
	CreatedBy string
	CreatedAt time.Time
	RequestID string // the raise request it came from ("" when added directly)
	// EndedAt and EndedBy are set when an admin ended the raise before Until.
	EndedAt time.Time
	EndedBy string
}

// End is when the raise stops adding to its cap: Until, or EndedAt when an
// admin ended it earlier.
func (r Raise) End() time.Time {
	if !r.EndedAt.IsZero() && r.EndedAt.Before(r.Until) {
		return r.EndedAt
	}
	return r.Until
}

// Active reports whether the raise adds to its cap at now.
func (r Raise) Active(now time.Time) bool { return now.Before(r.End()) }

// PolicyRaises is what the cap arithmetic (policy.EffectiveCap) needs of rs.
func PolicyRaises(rs []Raise) []policy.Raise {
	if len(rs) == 0 {
		return nil
	}
	out := make([]policy.Raise, len(rs))
	for i, r := range rs {
		out[i] = policy.Raise{Window: r.Window, Amount: r.Amount, Until: r.End()}
	}
	return out
}

// RaiseRequestState is where a raise request stands.
type RaiseRequestState string

// Raise request states.
const (
	RaiseRequestPending  RaiseRequestState = "pending"
	RaiseRequestApproved RaiseRequestState = "approved"
	RaiseRequestDeclined RaiseRequestState = "declined"
)

// RaiseRequest is a vault key asking an admin for a raise of one of its caps.
type RaiseRequest struct {
	ID       string // "rr_" + 26 characters, sortable by creation time
	KeyID    string
	KeyName  string
	Window   policy.WindowKind
	Amount   int64 // minor units of Currency
	Currency string
	Until    time.Time
	Reason   string
	State    RaiseRequestState
	// CreatedAt is when the key asked; DecidedAt, DecidedBy and Note when and
	// by whom it was approved or declined, and what they wrote.
	CreatedAt time.Time
	DecidedAt time.Time
	DecidedBy string
	Note      string
	// RaiseID is the raise an approval created.
	RaiseID string
}

// Windows is the key's cap windows at now with the caps its raises give them
// at now (policy.RaiseWindows).
func (k *Key) Windows(now time.Time) ([]policy.Window, error) {
	w, err := k.Policy.Windows(now)
	if err != nil {
		return nil, err
	}
	return policy.RaiseWindows(w, PolicyRaises(k.Raises), now), nil
}

// PerRequestCap is the key's per-request cap at now, raised by its active
// per-request raises, and whether it has one.
func (k *Key) PerRequestCap(now time.Time) (int64, bool) {
	return policy.RaisedPerRequestCap(&k.Policy, PolicyRaises(k.Raises), now)
}
