package proxytest_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

const secret = "sk_test_fake"

type reply struct {
	Status int
	Header http.Header
	Body   map[string]any
}

func MustPost(tb testing.TB, f *proxytest.FakeStripe, path, idemKey, auth string, form url.Values) reply {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPost, f.URL+path, strings.NewReader(form.Encode()))
	require.NoError(tb, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", auth)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	return MustDo(tb, req)
}

func MustDo(tb testing.TB, req *http.Request) reply {
	tb.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(tb, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	var m map[string]any
	require.NoError(tb, json.Unmarshal(b, &m), "body %s", b)
	return reply{resp.StatusCode, resp.Header, m}
}

func charge(amount string) url.Values {
	return url.Values{"amount": {amount}, "currency": {"usd"}, "source": {"tok_visa"}}
}

func errCode(r reply) string {
	e, _ := r.Body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func errType(r reply) string {
	e, _ := r.Body["error"].(map[string]any)
	s, _ := e["type"].(string)
	return s
}

func TestFakeStripeIdempotency(t *testing.T) {
	t.Parallel()
	f := proxytest.NewFakeStripe(t, secret)
	auth := "Bearer " + secret

	first := MustPost(t, f, "/v1/charges", "k1", auth, charge("500"))
	require.Equal(t, http.StatusOK, first.Status)
	assert.Equal(t, "k1", first.Header.Get("Idempotency-Key"))
	assert.Empty(t, first.Header.Get("Idempotent-Replayed"))

	again := MustPost(t, f, "/v1/charges", "k1", auth, charge("500"))
	assert.Equal(t, http.StatusOK, again.Status)
	assert.Equal(t, first.Body["id"], again.Body["id"])
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, first.Header.Get("Request-Id"), again.Header.Get("Original-Request"))

	changed := MustPost(t, f, "/v1/charges", "k1", auth, charge("501"))
	assert.Equal(t, http.StatusBadRequest, changed.Status)
	assert.Equal(t, "idempotency_error", errType(changed))

	other := MustPost(t, f, "/v1/charges", "k2", auth, charge("700"))
	require.Equal(t, http.StatusOK, other.Status)

	assert.Len(t, f.Charges(), 2)
	assert.Equal(t, int64(1200), f.TotalCharged("usd"))
	assert.Equal(t, int64(1200), f.TotalMoved("usd"))
	assert.Equal(t, 4, f.Count())
}

func TestFakeStripeAuth(t *testing.T) {
	t.Parallel()
	f := proxytest.NewFakeStripe(t, secret)
	cases := map[string]struct {
		auth string
		want int
	}{
		"bearer":       {"Bearer " + secret, http.StatusOK},
		"basic":        {proxytest.BasicAuth(secret), http.StatusOK},
		"wrong secret": {"Bearer sk_test_other", http.StatusUnauthorized},
		"none":         {"", http.StatusUnauthorized},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := MustPost(t, f, "/v1/charges", "", tc.auth, charge("100"))
			assert.Equal(t, tc.want, r.Status)
		})
	}
	assert.Len(t, f.Charges(), 2)
}

