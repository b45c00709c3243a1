package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// A money request the key's policy makes a person decide on is held by
// Store.Reserve and answered 402 approval_required here, unless the caller
// asked to wait (Keybrake-Approval-Wait): then the proxy waits on the same
// connection for the decision and forwards at once when it is approved.

// Headers of an approval.
const (
	// headerApprovalReason is the caller's reason, shown to the approver.
	headerApprovalReason = "Keybrake-Approval-Reason"
	// headerApprovalWait is how many seconds the caller waits for a decision.
	headerApprovalWait = "Keybrake-Approval-Wait"
)

// MaxApprovalWait is the longest Keybrake-Approval-Wait a caller may ask for.
const MaxApprovalWait = 60 * time.Second

// DefaultApprovalPoll is how often a waiting request reads the approval from
// the store, for decisions made through another replica (this process's own
// decisions wake it at once).
const DefaultApprovalPoll = time.Second

// approvalHeaders reads the request's approval headers into c (step 5, beside
// the idempotency key): the reason, with the request's parameters masked, for
// a money request under a policy that asks for approval; the wait for any.
func approvalHeaders(r *http.Request, c *call) error {
	if v := r.Header.Get(headerApprovalWait); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || time.Duration(n)*time.Second > MaxApprovalWait {
			return malformed(err, "%s must be a number of seconds from 0 to %d.", headerApprovalWait, int(MaxApprovalWait/time.Second))
		}
		c.approvalWait = time.Duration(n) * time.Second
	}
	reason := r.Header.Get(headerApprovalReason)
	if len(reason) > vault.MaxApprovalReason {
		return malformed(nil, "%s must be at most %d bytes.", headerApprovalReason, vault.MaxApprovalReason)
	}
	if !c.metered() || c.key.Policy.Approval == nil {
		return nil
	}
	pairs := c.params.Pairs()
	ask := &vault.ApprovalAsk{Reason: reason, Params: make([]vault.Param, len(pairs))}
	for i, pr := range pairs {
		ask.Params[i] = vault.Param{Name: pr.Key, Value: vault.MaskParam(pr.Key, pr.Value)}
	}
	c.ask = ask
	return nil
}

// awaitDecision waits, at most c.approvalWait, for the pending approval of
// res to be decided, then reserves again: the answer of that Reserve (an
// approved request is claimed for forwarding) is returned. It wakes when this
// process decides (Store.WatchApproval), and every poll interval reads the
// approval for a decision made elsewhere: no busy loop.
func (p *Proxy) awaitDecision(ctx context.Context, req vault.ReserveRequest, res vault.ReserveResult, wait time.Duration) (vault.ReserveResult, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	poll := time.NewTicker(p.approvalPoll)
	defer poll.Stop()
	id := res.Approval.ID
	for {
		woken, stop := p.store.WatchApproval(id)
		select {
		case <-woken:
		case <-poll.C:
			a, err := p.store.GetApproval(ctx, id)
			if err != nil {
				stop()
				return res, err
			}
			if a.State == vault.ApprovalPending && p.store.Now().Before(a.ExpiresAt) {
				stop()
				continue
			}
		case <-deadline.C:
			stop()
			return res, nil
		case <-ctx.Done():
			stop()
			return res, ctx.Err()
		}
		stop()
		next, err := p.store.Reserve(ctx, req)
		if err != nil || next.Outcome != vault.ReserveApproval || next.Approval.State != vault.ApprovalPending {
			return next, err
		}
		res = next
	}
}

// approvalRefusal is the answer to a request that waits for a person, or that
// a person declined, or whose approval expired: 402, not to be retried by an
// SDK (a retry with the same idempotency key is how the caller asks again).
func approvalRefusal(a *vault.Approval) *refusal {
	var rf *refusal
	switch a.State {
	case vault.ApprovalDeclined:
		rf = refuse(CodeApprovalDeclined, "An operator declined this request (approval %s). Retries with this idempotency key get the same answer.", a.ID)
	case vault.ApprovalExpired:
		rf = refuse(CodeApprovalExpired, "The approval %s expired before the request was forwarded. Retries with this idempotency key get the same answer; send a new request to ask again.", a.ID)
	default:
		rf = refuse(CodeApprovalRequired, "This request needs an operator's approval (%s). Its amount is held. Retry with the same idempotency key once it is approved, before %s, or send %s: N to wait.",
			a.ID, a.ExpiresAt.UTC().Format(time.RFC3339), headerApprovalWait)
	}
	exp := a.ExpiresAt.UTC()
	rf.Detail.Reason = rf.Code
	rf.Detail.ApprovalID, rf.Detail.ExpiresAt = a.ID, &exp
	rf.Detail.Amount, rf.Detail.Currency = formatMinor(a.Currency, a.Amount), a.Currency
	rf.Detail.Operation = a.Operation
	return rf
}

// approvalOutcome is what reserve does with a Reserve that answered about an
// approval: waits for a decision when asked to, else refuses.
func (p *Proxy) approvalOutcome(ctx context.Context, c *call, req vault.ReserveRequest, res vault.ReserveResult) (vault.ReserveResult, error) {
	if res.Approval == nil {
		return res, internalError(fmt.Errorf("reserve: an approval outcome without its approval"))
	}
	if res.Approval.State == vault.ApprovalPending && c.approvalWait > 0 {
		next, err := p.awaitDecision(ctx, req, res, c.approvalWait)
		if err != nil {
			return res, internalError(fmt.Errorf("wait for approval %s: %w", res.Approval.ID, err))
		}
		if next.Outcome != vault.ReserveApproval {
			return next, nil
		}
		res = next
	}
	return res, approvalRefusal(res.Approval)
}
