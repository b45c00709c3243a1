package proxy

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// decision is what the proxy did with a request: the canonical log line's
// decision and the outcome label of keybrake_proxy_requests_total. Where a ledger
// event records the same thing, it is the ledger's word (vault.Decision).
type decision string

// Decisions of the canonical log line.
const (
	decisionAllowed     = decision(vault.DecisionAllowed)
	decisionWouldRefuse = decision(vault.DecisionWouldRefuse)
	decisionRefused     = decision(vault.DecisionRefused)
	decisionReplayed    = decision("replayed") // a completed record's answer, written again
	decisionResumed     = decision("resumed")  // an unknown outcome, forwarded again under the same upstream key
)

// idemOutcome is what became of a request's idempotency key: the canonical
// line's idempotency field. It is the outcome of Store.Reserve, or "derived"
// while a derive-mode key has not reached Reserve yet.
type idemOutcome string

// Idempotency outcomes.
const (
	idemDerived  idemOutcome = "derived"
	idemClaimed  idemOutcome = "claimed"   // vault.ReserveClaimed
	idemResume   idemOutcome = "resume"    // vault.ReserveResume
	idemReplay   idemOutcome = "replay"    // vault.ReserveReplay
	idemInFlight idemOutcome = "in_flight" // vault.ReserveInFlight
	idemMismatch idemOutcome = "mismatch"  // vault.ReserveMismatch
	idemStale    idemOutcome = "stale"     // vault.ReserveStale
	idemRefused  idemOutcome = "refused"   // vault.ReserveRefused
)

// call is the state of one request through the pipeline. It travels from
// ServeHTTP to Rewrite, ModifyResponse and ErrorHandler in the request context;
// ReverseProxy runs those in the ServeHTTP goroutine, so no lock is needed.
type call struct {
	start     time.Time // p.now(): the clock the policy and the log line use
	began     time.Time // time.Now(), monotonic: the duration histogram's start
	requestID string
	method    string
	tool      string // the MCP tool that made the request ("" for none)

	// read from the request
	path          string // exact escaped path the client sent
	rawQuery      string // GET only
	body          []byte
	contentType   string
	stripeVersion string
	account       string // validated Stripe-Account
	stripeContext string // validated Stripe-Context
	params        *stripeapi.Params
	cls           stripeapi.Classification

	key    vault.Key
	secret string

	// metering
	metered     bool
	amount      int64 // the hold (minor units)
	currency    string
	objectTotal int64                   // what the money object can move in all (per-request cap)
	exposure    vault.Exposure          // the key's exposure on cls.Target before the request
	looked      *stripeapi.LookupResult // the lookup made before forwarding, if any
	overrun     int64                   // what Stripe reported moved beyond hold + exposure

	// idempotency
	idemKey     string // effective key (caller's or derived); "" when nothing is recorded
	record      bool   // a record is claimed: Settle after forwarding
	upstreamKey string
	idemOutcome idemOutcome
	replay      *vault.IdempotencyRecord
	settled     bool
	// connected is set when the transport got a connection for the forward:
	// from then on bytes of the request may have reached Stripe.
	connected atomic.Bool

	// outcome, for the log line
	decision        decision
	reason          string
	status          int
	upstreamStatus  int
	stripeRequestID string
	err             error

	// upstreamWait is the time spent waiting for Stripe's answers (timedTransport).
	upstreamWait time.Duration
}

type callKey struct{}

