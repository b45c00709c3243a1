package proxy

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Stripe error types used in refusals (the "type" member of a Stripe error body).
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeIdempotency    = "idempotency_error"
	TypeAPI            = "api_error"
	TypeRateLimit      = "rate_limit_error"
)

// ErrorCode is the code of one of keybrake's own refusals: the "code" member
// of a Stripe error body, the reason of its "keybrake" member, the reason of
// the canonical log line and of the refusal metric. The policy's refusal
// reasons are among them, by construction (codeOf).
type ErrorCode string

// Error codes of keybrake's own refusals. statusFor says which status each one
// carries (docs/proxy-errors.md).
const (
	CodeVaultKeyInvalid     ErrorCode = "vault_key_invalid"
	CodeVaultKeyRevoked     ErrorCode = "vault_key_revoked"
	CodeVaultKeyExpired               = ErrorCode(policy.ReasonExpired)
	CodeVaultKeyNotYetValid           = ErrorCode(policy.ReasonNotYetValid)
	CodeOperationNotAllowed           = ErrorCode(policy.ReasonOperationNotAllowed)
	CodeCustomerNotAllowed            = ErrorCode(policy.ReasonCustomerNotAllowed)
	CodeAccountNotAllowed             = ErrorCode(policy.ReasonAccountNotAllowed)
	CodeCurrencyNotAllowed            = ErrorCode(policy.ReasonCurrencyNotAllowed)
	CodeAmountUnknown                 = ErrorCode(policy.ReasonAmountUnknown)
	CodeSpendCapExceeded              = ErrorCode(policy.ReasonCapExceeded)
	CodeVelocityExceeded              = ErrorCode(policy.ReasonVelocityExceeded)
	CodeRequestMalformed    ErrorCode = "request_malformed"
	CodeRequestTooLarge     ErrorCode = "request_too_large"
	CodeIdemKeyRequired     ErrorCode = "idempotency_key_required"
	CodeIdemKeyInvalid      ErrorCode = "idempotency_key_invalid"
	CodeIdemKeyReused       ErrorCode = "idempotency_key_reused"
	CodeIdemKeyInUse        ErrorCode = "idempotency_key_in_use"
	CodeIdemOutcomeUnknown  ErrorCode = "idempotency_key_outcome_unknown"
	CodeIdemKeyResolved     ErrorCode = "idempotency_key_resolved" // replayed, never refused: see resolvedAnswer
	CodeUpstreamUnavailable ErrorCode = "upstream_unavailable"
	CodeUpstreamAuthFailed  ErrorCode = "upstream_authentication_failed"
	CodeUpstreamPermission  ErrorCode = "upstream_permission_denied"
	CodeStoreUnavailable    ErrorCode = "store_unavailable"
	CodeInternalError       ErrorCode = "internal_error"
	// Approvals (approval.go).
	CodeApprovalRequired ErrorCode = "approval_required"
	CodeApprovalDeclined ErrorCode = "approval_declined"
	CodeApprovalExpired  ErrorCode = "approval_expired"
)

// codeOf is the error code of a policy refusal reason: the same word; a
// decision without a reason refuses as operation_not_allowed.
func codeOf(r policy.Reason) ErrorCode {
	if r == policy.ReasonNone {
		return CodeOperationNotAllowed
	}
	return ErrorCode(r)
}

// Headers the proxy reads or writes.
const (
	headerRequestID          = "Request-Id"
	headerShouldRetry        = "Stripe-Should-Retry"
	headerRetryAfter         = "Retry-After"
	headerIdempotencyKey     = "Idempotency-Key"
	headerIdempotentReplayed = "Idempotent-Replayed"
	headerOriginalRequest    = "Original-Request"
	headerStripeAccount      = "Stripe-Account"
	headerStripeContext      = "Stripe-Context"
	headerStripeVersion      = "Stripe-Version"
	headerRemainingDaily     = "Keybrake-Remaining-Daily"
	headerRemainingPeriod    = "Keybrake-Remaining-Period"
)

