// Package proxy is keybrake's Stripe-facing request pipeline: the strict form parser,
// the Stripe operation catalogue, idempotency handling, the metering reverse proxy
// and Stripe-shaped errors.
//
// # The pipeline
//
// Proxy.ServeHTTP takes every request through these steps, each before the next;
// every refusal happens before anything is forwarded, and is written by the one
// function writeStripeError:
//
//  1. Authenticate the vault key: "Authorization: Bearer vk_…" or HTTP Basic with
//     the token as the username (the password is ignored). Unknown → 401
//     vault_key_invalid, revoked → 401 vault_key_revoked, expired → 401
//     vault_key_expired, period_start ahead → 403 vault_key_not_yet_valid.
//  2. Read the request exactly as Stripe would, or refuse 400 request_malformed
//     (413 request_too_large over MaxBodyBytes, 1 MiB): only GET, POST and DELETE
//     (another method is an unknown write: 403 operation_not_allowed);
//     no X-HTTP-Method-Override (or X-HTTP-Method, X-Method-Override) and no
//     Upgrade; header names must be tokens without "_" (CGI-style servers read
//     Stripe_Account as Stripe-Account) and values free of control characters;
//     Stripe-Account, Stripe-Context, Stripe-Version, Content-Type and Authorization
//     may not be repeated; the request target must be a path (no absolute URI); a POST or
//     DELETE may carry no query string at all (Stripe merges a query into the
//     parameters; stripe-go puts DELETE parameters into the query, but no DELETE in
//     the catalogue takes any); GET and DELETE carry no body; a GET query is parsed
//     with stripeapi.ParseForm, so a duplicated parameter is refused; Content-Encoding other
//     than identity is refused; a v1 POST with a body must be
//     application/x-www-form-urlencoded (charset utf-8 allowed), a v2 POST
//     application/json. The exact path bytes the client sent are classified and the
//     same bytes are forwarded: stripeapi.Classify refuses every non-canonical path.
//  3. Authorise against the policy: policy.Decide with amount 0 checks the
//     operation, the customer and the Stripe-Account; then every other connected
//     account the request names must be in the policy's stripe_accounts too
//     (touchedAccounts, the one list of where an account can be named: the
//     Stripe-Context header, the id of /v1/accounts/{id}/… — an implied
//     Stripe-Account — and of /v2/core/accounts/{id}/…, any acct_… path segment,
//     and the parameters destination, source, account, on_behalf_of and
//     connected_account, nested or not, in a body or a query: a transfer's
//     destination, a destination charge, an account debit with source=acct_…).
//     Refused with account_not_allowed, in report mode too. Endpoints outside the
//     catalogue: reads are allowed when the policy allows
//     "unknown.read"; writes are always refused (operation_not_allowed), in report
//     mode too.
//  4. Idempotency (see below): the key is read, demanded or derived before any
//     lookup, so a request refused for its key costs Stripe nothing.
//  5. Work out the amount of a money-moving request (see "What is metered"), then
//     ONE Store.Reserve: claim + hold in one write transaction, or replay / 409 in
//     flight / 422 reused / 409 outcome unknown / 402 spend_cap_exceeded / 403 with
//     the policy's reason.
//  6. Forward with httputil.ReverseProxy (Rewrite): the client's Authorization,
//     Stripe-Account, Stripe-Context, Idempotency-Key, Cookie, Forwarded and
//     X-Forwarded-* are removed before keybrake sets the real secret, the validated
//     account headers and the derived upstream Idempotency-Key (X-Idempotency-Key
//     and trailers are dropped). The body already read is forwarded byte for byte
//     with a Content-Length. A recorded POST reaches Stripe at most once per
//     attempt: http.Transport does not resend it after a broken connection (see
//     rewrite). Every upstream request
//     runs under UpstreamTimeout, detached from the caller's connection so that
//     Stripe's answer is recorded even when the caller has gone.
//  7. Settle in ONE Store.Settle from ModifyResponse or ErrorHandler: 2xx commit
//     (against the money object the request created or acted on, from Stripe's
//     answer: see "Money objects"), 4xx release — unless the 4xx body shows a money
//     object the request created anyway (error.payment_intent of a declined
//     creation): then a commit of nothing that keeps the hold as that object's
//     exposure — but: 429 abandons (nothing executed; the answer is passed on and
//     the record is left as it was before this attempt); 409 idempotency_key_in_use
//     means Stripe is executing an earlier attempt under the same upstream key, and
//     a resumed request answered with an idempotency_error means Stripe knows the
//     key from an earlier attempt — either may move the money, so both are outcome
//     unknown and the hold stays. 401 or 403 judge keybrake's own secret (wrong or
//     rolled; a restricted key without the permission, or without access to the
//     connected account), not the request: Stripe executed nothing and saved
//     nothing, so the attempt is abandoned like a 429, but Stripe's body (which
//     may repeat the key) is never passed on: the caller gets 502 api_error
//     upstream_authentication_failed (401) or upstream_permission_denied (403),
//     Stripe-Should-Retry: false, the failure is logged at Error and counted
//     (keybrake_upstream_auth_failures_total), and the cached secret is dropped
//     so that the operator's fix applies at once. A lookup answered 401 or 403 is
//     refused the same way rather than as amount_unknown. 5xx or no answer:
//     outcome unknown, the hold stays — unless the request provably never left:
//     the transport never got a connection (refused, DNS or TLS handshake
//     failure, a timeout while connecting; net/http/httptrace's GotConn fires
//     before the first byte is written), so nothing executed and the attempt is
//     abandoned like a 429; the answer says it is safe to retry (or, for a
//     resumed request, that the first attempt's outcome is still unknown). If
//     Settle itself fails after Stripe answered, the caller still gets Stripe's
//     answer and the failure is logged at Error; the record stays in_progress
//     and becomes unknown at the next start (fail closed). Any other 2xx answer
//     that shows a money object (a read, a cancel, a deletion, an unmetered
//     write) is applied to the key's exposure on it (Store.ObserveObject).
//  8. Respond: Stripe's answer byte for byte plus Keybrake-Remaining-Daily and
//     Keybrake-Remaining-Period (decimal strings in the policy currency; a window
//     without a cap has no header) on every 2xx; Set-Cookie is dropped, and the
//     Idempotency-Key Stripe echoes is replaced by the caller's own key (the derived
//     upstream key never leaves keybrake). One canonical log line per request
//     ("stripe request": key id, operation, amount, currency, decision, reason,
//     idempotency outcome, upstream status, status, duration, and the MCP tool
//     when NewContextWithTool named one), at Error for 5xx,
//     Warn for 4xx; never the token, the secret, the idempotency key or a body.
//     The same place counts the request for the Prometheus metrics (metrics.go).
//
// # What is metered
//
// A request is metered when the catalogue says it can move money (either direction:
// refunds, transfers and payouts count against the caps like charges). The amount:
//
//   - from the request itself when it says it (amount, amount_to_capture,
//     unit_amount × quantity, …);
//   - otherwise by a lookup: keybrake GETs the object at Stripe with the real secret
//     and the same Stripe-Account / Stripe-Context / Stripe-Version, and reads the
//     integer field the catalogue names, "currency", and what a money object has
//     moved so far. Stored prices (stripeapi.Classification.Prices) are looked up the same
//     way. A lookup that fails (a 4xx, field missing or not a non-negative
//     integer, bad currency, a price keybrake cannot bound) refuses the request
//     with 403 amount_unknown; keybrake never guesses. One that Stripe does not
//     answer (no answer, 429, 5xx) refuses it with 502/504 upstream_unavailable
//     (nothing was sent: safe to retry), and one answered 401 or 403 as a
//     refusal of keybrake's secret (step 7). A lookup is also made when only the
//     currency is unknown (a capture or refund with an amount), and for every
//     request that moves money on an existing object.
//   - An amount read from an object (a stored price) is in that object's
//     currency: a request naming another currency is refused with amount_unknown
//     (but a PaymentIntent update that changes only the currency, which re-meters
//     the whole amount in the new one).
//
// # Money objects
//
// Money is metered per money object, not per request (the vault documents the
// store side). Each money-moving request is one of three kinds
// (stripeapi.Classification.Target and Creates):
//
//   - it creates a money object that can move money after it (a PaymentIntent, an
//     uncaptured Charge, a Checkout Session, a pending invoice item), or adds lines
//     to one (invoice items and lines added to an invoice): its amount is held, and
//     on Stripe's answer what the object has not moved yet stays held as the
//     object's exposure, on the windows the request was placed on;
//   - it moves money on an existing object (confirm, capture, paying or finalising
//     an invoice): it holds its amount less the key's exposure on the object, so
//     money counted at creation is not counted again, and money the key moves on
//     an object it did not create is counted in full, each capture of a
//     multicapture by its own amount. A raise (payment_intents.update,
//     increment_authorization, invoiceitems.update: NewTotal) holds the new total
//     less the key's exposure — less the current total at Stripe for an object
//     the key did not create;
//   - neither: its money moves at once (refunds, transfers, payouts, subscriptions,
//     customer balances) and the hold is committed.
//
// On an object, Stripe's answer decides: what it moved since the key last saw it
// (amount_received, amount_captured, amount_paid, a paid Checkout Session's
// amount_total; see moneyKinds) is committed, taken from the exposure first; the
// rest of the hold stays exposure; an answer that shows the object can move no more
// money (cancelled, succeeded, captured, expired, paid, void, deleted) releases it.
// An answer about another object (an invoice line) moves nothing yet; an answer
// keybrake cannot read commits the hold. When the answer shows that more moved than
// was held (the object changed at Stripe between the lookup and the request), the
// excess is committed as a recorded overrun (vault.SettleRequest.AllowOverrun) and
// logged at Warn: the only commit above a hold.
//
// A 4xx is not always "nothing happened": a creation whose error body carries the
// object it created (error.payment_intent of a declined confirm=true) keeps its
// hold as that object's exposure. Every other 2xx answer under the key that shows a
// money object — a read, a cancel, an expiry, a void, a deletion — is applied to the
// key's exposure on it, so exposure is freed by acting on the object through
// keybrake (payment_intents.cancel, checkout.sessions.expire, invoices.void,
// DELETE /v1/invoiceitems/{id}) or by reading it once Stripe shows it settled.
//
// The per-request cap bounds what one money object can move
// (policy.Request.ObjectTotal): a raise's new total, and for a request that moves
// money on an object, everything the key has committed and holds on it.
//
// keybrake meters only what passes through it: subscription renewals, invoices
// Stripe collects by itself, Checkout Sessions and Payment Links paid later move
// money without any request it could see; what cannot be bounded before
// forwarding is refused (amount_unknown, with the reason in the message).
//
// # Idempotency
//
// On a POST that moves money an Idempotency-Key is required (400
// idempotency_key_required) in policy mode "require". In mode "derive" keybrake
// ignores the caller's key and derives one from the operation and the listed
// fields (a missing field is idempotency_key_required naming it in keybrake.field),
// so a caller that mints a fresh UUID per retry still hits the same record. On
// other POSTs the key is honoured when present (a record is kept, no hold); a POST
// without a key that moves no money is forwarded with no store write at all. GET
// and DELETE ignore the header. Keys are accepted bare or as an RFC 8941 string
// ("\"abc\"" is abc), 1–255 printable characters, else 400
// idempotency_key_invalid. The fingerprint is a SHA-256 over the method, the exact
// path, Stripe-Account, Stripe-Context and the canonical parameters.
//
// Reserve outcomes: Claimed forwards with the derived upstream key
// (vault.UpstreamKey). Replay writes the stored answer (status, Content-Type,
// Stripe-Version, body) with a new Request-Id (req_kb_…), Idempotent-Replayed:
// true, Original-Request (Stripe's request id of the answer) and the remaining
// headers. InFlight is 409 idempotency_key_in_use with Stripe-Should-Retry: true
// and Retry-After: 1. Mismatch is 422 idempotency_key_reused. Resume (the outcome
// of an earlier attempt is unknown) forwards again with the SAME upstream key, so
// Stripe deduplicates and the existing hold settles. Stale (an unknown outcome
// older than the vault's retry limit, 23 h: Stripe may have pruned its key) is
// refused with 409 idempotency_error idempotency_key_outcome_unknown and
// Stripe-Should-Retry: false: an operator must resolve the hold after checking
// Stripe (GET /api/v1/holds?state=unknown).
//
// # Errors
//
//	situation                                   status  type                   code
//	no, unknown, revoked, expired vault key     401     invalid_request_error  vault_key_invalid / _revoked / _expired
//	period_start ahead                          403     invalid_request_error  vault_key_not_yet_valid
//	operation/customer/account/currency refused 403     invalid_request_error  operation_not_allowed / customer_… / account_… / currency_…
//	amount cannot be known                      403     invalid_request_error  amount_unknown
//	cap would be exceeded                       402     invalid_request_error  spend_cap_exceeded (+ keybrake.{cap,limit,committed,held,requested,remaining,reset_at})
//	malformed or ambiguous request              400     invalid_request_error  request_malformed
//	body over 1 MiB                             413     invalid_request_error  request_too_large
//	idempotency key missing / invalid           400     idempotency_error      idempotency_key_required / idempotency_key_invalid
//	same key, different request                 422     idempotency_error      idempotency_key_reused
//	same key still in flight                    409     idempotency_error      idempotency_key_in_use (Stripe-Should-Retry: true, Retry-After)
//	same key, outcome unknown for over 23 h     409     idempotency_error      idempotency_key_outcome_unknown
//	Stripe unreachable / timed out              502/504 api_error              upstream_unavailable (Stripe-Should-Retry: true)
//	Stripe refused keybrake's secret (401)      502     api_error              upstream_authentication_failed
//	Stripe refused it the permission (403)      502     api_error              upstream_permission_denied
//	keybrake's own failure (store)              500     api_error              internal_error
//
// Every refusal carries Request-Id: req_kb_…, Content-Type: application/json and
// Stripe-Should-Retry (false unless the table says true). keybrake.reason repeats
// the code and keybrake.request_id the Request-Id.
package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// Defaults of Config.
const (
	DefaultUpstreamTimeout  = 80 * time.Second
	DefaultMaxBodyBytes     = 1 << 20
	DefaultMaxResponseBytes = 16 << 20
	DefaultSecretCacheTTL   = 5 * time.Second
)