func withCall(ctx context.Context, c *call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// prepare runs every step up to the forwarding decision: it returns a refusal, or
// leaves c ready to forward (or with c.replay set).
func (p *Proxy) prepare(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call) error {
	if err := p.authenticate(ctx, r, c); err != nil {
		return err
	}
	if err := p.readRequest(w, r, c); err != nil {
		return err
	}
	if err := p.authorise(c); err != nil {
		return err
	}
	secret, err := p.upstreamSecret(ctx, c.key.Upstream)
	if err != nil {
		return internalError(fmt.Errorf("upstream secret %q: %w", c.key.Upstream, err))
	}
	c.secret = secret
	c.metered = c.cls.MovesMoney
	// The idempotency key is checked before any amount lookup, so that a request
	// refused for its key costs Stripe nothing.
	if err := p.idempotency(r, c); err != nil {
		return err
	}
	if c.metered {
		if err := p.resolveAmount(ctx, c); err != nil {
			return err
		}
	}
	if c.idemKey == "" {
		if c.decision == "" {
			c.decision = decisionAllowed
		}
	} else if err := p.reserve(ctx, c); err != nil {
		return err
	}
	p.recordUnmeteredWouldRefuse(ctx, c)
	return nil
}

// recordUnmeteredWouldRefuse puts a request that moves no money, and that report
// mode lets through although the policy would refuse it, in the key's ledger
// (metered requests get their event from Store.Reserve). Losing this entry moves
// no money, so a store error is logged rather than failing the request.
func (p *Proxy) recordUnmeteredWouldRefuse(ctx context.Context, c *call) {
	if c.metered || c.decision != decisionWouldRefuse {
		return
	}
	err := p.store.RecordEvent(ctx, vault.Event{
		KeyID: c.key.ID, Operation: c.cls.Operation, Decision: vault.DecisionWouldRefuse, Reason: c.reason,
		ObjectID: c.cls.ObjectID, Tool: c.tool,
	})
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelError, "report-mode event not recorded",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.Any(logfield.Error, err))
	}
}

// ---- 1. authentication ----

