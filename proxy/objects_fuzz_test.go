package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
)

// Caps of the key each FuzzPaymentObjects run uses (minor units).
const (
	fuzzDailyCap      = 10000 // 100.00
	fuzzPerRequestCap = 6000  // 60.00
)

// FuzzPaymentObjects drives random sequences of PaymentIntent operations through
// keybrake against the fake Stripe — create (manual capture or not, confirmed at
// once or not, declined or not), raise or lower, confirm, capture in pieces with
// final_capture true or false, capture the rest, increment the authorisation,
// cancel, read — on PaymentIntents the key creates and on authorisations made
// outside it. After each sequence the store's invariant holds and what those
// PaymentIntents moved, or can still move, through this key is within its caps:
// the daily cap in all, the per-request cap for each one.
//
// Each step is three bytes: operation, which PaymentIntent, amount (× 100 minor
// units). The default run replays the seeds; fuzz with
// go test -fuzz FuzzPaymentObjects ./proxy/.
func FuzzPaymentObjects(f *testing.F) {
	e := MustEnv(f)
	f.Add([]byte{8, 0, 200, 3, 0, 20, 3, 0, 20, 3, 0, 20, 3, 0, 20})                 // multicapture of a foreign authorisation
	f.Add([]byte{0, 0, 10, 1, 0, 20, 1, 0, 30, 1, 0, 60, 1, 0, 90, 2, 0, 0})         // raises past the per-request cap
	f.Add([]byte{0, 1, 50, 0, 2, 50, 0, 3, 50, 6, 1, 0, 0, 4, 50})                   // declined creations, one cancelled
	f.Add([]byte{0, 0, 40, 2, 0, 0, 3, 0, 10, 3, 0, 10, 4, 0, 0, 7, 0, 0})           // own authorisation captured in pieces
	f.Add([]byte{8, 1, 30, 5, 1, 59, 5, 1, 61, 3, 1, 60, 7, 1, 0})                   // increments of a foreign authorisation
	f.Add([]byte{0, 2, 30, 2, 2, 0, 6, 2, 0, 0, 3, 30, 1, 3, 60, 7, 3, 0, 0, 4, 59}) // cancels and reads between creations
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) > 3*40 {
			t.Skip("at most 40 steps")
		}
		tok, key := e.MustKey(t, Policy("100.00", func(p *policy.Policy) {
			c := decimal.RequireFromString("60.00")
			p.PerRequestCap = &c
		}))
		ids := map[byte]string{}     // slot → PaymentIntent id
		created := map[string]bool{} // PaymentIntent id → created by this key (else authorised outside it)
		for step := 0; step+2 < len(prog); step += 3 {
			op, slot, amount := prog[step]%9, prog[step+1]%4, strconv.Itoa((int(prog[step+2])+1)*100)
			idem := fmt.Sprintf("s%d", step)
			id, ok := ids[slot]
			switch {
			case op == 0:
				body := form("amount", amount, "currency", "usd")
				switch prog[step+2] % 4 {
				case 1:
					body.Set("capture_method", "manual")
					body.Set("payment_method", "pm_card_visa")
					body.Set("confirm", "true")
				case 2:
					body.Set("payment_method", "pm_card_chargeDeclined")
					body.Set("confirm", "true")
				case 3:
					body.Set("capture_method", "manual")
				}
				r := e.Post(t, "/v1/payment_intents", tok, idem, body)
				if pi := createdPaymentIntent(r); pi != "" {
					ids[slot], created[pi] = pi, true
				}
			case op == 8:
				pi := e.Fake.AddAuthorization(int64(prog[step+2])*1000, "usd", "")
				ids[slot], created[pi] = pi, false
			case !ok:
			case op == 1:
				e.Post(t, "/v1/payment_intents/"+id, tok, idem, form("amount", amount))
			case op == 2:
				pm := "pm_card_visa"
				if prog[step+2]%5 == 0 {
					pm = "pm_card_chargeDeclined"
				}
				e.Post(t, "/v1/payment_intents/"+id+"/confirm", tok, idem, form("payment_method", pm))
			case op == 3:
				final := strconv.FormatBool(prog[step+2]%3 == 0)
				e.Post(t, "/v1/payment_intents/"+id+"/capture", tok, idem, form("amount_to_capture", amount, "final_capture", final))
			case op == 4:
				e.Post(t, "/v1/payment_intents/"+id+"/capture", tok, idem, form())
			case op == 5:
				e.Post(t, "/v1/payment_intents/"+id+"/increment_authorization", tok, idem, form("amount", amount))
			case op == 6:
				e.Post(t, "/v1/payment_intents/"+id+"/cancel", tok, idem, form())
			case op == 7:
				e.MustSend(t, http.MethodGet, "/v1/payment_intents/"+id, tok, nil, "")
			}
		}
		require.NoError(t, e.Store.CheckInvariant(context.Background()))
		var total int64
		for id, own := range created {
			pi, ok := e.Fake.PaymentIntent(id)
			require.True(t, ok)
			// What moved or can still move through this key: only this key
			// captures the authorisations made outside it.
			through := pi.AmountReceived
			if own && pi.Status != "succeeded" && pi.Status != "canceled" {
				through = pi.Amount
			}
			assert.LessOrEqual(t, through, int64(fuzzPerRequestCap), "%s moved or can move %d through one key: %+v", pi.ID, through, pi)
			total += through
		}
		assert.LessOrEqual(t, total, int64(fuzzDailyCap), "this key's PaymentIntents moved or can move %d", total)
		c, h := usage(t, e, key.ID)
		assert.GreaterOrEqual(t, c+h, total, "keybrake counts at least what they moved or can move")
	})
}

// createdPaymentIntent is the PaymentIntent a creation's answer shows: the object
// itself, or the one a decline carries.
func createdPaymentIntent(r reply) string {
	if id, _ := r.Body["id"].(string); id != "" {
		return id
	}
	e, _ := r.Body["error"].(map[string]any)
	pi, _ := e["payment_intent"].(map[string]any)
	id, _ := pi["id"].(string)
	return id
}
