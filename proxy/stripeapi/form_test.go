package stripeapi_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// MustParseForm parses body or fails the test.
func MustParseForm(tb testing.TB, body string) *stripeapi.Params {
	tb.Helper()
	p, err := stripeapi.ParseForm([]byte(body))
	require.NoError(tb, err, "body %q", body)
	return p
}

func TestParseFormAccepts(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		body string
		want []stripeapi.Pair // in body order
	}{
		"empty body": {body: "", want: nil},
		"plain pairs": {
			body: "amount=100&currency=usd",
			want: []stripeapi.Pair{{Key: "amount", Value: "100"}, {Key: "currency", Value: "usd"}},
		},
		"plus and %20 are spaces": {
			body: "description=Two+words&statement_descriptor=Three%20more%20words",
			want: []stripeapi.Pair{{Key: "description", Value: "Two words"}, {Key: "statement_descriptor", Value: "Three more words"}},
		},
		"encoded plus is a plus": {
			body: "description=1%2B1",
			want: []stripeapi.Pair{{Key: "description", Value: "1+1"}},
		},
		"nested hash": {
			body: "metadata[order_id]=42&metadata[billing_period]=2026-09",
			want: []stripeapi.Pair{{Key: "metadata[order_id]", Value: "42"}, {Key: "metadata[billing_period]", Value: "2026-09"}},
		},
		"percent-encoded brackets": {
			body: "metadata%5Border_id%5D=42&line_items%5b0%5d%5bquantity%5d=2",
			want: []stripeapi.Pair{{Key: "metadata[order_id]", Value: "42"}, {Key: "line_items[0][quantity]", Value: "2"}},
		},
		"deep nesting": {
			body: "line_items[0][price_data][product_data][metadata][sku]=A-1",
			want: []stripeapi.Pair{{Key: "line_items[0][price_data][product_data][metadata][sku]", Value: "A-1"}},
		},
		"array append repeats": {
			body: "expand[]=customer&expand[]=latest_charge&expand[]=customer",
			want: []stripeapi.Pair{{Key: "expand[]", Value: "customer"}, {Key: "expand[]", Value: "latest_charge"}, {Key: "expand[]", Value: "customer"}},
		},
		"indexed array": {
			body: "expand[0]=customer&expand[1]=latest_charge",
			want: []stripeapi.Pair{{Key: "expand[0]", Value: "customer"}, {Key: "expand[1]", Value: "latest_charge"}},
		},
		"empty value": {
			body: "description=",
			want: []stripeapi.Pair{{Key: "description", Value: ""}},
		},
		"equals sign in value": {
			body: "description=a=b",
			want: []stripeapi.Pair{{Key: "description", Value: "a=b"}},
		},
		"unicode value raw and encoded": {
			body: "description=caf%C3%A9&name=café",
			want: []stripeapi.Pair{{Key: "description", Value: "café"}, {Key: "name", Value: "café"}},
		},
		"newline and tab in value": {
			body: "description=line1%0Aline2%09end%0D",
			want: []stripeapi.Pair{{Key: "description", Value: "line1\nline2\tend\r"}},
		},
		"space inside a metadata key": {
			body: "metadata[my+key]=v",
			want: []stripeapi.Pair{{Key: "metadata[my key]", Value: "v"}},
		},
		"zero index": {
			body: "items[0][price]=price_1",
			want: []stripeapi.Pair{{Key: "items[0][price]", Value: "price_1"}},
		},
		"sixteen levels": {
			body: "a[b][c][d][e][f][g][h][i][j][k][l][m][n][o][p]=1",
			want: []stripeapi.Pair{{Key: "a[b][c][d][e][f][g][h][i][j][k][l][m][n][o][p]", Value: "1"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := stripeapi.ParseForm([]byte(tc.body))
			require.NoError(t, err)
			assert.Equal(t, tc.want, p.Pairs())
			assert.Equal(t, len(tc.want), p.Len())
		})
	}
}

