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

func TestMCPNodeClient(t *testing.T) {
	t.Parallel()
	node, dir := MustNodeMCPClient(t)
	s := MustMCPServer(t)
	_, token := s.MustMint(t, "node-agent", map[string]any{"daily_cap": "50.00",
		"operations": []string{"payment_intents.create", "*.read"}})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "client.mjs"))
	cmd.Env = append(os.Environ(),
		"KEYBRAKE_MCP_URL="+s.ProxyURL()+"/mcp",
		"KEYBRAKE_VAULT_KEY="+token,
		"KEYBRAKE_MCP_TOOL=create_payment_intent",
		`KEYBRAKE_MCP_ARGS={"amount": 1200, "currency": "usd", "customer": "cus_node", "idempotency_key": "node-1"}`,
	)
	var stderr proxytest.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "client.mjs: %s", stderr.String())

	var got nodeAnswer
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
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
	assert.Contains(t, pay.Required, "idempotency_key")
	assert.Equal(t, true, got.Tools[tools["list_customers"]].Annotations["readOnlyHint"])

	require.False(t, got.Result.IsError, "%+v", got.Result.Content)
	assert.Equal(t, "payment_intent", got.Result.StructuredContent["object"])
	assert.Equal(t, float64(1200), got.Result.StructuredContent["amount"])
	pis := s.fake.CountWhere(func(r proxytest.Request) bool { return r.Path == "/v1/payment_intents" })
	assert.Equal(t, 1, pis, "the call reached Stripe once")
	assert.Equal(t, int64(1200), s.fake.TotalMoved("usd"))
}
