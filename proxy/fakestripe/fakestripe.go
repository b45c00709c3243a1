// Package fakestripe is an in-process fake of the Stripe API (FakeStripe): it
// keeps objects, honours idempotency keys as Stripe does, counts what reached
// it and injects failures. The tests use it (through proxytest.NewFakeStripe)
// as the upstream keybrake meters against, and `keybrake serve --demo` uses it
// so that keybrake can be tried without a Stripe account. It is not Stripe: it
// keeps its objects in memory only and knows a part of Stripe's API.
package fakestripe

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FailMode is a way the fake Stripe misbehaves for a request that it executes.
type FailMode int

// Failure modes. The "AfterCreate" modes run the request first — the object
// exists and the result is saved under the request's idempotency key, as Stripe
// does — and only then misbehave.
const (
	// FailAfterCreate500 answers 500 api_error instead of the result; like Stripe, it
	// saves that 500 under the idempotency key and replays it.
	FailAfterCreate500 FailMode = iota + 1
	// FailAfterCreateReset closes the connection (TCP reset) without any answer. The
	// real result is saved under the idempotency key.
	FailAfterCreateReset
	// FailAfterCreateDelay holds the answer for the fail delay (SetFailDelay, default
	// 30 s) or until the client goes away. The idempotency key stays in flight (409)
	// until then; afterwards the saved result replays.
	FailAfterCreateDelay
	// FailBefore429 answers 429 rate_limit without executing; nothing is saved.
	FailBefore429
	// FailBefore500 answers 500 without executing anything (no object is created);
	// nothing is saved under the idempotency key.
	FailBefore500
	// FailAfterCreateResetInFlight runs the request and closes the connection (TCP
	// reset) at once, while the idempotency key is still in flight (409) for the
	// fail delay; afterwards the saved result replays. It is what a connection that
	// breaks while Stripe is still executing looks like to a client that resends.
	FailAfterCreateResetInFlight
	// FailIdempotencyMismatch answers 400 idempotency_error without executing, as
	// Stripe does when a key comes back with parameters it judges different (for
	// instance under another Stripe-Version). It applies even when the key has a
	// saved result.
	FailIdempotencyMismatch
)

// String names the mode.
func (m FailMode) String() string {
	switch m {
	case FailAfterCreate500:
		return "after_create_500"
	case FailAfterCreateReset:
		return "after_create_reset"
	case FailAfterCreateDelay:
		return "after_create_delay"
	case FailBefore429:
		return "before_429"
	case FailBefore500:
		return "before_500"
	case FailAfterCreateResetInFlight:
		return "after_create_reset_in_flight"
	case FailIdempotencyMismatch:
		return "idempotency_mismatch"
	default:
		return "fail_" + strconv.Itoa(int(m))
	}
}

// Request is what the fake Stripe saw of one request.
type Request struct {
	Method         string
	Path           string // the escaped path exactly as received
	RawQuery       string
	Header         http.Header
	Body           []byte
	Params         url.Values // form body (POST) or query (GET/DELETE)
	IdempotencyKey string
	Authorized     bool
	Replayed       bool   // answered from the idempotency store
	Failure        string // the failure injected, if any
}

// Charge is a charge the fake created.
type Charge struct {
	ID             string
	Amount         int64
	AmountCaptured int64
	AmountRefunded int64
	Currency       string
	Customer       string
	Captured       bool
	PaymentIntent  string
	IdempotencyKey string
	// Foreign is set for a charge made outside the API (AddCharge, AddAuthorization).
	Foreign bool
	// Source is the connected account an account debit (source=acct_…) took the
	// money from; "" for a charge of a card or token.
	Source string
	// Destination is the connected account a destination charge transfers to
	// (transfer_data[destination]) when it is captured.
	Destination string
}

// Transfer is a transfer to a connected account (AddTransfer).
type Transfer struct {
	ID          string
	Amount      int64
	Reversed    int64 // taken back from the account by reversals
	Currency    string
	Destination string
}

// Account is a connected account of the fake's platform (AddConnectedAccount).
type Account struct {
	ID       string
	Currency string // default currency: an account debit must use it
	Balance  int64  // available balance, minor units of Currency
}

// PaymentIntent is a PaymentIntent the fake created.
type PaymentIntent struct {
	ID               string
	Amount           int64
	AmountCapturable int64
	AmountReceived   int64
	Currency         string
	Customer         string
	Status           string
	CaptureMethod    string
	LatestCharge     string
	IdempotencyKey   string
	// Foreign is set for a PaymentIntent made outside keybrake (AddPaymentIntent,
	// AddAuthorization): only the money it really moves counts in TotalMoved.
	Foreign bool
}

// PaymentLink is a payment link the fake created.
type PaymentLink struct {
	ID       string
	Price    string
	Quantity int64
	URL      string
	Currency string
	Limit    int64 // restrictions[completed_sessions][limit]; at least 1
	Pinned   bool  // created with a currency: never charged in another one
}

// Refund is a refund the fake created.
type Refund struct {
	ID       string
	Amount   int64
	Currency string
	Charge   string
}

type failRule struct {
	mode  FailMode
	left  int // < 0: unlimited
	match func(Request) bool
}

type idemEntry struct {
	fingerprint string
	done        bool
	status      int
	body        []byte
	requestID   string
}

// FakeStripe is a stateful fake of the Stripe API on an httptest.Server bound to
// 127.0.0.1. It keeps charges (account debits of connected accounts among them),
// PaymentIntents, refunds, customers, products, prices, payment links and
// connected accounts; checks the Bearer (or Basic) secret; honours
// Idempotency-Key like Stripe (same key and parameters: replay of the first
// answer, 500s included, with Idempotent-Replayed and Original-Request; different
// parameters: 400 idempotency_error; while the first is executing: 409
// idempotency_key_in_use); counts every request; and injects failures (FailNext,
// FailWhen). It is safe for concurrent use.
type FakeStripe struct {
	// URL is the base URL ("http://127.0.0.1:port").
	URL string
	// Secret is the API key it accepts at start; SetSecret replaces it.
	Secret string

	srv *httptest.Server

	mu         sync.Mutex
	secret     string                        // the secret key accepted now
	restricted map[string]func(Request) bool // restricted keys: what each may do
	idle       *sync.Cond
	executing  int
	seq        int
	requests   []Request
	rules      []*failRule
	hook       func(Request)
	failDelay  time.Duration
	held       chan struct{} // closed by HoldDelayed's release; nil: the delay alone
	idem       map[string]*idemEntry
	charges    []*Charge
	pis        []*PaymentIntent
	refunds    []*Refund
	customers  map[string]map[string]any
	prices     map[string]map[string]any
	products   map[string]map[string]any
	links      []*PaymentLink
	accounts   map[string]*Account
	piByID     map[string]*PaymentIntent
	invoices   []*Invoice
	items      []*InvoiceItem
	subs       map[string]*Subscription
	cards      map[string]bool // Issuing cards (virtual)
	transfers  []*Transfer
	sessions   []*CheckoutSession
	moved      map[string]int64
	version    string // the Stripe-Version of the request being executed
}

