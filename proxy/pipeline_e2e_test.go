package proxy_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
)

func form(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return v
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	ctx := context.Background()
	tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) {
		p.Operations = []string{"charges.create", "payment_intents.create", "*.read"}
		p.Customers = []string{"cus_ok"}
		p.StripeAccounts = []string{"acct_ok"}
	}))
	revokedTok, revoked := e.MustKey(t, Policy("99.00"))
	_, err := e.Store.RevokeKey(ctx, "test", revoked.ID)
	require.NoError(t, err)
	futureTok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) {
		p.PeriodStart = time.Now().Add(24 * time.Hour).Truncate(time.Second)
	}))
	openTok, _ := e.MustKey(t, Policy("99.00"))

	charge := "amount=1000&currency=usd&customer=cus_ok&source=tok_visa"
	idem := hdr("Idempotency-Key", "k1")
	cases := map[string]struct {
		method, target, token string
		header                http.Header
		body                  string
		status                int
		code                  string
	}{
		"no vault key":       {"POST", "/v1/charges", "", idem, charge, 401, "vault_key_invalid"},
		"unknown vault key":  {"POST", "/v1/charges", "vk_nope", idem, charge, 401, "vault_key_invalid"},
		"Stripe secret":      {"POST", "/v1/charges", upstreamSecret, idem, charge, 401, "vault_key_invalid"},
		"revoked":            {"POST", "/v1/charges", revokedTok, idem, charge, 401, "vault_key_revoked"},
		"not yet valid":      {"POST", "/v1/charges", futureTok, idem, charge, 403, "vault_key_not_yet_valid"},
		"operation":          {"POST", "/v1/refunds", tok, idem, "charge=ch_1&amount=100", 403, "operation_not_allowed"},
		"unknown write":      {"POST", "/v1/frobnicate", openTok, idem, "amount=1", 403, "operation_not_allowed"},
		"customer":           {"POST", "/v1/charges", tok, idem, "amount=1000&currency=usd&customer=cus_other&source=tok_visa", 403, "customer_not_allowed"},
		"no customer":        {"POST", "/v1/charges", tok, idem, "amount=1000&currency=usd&source=tok_visa", 403, "customer_not_allowed"},
		"account":            {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "k1", "Stripe-Account", "acct_other"), charge, 403, "account_not_allowed"},
		"context":            {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "k1", "Stripe-Context", "acct_other"), charge, 403, "account_not_allowed"},
		"currency":           {"POST", "/v1/charges", tok, idem, "amount=1000&currency=eur&customer=cus_ok&source=tok_visa", 403, "currency_not_allowed"},
		"over the daily cap": {"POST", "/v1/charges", tok, idem, "amount=10000&currency=usd&customer=cus_ok&source=tok_visa", 402, "spend_cap_exceeded"},
		"idempotency key":    {"POST", "/v1/charges", tok, nil, charge, 400, "idempotency_key_required"},
		"empty key":          {"POST", "/v1/charges", tok, hdr("Idempotency-Key", `""`), charge, 400, "idempotency_key_invalid"},
		"256-char key":       {"POST", "/v1/charges", tok, hdr("Idempotency-Key", strings.Repeat("k", 256)), charge, 400, "idempotency_key_invalid"},
		"two keys":           {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "a", "Idempotency-Key", "b"), charge, 400, "idempotency_key_invalid"},
		"query on POST":      {"POST", "/v1/charges?amount=1", tok, idem, charge, 400, "request_malformed"},
		"query on DELETE":    {"DELETE", "/v1/customers/cus_ok?expand[]=x", tok, nil, "", 400, "request_malformed"},
		"duplicate amount":   {"POST", "/v1/charges", tok, idem, charge + "&amount=1", 400, "request_malformed"},
		"json body on v1":    {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "k1", "Content-Type", "application/json"), `{"amount":1000}`, 400, "request_malformed"},
		"gzip":               {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "k1", "Content-Encoding", "gzip"), charge, 400, "request_malformed"},
		"method override":    {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "k1", "X-HTTP-Method-Override", "GET"), charge, 400, "request_malformed"},
		"PUT":                {"PUT", "/v1/charges", tok, idem, charge, 403, "operation_not_allowed"},
		"upper-case path":    {"POST", "/v1/Charges", tok, idem, charge, 400, "request_malformed"},
		"encoded slash":      {"POST", "/v1/charges%2Fch_1/capture", tok, idem, "", 400, "request_malformed"},
		"body on GET":        {"GET", "/v1/charges", tok, nil, "x=1", 400, "request_malformed"},
		"duplicate in query": {"GET", "/v1/charges?limit=1&limit=2", tok, nil, "", 400, "request_malformed"},
		"two accounts":       {"GET", "/v1/charges", tok, hdr("Stripe-Account", "acct_ok", "Stripe-Account", "acct_ok"), "", 400, "request_malformed"},
		"too large":          {"POST", "/v1/charges", tok, idem, charge + "&description=" + strings.Repeat("x", 1<<20), 413, "request_too_large"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := e.MustSend(t, tc.method, tc.target, tc.token, tc.header, tc.body)
			AssertRefusal(t, r, tc.status, tc.code)
			assert.Equal(t, "false", r.Header.Get("Stripe-Should-Retry"))
		})
	}
	assert.Zero(t, e.Fake.Count(), "no refused request reached Stripe")
	for _, line := range e.Logs.LogLines(t) {
		assert.Equal(t, "refused", line["decision"])
	}
}

