package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Steps 5 and 7 of the pipeline (see prepare): the idempotency key, then the one
// Store.Reserve that claims it and places the hold, or refuses.

// idempotency takes the request's idempotency key (step 5): only a POST has one;
// a derive-mode key computes it from the request's fields (the outcome is then
// idemDerived), and a request that moves money must carry a valid one — or,
// from the MCP endpoint (NewContextDerivingIdempotency), gets one derived. A POST
// that moves no money keeps a record only when it carries a key. "" is no key.
func (p *Proxy) idempotency(r *http.Request, c *call) (string, idemOutcome, error) {
	if c.method != http.MethodPost {
		return "", "", nil
	}
	callerKey, present, perr := ParseIdempotencyKey(r.Header)
	pol := &c.key.Policy
	if c.metered() && pol.Idempotency.Mode == policy.IdempotencyDerive {
		k, err := DeriveIdempotencyKey(c.cls.Operation, pol.Idempotency.Fields, c.params.Get)
		if err != nil {
			var missing *MissingFieldError
			if !errors.As(err, &missing) {
				return "", "", internalError(fmt.Errorf("derive idempotency key: %w", err))
			}
			rf := refuse(CodeIdemKeyRequired, "This vault key derives idempotency keys from the request: the parameter %q is required.", missing.Field)
			rf.Param, rf.Detail.Field = missing.Field, missing.Field
			return "", "", rf
		}
		return k, idemDerived, nil
	} else if present || c.metered() {
		if perr != nil {
			rf := refuse(CodeIdemKeyInvalid, "The Idempotency-Key must be 1 to %d printable characters, bare or as a quoted string.", MaxIdempotencyKeyLen)
			rf.cause = perr
			return "", "", rf
		}
		if !present {
			if d := derivationFrom(r.Context()); d != nil && c.metered() {
				d.Key = DeriveCallIdempotencyKey(c.key.ID, c.cls.Operation,
					Fingerprint(c.method, c.path, c.account, c.stripeContext, c.params.Canonical()))
				return d.Key, idemDerived, nil
			}
			return "", "", refuse(CodeIdemKeyRequired, "An Idempotency-Key header is required on requests that move money.")
		}
		return callerKey, "", nil
	}
	return "", "", nil
}

// reserve is step 7: the one Store.Reserve of the request, and what its outcome
// means — forward (claimed, resumed), replay, or refuse. A request without an
// idempotency key keeps no record and makes no Reserve: it goes on as
// authorised.
func (p *Proxy) reserve(ctx context.Context, c *call) error {
	if c.idemKey == "" {
		if c.decision == "" {
			c.decision = decisionAllowed
		}
		return nil
	}
	fp := Fingerprint(c.method, c.path, c.account, c.stripeContext, c.params.Canonical())
	req := vault.ReserveRequest{
		KeyID:          c.key.ID,
		IdempotencyKey: c.idemKey,
		Fingerprint:    fp,
		Request:        c.policyRequest(c.amount, c.currency),
		Metered:        c.metered(),
		Tool:           c.tool,
		Ask:            c.ask,
	}
	req.Request.ObjectTotal = c.objectTotal
	if !c.metered() {
		req.Request.Amount, req.Request.Currency, req.Request.ObjectTotal = 0, "", 0
	}
	if c.remembered != nil {
		// The transaction checks the remembered key, with the hold.
		req.KeyVersion, req.UpstreamVersion = c.key.Version, c.key.UpstreamVersion
	}
	res, err := p.store.Reserve(ctx, req)
	if errors.Is(err, vault.ErrKeyChanged) {
		return errKeyChanged // decide reads the key again
	}
	c.remembered, req.KeyVersion = nil, 0 // what Reserve answered rests on the key as it is now
	switch {
	case errors.Is(err, vault.ErrKeyRevoked):
		return refuse(CodeVaultKeyRevoked, "This vault key has been revoked.")
	case err != nil:
		return internalError(fmt.Errorf("reserve: %w", err))
	}
	if res.Outcome == vault.ReserveApproval || (res.Outcome == vault.ReserveReplay && res.Record.Response == nil && res.Approval != nil &&
		(res.Approval.State == vault.ApprovalDeclined || res.Approval.State == vault.ApprovalExpired)) {
		if res, err = p.approvalOutcome(ctx, c, req, res); err != nil {
			c.idemOutcome = idemOutcomeOf(res.Outcome)
			return err
		}
	}
	c.windows, c.usage = res.Windows, res.Usage
	c.idemOutcome = idemOutcomeOf(res.Outcome)
	if res.Hold != nil {
		c.holdWindows = res.Hold.WindowIDs
	}
	switch res.Outcome {
	case vault.ReserveClaimed:
		c.upstreamKey = res.Record.UpstreamKey
		c.decision = decisionAllowed
		if res.Decision.WouldRefuse {
			c.decision, c.reason = decisionWouldRefuse, codeOf(res.Decision.Reason)
		}
		if res.Hold != nil {
			c.amount = res.Hold.Amount
		}
		return nil
	case vault.ReserveResume:
		c.upstreamKey = res.Record.UpstreamKey
		c.decision = decisionResumed
		if res.Hold != nil {
			c.amount = res.Hold.Amount
		}
		return nil
	case vault.ReserveReplay:
		rec := res.Record
		if rec.Response == nil && rec.Resolved && res.Hold != nil {
			rec.Response = resolvedAnswer(res.Hold.ID, res.Hold.State, c.requestID)
		}
		if rec.Response == nil {
			return internalError(fmt.Errorf("replay of %s: no stored response", rec.IdempotencyKey))
		}
		c.replay = &rec
		c.decision = decisionReplayed
		return nil
	case vault.ReserveInFlight:
		rf := refuse(CodeIdemKeyInUse, "There is currently another in-progress request using this idempotency key. Retry later.")
		rf.RetryAfter = 1
		return rf
	case vault.ReserveMismatch:
		return refuse(CodeIdemKeyReused, "This idempotency key was already used with a different request.")
	case vault.ReserveStale:
		return refuse(CodeIdemOutcomeUnknown,
			"The outcome of the first request with this idempotency key is unknown and too old to retry safely; an operator must resolve it.")
	case vault.ReserveRefused:
		cur := c.currency
		if cur == "" {
			cur = c.key.Policy.Currency
		}
		return reasonRefusal(res.Decision, cur)
	default:
		return internalError(fmt.Errorf("reserve: unexpected outcome %d", res.Outcome))
	}
}