// Start starts a fake Stripe on 127.0.0.1 that accepts secret; Close stops it.
func Start(secret string) (*FakeStripe, error) {
	f := &FakeStripe{
		Secret:    secret,
		secret:    secret,
		failDelay: 30 * time.Second,
		idem:      map[string]*idemEntry{},
		customers: map[string]map[string]any{},
		prices:    map[string]map[string]any{},
		products:  map[string]map[string]any{},
		accounts:  map[string]*Account{},
		piByID:    map[string]*PaymentIntent{},
		subs:      map[string]*Subscription{},
		cards:     map[string]bool{},
		moved:     map[string]int64{},
	}
	f.idle = sync.NewCond(&f.mu)
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fake stripe: listen: %w", err)
	}
	f.srv.Listener = ln
	f.srv.Start()
	f.URL = f.srv.URL
	return f, nil
}

// Fataler is what WaitIdle needs of a test: a *testing.T or *testing.B.
type Fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Close stops the server (idempotent).
func (f *FakeStripe) Close() {
	f.srv.CloseClientConnections()
	f.srv.Close()
}

// SetSecret makes the fake accept secret instead of the secret it accepted so
// far, as when the key is rolled at Stripe: the old one is answered 401 from now
// on.
func (f *FakeStripe) SetSecret(secret string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secret = secret
}

// AddRestrictedKey makes the fake accept key as a restricted key (rk_…) that may
// make the requests allowed returns true for; any other request is answered 403
// with Stripe's permission error, before anything executes.
func (f *FakeStripe) AddRestrictedKey(key string, allowed func(Request) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.restricted == nil {
		f.restricted = map[string]func(Request) bool{}
	}
	f.restricted[key] = allowed
}

// FailNext makes the next n executed requests (POSTs that run, not replays) fail
// with mode.
func (f *FakeStripe) FailNext(mode FailMode, n int) {
	f.FailWhen(mode, n, nil)
}

// FailWhen makes the next n executed requests for which match returns true fail
// with mode (n < 0: every one). A nil match matches every POST.
func (f *FakeStripe) FailWhen(mode FailMode, n int, match func(Request) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, &failRule{mode: mode, left: n, match: match})
}

// SetHook makes the fake call fn with every request it receives, before it
// answers, outside its lock (nil removes the hook). Tests use it to act at a
// precise point, e.g. while keybrake waits for the answer.
func (f *FakeStripe) SetHook(fn func(Request)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hook = fn
}

// SetFailDelay sets how long FailAfterCreateDelay holds its answer.
func (f *FakeStripe) SetFailDelay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failDelay = d
}

// HoldDelayed makes the answers that FailAfterCreateDelay and
// FailAfterCreateResetInFlight hold wait until release is called, or the fail
// delay passes (then a guard against a test that forgets to release), so
// that a test decides when Stripe answers instead of hoping its next request
// lands within a delay. release may be called more than once.
func (f *FakeStripe) HoldDelayed() (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	held := make(chan struct{})
	f.held = held
	var once sync.Once
	return func() { once.Do(func() { close(held) }) }
}

// WaitIdle blocks until no request is executing at the fake (e.g. a delayed answer
// whose client went away has finished and saved its result). It fails tb after a
// generous guard of 30 s so a bug cannot hang the test run.
func (f *FakeStripe) WaitIdle(tb Fataler) {
	tb.Helper()
	done := make(chan struct{})
	go func() {
		f.mu.Lock()
		for f.executing > 0 {
			f.idle.Wait()
		}
		f.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		tb.Fatalf("fake stripe: requests still executing after 30s")
	}
}

// Count returns how many requests reached the fake (authorised or not, replays included).
func (f *FakeStripe) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

// CountWhere returns how many requests that reached the fake match.
func (f *FakeStripe) CountWhere(match func(Request) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.requests {
		if match(r) {
			n++
		}
	}
	return n
}

// Requests returns a copy of every request that reached the fake, in arrival order.
func (f *FakeStripe) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

// RequestsFrom returns a copy of the requests from index i on (Requests()[i:]),
// so a long-running caller can read only what is new.
func (f *FakeStripe) RequestsFrom(i int) []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.requests) {
		return nil
	}
	return slices.Clone(f.requests[max(0, i):])
}

// Charges returns copies of the charges created, in creation order.
func (f *FakeStripe) Charges() []Charge {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyAll(f.charges)
}

// Refunds returns copies of the refunds created, in creation order.
func (f *FakeStripe) Refunds() []Refund {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyAll(f.refunds)
}

// PaymentLinks returns copies of the payment links created, in creation order.
func (f *FakeStripe) PaymentLinks() []PaymentLink {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyAll(f.links)
}

// copyAll copies the objects of list; the caller holds f.mu.
func copyAll[T any](list []*T) []T {
	out := make([]T, len(list))
	for i, o := range list {
		out[i] = *o
	}
	return out
}

// TotalCharged returns the sum of the amounts of every charge created through the
// API in currency (directly or by confirming a PaymentIntent), captured or not;
// charges made outside it (AddCharge, AddAuthorization) are left out.
func (f *FakeStripe) TotalCharged(currency string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var t int64
	for _, c := range f.charges {
		if c.Currency == currency && !c.Foreign {
			t += c.Amount
		}
	}
	return t
}

// TotalMoved returns, in currency, what keybrake must have counted for the objects
// the fake created: charges created directly, PaymentIntents created through the
// API at creation (plus every raise of their amount, whether or not their
// confirmation was declined: they stay confirmable), every capture or payment of a
// PaymentIntent or charge made outside the API (AddPaymentIntent, AddAuthorization,
// AddCharge), and refunds. Confirming or capturing a PaymentIntent created through the API adds
// nothing, and what it will never move (cancelled, or finally captured for less)
// is taken out again. A cap invariant check compares this with the cap.
func (f *FakeStripe) TotalMoved(currency string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.moved[currency]
}

// AddPaymentIntent creates a PaymentIntent directly (as if made with the real key
// outside keybrake) and returns its id.
func (f *FakeStripe) AddPaymentIntent(amount int64, currency, customer string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	pi := &PaymentIntent{ID: fmt.Sprintf("pi_fake%06d", f.seq), Amount: amount, Currency: currency,
		Customer: customer, Status: "requires_confirmation", CaptureMethod: "automatic", Foreign: true}
	f.addPILocked(pi)
	return pi.ID
}

// AddAuthorization creates, as if outside keybrake (by the merchant, or through
// Checkout), a PaymentIntent with capture_method=manual that is authorised for
// amount and awaits capture (status requires_capture), with multicapture
// available: a capture with final_capture=false keeps the rest capturable.
func (f *FakeStripe) AddAuthorization(amount int64, currency, customer string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	pi := &PaymentIntent{ID: fmt.Sprintf("pi_fake%06d", f.seq), Amount: amount, Currency: currency,
		Customer: customer, Status: "requires_capture", CaptureMethod: "manual", AmountCapturable: amount, Foreign: true}
	c := f.newChargeLocked(amount, currency, customer, false, pi.ID, "")
	c.Foreign = true
	pi.LatestCharge = c.ID
	f.addPILocked(pi)
	return pi.ID
}

// PaymentIntents returns copies of the PaymentIntents, in creation order.
func (f *FakeStripe) PaymentIntents() []PaymentIntent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyAll(f.pis)
}

