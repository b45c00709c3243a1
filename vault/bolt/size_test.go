package bolt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// What a metered request leaves in the database, by how long it stays
// (docs/operations.md, "Size of the database", documents them): its idempotency record with
// the stored answer, for the idempotency TTL; the record of its money object,
// for vault.ObjectRetention; its ledger events, for the ledger retention. They
// include the B+tree's share (pages filled to 50–100 %, branch pages, free
// pages waiting for reuse), measured with the ~3 KB answers below.
const (
	sizePerRecord = 3072 // bytes per request for the idempotency TTL
	sizePerObject = 384  // bytes per request for vault.ObjectRetention
	sizePerEvents = 768  // bytes per request for the ledger retention
	// sizeBase is the database without traffic, and what a retention cannot
	// bound: keys, counters, the B+trees' roots, bbolt's meta and freelist.
	sizeBase = 1 << 20
	// allocStep is how far bbolt grows the file ahead of its last page once
	// the file is mapped beyond it (bbolt's default AllocSize).
	allocStep = 16 << 20 // bbolt's DefaultAllocSize
)

// sizeBound is the most a database may hold after elapsed of traffic at rate
// requests per hour, with the given ledger retention and idempotency TTL.
func sizeBound(rate int, elapsed, ttl, ledger time.Duration) int64 {
	kept := func(retention time.Duration) int64 {
		return int64(float64(rate) * min(elapsed, retention).Hours())
	}
	return sizeBase + kept(ttl)*sizePerRecord + kept(vault.ObjectRetention)*sizePerObject + kept(ledger)*sizePerEvents
}

// chargeAnswer is a Stripe charge of about 3 KB, its ids random so that it
// compresses no better than a real one.
func chargeAnswer(id string) []byte {
	noise := make([]byte, 400)
	_, _ = rand.Read(noise)
	return fmt.Appendf(nil, `{"id":%q,"object":"charge","amount":1200,"amount_captured":1200,"amount_refunded":0,`+
		`"balance_transaction":"txn_%s","billing_details":{"address":{"city":null,"country":"US","line1":null,"line2":null,`+
		`"postal_code":"94103","state":null},"email":"jenny.rosen@example.com","name":"Jenny Rosen","phone":null},`+
		`"calculated_statement_descriptor":"KEYBRAKE","captured":true,"created":1760000000,"currency":"usd",`+
		`"customer":"cus_%s","description":"Usage for September","disputed":false,"fraud_details":{},`+
		`"livemode":false,"metadata":{"order":"%s"},"outcome":{"network_status":"approved_by_network","reason":null,`+
		`"risk_level":"normal","risk_score":32,"seller_message":"Payment complete.","type":"authorized"},"paid":true,`+
		`"payment_intent":"pi_%s","payment_method":"pm_%s","payment_method_details":{"card":{"brand":"visa",`+
		`"checks":{"address_line1_check":null,"address_postal_code_check":"pass","cvc_check":"pass"},"country":"US",`+
		`"exp_month":8,"exp_year":2030,"fingerprint":"%s","funding":"credit","last4":"4242","network":"visa"},"type":"card"},`+
		`"receipt_url":"https://pay.stripe.com/receipts/payment/%s","refunded":false,"refunds":{"object":"list","data":[],`+
		`"has_more":false,"total_count":0,"url":"/v1/charges/%s/refunds"},"status":"succeeded"}`,
		id, hex.EncodeToString(noise[:24]), hex.EncodeToString(noise[24:40]), hex.EncodeToString(noise[40:56]),
		hex.EncodeToString(noise[56:80]), hex.EncodeToString(noise[80:104]), hex.EncodeToString(noise[104:112]),
		hex.EncodeToString(noise[112:400]), id)
}

