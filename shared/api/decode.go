package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/jsonstrict"
)

// decodeObject decodes body, which must be one JSON object, into dst (a
// pointer to a struct) strictly: a body that is not JSON, or gives a key
// twice, is a 400 invalid_json (checkJSON); an unknown field, a field
// whose case does not match and a value of the wrong type are 400s
// invalid_request that name the field.
func decodeObject(body []byte, dst any) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return jsonError("the request body is empty: a JSON object is required")
	}
	if err := checkJSON(trimmed); err != nil {
		return err
	}
	if trimmed[0] != '{' {
		return badRequest("the request body must be a JSON object, not %s", jsonKind(trimmed[0]))
	}
	if err := checkFields(trimmed, reflect.TypeOf(dst).Elem(), ""); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Type == reflect.TypeFor[fleetapi.Scope]():
			// Value quotes a string other than "*"; for another kind it
			// would say only what is already plain.
			if strings.HasPrefix(te.Value, "string ") {
				return badRequest(`%s: want "*" or an array of ids, got the %s`, fieldName(te.Field), te.Value)
			}
			return badRequest(`%s: want "*" or an array of ids`, fieldName(te.Field))
		case errors.As(err, &te):
			return badRequest("%s: want %s, got %s", fieldName(te.Field), jsonstrict.Want(te.Type), te.Value)
		}
		return badRequest("the request body is not valid: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// givenValue is field's value in body, a JSON object decodeObject
// accepted (so no key is given twice), when body gives it other than null:
// what a pointer field would have told.
func givenValue(body []byte, field string) (json.RawMessage, bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return nil, false
	}
	v, ok := obj[field]
	if !ok || string(v) == "null" {
		return nil, false
	}
	return v, true
}

// given reports whether body gives field, other than null.
func given(body []byte, field string) bool {
	_, ok := givenValue(body, field)
	return ok
}

// checkJSON refuses a non-empty body (trimmed) that is not one valid JSON
// value, or that gives a key twice in one object: encoding/json would keep
// the last value, so {"host": "a", "host": "b"} would mean b to Fleet and
// perhaps a to whatever read it before (shared/jsonstrict; issue 30). Both
// are 400 invalid_json, the duplicate named by its path and never its
// value.
func checkJSON(trimmed []byte) error {
	if !json.Valid(trimmed) {
		return invalidJSON(trimmed)
	}
	if err := jsonstrict.CheckDuplicateKeys(trimmed); err != nil {
		return jsonError("%s", err.Error())
	}
	return nil
}

// invalidJSON names what is wrong with a non-empty body that is not valid
// JSON: not JSON at all (a form-encoded body, as curl -d sends key=value,
// named as such), cut short, or malformed at a byte. Nothing of the body is
// quoted: it may hold a secret meant for a field.
func invalidJSON(body []byte) error {
	switch {
	case formEncoded(body):
		return jsonError("the request body is form-encoded (key=value), not JSON: send a JSON object such as {\"agent\": \"shell\"}")
	case jsonKind(body[0]) == "not JSON":
		return jsonError("the request body is not JSON")
	}
	return syntaxError(body)
}

// formEncoded reports whether body reads as application/x-www-form-urlencoded.
func formEncoded(body []byte) bool {
	if bytes.ContainsAny(body, " \t\r\n{}[]\"") {
		return false
	}
	v, err := url.ParseQuery(string(body))
	if err != nil || len(v) == 0 {
		return false
	}
	for k := range v {
		if k == "" {
			return false
		}
	}
	return bytes.IndexByte(body, '=') > 0
}

// syntaxError locates a JSON syntax error for the message: a body cut
// short (truncated in transit, or a shell quote that ended it) is named as
// such.
func syntaxError(body []byte) error {
	// The decoder, unlike Unmarshal, tells a body cut short from a bad byte.
	var v any
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&v); errors.Is(err, io.ErrUnexpectedEOF) {
		return jsonError("the request body is truncated JSON: it ends after %d bytes, before the value closes", len(body))
	}
	err := json.Unmarshal(body, &v)
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return jsonError("malformed JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	}
	return jsonError("malformed JSON: %v", err)
}

