package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// upstreamTimeout is the self target's --upstream-timeout.
const upstreamTimeout = 30 * time.Second

// fakeStripe is the smallest Stripe that a charge load needs: POST /v1/charges
// creates a charge (the first answer to an Idempotency-Key is replayed to every
// later request with that key), every GET answers 200, and it counts what it
// executed. It is safe for concurrent use.
type fakeStripe struct {
	secret string

	mu      sync.Mutex
	answers map[string][]byte // idempotency key → first answer
	charges int64
	amount  int64
}

func newFakeStripe(secret string) *fakeStripe {
	return &fakeStripe{secret: secret, answers: map[string][]byte{}}
}

// totals returns the number of charges executed and their total amount.
func (f *fakeStripe) totals() (charges, amount int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.charges, f.amount
}

// ServeHTTP implements http.Handler.
func (f *fakeStripe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_fake_"+strconv.FormatInt(time.Now().UnixNano(), 36))
	switch {
	case r.Header.Get("Authorization") != "Bearer "+f.secret:
		stripeError(w, http.StatusUnauthorized, "invalid_request_error", "Invalid API Key provided.")
	case r.Method == http.MethodGet:
		_, _ = io.WriteString(w, `{"object":"list","data":[],"has_more":false}`)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/charges":
		f.charge(w, r)
	default:
		stripeError(w, http.StatusNotFound, "invalid_request_error", "Unrecognized request URL.")
	}
}

// charge creates a charge, or replays the first answer to its idempotency key.
func (f *fakeStripe) charge(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "Malformed body.")
		return
	}
	amount, err := strconv.ParseInt(r.PostForm.Get("amount"), 10, 64)
	if err != nil || amount < 1 || r.PostForm.Get("currency") == "" {
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "Missing or invalid amount or currency.")
		return
	}
	key := r.Header.Get("Idempotency-Key")

	f.mu.Lock()
	defer f.mu.Unlock()
	if body, ok := f.answers[key]; ok && key != "" {
		w.Header().Set("Idempotent-Replayed", "true")
		_, _ = w.Write(body)
		return
	}
	f.charges++
	f.amount += amount
	body, err := json.Marshal(map[string]any{
		"id": fmt.Sprintf("ch_fake%08d", f.charges), "object": "charge",
		"amount": amount, "amount_captured": amount, "captured": true, "paid": true,
		"currency": r.PostForm.Get("currency"), "status": "succeeded", "livemode": false,
	})
	if err != nil {
		stripeError(w, http.StatusInternalServerError, "api_error", "Encoding failed.")
		return
	}
	if key != "" {
		f.answers[key] = body
	}
	_, _ = w.Write(body)
}

func stripeError(w http.ResponseWriter, status int, typ, msg string) {
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"type": typ, "message": msg}})
}

// selfTarget is a fake Stripe and the real keybrake pieces, wired as `keybrake
// serve` wires them, on 127.0.0.1, with an upstream registered and a key minted
// through the admin API.
type selfTarget struct {
	fake     *fakeStripe
	dir      string
	store    vault.Store
	servers  []*http.Server
	proxyURL string
	adminURL string
	admin    string // admin JWT
	keyID    string
	vaultKey string
	capMinor int64
}

// startSelf starts the self target with a key whose period cap is capMinor minor
// units of usd. keybrake logs errors (only) to logw. On error the caller still
// calls Close.
func startSelf(ctx context.Context, capMinor int64, logw io.Writer) (*selfTarget, error) {
	secrets := make([]byte, 32+32+16)
	if _, err := rand.Read(secrets); err != nil {
		return nil, fmt.Errorf("generate secrets: %w", err)
	}
	masterKey, jwtSecret := secrets[:32], secrets[32:64]
	st := &selfTarget{fake: newFakeStripe("sk_test_load_" + hex.EncodeToString(secrets[64:])), capMinor: capMinor}
	logger := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelError}))

	dir, err := os.MkdirTemp("", "keybrake-load-")
	if err != nil {
		return st, fmt.Errorf("data directory: %w", err)
	}
	st.dir = dir
	st.store, err = bolt.Open(filepath.Join(dir, "keybrake.db"), bolt.Options{
		MasterKey: masterKey,
		Lease:     proxy.RecommendedLease(upstreamTimeout),
		Logger:    logger,
	})
	if err != nil {
		return st, fmt.Errorf("open store: %w", err)
	}

	upstreamURL, err := st.serve(ctx, st.fake)
	if err != nil {
		return st, err
	}
	u, err := url.Parse(upstreamURL)
	if err != nil {
		return st, fmt.Errorf("upstream url: %w", err)
	}
	stripe, err := proxy.New(proxy.Config{Store: st.store, Upstream: u, UpstreamTimeout: upstreamTimeout, Logger: logger})
	if err != nil {
		return st, fmt.Errorf("build proxy: %w", err)
	}
	if st.proxyURL, err = st.serve(ctx, api.NewProxyListener(api.ProxyConfig{Store: st.store, Logger: logger, Stripe: stripe})); err != nil {
		return st, err
	}
	admin := api.NewAdmin(api.AdminConfig{Store: st.store, Logger: logger, JWTSecret: jwtSecret, PublicURL: st.proxyURL, Stripe: stripe})
	if st.adminURL, err = st.serve(ctx, admin); err != nil {
		return st, err
	}
	if st.admin, err = api.IssueToken(jwtSecret, "keybrake-load", api.RoleAdmin, time.Hour, time.Now()); err != nil {
		return st, fmt.Errorf("admin token: %w", err)
	}

	if err := st.adminDo(ctx, http.MethodPost, "/upstreams", map[string]string{
		"name": "default", "vendor": "stripe", "secret": st.fake.secret,
	}, nil); err != nil {
		return st, fmt.Errorf("register upstream: %w", err)
	}
	var minted struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	if err := st.adminDo(ctx, http.MethodPost, "/keys", map[string]any{
		"name": "keybrake-load", "upstream": "default",
		"policy": map[string]any{
			"vendor": "stripe", "currency": "usd",
			"period_cap": policy.FormatMinor("usd", capMinor),
			"expires_at": time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339),
		},
	}, &minted); err != nil {
		return st, fmt.Errorf("mint key: %w", err)
	}
	st.keyID, st.vaultKey = minted.ID, minted.Token
	return st, nil
}

