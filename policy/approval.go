package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shopspring/decimal"
)

// Approval is the part of a policy that makes a person decide before money
// moves: a money request whose amount (the money object's new total, as the
// per-request cap counts it) is above Above, or whose operation matches one of
// Operations, is held but not forwarded until an admin approves it. Timeout is
// how long a pending approval waits for a decision, and how long an approved
// one waits for its retry.
type Approval struct {
	Above      *decimal.Decimal
	Operations []string
	Timeout    time.Duration // 0: DefaultApprovalTimeout
}

// The bounds and default of Approval.Timeout.
const (
	DefaultApprovalTimeout = 30 * time.Minute
	MinApprovalTimeout     = time.Minute
	MaxApprovalTimeout     = 72 * time.Hour
)

// JSON field names of the approval object.
const (
	fieldApproval           = "approval"
	fieldApprovalAbove      = "above"
	fieldApprovalOperations = "operations"
	fieldApprovalTimeout    = "timeout"
)

var approvalFields = []string{fieldApprovalAbove, fieldApprovalOperations, fieldApprovalTimeout}

// EffectiveTimeout is the approval's timeout, or DefaultApprovalTimeout when
// it names none.
func (a *Approval) EffectiveTimeout() time.Duration {
	if a == nil || a.Timeout == 0 {
		return DefaultApprovalTimeout
	}
	return a.Timeout
}

// NeedsApproval reports whether the money request req must wait for a
// person's decision under p: p has an approval rule, the key enforces its
// policy (report mode lets requests through and only records them), and
// either what the request's money object can move in all, max(Amount,
// ObjectTotal), is above the threshold, or its operation is listed. It is
// checked beside the caps, in the transaction that places the hold, after
// Decide allowed the request.
func (p *Policy) NeedsApproval(req Request) bool {
	a := p.Approval
	if a == nil || p.EffectiveMode() != ModeEnforce {
		return false
	}
	for _, g := range a.Operations {
		if matchGlob(g, req.Operation) {
			return true
		}
	}
	if a.Above == nil {
		return false
	}
	above, err := ToMinor(p.EffectiveCurrency(), *a.Above)
	if err != nil {
		return true // a threshold that cannot be read asks a person: fail closed
	}
	return max(req.Amount, req.ObjectTotal) > above
}

// validateApproval adds the approval object's problems to v.
func (p *Policy) validateApproval(v *ValidationError) {
	a := p.Approval
	if a == nil {
		return
	}
	if a.Above == nil && len(a.Operations) == 0 {
		v.add(fieldApproval, "needs above, operations or both")
	}
	if a.Above != nil {
		cur := p.EffectiveCurrency()
		switch _, err := ToMinor(cur, *a.Above); {
		case a.Above.Sign() < 0:
			v.add(fieldApproval+"."+fieldApprovalAbove, "must not be negative (it is %s)", exactString(*a.Above))
		case errors.Is(err, ErrPrecision):
			v.add(fieldApproval+"."+fieldApprovalAbove, "%s has more decimals than %s allows", exactString(*a.Above), cur)
		case err != nil:
			v.add(fieldApproval+"."+fieldApprovalAbove, "%s is not a valid amount: %v", exactString(*a.Above), err)
		}
	}
	for i, op := range a.Operations {
		if msg := checkGlob(op); msg != "" {
			v.add(fmt.Sprintf("%s.%s[%d]", fieldApproval, fieldApprovalOperations, i), "%q: %s", op, msg)
		}
	}
	if a.Timeout != 0 && (a.Timeout < MinApprovalTimeout || a.Timeout > MaxApprovalTimeout) {
		v.add(fieldApproval+"."+fieldApprovalTimeout, "must be from 1m to 72h (it is %s)", a.Timeout)
	}
}

// wireApproval is the approval object's JSON shape.
type wireApproval struct {
	Above      string   `json:"above,omitempty"`
	Operations []string `json:"operations,omitempty"`
	Timeout    string   `json:"timeout,omitempty"`
}

// wire is the approval object as MarshalJSON writes it (nil for none).
func (a *Approval) wire(currency string) *wireApproval {
	if a == nil {
		return nil
	}
	w := &wireApproval{Operations: a.Operations}
	if a.Above != nil {
		w.Above = formatMajor(currency, *a.Above)
	}
	if a.Timeout != 0 {
		w.Timeout = formatDuration(a.Timeout)
	}
	return w
}

// formatDuration writes d the way people write it ("30m", "2h", "1h30m").
func formatDuration(d time.Duration) string {
	s := d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}

// parseApproval reads the approval object raw into out, adding its problems to v.
func parseApproval(v *ValidationError, raw json.RawMessage, out *Policy) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		v.add(fieldApproval, "must be an object like {\"above\": \"200.00\", \"timeout\": \"30m\"}")
		return
	}
	checkKnownKeys(v, fieldApproval+".", obj, approvalFields)
	a := &Approval{}
	if r, ok := present(obj, fieldApprovalAbove); ok {
		d, err := parseCapJSON(r)
		if err != nil {
			v.add(fieldApproval+"."+fieldApprovalAbove, "%v", err)
		} else {
			a.Above = &d
		}
	}
	if r, ok := present(obj, fieldApprovalOperations); ok {
		if err := json.Unmarshal(r, &a.Operations); err != nil {
			v.add(fieldApproval+"."+fieldApprovalOperations, "must be an array of strings")
		}
	}
	if r, ok := present(obj, fieldApprovalTimeout); ok {
		var s string
		d, err := time.Duration(0), json.Unmarshal(r, &s)
		if err == nil {
			d, err = time.ParseDuration(s)
		}
		if err != nil || d <= 0 {
			v.add(fieldApproval+"."+fieldApprovalTimeout, "must be a duration like \"30m\" or \"2h\"")
		} else {
			a.Timeout = d
		}
	}
	out.Approval = a
}