// checkFields walks a JSON value against the Go type it decodes into and
// refuses object keys the type does not have by their exact name:
// encoding/json alone would accept "Agent" for "agent". Types with their
// own UnmarshalJSON, and json.RawMessage, are left to themselves.
func checkFields(raw []byte, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeOf(json.RawMessage(nil)) || reflect.PointerTo(t).Implements(reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()) {
		return nil
	}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if trimmed[0] != '{' {
			return badRequest("%s: want an object, got %s", fieldName(path), jsonKind(trimmed[0]))
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(trimmed, &obj); err != nil {
			return badRequest("%s: malformed object", fieldName(path))
		}
		fields := jsonFields(t)
		for key, val := range obj {
			ft, ok := fields[key]
			if !ok {
				for name := range fields {
					if strings.EqualFold(name, key) {
						return badRequest("unknown field %q (did you mean %q?)", join(path, key), join(path, name))
					}
				}
				return badRequest("unknown field %q", join(path, key))
			}
			if err := checkFields(val, ft, join(path, key)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if trimmed[0] != '[' {
			return nil // the decoder reports the type mismatch with the field
		}
		var elems []json.RawMessage
		if err := json.Unmarshal(trimmed, &elems); err != nil {
			return badRequest("%s: malformed array", fieldName(path))
		}
		for i, e := range elems {
			if err := checkFields(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if trimmed[0] != '{' {
			return nil
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(trimmed, &obj); err != nil {
			return badRequest("%s: malformed object", fieldName(path))
		}
		for k, v := range obj {
			if err := checkFields(v, t.Elem(), fmt.Sprintf("%s[%q]", path, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func fieldName(path string) string {
	if path == "" {
		return "the request body"
	}
	return path
}

func jsonKind(first byte) string {
	switch first {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	case '{':
		return "an object"
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return "a number"
	}
	return "not JSON"
}

// query is a request's query string, checked against what the route takes.
type query struct{ values url.Values }

// parseQuery refuses a malformed query string, a parameter the route does
// not take, and a parameter given twice.
func parseQuery(raw string, allowed []string) (query, error) {
	v, err := url.ParseQuery(raw)
	if err != nil {
		return query{}, badRequest("malformed query string")
	}
	for name, vals := range v {
		if !slices.Contains(allowed, name) {
			if len(allowed) == 0 {
				return query{}, badRequest("unknown query parameter %q: this route takes none", name)
			}
			return query{}, badRequest("unknown query parameter %q: this route takes %s", name, strings.Join(allowed, ", "))
		}
		if len(vals) > 1 {
			return query{}, badRequest("query parameter %q is given more than once", name)
		}
	}
	return query{values: v}, nil
}

func (q query) has(name string) bool   { return q.values.Has(name) }
func (q query) get(name string) string { return q.values.Get(name) }

// pageLimit reads a list route's optional limit parameter, the one rule
// for every list of the API: absent is 0 (the route's default page);
// given, it is an integer from 1 to max, digits only, and anything else
// (0, -1, 2.5, max+1, "", a number beyond int64) is a 400 naming the
// range. Neither 0 nor an excess is taken for something else: a client
// asking for 5000 learns the bound rather than getting 1000 unawares.
func (q query) pageLimit(max int) (int, error) {
	const name = "limit"
	if !q.has(name) {
		return 0, nil
	}
	s := q.get(name)
	n, err := strconv.Atoi(s)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" || err != nil || n < 1 || n > max {
		return 0, badRequest("%s=%q: want an integer from 1 to %d (or omit it for the default page)", name, truncate(s, 40), max)
	}
	return n, nil
}

// nonNegativeInt reads an optional integer parameter: digits only, so
// "Infinity", "2.5", "-1", "1e3", "+1" and "" are 400s naming it. A value
// beyond int64 reads as math.MaxInt64 (callers clamp).
func (q query) nonNegativeInt(name string) (int64, bool, error) {
	if !q.has(name) {
		return 0, false, nil
	}
	s := q.get(name)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false, badRequest("%s=%q: want a non-negative integer", name, truncate(s, 40))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		n = math.MaxInt64
	}
	return n, true, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// boolFlag reads an optional flag: 1/true or 0/false.
func (q query) boolFlag(name string) (bool, error) {
	if !q.has(name) {
		return false, nil
	}
	switch q.get(name) {
	case "1", "true":
		return true, nil
	case "0", "false":
		return false, nil
	}
	return false, badRequest("%s=%q: want 1 or 0", name, q.get(name))
}

// Query is a request's query string parsed as the API parses it, for the
// stream handler: a malformed string, an unknown parameter and a repeated
// one are 400s naming it.
type Query struct{ q query }

// ParseQuery parses raw, allowing only the named parameters.
func ParseQuery(raw string, allowed ...string) (Query, error) {
	q, err := parseQuery(raw, allowed)
	return Query{q}, err
}

// Has reports whether the parameter is present (empty or not).
func (q Query) Has(name string) bool { return q.q.has(name) }

// Get returns the parameter's value, "" when absent.
func (q Query) Get(name string) string { return q.q.get(name) }

// NonNegativeInt reads an optional non-negative integer parameter as the
// API does (digits only; beyond int64 reads as math.MaxInt64).
func (q Query) NonNegativeInt(name string) (int64, bool, error) { return q.q.nonNegativeInt(name) }

// BoolFlag reads an optional flag as the API does: 1/true or 0/false.
func (q Query) BoolFlag(name string) (bool, error) { return q.q.boolFlag(name) }

// NonNegativeInt parses a non-negative integer given outside the query (a
// header such as Last-Event-ID) with the same rule, the error naming it.
func NonNegativeInt(name, value string) (int64, error) {
	v, _, err := query{values: url.Values{name: {value}}}.nonNegativeInt(name)
	return v, err
}