func (p *Proxy) authenticate(ctx context.Context, r *http.Request, c *call) error {
	token, err := vaultToken(r.Header)
	if err != nil {
		if kind := StripeKeyKind(r.Header); kind != "" {
			p.log.LogAttrs(ctx, slog.LevelWarn, "a Stripe secret key was sent to the proxy instead of a vault key",
				slog.String(logfield.RequestID, c.requestID), slog.String(logfield.StripeKeyKind, kind),
				slog.String(logfield.RemoteAddr, r.RemoteAddr))
		}
		return err
	}
	key, err := p.store.Authenticate(ctx, token)
	switch {
	case errors.Is(err, vault.ErrKeyRevoked):
		return refuse(CodeVaultKeyRevoked, "This vault key has been revoked.")
	case errors.Is(err, vault.ErrKeyInvalid), errors.Is(err, vault.ErrNotFound):
		return refuse(CodeVaultKeyInvalid, "Invalid vault key provided.")
	case err != nil:
		return internalError(fmt.Errorf("authenticate: %w", err))
	}
	c.key = key
	now := p.now()
	if key.StatusAt(now) == vault.KeyExpired {
		return refuse(CodeVaultKeyExpired, "This vault key expired at %s.", key.Policy.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if now.Before(key.Policy.PeriodStart) {
		return refuse(CodeVaultKeyNotYetValid, "This vault key is valid from %s.", key.Policy.PeriodStart.UTC().Format(time.RFC3339))
	}
	return nil
}

// vaultToken reads the vault key as VaultToken does, refusing with
// vault_key_invalid when there is none.
func vaultToken(h http.Header) (string, error) {
	token, err := VaultToken(h)
	switch {
	case errors.Is(err, ErrStripeSecretKey):
		return "", refuse(CodeVaultKeyInvalid, "%s", StripeSecretKeyAdvice)
	case err != nil:
		return "", refuse(CodeVaultKeyInvalid, "Invalid vault key: %s. Use it as the API key of your Stripe client.", err)
	}
	return token, nil
}

// VaultToken reads the vault key from "Authorization: Bearer <token>" or from the
// user name of HTTP Basic (the password is ignored), as Stripe SDKs and curl -u
// send it. The error says what is wrong; it never repeats the header. A Stripe
// secret or restricted key is refused with ErrStripeSecretKey.
func VaultToken(h http.Header) (string, error) {
	token, err := readCredential(h)
	if err != nil {
		return "", err
	}
	if isStripeSecretKey(token) {
		return "", ErrStripeSecretKey
	}
	return token, nil
}

// readCredential reads the bearer token or the Basic user name.
func readCredential(h http.Header) (string, error) {
	vals := h.Values("Authorization")
	switch {
	case len(vals) == 0 || strings.TrimSpace(vals[0]) == "":
		return "", errors.New("missing Authorization header (send the vault key as Authorization: Bearer vk_...)")
	case len(vals) > 1:
		return "", errors.New("more than one Authorization header")
	}
	scheme, cred, _ := strings.Cut(strings.TrimSpace(vals[0]), " ")
	cred = strings.TrimSpace(cred)
	switch strings.ToLower(scheme) {
	case "bearer":
		if cred != "" {
			return cred, nil
		}
	case "basic":
		if raw, err := base64.StdEncoding.DecodeString(cred); err == nil {
			if user, _, _ := strings.Cut(string(raw), ":"); user != "" {
				return user, nil
			}
		}
	}
	return "", errors.New("invalid Authorization header: use Bearer with the vault key, or Basic with the vault key as the user name")
}

// ---- 2. reading the request ----

func (p *Proxy) readRequest(w http.ResponseWriter, r *http.Request, c *call) error {
	switch r.Method {
	case http.MethodGet, http.MethodPost, http.MethodDelete:
	default:
		// Not a Stripe API method: an unknown write, refused whatever the policy says.
		return refuse(CodeOperationNotAllowed, "Method %s is not part of the Stripe API.", stripeapi.Clip(r.Method))
	}
	if err := checkHeaders(r.Header); err != nil {
		return err
	}
	// Method overrides change the method a framework sees; Stripe's own handling
	// of them is unknown, so they are refused.
	for _, h := range [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"} {
		if _, ok := r.Header[h]; ok {
			return malformed(nil, "The %s header is not allowed.", h)
		}
	}
	if _, ok := r.Header["Upgrade"]; ok {
		return malformed(nil, "Protocol upgrades are not allowed.")
	}
	target := r.RequestURI
	if target == "" {
		target = r.URL.RequestURI()
	}
	if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, "#") {
		return malformed(nil, "The request target must be a path.")
	}
	path, query, hasQuery := strings.Cut(target, "?")
	c.path = path
	if hasQuery && r.Method != http.MethodGet {
		if r.Method == http.MethodDelete {
			return malformed(nil, "A DELETE request takes no parameters.")
		}
		return malformed(nil, "A POST request may not carry query parameters: send them in the body.")
	}
	if err := checkContentEncoding(r.Header); err != nil {
		return err
	}
	if v := r.Header.Values(headerStripeVersion); len(v) > 1 {
		return malformed(nil, "More than one Stripe-Version header.")
	} else if len(v) == 1 {
		c.stripeVersion = v[0]
	}
	var err error
	if c.account, err = singleHeader(r.Header, headerStripeAccount); err != nil {
		return err
	}
	if c.stripeContext, err = singleHeader(r.Header, headerStripeContext); err != nil {
		return err
	}

	if r.ContentLength > p.maxBody {
		return refuse(CodeRequestTooLarge, "The request body is larger than %d bytes.", p.maxBody)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return refuse(CodeRequestTooLarge, "The request body is larger than %d bytes.", p.maxBody)
		}
		return malformed(err, "The request body could not be read.")
	}
	c.body = body

	var params *stripeapi.Params
	switch r.Method {
	case http.MethodGet, http.MethodDelete:
		if len(body) > 0 {
			return malformed(nil, "A %s request may not carry a body.", r.Method)
		}
		if hasQuery {
			c.rawQuery = query
			q, err := stripeapi.ParseForm([]byte(query))
			if err != nil {
				return malformed(err, "The query string cannot be read unambiguously: %s.", errText(err))
			}
			c.params = q
		}
	case http.MethodPost:
		ct, err := singleHeader(r.Header, "Content-Type")
		if err != nil {
			return err
		}
		c.contentType = ct
		v2 := strings.HasPrefix(path, "/v2/")
		if len(body) > 0 || ct != "" {
			if err := checkContentType(ct, v2); err != nil {
				return err
			}
		} else if !v2 {
			// An empty POST (curl -X POST) goes on with the form type Stripe expects.
			c.contentType = "application/x-www-form-urlencoded"
		}
		if v2 {
			params, err = stripeapi.ParseJSON(body)
		} else {
			params, err = stripeapi.ParseForm(body)
		}
		if err != nil {
			return malformed(err, "The request body cannot be read unambiguously: %s.", errText(err))
		}
		c.params = params
	}
	cls, err := stripeapi.Classify(r.Method, path, params)
	if err != nil {
		return malformed(err, "The request cannot be read unambiguously: %s.", errText(err))
	}
	c.cls = cls
	return nil
}