func TestCapRefusalDetail(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) {
		pc := decimal.RequireFromString("110.00")
		p.PeriodCap = &pc
	}))
	ok := e.Post(t, "/v1/charges", tok, "a", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusOK, ok.Status, "%s", ok.Raw)
	assert.Equal(t, "39.00", ok.Header.Get("Keybrake-Remaining-Daily"))
	assert.Equal(t, "50.00", ok.Header.Get("Keybrake-Remaining-Period"))

	r := e.Post(t, "/v1/charges", tok, "b", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	kb := r.Keybrake()
	assert.Equal(t, "daily", kb["cap"])
	assert.Equal(t, "99.00", kb["limit"])
	assert.Equal(t, "60.00", kb["committed"])
	assert.Equal(t, "0.00", kb["held"])
	assert.Equal(t, "60.00", kb["requested"])
	assert.Equal(t, "39.00", kb["remaining"])
	assert.NotEmpty(t, kb["reset_at"])
	assert.Equal(t, "invalid_request_error", r.ErrType())
	assert.Equal(t, 1, e.Fake.Count())
}

func TestForwardedRequestHygiene(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00", func(p *policy.Policy) { p.StripeAccounts = []string{"acct_ok"} }))
	body := "amount=1000&currency=usd&description=caf%C3%A9+au+lait&metadata[order]=42&source=tok_visa"
	r := e.MustSend(t, http.MethodPost, "/v1/charges", "", hdr(
		"Authorization", proxytest.BasicAuth(tok),
		"Idempotency-Key", `"order 42"`,
		"Stripe-Account", "acct_ok",
		"Stripe-Version", "2026-08-26.dahlia",
		"X-Forwarded-For", "6.6.6.6",
		"X-Forwarded-Host", "evil.example",
		"Forwarded", "for=6.6.6.6",
		"Cookie", "session=1",
		"Keybrake-Remaining-Daily", "999",
	), body)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "order 42", r.Header.Get("Idempotency-Key"), "the caller sees its own key echoed")
	assert.Equal(t, "89.00", r.Header.Get("Keybrake-Remaining-Daily"))
	assert.Empty(t, r.Header.Get("Keybrake-Remaining-Period"), "no period cap, no header")
	assert.True(t, strings.HasPrefix(r.Header.Get("Request-Id"), "req_fake"), "Stripe's own Request-Id passes")

	reqs := e.Fake.Requests()
	require.Len(t, reqs, 1)
	got := reqs[0]
	assert.Equal(t, "Bearer "+upstreamSecret, got.Header.Get("Authorization"))
	assert.Equal(t, "acct_ok", got.Header.Get("Stripe-Account"))
	assert.Equal(t, "2026-08-26.dahlia", got.Header.Get("Stripe-Version"))
	assert.Equal(t, vault.UpstreamKey(key.ID, "order 42"), got.IdempotencyKey)
	assert.Empty(t, got.Header.Get("X-Forwarded-For"))
	assert.Empty(t, got.Header.Get("X-Forwarded-Host"))
	assert.Empty(t, got.Header.Get("Forwarded"))
	assert.Empty(t, got.Header.Get("Cookie"))
	assert.Empty(t, got.Header.Get("Keybrake-Remaining-Daily"))
	assert.Equal(t, "/v1/charges", got.Path)
	assert.Equal(t, body, string(got.Body), "the body is forwarded byte for byte")
	assert.Equal(t, "application/x-www-form-urlencoded", got.Header.Get("Content-Type"))
}

func TestStripeGoChunkedBodyAndReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	sc := e.Client(tok, 0)
	p := chargeParams(2500, "usd", "replay-me")
	p.Description = stripe.String("two words & more")
	p.AddMetadata("order_id", "A-1")
	first, err := sc.V1Charges.Create(ctx, p)
	require.NoError(t, err)
	assert.Equal(t, "74.00", first.LastResponse.Header.Get("Keybrake-Remaining-Daily"))
	assert.Empty(t, first.LastResponse.Header.Get("Idempotent-Replayed"))

	second, err := sc.V1Charges.Create(ctx, p)
	require.NoError(t, err)
	assert.Equal(t, first.ID, second.ID)
	assert.Equal(t, "true", second.LastResponse.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, first.LastResponse.RequestID, second.LastResponse.Header.Get("Original-Request"))
	assert.Equal(t, "74.00", second.LastResponse.Header.Get("Keybrake-Remaining-Daily"))
	assert.Equal(t, first.LastResponse.RawJSON, second.LastResponse.RawJSON)
	assert.Equal(t, 1, e.Fake.Count())

	changed := chargeParams(2600, "usd", "replay-me")
	_, err = sc.V1Charges.Create(ctx, changed)
	se := StripeErr(t, err)
	assert.Equal(t, http.StatusUnprocessableEntity, se.HTTPStatusCode)
	assert.Equal(t, stripe.ErrorCode("idempotency_key_reused"), se.Code)
	assert.Equal(t, stripe.ErrorTypeIdempotency, se.Type)
	assert.Equal(t, 1, e.Fake.Count())
}

func TestReadsAndNonMoneyWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	sc := e.Client(tok, 0)

	cus, err := sc.V1Customers.Create(ctx, &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")})
	require.NoError(t, err, "a POST that moves no money needs no idempotency key")
	got, err := sc.V1Customers.Retrieve(ctx, cus.ID, nil)
	require.NoError(t, err)
	assert.Equal(t, cus.ID, got.ID)
	assert.Equal(t, "99.00", got.LastResponse.Header.Get("Keybrake-Remaining-Daily"))

	r := e.MustSend(t, http.MethodGet, "/v1/charges?limit=3&expand[]=data.customer", tok, nil, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	reqs := e.Fake.Requests()
	assert.Equal(t, "limit=3&expand[]=data.customer", reqs[len(reqs)-1].RawQuery, "the query is forwarded as sent")

	unknown := e.MustSend(t, http.MethodGet, "/v1/unheard_of_things", tok, nil, "")
	assert.Equal(t, http.StatusNotFound, unknown.Status, "an unknown read is forwarded; Stripe answers")
	assert.Equal(t, "resource_missing", unknown.ErrCode())

	holds, _, err := e.Store.ListHolds(ctx, "", 10, "")
	require.NoError(t, err)
	assert.Empty(t, holds)
}

func TestCurrencyExponents(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		currency, cap      string
		amount             int64
		remaining, limit   string
		requested, refused string
	}{
		"jpy has no decimals":  {"jpy", "1000", 600, "400", "1000", "600", ""},
		"kwd has three":        {"kwd", "10.000", 6000, "4.000", "10.000", "6.000", ""},
		"isk has two (Stripe)": {"isk", "1000.00", 60000, "400.00", "1000.00", "600.00", ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := MustEnv(t)
			tok, _ := e.MustKey(t, Policy(tc.cap, func(p *policy.Policy) { p.Currency = tc.currency }))
			sc := e.Client(tok, 0)
			ch, err := sc.V1Charges.Create(ctx, chargeParams(tc.amount, tc.currency, "first"))
			require.NoError(t, err)
			assert.Equal(t, tc.remaining, ch.LastResponse.Header.Get("Keybrake-Remaining-Daily"))

			_, err = sc.V1Charges.Create(ctx, chargeParams(tc.amount, tc.currency, "second"))
			se := StripeErr(t, err)
			assert.Equal(t, http.StatusPaymentRequired, se.HTTPStatusCode)

			r := e.Post(t, "/v1/charges", tok, "third", form("amount", "600", "currency", tc.currency, "source", "tok_visa"))
			if r.Status == http.StatusPaymentRequired {
				kb := r.Keybrake()
				assert.Equal(t, tc.limit, kb["limit"])
				assert.Equal(t, tc.currency, kb["currency"])
			}
			assert.Len(t, e.Fake.Charges(), 1+boolInt(r.Status == http.StatusOK))
			assert.EqualValues(t, tc.amount+int64(600*boolInt(r.Status == http.StatusOK)), e.Fake.TotalCharged(tc.currency))
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestUpstream429IsPassedOnAndAbandoned(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	e.Fake.FailNext(proxytest.FailBefore429, 1)
	r := e.Post(t, "/v1/charges", tok, "k", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	assert.Equal(t, http.StatusTooManyRequests, r.Status)
	assert.Equal(t, "rate_limit", r.ErrCode(), "Stripe's answer is passed on")

	// Nothing stays held: the retry with the same key is a fresh claim, and a
	// second $60 would not fit if the first were still held.
	ok := e.Post(t, "/v1/charges", tok, "k", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusOK, ok.Status, "%s", ok.Raw)
	assert.Empty(t, ok.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "39.00", ok.Header.Get("Keybrake-Remaining-Daily"))
	assert.Len(t, e.Fake.Charges(), 1)
}

func TestDeclineReleasesTheHold(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	r := e.Post(t, "/v1/charges", tok, "d1", form("amount", "6000", "currency", "usd", "source", "tok_chargeDeclined"))
	assert.Equal(t, http.StatusPaymentRequired, r.Status)
	assert.Equal(t, "card_declined", r.ErrCode())

	again := e.Post(t, "/v1/charges", tok, "d1", form("amount", "6000", "currency", "usd", "source", "tok_chargeDeclined"))
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "a definitive 4xx is stored and replayed")
	assert.Equal(t, r.Raw, again.Raw)

	ok := e.Post(t, "/v1/charges", tok, "d2", form("amount", "9900", "currency", "usd", "source", "tok_visa"))
	assert.Equal(t, http.StatusOK, ok.Status, "the declined hold was released: %s", ok.Raw)
	assert.Equal(t, 2, e.Fake.Count())
}

func TestDeriveMode(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) {
		p.Idempotency = policy.Idempotency{Mode: policy.IdempotencyDerive, Fields: []string{"customer", "metadata[billing_period]"}}
	}))
	body := form("amount", "6000", "currency", "usd", "customer", "cus_1", "metadata[billing_period]", "2026-09", "source", "tok_visa")
	first := e.Post(t, "/v1/charges", tok, "uuid-1", body)
	require.Equal(t, http.StatusOK, first.Status, "%s", first.Raw)
	second := e.Post(t, "/v1/charges", tok, "uuid-2", body)
	require.Equal(t, http.StatusOK, second.Status)
	assert.Equal(t, "true", second.Header.Get("Idempotent-Replayed"), "a fresh caller key does not make a new request")
	assert.Equal(t, first.Body["id"], second.Body["id"])
	noKey := e.Post(t, "/v1/charges", tok, "", body)
	assert.Equal(t, "true", noKey.Header.Get("Idempotent-Replayed"), "the caller's key is not needed")
	assert.Len(t, e.Fake.Charges(), 1)

	missing := e.Post(t, "/v1/charges", tok, "uuid-3", form("amount", "100", "currency", "usd", "customer", "cus_1", "source", "tok_visa"))
	AssertRefusal(t, missing, http.StatusBadRequest, "idempotency_key_required")
	assert.Equal(t, "metadata[billing_period]", missing.Keybrake()["field"])
}

