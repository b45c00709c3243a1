package proxytest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// StripeMockKey is an API key stripe-mock accepts (it wants exactly three
// "_"-separated parts).
const StripeMockKey = "sk_test_123"

const (
	stripeMockModule    = "github.com/stripe/stripe-mock"
	stripeMockBuildTime = 5 * time.Minute
	stripeMockStartTime = 30 * time.Second
)

// StripeMock starts stripe-mock bound to 127.0.0.1 on two free ports (HTTP and
// HTTPS: it would otherwise open HTTPS on every interface) and returns its HTTP
// base URL. The process is killed by PID in tb.Cleanup.
//
// stripe-mock is a tool of the module (the tool directive of go.mod pins its
// version): `go tool -n stripe-mock` builds it once into the Go build cache,
// downloading the module first if need be, and names the binary, which is run
// directly so that its PID is the one to kill. When it cannot be built or
// started the test is skipped with the reason, or fails when the environment
// variable CI is "true".
func StripeMock(tb testing.TB) *url.URL {
	tb.Helper()
	bin, err := stripeMockBinary()
	if err != nil {
		stripeMockUnavailable(tb, err)
	}
	var lastErr error
	for range 3 { // a free port can be taken between probing and binding
		u, err := startStripeMock(tb, bin)
		if err == nil {
			return u
		}
		lastErr = err
	}
	stripeMockUnavailable(tb, lastErr)
	return nil
}

func stripeMockUnavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("stripe-mock unavailable: %v", err)
	}
	tb.Skipf("stripe-mock unavailable (set CI=true to make this fatal): %v", err)
}

// stripeMockBinary is the path of the stripe-mock tool, built once per test
// binary (and cached across them by the build cache).
var stripeMockBinary = sync.OnceValues(func() (string, error) {
	out, err := goCommand("tool", "-n", "stripe-mock")
	if err != nil {
		return "", err
	}
	bin := strings.TrimSpace(string(out))
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("go tool -n stripe-mock named %q, which is no file", bin)
	}
	return bin, nil
})

// findStripeMockModule says where the stripe-mock module of go.mod is, and its
// version: `go mod download` fetches it into the module cache first if need be.
var findStripeMockModule = sync.OnceValues(func() (stripeMockMod, error) {
	out, err := goCommand("mod", "download", "-json", stripeMockModule)
	if err != nil {
		return stripeMockMod{}, err
	}
	var mod stripeMockMod
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return stripeMockMod{}, fmt.Errorf("go mod download %s: no module directory in %q", stripeMockModule, clipOutput(string(out)))
	}
	return mod, nil
})

// stripeMockMod is what go mod download says of the stripe-mock module.
type stripeMockMod struct {
	Version string
	Dir     string
}

// goCommand runs the go command in the module's root directory (so that go.mod
// decides the versions) and returns its standard output.
func goCommand(args ...string) ([]byte, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("find the go command: %w", err)
	}
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), stripeMockBuildTime)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, clipOutput(stderr.String()))
	}
	return out, nil
}

// moduleRoot is the directory holding go.mod, above the test's working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test's working directory")
		}
		dir = parent
	}
}

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("probe a free port: %w", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", fmt.Errorf("close probe listener: %w", err)
	}
	return addr, nil
}