// AddPrice creates a one-time price of unitAmount in currency (GET /v1/prices/{id}
// answers it) and returns its id.
func (f *FakeStripe) AddPrice(unitAmount int64, currency string) string {
	return f.addPrice(unitAmount, currency, nil)
}

// addPrice creates a per-unit price, recurring when recurring is not nil.
func (f *FakeStripe) addPrice(unitAmount int64, currency string, recurring map[string]any) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.newPriceLocked(unitAmount, currency, "", recurring)
}

// newPriceLocked stores a per-unit price (recurring when recurring is not nil)
// and returns its id. f.mu is held.
func (f *FakeStripe) newPriceLocked(unitAmount int64, currency, product string, recurring map[string]any) string {
	f.seq++
	id := fmt.Sprintf("price_fake%06d", f.seq)
	pr := map[string]any{"id": id, "object": "price", "unit_amount": unitAmount, "currency": currency,
		"type": "one_time", "billing_scheme": "per_unit", "product": nullable(product)}
	if recurring != nil {
		pr["type"], pr["recurring"] = "recurring", recurring
	}
	f.prices[id] = pr
	return id
}

// AddConnectedAccount creates a connected account (Express or Custom, so the
// platform may debit it) with the given default currency and available balance,
// and returns its id. GET /v1/accounts/{id} and /v2/core/accounts/{id} answer it.
func (f *FakeStripe) AddConnectedAccount(currency string, balance int64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	a := &Account{ID: fmt.Sprintf("acct_fake%06d", f.seq), Currency: currency, Balance: balance}
	f.accounts[a.ID] = a
	return a.ID
}

// ConnectedAccount returns a copy of the connected account id and whether it exists.
func (f *FakeStripe) ConnectedAccount(id string) (Account, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if a, ok := f.accounts[id]; ok {
		return *a, true
	}
	return Account{}, false
}

// AddCharge creates a captured charge directly (outside keybrake) and returns its id.
func (f *FakeStripe) AddCharge(amount int64, currency, customer string, captured bool) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.newChargeLocked(amount, currency, customer, captured, "", "")
	c.Foreign = true
	return c.ID
}

// ---- server ----

type answer struct {
	status int
	body   []byte
}

func (f *FakeStripe) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	path := r.URL.EscapedPath()
	if i := strings.IndexByte(r.RequestURI, '?'); i >= 0 {
		path = r.RequestURI[:i]
	} else if strings.HasPrefix(r.RequestURI, "/") {
		path = r.RequestURI
	}
	req := Request{
		Method:         r.Method,
		Path:           path,
		RawQuery:       r.URL.RawQuery,
		Header:         r.Header.Clone(),
		Body:           body,
		IdempotencyKey: r.Header.Get("Idempotency-Key"),
	}
	if r.Method == http.MethodPost {
		req.Params, _ = url.ParseQuery(string(body))
	} else {
		req.Params, _ = url.ParseQuery(r.URL.RawQuery)
	}
	apiKey := requestKey(r)

	f.mu.Lock()
	permitted, restricted := f.restricted[apiKey]
	req.Authorized = restricted || (apiKey != "" && apiKey == f.secret)
	f.seq++
	reqID := fmt.Sprintf("req_fake%08d", f.seq)
	idx := len(f.requests)
	f.requests = append(f.requests, req)
	hook := f.hook
	f.mu.Unlock()
	if hook != nil {
		hook(req)
	}

	w.Header().Set("Request-Id", reqID)
	w.Header().Set("Stripe-Version", stripeVersion(r))
	if req.IdempotencyKey != "" {
		w.Header().Set("Idempotency-Key", req.IdempotencyKey)
	}
	if !req.Authorized {
		// stripe-mock echoes the rejected key in full (Stripe masks all but its
		// last characters): a proxy must never pass this body on.
		writeAnswer(w, answer{http.StatusUnauthorized, errJSON("invalid_request_error", "", "Invalid API Key provided: "+apiKey)})
		return
	}
	if restricted && !permitted(req) {
		// Stripe checks a restricted key's permissions before it executes anything
		// and saves nothing under the idempotency key.
		writeAnswer(w, answer{http.StatusForbidden, errJSON("invalid_request_error", "",
			"The provided key '"+maskKey(apiKey)+"' does not have the required permissions for this endpoint.")})
		return
	}
	if r.Method != http.MethodPost {
		f.mu.Lock()
		f.version = stripeVersion(r)
		a := f.route(r.Method, path, req.Params, "")
		f.mu.Unlock()
		writeAnswer(w, a)
		return
	}

	fp := fingerprint(r.Method, path, r.Header.Get("Stripe-Account"), req.Params)
	idemKey := req.IdempotencyKey
	f.mu.Lock()
	if idemKey != "" && f.takeRuleLocked(req, func(m FailMode) bool { return m == FailIdempotencyMismatch }) != 0 {
		f.requests[idx].Failure = FailIdempotencyMismatch.String()
		f.mu.Unlock()
		writeAnswer(w, answer{http.StatusBadRequest, errJSON("idempotency_error", "",
			"Keys for idempotent requests can only be used with the same parameters they were first used with.")})
		return
	}
	if idemKey != "" {
		if e, ok := f.idem[idemKey]; ok {
			switch {
			case e.fingerprint != fp:
				f.mu.Unlock()
				writeAnswer(w, answer{http.StatusBadRequest, errJSON("idempotency_error", "",
					"Keys for idempotent requests can only be used with the same parameters they were first used with.")})
				return
			case !e.done:
				f.mu.Unlock()
				writeAnswer(w, answer{http.StatusConflict, errJSON("idempotency_error", "idempotency_key_in_use",
					"There is currently another in-progress request using this Idempotent Key.")})
				return
			default:
				f.requests[idx].Replayed = true
				a, orig := answer{e.status, e.body}, e.requestID
				f.mu.Unlock()
				w.Header().Set("Idempotent-Replayed", "true")
				w.Header().Set("Original-Request", orig)
				writeAnswer(w, a)
				return
			}
		}
	}
	rule := f.takeRuleLocked(req, func(m FailMode) bool { return m != FailIdempotencyMismatch })
	if rule != 0 {
		f.requests[idx].Failure = rule.String()
	}
	switch rule {
	case FailBefore429:
		f.mu.Unlock()
		writeAnswer(w, answer{http.StatusTooManyRequests, errJSON("invalid_request_error", "rate_limit", "Too many requests.")})
		return
	case FailBefore500:
		f.mu.Unlock()
		writeAnswer(w, answer{http.StatusInternalServerError, errJSON("api_error", "", "An unknown error occurred.")})
		return
	}
	var entry *idemEntry
	if idemKey != "" {
		entry = &idemEntry{fingerprint: fp, requestID: reqID}
		f.idem[idemKey] = entry
	}
	f.executing++
	f.version = stripeVersion(r)
	a := f.route(r.Method, path, req.Params, idemKey)
	if a.status == http.StatusBadRequest && entry != nil {
		// Stripe saves no result for a request that failed validation.
		delete(f.idem, idemKey)
		entry = nil
	}
	if rule == FailAfterCreate500 {
		a = answer{http.StatusInternalServerError, errJSON("api_error", "", "An unknown error occurred while processing the request.")}
	}
	if entry != nil {
		entry.status, entry.body = a.status, a.body
		if rule != FailAfterCreateDelay && rule != FailAfterCreateResetInFlight {
			entry.done = true
		}
	}
	delay, held := f.failDelay, f.held
	if rule != FailAfterCreateDelay && rule != FailAfterCreateResetInFlight {
		f.finishLocked(nil)
	}
	f.mu.Unlock()

	switch rule {
	case FailAfterCreateReset:
		resetConn(w)
		return
	case FailAfterCreateResetInFlight:
		resetConn(w)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-held:
			t.Stop()
		}
		f.mu.Lock()
		f.finishLocked(entry)
		f.mu.Unlock()
		return
	case FailAfterCreateDelay:
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-held:
			t.Stop()
		case <-r.Context().Done():
			t.Stop()
		}
		f.mu.Lock()
		f.finishLocked(entry)
		f.mu.Unlock()
		if r.Context().Err() != nil {
			return
		}
	}
	writeAnswer(w, a)
}

