package vault

import (
	"context"
	"time"
)

// The types of the events keybrake sends to webhook endpoints. Each is
// written to the outbox in the transaction that caused it (see EmitEvent in
// the engine), so a crash neither loses one nor invents one.
const (
	EventThresholdCrossed    = "budget.threshold_crossed"
	EventSpendCapRefused     = "spend_cap.refused"
	EventVelocityRefused     = "velocity.refused"
	EventHoldUnknown         = "hold.unknown"
	EventApprovalPending     = "approval.pending"
	EventApprovalDecided     = "approval.decided"
	EventRaiseRequestCreated = "raise_request.created"
	EventRaiseRequestDecided = "raise_request.decided"
	EventUpstreamAuthFailed  = "upstream.auth_failed"
	EventRenewalPaused       = "renewal.paused"
	EventKeyExpiring         = "key.expiring"
	EventWebhookTest         = "webhook.test"
	EventAll                 = "*"
)

// EventTypes lists every event type an endpoint may subscribe to.
func EventTypes() []string {
	return []string{
		EventThresholdCrossed, EventSpendCapRefused, EventVelocityRefused, EventHoldUnknown,
		EventApprovalPending, EventApprovalDecided, EventRaiseRequestCreated, EventRaiseRequestDecided,
		EventUpstreamAuthFailed, EventRenewalPaused, EventKeyExpiring, EventWebhookTest,
	}
}

// KnownEventType reports whether t is one of EventTypes or "*".
func KnownEventType(t string) bool {
	if t == EventAll {
		return true
	}
	for _, k := range EventTypes() {
		if k == t {
			return true
		}
	}
	return false
}

// WebhookStatus says whether an endpoint receives deliveries.
type WebhookStatus string

// The states of an endpoint: disabled by an operator, or by keybrake when
// the endpoint answered 410 Gone.
const (
	WebhookEnabled  WebhookStatus = "enabled"
	WebhookDisabled WebhookStatus = "disabled"
)

// Webhook is an operator's endpoint that receives signed events. Its secret is
// sealed in the store and shown only when it is created or rotated.
type Webhook struct {
	ID             string        `json:"id"`
	URL            string        `json:"url"`
	Events         []string      `json:"events"`
	Thresholds     []int         `json:"thresholds"`
	Description    string        `json:"description,omitempty"`
	Status         WebhookStatus `json:"status"`
	DisabledReason string        `json:"disabled_reason,omitempty"`
	// SecretLast4 is the end of the current secret, to tell secrets apart.
	SecretLast4 string `json:"secret_last4"`
	// PreviousSecretUntil is when the secret replaced by the last rotation
	// stops signing; zero when none signs beside the current one.
	PreviousSecretUntil time.Time `json:"previous_secret_until,omitzero"`
	Version             uint64    `json:"version"`
	CreatedAt           time.Time `json:"created_at"`
	UpdatedAt           time.Time `json:"updated_at"`
}

// Subscribes reports whether the endpoint takes events of type t.
func (w *Webhook) Subscribes(t string) bool {
	for _, e := range w.Events {
		if e == t || e == EventAll {
			return true
		}
	}
	return t == EventWebhookTest
}

// WebhookInput is a new endpoint.
type WebhookInput struct {
	URL         string
	Events      []string
	Thresholds  []int
	Description string
}

// WebhookChange is a change to an endpoint; nil fields stay as they are.
type WebhookChange struct {
	URL         *string
	Events      *[]string
	Thresholds  *[]int
	Description *string
	// Status enables or disables the endpoint.
	Status *WebhookStatus
	// IfVersion, when not 0, is the Webhook.Version the change was made
	// against: another version is ErrPrecondition.
	IfVersion uint64
}

// DeliveryState is where one event's delivery to one endpoint stands.
type DeliveryState string

// The states of a delivery: pending (waiting for its next attempt, or being
// attempted under a lease), delivered (a 2xx answer), failed (every attempt
// failed, the endpoint answered 410, or it was disabled or deleted).
const (
	DeliveryPending   DeliveryState = "pending"
	DeliveryDelivered DeliveryState = "delivered"
	DeliveryFailed    DeliveryState = "failed"
)

