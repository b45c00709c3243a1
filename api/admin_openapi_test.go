package api_test

import (
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
)

// echoParam matches an echo path parameter (":id").
var echoParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

// TestAdminOpenAPIDocumentMatchesRoutes loads the served document with kin-openapi,
// validates it, and checks that every route echo serves is documented and every
// documented operation (except the agent endpoints of the proxy listener) is served.
func TestAdminOpenAPIDocumentMatchesRoutes(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)

	// Served without a token, as JSON.
	r := env.Do(http.MethodGet, "/api/v1/openapi.json", "", nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
	doc := MustOpenAPIDoc(t, r.Body)
	assert.Equal(t, api.OpenAPIDocument(), r.Body)

	e, ok := env.handler.(*echo.Echo)
	require.True(t, ok, "NewAdmin returns an *echo.Echo")
	var served []string
	for _, rt := range e.Routes() {
		if rt.Path == "/" || rt.Path == "/ui" || strings.HasPrefix(rt.Path, api.UIPath) {
			continue // the web dashboard's pages, not the API
		}
		served = append(served, rt.Method+" "+echoParam.ReplaceAllString(rt.Path, "{$1}"))
	}
	sort.Strings(served)

	var documented []string
	agentTag := false
	for _, tag := range doc.Tags {
		if tag.Name == "agent" {
			agentTag = true
		}
	}
	assert.True(t, agentTag, `the document keeps the "agent" tag for the proxy listener's endpoints`)
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if slices.Contains(op.Tags, "agent") || slices.Contains(op.Tags, "stripe-events") {
				continue // served by the proxy listener
			}
			documented = append(documented, method+" "+path)
			assert.NotEmpty(t, op.OperationID, "%s %s has an operationId", method, path)
			assert.NotEmpty(t, op.Summary, "%s %s has a summary", method, path)
			public := path == "/healthz" || path == "/readyz" || path == "/api/v1/openapi.json" || path == "/metrics"
			if !public {
				assert.NotNil(t, op.Responses.Value("401"), "%s %s documents 401", method, path)
				assert.NotNil(t, op.Responses.Value("500"), "%s %s documents 500", method, path)
			}
			if method != http.MethodGet && !public {
				assert.NotNil(t, op.Responses.Value("403"), "%s %s documents 403 for viewers", method, path)
			}
		}
	}
	sort.Strings(documented)
	assert.Equal(t, served, documented, "served routes and documented operations differ")
	assert.Len(t, served, 57)

	// The document's problem types are the ones the server uses.
	assertProblemTypes(t, doc, "Problem",
		api.ProblemMalformed, api.ProblemUnauthorized, api.ProblemForbidden, api.ProblemNotFound,
		api.ProblemMethodNotAllowed, api.ProblemConflict, api.ProblemTooLarge, api.ProblemUnsupportedMedia,
		api.ProblemValidation, api.ProblemInternal, api.ProblemUnavailable, api.ProblemNoSpace,
		api.ProblemUpstreamUnavailable, api.ProblemUpstreamAuthFailed, api.ProblemUpstreamPermission,
		api.ProblemStripeObjectNotFound, api.ProblemStripeAnswerUnusable)
	assert.True(t, strings.HasPrefix(doc.OpenAPI, "3."), "OpenAPI 3 document")
}

// TestAgentOpenAPIDocumentMatchesRoutes holds the proxy listener's agent endpoints
// and the document's operations tagged "agent" together: every agent route is
// documented, every agent operation is served, and each says how it is
// authenticated (the vault key) and where it is served (the proxy listener).
func TestAgentOpenAPIDocumentMatchesRoutes(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	doc := MustOpenAPIDoc(t, api.OpenAPIDocument())

	h := api.NewProxyListener(api.ProxyConfig{Store: env.store, Stripe: http.NotFoundHandler()})
	e, ok := h.(*echo.Echo)
	require.True(t, ok, "NewProxyListener returns an *echo.Echo")
	var served []string
	for _, rt := range e.Routes() {
		if strings.HasPrefix(rt.Path, api.AgentPathPrefix) && rt.Path != api.StripeEventsPath {
			served = append(served, rt.Method+" "+echoParam.ReplaceAllString(rt.Path, "{$1}"))
		}
	}
	sort.Strings(served)

	var documented []string
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if slices.Contains(op.Tags, "stripe-events") {
				// Stripe's deliveries carry no vault key: their signature is their proof.
				assert.Equal(t, "POST /keybrake/v1/stripe/events/{upstream}", method+" "+path)
				require.NotNil(t, op.Security)
				assert.Empty(t, *op.Security, "no vault key")
				assert.NotEmpty(t, item.Servers, "served on the proxy listener")
				continue
			}
			if !slices.Contains(op.Tags, "agent") {
				assert.False(t, strings.HasPrefix(path, api.AgentPathPrefix), "%s %s is tagged agent", method, path)
				continue
			}
			documented = append(documented, method+" "+path)
			assert.True(t, strings.HasPrefix(path, api.AgentPathPrefix), "%s %s is under %s", method, path, api.AgentPathPrefix)
			assert.NotEmpty(t, op.OperationID, "%s %s has an operationId", method, path)
			assert.NotEmpty(t, op.Summary, "%s %s has a summary", method, path)
			require.NotNil(t, op.Security, "%s %s names its security", method, path)
			var schemes []string
			for _, req := range *op.Security {
				for name := range req {
					schemes = append(schemes, name)
				}
			}
			sort.Strings(schemes)
			assert.Equal(t, []string{"vaultKey", "vaultKeyBasic"}, schemes, "%s %s is authenticated with the vault key", method, path)
			assert.NotNil(t, op.Responses.Value("401"), "%s %s documents 401", method, path)
			assert.NotNil(t, op.Responses.Value("500"), "%s %s documents 500", method, path)
			assert.NotEmpty(t, item.Servers, "%s %s names the proxy listener as its server", method, path)
		}
	}
	sort.Strings(documented)
	assert.Equal(t, served, documented, "served agent routes and documented agent operations differ")
	assert.Len(t, served, 7)

	// The agent problem types are the general ones plus the claims API's.
	assertProblemTypes(t, doc, "AgentProblem",
		api.ProblemMalformed, api.ProblemUnauthorized, api.ProblemNotFound, api.ProblemMethodNotAllowed,
		api.ProblemTooLarge, api.ProblemUnsupportedMedia, api.ProblemValidation, api.ProblemInternal,
		api.ProblemClaimInProgress, api.ProblemClaimFingerprintMismatch, api.ProblemClaimNotOwner)
	for name, scheme := range map[string]string{"vaultKey": "bearer", "vaultKeyBasic": "basic"} {
		s := doc.Components.SecuritySchemes[name]
		require.NotNil(t, s, name)
		assert.Equal(t, scheme, s.Value.Scheme, name)
	}
}

// assertProblemTypes checks that the enum of the schema's type property lists every
// one of want.
func assertProblemTypes(t *testing.T, doc *openapi3.T, schema string, want ...string) {
	t.Helper()
	ref := doc.Components.Schemas[schema]
	require.NotNil(t, ref, schema)
	require.NotNil(t, ref.Value, schema)
	var types []string
	for _, v := range ref.Value.Properties["type"].Value.Enum {
		types = append(types, v.(string))
	}
	for _, typ := range want {
		assert.Contains(t, types, typ, schema)
	}
}