func (f *FakeStripe) finishLocked(entry *idemEntry) {
	if entry != nil {
		entry.done = true
	}
	f.executing--
	if f.executing == 0 {
		f.idle.Broadcast()
	}
}

// takeRuleLocked takes the first rule whose mode is wanted and that matches req,
// counting it down, and returns its mode (0 when none applies).
func (f *FakeStripe) takeRuleLocked(req Request, wanted func(FailMode) bool) FailMode {
	for i, r := range f.rules {
		if !wanted(r.mode) || r.left == 0 || (r.match != nil && !r.match(req)) {
			continue
		}
		if r.left > 0 {
			r.left--
		}
		if r.left == 0 {
			f.rules = slices.Delete(f.rules, i, i+1)
		}
		return r.mode
	}
	return 0
}

// requestKey is the API key of a request: the Bearer token or the Basic user name.
func requestKey(r *http.Request) string {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return tok
	}
	if user, _, ok := r.BasicAuth(); ok {
		return user
	}
	return ""
}

// maskKey shows a key as Stripe's error messages do: its prefix and last four
// characters.
func maskKey(key string) string {
	if i := strings.LastIndexByte(key, '_'); i >= 0 && len(key) > i+5 {
		return key[:i+1] + "***" + key[len(key)-4:]
	}
	return "***"
}

// resetConn hijacks the connection and closes it with a TCP reset, so the client
// gets no answer at all.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func writeAnswer(w http.ResponseWriter, a answer) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

func stripeVersion(r *http.Request) string {
	if v := r.Header.Get("Stripe-Version"); v != "" {
		return v
	}
	return "2026-08-26.dahlia"
}

func fingerprint(method, path, account string, params url.Values) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s", method, path, account, params.Encode())
	return hex.EncodeToString(h.Sum(nil))
}

func errJSON(typ, code, msg string) []byte {
	e := map[string]any{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	return b
}

func paramErr(param, msg string) answer {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"type": "invalid_request_error", "code": "parameter_invalid", "param": param, "message": msg}})
	return answer{http.StatusBadRequest, b}
}

func okJSON(v any) answer {
	b, _ := json.Marshal(v)
	return answer{http.StatusOK, b}
}

func notFound(msg string) answer {
	return answer{http.StatusNotFound, errJSON("invalid_request_error", "resource_missing", msg)}
}

var (
	reCurrency = regexp.MustCompile(`^[a-z]{3}$`)
	reSegment  = regexp.MustCompile(`^[A-Za-z0-9_]+$`)
)

func amountParam(p url.Values, name string, required bool) (int64, bool, *answer) {
	v, ok := p[name]
	if !ok || len(v) == 0 {
		if required {
			a := paramErr(name, "Missing required param: "+name+".")
			return 0, false, &a
		}
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v[len(v)-1], 10, 64)
	if err != nil || n < 0 {
		a := paramErr(name, "Invalid integer: "+v[len(v)-1])
		return 0, false, &a
	}
	return n, true, nil
}

func currencyParam(p url.Values) (string, *answer) {
	c := p.Get("currency")
	if !reCurrency.MatchString(c) {
		a := paramErr("currency", "Invalid currency: "+c)
		return "", &a
	}
	return c, nil
}

func declined(p url.Values) bool {
	return p.Get("source") == "tok_chargeDeclined" || p.Get("payment_method") == "pm_card_chargeDeclined"
}