// checkHeaders refuses header names that are not HTTP tokens and values with
// control characters. net/http's server already refuses them; this keeps the
// handler safe when it is mounted behind something more lenient, because the
// upstream transport would fail on them only after the hold was placed.
func checkHeaders(h http.Header) error {
	for name, vals := range h {
		if name == "" {
			return malformed(nil, "An empty header name is not allowed.")
		}
		for i := 0; i < len(name); i++ {
			if !isTokenChar(name[i]) {
				return malformed(nil, "Header name %q is not allowed.", stripeapi.Clip(name))
			}
		}
		if strings.IndexByte(name, '_') >= 0 {
			// CGI-style servers (Rack among them) read "Stripe_Account" as
			// Stripe-Account; keybrake checks and replaces only the real spelling.
			return malformed(nil, "Header name %q is not allowed: use '-', not '_'.", stripeapi.Clip(name))
		}
		for _, v := range vals {
			for i := 0; i < len(v); i++ {
				if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
					return malformed(nil, "The value of header %q holds a control character.", stripeapi.Clip(name))
				}
			}
		}
	}
	return nil
}

// isTokenChar reports whether c may appear in an RFC 9110 token.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func checkContentEncoding(h http.Header) error {
	for _, v := range h.Values("Content-Encoding") {
		for part := range strings.SplitSeq(v, ",") {
			if e := strings.TrimSpace(part); e != "" && !strings.EqualFold(e, "identity") {
				return malformed(nil, "Content-Encoding %q is not allowed: send the body uncompressed.", stripeapi.Clip(e))
			}
		}
	}
	return nil
}

func checkContentType(ct string, v2 bool) error {
	want := "application/x-www-form-urlencoded"
	if v2 {
		want = "application/json"
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != want {
		return malformed(err, "Content-Type must be %s.", want)
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return malformed(nil, "Content-Type parameter %q is not allowed.", stripeapi.Clip(k))
		}
	}
	return nil
}

func singleHeader(h http.Header, name string) (string, error) {
	vals := h.Values(name)
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
		return strings.TrimSpace(vals[0]), nil
	default:
		return "", malformed(nil, "More than one %s header.", name)
	}
}

// ---- 3. authorisation ----

// authorise checks the operation, customer and accounts with amount 0; caps are
// checked by Store.Reserve inside its write transaction.
func (p *Proxy) authorise(c *call) error {
	pol := &c.key.Policy
	if !c.cls.Known && c.method != http.MethodGet {
		return reasonRefusal(policy.Decision{Reason: policy.ReasonOperationNotAllowed,
			Message: "This endpoint is not in keybrake's catalogue: only reads of unknown endpoints can pass."}, "")
	}
	if c.cls.MovesMoney && c.method != http.MethodPost {
		return malformed(nil, "A %s request that moves money cannot be metered.", c.method)
	}
	d := policy.Decide(pol, nil, c.policyRequest(0, ""), p.now())
	if !d.Allowed {
		return reasonRefusal(d, "")
	}
	if d.WouldRefuse {
		c.decision, c.reason = decisionWouldRefuse, string(d.Reason)
	}
	return checkAccounts(pol, stripeapi.Accounts(c.account, c.stripeContext, c.path, c.cls.Operation, c.params))
}

// checkAccounts refuses the first touched account the policy does not allow.
// The refusal is never relaxed, not even in report mode.
func checkAccounts(pol *policy.Policy, accounts []stripeapi.AccountRef) error {
	for _, a := range accounts {
		if a.ID != "" && pol.AllowsAccount(a.ID) {
			continue
		}
		msg := fmt.Sprintf("The connected account %s named by %s is not allowed for this vault key.", stripeapi.Clip(a.ID), a.Where)
		if a.ID == "" {
			msg = fmt.Sprintf("The %s must name one connected account, as a plain value.", a.Where)
		}
		return reasonRefusal(policy.Decision{Reason: policy.ReasonAccountNotAllowed, Message: msg}, "")
	}
	return nil
}

// policyRequest is the policy.Request of this call for amount in currency.
func (c *call) policyRequest(amount int64, currency string) policy.Request {
	customer := c.cls.Customer
	if customer == "" && c.method == http.MethodGet && c.params != nil {
		// A list filtered by customer (GET /v1/charges?customer=cus_…) touches it.
		customer, _ = c.params.Get("customer")
	}
	return policy.Request{
		Operation: c.cls.Operation,
		Amount:    amount,
		Currency:  currency,
		Customer:  customer,
		Account:   c.account,
	}
}

// ---- 4. amounts ----