func TestReportModeForwardsWhatWouldBeRefused(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("10.00", func(p *policy.Policy) { p.Mode = policy.ModeReport }))
	r := e.Post(t, "/v1/charges", tok, "big", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Len(t, e.Fake.Charges(), 1)
	var found bool
	for _, l := range e.Logs.LogLines(t) {
		if l["decision"] == "would_refuse" {
			found = true
			assert.Equal(t, "spend_cap_exceeded", l["reason"])
		}
	}
	assert.True(t, found, "the canonical line says what would have been refused")
}

func TestCanonicalLogLine(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	r := e.Post(t, "/v1/charges", tok, "log-1", form("amount", "1234", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusOK, r.Status)
	lines := e.Logs.LogLines(t)
	require.Len(t, lines, 1)
	l := lines[0]
	assert.Equal(t, key.ID, l["key_id"])
	assert.Equal(t, "charges.create", l["operation"])
	assert.EqualValues(t, 1234, l["amount"])
	assert.Equal(t, "usd", l["currency"])
	assert.Equal(t, "allowed", l["decision"])
	assert.EqualValues(t, 200, l["upstream_status"])
	assert.EqualValues(t, 200, l["status"])
	assert.Equal(t, "INFO", l["level"])
	assert.IsType(t, float64(0), l["duration_ms"], "the duration in milliseconds, as the access lines have it")
	assert.NotContains(t, l, "duration")
	assert.NotContains(t, e.Logs.String(), "log-1", "the idempotency key is not logged")
	assert.NotContains(t, e.Logs.String(), "tok_visa", "bodies are not logged")
}

// TestKeyAndUpstreamChangesTakeEffectOnTheNextRequest: the proxy's hot path
// reads no key and no secret from the store (the bbolt store keeps them in
// memory), yet a rotation, a revocation and a new upstream secret each apply
// from the very next request.
func TestKeyAndUpstreamChangesTakeEffectOnTheNextRequest(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	ctx := context.Background()
	tok, key := e.MustKey(t, Policy("99.00"))
	charge := func(token, idem string) reply {
		return e.Post(t, "/v1/charges", token, idem, form("amount", "100", "currency", "usd", "source", "tok_visa"))
	}
	require.Equal(t, http.StatusOK, charge(tok, "a").Status)
	require.Equal(t, http.StatusOK, e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, "").Status)

	_, newTok, err := e.Store.RotateKey(ctx, "test", key.ID)
	require.NoError(t, err)
	AssertRefusal(t, charge(tok, "b"), http.StatusUnauthorized, "vault_key_invalid")
	require.Equal(t, http.StatusOK, charge(newTok, "c").Status)

	// A new secret at the upstream and in keybrake: the next request uses it.
	e.Fake.SetSecret("sk_test_rolled")
	_, _, err = e.Store.PutUpstream(ctx, "test", "default", "stripe", "sk_test_rolled")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, charge(newTok, "d").Status)

	_, err = e.Store.RevokeKey(ctx, "test", key.ID)
	require.NoError(t, err)
	AssertRefusal(t, charge(newTok, "e"), http.StatusUnauthorized, "vault_key_revoked")
	AssertRefusal(t, e.MustSend(t, http.MethodGet, "/v1/charges", newTok, nil, ""), http.StatusUnauthorized, "vault_key_revoked")
}