// RecommendedLease is the vault.Options.Lease to use with an upstream timeout: a
// claim must outlive the upstream request it covers plus its Settle, or a retry
// could take it over (Resume) while the first attempt is still waiting for Stripe.
// Amount lookups run before the claim and do not count.
func RecommendedLease(upstreamTimeout time.Duration) time.Duration {
	return upstreamTimeout + settleTimeout
}

// Config configures the proxy.
type Config struct {
	// Store is the vault. Required.
	Store *vault.Store
	// Upstream is Stripe's base URL (https://api.stripe.com); never taken from a request.
	Upstream *url.URL
	// UpstreamTimeout bounds one upstream request (default 80s).
	UpstreamTimeout time.Duration
	// Transport overrides the upstream transport (tests); cloned from
	// http.DefaultTransport with explicit timeouts when nil.
	Transport http.RoundTripper
	// Logger receives the canonical line of every request; slog.Default() when nil.
	Logger *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// MaxBodyBytes is the largest request body read (default 1 MiB); larger is 413.
	MaxBodyBytes int64
	// MaxResponseBytes is the largest Stripe answer buffered for replay (default
	// 16 MiB); a larger answer to a recorded request settles as outcome unknown.
	MaxResponseBytes int64
	// SecretCacheTTL is how long an unsealed upstream secret is reused (default
	// 5s); negative disables the cache.
	SecretCacheTTL time.Duration
	// Registerer receives the proxy's Prometheus collectors (see metrics.go); when
	// nil they count but are exposed nowhere.
	Registerer prometheus.Registerer
}