// serve serves h on a new 127.0.0.1 port and returns its base URL.
func (st *selfTarget) serve(ctx context.Context, h http.Handler) (string, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      upstreamTimeout + 45*time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
	st.servers = append(st.servers, srv)
	go func() { _ = srv.Serve(ln) }() // returns ErrServerClosed once Close shuts it down
	return "http://" + ln.Addr().String(), nil
}

// adminDo sends a JSON request to the admin API and decodes a 2xx answer into out.
func (st *selfTarget) adminDo(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, st.adminURL+"/api/v1"+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+st.admin)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// check fills s.Upstream from the fake Stripe and the key's usage, and records
// every broken invariant: Stripe moved more than the cap; keybrake metered less
// than Stripe moved; Stripe executed a different number of charges than keybrake
// answered 200 for the first time (requests without an answer aside).
func (st *selfTarget) check(ctx context.Context, s *Summary) error {
	var usage struct {
		Period struct {
			Committed string `json:"committed"`
			Held      string `json:"held"`
		} `json:"period"`
	}
	if err := st.adminDo(ctx, http.MethodGet, "/keys/"+url.PathEscape(st.keyID)+"/usage", nil, &usage); err != nil {
		return fmt.Errorf("read usage: %w", err)
	}
	committed, err := minor(usage.Period.Committed)
	if err != nil {
		return fmt.Errorf("usage committed: %w", err)
	}
	held, err := minor(usage.Period.Held)
	if err != nil {
		return fmt.Errorf("usage held: %w", err)
	}
	charges, amount := st.fake.totals()
	s.Upstream = &UpstreamStats{Charges: charges, Amount: amount, Cap: st.capMinor, Committed: committed, Held: held}

	if amount > st.capMinor {
		s.violate("OVER CAP: the fake Stripe executed %d minor units, the cap is %d", amount, st.capMinor)
	}
	if committed+held > st.capMinor {
		s.violate("keybrake's committed %d + held %d exceeds the cap %d", committed, held, st.capMinor)
	}
	if committed+held < amount {
		s.violate("UNMETERED: the fake Stripe executed %d minor units, keybrake metered %d committed + %d held", amount, committed, held)
	}
	if charges < int64(s.Fresh200) || charges > int64(s.Fresh200+s.Errors) {
		s.violate("the fake Stripe executed %d charges, keybrake answered %d fresh 200s (%d requests got no answer)",
			charges, s.Fresh200, s.Errors)
	}
	return nil
}

// minor converts a decimal usd amount to minor units.
func minor(s string) (int64, error) {
	d, err := policy.ParseAmount(s)
	if err != nil {
		return 0, fmt.Errorf("amount %q: %w", s, err)
	}
	n, err := policy.ToMinor("usd", d)
	if err != nil {
		return 0, fmt.Errorf("amount %q: %w", s, err)
	}
	return n, nil
}

// Close shuts the servers down, closes the store and removes the data directory.
func (st *selfTarget) Close() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, srv := range slices.Backward(st.servers) { // the proxy before its upstream
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shut down server: %w", err))
		}
	}
	if st.store != nil {
		if err := st.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
	}
	if st.dir != "" {
		if err := os.RemoveAll(st.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove data directory: %w", err))
		}
	}
	return errors.Join(errs...)
}
