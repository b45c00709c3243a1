package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
)

// A version with every character the text format must escape in a label value.
const metricsTestVersion = "v9.9.9-test \"quoted\" back\\slash\nnext line"

// MustMetricsAdmin starts the admin API over the agent env's store and proxy.
func MustMetricsAdmin(tb testing.TB, env *agentEnv) *httptest.Server {
	tb.Helper()
	h := api.NewAdmin(api.AdminConfig{
		Store:     env.store,
		Logger:    slog.New(slog.NewJSONHandler(env.logs, nil)),
		JWTSecret: []byte("test-jwt-secret-0123456789abcdef-xyz"),
		Now:       env.clock.Now,
		Proxy:     env.proxy,
		Version:   metricsTestVersion,
	})
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return srv
}

// MustScrape GETs /metrics without a token and checks the answer is valid text
// exposition format.
func MustScrape(tb testing.TB, srv *httptest.Server) *scrape {
	tb.Helper()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	require.NoError(tb, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	require.Equal(tb, http.StatusOK, resp.StatusCode, "body: %s", body)
	assert.Equal(tb, "text/plain; version=0.0.4; charset=utf-8", resp.Header.Get("Content-Type"))
	return MustParseExposition(tb, string(body))
}

func TestMetricsCountProxiedRequests(t *testing.T) {
	ctx := context.Background()
	env := MustAgentEnv(t)
	admin := MustMetricsAdmin(t, env)
	_, tok := env.MustKey("metered", seedPolicy, nil) // daily cap 99.00 usd
	sc := env.Stripe(tok)
	charge := func(amount int64, idem string) error {
		p := &stripe.ChargeCreateParams{
			Amount: stripe.Int64(amount), Currency: stripe.String("usd"),
			Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
		}
		p.SetIdempotencyKey(idem)
		_, err := sc.V1Charges.Create(ctx, p)
		return err
	}

	before := MustScrape(t, admin)
	assert.Equal(t, 1.0, before.Value("keybrake_build_info", "version", metricsTestVersion, "goversion", runtime.Version()),
		"the version label survives escaping")
	assert.Equal(t, 0.0, before.Value("keybrake_holds_unknown"))

	require.NoError(t, charge(6000, "m-1"), "allowed")
	var se *stripe.Error
	require.ErrorAs(t, charge(5000, "m-2"), &se, "60 + 50 passes the daily cap")
	assert.Equal(t, http.StatusPaymentRequired, se.HTTPStatusCode)
	require.NoError(t, charge(6000, "m-1"), "replayed")
	env.fake.FailNext(proxytest.FailAfterCreate500, 1)
	require.ErrorAs(t, charge(1000, "m-3"), &se, "Stripe answers 500: outcome unknown")
	assert.Equal(t, http.StatusInternalServerError, se.HTTPStatusCode)
	r := env.Do(http.MethodGet, "/v1/charges", "vk_not_a_key", nil)
	require.Equal(t, http.StatusUnauthorized, r.Status)
	env.fake.WaitIdle(t)

	after := MustScrape(t, admin)
	delta := func(name string, labels ...string) float64 {
		return after.Value(name, labels...) - before.Value(name, labels...)
	}
	const req = "keybrake_proxy_requests_total"
	assert.Equal(t, 2.0, delta(req, "decision", "allowed", "code", ""), "m-1 and m-3")
	assert.Equal(t, 1.0, delta(req, "decision", "refused", "code", "spend_cap_exceeded"))
	assert.Equal(t, 1.0, delta(req, "decision", "replayed", "code", ""))
	assert.Equal(t, 1.0, delta(req, "decision", "refused", "code", "vault_key_invalid"))
	assert.Equal(t, 5.0, after.Sum(req)-before.Sum(req), "every request counted once")

	const up = "keybrake_proxy_upstream_requests_total"
	assert.Equal(t, 1.0, delta(up, "kind", "forward", "status_class", "2xx"))
	assert.Equal(t, 1.0, delta(up, "kind", "forward", "status_class", "5xx"))
	assert.Equal(t, 2.0, after.Sum(up)-before.Sum(up), "only m-1 and m-3 reached Stripe; no lookups")
	assert.Equal(t, 2, env.fake.Count())

	const dur = "keybrake_proxy_request_duration_seconds"
	assert.Equal(t, 5.0, delta(dur+"_count"))
	assert.Equal(t, 5.0, delta(dur+"_bucket", "le", "+Inf"))
	assert.Greater(t, delta(dur+"_sum"), 0.0)

	// Sequential requests share no transaction: a Reserve for each of m-1, m-2,
	// the replay and m-3, a Settle for m-1 and m-3.
	assert.Equal(t, 6.0, delta("keybrake_store_ops_total"))
	assert.Equal(t, 6.0, delta("keybrake_store_commits_total"))
	assert.Equal(t, 1.0, after.Value("keybrake_holds_unknown"), "m-3's hold")

	for name, typ := range map[string]string{
		"keybrake_build_info": "gauge", req: "counter", up: "counter", dur: "histogram",
		"keybrake_store_commits_total": "counter", "keybrake_store_ops_total": "counter",
		"keybrake_holds_unknown": "gauge",
	} {
		assert.Equal(t, typ, after.types[name], name)
		assert.NotEmpty(t, after.help[name], name)
	}
}

func TestMetricsWithoutProxyAndWithoutToken(t *testing.T) {
	env := MustAdminEnv(t) // no proxy configured
	env.MustUpstream("default")
	k := env.MustMint("k", "", nil, seedLegacyPolicy)
	env.MustHold(k.ID, "a", 100, vault.SettleUnknown)
	env.MustHold(k.ID, "b", 100, vault.SettleCommit)

	r := env.Do(http.MethodGet, "/metrics", "", nil) // checked against the OpenAPI document
	require.Equal(t, http.StatusOK, r.Status, "no token needed")
	s := MustParseExposition(t, string(r.Body))
	assert.Equal(t, 1.0, s.Value("keybrake_holds_unknown"))
	assert.Equal(t, 4.0, s.Value("keybrake_store_ops_total"), "a Reserve and a Settle per hold")
	assert.Equal(t, 1.0, s.Value("keybrake_build_info", "version", "", "goversion", runtime.Version()))
	for name := range s.types {
		assert.False(t, strings.HasPrefix(name, "keybrake_proxy_"), "%s without a proxy", name)
	}

	r = env.Do(http.MethodPost, "/metrics", "", nil)
	assert.Equal(t, http.StatusMethodNotAllowed, r.Status)
}

func TestExpositionCheckerRejects(t *testing.T) {
	for name, body := range map[string]string{
		"no TYPE":              "x_total 1\n",
		"bad metric name":      "# TYPE 1x counter\n1x 1\n",
		"bad label name":       "# TYPE x gauge\nx{1a=\"v\"} 1\n",
		"bad escape":           "# TYPE x gauge\nx{a=\"\\t\"} 1\n",
		"unterminated value":   "# TYPE x gauge\nx{a=\"v} 1\n",
		"missing newline":      "# TYPE x gauge\nx 1",
		"bad value":            "# TYPE x gauge\nx one\n",
		"duplicate series":     "# TYPE x gauge\nx{a=\"v\"} 1\nx{a=\"v\"} 2\n",
		"TYPE twice":           "# TYPE x gauge\n# TYPE x gauge\nx 1\n",
		"interleaved families": "# TYPE x gauge\n# TYPE y gauge\nx 1\ny 1\nx{a=\"b\"} 1\n",
		"unknown type":         "# TYPE x meter\nx 1\n",
		"histogram +Inf differs from count": "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\n" +
			"h_sum 1\nh_count 3\n",
		"histogram not cumulative": "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseExposition(body)
			assert.Error(t, err)
		})
	}
	_, err := parseExposition("# HELP x a \\\\ b\\n c\n# TYPE x gauge\nx{a=\"\\\\\\\"\\n\",} 1 1700000000000\n# comment\n")
	assert.NoError(t, err, "escapes, a trailing comma, a timestamp and a plain comment are valid")
}

