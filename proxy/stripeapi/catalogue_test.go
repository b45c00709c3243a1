package stripeapi_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// sdkRequest is one request as an SDK put it on the wire.
type sdkRequest struct {
	method, path, contentType, transferEncoding string
	body                                        []byte
}

// MustRecordingServer starts a 127.0.0.1 server that records every request and
// answers with an empty Stripe object, so a real SDK call completes.
func MustRecordingServer(tb testing.TB) (*httptest.Server, func() []sdkRequest) {
	tb.Helper()
	var mu sync.Mutex
	var got []sdkRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		te := ""
		if len(r.TransferEncoding) > 0 {
			te = r.TransferEncoding[0]
		}
		mu.Lock()
		got = append(got, sdkRequest{r.Method, r.URL.EscapedPath(), r.Header.Get("Content-Type"), te, body})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", "req_test")
		_, _ = io.WriteString(w, `{"id":"obj_123"}`)
	}))
	tb.Cleanup(srv.Close)
	return srv, func() []sdkRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]sdkRequest(nil), got...)
	}
}

// TestStripeGoRequests sends real stripe-go v84 calls to a recording server and
// classifies exactly what went over the wire: the SDK's encoding (sorted keys,
// unescaped brackets, "+" for spaces, indexed arrays) must be read as meant.
func TestStripeGoRequests(t *testing.T) {
	t.Parallel()
	srv, recorded := MustRecordingServer(t)
	sc := stripe.NewClient("sk_test_123", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
	ctx := context.Background()

	tests := []struct {
		name string
		call func() error
		want stripeapi.Classification
	}{
		{
			name: "charge create",
			call: func() error {
				p := &stripe.ChargeCreateParams{Amount: stripe.Int64(2000), Currency: stripe.String("usd"), Customer: stripe.String("cus_123"), Description: stripe.String("Order #42 (two words)")}
				p.AddMetadata("order id", "42")
				p.AddExpand("balance_transaction")
				_, err := sc.V1Charges.Create(ctx, p)
				return err
			},
			want: stripeapi.Classification{Operation: "charges.create", Known: true, MovesMoney: true, Direction: stripeapi.DirectionIn, Amount: 2000, Currency: "usd", AmountKnown: true, Customer: "cus_123", Creates: true},
		},
		{
			name: "charge capture without amount",
			call: func() error {
				_, err := sc.V1Charges.Capture(ctx, "ch_3NxAbC", &stripe.ChargeCaptureParams{})
				return err
			},
			want: stripeapi.Classification{Operation: "charges.capture", Known: true, MovesMoney: true, Direction: stripeapi.DirectionIn, Lookup: &stripeapi.Lookup{Path: "/v1/charges/ch_3NxAbC", Field: "amount"}, ObjectID: "ch_3NxAbC", Target: "ch_3NxAbC"},
		},
		{
			name: "payment intent create jpy",
			call: func() error {
				_, err := sc.V1PaymentIntents.Create(ctx, &stripe.PaymentIntentCreateParams{
					Amount: stripe.Int64(1000), Currency: stripe.String("jpy"),
					PaymentMethodTypes: []*string{stripe.String("card"), stripe.String("link")},
				})
				return err
			},
			want: stripeapi.Classification{Operation: "payment_intents.create", Known: true, MovesMoney: true, Direction: stripeapi.DirectionIn, Amount: 1000, Currency: "jpy", AmountKnown: true, Creates: true},
		},
		{
			name: "payment intent increment authorization",
			call: func() error {
				_, err := sc.V1PaymentIntents.IncrementAuthorization(ctx, "pi_123", &stripe.PaymentIntentIncrementAuthorizationParams{Amount: stripe.Int64(3000)})
				return err
			},
			want: stripeapi.Classification{Operation: "payment_intents.increment_authorization", Known: true, MovesMoney: true, Direction: stripeapi.DirectionIn, Amount: 3000, AmountKnown: true, NewTotal: true, Lookup: &stripeapi.Lookup{Path: "/v1/payment_intents/pi_123", Field: "amount"}, ObjectID: "pi_123", Target: "pi_123"},
		},
		{
			name: "refund of a payment intent",
			call: func() error {
				_, err := sc.V1Refunds.Create(ctx, &stripe.RefundCreateParams{PaymentIntent: stripe.String("pi_123")})
				return err
			},
			want: stripeapi.Classification{Operation: "refunds.create", Known: true, MovesMoney: true, Direction: stripeapi.DirectionOut, Lookup: &stripeapi.Lookup{Path: "/v1/payment_intents/pi_123", Field: "amount_received"}},
		},
		{
			name: "invoice item with price data",
			call: func() error {
				_, err := sc.V1InvoiceItems.Create(ctx, &stripe.InvoiceItemCreateParams{
					Customer: stripe.String("cus_123"), Currency: stripe.String("kwd"), Quantity: stripe.Int64(3),
					PriceData: &stripe.InvoiceItemCreatePriceDataParams{Currency: stripe.String("kwd"), Product: stripe.String("prod_1"), UnitAmount: stripe.Int64(1250)},
				})
				return err
			},
			want: stripeapi.Classification{Operation: "invoiceitems.create", Known: true, MovesMoney: true, Direction: stripeapi.DirectionIn, Amount: 3750, Currency: "kwd", AmountKnown: true, Customer: "cus_123", Creates: true},
		},
		{
			name: "invoice item with unit_amount_decimal",
			call: func() error {
				_, err := sc.V1InvoiceItems.Create(ctx, &stripe.InvoiceItemCreateParams{
					Customer: stripe.String("cus_123"), Currency: stripe.String("isk"), Quantity: stripe.Int64(2),
					UnitAmountDecimal: stripe.Float64(50000),
				})
				return err
			},
			want: stripeapi.Classification{Operation: "invoiceitems.create", Known: true, MovesMoney: true, Direction: stripeapi.DirectionIn, Amount: 100000, Currency: "isk", AmountKnown: true, Customer: "cus_123", Creates: true},
		},
		{
			name: "checkout session with price data",
			call: func() error {
				_, err := sc.V1CheckoutSessions.Create(ctx, &stripe.CheckoutSessionCreateParams{
					Mode:       stripe.String("payment"),
					SuccessURL: stripe.String("https://example.com/ok?session={CHECKOUT_SESSION_ID}"),
					LineItems: []*stripe.CheckoutSessionCreateLineItemParams{
						{Quantity: stripe.Int64(2), PriceData: &stripe.CheckoutSessionCreateLineItemPriceDataParams{Currency: stripe.String("usd"), UnitAmount: stripe.Int64(2000), ProductData: &stripe.CheckoutSessionCreateLineItemPriceDataProductDataParams{Name: stripe.String("T-shirt & cap")}}},
						{Quantity: stripe.Int64(1), PriceData: &stripe.CheckoutSessionCreateLineItemPriceDataParams{Currency: stripe.String("usd"), UnitAmount: stripe.Int64(500), ProductData: &stripe.CheckoutSessionCreateLineItemPriceDataProductDataParams{Name: stripe.String("Sticker")}}},
					},
				})
				return err
			},
			want: stripeapi.Classification{Operation: "checkout.sessions.create", Known: true, MovesMoney: true, Direction: stripeapi.DirectionIn, Amount: 4500, Currency: "usd", AmountKnown: true, Creates: true},
		},
		{
			name: "invoice pay",
			call: func() error {
				_, err := sc.V1Invoices.Pay(ctx, "in_123", &stripe.InvoicePayParams{})
				return err
			},
			want: stripeapi.Classification{Operation: "invoices.pay", Known: true, MovesMoney: true, Direction: stripeapi.DirectionIn, Lookup: &stripeapi.Lookup{Path: "/v1/invoices/in_123", Field: "amount_remaining"}, ObjectID: "in_123", Target: "in_123"},
		},
		{
			name: "customer read",
			call: func() error {
				_, err := sc.V1Customers.Retrieve(ctx, "cus_123", nil)
				return err
			},
			want: stripeapi.Classification{Operation: "customers.read", Known: true, Customer: "cus_123", ObjectID: "cus_123"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(recorded())
			require.NoError(t, tc.call())
			all := recorded()
			require.Len(t, all, before+1)
			req := all[before]
			if req.method == http.MethodPost {
				assert.Equal(t, "application/x-www-form-urlencoded", req.contentType)
			}
			p, err := stripeapi.ParseForm(req.body)
			require.NoError(t, err, "stripe-go body %q", req.body)
			got, err := stripeapi.Classify(req.method, req.path, p)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got, "body %q", req.body)
		})
	}
}

func TestOperationsAndRoutes(t *testing.T) {
	t.Parallel()
	ops := stripeapi.Operations()
	require.NotEmpty(t, ops)
	assert.IsIncreasing(t, ops)
	routes := stripeapi.Routes()
	seen := map[string]bool{}
	for _, rt := range routes {
		key := rt.Method + " " + rt.Path
		assert.False(t, seen[key], "route %s listed twice", key)
		seen[key] = true
		assert.Contains(t, ops, rt.Operation)
		assert.Equal(t, rt.MovesMoney, rt.Direction != stripeapi.DirectionNone, key)
	}
	for _, op := range []string{"charges.create", "refunds.create", "checkout.sessions.create", "invoices.pay"} {
		assert.Contains(t, ops, op)
	}
}