// resolveAmount works out the hold of a money-moving request (see "What is
// metered"): the amount it can move, less what the key already counts as the
// exposure of the money object it acts on, and the object's total for the
// per-request cap.
func (p *Proxy) resolveAmount(ctx context.Context, c *call) error {
	cls := c.cls
	amount, currency := cls.Amount, cls.Currency
	lookup := func() error {
		if c.looked != nil {
			return nil
		}
		if cls.Lookup == nil {
			if cls.Unknown != "" {
				return refuse(CodeAmountUnknown, "The amount of this %s request cannot be known before it reaches Stripe: %s.", cls.Operation, cls.Unknown)
			}
			return refuse(CodeAmountUnknown, "The amount of this %s request cannot be known before it reaches Stripe.", cls.Operation)
		}
		res, err := p.lookup(ctx, c, *cls.Lookup)
		var rf *refusal
		if errors.As(err, &rf) {
			return rf // Stripe refused keybrake's secret or gave no answer: not the amount's fault
		}
		if err != nil {
			rf = refuse(CodeAmountUnknown, "The amount of this %s request could not be read from Stripe.", cls.Operation)
			rf.cause = err
			return rf
		}
		c.looked = &res
		return nil
	}
	if cls.Target != "" {
		exp, _, err := p.store.ObjectExposure(ctx, c.key.ID, cls.Target)
		if err != nil {
			return internalError(fmt.Errorf("object exposure %s: %w", cls.Target, err))
		}
		c.exposure = exp
	}
	prices, pricesCurrency, err := p.priceTotal(ctx, c)
	if err != nil {
		return err
	}
	if amount, err = stripeapi.AddMinor(amount, prices); err != nil {
		return malformed(err, "The request's amount is too large.")
	}
	switch {
	case cls.AmountKnown && cls.NewTotal:
		// Always looked up: the object's currency decides whether its current
		// total counts at all.
		if err := lookup(); err != nil {
			return err
		}
		if len(cls.Lookup.Factors) > 0 {
			// The update changes one factor; the object keeps the other.
			n, err := stripeapi.MulMinor(cls.Amount, c.looked.Factor)
			if err == nil {
				amount, err = stripeapi.AddMinor(n, prices)
			}
			if err != nil {
				return malformed(err, "The request's new total is too large.")
			}
		}
		// The current total is not this key's to count, unless the key created
		// the object: then its exposure already counts it.
		base := c.looked.Amount
		if c.exposure.Own {
			base = c.exposure.Held
		}
		if currency != "" && c.looked.Currency != "" && c.looked.Currency != currency {
			// A new currency: the current total is in another currency's minor
			// units, and the whole new total is new money.
			base = 0
		}
		c.objectTotal = amount
		amount = max(0, amount-base)
	case cls.AmountKnown:
		// An object the money is counted on is read too: what it has moved so far
		// tells what this request moves, and its currency is the request's.
		if (currency == "" && (cls.Lookup != nil || pricesCurrency == "")) || (cls.Target != "" && cls.Lookup != nil) {
			if err := lookup(); err != nil {
				return err
			}
			if currency != "" && c.looked.Currency != "" && c.looked.Currency != currency {
				return refuse(CodeAmountUnknown, "The %s request names currency %s but acts on an object in %s.",
					cls.Operation, currency, stripeapi.Clip(c.looked.Currency))
			}
		}
	default:
		if err := lookup(); err != nil {
			return err
		}
		amount = c.looked.Amount
		if currency != "" && c.looked.Currency != "" && c.looked.Currency != currency &&
			cls.Operation != "payment_intents.update" {
			// The amount is the object's, so it is in the object's currency (a
			// stored price); only a PaymentIntent update changes the currency of
			// the amount it keeps. Keybrake does not guess which one Stripe uses.
			return refuse(CodeAmountUnknown, "The %s request names currency %s but its amount comes from an object in %s.",
				cls.Operation, currency, stripeapi.Clip(c.looked.Currency))
		}
	}
	if currency == "" && c.looked != nil {
		currency = c.looked.Currency
	}
	if currency == "" {
		currency = pricesCurrency
	}
	if currency == "" {
		return refuse(CodeAmountUnknown, "The currency of this %s request cannot be known.", cls.Operation)
	}
	if pricesCurrency != "" && pricesCurrency != currency {
		return refuse(CodeAmountUnknown, "The %s request uses a stored price in %s, not in %s.", cls.Operation, pricesCurrency, currency)
	}
	switch {
	case cls.Target != "" && cls.Creates:
		// Lines added to an object: new money on top of what it counts.
		c.objectTotal = c.exposure.Committed + c.exposure.Held + amount
	case cls.Target != "" && !cls.NewTotal:
		// Money moved on an object: what its exposure already counts (its
		// creation, a raise) is not counted again; anything beyond is, in full.
		c.objectTotal = c.exposure.Committed + max(c.exposure.Held, amount)
		amount = max(0, amount-c.exposure.Held)
	}
	c.amount, c.currency = amount, currency
	return nil
}

