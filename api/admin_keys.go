package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// Limits on names and labels.
const (
	maxNameLen       = 200
	maxLabels        = 64
	maxLabelKeyLen   = 63
	maxLabelValueLen = 256
	defaultUpstream  = "default"
)

// mintKeyRequest is the body of POST /api/v1/keys.
type mintKeyRequest struct {
	Name     string          `json:"name"`
	Upstream string          `json:"upstream"`
	Labels   json.RawMessage `json:"labels"`
	Policy   json.RawMessage `json:"policy"`
}

// mintKey handles POST /api/v1/keys.
func (a *admin) mintKey(c echo.Context) error {
	var req mintKeyRequest
	if err := bindJSON(c, DefaultMaxBodyBytes, &req); err != nil {
		return err
	}
	now := a.now()
	var errs []policy.FieldError
	errs = append(errs, checkName("name", req.Name)...)
	if req.Upstream == "" {
		req.Upstream = defaultUpstream
	}
	errs = append(errs, checkName("upstream", req.Upstream)...)
	labels, lerrs := decodeLabels(req.Labels)
	errs = append(errs, lerrs...)
	errs = append(errs, checkLabels(labels)...)
	var p policy.Policy
	if isAbsent(req.Policy) {
		errs = append(errs, fieldError("policy", "required"))
	} else if err := json.Unmarshal(req.Policy, &p); err != nil {
		errs = append(errs, policyDecodeErrors(err)...)
	} else {
		errs = append(errs, checkPolicy(&p, now)...)
	}
	if len(errs) > 0 {
		return validationProblem("the key cannot be minted", errs...)
	}

	key, token, err := a.store.MintKey(c.Request().Context(), actor(c), vault.MintRequest{
		Name:     req.Name,
		Upstream: req.Upstream,
		Labels:   labels,
		Policy:   p,
	})
	switch {
	case errors.Is(err, vault.ErrNotFound):
		return validationProblem("the key cannot be minted",
			fieldError("upstream", fmt.Sprintf("no upstream named %q; register it with POST /api/v1/upstreams", req.Upstream)))
	case errors.Is(err, vault.ErrConflict):
		return newProblem(http.StatusConflict, fmt.Sprintf("a key named %q already exists", req.Name))
	case err != nil:
		return mapPolicyError(fmt.Errorf("mint key: %w", err))
	}
	c.Response().Header().Set(echo.HeaderLocation, "/api/v1/keys/"+key.ID)
	v := newKeyView(key, now)
	v.Warnings = key.Policy.Warnings()
	return a.keyJSON(c, http.StatusCreated, key, keyWithTokenView{keyView: v, Token: token, BaseURL: a.publicURL})
}

// keyListView is the answer of GET /api/v1/keys.
type keyListView struct {
	Keys []keyView `json:"keys"`
	page
}