// syncBuffer collects a child's output for error messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() < 64<<10 {
		s.b.Write(p)
	}
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startStripeMock starts one stripe-mock process and waits until it answers.
func startStripeMock(tb testing.TB, bin string) (*url.URL, error) {
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	httpsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	out := &syncBuffer{}
	cmd := exec.Command(bin, "-http-addr", httpAddr, "-https-addr", httpsAddr)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	u := &url.URL{Scheme: "http", Host: httpAddr}
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(stripeMockStartTime)
	for {
		select {
		case err := <-exited:
			exited <- err
			return nil, fmt.Errorf("stripe-mock exited early (%v): %s", err, clipOutput(out.String()))
		default:
		}
		req, err := http.NewRequest(http.MethodGet, u.String()+"/v1/balance", nil)
		if err != nil {
			stop()
			return nil, fmt.Errorf("build readiness request: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+StripeMockKey)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("stripe-mock did not answer within %s: %s", stripeMockStartTime, clipOutput(out.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Cleanup(stop)
	return u, nil
}

func clipOutput(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}

// TestdataDir returns the repository's testdata directory, found by walking up from
// the working directory of the test to the directory holding go.mod.
func TestdataDir(tb testing.TB) string {
	tb.Helper()
	root, err := moduleRoot()
	if err != nil {
		tb.Fatalf("testdata: %v", err)
	}
	return filepath.Join(root, "testdata")
}

// CatalogueCase is one entry of testdata/catalogue/cases.json: a Stripe request and
// what the catalogue must say about it. Path is what Classify sees; Query (without
// "?") is sent along on a GET only, never classified. StripeMock marks valid
// samples that stripe-mock must accept (2xx).
type CatalogueCase struct {
	Name        string        `json:"name"`
	Method      string        `json:"method"`
	Path        string        `json:"path"`
	Query       string        `json:"query,omitempty"`
	Body        string        `json:"body,omitempty"`
	ContentType string        `json:"content_type,omitempty"`
	StripeMock  bool          `json:"stripe_mock,omitempty"`
	Note        string        `json:"note,omitempty"`
	Want        CatalogueWant `json:"want"`
}

// CatalogueWant is the expected classification of a CatalogueCase; Error is
// "malformed" when the request must be refused as malformed, else "".
type CatalogueWant struct {
	Operation   string      `json:"operation,omitempty"`
	Known       bool        `json:"known,omitempty"`
	MovesMoney  bool        `json:"moves_money,omitempty"`
	Direction   string      `json:"direction,omitempty"`
	Amount      int64       `json:"amount,omitempty"`
	Currency    string      `json:"currency,omitempty"`
	AmountKnown bool        `json:"amount_known,omitempty"`
	NewTotal    bool        `json:"new_total,omitempty"`
	Lookup      *CaseLookup `json:"lookup,omitempty"`
	Prices      []CasePrice `json:"prices,omitempty"`
	Customer    string      `json:"customer,omitempty"`
	ObjectID    string      `json:"object_id,omitempty"`
	Target      string      `json:"target,omitempty"`
	Creates     bool        `json:"creates,omitempty"`
	MinVersion  string      `json:"min_version,omitempty"`
	Error       string      `json:"error,omitempty"`
}

// CaseLookup is the expected Lookup of a CatalogueWant.
type CaseLookup struct {
	Path    string   `json:"path"`
	Field   string   `json:"field"`
	Factors []string `json:"factors,omitempty"`
	Signed  bool     `json:"signed,omitempty"`
}

// CasePrice is one expected stored price of a CatalogueWant.
type CasePrice struct {
	ID       string `json:"id"`
	Quantity int64  `json:"quantity"`
	OneTime  bool   `json:"one_time,omitempty"`
}

// MalformedCase is one entry of testdata/malformed/cases.json: a request the full
// proxy must refuse (WantStatus, WantCode). Path is raw and may carry a query.
// Unit says which refusal ParseForm/Classify alone give: "malformed" (an error
// wrapping ErrMalformed), "amount_unknown" (a money-moving classification with
// neither an amount nor a lookup), "unknown_write" (not in the catalogue), or ""
// when only the pipeline (headers, query, size, content type) can refuse it.
type MalformedCase struct {
	Name       string            `json:"name"`
	Method     string            `json:"method"`
	Path       string            `json:"path"`
	Headers    map[string]string `json:"headers,omitempty"`
	Body       string            `json:"body,omitempty"`
	BodyBase64 string            `json:"body_base64,omitempty"`
	PadTo      int               `json:"pad_to,omitempty"`
	WantStatus int               `json:"want_status"`
	WantCode   string            `json:"want_code"`
	Unit       string            `json:"unit,omitempty"`
	Note       string            `json:"note,omitempty"`
}

// RawBody returns the request body: BodyBase64 decoded when set, else Body; when
// PadTo is larger, "&description=xxx…" is appended until the body is PadTo bytes.
func (c MalformedCase) RawBody() ([]byte, error) {
	body := []byte(c.Body)
	if c.BodyBase64 != "" {
		b, err := base64.StdEncoding.DecodeString(c.BodyBase64)
		if err != nil {
			return nil, fmt.Errorf("case %s: body_base64: %w", c.Name, err)
		}
		body = b
	}
	const pad = "&description="
	if c.PadTo > len(body)+len(pad) {
		body = append(body, pad...)
		body = append(body, bytes.Repeat([]byte{'x'}, c.PadTo-len(body))...)
	}
	return body, nil
}

// CatalogueCases reads testdata/catalogue/cases.json (unknown fields are an error).
func CatalogueCases(tb testing.TB) []CatalogueCase {
	tb.Helper()
	var cases []CatalogueCase
	readCases(tb, filepath.Join(TestdataDir(tb), "catalogue", "cases.json"), &cases)
	return cases
}

// MalformedCases reads testdata/malformed/cases.json (unknown fields are an error).
func MalformedCases(tb testing.TB) []MalformedCase {
	tb.Helper()
	var cases []MalformedCase
	readCases(tb, filepath.Join(TestdataDir(tb), "malformed", "cases.json"), &cases)
	return cases
}

func readCases(tb testing.TB, path string, v any) {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("read cases: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		tb.Fatalf("decode %s: %v", filepath.Base(path), err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		tb.Fatalf("decode %s: data after the case list", filepath.Base(path))
	}
}
