package proxy

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// Step 2 of the pipeline (see prepare): reading the request exactly as Stripe
// would, or refusing it as malformed.

// readRequest reads the request exactly as Stripe would, or refuses it: each
// step below is one kind of ambiguity, checked in this order.
func (p *Proxy) readRequest(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := checkMethod(r.Method); err != nil {
		return err
	}
	if err := checkHeaders(r.Header); err != nil {
		return err
	}
	query, hasQuery, err := c.readTarget(r)
	if err != nil {
		return err
	}
	if err := checkContentEncoding(r.Header); err != nil {
		return err
	}
	if err := c.readStripeHeaders(r.Header); err != nil {
		return err
	}
	if c.body, err = p.readBody(w, r); err != nil {
		return err
	}
	body, err := c.readParams(r.Header, query, hasQuery)
	if err != nil {
		return err
	}
	// Only a POST's body is classified: a GET's query filters, it names no amount.
	if c.cls, err = stripeapi.Classify(c.method, c.path, body); err != nil {
		return malformed(err, "The request cannot be read unambiguously: %s.", errText(err))
	}
	return nil
}

// checkMethod refuses what is not a Stripe API method: an unknown write,
// refused whatever the policy says.
func checkMethod(method string) error {
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodDelete:
		return nil
	}
	return refuse(CodeOperationNotAllowed, "Method %s is not part of the Stripe API.", stripeapi.Clip(method))
}

// readTarget reads the request target into c.path, the exact bytes the client
// sent (classified and forwarded as they are), and returns its query. Only a GET
// may carry one: Stripe merges a query into a POST's parameters, and no DELETE
// in the catalogue takes any.
func (c *call) readTarget(r *http.Request) (query string, hasQuery bool, err error) {
	target := r.RequestURI
	if target == "" {
		target = r.URL.RequestURI()
	}
	if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, "#") {
		return "", false, malformed(nil, "The request target must be a path.")
	}
	c.path, query, hasQuery = strings.Cut(target, "?")
	switch {
	case hasQuery && c.method == http.MethodDelete:
		return "", false, malformed(nil, "A DELETE request takes no parameters.")
	case hasQuery && c.method != http.MethodGet:
		return "", false, malformed(nil, "A POST request may not carry query parameters: send them in the body.")
	}
	return query, hasQuery, nil
}

// readStripeHeaders reads Stripe-Version, Stripe-Account and Stripe-Context,
// each at most once.
func (c *call) readStripeHeaders(h http.Header) error {
	if v := h.Values(headerStripeVersion); len(v) > 1 {
		return malformed(nil, "More than one Stripe-Version header.")
	} else if len(v) == 1 {
		c.stripeVersion = v[0]
	}
	var err error
	if c.account, err = singleHeader(h, headerStripeAccount); err != nil {
		return err
	}
	c.stripeContext, err = singleHeader(h, headerStripeContext)
	return err
}

// readBody reads the whole body, at most maxBody bytes (413 beyond).
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	tooLarge := func() error {
		return refuse(CodeRequestTooLarge, "The request body is larger than %d bytes.", p.maxBody)
	}
	if r.ContentLength > p.maxBody {
		return nil, tooLarge()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.maxBody))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return nil, tooLarge()
	case err != nil:
		return nil, malformed(err, "The request body could not be read.")
	}
	return body, nil
}