// declinedAnswer is Stripe's 402 for a declined card. A decline while confirming a
// PaymentIntent carries the PaymentIntent in error.payment_intent (status
// requires_payment_method: it still exists and can be confirmed again).
func declinedAnswer(pi *PaymentIntent) answer {
	e := map[string]any{"type": "card_error", "code": "card_declined", "decline_code": "generic_decline",
		"message": "Your card was declined."}
	if pi != nil {
		e["payment_intent"] = piJSON(pi)
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	return answer{http.StatusPaymentRequired, b}
}

// route executes one request against the fake's state. f.mu is held.
func (f *FakeStripe) route(method, path string, p url.Values, idemKey string) answer {
	seg := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(seg) == 4 && seg[0] == "v2" && seg[1] == "core" && seg[2] == "accounts" && method == http.MethodGet {
		return f.accountAnswer(seg[3])
	}
	if len(seg) < 2 || seg[0] != "v1" {
		return notFound("Unrecognized request URL (" + method + ": " + path + ").")
	}
	for _, s := range seg[1:] {
		if !reSegment.MatchString(s) {
			return notFound("Unrecognized request URL (" + method + ": " + path + ").")
		}
	}
	res, rest := seg[1], seg[2:]
	if a, ok := f.routeInvoicing(method, res, rest, p); ok {
		return a
	}
	if a, ok := f.routeBilling(method, res, rest, p); ok {
		return a
	}
	if res == "transfers" && len(rest) >= 1 {
		if a, ok := f.routeTransfer(method, rest, p); ok {
			return a
		}
	}
	if res == "issuing" && len(rest) == 2 && rest[0] == "cards" && method == http.MethodGet {
		return f.issuingCard(rest[1], p["expand[]"])
	}
	if res == "checkout" {
		if a, ok := f.routeCheckout(method, rest, p); ok {
			return a
		}
	}
	switch {
	case res == "charges" && len(rest) == 0 && method == http.MethodPost:
		return f.createCharge(p, idemKey)
	case res == "charges" && len(rest) == 0 && method == http.MethodGet:
		return f.list("charges", f.chargeJSONs())
	case res == "charges" && len(rest) == 1 && method == http.MethodGet:
		if c := f.charge(rest[0]); c != nil {
			return okJSON(chargeJSON(c))
		}
		return notFound("No such charge: '" + rest[0] + "'")
	case res == "charges" && len(rest) == 2 && rest[1] == "capture" && method == http.MethodPost:
		return f.captureCharge(rest[0], p)
	case res == "payment_intents" && len(rest) == 0 && method == http.MethodPost:
		return f.createPI(p, idemKey)
	case res == "payment_intents" && len(rest) == 0 && method == http.MethodGet:
		data := make([]any, 0, len(f.pis))
		for _, pi := range f.pis {
			if c := p.Get("customer"); c == "" || c == pi.Customer {
				data = append(data, piJSON(pi))
			}
		}
		return f.list("payment_intents", data)
	case res == "payment_intents" && len(rest) == 1 && method == http.MethodGet:
		if pi := f.pi(rest[0]); pi != nil {
			return okJSON(piJSON(pi))
		}
		return notFound("No such payment_intent: '" + rest[0] + "'")
	case res == "payment_intents" && len(rest) == 1 && method == http.MethodPost:
		return f.updatePI(rest[0], p)
	case res == "payment_intents" && len(rest) == 2 && method == http.MethodPost:
		switch rest[1] {
		case "confirm":
			return f.confirmPI(rest[0], p)
		case "capture":
			return f.capturePI(rest[0], p)
		case "increment_authorization":
			return f.incrementPI(rest[0], p)
		case "cancel":
			return f.cancelPI(rest[0])
		}
	case res == "refunds" && len(rest) == 0 && method == http.MethodPost:
		return f.createRefund(p)
	case res == "customers" && len(rest) == 0 && method == http.MethodPost:
		f.seq++
		c := map[string]any{"id": fmt.Sprintf("cus_fake%06d", f.seq), "object": "customer",
			"email": p.Get("email"), "name": p.Get("name")}
		f.customers[c["id"].(string)] = c
		return okJSON(c)
	case res == "customers" && len(rest) == 0 && method == http.MethodGet:
		var data []any
		for _, c := range f.customers {
			data = append(data, c)
		}
		return f.list("customers", data)
	case res == "customers" && len(rest) == 1 && method == http.MethodGet:
		if c, ok := f.customers[rest[0]]; ok {
			return okJSON(c)
		}
		return okJSON(map[string]any{"id": rest[0], "object": "customer"})
	case res == "customers" && len(rest) == 1 && method == http.MethodDelete:
		delete(f.customers, rest[0])
		return okJSON(map[string]any{"id": rest[0], "object": "customer", "deleted": true})
	case res == "products" && len(rest) == 0 && method == http.MethodPost:
		if p.Get("name") == "" {
			return paramErr("name", "Missing required param: name.")
		}
		f.seq++
		pr := map[string]any{"id": fmt.Sprintf("prod_fake%06d", f.seq), "object": "product", "name": p.Get("name"),
			"description": nullable(p.Get("description")), "active": true}
		f.products[pr["id"].(string)] = pr
		return okJSON(pr)
	case res == "prices" && len(rest) == 0 && method == http.MethodPost:
		return f.createPrice(p)
	case res == "prices" && len(rest) == 1 && method == http.MethodPost:
		return f.updatePrice(rest[0], p)
	case res == "prices" && len(rest) == 1 && method == http.MethodGet:
		if pr, ok := f.prices[rest[0]]; ok {
			return okJSON(priceJSON(pr, slices.Contains(p["expand[]"], "currency_options")))
		}
		return notFound("No such price: '" + rest[0] + "'")
	case res == "accounts" && len(rest) == 1 && method == http.MethodGet:
		return f.accountAnswer(rest[0])
	case res == "balance" && len(rest) == 0 && method == http.MethodGet:
		return okJSON(map[string]any{"object": "balance", "available": []any{}, "pending": []any{}})
	}
	return notFound("Unrecognized request URL (" + method + ": " + path + ").")
}

func (f *FakeStripe) list(name string, data []any) answer {
	if data == nil {
		data = []any{}
	}
	return okJSON(map[string]any{"object": "list", "data": data, "has_more": false, "url": "/v1/" + name})
}

func (f *FakeStripe) chargeJSONs() []any {
	out := make([]any, 0, len(f.charges))
	for _, c := range f.charges {
		out = append(out, chargeJSON(c))
	}
	return out
}

func (f *FakeStripe) charge(id string) *Charge {
	for _, c := range f.charges {
		if c.ID == id {
			return c
		}
	}
	return nil
}

func (f *FakeStripe) pi(id string) *PaymentIntent { return f.piByID[id] }

func (f *FakeStripe) addPILocked(pi *PaymentIntent) {
	f.pis = append(f.pis, pi)
	f.piByID[pi.ID] = pi
}

// PaymentIntent returns a copy of the PaymentIntent id.
func (f *FakeStripe) PaymentIntent(id string) (PaymentIntent, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if pi := f.piByID[id]; pi != nil {
		return *pi, true
	}
	return PaymentIntent{}, false
}

func (f *FakeStripe) newChargeLocked(amount int64, currency, customer string, captured bool, pi, idemKey string) *Charge {
	f.seq++
	c := &Charge{ID: fmt.Sprintf("ch_fake%06d", f.seq), Amount: amount, Currency: currency, Customer: customer,
		Captured: captured, PaymentIntent: pi, IdempotencyKey: idemKey}
	if captured {
		c.AmountCaptured = amount
	}
	f.charges = append(f.charges, c)
	return c
}

func (f *FakeStripe) createCharge(p url.Values, idemKey string) answer {
	amount, _, bad := amountParam(p, "amount", true)
	if bad != nil {
		return *bad
	}
	cur, bad := currencyParam(p)
	if bad != nil {
		return *bad
	}
	if src := p.Get("source"); strings.HasPrefix(src, "acct_") {
		return f.debitAccount(src, amount, cur, idemKey)
	}
	if declined(p) {
		return declinedAnswer(nil)
	}
	captured := p.Get("capture") != "false"
	c := f.newChargeLocked(amount, cur, p.Get("customer"), captured, "", idemKey)
	f.moved[cur] += amount
	return okJSON(chargeJSON(c))
}

// debitAccount is an account debit (POST /v1/charges with source=acct_…) as
// Stripe documents it: only for a connected account of the platform, in the
// account's default currency, never below a zero balance; the money moves from
// the account's balance to the platform's at once, and the answer is the Payment
// created on the platform (a charge object with a py_ id whose source is the
// account).
func (f *FakeStripe) debitAccount(acct string, amount int64, cur, idemKey string) answer {
	a, ok := f.accounts[acct]
	if !ok {
		return answer{http.StatusBadRequest, errJSON("invalid_request_error", "resource_missing", "No such source: '"+acct+"'")}
	}
	if cur != a.Currency {
		return paramErr("currency", "An account debit must be in the connected account's default currency ("+a.Currency+").")
	}
	if amount > a.Balance {
		return answer{http.StatusBadRequest, errJSON("invalid_request_error", "balance_insufficient",
			"The connected account's balance is too low for this debit.")}
	}
	a.Balance -= amount
	c := f.newChargeLocked(amount, cur, "", true, "", idemKey)
	c.ID, c.Source = strings.Replace(c.ID, "ch_", "py_", 1), acct
	f.moved[cur] += amount
	return okJSON(chargeJSON(c))
}

// accountAnswer is a connected account as GET /v1/accounts/{id} answers it.
func (f *FakeStripe) accountAnswer(id string) answer {
	a, ok := f.accounts[id]
	if !ok {
		return notFound("No such account: '" + id + "'")
	}
	return okJSON(map[string]any{"id": a.ID, "object": "account", "default_currency": a.Currency,
		"type": "custom", "charges_enabled": true, "payouts_enabled": true})
}

func (f *FakeStripe) captureCharge(id string, p url.Values) answer {
	c := f.charge(id)
	if c == nil {
		return notFound("No such charge: '" + id + "'")
	}
	if c.Captured {
		return paramErr("charge", "Charge "+id+" has already been captured.")
	}
	amount, ok, bad := amountParam(p, "amount", false)
	if bad != nil {
		return *bad
	}
	if !ok {
		amount = c.Amount
	}
	if amount > c.Amount {
		return paramErr("amount", "Amount must be no more than the authorized amount.")
	}
	c.Captured, c.AmountCaptured = true, amount
	if c.Foreign {
		f.moved[c.Currency] += amount
	}
	return okJSON(chargeJSON(c))
}

func (f *FakeStripe) createPI(p url.Values, idemKey string) answer {
	amount, _, bad := amountParam(p, "amount", true)
	if bad != nil {
		return *bad
	}
	cur, bad := currencyParam(p)
	if bad != nil {
		return *bad
	}
	f.seq++
	pi := &PaymentIntent{ID: fmt.Sprintf("pi_fake%06d", f.seq), Amount: amount, Currency: cur,
		Customer: p.Get("customer"), Status: "requires_payment_method", CaptureMethod: "automatic", IdempotencyKey: idemKey}
	if p.Get("capture_method") == "manual" {
		pi.CaptureMethod = "manual"
	}
	if p.Get("payment_method") != "" {
		pi.Status = "requires_confirmation"
	}
	f.addPILocked(pi)
	f.moved[cur] += amount
	if p.Get("confirm") == "true" {
		if a := f.confirmLocked(pi, p); a.status != http.StatusOK {
			return a
		}
	}
	return okJSON(piJSON(pi))
}

func (f *FakeStripe) updatePI(id string, p url.Values) answer {
	pi := f.pi(id)
	if pi == nil {
		return notFound("No such payment_intent: '" + id + "'")
	}
	amount, hasAmount, bad := amountParam(p, "amount", false)
	if bad != nil {
		return *bad
	}
	cur, hasCur := pi.Currency, p.Has("currency")
	if hasCur {
		if cur, bad = currencyParam(p); bad != nil {
			return *bad
		}
	}
	if hasAmount || hasCur {
		if pi.Status == "succeeded" || pi.Status == "requires_capture" {
			return paramErr("amount", "This PaymentIntent's amount could not be updated in its current state.")
		}
		if !hasAmount {
			amount = pi.Amount
		}
		switch {
		case pi.Foreign:
			// Only the money it moves counts (receiveLocked).
		case cur != pi.Currency:
			// A new currency: the whole amount is new money in it.
			f.moved[cur] += amount
		case amount > pi.Amount:
			f.moved[cur] += amount - pi.Amount
		}
		pi.Amount, pi.Currency = amount, cur
	}
	if c := p.Get("customer"); c != "" {
		pi.Customer = c
	}
	return okJSON(piJSON(pi))
}

func (f *FakeStripe) confirmPI(id string, p url.Values) answer {
	pi := f.pi(id)
	if pi == nil {
		return notFound("No such payment_intent: '" + id + "'")
	}
	if pi.Status == "succeeded" || pi.Status == "requires_capture" || pi.Status == "canceled" {
		return paramErr("payment_intent", "This PaymentIntent's status is "+pi.Status+" and cannot be confirmed.")
	}
	if a := f.confirmLocked(pi, p); a.status != http.StatusOK {
		return a
	}
	return okJSON(piJSON(pi))
}

func (f *FakeStripe) confirmLocked(pi *PaymentIntent, p url.Values) answer {
	if declined(p) {
		pi.Status = "requires_payment_method"
		return declinedAnswer(pi)
	}
	manual := pi.CaptureMethod == "manual"
	c := f.newChargeLocked(pi.Amount, pi.Currency, pi.Customer, !manual, pi.ID, "")
	pi.LatestCharge = c.ID
	if manual {
		pi.Status, pi.AmountCapturable = "requires_capture", pi.Amount
	} else {
		f.receiveLocked(pi, pi.Amount)
		pi.Status = "succeeded"
	}
	return answer{status: http.StatusOK}
}

// receiveLocked books money received on pi (a capture or an automatic
// confirmation).
func (f *FakeStripe) receiveLocked(pi *PaymentIntent, amount int64) {
	pi.AmountReceived += amount
	if pi.Foreign {
		f.moved[pi.Currency] += amount
	}
}

func (f *FakeStripe) capturePI(id string, p url.Values) answer {
	pi := f.pi(id)
	if pi == nil {
		return notFound("No such payment_intent: '" + id + "'")
	}
	if pi.Status != "requires_capture" {
		return paramErr("payment_intent", "This PaymentIntent could not be captured because it has a status of "+pi.Status+".")
	}
	amount, ok, bad := amountParam(p, "amount_to_capture", false)
	if bad != nil {
		return *bad
	}
	if !ok {
		amount = pi.AmountCapturable
	}
	if amount > pi.AmountCapturable {
		return paramErr("amount_to_capture", "Amount to capture exceeds the capturable amount.")
	}
	// Multicapture: final_capture=false keeps the rest capturable (the status stays
	// requires_capture); a final capture releases what is left.
	f.receiveLocked(pi, amount)
	pi.AmountCapturable -= amount
	if p.Get("final_capture") != "false" {
		pi.Status, pi.AmountCapturable = "succeeded", 0
		f.forgoLocked(pi)
	}
	if c := f.charge(pi.LatestCharge); c != nil {
		c.AmountCaptured += amount
		c.Captured = pi.Status == "succeeded"
	}
	return okJSON(piJSON(pi))
}

func (f *FakeStripe) cancelPI(id string) answer {
	pi := f.pi(id)
	if pi == nil {
		return notFound("No such payment_intent: '" + id + "'")
	}
	switch pi.Status {
	case "succeeded", "canceled", "processing":
		return paramErr("payment_intent", "You cannot cancel this PaymentIntent because it has a status of "+pi.Status+".")
	}
	pi.Status, pi.AmountCapturable = "canceled", 0
	f.forgoLocked(pi)
	return okJSON(piJSON(pi))
}

// forgoLocked takes what a PaymentIntent created through the API will now never
// move (cancelled, or finally captured for less) out of TotalMoved: keybrake
// releases it.
func (f *FakeStripe) forgoLocked(pi *PaymentIntent) {
	if !pi.Foreign {
		f.moved[pi.Currency] -= pi.Amount - pi.AmountReceived
	}
}

func (f *FakeStripe) incrementPI(id string, p url.Values) answer {
	pi := f.pi(id)
	if pi == nil {
		return notFound("No such payment_intent: '" + id + "'")
	}
	if pi.Status != "requires_capture" {
		return paramErr("payment_intent", "Only a PaymentIntent in requires_capture can be incremented.")
	}
	amount, _, bad := amountParam(p, "amount", true)
	if bad != nil {
		return *bad
	}
	if amount < pi.Amount {
		return paramErr("amount", "The new amount must be greater than the current amount.")
	}
	if !pi.Foreign {
		f.moved[pi.Currency] += amount - pi.Amount
	}
	pi.Amount, pi.AmountCapturable = amount, amount
	if c := f.charge(pi.LatestCharge); c != nil {
		c.Amount = amount
	}
	return okJSON(piJSON(pi))
}

func (f *FakeStripe) createRefund(p url.Values) answer {
	var c *Charge
	if id := p.Get("charge"); id != "" {
		c = f.charge(id)
	} else if id := p.Get("payment_intent"); id != "" {
		if pi := f.pi(id); pi != nil {
			c = f.charge(pi.LatestCharge)
		}
	}
	if c == nil {
		return paramErr("charge", "No such charge or payment_intent to refund.")
	}
	amount, ok, bad := amountParam(p, "amount", false)
	if bad != nil {
		return *bad
	}
	if !ok {
		amount = c.AmountCaptured - c.AmountRefunded
	}
	if amount > c.AmountCaptured-c.AmountRefunded {
		return paramErr("amount", "Refund amount is greater than the unrefunded amount.")
	}
	c.AmountRefunded += amount
	f.seq++
	r := &Refund{ID: fmt.Sprintf("re_fake%06d", f.seq), Amount: amount, Currency: c.Currency, Charge: c.ID}
	f.refunds = append(f.refunds, r)
	f.moved[c.Currency] += amount
	return okJSON(map[string]any{"id": r.ID, "object": "refund", "amount": r.Amount, "currency": r.Currency,
		"charge": r.Charge, "status": "succeeded"})
}

func (f *FakeStripe) createPrice(p url.Values) answer {
	product := p.Get("product")
	if _, ok := f.products[product]; !ok {
		return paramErr("product", "No such product: '"+product+"'")
	}
	amount, _, bad := amountParam(p, "unit_amount", true)
	if bad != nil {
		return *bad
	}
	cur, bad := currencyParam(p)
	if bad != nil {
		return *bad
	}
	return okJSON(priceJSON(f.prices[f.newPriceLocked(amount, cur, product, nil)], false))
}

// createPaymentLink creates a link for its line items (a stored price, or
// price_data, times a quantity). A customer pays it later, outside any API
// request, up to restrictions[completed_sessions][limit] times: what keybrake
// must count is that limit times the line items (one time without a limit),
// and TotalMoved counts it when the link is created.
func (f *FakeStripe) createPaymentLink(p url.Values) answer {
	lines := indexed(p, "line_items")
	if len(lines) == 0 {
		return paramErr("line_items", "Missing required param: line_items.")
	}
	limit, _ := strconv.ParseInt(p.Get("restrictions[completed_sessions][limit]"), 10, 64)
	var total int64
	cur := ""
	l := &PaymentLink{}
	for i, pre := range lines {
		unit, qty, c, bad := f.lineItemLocked(p, pre)
		if bad != nil {
			return *bad
		}
		if id := p.Get(pre + "[price]"); id != "" {
			f.localCurrencyLocked(p, id, qty*max(1, limit))
		}
		if i == 0 {
			l.Price, l.Quantity = p.Get(pre+"[price]"), qty
		}
		cur = c
		// An inline recurring price starts a subscription for each payer: what
		// it charges in the first 30 days.
		total += unit * qty * chargesIn30Days(p.Get(pre+"[price_data][recurring][interval]"))
	}
	extra, bad := f.linkExtrasLocked(p)
	if bad != nil {
		return *bad
	}
	l.Currency, l.Limit, l.Pinned = cur, max(1, limit), p.Get("currency") != ""
	f.moved[cur] += l.Limit * (total + extra)
	f.seq++
	l.ID = fmt.Sprintf("plink_fake%06d", f.seq)
	l.URL = "https://buy.stripe.com/test_" + l.ID
	f.links = append(f.links, l)
	after := map[string]any{"type": "hosted_confirmation"}
	if u := p.Get("after_completion[redirect][url]"); u != "" && p.Get("after_completion[type]") == "redirect" {
		after = map[string]any{"type": "redirect", "redirect": map[string]any{"url": u}}
	}
	return okJSON(map[string]any{"id": l.ID, "object": "payment_link", "url": l.URL, "active": true, "currency": cur,
		"after_completion": after, "livemode": false, "metadata": map[string]any{}})
}

// chargesIn30Days is how often a price recurring every interval charges in
// the 30 days from a subscription's start, that start included (1 for a
// one-time price).
func chargesIn30Days(interval string) int64 {
	switch interval {
	case "day":
		return 31
	case "week":
		return 5
	case "month":
		return 2
	}
	return 1
}

// linkExtrasLocked is what a customer paying a Payment Link may add to its line
// items: every optional item (optional_items[i], a stored price × quantity) and
// the dearest shipping option (shipping_options[i][shipping_rate_data]).
func (f *FakeStripe) linkExtrasLocked(p url.Values) (int64, *answer) {
	var extra, shipping int64
	for _, pre := range indexed(p, "optional_items") {
		pr, ok := f.prices[p.Get(pre+"[price]")]
		if !ok {
			a := paramErr(pre+"[price]", "No such price: '"+p.Get(pre+"[price]")+"'")
			return 0, &a
		}
		qty, _ := strconv.ParseInt(p.Get(pre+"[quantity]"), 10, 64)
		extra += pr["unit_amount"].(int64) * max(1, qty)
	}
	for _, pre := range indexed(p, "shipping_options") {
		n, _ := strconv.ParseInt(p.Get(pre+"[shipping_rate_data][fixed_amount][amount]"), 10, 64)
		shipping = max(shipping, n)
	}
	return extra + shipping, nil
}

// updatePaymentLink applies what an update adds to what the link can collect
// (see linkExtrasLocked) for every payment it still allows.
func (f *FakeStripe) updatePaymentLink(id string, p url.Values) answer {
	i := slices.IndexFunc(f.links, func(l *PaymentLink) bool { return l.ID == id })
	if i < 0 {
		return notFound("No such payment link: '" + id + "'")
	}
	l := f.links[i]
	extra, bad := f.linkExtrasLocked(p)
	if bad != nil {
		return *bad
	}
	f.moved[l.Currency] += l.Limit * extra
	return okJSON(map[string]any{"id": l.ID, "object": "payment_link", "url": l.URL, "active": p.Get("active") != "false",
		"currency": l.Currency, "livemode": false, "metadata": map[string]any{}})
}

// priceJSON is a stored price as Stripe answers it: its currency_options (its
// amount in each currency it is sold in, its own included) only when expanded.
func priceJSON(pr map[string]any, expandOptions bool) map[string]any {
	out := map[string]any{}
	for k, v := range pr {
		if k != "options" {
			out[k] = v
		}
	}
	if expandOptions {
		opts := map[string]any{pr["currency"].(string): map[string]any{"unit_amount": pr["unit_amount"], "tax_behavior": "unspecified"}}
		others, _ := pr["options"].(map[string]int64)
		for cur, unit := range others {
			opts[cur] = map[string]any{"unit_amount": unit, "tax_behavior": "unspecified"}
		}
		out["currency_options"] = opts
	}
	return out
}

// AddMultiCurrencyPrice creates a one-time price of unitAmount in currency that
// is also sold in other currencies (currency_options: currency → unit amount),
// and returns its id. Checkout and Payment Links charge a customer the amount of
// their local currency when the request does not fix the currency.
func (f *FakeStripe) AddMultiCurrencyPrice(unitAmount int64, currency string, options map[string]int64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newPriceLocked(unitAmount, currency, "", nil)
	f.prices[id]["options"] = options
	return id
}

// lineItemLocked reads the line item under pre of a Checkout Session or a
// Payment Link: its unit amount, quantity and currency, from price_data or a
// stored price.
func (f *FakeStripe) lineItemLocked(p url.Values, pre string) (unit, qty int64, cur string, bad *answer) {
	unit, qty, bad = linePrice(p, pre, 0, 1)
	if bad != nil {
		return 0, 0, "", bad
	}
	cur = p.Get(pre + "[price_data][currency]")
	if id := p.Get(pre + "[price]"); id != "" {
		pr, ok := f.prices[id]
		if !ok {
			a := paramErr(pre+"[price]", "No such price: '"+id+"'")
			return 0, 0, "", &a
		}
		unit, cur = pr["unit_amount"].(int64), pr["currency"].(string)
	}
	return unit, qty, cur, nil
}

// updatePrice adds amounts in other currencies (currency_options[cur][unit_amount])
// to a price: from then on every Payment Link that uses it without a fixed
// currency can be paid in them, which TotalMoved counts.
func (f *FakeStripe) updatePrice(id string, p url.Values) answer {
	pr, ok := f.prices[id]
	if !ok {
		return notFound("No such price: '" + id + "'")
	}
	options, _ := pr["options"].(map[string]int64)
	if options == nil {
		options = map[string]int64{}
	}
	added := map[string]int64{}
	for k, v := range p {
		rest, isOption := strings.CutPrefix(k, "currency_options[")
		cur, isAmount := strings.CutSuffix(rest, "][unit_amount]")
		if !isOption || !isAmount {
			continue
		}
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil || n < 0 {
			return paramErr(k, "Invalid integer: "+v[0])
		}
		options[cur], added[cur] = n, n
	}
	pr["options"] = options
	for _, l := range f.links {
		if l.Price == id && !l.Pinned {
			for cur, unit := range added {
				f.moved[cur] += unit * l.Quantity * l.Limit
			}
		}
	}
	return okJSON(priceJSON(pr, false))
}

// localCurrencyLocked counts what a stored price sold in other currencies
// (AddMultiCurrencyPrice) can collect in each of them, times n, when the
// request left the currency to the customer's location.
func (f *FakeStripe) localCurrencyLocked(p url.Values, price string, n int64) {
	options, _ := f.prices[price]["options"].(map[string]int64)
	if p.Get("currency") != "" {
		return
	}
	for cur, unit := range options {
		f.moved[cur] += unit * n
	}
}

// AddTransfer creates, as if outside keybrake, a transfer of amount to the
// connected account destination, and returns its id.
func (f *FakeStripe) AddTransfer(amount int64, currency, destination string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	t := &Transfer{ID: fmt.Sprintf("tr_fake%06d", f.seq), Amount: amount, Currency: currency, Destination: destination}
	f.transfers = append(f.transfers, t)
	return t.ID
}

// AddDestinationCharge creates, as if outside keybrake, a destination charge
// whose capture transfers amount to the connected account destination
// (captured already, or awaiting capture), and returns its id.
func (f *FakeStripe) AddDestinationCharge(amount int64, currency, destination string, captured bool) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.newChargeLocked(amount, currency, "", captured, "", "")
	c.Foreign, c.Destination = true, destination
	return c.ID
}