func TestFakeStripeFailures(t *testing.T) {
	t.Parallel()
	t.Run("500 after create is saved and replayed", func(t *testing.T) {
		f := proxytest.NewFakeStripe(t, secret)
		f.FailNext(proxytest.FailAfterCreate500, 1)
		r := MustPost(t, f, "/v1/charges", "k", "Bearer "+secret, charge("100"))
		assert.Equal(t, http.StatusInternalServerError, r.Status)
		assert.Equal(t, "api_error", errType(r))
		require.Len(t, f.Charges(), 1)

		again := MustPost(t, f, "/v1/charges", "k", "Bearer "+secret, charge("100"))
		assert.Equal(t, http.StatusInternalServerError, again.Status)
		assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
		assert.Len(t, f.Charges(), 1)
	})

	t.Run("reset after create saves the result", func(t *testing.T) {
		f := proxytest.NewFakeStripe(t, secret)
		f.FailNext(proxytest.FailAfterCreateReset, 1)
		req, err := http.NewRequest(http.MethodPost, f.URL+"/v1/charges", strings.NewReader(charge("100").Encode()))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+secret)
		// A fresh connection and no Idempotency-Key header, so net/http cannot
		// replay the request by itself: the reset must surface.
		req.Close = true
		_, err = (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		require.Error(t, err)
		require.Len(t, f.Charges(), 1)

		ok := MustPost(t, f, "/v1/charges", "k", "Bearer "+secret, charge("100"))
		assert.Equal(t, http.StatusOK, ok.Status)
		assert.Len(t, f.Charges(), 2)
	})

	t.Run("delay keeps the key in flight then replays", func(t *testing.T) {
		f := proxytest.NewFakeStripe(t, secret)
		f.SetFailDelay(time.Hour)
		f.FailNext(proxytest.FailAfterCreateDelay, 1)
		req, err := http.NewRequest(http.MethodPost, f.URL+"/v1/charges", strings.NewReader(charge("100").Encode()))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Idempotency-Key", "slow")
		client := &http.Client{Timeout: 200 * time.Millisecond}
		var wg sync.WaitGroup
		wg.Go(func() {
			_, err := client.Do(req)
			assert.Error(t, err)
		})
		// While the first request is held, the same key is in flight.
		for len(f.Charges()) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		inUse := MustPost(t, f, "/v1/charges", "slow", "Bearer "+secret, charge("100"))
		assert.Equal(t, http.StatusConflict, inUse.Status)
		assert.Equal(t, "idempotency_key_in_use", errCode(inUse))
		wg.Wait()
		f.WaitIdle(t)

		replay := MustPost(t, f, "/v1/charges", "slow", "Bearer "+secret, charge("100"))
		assert.Equal(t, http.StatusOK, replay.Status)
		assert.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
		assert.Len(t, f.Charges(), 1)
	})

	t.Run("429 before executing saves nothing", func(t *testing.T) {
		f := proxytest.NewFakeStripe(t, secret)
		f.FailNext(proxytest.FailBefore429, 1)
		r := MustPost(t, f, "/v1/charges", "k", "Bearer "+secret, charge("100"))
		assert.Equal(t, http.StatusTooManyRequests, r.Status)
		assert.Empty(t, f.Charges())
		ok := MustPost(t, f, "/v1/charges", "k", "Bearer "+secret, charge("100"))
		assert.Equal(t, http.StatusOK, ok.Status)
		assert.Empty(t, ok.Header.Get("Idempotent-Replayed"))
		assert.Len(t, f.Charges(), 1)
	})

	t.Run("predicate selects the request", func(t *testing.T) {
		f := proxytest.NewFakeStripe(t, secret)
		f.FailWhen(proxytest.FailAfterCreate500, -1, func(r proxytest.Request) bool {
			return r.Params.Get("amount") == "666"
		})
		assert.Equal(t, http.StatusOK, MustPost(t, f, "/v1/charges", "", "Bearer "+secret, charge("100")).Status)
		assert.Equal(t, http.StatusInternalServerError, MustPost(t, f, "/v1/charges", "", "Bearer "+secret, charge("666")).Status)
		assert.Equal(t, http.StatusInternalServerError, MustPost(t, f, "/v1/charges", "", "Bearer "+secret, charge("666")).Status)
		assert.Len(t, f.Charges(), 3)
	})
}

func TestFakeStripePaymentIntentLifecycle(t *testing.T) {
	t.Parallel()
	f := proxytest.NewFakeStripe(t, secret)
	auth := "Bearer " + secret
	pi := MustPost(t, f, "/v1/payment_intents", "", auth, url.Values{
		"amount": {"1000"}, "currency": {"usd"}, "capture_method": {"manual"}, "payment_method": {"pm_card_visa"}})
	require.Equal(t, http.StatusOK, pi.Status)
	id := pi.Body["id"].(string)

	up := MustPost(t, f, "/v1/payment_intents/"+id, "", auth, url.Values{"amount": {"1500"}})
	require.Equal(t, http.StatusOK, up.Status)
	conf := MustPost(t, f, "/v1/payment_intents/"+id+"/confirm", "", auth, url.Values{})
	require.Equal(t, http.StatusOK, conf.Status)
	assert.Equal(t, "requires_capture", conf.Body["status"])
	assert.EqualValues(t, 1500, conf.Body["amount_capturable"])

	cap := MustPost(t, f, "/v1/payment_intents/"+id+"/capture", "", auth, url.Values{"amount_to_capture": {"1200"}})
	require.Equal(t, http.StatusOK, cap.Status)
	assert.EqualValues(t, 1200, cap.Body["amount_received"])

	get, err := http.NewRequest(http.MethodGet, f.URL+"/v1/payment_intents/"+id, nil)
	require.NoError(t, err)
	get.Header.Set("Authorization", auth)
	got := MustDo(t, get)
	assert.Equal(t, "succeeded", got.Body["status"])

	ref := MustPost(t, f, "/v1/refunds", "", auth, url.Values{"payment_intent": {id}, "amount": {"200"}})
	require.Equal(t, http.StatusOK, ref.Status)

	assert.Equal(t, int64(1500), f.TotalCharged("usd"))
	assert.Equal(t, int64(1200+200), f.TotalMoved("usd"), "PI creation and raise, less what the final capture left, and the refund")
	assert.Len(t, f.Refunds(), 1)
}