// ---- a small checker of the Prometheus text exposition format 0.0.4 ----

var (
	metricNameRE = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelNameRE  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// sample is one parsed sample line.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrape is a parsed exposition.
type scrape struct {
	types   map[string]string // metric family → TYPE
	help    map[string]string // metric family → HELP (unescaped)
	samples []sample
}

// Value is the value of the series name{labels}; 0 when absent (counters leave out
// label pairs never seen).
func (s *scrape) Value(name string, labels ...string) float64 {
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, sm := range s.samples {
		if sm.name == name && mapsEqual(sm.labels, want) {
			return sm.value
		}
	}
	return 0
}

// Sum adds every series of name.
func (s *scrape) Sum(name string) float64 {
	var total float64
	for _, sm := range s.samples {
		if sm.name == name {
			total += sm.value
		}
	}
	return total
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// MustParseExposition parses body line by line, failing the test on anything the
// text format does not allow.
func MustParseExposition(tb testing.TB, body string) *scrape {
	tb.Helper()
	s, err := parseExposition(body)
	require.NoError(tb, err, "exposition:\n%s", body)
	return s
}

func parseExposition(body string) (*scrape, error) {
	if !strings.HasSuffix(body, "\n") {
		return nil, fmt.Errorf("the last line does not end in a line feed")
	}
	s := &scrape{types: map[string]string{}, help: map[string]string{}}
	seen := map[string]bool{}     // series already seen
	finished := map[string]bool{} // families whose samples are behind us
	current := ""
	for i, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		fail := func(format string, args ...any) error {
			return fmt.Errorf("line %d %q: %s", i+1, line, fmt.Sprintf(format, args...))
		}
		if strings.HasPrefix(line, "#") {
			fields := strings.SplitN(strings.TrimLeft(line[1:], " \t"), " ", 3)
			if len(fields) < 2 || (fields[0] != "HELP" && fields[0] != "TYPE") {
				continue // a plain comment
			}
			name := fields[1]
			if !metricNameRE.MatchString(name) {
				return nil, fail("metric name %q", name)
			}
			text := ""
			if len(fields) == 3 {
				text = fields[2]
			}
			switch fields[0] {
			case "HELP":
				if _, dup := s.help[name]; dup {
					return nil, fail("second HELP for %s", name)
				}
				h, err := unescape(text, false)
				if err != nil {
					return nil, fail("%v", err)
				}
				s.help[name] = h
			case "TYPE":
				if _, dup := s.types[name]; dup {
					return nil, fail("second TYPE for %s", name)
				}
				if finished[name] || current == name {
					return nil, fail("TYPE after samples of %s", name)
				}
				if !slices.Contains([]string{"counter", "gauge", "histogram", "summary", "untyped"}, text) {
					return nil, fail("type %q", text)
				}
				s.types[name] = text
			}
			continue
		}
		sm, err := parseSample(line)
		if err != nil {
			return nil, fail("%v", err)
		}
		family := s.familyOf(sm.name)
		if family == "" {
			return nil, fail("no TYPE line before %s", sm.name)
		}
		if family != current {
			if finished[family] {
				return nil, fail("samples of %s are not together", family)
			}
			if current != "" {
				finished[current] = true
			}
			current = family
		}
		if s.types[family] == "counter" && (sm.value < 0 || math.IsNaN(sm.value)) {
			return nil, fail("counter %s is %v", sm.name, sm.value)
		}
		if strings.HasSuffix(sm.name, "_bucket") && s.types[family] == "histogram" {
			if _, ok := sm.labels["le"]; !ok {
				return nil, fail("bucket without le")
			}
		}
		key := seriesKey(sm)
		if seen[key] {
			return nil, fail("duplicate series %s", key)
		}
		seen[key] = true
		s.samples = append(s.samples, sm)
	}
	if err := s.checkHistograms(); err != nil {
		return nil, err
	}
	return s, nil
}

// familyOf is the metric family a sample belongs to ("" for none declared).
func (s *scrape) familyOf(name string) string {
	if _, ok := s.types[name]; ok {
		return name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch s.types[base] {
		case "histogram":
			return base
		case "summary":
			if suffix != "_bucket" {
				return base
			}
		}
	}
	return ""
}

// checkHistograms checks each histogram: buckets by increasing le with
// non-decreasing counts, the last +Inf and equal to _count, and a _sum.
func (s *scrape) checkHistograms() error {
	for name, typ := range s.types {
		if typ != "histogram" {
			continue
		}
		type bucket struct{ le, n float64 }
		var buckets []bucket
		var count, sum *float64
		for _, sm := range s.samples {
			switch sm.name {
			case name + "_bucket":
				le, err := strconv.ParseFloat(sm.labels["le"], 64)
				if err != nil {
					return fmt.Errorf("%s: le %q", name, sm.labels["le"])
				}
				buckets = append(buckets, bucket{le, sm.value})
			case name + "_count":
				count = &sm.value
			case name + "_sum":
				sum = &sm.value
			}
		}
		if count == nil || sum == nil || len(buckets) == 0 {
			return fmt.Errorf("%s: buckets, _sum and _count are all required", name)
		}
		for i := 1; i < len(buckets); i++ {
			if buckets[i].le <= buckets[i-1].le || buckets[i].n < buckets[i-1].n {
				return fmt.Errorf("%s: buckets are not cumulative by increasing le", name)
			}
		}
		last := buckets[len(buckets)-1]
		if !math.IsInf(last.le, 1) || last.n != *count {
			return fmt.Errorf("%s: the +Inf bucket (%v) must be last and equal _count (%v)", name, last.n, *count)
		}
	}
	return nil
}

// parseSample reads `name{label="value",...} value [timestamp]`.
func parseSample(line string) (sample, error) {
	sm := sample{labels: map[string]string{}}
	end := strings.IndexAny(line, "{ ")
	if end < 0 {
		return sm, fmt.Errorf("no value")
	}
	sm.name = line[:end]
	if !metricNameRE.MatchString(sm.name) {
		return sm, fmt.Errorf("metric name %q", sm.name)
	}
	rest := line[end:]
	if strings.HasPrefix(rest, "{") {
		rest = rest[1:]
		for !strings.HasPrefix(rest, "}") {
			eq := strings.Index(rest, `="`)
			if eq < 0 {
				return sm, fmt.Errorf("label without =\"")
			}
			lname := rest[:eq]
			if !labelNameRE.MatchString(lname) {
				return sm, fmt.Errorf("label name %q", lname)
			}
			rest = rest[eq+2:]
			closing := -1
			for j := 0; j < len(rest); j++ {
				if rest[j] == '\\' {
					j++
					continue
				}
				if rest[j] == '"' {
					closing = j
					break
				}
			}
			if closing < 0 {
				return sm, fmt.Errorf("unterminated label value")
			}
			v, err := unescape(rest[:closing], true)
			if err != nil {
				return sm, err
			}
			if _, dup := sm.labels[lname]; dup {
				return sm, fmt.Errorf("label %s twice", lname)
			}
			sm.labels[lname] = v
			rest = rest[closing+1:]
			switch {
			case strings.HasPrefix(rest, ","):
				rest = rest[1:]
			case strings.HasPrefix(rest, "}"):
			default:
				return sm, fmt.Errorf("expected , or } after a label")
			}
		}
		rest = rest[1:]
	}
	fields := strings.Split(strings.TrimPrefix(rest, " "), " ")
	if !strings.HasPrefix(rest, " ") || len(fields) < 1 || len(fields) > 2 {
		return sm, fmt.Errorf("expected ' value [timestamp]'")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return sm, fmt.Errorf("value %q", fields[0])
	}
	sm.value = v
	if len(fields) == 2 {
		if _, err := strconv.ParseInt(fields[1], 10, 64); err != nil {
			return sm, fmt.Errorf("timestamp %q", fields[1])
		}
	}
	return sm, nil
}

// unescape undoes the text format's escapes: \\ and \n, and \" in a label value.
func unescape(s string, label bool) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			if label && c == '"' {
				return "", fmt.Errorf("unescaped quote in label value")
			}
			b.WriteByte(c)
			continue
		}
		i++
		if i == len(s) {
			return "", fmt.Errorf("trailing backslash")
		}
		switch {
		case s[i] == '\\':
			b.WriteByte('\\')
		case s[i] == 'n':
			b.WriteByte('\n')
		case s[i] == '"' && label:
			b.WriteByte('"')
		default:
			return "", fmt.Errorf("unknown escape \\%c", s[i])
		}
	}
	return b.String(), nil
}

// seriesKey identifies a series: the name and its sorted labels.
func seriesKey(sm sample) string {
	names := make([]string, 0, len(sm.labels))
	for k := range sm.labels {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(sm.name)
	for _, k := range names {
		b.WriteString("|" + k + "=" + strconv.Quote(sm.labels[k]))
	}
	return b.String()
}
