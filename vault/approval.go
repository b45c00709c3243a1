package vault

import (
	"strings"
	"time"
)

// ApprovalState is the state of an approval: the decision a person makes on a
// held request before it may be forwarded.
type ApprovalState string

// Approval states. A pending approval's request is held (its amount counts
// against every cap) and not forwarded; approved, it waits for the caller's
// retry, which forwards it (used); declined or expired, its hold is released.
const (
	ApprovalPending  ApprovalState = "pending"
	ApprovalApproved ApprovalState = "approved"
	ApprovalDeclined ApprovalState = "declined"
	ApprovalExpired  ApprovalState = "expired"
	ApprovalUsed     ApprovalState = "used"
)

// Open reports whether the approval still holds money and waits for someone:
// a person's decision (pending) or the caller's retry (approved).
func (s ApprovalState) Open() bool { return s == ApprovalPending || s == ApprovalApproved }

// Valid reports whether s is one of the approval states.
func (s ApprovalState) Valid() bool {
	switch s {
	case ApprovalPending, ApprovalApproved, ApprovalDeclined, ApprovalExpired, ApprovalUsed:
		return true
	}
	return false
}

// MaxApprovalReason is the longest reason a caller may give for a request
// that needs approval (Keybrake-Approval-Reason), in bytes.
const MaxApprovalReason = 500

// Param is one parameter of a request, as the approver sees it (card and bank
// fields masked).
type Param struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// ApprovalAsk is what the proxy tells the store about a money request in case
// its key's policy makes it wait for a person: why the caller says it is made,
// and its parameters with every card and bank field masked. The store decides
// whether it needs approval, in the transaction that holds its amount.
type ApprovalAsk struct {
	Reason string
	Params []Param
}

// Approval is a person's decision on one held request (see ApprovalState). It
// belongs to the idempotency record of (KeyID, IdempotencyKey) and to its hold.
type Approval struct {
	ID             string // "apr_" + 26 chars, sortable by creation time
	KeyID          string
	KeyName        string
	IdempotencyKey string
	HoldID         string
	Operation      string
	Amount         int64 // minor units held
	Currency       string
	Customer       string
	Account        string // Stripe-Account / Stripe-Context, "" for the platform
	Reason         string // the caller's, at most MaxApprovalReason bytes
	Params         []Param
	State          ApprovalState
	Timeout        time.Duration
	CreatedAt      time.Time
	// ExpiresAt is when a pending approval expires undecided, or, once
	// approved, when it expires unless the caller retried.
	ExpiresAt time.Time
	DecidedAt time.Time // zero until approved or declined
	DecidedBy string    // the admin's JWT sub
	Note      string    // the admin's note
	UsedAt    time.Time // when the approved request was forwarded
}

// ApprovalFilter selects approvals: State "" for every state, KeyID "" for
// every key. Limit defaults to 50, max 500; Cursor is the previous page's next.
type ApprovalFilter struct {
	State  ApprovalState
	KeyID  string
	Limit  int
	Cursor string
}

// MaskParam reports the value an approver may see of the request parameter
// name: card numbers, security codes, bank account and routing numbers and
// the like are replaced by their last four characters at most.
func MaskParam(name, value string) string {
	n := strings.ToLower(name)
	for _, s := range maskedParamWords {
		if strings.Contains(n, s) {
			if len(value) > 8 {
				return "••••" + value[len(value)-4:]
			}
			return "••••"
		}
	}
	return value
}

// maskedParamWords are the parts of a parameter name whose values are masked.
var maskedParamWords = []string{
	"card[", "number", "cvc", "exp_month", "exp_year", "account_number", "routing_number",
	"iban", "bsb_number", "sort_code", "bank_account", "sepa_debit", "au_becs_debit",
	"bacs_debit", "acss_debit", "us_bank_account", "token", "secret", "ssn", "id_number",
	"tax_id", "password",
}