// DefaultConfig returns a Config with every default filled in except Store and
// Upstream (which point at https://api.stripe.com).
func DefaultConfig() Config {
	u, _ := url.Parse("https://api.stripe.com")
	return Config{
		Upstream:         u,
		UpstreamTimeout:  DefaultUpstreamTimeout,
		MaxBodyBytes:     DefaultMaxBodyBytes,
		MaxResponseBytes: DefaultMaxResponseBytes,
		SecretCacheTTL:   DefaultSecretCacheTTL,
	}
}

// Validate reports a Config that cannot work: no store, an upstream that is not
// an absolute http(s) URL without query or fragment, negative limits.
func (c *Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("store is required"))
	}
	if c.Upstream == nil {
		errs = append(errs, errors.New("upstream URL is required"))
	} else if (c.Upstream.Scheme != "http" && c.Upstream.Scheme != "https") || c.Upstream.Host == "" ||
		c.Upstream.RawQuery != "" || c.Upstream.Fragment != "" || c.Upstream.User != nil {
		errs = append(errs, fmt.Errorf("upstream URL %q must be http(s)://host[:port][/path] without query, fragment or user", c.Upstream.Redacted()))
	}
	if c.UpstreamTimeout < 0 || c.MaxBodyBytes < 0 || c.MaxResponseBytes < 0 {
		errs = append(errs, errors.New("timeouts and limits must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("proxy config: %w", err)
	}
	return nil
}

// Proxy serves Stripe's API surface (/v1/*, /v2/*) with metering. It is an
// http.Handler, safe for concurrent use.
type Proxy struct {
	store       *vault.Store
	upstream    *url.URL
	timeout     time.Duration
	maxBody     int64
	maxResponse int64
	log         *slog.Logger
	now         func() time.Time
	rp          *httputil.ReverseProxy
	lookups     *http.Client
	secrets     secretCache
	metrics     *metrics
}

var _ http.Handler = (*Proxy)(nil)

// New builds a Proxy. Zero fields of cfg take the defaults of DefaultConfig.
func New(cfg Config) (*Proxy, error) {
	def := DefaultConfig()
	if cfg.Upstream == nil {
		cfg.Upstream = def.Upstream
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = def.UpstreamTimeout
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = def.MaxBodyBytes
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = def.MaxResponseBytes
	}
	if cfg.SecretCacheTTL == 0 {
		cfg.SecretCacheTTL = def.SecretCacheTTL
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("proxy metrics: %w", err)
	}
	up := *cfg.Upstream
	p := &Proxy{
		store:       cfg.Store,
		upstream:    &up,
		timeout:     cfg.UpstreamTimeout,
		maxBody:     cfg.MaxBodyBytes,
		maxResponse: cfg.MaxResponseBytes,
		log:         cfg.Logger.With(logfield.Component, "proxy"),
		now:         cfg.Now,
		secrets:     secretCache{ttl: cfg.SecretCacheTTL, entries: map[string]cachedSecret{}},
		metrics:     m,
	}
	transport := cfg.Transport
	if transport == nil {
		transport = newTransport(cfg.UpstreamTimeout)
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      &timedTransport{next: transport, kind: upstreamForward, metrics: m},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		BufferPool:     newBufferPool(),
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	p.lookups = &http.Client{
		Transport: &timedTransport{next: transport, kind: upstreamLookup, metrics: m},
		Timeout:   cfg.UpstreamTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return p, nil
}

// ServeHTTP implements http.Handler: the whole pipeline of the package
// documentation for one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := &call{start: p.now(), began: time.Now(), requestID: newRequestID(), method: r.Method,
		tool: ToolFromContext(r.Context())}
	defer p.logCall(c)
	r = r.WithContext(withCall(r.Context(), c)) // amount lookups add their wait to c
	if err := p.prepare(r.Context(), w, r, c); err != nil {
		p.writeRefusal(w, c, err)
		return
	}
	if c.replay != nil {
		p.writeReplay(r.Context(), w, c)
		return
	}
	p.forward(w, r, c)
}

// secretCache keeps unsealed upstream secrets for a short time so that the hot
// path does not unseal on every request; a rotated secret is picked up within ttl.
type secretCache struct {
	ttl     time.Duration
	mu      sync.Mutex
	entries map[string]cachedSecret
}

type cachedSecret struct {
	secret  string
	fetched time.Time
}
