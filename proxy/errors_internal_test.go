package proxy

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
)

func TestWriteStripeError(t *testing.T) {
	t.Parallel()
	reset := time.Date(2026, 9, 15, 0, 0, 0, 0, time.UTC)
	capRefusal := reasonRefusal(policy.Decision{Reason: policy.ReasonCapExceeded, Cap: policy.WindowDaily,
		Limit: 9900, Committed: 6000, Held: 0, Requested: 6000, Remaining: 3900, ResetAt: reset}, "usd")
	inUse := refuse(CodeIdemKeyInUse, "in use")
	inUse.RetryAfter = 1
	cases := map[string]struct {
		err        error
		status     int
		typ        string
		code       ErrorCode
		retry      string
		retryAfter string
	}{
		"cap":       {capRefusal, 402, TypeInvalidRequest, CodeSpendCapExceeded, "false", ""},
		"malformed": {malformed(errors.New("dup"), "bad"), 400, TypeInvalidRequest, CodeRequestMalformed, "false", ""},
		"in use":    {inUse, 409, TypeIdempotency, CodeIdemKeyInUse, "true", "1"},
		"stale":     {refuse(CodeIdemOutcomeUnknown, "old"), 409, TypeIdempotency, CodeIdemOutcomeUnknown, "false", ""},
		"upstream":  {refuse(CodeUpstreamUnavailable, "down"), 502, TypeAPI, CodeUpstreamUnavailable, "true", ""},
		"not ours":  {errors.New("bbolt: secret detail"), 500, TypeAPI, CodeInternalError, "false", ""},
		"expired":   {reasonRefusal(policy.Decision{Reason: policy.ReasonExpired}, ""), 401, TypeInvalidRequest, CodeVaultKeyExpired, "false", ""},
		"currency":  {reasonRefusal(policy.Decision{Reason: policy.ReasonCurrencyNotAllowed}, "usd"), 403, TypeInvalidRequest, CodeCurrencyNotAllowed, "false", ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeStripeError(rec, "req_kb_test", tc.err)
			assert.Equal(t, tc.status, rec.Code)
			assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			assert.Equal(t, "req_kb_test", rec.Header().Get("Request-Id"))
			assert.Equal(t, tc.retry, rec.Header().Get("Stripe-Should-Retry"))
			assert.Equal(t, tc.retryAfter, rec.Header().Get("Retry-After"))
			var body struct {
				Error struct {
					Type, Code, Message string
					Keybrake            map[string]any
				}
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
			assert.Equal(t, tc.typ, body.Error.Type)
			assert.Equal(t, string(tc.code), body.Error.Code)
			assert.NotEmpty(t, body.Error.Message)
			assert.Equal(t, string(tc.code), body.Error.Keybrake["reason"])
			assert.Equal(t, "req_kb_test", body.Error.Keybrake["request_id"])
			assert.NotContains(t, rec.Body.String(), "bbolt", "internal error text never reaches the caller")
		})
	}

	rec := httptest.NewRecorder()
	writeStripeError(rec, "req_kb_x", capRefusal)
	var body map[string]map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	kb := body["error"]["keybrake"].(map[string]any)
	assert.Equal(t, map[string]any{
		"reason": "spend_cap_exceeded", "cap": "daily", "currency": "usd", "limit": "99.00", "committed": "60.00",
		"held": "0.00", "requested": "60.00", "remaining": "39.00", "reset_at": "2026-09-15T00:00:00Z", "request_id": "req_kb_x",
	}, kb)
}

func TestNewRequestID(t *testing.T) {
	t.Parallel()
	a, b := newRequestID(), newRequestID()
	assert.True(t, strings.HasPrefix(a, "req_kb_"))
	assert.Len(t, a, len("req_kb_")+20)
	assert.NotEqual(t, a, b)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	assert.Error(t, (&Config{}).Validate(), "no store, no upstream")
	_, err := New(Config{})
	assert.Error(t, err)
}

func TestVaultToken(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		auth []string
		want string
	}{
		"bearer":            {[]string{"Bearer vk_abc"}, "vk_abc"},
		"bearer lower case": {[]string{"bearer vk_abc"}, "vk_abc"},
		"basic":             {[]string{"Basic dmtfYWJjOg=="}, "vk_abc"},
		"basic no colon":    {[]string{"Basic dmtfYWJj"}, "vk_abc"},
		"none":              {nil, ""},
		"empty bearer":      {[]string{"Bearer "}, ""},
		"bad basic":         {[]string{"Basic %%%"}, ""},
		"other scheme":      {[]string{"Token vk_abc"}, ""},
		"two headers":       {[]string{"Bearer vk_a", "Bearer vk_b"}, ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := http.Header{}
			if tc.auth != nil {
				h["Authorization"] = tc.auth
			}
			got, kr := readVaultToken(h)
			if tc.want == "" {
				require.NotNil(t, kr)
				assert.Equal(t, CodeVaultKeyInvalid, kr.Code)
				return
			}
			require.Nil(t, kr)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestCodeOfPolicyReasons checks that every policy refusal reason is an error
// code with its own status, not the 500 of an unknown code.
func TestCodeOfPolicyReasons(t *testing.T) {
	t.Parallel()
	reasons := []policy.Reason{policy.ReasonExpired, policy.ReasonNotYetValid, policy.ReasonOperationNotAllowed,
		policy.ReasonCustomerNotAllowed, policy.ReasonAccountNotAllowed, policy.ReasonCurrencyNotAllowed,
		policy.ReasonCapExceeded, policy.ReasonAmountUnknown}
	for _, r := range reasons {
		code := codeOf(r)
		assert.Equal(t, string(r), string(code))
		assert.Contains(t, metricReasons, code, "the refusal metric counts %s", code)
		status, _, _ := statusFor(code)
		assert.NotEqual(t, http.StatusInternalServerError, status, "%s has no status of its own", code)
	}
	assert.Equal(t, CodeOperationNotAllowed, codeOf(policy.ReasonNone))
}
