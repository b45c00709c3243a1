package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

func TestProblemForMapsEveryDomainError(t *testing.T) {
	t.Parallel()
	verr := &policy.ValidationError{Errors: []policy.FieldError{
		{Field: "daily_cap", Message: "must be positive"},
		{Field: "expires_at", Message: "must be in the future"},
	}}
	cases := map[string]struct {
		err      error
		status   int
		typ      string
		internal bool
		fields   int
	}{
		"not found":           {err: fmt.Errorf("get key k: %w", vault.ErrNotFound), status: 404, typ: ProblemNotFound},
		"conflict":            {err: fmt.Errorf("mint: %w", vault.ErrConflict), status: 409, typ: ProblemConflict},
		"invalid":             {err: fmt.Errorf("cursor: %w", vault.ErrInvalid), status: 422, typ: ProblemValidation},
		"validation error":    {err: fmt.Errorf("update: %w", verr), status: 422, typ: ProblemValidation, fields: 2},
		"validation+invalid":  {err: fmt.Errorf("update: %w: %w", vault.ErrInvalid, verr), status: 422, typ: ProblemValidation, fields: 2},
		"revoked":             {err: vault.ErrKeyRevoked, status: 409, typ: ProblemConflict},
		"expired":             {err: vault.ErrKeyExpired, status: 409, typ: ProblemConflict},
		"closed":              {err: vault.ErrClosed, status: 503, typ: ProblemUnavailable},
		"sealed is internal":  {err: fmt.Errorf("unseal: %w", vault.ErrSealed), status: 500, typ: ProblemInternal, internal: true},
		"plain error":         {err: errors.New("disk on fire"), status: 500, typ: ProblemInternal, internal: true},
		"echo not found":      {err: echo.ErrNotFound, status: 404, typ: ProblemNotFound},
		"echo 405":            {err: echo.ErrMethodNotAllowed, status: 405, typ: ProblemMethodNotAllowed},
		"echo 500":            {err: echo.NewHTTPError(500, "boom"), status: 500, typ: ProblemInternal, internal: true},
		"max bytes":           {err: fmt.Errorf("read: %w", &http.MaxBytesError{Limit: 10}), status: 413, typ: ProblemTooLarge},
		"problem passes":      {err: fmt.Errorf("x: %w", newProblem(http.StatusForbidden, "no")), status: 403, typ: ProblemForbidden},
		"client gone":         {err: fmt.Errorf("list: %w", context.Canceled), status: 503, typ: ProblemUnavailable},
		"unknown status code": {err: newProblem(http.StatusTeapot, ""), status: 418, typ: "about:blank"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p, internal := problemFor(tc.err)
			assert.Equal(t, tc.status, p.Status)
			assert.Equal(t, tc.typ, p.Type)
			assert.Equal(t, tc.internal, internal)
			assert.Len(t, p.Errors, tc.fields)
			assert.NotEmpty(t, p.Title)
			if internal {
				assert.Equal(t, "internal server error", p.Detail, "no cause reaches the client")
			}
		})
	}
}

func TestPrefixFields(t *testing.T) {
	t.Parallel()
	got := prefixFields("policy", []policy.FieldError{
		{Field: "", Message: "a"}, {Field: "daily_cap", Message: "b"}, {Field: "[0]", Message: "c"},
	})
	assert.Equal(t, []string{"policy", "policy.daily_cap", "policy[0]"},
		[]string{got[0].Field, got[1].Field, got[2].Field})
}

func TestDecodeStrictWantsExactNames(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		body   string
		fields []string
	}{
		"exact":              {body: `{"name":"a","secret":"sk_x"}`},
		"other case":         {body: `{"Name":"a"}`, fields: []string{"Name"}},
		"both cases":         {body: `{"Name":"a","name":"b"}`, fields: []string{"Name"}},
		"unknown and a typo": {body: `{"nmae":"a","secert":"b"}`, fields: []string{"nmae", "secert"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var req putUpstreamRequest
			err := decodeStrict([]byte(tc.body), &req)
			if tc.fields == nil {
				assert.NoError(t, err)
				return
			}
			var p *Problem
			if assert.ErrorAs(t, err, &p) {
				assert.Equal(t, http.StatusUnprocessableEntity, p.Status)
				var got []string
				for _, fe := range p.Errors {
					got = append(got, fe.Field)
				}
				assert.Equal(t, tc.fields, got)
			}
		})
	}
}

func TestDomainDetailDropsOperationContext(t *testing.T) {
	t.Parallel()
	inner := fmt.Errorf("hold %q: %w", "hold_x", vault.ErrNotFound)
	err := fmt.Errorf("resolve hold hold_x: %w", fmt.Errorf("resolve hold: %w", inner))
	p, internal := problemFor(err)
	assert.False(t, internal)
	assert.Equal(t, http.StatusNotFound, p.Status)
	assert.Equal(t, `hold "hold_x": not found`, p.Detail)
	assert.Equal(t, "not found", domainDetail(vault.ErrNotFound), "a bare sentinel keeps its text")
}
