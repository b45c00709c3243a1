package api_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
)

// seenRequest is what the mounted Stripe handler observed.
type seenRequest struct {
	Method      string
	Path        string
	RawPath     string
	EscapedPath string
	RequestURI  string
	Body        string
	Header      http.Header
	Flushed     error
}

// recordingStripe is a stand-in for the metering proxy that records every request
// it is handed.
type recordingStripe struct {
	mu   sync.Mutex
	seen []seenRequest
}

func (s *recordingStripe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTeapot)
	_, _ = io.WriteString(w, `{"object":"stand-in"}`)
	flushErr := http.NewResponseController(w).Flush()

	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, seenRequest{
		Method:      r.Method,
		Path:        r.URL.Path,
		RawPath:     r.URL.RawPath,
		EscapedPath: r.URL.EscapedPath(),
		RequestURI:  r.RequestURI,
		Body:        string(body),
		Header:      r.Header.Clone(),
		Flushed:     flushErr,
	})
}

func (s *recordingStripe) take() []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.seen
	s.seen = nil
	return out
}

// MustProxyListener starts the proxy listener's handler on 127.0.0.1:0 with a
// recording Stripe handler mounted.
func MustProxyListener(tb testing.TB) (*httptest.Server, *recordingStripe) {
	tb.Helper()
	stripe := &recordingStripe{}
	h := api.NewProxyListener(api.ProxyConfig{Stripe: stripe})
	require.NotNil(tb, h)
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return srv, stripe
}

// rawResponse is a response read off a raw connection.
type rawResponse struct {
	Status int
	Header http.Header
	Body   string
}