// readParams parses the parameters into c.params: a GET's or DELETE's query
// (they carry no body), a POST's body by its content type (a form on v1, JSON on
// v2). It returns the body's parameters, the ones Classify reads.
func (c *call) readParams(h http.Header, query string, hasQuery bool) (*stripeapi.Params, error) {
	if c.method != http.MethodPost {
		if len(c.body) > 0 {
			return nil, malformed(nil, "A %s request may not carry a body.", c.method)
		}
		if hasQuery {
			q, err := stripeapi.ParseForm([]byte(query))
			if err != nil {
				return nil, malformed(err, "The query string cannot be read unambiguously: %s.", errText(err))
			}
			c.rawQuery, c.params = query, q
		}
		return nil, nil
	}
	ct, err := singleHeader(h, "Content-Type")
	if err != nil {
		return nil, err
	}
	c.contentType = ct
	v2 := strings.HasPrefix(c.path, "/v2/")
	if len(c.body) > 0 || ct != "" {
		if err := checkContentType(ct, v2); err != nil {
			return nil, err
		}
	} else if !v2 {
		// An empty POST (curl -X POST) goes on with the form type Stripe expects.
		c.contentType = "application/x-www-form-urlencoded"
	}
	parse := stripeapi.ParseForm
	if v2 {
		parse = stripeapi.ParseJSON
	}
	if c.params, err = parse(c.body); err != nil {
		return nil, malformed(err, "The request body cannot be read unambiguously: %s.", errText(err))
	}
	return c.params, nil
}

// checkHeaders refuses header names that are not HTTP tokens and values with
// control characters (net/http's server already refuses them; this keeps the
// handler safe when it is mounted behind something more lenient, because the
// upstream transport would fail on them only after the hold was placed), then
// method overrides and protocol upgrades.
func checkHeaders(h http.Header) error {
	if err := checkHeaderSyntax(h); err != nil {
		return err
	}
	// Method overrides change the method a framework sees; Stripe's own handling
	// of them is unknown, so they are refused.
	for _, name := range [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"} {
		if _, ok := h[name]; ok {
			return malformed(nil, "The %s header is not allowed.", name)
		}
	}
	if _, ok := h["Upgrade"]; ok {
		return malformed(nil, "Protocol upgrades are not allowed.")
	}
	return nil
}

// checkHeaderSyntax refuses header names that are not tokens (or hold "_") and
// values with control characters.
func checkHeaderSyntax(h http.Header) error {
	for name, vals := range h {
		if name == "" {
			return malformed(nil, "An empty header name is not allowed.")
		}
		for i := 0; i < len(name); i++ {
			if !isTokenChar(name[i]) {
				return malformed(nil, "Header name %q is not allowed.", stripeapi.Clip(name))
			}
		}
		if strings.IndexByte(name, '_') >= 0 {
			// CGI-style servers (Rack among them) read "Stripe_Account" as
			// Stripe-Account; keybrake checks and replaces only the real spelling.
			return malformed(nil, "Header name %q is not allowed: use '-', not '_'.", stripeapi.Clip(name))
		}
		for _, v := range vals {
			for i := 0; i < len(v); i++ {
				if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
					return malformed(nil, "The value of header %q holds a control character.", stripeapi.Clip(name))
				}
			}
		}
	}
	return nil
}

// isTokenChar reports whether c may appear in an RFC 9110 token.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// checkContentEncoding refuses a compressed body: keybrake would meter what it
// cannot read as Stripe will.
func checkContentEncoding(h http.Header) error {
	for _, v := range h.Values("Content-Encoding") {
		for part := range strings.SplitSeq(v, ",") {
			if e := strings.TrimSpace(part); e != "" && !strings.EqualFold(e, "identity") {
				return malformed(nil, "Content-Encoding %q is not allowed: send the body uncompressed.", stripeapi.Clip(e))
			}
		}
	}
	return nil
}

// checkContentType accepts a v1 form or a v2 JSON body, utf-8 at most.
func checkContentType(ct string, v2 bool) error {
	want := "application/x-www-form-urlencoded"
	if v2 {
		want = "application/json"
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != want {
		return malformed(err, "Content-Type must be %s.", want)
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return malformed(nil, "Content-Type parameter %q is not allowed.", stripeapi.Clip(k))
		}
	}
	return nil
}

// singleHeader is the one value of header name ("" when absent); a repeated
// header is malformed.
func singleHeader(h http.Header, name string) (string, error) {
	vals := h.Values(name)
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
		return strings.TrimSpace(vals[0]), nil
	default:
		return "", malformed(nil, "More than one %s header.", name)
	}
}
