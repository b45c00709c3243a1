package api

import _ "embed"

// openAPIJSON is the OpenAPI 3 document of the admin API.
//
//go:embed openapi.json
var openAPIJSON []byte

// OpenAPIDocument returns the OpenAPI 3 document of the admin API (served at
// GET /api/v1/openapi.json). The caller must not modify the returned slice.
func OpenAPIDocument() []byte { return openAPIJSON }
