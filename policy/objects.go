package policy

import (
	"encoding/json"
	"time"
)

// Objects is the part of a policy about the money objects a key's requests
// created, after the request: CancelUnconfirmedAfter, when set, has keybrake
// cancel at Stripe a PaymentIntent the key created that is still unconfirmed
// (requires_payment_method, requires_confirmation or requires_action) that long
// after keybrake first counted it, and release its exposure. It is checked when
// the background refresher looks the object up (docs/metering.md, "Stale
// exposure").
type Objects struct {
	CancelUnconfirmedAfter time.Duration // 0: never
}

// The bounds of Objects.CancelUnconfirmedAfter.
const (
	MinCancelUnconfirmedAfter = 10 * time.Minute
	MaxCancelUnconfirmedAfter = 30 * 24 * time.Hour
)

// JSON field names of the objects object.
const (
	fieldObjects                = "objects"
	fieldCancelUnconfirmedAfter = "cancel_unconfirmed_after"
)

var objectsFields = []string{fieldCancelUnconfirmedAfter}

// CancelUnconfirmedAfter is how long a PaymentIntent the key created may stay
// unconfirmed before keybrake cancels it; 0 when the policy never cancels.
func (p *Policy) CancelUnconfirmedAfter() time.Duration {
	if p.Objects == nil {
		return 0
	}
	return p.Objects.CancelUnconfirmedAfter
}

// validateObjects adds the objects object's problems to v.
func (p *Policy) validateObjects(v *ValidationError) {
	o := p.Objects
	if o == nil || o.CancelUnconfirmedAfter == 0 {
		return
	}
	if o.CancelUnconfirmedAfter < MinCancelUnconfirmedAfter || o.CancelUnconfirmedAfter > MaxCancelUnconfirmedAfter {
		v.add(fieldObjects+"."+fieldCancelUnconfirmedAfter, "must be from 10m to 720h (it is %s)", formatDuration(o.CancelUnconfirmedAfter))
	}
}

// wireObjects is the objects object's JSON shape.
type wireObjects struct {
	CancelUnconfirmedAfter string `json:"cancel_unconfirmed_after,omitempty"`
}

// wire is the objects object as MarshalJSON writes it (nil for none).
func (o *Objects) wire() *wireObjects {
	if o == nil {
		return nil
	}
	w := &wireObjects{}
	if o.CancelUnconfirmedAfter != 0 {
		w.CancelUnconfirmedAfter = formatDuration(o.CancelUnconfirmedAfter)
	}
	return w
}

// parseObjects reads the objects object raw into out, adding its problems to v.
func parseObjects(v *ValidationError, raw json.RawMessage, out *Policy) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		v.add(fieldObjects, "must be an object like {\"cancel_unconfirmed_after\": \"24h\"}")
		return
	}
	checkKnownKeys(v, fieldObjects+".", obj, objectsFields)
	o := &Objects{}
	if r, ok := present(obj, fieldCancelUnconfirmedAfter); ok {
		var s string
		d, err := time.Duration(0), json.Unmarshal(r, &s)
		if err == nil {
			d, err = time.ParseDuration(s)
		}
		if err != nil || d <= 0 {
			v.add(fieldObjects+"."+fieldCancelUnconfirmedAfter, "must be a duration like \"24h\"")
		} else {
			o.CancelUnconfirmedAfter = d
		}
	}
	out.Objects = o
}