func TestParseFormRefuses(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"duplicate scalar same value":         "amount=100&amount=100",
		"duplicate scalar other value":        "amount=100&amount=100000",
		"duplicate after decoding":            "amount=100&%61mount=5",
		"duplicate bracket encodings":         "metadata[k]=a&metadata%5Bk%5D=b",
		"duplicate nested":                    "metadata[k]=a&metadata[k]=b",
		"scalar then container":               "amount=1&amount[x]=2",
		"container then scalar":               "amount[x]=2&amount=1",
		"scalar then array":                   "expand=a&expand[]=b",
		"array then scalar":                   "expand[]=a&expand=b",
		"array then hash":                     "expand[]=a&expand[0]=b",
		"hash then array":                     "expand[0]=a&expand[]=b",
		"nesting after array":                 "a[][b]=1",
		"unbalanced open":                     "a[b=1",
		"unbalanced close":                    "a]=1",
		"close inside segment":                "a[b]]=1",
		"open inside segment":                 "a[b[c]=1",
		"text after bracket":                  "a[b]c=1",
		"empty name with brackets":            "[x]=1",
		"empty key":                           "=1",
		"empty segment in the middle":         "a[][]=1",
		"pair without equals":                 "amount",
		"empty pair":                          "a=1&&b=2",
		"leading ampersand":                   "&a=1",
		"trailing ampersand":                  "a=1&",
		"invalid percent":                     "a=%zz",
		"truncated percent":                   "a=%4",
		"percent at end":                      "a=%",
		"invalid percent in key":              "a%G1=1",
		"invalid UTF-8 encoded":               "a=%ff",
		"invalid UTF-8 raw":                   "a=\xff",
		"NUL in value":                        "a=%00",
		"NUL in key":                          "a%00=1",
		"control character in value":          "a=%07",
		"DEL in value":                        "a=%7F",
		"C1 control in value":                 "a=%C2%85",
		"newline in key":                      "a%0A=1",
		"raw newline":                         "a=1\n",
		"raw tab":                             "a=\t1",
		"raw space":                           "a=1& b=2",
		"raw semicolon":                       "a=1;b=2",
		"leading space in key":                "+amount=1",
		"trailing space in segment":           "metadata[k+]=1",
		"leading zero index":                  "items[01][price]=p",
		"double zero index":                   "items[00]=p",
		"seventeen levels":                    "a[b][c][d][e][f][g][h][i][j][k][l][m][n][o][p][q]=1",
		"array at seventeenth level":          "a[b][c][d][e][f][g][h][i][j][k][l][m][n][o][p][]=1",
		"encoded bracket makes it unbalanced": "metadata[a%5Bb]=1",
	}
	for name, body := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := stripeapi.ParseForm([]byte(body))
			require.Error(t, err)
			assert.ErrorIs(t, err, stripeapi.ErrMalformed)
			assert.Nil(t, p)
		})
	}
}

func TestParamsLookups(t *testing.T) {
	t.Parallel()
	p := MustParseForm(t, "amount=100&metadata[k]=v&expand[]=a&expand[]=b&line_items[1][quantity]=2&line_items[0][quantity]=1")

	got, ok := p.Get("amount")
	assert.True(t, ok)
	assert.Equal(t, "100", got)
	got, ok = p.Get("metadata[k]")
	assert.True(t, ok)
	assert.Equal(t, "v", got)
	_, ok = p.Get("metadata")
	assert.False(t, ok, "a hash is not a scalar")
	_, ok = p.Get("expand")
	assert.False(t, ok, "an array is not a scalar")
	_, ok = p.Get("missing")
	assert.False(t, ok)
	_, ok = p.Get("amount[x]")
	assert.False(t, ok, "below a scalar there is nothing")

	assert.True(t, p.Has("metadata"))
	assert.True(t, p.IsContainer("metadata"))
	assert.True(t, p.IsContainer("expand"))
	assert.False(t, p.IsContainer("amount"))
	assert.False(t, p.Has("nothing"))

	assert.Equal(t, []string{"a", "b"}, p.Values("expand"))
	assert.Equal(t, []string{"a", "b"}, p.Values("expand[]"))
	assert.Nil(t, p.Values("amount"))
	assert.Equal(t, []string{"0", "1"}, p.Keys("line_items"))
	assert.Equal(t, []string{"amount", "expand", "line_items", "metadata"}, p.Keys(""))
	assert.Nil(t, p.Keys("amount"))

	var nilParams *stripeapi.Params
	_, ok = nilParams.Get("amount")
	assert.False(t, ok)
	assert.False(t, nilParams.Has("amount"))
	assert.Equal(t, 0, nilParams.Len())
	assert.Empty(t, nilParams.Canonical())
	assert.Nil(t, nilParams.Pairs())
}

