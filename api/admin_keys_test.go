package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/vault"
)

func TestAdminMintWithSeedLegacyPolicy(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")

	r := env.Do(http.MethodPost, "/api/v1/keys", env.adminToken,
		`{"name":"vault_key_cust_123_2026_09","labels":{"customer_id":"cust_123","billing_period":"2026-09"},"policy":`+seedLegacyPolicy+`}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	var k mintedKey
	r.Decode(t, &k)

	assert.True(t, strings.HasPrefix(k.ID, "key_"), k.ID)
	assert.Equal(t, "/api/v1/keys/"+k.ID, r.Header.Get("Location"))
	assert.True(t, strings.HasPrefix(k.Token, "vk_"), "token is a vk_ token")
	assert.Equal(t, "http://127.0.0.1:8080", k.BaseURL)
	assert.Equal(t, "active", k.Status)
	assert.Equal(t, "default", k.Upstream, "upstream defaults to default")
	assert.Equal(t, map[string]string{"customer_id": "cust_123", "billing_period": "2026-09"}, k.Labels)
	assert.Equal(t, "stripe", k.Policy["vendor"])
	assert.Equal(t, "usd", k.Policy["currency"], "the legacy form means usd")
	assert.Equal(t, "99.00", k.Policy["daily_cap"])
	assert.Equal(t, "110.00", k.Policy["period_cap"])
	assert.Equal(t, "2026-10-01T00:00:00Z", k.Policy["expires_at"])
	assert.Equal(t, "2026-09-14T12:00:00Z", k.Policy["period_start"], "period_start defaults to the time of minting")
	assert.Equal(t, "no-store", r.Header.Get("Cache-Control"), "the token must not be cached")

	// The token works against the store, and is shown only once.
	got, err := env.store.Authenticate(context.Background(), k.Token)
	require.NoError(t, err)
	assert.Equal(t, k.ID, got.ID)

	g := env.Do(http.MethodGet, "/api/v1/keys/"+k.ID, env.adminToken, nil)
	require.Equal(t, http.StatusOK, g.Status, "body: %s", g.Body)
	assert.NotContains(t, string(g.Body), k.Token)
	assert.NotContains(t, string(g.Body), "token\":")
	body := g.JSON(t)
	usage, ok := body["usage"].(map[string]any)
	require.True(t, ok, "GET /keys/{id} includes usage: %s", g.Body)
	assert.Equal(t, "usd", usage["currency"])

	u := env.MustUsage(k.ID)
	assert.Equal(t, "usd", u.Currency)
	assert.Equal(t, strp("99.00"), u.Daily.Cap)
	assert.Equal(t, "0.00", u.Daily.Committed)
	assert.Equal(t, "0.00", u.Daily.Held)
	assert.Equal(t, strp("99.00"), u.Daily.Remaining)
	assert.Equal(t, time.Date(2026, 9, 14, 0, 0, 0, 0, time.UTC), u.Daily.Start.UTC())
	assert.Equal(t, time.Date(2026, 9, 15, 0, 0, 0, 0, time.UTC), u.Daily.ResetAt.UTC())
	assert.Equal(t, strp("110.00"), u.Period.Cap)
	assert.Equal(t, strp("110.00"), u.Period.Remaining)
	assert.Equal(t, time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), u.Period.ResetAt.UTC())
	assert.Nil(t, u.PerRequest.Cap, "no per-request cap: null")
}

func TestAdminMintCanonicalPolicy(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	body := `{
	  "name": "vault_key_cust_123_2026_09",
	  "upstream": "default",
	  "labels": {"customer_id": "cust_123", "billing_period": "2026-09"},
	  "policy": {
	    "vendor": "stripe", "currency": "usd",
	    "daily_cap": "99.00", "period_cap": "110.00", "per_request_cap": "99.00",
	    "period_start": "2026-09-01T00:00:00Z", "expires_at": "2026-10-01T00:00:00Z",
	    "timezone": "UTC",
	    "operations": ["charges.create", "payment_intents.create", "*.read"],
	    "customers": ["cus_123"], "stripe_accounts": [],
	    "idempotency": {"mode": "require"}, "mode": "enforce"
	  }
	}`
	r := env.Do(http.MethodPost, "/api/v1/keys", env.adminToken, body)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	var k mintedKey
	r.Decode(t, &k)
	assert.Equal(t, "99.00", k.Policy["per_request_cap"])
	assert.Equal(t, []any{"charges.create", "payment_intents.create", "*.read"}, k.Policy["operations"])

	u := env.MustUsage(k.ID)
	assert.Equal(t, strp("99.00"), u.PerRequest.Cap)
	assert.Equal(t, time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC), u.Period.Start.UTC())
}

func TestAdminMintRefusals(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	env.MustMint("taken", "", nil, seedLegacyPolicy)

	big := `{"name":"big","labels":{"x":"` + strings.Repeat("a", 70<<10) + `"},"policy":` + seedLegacyPolicy + `}`
	cases := map[string]struct {
		body        string
		contentType string
		status      int
		fields      []string // every field the problem must list
	}{
		"malformed JSON":           {body: `{"name":"x",`, status: http.StatusBadRequest},
		"trailing garbage":         {body: `{"name":"x"} {}`, status: http.StatusBadRequest},
		"empty body":               {body: ``, status: http.StatusBadRequest},
		"not JSON content type":    {body: `name=x`, contentType: "application/x-www-form-urlencoded", status: http.StatusUnsupportedMediaType},
		"body over 64 KiB":         {body: big, status: http.StatusRequestEntityTooLarge},
		"unknown top-level field":  {body: `{"name":"x","polcy":` + seedLegacyPolicy + `}`, status: http.StatusUnprocessableEntity, fields: []string{"polcy"}},
		"typo in a legacy cap":     {body: `{"name":"x","policy":{"vendor":"stripe","daily_usd_cpa":99,"expires_at":"2026-10-01T00:00:00Z"}}`, status: http.StatusUnprocessableEntity, fields: []string{"policy.daily_usd_cpa"}},
		"typo in a canonical cap":  {body: `{"name":"x","policy":{"vendor":"stripe","daly_cap":"99","period_cap":"100","expires_at":"2026-10-01T00:00:00Z"}}`, status: http.StatusUnprocessableEntity, fields: []string{"policy.daly_cap"}},
		"duplicate member":         {body: `{"name":"x","name":"y","policy":` + seedLegacyPolicy + `}`, status: http.StatusUnprocessableEntity, fields: []string{"name"}},
		"duplicate cap in policy":  {body: `{"name":"x","policy":{"vendor":"stripe","daily_cap":"10","daily_cap":null,"expires_at":"2026-10-01T00:00:00Z"}}`, status: http.StatusUnprocessableEntity, fields: []string{"policy.daily_cap"}},
		"wrong type":               {body: `{"name":7,"policy":` + seedLegacyPolicy + `}`, status: http.StatusUnprocessableEntity, fields: []string{"name"}},
		"every field error listed": {body: `{"labels":{"a:b":"c"}}`, status: http.StatusUnprocessableEntity, fields: []string{"name", "labels.a:b", "policy"}},
		"expires_at in the past":   {body: `{"name":"x","policy":{"vendor":"stripe","daily_usd_cap":99,"expires_at":"2026-09-01T00:00:00Z"}}`, status: http.StatusUnprocessableEntity, fields: []string{"policy.expires_at"}},
		"no cap at all":            {body: `{"name":"x","policy":{"vendor":"stripe","expires_at":"2026-10-01T00:00:00Z"}}`, status: http.StatusUnprocessableEntity},
		"negative cap":             {body: `{"name":"x","policy":{"vendor":"stripe","daily_cap":"-5","expires_at":"2026-10-01T00:00:00Z"}}`, status: http.StatusUnprocessableEntity, fields: []string{"policy.daily_cap"}},
		"unknown upstream":         {body: `{"name":"x","upstream":"nope","policy":` + seedLegacyPolicy + `}`, status: http.StatusUnprocessableEntity, fields: []string{"upstream"}},
		"duplicate name":           {body: `{"name":"taken","policy":` + seedLegacyPolicy + `}`, status: http.StatusConflict},
		"policy is not an object":  {body: `{"name":"x","policy":"daily 99"}`, status: http.StatusUnprocessableEntity, fields: []string{"policy"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ct := tc.contentType
			if ct == "" {
				ct = "application/json"
			}
			r := env.DoRaw(http.MethodPost, "/api/v1/keys", http.Header{
				"Authorization": {"Bearer " + env.adminToken},
				"Content-Type":  {ct},
			}, []byte(tc.body))
			require.Equal(t, tc.status, r.Status, "body: %s", r.Body)
			p := r.Problem(t)
			if tc.status == http.StatusUnprocessableEntity {
				assert.Equal(t, api.ProblemValidation, p.Type)
				assert.NotEmpty(t, p.Errors, "a 422 lists its field errors")
			}
			fields := r.ErrorFields(t)
			for _, f := range tc.fields {
				assert.Contains(t, fields, f, "problem: %s", r.Body)
			}
		})
	}

	// Nothing of the refused requests was minted.
	r := env.Do(http.MethodGet, "/api/v1/keys", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	var list struct {
		Keys []mintedKey `json:"keys"`
	}
	r.Decode(t, &list)
	require.Len(t, list.Keys, 1)
	assert.Equal(t, "taken", list.Keys[0].Name)
}

func TestAdminListKeysFiltersAndPages(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	env.MustUpstream("eu")

	byName := map[string]string{}
	for i := range 7 {
		customer, upstream := "cust_a", ""
		if i%2 == 1 {
			customer, upstream = "cust_b", "eu"
		}
		name := fmt.Sprintf("key-%d", i)
		if i == 6 {
			name = "special-6"
		}
		k := env.MustMint(name, upstream, map[string]string{"customer_id": customer, "billing_period": "2026-09"}, seedLegacyPolicy)
		byName[name] = k.ID
	}
	rv := env.Do(http.MethodPost, "/api/v1/keys/"+byName["key-1"]+"/revoke", env.adminToken, nil)
	require.Equal(t, http.StatusOK, rv.Status, "body: %s", rv.Body)

	// listAll follows next_cursor from the first page and returns the names per page.
	listAll := func(t *testing.T, filter string) (pages [][]string) {
		t.Helper()
		cursor := ""
		for range 20 {
			q := filter
			if cursor != "" {
				q += "&cursor=" + url.QueryEscape(cursor)
			}
			r := env.Do(http.MethodGet, "/api/v1/keys?"+q, env.viewerToken, nil)
			require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
			var page struct {
				Keys       []mintedKey `json:"keys"`
				NextCursor *string     `json:"next_cursor"`
			}
			r.Decode(t, &page)
			var names []string
			for _, k := range page.Keys {
				assert.Empty(t, k.Token, "a listing never carries a token")
				names = append(names, k.Name)
			}
			pages = append(pages, names)
			if page.NextCursor == nil {
				return pages
			}
			require.NotEmpty(t, *page.NextCursor)
			cursor = *page.NextCursor
		}
		t.Fatal("pagination does not end")
		return nil
	}
	flatten := func(pages [][]string) []string {
		var out []string
		for _, p := range pages {
			out = append(out, p...)
		}
		return out
	}

	pages := listAll(t, "limit=3")
	require.GreaterOrEqual(t, len(pages), 3, "7 keys in pages of 3: %v", pages)
	assert.Len(t, pages[0], 3)
	assert.Len(t, pages[1], 3)
	assert.Equal(t, []string{"key-0", "key-1", "key-2", "key-3", "key-4", "key-5", "special-6"}, flatten(pages), "oldest first, each exactly once")

	cases := map[string]struct {
		filter string
		want   []string
	}{
		"label":                {filter: "label=customer_id:cust_a&limit=2", want: []string{"key-0", "key-2", "key-4", "special-6"}},
		"two labels":           {filter: "label=customer_id:cust_b&label=billing_period:2026-09", want: []string{"key-1", "key-3", "key-5"}},
		"label no match":       {filter: "label=customer_id:cust_c", want: nil},
		"status revoked":       {filter: "status=revoked", want: []string{"key-1"}},
		"status active":        {filter: "status=active&limit=2", want: []string{"key-0", "key-2", "key-3", "key-4", "key-5", "special-6"}},
		"upstream":             {filter: "upstream=eu", want: []string{"key-1", "key-3", "key-5"}},
		"name prefix":          {filter: "q=special", want: []string{"special-6"}},
		"combined":             {filter: "upstream=eu&status=active&label=customer_id:cust_b", want: []string{"key-3", "key-5"}},
		"label value with a :": {filter: "label=" + url.QueryEscape("customer_id:cust_a:x"), want: nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, flatten(listAll(t, tc.filter)))
		})
	}

	// Expired keys: move the clock past the policy's expiry.
	env.clock.Set(time.Date(2026, 10, 2, 0, 0, 0, 0, time.UTC))
	env.viewerToken = env.MustToken("victor@example.com", api.RoleViewer)
	assert.Len(t, flatten(listAll(t, "status=expired")), 6)
	assert.Len(t, flatten(listAll(t, "status=active")), 0)
	env.clock.Set(adminTestNow)
	env.viewerToken = env.MustToken("victor@example.com", api.RoleViewer)

	bad := map[string]struct {
		query string
		field string
	}{
		"bad status":         {query: "status=paused", field: "status"},
		"label without :":    {query: "label=customer_id", field: "label"},
		"limit zero":         {query: "limit=0", field: "limit"},
		"limit too big":      {query: "limit=501", field: "limit"},
		"limit not a number": {query: "limit=ten", field: "limit"},
		"misspelt filter":    {query: "stauts=revoked", field: "stauts"},
		"repeated status":    {query: "status=active&status=revoked", field: "status"},
		"garbage cursor":     {query: "cursor=%2A%2A%2A", field: "cursor"},
	}
	for name, tc := range bad {
		t.Run(name, func(t *testing.T) {
			r := env.Do(http.MethodGet, "/api/v1/keys?"+tc.query, env.viewerToken, nil)
			require.Equal(t, http.StatusUnprocessableEntity, r.Status, "body: %s", r.Body)
			assert.Contains(t, r.ErrorFields(t), tc.field)
		})
	}
}

func TestAdminPatchCapKeepsUsage(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("patched", "", map[string]string{"env": "prod", "team": "billing"}, seedLegacyPolicy)

	env.MustHold(k.ID, "idem-commit", 2500, vault.SettleCommit) // $25.00 committed
	env.MustHold(k.ID, "idem-held", 1000, "")                   // $10.00 in flight
	before := env.MustUsage(k.ID)
	require.Equal(t, "25.00", before.Daily.Committed)
	require.Equal(t, "10.00", before.Daily.Held)
	require.Equal(t, strp("64.00"), before.Daily.Remaining)

	r := env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken,
		`{"policy":{"daily_cap":"50"},"labels":{"team":null,"tier":"gold"}}`,
		"Content-Type", "application/merge-patch+json")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var patched mintedKey
	r.Decode(t, &patched)
	assert.Equal(t, "50.00", patched.Policy["daily_cap"])
	assert.Equal(t, "110.00", patched.Policy["period_cap"], "fields not in the patch stay")
	assert.Equal(t, "2026-10-01T00:00:00Z", patched.Policy["expires_at"])
	assert.Equal(t, map[string]string{"env": "prod", "tier": "gold"}, patched.Labels)

	after := env.MustUsage(k.ID)
	assert.Equal(t, strp("50.00"), after.Daily.Cap)
	assert.Equal(t, before.Daily.Committed, after.Daily.Committed, "usage is never reset")
	assert.Equal(t, before.Daily.Held, after.Daily.Held, "usage is never reset")
	assert.Equal(t, before.Period.Committed, after.Period.Committed)
	assert.Equal(t, before.Period.Held, after.Period.Held)
	assert.Equal(t, strp("15.00"), after.Daily.Remaining)

	// Lowering the cap below usage is allowed; remaining is then 0, never negative.
	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{"policy":{"daily_cap":"20.00"}}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	assert.Equal(t, strp("0.00"), env.MustUsage(k.ID).Daily.Remaining)

	// A legacy cap in a patch works too; removing a cap with null.
	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{"policy":{"daily_usd_cap":60,"period_cap":null}}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	u := env.MustUsage(k.ID)
	assert.Equal(t, strp("60.00"), u.Daily.Cap)
	assert.Nil(t, u.Period.Cap)
	assert.Nil(t, u.Period.Remaining)
	assert.Equal(t, before.Period.Committed, u.Period.Committed, "usage of an uncapped window is still counted")

	// An empty patch changes nothing.
	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)

	refused := map[string]struct {
		body   string
		status int
		field  string
	}{
		"negative cap":            {body: `{"policy":{"daily_cap":"-1"}}`, status: http.StatusUnprocessableEntity, field: "policy.daily_cap"},
		"too many decimals":       {body: `{"policy":{"daily_cap":"1.001"}}`, status: http.StatusUnprocessableEntity, field: "policy.daily_cap"},
		"typo in policy":          {body: `{"policy":{"daily_cpa":"10"}}`, status: http.StatusUnprocessableEntity, field: "policy.daily_cpa"},
		"typo at the top":         {body: `{"polciy":{"daily_cap":"10"}}`, status: http.StatusUnprocessableEntity, field: "polciy"},
		"expires in the past":     {body: `{"policy":{"expires_at":"2026-09-01T00:00:00Z"}}`, status: http.StatusUnprocessableEntity, field: "policy.expires_at"},
		"every cap removed":       {body: `{"policy":{"daily_cap":null}}`, status: http.StatusUnprocessableEntity},
		"policy removed":          {body: `{"policy":null}`, status: http.StatusUnprocessableEntity, field: "policy"},
		"label of the wrong type": {body: `{"labels":{"env":5}}`, status: http.StatusUnprocessableEntity, field: "labels.env"},
		"bad label name":          {body: `{"labels":{"a:b":"x"}}`, status: http.StatusUnprocessableEntity, field: "labels.a:b"},
		"malformed":               {body: `{"policy":`, status: http.StatusBadRequest},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			r := env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, tc.body)
			require.Equal(t, tc.status, r.Status, "body: %s", r.Body)
			if tc.field != "" {
				assert.Contains(t, r.ErrorFields(t), tc.field, "problem: %s", r.Body)
			} else {
				r.Problem(t)
			}
		})
	}
	// The refused patches changed nothing.
	final := env.MustUsage(k.ID)
	assert.Equal(t, strp("60.00"), final.Daily.Cap)
	assert.Equal(t, before.Daily.Committed, final.Daily.Committed)

	r = env.Do(http.MethodPatch, "/api/v1/keys/key_doesnotexist", env.adminToken, `{"policy":{"daily_cap":"5"}}`)
	assert.Equal(t, http.StatusNotFound, r.Status)
	r.Problem(t)
}

func TestAdminRevokeAndRotate(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("rotated", "", nil, seedLegacyPolicy)
	env.MustHold(k.ID, "idem-1", 1234, vault.SettleCommit)
	ctx := context.Background()

	r := env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/rotate", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var rotated mintedKey
	r.Decode(t, &rotated)
	assert.Equal(t, k.ID, rotated.ID, "same key")
	assert.True(t, strings.HasPrefix(rotated.Token, "vk_"))
	assert.NotEqual(t, k.Token, rotated.Token)
	assert.Equal(t, "http://127.0.0.1:8080", rotated.BaseURL)

	_, err := env.store.Authenticate(ctx, k.Token)
	assert.ErrorIs(t, err, vault.ErrKeyInvalid, "the old token stops working at once")
	got, err := env.store.Authenticate(ctx, rotated.Token)
	require.NoError(t, err)
	assert.Equal(t, k.ID, got.ID)
	assert.Equal(t, "12.34", env.MustUsage(k.ID).Daily.Committed, "rotation keeps usage")

	r = env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/revoke", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	m := r.JSON(t)
	assert.Equal(t, "revoked", m["status"])
	assert.NotEmpty(t, m["revoked_at"])
	assert.NotContains(t, m, "token")
	_, err = env.store.Authenticate(ctx, rotated.Token)
	assert.ErrorIs(t, err, vault.ErrKeyRevoked)

	// Revoking again is harmless; rotating or changing a revoked key is a conflict.
	r = env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/revoke", env.adminToken, nil)
	assert.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r = env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/rotate", env.adminToken, nil)
	assert.Equal(t, http.StatusConflict, r.Status, "body: %s", r.Body)
	assert.Equal(t, api.ProblemConflict, r.Problem(t).Type)
	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{"policy":{"daily_cap":"5"}}`)
	assert.Equal(t, http.StatusConflict, r.Status, "body: %s", r.Body)

	for _, path := range []string{"/revoke", "/rotate", "/usage", "/events", ""} {
		method := http.MethodPost
		if path == "/usage" || path == "/events" || path == "" {
			method = http.MethodGet
		}
		r := env.Do(method, "/api/v1/keys/key_unknown"+path, env.adminToken, nil)
		assert.Equal(t, http.StatusNotFound, r.Status, "%s %s: %s", method, path, r.Body)
		assert.Equal(t, api.ProblemNotFound, r.Problem(t).Type)
	}
}

func TestAdminUpstreams(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)

	r := env.Do(http.MethodPost, "/api/v1/upstreams", env.adminToken, map[string]string{"name": "default", "secret": testStripeSecret})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	m := r.JSON(t)
	assert.Equal(t, "stripe", m["vendor"], "vendor defaults to stripe")
	assert.Equal(t, testStripeSecret[len(testStripeSecret)-4:], m["secret_last4"])
	assert.NotContains(t, string(r.Body), testStripeSecret)

	r = env.Do(http.MethodPost, "/api/v1/upstreams", env.adminToken, map[string]string{"name": "default", "vendor": "stripe", "secret": "sk_test_replacement_7777"})
	require.Equal(t, http.StatusOK, r.Status, "re-registering replaces: %s", r.Body)
	assert.Equal(t, "7777", r.JSON(t)["secret_last4"])

	r = env.Do(http.MethodGet, "/api/v1/upstreams", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.NotContains(t, string(r.Body), "sk_test_")
	var list struct {
		Upstreams []map[string]any `json:"upstreams"`
	}
	r.Decode(t, &list)
	require.Len(t, list.Upstreams, 1)
	assert.Equal(t, "default", list.Upstreams[0]["name"])

	for name, tc := range map[string]struct {
		body  string
		field string
	}{
		"publishable key": {body: `{"name":"x","secret":"pk_test_abc"}`, field: "secret"},
		"no secret":       {body: `{"name":"x"}`, field: "secret"},
		"no name":         {body: `{"secret":"sk_test_abc"}`, field: "name"},
		"other vendor":    {body: `{"name":"x","vendor":"paypal","secret":"sk_test_abc"}`, field: "vendor"},
		"unknown field":   {body: `{"name":"x","secret":"sk_test_abc","secert":"y"}`, field: "secert"},
	} {
		t.Run(name, func(t *testing.T) {
			r := env.Do(http.MethodPost, "/api/v1/upstreams", env.adminToken, tc.body)
			require.Equal(t, http.StatusUnprocessableEntity, r.Status, "body: %s", r.Body)
			assert.Contains(t, r.ErrorFields(t), tc.field)
			assert.NotContains(t, string(r.Body), "sk_test_abc", "a problem never echoes a secret")
		})
	}

	// Refused while an active key uses it; allowed once the key is revoked.
	k := env.MustMint("user", "", nil, seedLegacyPolicy)
	r = env.Do(http.MethodDelete, "/api/v1/upstreams/default", env.adminToken, nil)
	require.Equal(t, http.StatusConflict, r.Status, "body: %s", r.Body)
	assert.Equal(t, api.ProblemConflict, r.Problem(t).Type)
	r = env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/revoke", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	r = env.Do(http.MethodDelete, "/api/v1/upstreams/default", env.adminToken, nil)
	require.Equal(t, http.StatusNoContent, r.Status, "body: %s", r.Body)
	r = env.Do(http.MethodDelete, "/api/v1/upstreams/default", env.adminToken, nil)
	assert.Equal(t, http.StatusNotFound, r.Status, "body: %s", r.Body)
	r.Problem(t)
}

func TestAdminHoldsAndEvents(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("holder", "", nil, seedLegacyPolicy)
	env.MustHold(k.ID, "idem-ok", 500, vault.SettleCommit)
	env.MustHold(k.ID, "idem-lost", 700, vault.SettleUnknown)
	env.MustHold(k.ID, "idem-lost-2", 300, vault.SettleUnknown)

	r := env.Do(http.MethodGet, "/api/v1/holds?state=unknown", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var holds struct {
		Holds []struct {
			ID                     string   `json:"id"`
			KeyID                  string   `json:"key_id"`
			IdempotencyKey         string   `json:"idempotency_key"`
			UpstreamIdempotencyKey string   `json:"upstream_idempotency_key"`
			Amount                 string   `json:"amount"`
			State                  string   `json:"state"`
			Windows                []string `json:"windows"`
		} `json:"holds"`
	}
	r.Decode(t, &holds)
	require.Len(t, holds.Holds, 2)
	var lost string
	for _, h := range holds.Holds {
		assert.Equal(t, "unknown", h.State)
		assert.Equal(t, k.ID, h.KeyID)
		if h.IdempotencyKey == "idem-lost" {
			lost = h.ID
			assert.Equal(t, "7.00", h.Amount)
			assert.Equal(t, vault.UpstreamKey(k.ID, "idem-lost"), h.UpstreamIdempotencyKey)
			assert.NotEmpty(t, h.Windows)
		}
	}
	require.NotEmpty(t, lost)
	assert.Equal(t, "10.00", env.MustUsage(k.ID).Daily.Held, "unknown holds stay held")

	r = env.Do(http.MethodPost, "/api/v1/holds/"+lost+"/resolve", env.adminToken, `{"outcome":"committed"}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	assert.Equal(t, "committed", r.JSON(t)["state"])
	u := env.MustUsage(k.ID)
	assert.Equal(t, "12.00", u.Daily.Committed)
	assert.Equal(t, "3.00", u.Daily.Held)

	r = env.Do(http.MethodPost, "/api/v1/holds/"+lost+"/resolve", env.adminToken, `{"outcome":"released"}`)
	assert.Equal(t, http.StatusConflict, r.Status, "a resolved hold cannot be resolved again: %s", r.Body)
	r.Problem(t)
	r = env.Do(http.MethodPost, "/api/v1/holds/"+lost+"/resolve", env.adminToken, `{"outcome":"maybe"}`)
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
	assert.Contains(t, r.ErrorFields(t), "outcome")
	r = env.Do(http.MethodPost, "/api/v1/holds/hold_nope/resolve", env.adminToken, `{"outcome":"released"}`)
	assert.Equal(t, http.StatusNotFound, r.Status, "body: %s", r.Body)
	r = env.Do(http.MethodGet, "/api/v1/holds?state=lost", env.adminToken, nil)
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)

	r = env.Do(http.MethodGet, "/api/v1/holds?state=unknown", env.adminToken, nil)
	r.Decode(t, &holds)
	require.Len(t, holds.Holds, 1)
	assert.Equal(t, "idem-lost-2", holds.Holds[0].IdempotencyKey)

	// The ledger: newest first, in pages.
	var seen []map[string]any
	cursor := ""
	for range 50 {
		path := "/api/v1/keys/" + k.ID + "/events?limit=2"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		r := env.Do(http.MethodGet, path, env.viewerToken, nil)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		var page struct {
			Events     []map[string]any `json:"events"`
			NextCursor string           `json:"next_cursor"`
		}
		r.Decode(t, &page)
		assert.LessOrEqual(t, len(page.Events), 2)
		seen = append(seen, page.Events...)
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Greater(t, len(seen), 2, "more than one page of events")
	for i := 1; i < len(seen); i++ {
		prev, err := time.Parse(time.RFC3339Nano, seen[i-1]["time"].(string))
		require.NoError(t, err)
		cur, err := time.Parse(time.RFC3339Nano, seen[i]["time"].(string))
		require.NoError(t, err)
		assert.False(t, cur.After(prev), "newest first")
		assert.Greater(t, seen[i-1]["id"], seen[i]["id"], "newest first by id")
	}
	raw, err := json.Marshal(seen)
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"amount":"5.00"`)
	assert.Contains(t, string(raw), `"operation":"charges.create"`)
}

func TestAdminConcurrentPatchesLoseNothing(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("busy", "", nil, seedLegacyPolicy)

	const n = 8
	errs := make(chan error, n)
	for i := range n {
		go func() {
			body := fmt.Sprintf(`{"labels":{"l%d":"v%d"}}`, i, i)
			req, err := http.NewRequest(http.MethodPatch, env.srv.URL+"/api/v1/keys/"+k.ID, strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			req.Header.Set("Authorization", "Bearer "+env.adminToken)
			req.Header.Set("Content-Type", "application/merge-patch+json")
			resp, err := env.srv.Client().Do(req)
			if err != nil {
				errs <- err
				return
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs <- fmt.Errorf("patch %d: status %d", i, resp.StatusCode)
				return
			}
			errs <- nil
		}()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	r := env.Do(http.MethodGet, "/api/v1/keys/"+k.ID, env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	var got mintedKey
	r.Decode(t, &got)
	assert.Len(t, got.Labels, n, "every concurrent merge patch survives: %v", got.Labels)
}