func TestFakeStripeCatalogAndPaymentLinks(t *testing.T) {
	t.Parallel()
	f := proxytest.NewFakeStripe(t, secret)
	auth := "Bearer " + secret

	prod := MustPost(t, f, "/v1/products", "", auth, url.Values{"name": {"T-shirt"}})
	require.Equal(t, http.StatusOK, prod.Status)
	price := MustPost(t, f, "/v1/prices", "", auth, url.Values{
		"product": {prod.Body["id"].(string)}, "unit_amount": {"1500"}, "currency": {"usd"}})
	require.Equal(t, http.StatusOK, price.Status)
	assert.Equal(t, float64(1500), price.Body["unit_amount"])

	r := MustPost(t, f, "/v1/prices", "", auth, url.Values{"product": {"prod_nope"}, "unit_amount": {"1"}, "currency": {"usd"}})
	assert.Equal(t, http.StatusBadRequest, r.Status, "a price needs an existing product")

	link := MustPost(t, f, "/v1/payment_links", "pl-1", auth, url.Values{
		"line_items[0][price]": {price.Body["id"].(string)}, "line_items[0][quantity]": {"2"},
		"after_completion[type]": {"redirect"}, "after_completion[redirect][url]": {"https://example.com/thanks"}})
	require.Equal(t, http.StatusOK, link.Status)
	assert.Equal(t, "payment_link", link.Body["object"])
	assert.Equal(t, "redirect", link.Body["after_completion"].(map[string]any)["type"])
	again := MustPost(t, f, "/v1/payment_links", "pl-1", auth, url.Values{
		"line_items[0][price]": {price.Body["id"].(string)}, "line_items[0][quantity]": {"2"},
		"after_completion[type]": {"redirect"}, "after_completion[redirect][url]": {"https://example.com/thanks"}})
	assert.Equal(t, link.Body["id"], again.Body["id"], "the same idempotency key replays")
	links := f.PaymentLinks()
	require.Len(t, links, 1)
	assert.Equal(t, int64(2), links[0].Quantity)
	assert.Equal(t, int64(2*1500), f.TotalMoved("usd"), "a link without a limit counts what one payment of it moves")

	r = MustPost(t, f, "/v1/payment_links", "", auth, url.Values{"line_items[0][price]": {"price_nope"}, "line_items[0][quantity]": {"1"}})
	assert.Equal(t, http.StatusBadRequest, r.Status)

	pi := MustPost(t, f, "/v1/payment_intents", "", auth, url.Values{"amount": {"700"}, "currency": {"usd"}, "customer": {"cus_a"}})
	require.Equal(t, http.StatusOK, pi.Status)
	MustPost(t, f, "/v1/payment_intents", "", auth, url.Values{"amount": {"800"}, "currency": {"usd"}, "customer": {"cus_b"}})
	req, err := http.NewRequest(http.MethodGet, f.URL+"/v1/payment_intents?customer=cus_a", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", auth)
	list := MustDo(t, req)
	require.Equal(t, http.StatusOK, list.Status)
	data := list.Body["data"].([]any)
	require.Len(t, data, 1)
	assert.Equal(t, pi.Body["id"], data[0].(map[string]any)["id"])
}

// An account debit works only on a connected account, in its default currency,
// within its balance; it answers the Payment created on the platform.
func TestFakeStripeAccountDebit(t *testing.T) {
	t.Parallel()
	f := proxytest.NewFakeStripe(t, secret)
	acct := f.AddConnectedAccount("eur", 1000)
	debit := func(idem, amount, currency, source string) reply {
		return MustPost(t, f, "/v1/charges", idem, "Bearer "+secret,
			url.Values{"amount": {amount}, "currency": {currency}, "source": {source}})
	}
	r := debit("d1", "500", "eur", "acct_unknown")
	assert.Equal(t, http.StatusBadRequest, r.Status)
	assert.Equal(t, "resource_missing", errCode(r))
	r = debit("d2", "500", "usd", acct)
	assert.Equal(t, http.StatusBadRequest, r.Status, "not the account's default currency")
	r = debit("d3", "1001", "eur", acct)
	assert.Equal(t, "balance_insufficient", errCode(r))
	assert.Empty(t, f.Charges())

	r = debit("d4", "600", "eur", acct)
	require.Equal(t, http.StatusOK, r.Status)
	assert.True(t, strings.HasPrefix(r.Body["id"].(string), "py_"), "a Payment on the platform: %v", r.Body["id"])
	assert.Equal(t, acct, r.Body["source"].(map[string]any)["id"])
	a, ok := f.ConnectedAccount(acct)
	require.True(t, ok)
	assert.EqualValues(t, 400, a.Balance)
	assert.EqualValues(t, 600, f.TotalMoved("eur"))
	require.Len(t, f.Charges(), 1)
	assert.Equal(t, acct, f.Charges()[0].Source)
}

// The fake behaves as Stripe documents for multicapture, declines and cancels.
func TestFakeStripeMulticaptureDeclinesAndCancels(t *testing.T) {
	t.Parallel()
	auth := "Bearer " + secret
	t.Run("multicapture of an authorisation made outside", func(t *testing.T) {
		f := proxytest.NewFakeStripe(t, secret)
		id := f.AddAuthorization(5000, "usd", "")
		c1 := MustPost(t, f, "/v1/payment_intents/"+id+"/capture", "", auth, url.Values{"amount_to_capture": {"1000"}, "final_capture": {"false"}})
		require.Equal(t, http.StatusOK, c1.Status)
		assert.Equal(t, "requires_capture", c1.Body["status"], "final_capture=false keeps it capturable")
		assert.EqualValues(t, 1000, c1.Body["amount_received"])
		assert.EqualValues(t, 4000, c1.Body["amount_capturable"])
		c2 := MustPost(t, f, "/v1/payment_intents/"+id+"/capture", "", auth, url.Values{"amount_to_capture": {"1500"}})
		require.Equal(t, http.StatusOK, c2.Status)
		assert.Equal(t, "succeeded", c2.Body["status"])
		assert.EqualValues(t, 2500, c2.Body["amount_received"], "cumulative")
		assert.EqualValues(t, 0, c2.Body["amount_capturable"], "a final capture releases the rest")
		assert.Equal(t, int64(2500), f.TotalMoved("usd"), "captures of a foreign authorisation are money moved")
		assert.Zero(t, f.TotalCharged("usd"), "its charge was made outside the API")
		over := MustPost(t, f, "/v1/payment_intents/"+id+"/capture", "", auth, url.Values{"amount_to_capture": {"1"}})
		assert.Equal(t, http.StatusBadRequest, over.Status)
	})
	t.Run("a declined creation carries the PaymentIntent", func(t *testing.T) {
		f := proxytest.NewFakeStripe(t, secret)
		r := MustPost(t, f, "/v1/payment_intents", "k", auth, url.Values{"amount": {"5000"}, "currency": {"usd"},
			"confirm": {"true"}, "payment_method": {"pm_card_chargeDeclined"}})
		assert.Equal(t, http.StatusPaymentRequired, r.Status)
		e := r.Body["error"].(map[string]any)
		assert.Equal(t, "card_error", e["type"])
		pi := e["payment_intent"].(map[string]any)
		assert.Equal(t, "requires_payment_method", pi["status"])
		assert.Equal(t, int64(5000), f.TotalMoved("usd"), "it still exists and can be confirmed")
		again := MustPost(t, f, "/v1/payment_intents", "k", auth, url.Values{"amount": {"5000"}, "currency": {"usd"},
			"confirm": {"true"}, "payment_method": {"pm_card_chargeDeclined"}})
		assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "Stripe saves a decline under the key")

		cancel := MustPost(t, f, "/v1/payment_intents/"+pi["id"].(string)+"/cancel", "", auth, url.Values{})
		require.Equal(t, http.StatusOK, cancel.Status)
		assert.Equal(t, "canceled", cancel.Body["status"])
		assert.Zero(t, f.TotalMoved("usd"), "a cancelled PaymentIntent can move nothing")
		twice := MustPost(t, f, "/v1/payment_intents/"+pi["id"].(string)+"/cancel", "", auth, url.Values{})
		assert.Equal(t, http.StatusBadRequest, twice.Status)
	})
}