// ---- 5. idempotency and reserve ----

func (p *Proxy) idempotency(r *http.Request, c *call) error {
	if c.method != http.MethodPost {
		return nil
	}
	callerKey, present, perr := ParseIdempotencyKey(r.Header)
	pol := &c.key.Policy
	if c.metered && pol.Idempotency.Mode == policy.IdempotencyDerive {
		k, err := DeriveIdempotencyKey(c.cls.Operation, pol.Idempotency.Fields, c.params.Get)
		if err != nil {
			var missing *MissingFieldError
			if !errors.As(err, &missing) {
				return internalError(fmt.Errorf("derive idempotency key: %w", err))
			}
			rf := refuse(CodeIdemKeyRequired, "This vault key derives idempotency keys from the request: the parameter %q is required.", missing.Field)
			rf.Param, rf.Detail.Field = missing.Field, missing.Field
			return rf
		}
		c.idemKey, c.idemOutcome = k, idemDerived
	} else if present || c.metered {
		if perr != nil {
			rf := refuse(CodeIdemKeyInvalid, "The Idempotency-Key must be 1 to %d printable characters, bare or as a quoted string.", MaxIdempotencyKeyLen)
			rf.cause = perr
			return rf
		}
		if !present {
			return refuse(CodeIdemKeyRequired, "An Idempotency-Key header is required on requests that move money.")
		}
		c.idemKey = callerKey
	}
	return nil
}

func (p *Proxy) reserve(ctx context.Context, c *call) error {
	fp := Fingerprint(c.method, c.path, c.account, c.stripeContext, c.params.Canonical())
	req := vault.ReserveRequest{
		KeyID:          c.key.ID,
		IdempotencyKey: c.idemKey,
		Fingerprint:    fp,
		Request:        c.policyRequest(c.amount, c.currency),
		Metered:        c.metered,
		Tool:           c.tool,
	}
	req.Request.ObjectTotal = c.objectTotal
	if !c.metered {
		req.Request.Amount, req.Request.Currency, req.Request.ObjectTotal = 0, "", 0
	}
	res, err := p.store.Reserve(ctx, req)
	switch {
	case errors.Is(err, vault.ErrKeyRevoked):
		return refuse(CodeVaultKeyRevoked, "This vault key has been revoked.")
	case err != nil:
		return internalError(fmt.Errorf("reserve: %w", err))
	}
	switch res.Outcome {
	case vault.ReserveClaimed:
		c.idemOutcome = idemClaimed
		c.record, c.upstreamKey = true, res.Record.UpstreamKey
		c.decision = decisionAllowed
		if res.Decision.WouldRefuse {
			c.decision, c.reason = decisionWouldRefuse, string(res.Decision.Reason)
		}
		if res.Hold != nil {
			c.amount = res.Hold.Amount
		}
		return nil
	case vault.ReserveResume:
		c.idemOutcome = idemResume
		c.record, c.upstreamKey = true, res.Record.UpstreamKey
		c.decision = decisionResumed
		if res.Hold != nil {
			c.amount = res.Hold.Amount
		}
		return nil
	case vault.ReserveReplay:
		c.idemOutcome = idemReplay
		rec := res.Record
		if rec.Response == nil && rec.Resolved && res.Hold != nil {
			rec.Response = resolvedAnswer(res.Hold.ID, res.Hold.State)
		}
		if rec.Response == nil {
			return internalError(fmt.Errorf("replay of %s: no stored response", rec.IdempotencyKey))
		}
		c.replay = &rec
		c.decision = decisionReplayed
		return nil
	case vault.ReserveInFlight:
		c.idemOutcome = idemInFlight
		rf := refuse(CodeIdemKeyInUse, "There is currently another in-progress request using this idempotency key. Retry later.")
		rf.RetryAfter = 1
		return rf
	case vault.ReserveMismatch:
		c.idemOutcome = idemMismatch
		return refuse(CodeIdemKeyReused, "This idempotency key was already used with a different request.")
	case vault.ReserveStale:
		c.idemOutcome = idemStale
		return refuse(CodeIdemOutcomeUnknown,
			"The outcome of the first request with this idempotency key is unknown and too old to retry safely; an operator must resolve it.")
	case vault.ReserveRefused:
		c.idemOutcome = idemRefused
		cur := c.currency
		if cur == "" {
			cur = c.key.Policy.Currency
		}
		return reasonRefusal(res.Decision, cur)
	default:
		return internalError(fmt.Errorf("reserve: unexpected outcome %d", res.Outcome))
	}
}

