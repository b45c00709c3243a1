package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/policy/strictjson"
)

// DefaultMaxBodyBytes is the admin API's request body limit, and the agent
// endpoints' when ProxyConfig.AgentMaxBodyBytes is zero.
const DefaultMaxBodyBytes = 64 << 10

// Media types a request body may carry.
const (
	mediaJSON       = "application/json"
	mediaMergePatch = "application/merge-patch+json"
)

// readJSONBody reads the request body (at most limit bytes) and checks that it is one
// well-formed JSON value without duplicate member names.
//
// The answers are deliberate: a body over the limit is 413; a Content-Type other than
// JSON is 415; an empty body or JSON that does not parse is 400 (malformed); a
// duplicate member name is 422 (well-formed, but one of the two values would be
// silently ignored).
func readJSONBody(c echo.Context, limit int64) ([]byte, error) {
	req := c.Request()
	if ct := req.Header.Get(echo.HeaderContentType); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != mediaJSON && mt != mediaMergePatch) {
			return nil, newProblem(http.StatusUnsupportedMediaType,
				"request bodies must be application/json or application/merge-patch+json")
		}
	}
	if req.ContentLength > limit {
		return nil, newProblem(http.StatusRequestEntityTooLarge,
			fmt.Sprintf("request body is larger than %d bytes", limit))
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), req.Body, limit))
	if err != nil {
		var merr *http.MaxBytesError
		if errors.As(err, &merr) {
			return nil, newProblem(http.StatusRequestEntityTooLarge,
				fmt.Sprintf("request body is larger than %d bytes", limit))
		}
		return nil, newProblem(http.StatusBadRequest, "cannot read request body")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, newProblem(http.StatusBadRequest, "request body is empty; a JSON object is expected")
	}
	if !json.Valid(body) {
		var v any
		detail := "request body is not valid JSON"
		var serr *json.SyntaxError
		if err := json.Unmarshal(body, &v); errors.As(err, &serr) {
			detail = fmt.Sprintf("request body is not valid JSON: %s (at byte %d)", serr.Error(), serr.Offset)
		}
		return nil, newProblem(http.StatusBadRequest, detail)
	}
	if dups, _ := strictjson.Duplicates(body, 0); len(dups) > 0 {
		return nil, validationProblem("the request is not valid",
			policy.FieldError{Field: dups[0].Path, Message: "appears more than once"})
	}
	return body, nil
}

// bindJSON reads the request body (readJSONBody) and decodes it into dst
// (decodeStrict): the one way every handler takes a JSON body.
func bindJSON(c echo.Context, limit int64, dst any) error {
	body, err := readJSONBody(c, limit)
	if err != nil {
		return err
	}
	return decodeStrict(body, dst)
}

// decodeStrict decodes well-formed JSON into dst, refusing unknown fields and values
// of the wrong type. Every failure is a 422 naming the field: the JSON is well
// formed, it just does not fit (an unknown field is usually a typo, and a typo in a
// cap must never pass silently as "no cap").
func decodeStrict(body []byte, dst any) error {
	if err := checkExactMembers(body, dst); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(dst); err != nil {
		return decodeProblem(err, "")
	}
	return nil
}

// checkExactMembers refuses object members whose names match a field of the struct
// dst only case-insensitively: encoding/json would accept "Name" for "name", and
// {"Name":"a","name":"b"} would then silently keep one of the two.
func checkExactMembers(body []byte, dst any) error {
	t := reflect.TypeOf(dst)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil // not an object: the typed decode reports it
	}
	known := map[string]bool{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			known[name] = true
		}
	}
	var errs []policy.FieldError
	for _, name := range slices.Sorted(maps.Keys(members)) {
		if !known[name] {
			errs = append(errs, fieldError(name, "unknown field"))
		}
	}
	if len(errs) > 0 {
		return validationProblem("the request is not valid", errs...)
	}
	return nil
}

// decodeProblem turns a json decoding error into a 422 problem with a field name.
func decodeProblem(err error, prefix string) *Problem {
	field, msg := prefix, strings.TrimPrefix(err.Error(), "json: ")
	var terr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &terr):
		field = joinField(prefix, terr.Field)
		msg = fmt.Sprintf("must be %s, not %s", jsonTypeName(terr.Type.String()), terr.Value)
	case strings.HasPrefix(msg, "unknown field "):
		name, uerr := strconv.Unquote(strings.TrimPrefix(msg, "unknown field "))
		if uerr == nil {
			field = joinField(prefix, name)
		}
		msg = "unknown field"
	}
	if field == "" {
		field = "body"
	}
	return validationProblem("the request is not valid", policy.FieldError{Field: field, Message: msg})
}

// joinField joins a prefix and a field path with a dot.
func joinField(prefix, field string) string {
	switch {
	case prefix == "":
		return field
	case field == "":
		return prefix
	default:
		return prefix + "." + field
	}
}

// jsonTypeName names a Go type the way a JSON client thinks of it.
func jsonTypeName(goType string) string {
	switch {
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "map["), strings.HasPrefix(goType, "struct"), strings.HasPrefix(goType, "api."):
		return "an object"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case goType == "bool":
		return "a boolean"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"), strings.HasPrefix(goType, "float"):
		return "a number"
	default:
		return "of another type"
	}
}