// MustRawRequest writes requestLine and the headers byte for byte (no client-side
// path cleaning or re-escaping) and reads the response.
func MustRawRequest(tb testing.TB, addr, requestLine string, header map[string]string, body string) rawResponse {
	tb.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(tb, err)
	defer conn.Close()
	require.NoError(tb, conn.SetDeadline(time.Now().Add(10*time.Second)))

	var b strings.Builder
	b.WriteString(requestLine + "\r\nHost: " + addr + "\r\nConnection: close\r\n")
	for k, v := range header {
		b.WriteString(k + ": " + v + "\r\n")
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	_, err = io.WriteString(conn, b.String())
	require.NoError(tb, err)

	method, _, _ := strings.Cut(requestLine, " ")
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	require.NoError(tb, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	return rawResponse{Status: resp.StatusCode, Header: resp.Header, Body: string(data)}
}

func TestProxyListenerPassesStripeRequestsUntouched(t *testing.T) {
	t.Parallel()
	srv, stripe := MustProxyListener(t)
	addr := srv.Listener.Addr().String()

	tests := map[string]struct {
		method      string
		target      string
		body        string
		header      map[string]string
		wantPath    string // r.URL.Path
		wantEscaped string // r.URL.EscapedPath()
		wantRaw     string // r.URL.RawPath
	}{
		"plain v1": {
			method: "GET", target: "/v1/charges",
			wantPath: "/v1/charges", wantEscaped: "/v1/charges",
		},
		"double slash": {
			method: "GET", target: "/v1//charges",
			wantPath: "/v1//charges", wantEscaped: "/v1//charges",
		},
		"encoded slash": {
			method: "POST", target: "/v1/charges%2Fch_123/capture",
			wantPath: "/v1/charges/ch_123/capture", wantEscaped: "/v1/charges%2Fch_123/capture",
			wantRaw: "/v1/charges%2Fch_123/capture",
		},
		"dot dot": {
			method: "GET", target: "/v1/customers/../charges",
			wantPath: "/v1/customers/../charges", wantEscaped: "/v1/customers/../charges",
		},
		"dot dot escaping the prefix": {
			method: "POST", target: "/v1/../keybrake/v1/me",
			wantPath: "/v1/../keybrake/v1/me", wantEscaped: "/v1/../keybrake/v1/me",
		},
		"encoded dots": {
			method: "GET", target: "/v1/%2E%2E/charges",
			wantPath: "/v1/../charges", wantEscaped: "/v1/%2E%2E/charges", wantRaw: "/v1/%2E%2E/charges",
		},
		"trailing slash": {
			method: "GET", target: "/v1/charges/",
			wantPath: "/v1/charges/", wantEscaped: "/v1/charges/",
		},
		"query kept": {
			method: "GET", target: "/v1/charges?limit=3&expand%5B%5D=data.customer",
			wantPath: "/v1/charges", wantEscaped: "/v1/charges",
		},
		"form body kept": {
			method: "POST", target: "/v1/charges",
			header:   map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Idempotency-Key": "abc"},
			body:     "amount=100&currency=usd&metadata[k]=a+b%20c",
			wantPath: "/v1/charges", wantEscaped: "/v1/charges",
		},
		"json body on v2": {
			method: "POST", target: "/v2/core/event_destinations",
			header:   map[string]string{"Content-Type": "application/json"},
			body:     `{"name":"x"}`,
			wantPath: "/v2/core/event_destinations", wantEscaped: "/v2/core/event_destinations",
		},
		"delete": {
			method: "DELETE", target: "/v1/customers/cus_1",
			wantPath: "/v1/customers/cus_1", wantEscaped: "/v1/customers/cus_1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp := MustRawRequest(t, addr, tc.method+" "+tc.target+" HTTP/1.1", tc.header, tc.body)
			assert.Equal(t, http.StatusTeapot, resp.Status, "the Stripe handler answered")
			assert.JSONEq(t, `{"object":"stand-in"}`, resp.Body)

			seen := stripe.take()
			require.Len(t, seen, 1, "exactly one request reached the Stripe handler")
			got := seen[0]
			assert.Equal(t, tc.method, got.Method)
			assert.Equal(t, tc.target, got.RequestURI, "RequestURI is the request line's target")
			assert.Equal(t, tc.wantPath, got.Path)
			assert.Equal(t, tc.wantEscaped, got.EscapedPath)
			assert.Equal(t, tc.wantRaw, got.RawPath)
			assert.Equal(t, tc.body, got.Body, "the body reaches the handler unread")
			for k, v := range tc.header {
				assert.Equal(t, v, got.Header.Get(k))
			}
			assert.NoError(t, got.Flushed, "the response writer supports flushing (streaming proxy)")
		})
	}
}

func TestProxyListenerOwnRoutes(t *testing.T) {
	t.Parallel()
	srv, stripe := MustProxyListener(t)
	addr := srv.Listener.Addr().String()

	tests := map[string]struct {
		requestLine string
		wantStatus  int
		wantCode    string // Stripe error code; "" for a non-error
	}{
		"healthz":                    {"GET /healthz HTTP/1.1", http.StatusOK, ""},
		"agent endpoints not yet":    {"GET /keybrake/v1/me HTTP/1.1", http.StatusNotFound, "resource_missing"},
		"unknown path":               {"GET /charges HTTP/1.1", http.StatusNotFound, "resource_missing"},
		"root":                       {"GET / HTTP/1.1", http.StatusNotFound, "resource_missing"},
		"v1 without a resource":      {"GET /v1 HTTP/1.1", http.StatusNotFound, "resource_missing"},
		"leading double slash":       {"POST //v1/charges HTTP/1.1", http.StatusNotFound, "resource_missing"},
		"v3":                         {"GET /v3/charges HTTP/1.1", http.StatusNotFound, "resource_missing"},
		"healthz is not writable":    {"POST /healthz HTTP/1.1", http.StatusMethodNotAllowed, "method_not_allowed"},
		"method echo does not route": {"BREW /v1/charges HTTP/1.1", http.StatusMethodNotAllowed, "method_not_allowed"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp := MustRawRequest(t, addr, tc.requestLine, nil, "")
			assert.Equal(t, tc.wantStatus, resp.Status)
			assert.Equal(t, "application/json", strings.Split(resp.Header.Get("Content-Type"), ";")[0])
			assert.Empty(t, stripe.take(), "nothing reached the Stripe handler")

			if tc.wantCode == "" {
				assert.JSONEq(t, `{"status":"ok"}`, resp.Body)
				return
			}
			var body struct {
				Error struct {
					Type    string `json:"type"`
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(resp.Body), &body), resp.Body)
			assert.Equal(t, "invalid_request_error", body.Error.Type)
			assert.Equal(t, tc.wantCode, body.Error.Code)
			assert.NotEmpty(t, body.Error.Message)
			assert.Equal(t, "false", resp.Header.Get("Stripe-Should-Retry"))
		})
	}
}

func TestProxyListenerWithoutStripeHandler(t *testing.T) {
	t.Parallel()
	h := api.NewProxyListener(api.ProxyConfig{})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	resp := MustRawRequest(t, srv.Listener.Addr().String(), "POST /v1/charges HTTP/1.1", nil, "")
	assert.Equal(t, http.StatusNotFound, resp.Status, "no proxy mounted: nothing is forwarded")
}