// ---- answers written by keybrake ----

func (p *Proxy) writeRefusal(w http.ResponseWriter, c *call, err error) {
	rf := writeStripeError(w, c.requestID, err)
	c.status, c.reason = rf.Status, rf.Code
	if c.decision != decisionReplayed {
		c.decision = decisionRefused
	}
	if rf.Status >= 500 {
		c.err = err
	} else if rf.cause != nil {
		c.err = rf.cause
	}
}

// writeReplay answers with the stored response of a completed record.
func (p *Proxy) writeReplay(ctx context.Context, w http.ResponseWriter, c *call) {
	resp := c.replay.Response
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = append([]string(nil), vs...)
	}
	h.Set(headerRequestID, c.requestID)
	h.Set(headerIdempotentReplayed, "true")
	if c.replay.RequestID != "" {
		h.Set(headerOriginalRequest, c.replay.RequestID)
	}
	if c.idemKey != "" {
		h.Set(headerIdempotencyKey, c.idemKey)
	}
	if resp.Status >= 200 && resp.Status < 300 {
		p.setRemaining(ctx, h, c)
	}
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	c.status, c.stripeRequestID = resp.Status, c.replay.RequestID
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// setRemaining sets Keybrake-Remaining-Daily / -Period from the key's current
// usage: what is left of each capped window after every commit and hold.
func (p *Proxy) setRemaining(ctx context.Context, h http.Header, c *call) {
	key, windows, usage, err := p.store.KeyUsage(ctx, c.key.ID)
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelWarn, "remaining budget unavailable",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.Any(logfield.Error, err))
		return
	}
	for _, win := range windows {
		if !win.HasCap {
			continue
		}
		cnt := usage[win.ID]
		rem := max(0, win.Cap-cnt.Committed-cnt.Held)
		v := policy.FormatMinor(key.Policy.Currency, rem)
		switch win.Kind {
		case policy.WindowDaily:
			h.Set(headerRemainingDaily, v)
		case policy.WindowPeriod:
			h.Set(headerRemainingPeriod, v)
		}
	}
}

// logCall writes the canonical line: 5xx at Error, 4xx at Warn, else Info. It
// never logs the token, the secret, the idempotency key or a body. It also counts
// the request for /metrics, so every request is counted exactly once.
func (p *Proxy) logCall(c *call) {
	p.metrics.observeRequest(c, time.Since(c.began))
	level := slog.LevelInfo
	switch {
	case c.status >= 500 || c.status == 0:
		level = slog.LevelError
	case c.status >= 400:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String(logfield.RequestID, c.requestID),
		slog.String(logfield.Method, c.method),
		slog.String(logfield.Path, stripeapi.Clip(c.path)),
		slog.String(logfield.KeyID, c.key.ID),
		slog.String(logfield.Operation, c.cls.Operation),
		slog.Int64(logfield.Amount, c.amount),
		slog.String(logfield.Currency, c.currency),
		slog.String(logfield.Decision, string(c.decision)),
		slog.String(logfield.Reason, c.reason),
		slog.String(logfield.Idempotency, string(c.idemOutcome)),
		slog.Int(logfield.UpstreamStatus, c.upstreamStatus),
		slog.Int(logfield.Status, c.status),
		logfield.Duration(p.now().Sub(c.start)),
	}
	if c.stripeRequestID != "" {
		attrs = append(attrs, slog.String(logfield.StripeRequestID, c.stripeRequestID))
	}
	if c.tool != "" {
		attrs = append(attrs, slog.String(logfield.Tool, c.tool))
	}
	if c.err != nil {
		attrs = append(attrs, slog.String(logfield.Error, c.err.Error()))
	}
	p.log.LogAttrs(context.Background(), level, "stripe request", attrs...)
}

// errText is the text of a parse error without the stripeapi.ErrMalformed suffix.
func errText(err error) string {
	return strings.TrimSuffix(err.Error(), ": "+stripeapi.ErrMalformed.Error())
}