// listKeys handles GET /api/v1/keys.
func (a *admin) listKeys(c echo.Context) error {
	q, err := query(c, "status", "label", "upstream", "q", "limit", "cursor")
	if err != nil {
		return err
	}
	f := vault.KeyFilter{Upstream: q.Get("upstream"), NamePrefix: q.Get("q")}
	var errs []policy.FieldError
	switch s := vault.KeyStatus(q.Get("status")); s {
	case "", vault.KeyActive, vault.KeyRevoked, vault.KeyExpired:
		f.Status = s
	default:
		errs = append(errs, fieldError("status", `must be "active", "revoked" or "expired"`))
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, ":")
		if !ok || k == "" {
			errs = append(errs, fieldError("label", fmt.Sprintf("%q must be key:value", l)))
			continue
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		if old, dup := f.Labels[k]; dup && old != v {
			errs = append(errs, fieldError("label", fmt.Sprintf("label %q is filtered on twice with different values", k)))
			continue
		}
		f.Labels[k] = v
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	if len(errs) > 0 {
		return validationProblem("the request is not valid", errs...)
	}
	f.Limit, f.Cursor = limit, cursor
	keys, next, err := a.store.ListKeys(c.Request().Context(), f)
	if err != nil {
		return cursorError(fmt.Errorf("list keys: %w", err))
	}
	now := a.now()
	return c.JSON(http.StatusOK, keyListView{
		Keys: viewsOf(keys, func(k vault.Key) keyView { return newKeyView(k, now) }),
		page: page{NextCursor: next},
	})
}

// getKey handles GET /api/v1/keys/{id}: the key with its usage.
func (a *admin) getKey(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	key, windows, usage, err := a.store.KeyUsage(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("get key %s: %w", id, err)
	}
	v := newKeyView(key, a.now())
	v.Usage = newUsageView(key, windows, usage, a.now())
	return a.keyJSON(c, http.StatusOK, key, v)
}

// keyUsage handles GET /api/v1/keys/{id}/usage.
func (a *admin) keyUsage(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	key, windows, usage, err := a.store.KeyUsage(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("key usage %s: %w", id, err)
	}
	return c.JSON(http.StatusOK, newUsageView(key, windows, usage, a.now()))
}

// patchKeyRequest is the body of PATCH /api/v1/keys/{id}: a JSON merge patch
// (RFC 7386) of the key's policy and labels.
type patchKeyRequest struct {
	Policy json.RawMessage `json:"policy"`
	Labels json.RawMessage `json:"labels"`
}

// patchKey handles PATCH /api/v1/keys/{id}. The patched policy is validated exactly
// like a new one; usage is never touched.
func (a *admin) patchKey(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	var req patchKeyRequest
	if err := bindJSON(c, DefaultMaxBodyBytes, &req); err != nil {
		return err
	}
	var (
		labelPatch map[string]*string
		labelsNull bool
		errs       []policy.FieldError
	)
	switch {
	case req.Labels == nil:
	case isNull(req.Labels):
		labelsNull = true
	default:
		labelPatch, errs = decodeLabelPatch(req.Labels)
	}
	if req.Policy != nil && isNull(req.Policy) {
		errs = append(errs, fieldError("policy", "cannot be removed; patch its fields instead"))
	}
	if len(errs) > 0 {
		return validationProblem("the key cannot be changed", errs...)
	}

	ifVersion, err := ifMatchVersion(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	if req.Policy == nil && req.Labels == nil {
		// An empty merge patch changes nothing: answer with the key as it is.
		key, err := a.store.GetKey(ctx, id)
		if err != nil {
			return fmt.Errorf("patch key %s: %w", id, err)
		}
		if ifVersion != 0 && ifVersion != key.Version {
			return fmt.Errorf("patch key %s: %w", id, vault.ErrPrecondition)
		}
		return a.keyJSON(c, http.StatusOK, key, newKeyView(key, a.now()))
	}
	// The merge patch is applied inside the store's transaction, to the key
	// as it is under its lock: a patch of another field that another replica
	// commits meanwhile is never written over.
	updated, err := a.store.PatchKey(ctx, actor(c), id, vault.KeyChange{
		IfVersion: ifVersion,
		Apply: func(key vault.Key, now time.Time) (policy.Policy, map[string]string, error) {
			var errs []policy.FieldError
			p := key.Policy
			if req.Policy != nil {
				patched, err := key.Policy.MergePatch(req.Policy)
				if err != nil {
					errs = append(errs, policyDecodeErrors(err)...)
				} else {
					p = patched
					errs = append(errs, checkPolicy(&p, now)...)
				}
			}
			labels := mergeLabels(key.Labels, labelPatch, labelsNull)
			if req.Labels != nil {
				errs = append(errs, checkLabels(labels)...)
			}
			if len(errs) > 0 {
				return policy.Policy{}, nil, validationProblem("the key cannot be changed", errs...)
			}
			return p, labels, nil
		},
	})
	if err != nil {
		return mapPolicyError(fmt.Errorf("patch key %s: %w", id, err))
	}
	v := newKeyView(updated, a.now())
	v.Warnings = updated.Policy.Warnings()
	return a.keyJSON(c, http.StatusOK, updated, v)
}

// keyETag is the entity tag of a key's version: it changes with every write
// of the key.
func keyETag(k vault.Key) string { return `"` + strconv.FormatUint(k.Version, 10) + `"` }

// keyJSON answers with v, the view of key, and key's ETag.
func (a *admin) keyJSON(c echo.Context, status int, key vault.Key, v any) error {
	c.Response().Header().Set("ETag", keyETag(key))
	return c.JSON(status, v)
}

// ifMatchVersion reads the If-Match header of a change of a key: 0 when there
// is none or it is "*" (the key only has to exist), else the version of the
// one strong ETag it names. An ETag keybrake never gave (a weak one, a list,
// anything else) can match no key: 412.
func ifMatchVersion(c echo.Context) (uint64, error) {
	raw := strings.TrimSpace(c.Request().Header.Get("If-Match"))
	if raw == "" || raw == "*" {
		return 0, nil
	}
	inner, ok := strings.CutPrefix(raw, `"`)
	if ok {
		inner, ok = strings.CutSuffix(inner, `"`)
	}
	v, err := strconv.ParseUint(inner, 10, 64)
	if !ok || err != nil || v == 0 {
		return 0, newProblem(http.StatusPreconditionFailed, fmt.Sprintf("If-Match %q is no ETag of a key (a key's ETag is a quoted version, such as \"3\")", raw))
	}
	return v, nil
}

// revokeKey handles POST /api/v1/keys/{id}/revoke.
func (a *admin) revokeKey(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	key, err := a.store.RevokeKey(c.Request().Context(), actor(c), id)
	if err != nil {
		return fmt.Errorf("revoke key %s: %w", id, err)
	}
	return a.keyJSON(c, http.StatusOK, key, newKeyView(key, a.now()))
}

// rotateKey handles POST /api/v1/keys/{id}/rotate: a new token, shown once.
func (a *admin) rotateKey(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	key, token, err := a.store.RotateKey(c.Request().Context(), actor(c), id)
	if err != nil {
		return fmt.Errorf("rotate key %s: %w", id, err)
	}
	return a.keyJSON(c, http.StatusOK, key, keyWithTokenView{
		keyView: newKeyView(key, a.now()),
		Token:   token,
		BaseURL: a.publicURL,
	})
}

// eventListView is the answer of GET /api/v1/keys/{id}/events.
type eventListView struct {
	Events []eventView `json:"events"`
	page
}

// keyEvents handles GET /api/v1/keys/{id}/events: newest first.
func (a *admin) keyEvents(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	limit, cursor, err := pageQuery(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	if _, err := a.store.GetKey(ctx, id); err != nil {
		return fmt.Errorf("key events %s: %w", id, err)
	}
	events, next, err := a.store.ListEvents(ctx, id, limit, cursor)
	if err != nil {
		return cursorError(fmt.Errorf("key events %s: %w", id, err))
	}
	return c.JSON(http.StatusOK, eventListView{Events: viewsOf(events, newEventView), page: page{NextCursor: next}})
}

// mergeLabels applies a JSON merge patch of labels (null deletes a label; a null
// labels member deletes them all) and returns the new set.
func mergeLabels(current map[string]string, patch map[string]*string, clear bool) map[string]string {
	out := map[string]string{}
	if !clear {
		maps.Copy(out, current)
	}
	for k, v := range patch {
		if v == nil {
			delete(out, k)
			continue
		}
		out[k] = *v
	}
	return out
}

// decodeLabels reads the labels of a new key: an object of strings (absent or null:
// none).
func decodeLabels(raw json.RawMessage) (map[string]string, []policy.FieldError) {
	if isAbsent(raw) {
		return nil, nil
	}
	patch, errs := decodeLabelPatch(raw)
	labels := make(map[string]string, len(patch))
	for _, k := range slices.Sorted(maps.Keys(patch)) {
		if patch[k] == nil {
			errs = append(errs, fieldError("labels."+k, "must be a string"))
			continue
		}
		labels[k] = *patch[k]
	}
	return labels, errs
}

// decodeLabelPatch reads a merge patch of labels: an object whose values are strings
// (set) or null (delete). Anything else is a field error naming the label.
func decodeLabelPatch(raw json.RawMessage) (map[string]*string, []policy.FieldError) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return nil, []policy.FieldError{fieldError("labels", "must be an object of strings")}
	}
	patch := make(map[string]*string, len(members))
	var errs []policy.FieldError
	for _, k := range slices.Sorted(maps.Keys(members)) {
		v := members[k]
		if isNull(v) {
			patch[k] = nil
			continue
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			errs = append(errs, fieldError("labels."+k, "must be a string"))
			continue
		}
		patch[k] = &s
	}
	return patch, errs
}

// checkName checks a key or upstream name: 1–200 printable characters.
func checkName(field, name string) []policy.FieldError {
	switch {
	case name == "":
		return []policy.FieldError{fieldError(field, "required")}
	case utf8.RuneCountInString(name) > maxNameLen:
		return []policy.FieldError{fieldError(field, fmt.Sprintf("must be at most %d characters", maxNameLen))}
	case !printable(name):
		return []policy.FieldError{fieldError(field, "must be printable text without control characters")}
	}
	return nil
}

// checkLabels checks a key's labels: at most 64; keys 1–63 printable characters
// without ":" (label filters are key:value) and values up to 256 characters.
func checkLabels(labels map[string]string) []policy.FieldError {
	var errs []policy.FieldError
	if len(labels) > maxLabels {
		errs = append(errs, fieldError("labels", fmt.Sprintf("at most %d labels", maxLabels)))
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		v := labels[k]
		field := "labels." + k
		switch {
		case k == "":
			errs = append(errs, fieldError("labels", "a label name must not be empty"))
		case utf8.RuneCountInString(k) > maxLabelKeyLen || strings.Contains(k, ":") || !printable(k):
			errs = append(errs, fieldError(field, fmt.Sprintf("a label name is 1 to %d printable characters without ':'", maxLabelKeyLen)))
		}
		if utf8.RuneCountInString(v) > maxLabelValueLen || !printable(v) {
			errs = append(errs, fieldError(field, fmt.Sprintf("a label value is at most %d printable characters", maxLabelValueLen)))
		}
	}
	return errs
}

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// isAbsent reports whether a raw member was missing or null.
func isAbsent(raw json.RawMessage) bool { return raw == nil || isNull(raw) }

// isNull reports whether raw is the JSON null.
func isNull(raw json.RawMessage) bool { return strings.TrimSpace(string(raw)) == "null" }

// policyDecodeErrors turns a failure to read a policy document (canonical or legacy
// form, or a merge patch of it) into field errors under "policy".
func policyDecodeErrors(err error) []policy.FieldError {
	var verr *policy.ValidationError
	if errors.As(err, &verr) {
		return prefixFields("policy", verr.Errors)
	}
	return decodeProblem(err, "policy").Errors
}

// policyValidationErrors returns the field errors of a policy validation, under
// "policy"; nil when err is nil. A non-validation error is reported on "policy".
func policyValidationErrors(err error) []policy.FieldError {
	if err == nil {
		return nil
	}
	return policyDecodeErrors(err)
}

// checkPolicy applies the defaults to p and validates it as a new policy, with its
// field errors under "policy". period_start defaults to now to the second: nobody
// needs the nanoseconds, and they would be in every answer and audit entry.
func checkPolicy(p *policy.Policy, now time.Time) []policy.FieldError {
	p.Normalize(now.Truncate(time.Second))
	errs := policyValidationErrors(p.ValidateNew(now))
	errs = append(errs, checkOperations("policy.operations", p.Operations, errs)...)
	return append(errs, checkVelocityOperations("policy.velocity", p.Velocity, errs)...)
}

// checkVelocityOperations is checkOperations for the operations of each
// velocity limit in vs, under field: a limit whose glob matches nothing would
// count nothing, as silently.
func checkVelocityOperations(field string, vs []policy.Velocity, errs []policy.FieldError) []policy.FieldError {
	var out []policy.FieldError
	for i, v := range vs {
		out = append(out, checkOperations(fmt.Sprintf("%s[%d].operations", field, i), v.Operations, errs)...)
	}
	return out
}

// checkOperations refuses the operation globs of the list under field that
// match no operation keybrake knows (a typo would silently allow nothing),
// suggesting the closest names. A glob that already has an error (malformed)
// is left to that error.
func checkOperations(listField string, ops []string, errs []policy.FieldError) []policy.FieldError {
	var out []policy.FieldError
	for i, op := range ops {
		field := fmt.Sprintf("%s[%d]", listField, i)
		if slices.ContainsFunc(errs, func(fe policy.FieldError) bool { return fe.Field == field }) {
			continue
		}
		ok, suggestions := stripeapi.CheckOperation(op)
		if ok {
			continue
		}
		msg := fmt.Sprintf("%q is not an operation keybrake knows", op)
		if len(suggestions) > 0 {
			msg += fmt.Sprintf("; did you mean %s?", quoteList(suggestions))
		}
		out = append(out, fieldError(field, msg))
	}
	return out
}

// quoteList renders names as "a", "b" or "c".
func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// mapPolicyError puts the field errors of a policy validation the store returned under
// "policy"; other errors pass through to the error handler.
func mapPolicyError(err error) error {
	var verr *policy.ValidationError
	if errors.As(err, &verr) {
		return validationProblem("the policy is not valid", prefixFields("policy", verr.Errors)...)
	}
	return err
}