func TestCanonical(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		a, b string
		same bool
	}{
		"stripe-go and stripe-node encodings": {
			a:    "amount=2000&currency=usd&description=Order+42&metadata[order_id]=42",
			b:    "metadata%5Border_id%5D=42&description=Order%2042&currency=usd&amount=2000",
			same: true,
		},
		"pair order of a hash": {
			a:    "metadata[a]=1&metadata[b]=2",
			b:    "metadata[b]=2&metadata[a]=1",
			same: true,
		},
		"lower- and upper-case percent hex": {
			a:    "description=%c3%a9",
			b:    "description=%C3%A9",
			same: true,
		},
		"array order matters": {
			a: "expand[]=a&expand[]=b",
			b: "expand[]=b&expand[]=a",
		},
		"indexed and appended arrays stay distinct": {
			a: "expand[0]=a",
			b: "expand[]=a",
		},
		"different values": {
			a: "amount=100",
			b: "amount=1000",
		},
		"key and value boundary": {
			a: "ab=c",
			b: "a=bc",
		},
		"empty value and missing key": {
			a: "a=&b=1",
			b: "b=1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a, b := MustParseForm(t, tc.a), MustParseForm(t, tc.b)
			if tc.same {
				assert.Equal(t, a.Canonical(), b.Canonical())
			} else {
				assert.NotEqual(t, a.Canonical(), b.Canonical())
			}
		})
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range proxytest.CatalogueCases(t) {
		if c.Method != "POST" || c.Path[:4] == "/v2/" {
			continue
		}
		p, err := stripeapi.ParseForm([]byte(c.Body))
		if err != nil {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			q, err := stripeapi.ParseForm(p.Encode())
			require.NoError(t, err)
			assert.Equal(t, p.Canonical(), q.Canonical())
		})
	}
}

func TestParseJSON(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		body string
		want []stripeapi.Pair
	}{
		"empty body":   {body: "", want: nil},
		"empty object": {body: " {} ", want: nil},
		"flat": {
			body: `{"display_name":"Acme","amount":100}`,
			want: []stripeapi.Pair{{Key: "display_name", Value: "Acme"}, {Key: "amount", Value: "100"}},
		},
		"numbers keep their text": {
			body: `{"a":1e5,"b":-0.50,"c":10000000000000000000000}`,
			want: []stripeapi.Pair{{Key: "a", Value: "1e5"}, {Key: "b", Value: "-0.50"}, {Key: "c", Value: "10000000000000000000000"}},
		},
		"nested objects and arrays": {
			body: `{"a":{"b":[{"c":true},"x"]}}`,
			want: []stripeapi.Pair{{Key: "a[b][0][c]", Value: "true"}, {Key: "a[b][1]", Value: "x"}},
		},
		"null and empty containers": {
			body: `{"n":null,"o":{},"l":[]}`,
			want: []stripeapi.Pair{{Key: "n", Value: "null"}, {Key: "o", Value: "{}"}, {Key: "l", Value: "[]"}},
		},
		"same key in different objects": {
			body: `{"a":{"k":1},"b":{"k":2}}`,
			want: []stripeapi.Pair{{Key: "a[k]", Value: "1"}, {Key: "b[k]", Value: "2"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := stripeapi.ParseJSON([]byte(tc.body))
			require.NoError(t, err)
			assert.Equal(t, tc.want, p.Pairs())
		})
	}

	p, err := stripeapi.ParseJSON([]byte(`{"s":"1","n":1,"z":null,"o":{}}`))
	require.NoError(t, err)
	v, ok := p.Get("s")
	assert.True(t, ok)
	assert.Equal(t, "1", v)
	v, ok = p.Get("n")
	assert.True(t, ok)
	assert.Equal(t, "1", v)
	_, ok = p.Get("z")
	assert.False(t, ok, "null is not a value")
	_, ok = p.Get("o")
	assert.False(t, ok, "an empty object is not a value")

	str, err := stripeapi.ParseJSON([]byte(`{"a":"1"}`))
	require.NoError(t, err)
	num, err := stripeapi.ParseJSON([]byte(`{"a":1}`))
	require.NoError(t, err)
	assert.NotEqual(t, str.Canonical(), num.Canonical(), "a string and a number differ")
	nul, err := stripeapi.ParseJSON([]byte(`{"a":null}`))
	require.NoError(t, err)
	nulStr, err := stripeapi.ParseJSON([]byte(`{"a":"null"}`))
	require.NoError(t, err)
	assert.NotEqual(t, nul.Canonical(), nulStr.Canonical(), "null and \"null\" differ")
	reordered, err := stripeapi.ParseJSON([]byte(`{"b":{"y":2,"x":1},"a":1}`))
	require.NoError(t, err)
	ordered, err := stripeapi.ParseJSON([]byte(`{"a":1,"b":{"x":1,"y":2}}`))
	require.NoError(t, err)
	assert.Equal(t, ordered.Canonical(), reordered.Canonical(), "member order does not matter")
}

