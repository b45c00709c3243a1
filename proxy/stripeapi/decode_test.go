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
