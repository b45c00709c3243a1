package stripeapi_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// FuzzDecodeObject holds DecodeObject to what json.Unmarshal into an Object
// gives, for any input: nil for what is not a JSON object, else the same
// members with the same raw values; and Object.Get, for any raw value, to
// what json.Unmarshal into a string gives.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { } `, `null`, `[]`, `"x"`, `12`, `{"a":1}`, `{"a":1,"a":2}`, `{`, `{"a":1}x`, `{"a" : [1, "]", {"b":"}"}] , "c":null}`,
		"{\"id\":\"ch_1\",\"object\":\"charge\",\"amount\":100,\"paid\":true,\"metadata\":{},\"refunds\":{\"data\":[]}}",
		`{"\u0069d":"ch_1","a\"b":"c\\"}`, "{\"\xff\":1}", `{"a":"\ud800"}`, `{"a":-1.5e+3,"b":false,"c":true}`,
		"\t{\"a\"\n:\r\"x\" }\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var want stripeapi.Object
		if json.Unmarshal(body, &want) != nil {
			want = nil
		}
		if got := stripeapi.DecodeObject(body); !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodeObject(%q) = %q, json.Unmarshal gives %q", body, got, want)
		}
		var s string
		_ = json.Unmarshal(body, &s)
		if got := (stripeapi.Object{"f": body}).Get("f"); got != s {
			t.Fatalf("Get of %q = %q, json.Unmarshal gives %q", body, got, s)
		}
	})
}

// BenchmarkDecodeObject decodes a charge as Stripe answers one (its top-level
// members; the nested objects stay raw).
func BenchmarkDecodeObject(b *testing.B) {
	body := []byte(`{"id":"ch_3MmlLrLkdIwHu7ix0snN0B15","object":"charge","amount":1099,"amount_captured":1099,` +
		`"amount_refunded":0,"application":null,"application_fee":null,"application_fee_amount":null,` +
		`"balance_transaction":"txn_3MmlLrLkdIwHu7ix0uke3Ezy","billing_details":{"address":{"city":null,"country":null,` +
		`"line1":null,"line2":null,"postal_code":null,"state":null},"email":null,"name":null,"phone":null},` +
		`"calculated_statement_descriptor":"Stripe","captured":true,"created":1679090539,"currency":"usd",` +
		`"customer":null,"description":null,"disputed":false,"failure_balance_transaction":null,"failure_code":null,` +
		`"failure_message":null,"fraud_details":{},"invoice":null,"livemode":false,"metadata":{},"on_behalf_of":null,` +
		`"outcome":{"network_status":"approved_by_network","reason":null,"risk_level":"normal","risk_score":32,` +
		`"seller_message":"Payment complete.","type":"authorized"},"paid":true,"payment_intent":null,` +
		`"payment_method":"card_1MmlLrLkdIwHu7ixIJwEWSNR","receipt_email":null,"receipt_number":null,` +
		`"receipt_url":"https://pay.stripe.com/receipts/x","refunded":false,"review":null,"shipping":null,` +
		`"source_transfer":null,"statement_descriptor":null,"statement_descriptor_suffix":null,"status":"succeeded",` +
		`"transfer_data":null,"transfer_group":null}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if o := stripeapi.DecodeObject(body); o.Get("id") == "" {
			b.Fatal("no id")
		}
	}
}