func TestParseJSONRefuses(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"duplicate key":              `{"amount":1,"amount":2}`,
		"duplicate nested key":       `{"a":{"k":1,"k":1}}`,
		"duplicate key in array obj": `{"a":[{"k":1,"k":2}]}`,
		"not an object":              `[1,2]`,
		"a string":                   `"x"`,
		"trailing data":              `{"a":1} {"a":2}`,
		"trailing garbage":           `{"a":1}x`,
		"truncated":                  `{"a":1`,
		"invalid UTF-8":              "{\"a\":\"\xff\"}",
		"lone surrogate":             `{"a":"\ud800"}`,
		"empty key":                  `{"":1}`,
		"bracket in key":             `{"a[b]":1}`,
		"NUL in value":               `{"a":"\u0000"}`,
		"control in key":             `{"a\u0001":1}`,
		"too deep":                   `{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":1}}}}}}}}}}}}}}}}}`,
		"too deep arrays":            `{"a":[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}`,
		"form body":                  `amount=100`,
	}
	for name, body := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := stripeapi.ParseJSON([]byte(body))
			require.Error(t, err)
			assert.ErrorIs(t, err, stripeapi.ErrMalformed)
		})
	}
}

// FuzzParseForm checks that the parser never panics and that an accepted body has
// a deterministic canonical form that survives re-encoding.
func FuzzParseForm(f *testing.F) {
	for _, c := range proxytest.CatalogueCases(f) {
		f.Add([]byte(c.Body))
	}
	for _, c := range proxytest.MalformedCases(f) {
		if b, err := c.RawBody(); err == nil && len(b) < 4096 {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := stripeapi.ParseForm(body)
		if err != nil {
			if !errors.Is(err, stripeapi.ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		c1, c2 := p.Canonical(), p.Canonical()
		if !bytes.Equal(c1, c2) {
			t.Fatalf("canonical form not deterministic")
		}
		again, err := stripeapi.ParseForm(body)
		if err != nil || !bytes.Equal(again.Canonical(), c1) {
			t.Fatalf("second parse differs: %v", err)
		}
		q, err := stripeapi.ParseForm(p.Encode())
		if err != nil {
			t.Fatalf("re-encoded body %q refused: %v", p.Encode(), err)
		}
		if !bytes.Equal(q.Canonical(), c1) {
			t.Fatalf("re-encoded body reads differently:\n%q\n%q", c1, q.Canonical())
		}
		for _, pr := range p.Pairs() {
			if v, ok := p.Get(pr.Key); ok && v != pr.Value {
				t.Fatalf("Get(%q) = %q, pair says %q", pr.Key, v, pr.Value)
			}
		}
	})
}

// FuzzParseJSON checks that the JSON reader never panics and refuses only with
// ErrMalformed.
func FuzzParseJSON(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":{"b":[1,"x",null,true,{}]}}`, `{"a":1,"a":2}`, `[`, `{"a":"\ud800"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := stripeapi.ParseJSON(body)
		if err != nil {
			if !errors.Is(err, stripeapi.ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		if !bytes.Equal(p.Canonical(), p.Canonical()) {
			t.Fatalf("canonical form not deterministic")
		}
	})
}

// checkoutBody is a realistic stripe-go checkout body with three line items.
const checkoutBody = "line_items[0][price_data][currency]=usd&line_items[0][price_data][product_data][name]=T-shirt&line_items[0][price_data][unit_amount]=2000&line_items[0][quantity]=2&line_items[1][price_data][currency]=usd&line_items[1][price_data][product_data][name]=Sticker&line_items[1][price_data][unit_amount]=500&line_items[1][quantity]=1&line_items[2][price_data][currency]=usd&line_items[2][price_data][product_data][name]=Mug&line_items[2][price_data][unit_amount]=1250&line_items[2][quantity]=4&metadata[order_id]=42&mode=payment&success_url=https%3A%2F%2Fexample.com%2Fsuccess"

func BenchmarkParseForm(b *testing.B) {
	for _, bc := range []struct{ name, body string }{
		{"charge", "amount=2000&currency=usd&customer=cus_123&description=Order+42&metadata[order_id]=42"},
		{"checkout", checkoutBody},
	} {
		b.Run(bc.name, func(b *testing.B) {
			body := []byte(bc.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := stripeapi.ParseForm(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkCanonical(b *testing.B) {
	p := MustParseForm(b, checkoutBody)
	b.ReportAllocs()
	for b.Loop() {
		_ = p.Canonical()
	}
}
