package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/runfleet/runfleet/shared/jsonstrict"
)

// decodeStrict decodes data, one JSON object, into the struct v points to and
// returns every problem found rather than the first, each at its path: a
// key given twice (jsonstrict), a key no field takes, a value of the wrong
// JSON type, a value its type's UnmarshalJSON refuses. What can be decoded
// is, so the checks that follow see every other field.
//
// It decodes as encoding/json does for the shapes edge.json has (structs
// with json tags, maps with string keys, slices, pointers, strings, numbers,
// booleans and json.Unmarshaler types, null leaving a value as it is or
// setting a pointer, map or slice to nil), with two differences that make
// it stricter: a key must name its field exactly (encoding/json also takes
// "DataDir" for "dataDir"), and data must hold one JSON value and nothing
// after it.
//
// When nothing can be decoded (data is not JSON, or not an object) the one
// problem returned is the file's, with an empty Path.
func decodeStrict(data []byte, v any) Problems {
	if !json.Valid(data) {
		return Problems{syntaxProblem(data)}
	}
	if _, ok := objectMembers(data); !ok {
		return Problems{{Msg: "not a JSON object"}}
	}
	var ps Problems
	var dup *jsonstrict.DuplicateKeyError
	if errors.As(jsonstrict.CheckDuplicateKeys(data), &dup) {
		ps = append(ps, Problem{Path: dup.Path, Msg: "the key is given more than once (JSON keys must be unique)"})
	}
	decodeValue(data, reflect.ValueOf(v).Elem(), nil, &ps)
	return ps
}

// syntaxProblem says where data stops being JSON, by line and column.
func syntaxProblem(data []byte) Problem {
	var syn *json.SyntaxError
	if err := json.Unmarshal(data, new(any)); !errors.As(err, &syn) {
		return Problem{Msg: "not valid JSON"}
	}
	// Offset counts the bytes read up to and including the one at fault.
	pos := max(min(int(syn.Offset), len(data))-1, 0)
	line := 1 + bytes.Count(data[:pos], []byte("\n"))
	col := pos - bytes.LastIndexByte(data[:pos], '\n')
	return Problem{Msg: fmt.Sprintf("not valid JSON at line %d, column %d: %v", line, col, syn)}
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// pathDecoder is a type that decodes itself as decodeValue does, naming
// its problems by their paths below at; decodeValue prefers it to the
// type's UnmarshalJSON, which cannot know where it is.
type pathDecoder interface {
	decodeAt(raw []byte, at Path, ps *Problems)
}

func decodeValue(raw []byte, v reflect.Value, at Path, ps *Problems) {
	isNull := bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
	if v.Kind() == reflect.Pointer {
		if isNull {
			v.SetZero()
			return
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		decodeValue(raw, v.Elem(), at, ps)
		return
	}
	if d, ok := v.Addr().Interface().(pathDecoder); ok {
		d.decodeAt(raw, at, ps)
		return
	}
	if v.Addr().Type().Implements(unmarshalerType) {
		// As encoding/json, null included.
		if err := v.Addr().Interface().(json.Unmarshaler).UnmarshalJSON(raw); err != nil {
			ps.add(at, "%v", err)
		}
		return
	}
	if isNull {
		if k := v.Kind(); k == reflect.Map || k == reflect.Slice {
			v.SetZero()
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		decodeStruct(raw, v, at, ps)
	case reflect.Map:
		members, ok := objectMembers(raw)
		if !ok {
			ps.add(at, "must be an object")
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMapWithSize(v.Type(), len(members)))
		}
		for _, m := range members {
			elem := reflect.New(v.Type().Elem()).Elem()
			decodeValue(m.value, elem, at.Key(m.key), ps)
			v.SetMapIndex(reflect.ValueOf(m.key).Convert(v.Type().Key()), elem)
		}
	case reflect.Slice:
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			ps.add(at, "must be an array")
			return
		}
		s := reflect.MakeSlice(v.Type(), len(items), len(items))
		for i, item := range items {
			decodeValue(item, s.Index(i), at.Index(i), ps)
		}
		v.Set(s)
	default:
		// The value is never quoted: a field may hold what should have
		// gone into another (a secret in a path).
		if json.Unmarshal(raw, v.Addr().Interface()) != nil {
			ps.add(at, "must be %s", jsonstrict.Want(v.Type()))
		}
	}
}

func decodeStruct(raw []byte, v reflect.Value, at Path, ps *Problems) {
	members, ok := objectMembers(raw)
	if !ok {
		ps.add(at, "must be an object")
		return
	}
	fields := jsonFields(v.Type())
	for _, m := range members {
		i, ok := fields[m.key]
		if !ok {
			ps.add(at.Key(m.key), "unknown field; %s", suggest(m.key, fields))
			continue
		}
		decodeValue(m.value, v.Field(i), at.Key(m.key), ps)
	}
}

type member struct {
	key   string
	value json.RawMessage
}

// objectMembers are raw's members in the order written; ok is false when
// raw is not an object.
func objectMembers(raw []byte) (members []member, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		key, isKey := tok.(string)
		var value json.RawMessage
		if err != nil || !isKey || dec.Decode(&value) != nil {
			return nil, false
		}
		members = append(members, member{key, value})
	}
	return members, true
}

// jsonFields maps each JSON name of t's exported fields to its index.
func jsonFields(t reflect.Type) map[string]int {
	fields := map[string]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = i
	}
	return fields
}

// suggest names the field key was probably meant to be, or lists them.
func suggest(key string, fields map[string]int) string {
	names := make([]string, 0, len(fields))
	for n := range fields {
		names = append(names, n)
	}
	sort.Strings(names)
	best, bestDist := "", 3
	for _, n := range names {
		if d := editDistance(strings.ToLower(key), strings.ToLower(n)); d < bestDist && d <= len(key)/3+1 {
			best, bestDist = n, d
		}
	}
	if best != "" {
		return fmt.Sprintf("did you mean %q?", best)
	}
	return "the fields here are " + strings.Join(names, ", ")
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
