package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// prepare runs the steps before forwarding, in this order, each in its file:
//
//  1. authenticate the vault key (authenticate.go);
//  2. read the request exactly as Stripe would (request.go);
//  3. authorise it against the policy, amount aside (authorise.go);
//  4. unseal the upstream's real secret, cached for a few seconds (secrets.go);
//  5. read, demand or derive the idempotency key (reserve.go), before any amount
//     lookup, so that a request refused for its key costs Stripe nothing;
//  6. work out the amount of a request that can move money (amount.go, with
//     the lookups of lookup.go);
//  7. one Store.Reserve: the claim and the hold, or a replay or refusal
//     (reserve.go); a request without an idempotency key keeps no record;
//  8. put a report-mode would-refuse of a request that moves no money in the
//     ledger (below: Reserve records the others).
//
// It returns a refusal, or leaves c ready to forward (or with c.replay set).
// ServeHTTP then forwards (9, forward.go) and settles (10, settle.go; what
// Stripe's answer means for the hold is decideSettle's, settle_decision.go),
// or answers itself; the answers keybrake writes and the canonical log line
// (11) are in answer.go. call (call.go) holds what each step wrote.
//
// A key this replica remembered (step 1) may have been changed by another
// since: steps 3 to 7 are decided again, once, with the key as it is now when
// the Reserve that checks it, or confirmKey before anything else rests on it,
// finds it changed.
func (p *Proxy) prepare(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call) error {
	if !c.asked {
		if err := p.authenticate(ctx, r, c); err != nil {
			return err
		}
	}
	if err := p.readRequest(w, r, c); err != nil {
		return err
	}
	err := p.decide(ctx, r, c)
	if errors.Is(err, errKeyChanged) {
		c.undecide()
		err = p.decide(ctx, r, c)
	}
	if err != nil {
		return err
	}
	p.recordUnmeteredWouldRefuse(ctx, c)
	return nil
}

// decide runs steps 3 to 7. A remembered key that no Reserve checked is read
// again (confirmKey) before the request is refused or goes on, and what it
// is now overrides the outcome.
func (p *Proxy) decide(ctx context.Context, r *http.Request, c *call) error {
	err := p.decideSteps(ctx, r, c)
	if cerr := p.confirmKey(ctx, c); cerr != nil {
		return cerr
	}
	return err
}

func (p *Proxy) decideSteps(ctx context.Context, r *http.Request, c *call) error {
	if err := p.authorise(c); err != nil {
		return err
	}
	secret, err := p.upstreamSecret(ctx, c.key)
	if err != nil {
		return internalError(fmt.Errorf("upstream secret %q: %w", c.key.Upstream, err))
	}
	c.secret = secret
	if c.idemKey, c.idemOutcome, err = p.idempotency(r, c); err != nil {
		return err
	}
	if err := approvalHeaders(r, c); err != nil {
		return err
	}
	if err := p.resolveAmount(ctx, c); err != nil {
		return err
	}
	return p.reserve(ctx, c)
}

// recordUnmeteredWouldRefuse puts a request that moves no money, and that report
// mode lets through although the policy would refuse it, in the key's ledger
// (metered requests get their event from Store.Reserve). Losing this entry moves
// no money, so a store error is logged rather than failing the request.
func (p *Proxy) recordUnmeteredWouldRefuse(ctx context.Context, c *call) {
	if c.metered() || c.decision != decisionWouldRefuse {
		return
	}
	err := p.store.RecordEvent(ctx, vault.Event{
		KeyID: c.key.ID, Operation: c.cls.Operation, Decision: vault.DecisionWouldRefuse, Reason: string(c.reason),
		ObjectID: c.cls.ObjectID, Tool: c.tool,
	})
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelError, "report-mode event not recorded",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.Any(logfield.Error, err))
	}
}
