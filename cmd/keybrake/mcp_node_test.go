package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// The MCP endpoint with a second, independent client: the official TypeScript
// SDK's, run by Node from testdata/mcp-node (a pinned package.json and
// package-lock.json, and client.mjs).

// nodeClientSource is the client's source directory.
var nodeClientSource = filepath.Join("..", "..", "testdata", "mcp-node")

// nodeClientFiles are copied into the install directory; their digest names it.
var nodeClientFiles = []string{"package.json", "package-lock.json", "client.mjs"}

const nodeInstallTime = 5 * time.Minute

// MustNodeMCPClient returns the node binary and the directory holding client.mjs
// with its locked dependencies, installed once per version of the files with
// `npm ci` into os.UserCacheDir()/keybrake/mcp-node-<digest>/ (built in a private
// directory and renamed into place, so no test sees a half-installed one). Without
// node or npm, or when the install fails, the test is skipped, or fails when CI
// is "true".
func MustNodeMCPClient(tb testing.TB) (node, dir string) {
	tb.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		nodeUnavailable(tb, err)
	}
	dir, err = installNodeClient()
	if err != nil {
		nodeUnavailable(tb, err)
	}
	return node, dir
}

func nodeUnavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("the Node MCP client is unavailable: %v", err)
	}
	tb.Skipf("the Node MCP client is unavailable (set CI=true to make this fatal): %v", err)
}

func installNodeClient() (string, error) {
	h := sha256.New()
	for _, name := range nodeClientFiles {
		data, err := os.ReadFile(filepath.Join(nodeClientSource, name))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", name, len(data))
		h.Write(data)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("user cache dir: %w", err)
	}
	dir := filepath.Join(cache, "keybrake", "mcp-node-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err == nil {
		return dir, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "mcp-node-install-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, name := range nodeClientFiles {
		data, err := os.ReadFile(filepath.Join(nodeClientSource, name))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(tmp, name), data, 0o644); err != nil {
			return "", err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), nodeInstallTime)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm ci: %w: %s", err, out)
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, statErr := os.Stat(dir); statErr != nil { // not another test's install
			return "", fmt.Errorf("move the client into the cache: %w", err)
		}
	}
	return dir, nil
}

// nodeAnswer is what client.mjs prints.
type nodeAnswer struct {
	Server struct {
		Name string `json:"name"`
	} `json:"server"`
	Tools []struct {
		Name        string         `json:"name"`
		Annotations map[string]any `json:"annotations"`
		Required    []string       `json:"required"`
	} `json:"tools"`
	Result struct {
		IsError           bool           `json:"isError"`
		StructuredContent map[string]any `json:"structuredContent"`
		Content           []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"result"`
}

// MustRunNodeClient runs client.mjs once: a fresh connection that lists the
// tools and calls tool with the JSON arguments args.
func MustRunNodeClient(tb testing.TB, node, dir, url, token, tool, args string) nodeAnswer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "client.mjs"))
	cmd.Env = append(os.Environ(),
		"KEYBRAKE_MCP_URL="+url+"/mcp",
		"KEYBRAKE_VAULT_KEY="+token,
		"KEYBRAKE_MCP_TOOL="+tool,
		"KEYBRAKE_MCP_ARGS="+args,
	)
	var stderr proxytest.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(tb, err, "client.mjs: %s", stderr.String())
	var got nodeAnswer
	require.NoError(tb, json.Unmarshal(out, &got), "%s", out)
	return got
}

func TestMCPNodeClient(t *testing.T) {
	t.Parallel()
	node, dir := MustNodeMCPClient(t)
	s := MustMCPServer(t)
	_, token := s.MustMint(t, "node-agent", map[string]any{"daily_cap": "50.00",
		"operations": []string{"payment_intents.create", "*.read"}})

	got := MustRunNodeClient(t, node, dir, s.ProxyURL(), token, "create_payment_intent",
		`{"amount": 1200, "currency": "usd", "customer": "cus_node", "idempotency_key": "node-1"}`)
	assert.Equal(t, "keybrake", got.Server.Name)
	tools := map[string]int{}
	for i, tool := range got.Tools {
		tools[tool.Name] = i
	}
	require.Contains(t, tools, "create_payment_intent")
	require.Contains(t, tools, "list_customers")
	assert.NotContains(t, tools, "create_refund", "the policy does not allow refunds")
	pay := got.Tools[tools["create_payment_intent"]]
	assert.Equal(t, true, pay.Annotations["destructiveHint"])
	assert.ElementsMatch(t, []string{"amount", "currency"}, pay.Required, "keybrake derives a missing idempotency key")
	assert.Equal(t, true, got.Tools[tools["list_customers"]].Annotations["readOnlyHint"])

	require.False(t, got.Result.IsError, "%+v", got.Result.Content)
	assert.Equal(t, "payment_intent", got.Result.StructuredContent["object"])
	assert.Equal(t, float64(1200), got.Result.StructuredContent["amount"])
	pis := s.fake.CountWhere(func(r proxytest.Request) bool { return r.Path == "/v1/payment_intents" })
	assert.Equal(t, 1, pis, "the call reached Stripe once")
	assert.Equal(t, int64(1200), s.fake.TotalMoved("usd"))
}

// TestMCPNodeGenericTools: an agent written against Stripe's hosted server,
// through the TypeScript SDK. It retries blindly — a second process sends the
// same stripe_api_write again, with no idempotency_key — and the money moves
// once; a refusal reads as Stripe's server writes errors.
func TestMCPNodeGenericTools(t *testing.T) {
	t.Parallel()
	node, dir := MustNodeMCPClient(t)
	s := MustMCPServer(t)
	_, token := s.MustMint(t, "node-generic", map[string]any{"daily_cap": "50.00", "operations": []string{"charges.create"}})

	const charge = `{"stripe_api_operation_id": "PostCharges", "parameters": {"amount": 900, "currency": "usd", "source": "tok_visa"}}`
	first := MustRunNodeClient(t, node, dir, s.ProxyURL(), token, "stripe_api_write", charge)
	require.False(t, first.Result.IsError, "%+v", first.Result.Content)
	again := MustRunNodeClient(t, node, dir, s.ProxyURL(), token, "stripe_api_write", charge)
	require.False(t, again.Result.IsError, "%+v", again.Result.Content)
	assert.Equal(t, first.Result.StructuredContent["id"], again.Result.StructuredContent["id"])
	assert.Len(t, s.fake.Charges(), 1, "the blind retry moved no money")
	assert.Equal(t, int64(900), s.fake.TotalMoved("usd"))
	var notes []string
	for _, c := range again.Result.Content {
		notes = append(notes, c.Text)
	}
	assert.Contains(t, fmt.Sprint(notes), "stored answer of the first call")

	refund := MustRunNodeClient(t, node, dir, s.ProxyURL(), token, "stripe_api_write",
		`{"stripe_api_operation_id": "PostRefunds", "parameters": {"charge": "ch_1"}}`)
	require.True(t, refund.Result.IsError)
	require.NotEmpty(t, refund.Result.Content)
	assert.Regexp(t, `^Stripe API error: keybrake refused this call \(operation_not_allowed\): operation "refunds.create"`,
		refund.Result.Content[0].Text)
	assert.Equal(t, "operation_not_allowed", refund.Result.StructuredContent["code"])
	assert.Equal(t, "keybrake", refund.Result.StructuredContent["source"])
	assert.Len(t, s.fake.Requests(), 1, "the refusal reached no Stripe")
}
