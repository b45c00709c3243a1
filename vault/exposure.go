package vault

// Exposure is what a key has counted for one Stripe money object.
type Exposure struct {
	// Held is the object's live exposure: counted as held on the windows where it
	// was placed until the money moves (committed) or Stripe's answer proves it
	// cannot (released).
	Held int64
	// Committed is the money committed for the object through the key.
	Committed int64
	// Moved is the object's cumulative money moved as Stripe last reported it to
	// this key; MovedSeen is false when no answer reported it.
	Moved     int64
	MovedSeen bool
	// Own is true when a request of this key created the object.
	Own bool
	// Closed is true when an answer proved the object can move no more money.
	Closed bool
	// StripeAccount and StripeContext are the Stripe-Account and Stripe-Context
	// headers of the last request whose answer settled the object ("" for the
	// platform account): Stripe shows the object under them, so a lookup of it
	// sends them too.
	StripeAccount string
	StripeContext string
}

// Observation is what a Stripe answer that was not a metered request's own (a
// read, a cancel, an expiry, a deletion) shows of a money object.
type Observation struct {
	// Operation names the request that saw it, for the ledger.
	Operation string
	// Moved is the object's cumulative money moved (MovedKnown false when the
	// answer does not say).
	Moved      int64
	MovedKnown bool
	// Terminal is true when the answer proves the object can move no more money
	// (a cancelled PaymentIntent, an expired Checkout Session, a voided invoice, a
	// deleted invoice item).
	Terminal bool
}