// Delivery is one event's delivery to one endpoint, with its last attempt.
type Delivery struct {
	ID            string        `json:"id"`
	WebhookID     string        `json:"webhook_id"`
	EventID       string        `json:"event_id"`
	EventType     string        `json:"event_type"`
	State         DeliveryState `json:"state"`
	Attempts      int           `json:"attempts"`
	NextAttemptAt time.Time     `json:"next_attempt_at,omitzero"`
	LastAttemptAt time.Time     `json:"last_attempt_at,omitzero"`
	LastStatus    int           `json:"last_status,omitempty"`
	LastError     string        `json:"last_error,omitempty"`
	CreatedAt     time.Time     `json:"created_at"`
	DoneAt        time.Time     `json:"done_at,omitzero"`
}

// DeliveryJob is a delivery claimed under a lease for one attempt: what the
// deliverer sends and how it signs it.
type DeliveryJob struct {
	Delivery
	URL string
	// Secrets sign the attempt: the current secret, and the previous one
	// while it still signs (whsec_… form).
	Secrets []string
	// Body is the event as it is sent, the same on every attempt.
	Body []byte
	// Attempt numbers this attempt from 1; FinishDelivery checks it still
	// holds the lease.
	Attempt int
}

// DeliveryResult is the outcome of one attempt: the endpoint's status (0 when
// none came) and, when it failed, why.
type DeliveryResult struct {
	Status int
	Err    string
}

// WebhookStore is the part of the store contract for webhooks out: the
// endpoints, their outbox and the delivery log. Errors: ErrNotFound (no such
// endpoint or delivery), ErrInvalid (bad input), ErrPrecondition (a stale
// IfVersion), ErrConflict (a retry of a delivery that is not failed).
type WebhookStore interface {
	// CreateWebhook adds an endpoint and returns it with its secret, shown
	// only here.
	CreateWebhook(ctx context.Context, actor string, in WebhookInput) (Webhook, string, error)
	// ListWebhooks lists every endpoint, oldest first.
	ListWebhooks(ctx context.Context) ([]Webhook, error)
	// GetWebhook returns one endpoint.
	GetWebhook(ctx context.Context, id string) (Webhook, error)
	// PatchWebhook applies change in one transaction.
	PatchWebhook(ctx context.Context, actor, id string, change WebhookChange) (Webhook, error)
	// DeleteWebhook removes an endpoint; its pending deliveries fail.
	DeleteWebhook(ctx context.Context, actor, id string) error
	// RotateWebhookSecret gives the endpoint a new secret (returned, shown
	// only here); the old one keeps signing beside it for 24 hours.
	RotateWebhookSecret(ctx context.Context, actor, id string) (Webhook, string, error)
	// TestWebhook queues a webhook.test event for the endpoint.
	TestWebhook(ctx context.Context, actor, id string) (Delivery, error)
	// ListDeliveries lists an endpoint's deliveries, newest first.
	ListDeliveries(ctx context.Context, webhookID string, limit int, cursor string) ([]Delivery, string, error)
	// RetryDelivery makes a failed delivery pending again, due now.
	RetryDelivery(ctx context.Context, actor, webhookID, deliveryID string) (Delivery, error)
	// ClaimDeliveries claims up to limit due deliveries for one attempt each,
	// under a lease: no other caller (another replica) claims them again
	// before the lease ends or FinishDelivery records the attempt.
	ClaimDeliveries(ctx context.Context, limit int, lease time.Duration) ([]DeliveryJob, error)
	// FinishDelivery records the outcome of a claimed attempt and schedules
	// the next one; an attempt whose lease was taken over changes nothing.
	FinishDelivery(ctx context.Context, job DeliveryJob, res DeliveryResult) error
	// NextDeliveryAt is when the earliest pending delivery is due (zero when
	// none is), for a deliverer that sleeps until then.
	NextDeliveryAt(ctx context.Context) (time.Time, error)
	// NoticeExpiringKeys emits key.expiring for every active key that
	// expires within 7 days or within 1 day, once each; it returns how many
	// events it wrote.
	NoticeExpiringKeys(ctx context.Context) (int, error)
	// NoticeUpstreamAuthFailed emits upstream.auth_failed for Stripe's
	// refusal (status 401 or 403) of the upstream's secret, at most once per
	// upstream and hour.
	NoticeUpstreamAuthFailed(ctx context.Context, upstream string, status int, keyID, operation string) error
	// PruneDeliveries removes the deliveries done (delivered or failed)
	// longer ago than the ledger retention, and the once-marks whose window
	// has ended; it returns how many entries it removed.
	PruneDeliveries(ctx context.Context) (int, error)
}