// TestSizeBoundedOverASimulatedMonth: under a steady load, with the reaper
// running every simulated hour, the database holds no more than each
// request's share (sizePerRecord, sizePerObject, sizePerEvents) for as long as
// its retention keeps it: the file stops growing once the retentions are
// reached, whatever the number of requests. The default is short (2,304
// requests over 8 simulated days, a ledger retention of 3 days: five days
// past the last retention it reaches, at a rate that fills more than a third
// of the bound, which the end checks);
// KEYBRAKE_LONG=1 runs 45 days at 100 requests an hour with a retention of 14
// days (108,000 requests), past every retention: the file stops growing on
// day 35, when the first money objects go.
func TestSizeBoundedOverASimulatedMonth(t *testing.T) {
	t.Parallel()
	days, rate, ledger := 8, 12, 3*24*time.Hour
	if os.Getenv("KEYBRAKE_LONG") != "" {
		days, rate, ledger = 45, 100, 14*24*time.Hour
	}
	const ttl = vault.DefaultIdempotencyTTL
	ctx := context.Background()
	clock := vaulttest.NewClock(vaulttest.T0)
	s, path := MustOpen(t, clock, func(o *Options) { o.LedgerRetention = ledger })
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	p := vaulttest.Policy(t, "1000000.00", "", "")
	p.ExpiresAt = vaulttest.T0.AddDate(1, 0, 0)
	k, _ := vaulttest.MustMint(t, s, "steady", p, nil)

	charge := func(n int) {
		idem := fmt.Sprintf("charge-%d", n)
		chargeID := fmt.Sprintf("ch_%024d", n)
		vaulttest.MustReserve(t, s, vaulttest.Charge(k.ID, idem, 1200))
		vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: idem, Outcome: vault.SettleCommit,
			Amount: 1200, UpstreamStatus: http.StatusOK, StripeRequestID: "req_" + chargeID[3:], ObjectID: chargeID,
			Object: vault.ObjectSettle{Created: true, Expose: true, Terminal: true, Moved: 1200, MovedKnown: true},
			Response: &vault.StoredResponse{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
				Body: chargeAnswer(chargeID)}})
	}
	// highWater is the end of the database's last page in use: the file is
	// that, plus bbolt's allocation step at most.
	highWater := func() int64 {
		var n int64
		require.NoError(t, s.db.View(func(tx *bbolt.Tx) error { n = tx.Size(); return nil }))
		return n
	}

	const workers = 6
	n := 0
	var peakData, peakFile int64
	// The file's size does not depend on when its pages reach the disk: the
	// simulated month commits without waiting for it (see unsynced).
	unsynced(t, s, func() {
		for hour := 1; hour <= days*24; hour++ {
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := w; i < rate; i += workers {
						charge(n + i)
					}
				})
			}
			wg.Wait()
			n += rate
			clock.Advance(time.Hour)
			_, err := s.Reap(ctx)
			require.NoError(t, err)

			data := highWater()
			file, err := s.Size(ctx)
			require.NoError(t, err)
			peakData, peakFile = max(peakData, data), max(peakFile, file)
			bound := sizeBound(rate, time.Duration(hour)*time.Hour, ttl, ledger)
			if hour%24 == 0 {
				t.Logf("day %2d: %6d requests, data %6.2f MiB, file %6.2f MiB, bound %6.2f MiB (+ %d MiB allocation step for the file)",
					hour/24, n, mib(data), mib(file), mib(bound), allocStep>>20)
			}
			require.LessOrEqual(t, data, bound, "hour %d: the data outgrew what the retentions keep", hour)
			require.LessOrEqual(t, file, bound+allocStep, "hour %d: the file outgrew what the retentions keep", hour)
		}
	})
	// The retentions' bound is not loose: most of it is used.
	assert.Greater(t, peakData, sizeBound(rate, time.Duration(days)*24*time.Hour, ttl, ledger)/3)
	require.NoError(t, s.CheckInvariant(ctx))
	_, period := usageOf(t, s, k.ID)
	assert.Equal(t, int64(n)*1200, period.Committed, "every charge is counted, its events reaped or not")
	t.Logf("%d requests over %d simulated days: peak data %.2f MiB, peak file %.2f MiB (%s)", n, days, mib(peakData), mib(peakFile), path)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