// refusal is a Stripe-shaped answer keybrake gives instead of forwarding (or when
// Stripe cannot be reached). Every step of the pipeline returns one as an error;
// writeStripeError is the one place that turns it into a response.
type refusal struct {
	Status     int
	Type       string
	Code       ErrorCode
	Message    string
	Param      string
	Retry      bool // Stripe-Should-Retry: true (else false)
	RetryAfter int  // seconds; 0 writes no Retry-After
	Detail     keybrakeDetail
	cause      error // logged, never shown
}

// Error implements error.
func (r *refusal) Error() string {
	if r.cause != nil {
		return fmt.Sprintf("%s: %s: %v", r.Code, r.Message, r.cause)
	}
	return string(r.Code) + ": " + r.Message
}

// Unwrap returns the underlying cause, if any.
func (r *refusal) Unwrap() error { return r.cause }

// keybrakeDetail is the "keybrake" member of a refusal body. Money is a decimal
// string in the major unit of Currency.
type keybrakeDetail struct {
	Reason ErrorCode `json:"reason"`
	// Scope names the key or budget whose cap or velocity limit refused.
	Scope     *policy.Scope `json:"scope,omitempty"`
	Count     int           `json:"count,omitempty"`
	Per       string        `json:"per,omitempty"`
	RetryAt   *time.Time    `json:"retry_at,omitempty"`
	Cap       string        `json:"cap,omitempty"`
	Currency  string        `json:"currency,omitempty"`
	Limit     string        `json:"limit,omitempty"`
	Committed string        `json:"committed,omitempty"`
	Held      string        `json:"held,omitempty"`
	Requested string        `json:"requested,omitempty"`
	Remaining string        `json:"remaining,omitempty"`
	ResetAt   *time.Time    `json:"reset_at,omitempty"`
	Field     string        `json:"field,omitempty"`
	Operation string        `json:"operation,omitempty"`
	// Of an approval: its id, when it expires, the amount it holds.
	ApprovalID string     `json:"approval_id,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	Amount     string     `json:"amount,omitempty"`
	RequestID  string     `json:"request_id"`
}

type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Type     string         `json:"type"`
	Code     ErrorCode      `json:"code"`
	Message  string         `json:"message"`
	Param    string         `json:"param,omitempty"`
	Keybrake keybrakeDetail `json:"keybrake"`
}

// refuse builds a refusal with the status and type the error table gives code.
func refuse(code ErrorCode, format string, args ...any) *refusal {
	r := &refusal{Code: code, Message: fmt.Sprintf(format, args...)}
	r.Status, r.Type, r.Retry = statusFor(code)
	return r
}

// statusFor is the error table of docs/proxy-errors.md.
func statusFor(code ErrorCode) (status int, typ string, retry bool) {
	switch code {
	case CodeVaultKeyInvalid, CodeVaultKeyRevoked, CodeVaultKeyExpired:
		return http.StatusUnauthorized, TypeInvalidRequest, false
	case CodeVaultKeyNotYetValid, CodeOperationNotAllowed, CodeCustomerNotAllowed,
		CodeAccountNotAllowed, CodeCurrencyNotAllowed, CodeAmountUnknown:
		return http.StatusForbidden, TypeInvalidRequest, false
	case CodeSpendCapExceeded, CodeApprovalRequired, CodeApprovalDeclined, CodeApprovalExpired:
		return http.StatusPaymentRequired, TypeInvalidRequest, false
	case CodeVelocityExceeded:
		// A count limit: retrying at once is refused again, and an SDK's
		// automatic retries would only burn the caller's attempts, so
		// Stripe-Should-Retry is false; Retry-After says when a slot frees.
		return http.StatusTooManyRequests, TypeRateLimit, false
	case CodeRequestMalformed:
		return http.StatusBadRequest, TypeInvalidRequest, false
	case CodeRequestTooLarge:
		return http.StatusRequestEntityTooLarge, TypeInvalidRequest, false
	case CodeIdemKeyRequired, CodeIdemKeyInvalid:
		return http.StatusBadRequest, TypeIdempotency, false
	case CodeIdemKeyReused:
		return http.StatusUnprocessableEntity, TypeIdempotency, false
	case CodeIdemKeyInUse:
		return http.StatusConflict, TypeIdempotency, true
	case CodeIdemOutcomeUnknown:
		return http.StatusConflict, TypeIdempotency, false
	case CodeUpstreamUnavailable:
		return http.StatusBadGateway, TypeAPI, true
	case CodeUpstreamAuthFailed, CodeUpstreamPermission:
		// Not the caller's key (that is 401 vault_key_*): keybrake's own upstream
		// credential, which only an operator can fix, so SDKs must not retry.
		return http.StatusBadGateway, TypeAPI, false
	case CodeStoreUnavailable:
		return http.StatusServiceUnavailable, TypeAPI, true
	default:
		return http.StatusInternalServerError, TypeAPI, false
	}
}

// malformed is the 400 request_malformed refusal; cause is kept for the log.
func malformed(cause error, format string, args ...any) *refusal {
	r := refuse(CodeRequestMalformed, format, args...)
	r.cause = cause
	return r
}

// reasonRefusal turns a policy refusal reason into its refusal. A cap refusal
// carries the window's figures as decimal strings of currency.
func reasonRefusal(d policy.Decision, currency string) *refusal {
	code := codeOf(d.Reason)
	msg := d.Message
	if msg == "" {
		msg = "The vault key's policy does not allow this request."
	}
	r := refuse(code, "%s", msg)
	r.Detail.Reason = code
	if d.Scope.ID != "" && (d.Reason == policy.ReasonCapExceeded || d.Reason == policy.ReasonVelocityExceeded) {
		sc := d.Scope
		r.Detail.Scope = &sc
	}
	if d.Reason == policy.ReasonVelocityExceeded {
		at := d.RetryAt.UTC()
		r.Detail.Count, r.Detail.Per, r.Detail.RetryAt = d.Velocity.Count, d.Velocity.Per, &at
		r.RetryAfter = retryAfterSeconds(d.RetryAt, d.Now)
	}
	if d.Reason == policy.ReasonCapExceeded {
		reset := d.ResetAt.UTC()
		r.Detail.Cap = string(d.Cap)
		r.Detail.Currency = currency
		r.Detail.Limit = formatMinor(currency, d.Limit)
		r.Detail.Committed = formatMinor(currency, d.Committed)
		r.Detail.Held = formatMinor(currency, d.Held)
		r.Detail.Requested = formatMinor(currency, d.Requested)
		r.Detail.Remaining = formatMinor(currency, d.Remaining)
		if !reset.IsZero() {
			r.Detail.ResetAt = &reset
		}
		if d.Message == "" {
			r.Message = fmt.Sprintf("This request would exceed the vault key's %s spend cap of %s %s (remaining %s %s, requested %s %s).",
				d.Cap, r.Detail.Limit, currency, r.Detail.Remaining, currency, r.Detail.Requested, currency)
		}
	}
	return r
}

// retryAfterSeconds is the Retry-After of a refusal until at, seen at now:
// whole seconds, rounded up, at least 1.
func retryAfterSeconds(at, now time.Time) int {
	d := at.Sub(now)
	secs := int((d + time.Second - 1) / time.Second)
	return max(secs, 1)
}

// formatMinor renders minor units of currency as a decimal string; for a request
// without currency (never metered) it renders the bare integer.
func formatMinor(currency string, minor int64) string {
	if currency == "" {
		return strconv.FormatInt(minor, 10)
	}
	return policy.FormatMinor(currency, minor)
}

// internalError answers a failure of keybrake's own: the generic 500, whose
// text never reaches the caller — or, when the store failed or is closed (a
// PostgreSQL server that is down or restarting, a disk error, a shutdown), the
// 503 store_unavailable. Every step that can fail this way runs before the
// request is forwarded, and a forward waits for its durable hold, so nothing
// was sent to Stripe: a retry with the same idempotency key is safe, and SDKs
// are told to retry.
func internalError(cause error) *refusal {
	if errors.Is(cause, vault.ErrStorage) || errors.Is(cause, vault.ErrClosed) {
		r := refuse(CodeStoreUnavailable, "keybrake cannot reach its store, so the request was not sent to Stripe. "+
			"Retry with the same idempotency key.")
		r.RetryAfter = 1
		r.cause = cause
		return r
	}
	r := refuse(CodeInternalError, "An internal error occurred in keybrake.")
	r.cause = cause
	return r
}

// asRefusal maps any error of the pipeline to the refusal that answers it.
func asRefusal(err error) *refusal {
	var r *refusal
	if errors.As(err, &r) {
		return r
	}
	return internalError(err)
}

// writeStripeError is the one place where the proxy writes a refusal: a Stripe
// error body, Content-Type application/json, a keybrake Request-Id and
// Stripe-Should-Retry. It returns the refusal it wrote (for the log line).
func writeStripeError(w http.ResponseWriter, requestID string, err error) *refusal {
	r := asRefusal(err)
	if r.Detail.Reason == "" {
		r.Detail.Reason = r.Code
	}
	r.Detail.RequestID = requestID
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set(headerRequestID, requestID)
	h.Set(headerShouldRetry, strconv.FormatBool(r.Retry))
	if r.RetryAfter > 0 {
		h.Set(headerRetryAfter, strconv.Itoa(r.RetryAfter))
	}
	h.Del("Content-Length")
	body, mErr := json.Marshal(errorBody{Error: errorObject{
		Type:     r.Type,
		Code:     r.Code,
		Message:  r.Message,
		Param:    r.Param,
		Keybrake: r.Detail,
	}})
	if mErr != nil {
		// Marshalling plain strings cannot fail; keep a valid body regardless.
		body = []byte(`{"error":{"type":"api_error","code":"internal_error","message":"internal error"}}`)
	}
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(r.Status)
	_, _ = w.Write(append(body, '\n'))
	return r
}

// resolvedAnswer is what a retry of a request whose hold an operator resolved
// (vault.Store.ResolveHold) replays: a Stripe-shaped idempotency error that says
// what the operator decided and tells SDKs not to retry. It carries no Stripe
// object, because keybrake never saw one, and, like every error keybrake writes,
// the reason and the id of the request it answers. (Earlier builds stored a
// version of these bytes without reason and request id in the record; such
// records replay them as stored.)
func resolvedAnswer(holdID string, outcome vault.HoldState, requestID string) *vault.StoredResponse {
	verb := "committed (the payment is counted as made)"
	if outcome == vault.HoldReleased {
		verb = "released (the payment is counted as not made)"
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]any{
		"type":    TypeIdempotency,
		"code":    CodeIdemKeyResolved,
		"message": "The outcome of the request made with this idempotency key was unknown and an operator resolved it as " + verb + ". Check the object in Stripe before sending a new request.",
		"keybrake": map[string]any{
			"reason":     CodeIdemKeyResolved,
			"hold_id":    holdID,
			"outcome":    string(outcome),
			"request_id": requestID,
		},
	}})
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(headerShouldRetry, "false")
	return &vault.StoredResponse{Status: http.StatusConflict, Header: h, Body: body}
}

// newRequestID returns a keybrake request id, "req_kb_" and 20 base62 characters.
func newRequestID() string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	var b [20]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error
	const prefix = "req_kb_"
	var out [len(prefix) + len(b)]byte // on the stack: the string is the one allocation
	copy(out[:], prefix)
	for i, c := range b {
		out[len(prefix)+i] = alphabet[int(c)%len(alphabet)]
	}
	return string(out[:])
}