// routeTransfer answers GET /v1/transfers/{id} and creates reversals (POST
// /v1/transfers/{id}/reversals), which take money back from the connected
// account; ok is false for other paths. f.mu is held.
func (f *FakeStripe) routeTransfer(method string, rest []string, p url.Values) (answer, bool) {
	i := slices.IndexFunc(f.transfers, func(t *Transfer) bool { return t.ID == rest[0] })
	if i < 0 {
		return notFound("No such transfer: '" + rest[0] + "'"), true
	}
	t := f.transfers[i]
	switch {
	case len(rest) == 1 && method == http.MethodGet:
	case len(rest) == 2 && rest[1] == "reversals" && method == http.MethodPost:
		amount, ok, bad := amountParam(p, "amount", false)
		if bad != nil {
			return *bad, true
		}
		if !ok {
			amount = t.Amount - t.Reversed
		}
		if amount > t.Amount-t.Reversed {
			return paramErr("amount", "Reversal amount is greater than the transfer's unreversed amount."), true
		}
		t.Reversed += amount
		f.moved[t.Currency] += amount
		f.seq++
		return okJSON(map[string]any{"id": fmt.Sprintf("trr_fake%06d", f.seq), "object": "transfer_reversal",
			"amount": amount, "currency": t.Currency, "transfer": t.ID}), true
	default:
		return answer{}, false
	}
	return okJSON(map[string]any{"id": t.ID, "object": "transfer", "amount": t.Amount, "amount_reversed": t.Reversed,
		"currency": t.Currency, "destination": t.Destination, "livemode": false}), true
}

