package jsonstrict

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckDuplicateKeys(t *testing.T) {
	cases := []struct {
		in   string
		path string // "" for no error
	}{
		{`{"a": 1, "b": 2}`, ""},
		{`{"a": 1, "a": 2}`, "a"},
		{`{"host": "x", "labels": {"k": "1", "k": "2"}}`, "labels.k"},
		{`{"secrets": [{"key": "A"}, {"key": "B", "key": "C"}]}`, "secrets[1].key"},
		{`[[{}], [{"x": {"y": 1, "y": 1}}]]`, "[1][0].x.y"},
		{`{"keys": {"API.KEY": {}, "API.KEY": {}}}`, `keys["API.KEY"]`},
		// Keys compare after unescaping, as the decoder matches them.
		{`{"a": 1, "\u0061": 2}`, "a"},
		// The same key in sibling objects is no duplicate.
		{`{"x": {"a": 1}, "y": {"a": 1}}`, ""},
		// Case differs: a different key here (the API refuses a case
		// mismatch as an unknown field on its own).
		{`{"a": 1, "A": 2}`, ""},
		// Invalid JSON is the decoder's to report.
		{`{"a": 1, "a"`, ""},
		{`not json`, ""},
		{`"a string"`, ""},
		{`{"a": 1, "a": 2`, ""},
	}
	for _, c := range cases {
		err := CheckDuplicateKeys([]byte(c.in))
		if c.path == "" {
			if err != nil {
				t.Errorf("%s: %v, want none", c.in, err)
			}
			continue
		}
		var dup *DuplicateKeyError
		if !errors.As(err, &dup) || dup.Path != c.path {
			t.Errorf("%s: %v, want a duplicate at %s", c.in, err, c.path)
		}
	}
}

func TestErrorNeverQuotesTheValue(t *testing.T) {
	err := CheckDuplicateKeys([]byte(`{"token": "sk-live-1", "token": "sk-live-2"}`))
	if err == nil || strings.Contains(err.Error(), "sk-live") || !strings.Contains(err.Error(), "token") {
		t.Fatalf("error %v: want the key named and no value", err)
	}
}

func TestPath(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{nil, "the document"},
		{[]string{"runner", "maxConcurrent"}, "runner.maxConcurrent"},
		{[]string{"agents", "claude-code", "argv", "[2]"}, "agents.claude-code.argv[2]"},
		{[]string{"policy", "projects", "p", "keys", "A.B"}, `policy.projects.p.keys["A.B"]`},
		{[]string{"[0]", "x"}, "[0].x"},
		{[]string{"9lives"}, `["9lives"]`},
	} {
		if got := Path(c.in); got != c.want {
			t.Errorf("Path(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
