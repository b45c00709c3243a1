package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// keybrake's own reads at Stripe, before a request is forwarded (the amount
// lookups of step 6, see prepare) and for an operator's refresh: a GET with the
// upstream's real secret and the call's account headers.

// lookup GETs the object at Stripe with the real secret and the call's account
// headers and reads the integer field l.Field, "currency" and l.Factors. When
// Stripe refuses keybrake's secret or gives no answer (none, 429, 5xx), the error
// is the *refusal to answer with; any other error means the amount cannot be
// known.
func (p *Proxy) lookup(ctx context.Context, c *call, l stripeapi.Lookup) (stripeapi.LookupResult, error) {
	var query url.Values
	if expand := stripeapi.LookupExpand(l.Accounts); len(expand) > 0 {
		query = url.Values{"expand[]": expand}
	}
	body, err := p.fetch(ctx, c, l.Path, query)
	if err != nil {
		return stripeapi.LookupResult{}, err
	}
	return stripeapi.ReadLookup(body, l)
}

// fetch GETs path at Stripe with the real secret and the call's Stripe-Account,
// Stripe-Context and Stripe-Version, with query (expansions, a list's filter),
// and returns the body of a 200.
func (p *Proxy) fetch(ctx context.Context, c *call, path string, query url.Values) ([]byte, error) {
	return p.send(ctx, c, http.MethodGet, path, query, nil, "")
}

// send is fetch for any method: a POST carries form as its
// application/x-www-form-urlencoded body and idem as its Idempotency-Key (a
// request keybrake makes by itself, such as the background refresher's
// cancel of an unconfirmed PaymentIntent).
func (p *Proxy) send(ctx context.Context, c *call, method, path string, query, form url.Values, idem string) ([]byte, error) {
	if !strings.HasPrefix(path, "/v1/") || strings.ContainsAny(path, "?#%") || strings.Contains(path, "..") {
		return nil, fmt.Errorf("lookup path %q refused", path)
	}
	if err := p.confirmKey(ctx, c); err != nil {
		return nil, err // what the key is now overrides the outcome (decide)
	}
	u := *p.upstream
	u.Path = strings.TrimSuffix(p.upstream.Path, "/") + path
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	if len(query) > 0 {
		u.RawQuery = query.Encode()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
	defer cancel()
	var reqBody io.Reader
	if form != nil {
		reqBody = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), reqBody)
	if err != nil {
		return nil, fmt.Errorf("lookup request: %w", err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if idem != "" {
		req.Header.Set(headerIdempotencyKey, idem)
	}
	req.Header.Set("Authorization", "Bearer "+c.secret)
	if c.account != "" {
		req.Header.Set(headerStripeAccount, c.account)
	}
	if c.stripeContext != "" {
		req.Header.Set(headerStripeContext, c.stripeContext)
	}
	if c.stripeVersion != "" {
		req.Header.Set(headerStripeVersion, c.stripeVersion)
	}
	resp, err := p.lookups.Do(req)
	if err != nil {
		return nil, lookupUnavailable(c, fmt.Errorf("lookup %s: %w", path, err))
	}
	defer resp.Body.Close()
	switch {
	case isCredentialRefusal(resp.StatusCode):
		return nil, p.upstreamAuthFailed(c, "lookup", resp.StatusCode, resp.Header.Get(headerRequestID)).refusal(false)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return nil, lookupUnavailable(c, fmt.Errorf("lookup %s: status %d", path, resp.StatusCode))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.maxResponse))
	if err != nil {
		return nil, lookupUnavailable(c, fmt.Errorf("lookup %s: read: %w", path, err))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &lookupStatusError{path: path, status: resp.StatusCode}
	}
	return body, nil
}

// lookupStatusError is Stripe's answer to a lookup when it is neither 200 nor
// one fetch turns into a refusal (401, 403, 429, 5xx): a 404, a 400.
type lookupStatusError struct {
	path   string
	status int
}

// Error implements error.
func (e *lookupStatusError) Error() string {
	return fmt.Sprintf("lookup %s: status %d", e.path, e.status)
}

// lookupUnavailable is the refusal of a request whose amount lookup Stripe did
// not answer (no answer, 429, 5xx): an upstream failure rather than an amount
// that cannot be known, and the request itself was never sent.
func lookupUnavailable(c *call, cause error) *refusal {
	rf := refuse(CodeUpstreamUnavailable,
		"keybrake could not read the amount of this %s request from Stripe: the request was not sent, so nothing was executed. It is safe to retry.",
		c.cls.Operation)
	if isTimeout(cause) {
		rf.Status = http.StatusGatewayTimeout
	}
	rf.cause = cause
	return rf
}
