// Package jsonstrict finds what encoding/json accepts but a careful reader
// must refuse, an object that names one key twice, and says in one way
// where in a document a field is (Path) and what it wants (Want). encoding/json keeps the
// last value, so {"host": "a", "host": "b"} would quietly mean "b" to Fleet
// and perhaps "a" to a proxy or a reviewer in front of it; every JSON input
// runfleet reads (Fleet's API, the host API, edge's config files) refuses
// it instead, naming the key by its path.
package jsonstrict

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// DuplicateKeyError is a key given twice in one object. Path is where, in
// the form Path documents; the key's value is never quoted (it may be a
// secret meant for the field).
type DuplicateKeyError struct {
	Path string
}

func (e *DuplicateKeyError) Error() string {
	return fmt.Sprintf("%s: the key is given more than once (JSON keys must be unique)", e.Path)
}

// CheckDuplicateKeys returns a *DuplicateKeyError for the first key an
// object in data names twice, exactly as written (keys are compared byte for
// byte after unescaping, as encoding/json does before matching a field).
// It returns nil when data is not one valid JSON value: a syntax error is
// the decoder's to describe, with its own offset.
func CheckDuplicateKeys(data []byte) error {
	if !json.Valid(data) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	err := walk(dec, nil)
	var dup *DuplicateKeyError
	if errors.As(err, &dup) {
		return dup
	}
	return nil
}

// walk reads one value from dec; path is where it is.
func walk(dec *json.Decoder, path []string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch delim {
	case '{':
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, ok := tok.(string)
			if !ok {
				return io.ErrUnexpectedEOF
			}
			p := append(path, key)
			if seen[key] {
				return &DuplicateKeyError{Path: Path(p)}
			}
			seen[key] = true
			if err := walk(dec, p); err != nil {
				return err
			}
		}
	case '[':
		for i := 0; dec.More(); i++ {
			if err := walk(dec, append(path, "["+strconv.Itoa(i)+"]")); err != nil {
				return err
			}
		}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

// Path writes a JSON path as runfleet's messages name fields: keys joined
// by dots, array indexes in brackets (runner.agents[2].argv), a key that is
// not a plain identifier quoted in brackets (keys["API.KEY"]), and "the
// document" for the top level. Elements that are already "[n]" are taken
// as indexes.
func Path(elems []string) string {
	if len(elems) == 0 {
		return "the document"
	}
	var b strings.Builder
	for _, e := range elems {
		switch {
		case isIndex(e):
			b.WriteString(e)
		case plainKey(e):
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(e)
		default:
			b.WriteString("[" + strconv.Quote(e) + "]")
		}
	}
	return b.String()
}

func isIndex(e string) bool {
	if len(e) < 3 || e[0] != '[' || e[len(e)-1] != ']' {
		return false
	}
	_, err := strconv.Atoi(e[1 : len(e)-1])
	return err == nil
}

// plainKey: letters, digits, '_' and '-', not starting with a digit.
func plainKey(k string) bool {
	if k == "" || k[0] >= '0' && k[0] <= '9' {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// Want names the JSON value a Go type decodes from, for a message that
// says what a field wants: "a string", "an integer", "an array of
// strings", "an object of string values". Pointers are looked through.
func Want(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer, not negative"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array of " + bare(Want(t.Elem()))
	case reflect.Map:
		return "an object of " + bare(Want(t.Elem())) + " values"
	case reflect.Struct:
		return "an object"
	}
	return t.String()
}

// bare drops the article: "a string" -> "string".
func bare(s string) string {
	if rest, ok := strings.CutPrefix(s, "an "); ok {
		return rest
	}
	return strings.TrimPrefix(s, "a ")
}