// IssuingCardNumber is the full number of every virtual card AddIssuingCard
// creates: whoever reads it can spend with the card, outside the API.
const IssuingCardNumber = "4000009990000001"

// AddIssuingCard creates a virtual Issuing card and returns its id.
func (f *FakeStripe) AddIssuingCard() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	id := fmt.Sprintf("ic_fake%06d", f.seq)
	f.cards[id] = true
	return id
}

// issuingCard answers GET /v1/issuing/cards/{id}: as Stripe documents, the full
// number and the CVC of a virtual card only when expanded.
func (f *FakeStripe) issuingCard(id string, expand []string) answer {
	if !f.cards[id] {
		return notFound("No such issuing card: '" + id + "'")
	}
	c := map[string]any{"id": id, "object": "issuing.card", "type": "virtual", "status": "active", "last4": "0001",
		"currency": "usd", "livemode": false}
	if slices.Contains(expand, "number") {
		c["number"] = IssuingCardNumber
	}
	if slices.Contains(expand, "cvc") {
		c["cvc"] = "123"
	}
	return okJSON(c)
}

func chargeJSON(c *Charge) map[string]any {
	m := map[string]any{"id": c.ID, "object": "charge", "amount": c.Amount, "amount_captured": c.AmountCaptured,
		"amount_refunded": c.AmountRefunded, "currency": c.Currency, "captured": c.Captured, "paid": true,
		"status": "succeeded", "livemode": false, "metadata": map[string]any{}}
	m["customer"] = nullable(c.Customer)
	m["payment_intent"] = nullable(c.PaymentIntent)
	m["transfer_data"] = nil
	if c.Destination != "" {
		m["transfer_data"] = map[string]any{"destination": c.Destination, "amount": nil}
	}
	if c.Source != "" {
		m["source"] = map[string]any{"id": c.Source, "object": "account"}
		m["payment_method_details"] = map[string]any{"type": "stripe_account", "stripe_account": map[string]any{}}
	}
	return m
}

func piJSON(p *PaymentIntent) map[string]any {
	m := map[string]any{"id": p.ID, "object": "payment_intent", "amount": p.Amount,
		"amount_capturable": p.AmountCapturable, "amount_received": p.AmountReceived, "currency": p.Currency,
		"status": p.Status, "capture_method": p.CaptureMethod, "livemode": false, "metadata": map[string]any{},
		"client_secret": p.ID + "_secret_fake"}
	m["customer"] = nullable(p.Customer)
	m["latest_charge"] = nullable(p.LatestCharge)
	return m
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// BasicAuth returns an Authorization header value with token as the Basic
// username and an empty password (what curl -u token: sends).
func BasicAuth(token string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(token+":"))
}
