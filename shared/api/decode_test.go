package api

import (
	"errors"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/fleetapi"
)

func TestDecodeObjectIsStrictAndNamesTheField(t *testing.T) {
	for body, want := range map[string]string{
		``:                                  "the request body is empty: a JSON object is required",
		`   `:                               "the request body is empty: a JSON object is required",
		`[]`:                                "must be a JSON object, not an array",
		`"x"`:                               "must be a JSON object, not a string",
		`42`:                                "must be a JSON object, not a number",
		`agent=shell&prompt=hi`:             "the request body is form-encoded (key=value), not JSON",
		`true=1`:                            "the request body is form-encoded (key=value), not JSON",
		`agent: shell`:                      "the request body is not JSON",
		`{"agent": "shell"`:                 "the request body is truncated JSON: it ends after 17 bytes",
		`{"agent" "shell"}`:                 "malformed JSON at byte 10",
		`{"agent": "shell"} {}`:             "malformed JSON",
		`{"agent": 5}`:                      "agent: want a string, got number",
		`{"Agent": "shell"}`:                `unknown field "Agent" (did you mean "agent"?)`,
		`{"agnet": "shell"}`:                `unknown field "agnet"`,
		`{"argv": "ls"}`:                    "argv: want an array of string, got string",
		`{"env": ["A=1"]}`:                  "env: want an object of string values, got array",
		`{"env": {"A": 1}}`:                 "env",
		`{"secrets": {"projectId": "x"}}`:   "secrets: want an array of object, got object",
		`{"secrets": [{"project": "x"}]}`:   `unknown field "secrets[0].project"`,
		`{"secrets": [{"domains": "a.b"}]}`: "secrets.domains: want an array of string, got string",
		`{"secrets": ["x"]}`:                "secrets[0]: want an object, got a string",
	} {
		var b fleetapi.DispatchRequest
		err := decodeObject([]byte(body), &b)
		var re *requestError
		if !errors.As(err, &re) || re.status != 400 || !strings.Contains(re.message, want) {
			t.Errorf("%s: %v, want a 400 containing %q", body, err, want)
		}
	}
	var b fleetapi.DispatchRequest
	if err := decodeObject([]byte(`{"agent":"shell","env":{"A":"1"},"secrets":[{"projectId":"p","key":"K","domains":["a.b"]}]}`), &b); err != nil {
		t.Fatalf("a good body: %v", err)
	}
	if b.Agent != "shell" || b.Env["A"] != "1" || b.Secrets[0].Domains[0] != "a.b" {
		t.Fatalf("decoded %+v", b)
	}
}

// TestDecodeObjectNamesAScopeField: a scope that is neither "*" nor a
// list of ids is refused in the words the API always used.
func TestDecodeObjectNamesAScopeField(t *testing.T) {
	for body, want := range map[string]string{
		`{"allowedHosts":"all"}`:                                  `allowedHosts: want "*" or an array of ids, got the string "all"`,
		`{"allowedProjects":[1]}`:                                 `allowedProjects: want "*" or an array of ids`,
		`{"allowedHosts":{"h1":true}}`:                            `allowedHosts: want "*" or an array of ids`,
		`{"allowedHosts":` + `"` + strings.Repeat("x", 50) + `"}`: `allowedHosts: want "*" or an array of ids, got the string "` + strings.Repeat("x", 40) + `..."`,
	} {
		var b fleetapi.MintCaller
		err := decodeObject([]byte(body), &b)
		var re *requestError
		if !errors.As(err, &re) || re.status != 400 || re.message != want {
			t.Errorf("%s: %v, want a 400 saying %q", body, err, want)
		}
	}
	var b fleetapi.MintCaller
	if err := decodeObject([]byte(`{"ownerId":"o","allowedHosts":"*","allowedProjects":[]}`), &b); err != nil ||
		!b.AllowedHosts.All || b.AllowedProjects == nil || b.AllowedProjects.IDs == nil {
		t.Fatalf("a good body: %+v, %v", b, err)
	}
}

func TestQueryParsing(t *testing.T) {
	for raw, want := range map[string]string{
		"after=Infinity":  `after="Infinity": want a non-negative integer`,
		"after=2.5":       `after="2.5": want a non-negative integer`,
		"after=-1":        `after="-1"`,
		"after=1e3":       `after="1e3"`,
		"after=":          `after=""`,
		"after=%2B5":      `after="+5"`,
		"after=1&after=2": `"after" is given more than once`,
		"limit=-1":        `unknown query parameter "limit"`,
		"%zz":             "malformed query string",
	} {
		q, err := parseQuery(raw, []string{"cursor", "after"})
		if err == nil {
			_, _, err = q.nonNegativeInt("after")
		}
		var re *requestError
		if !errors.As(err, &re) || re.code != "invalid_request" || !strings.Contains(re.message, want) {
			t.Errorf("%q: %v, want invalid_request %q", raw, err, want)
		}
	}
	q, err := parseQuery("after=99999999999999999999999", []string{"after"})
	if err != nil {
		t.Fatal(err)
	}
	if n, ok, err := q.nonNegativeInt("after"); err != nil || !ok || n <= 1000 {
		t.Fatalf("huge after = %d %v %v, want a large value", n, ok, err)
	}
	if _, err := parseQuery("force=yes", []string{"force"}); err != nil {
		t.Fatal(err)
	}
	q, _ = parseQuery("force=yes", []string{"force"})
	if _, err := q.boolFlag("force"); err == nil {
		t.Fatal("force=yes accepted")
	}
}

// TestPageLimit: a list's limit is absent (the default page, 0) or an
// integer from 1 to the maximum; anything else is a 400 naming the range,
// never clamped or taken for the default.
func TestPageLimit(t *testing.T) {
	const want = "want an integer from 1 to 1000"
	for raw, n := range map[string]int{"": 0, "limit=1": 1, "limit=1000": 1000, "limit=0250": 250} {
		q, err := parseQuery(raw, []string{"limit"})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := q.pageLimit(1000); err != nil || got != n {
			t.Errorf("%q: %d, %v; want %d", raw, got, err, n)
		}
	}
	for _, v := range []string{"0", "00", "-1", "1001", "5000", "99999999999999999999999", "2.5", "1e3", "%2B5", "Infinity", "", "x"} {
		q, err := parseQuery("limit="+v, []string{"limit"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = q.pageLimit(1000)
		var re *requestError
		if !errors.As(err, &re) || re.status != 400 || re.code != "invalid_request" || !strings.Contains(re.message, want) || !strings.HasPrefix(re.message, "limit=") {
			t.Errorf("limit=%s: %v, want a 400 naming limit and %q", v, err, want)
		}
	}
}

// TestJSONLevelProblemsAreInvalidJSON: a body that is not one JSON value,
// or that gives a key twice, is 400 invalid_json wherever a body is read
// (decodeObject, the input route's own reading); the duplicate is named by
// its path, its values never quoted.
func TestJSONLevelProblemsAreInvalidJSON(t *testing.T) {
	for body, want := range map[string]string{
		``:                              "the request body is empty",
		`agent=shell`:                   "form-encoded",
		`agent: shell`:                  "the request body is not JSON",
		`{"agent": "shell"`:             "truncated JSON",
		`{"agent" "shell"}`:             "malformed JSON at byte 10",
		`{"agent":"shell","agent":"x"}`: "agent: the key is given more than once",
		`{"agent":"shell","env":{"K":"sk-live-1","K":"sk-live-2"}}`:                        "env.K: the key is given more than once",
		`{"agent":"shell","secrets":[{"projectId":"p","key":"A","domains":[],"key":"B"}]}`: "secrets[0].key: the key is given more than once",
		`{"Agent":"shell","Agent":"x"}`:                                                    "Agent: the key is given more than once",
	} {
		var b fleetapi.DispatchRequest
		err := decodeObject([]byte(body), &b)
		var re *requestError
		if !errors.As(err, &re) || re.status != 400 || re.code != fleetapi.CodeInvalidJSON || !strings.Contains(re.message, want) || strings.Contains(re.message, "sk-live") {
			t.Errorf("%s: %v, want a 400 invalid_json containing %q", body, err, want)
		}
	}
	for body, want := range map[string]string{
		``:                               "a JSON body is required",
		`{"input":"a","input":"b"}`:      "input: the key is given more than once",
		`{"input":{"x":1,"x":2}}`:        "input.x: the key is given more than once",
		`{"answer":1,"answer":2}`:        "answer: the key is given more than once",
		`[{"k":1},{"k":1,"k":"secret"}]`: "[1].k: the key is given more than once",
		`{"input":`:                      "truncated JSON",
	} {
		_, err := inputValue([]byte(body))
		var re *requestError
		if !errors.As(err, &re) || re.status != 400 || re.code != fleetapi.CodeInvalidJSON || !strings.Contains(re.message, want) || strings.Contains(re.message, "secret") {
			t.Errorf("input %s: %v, want a 400 invalid_json containing %q", body, err, want)
		}
	}
	// JSON that is not what the route takes stays invalid_request.
	for _, body := range []string{`[]`, `{"agent":5}`, `{"agnet":"shell"}`} {
		var b fleetapi.DispatchRequest
		var re *requestError
		if err := decodeObject([]byte(body), &b); !errors.As(err, &re) || re.code != "invalid_request" {
			t.Errorf("%s: %v, want invalid_request", body, err)
		}
	}
}

// FuzzDecodeObject: any body decodes or is a 400 with a message; nothing
// panics and no other error kind escapes.
func FuzzDecodeObject(f *testing.F) {
	for _, seed := range []string{`{"agent":"shell"}`, `[]`, `{"Agent":1}`, `{"secrets":[{"domains":[1]}]}`, `{"env":{"A":null}}`, `{`, ``} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var b fleetapi.DispatchRequest
		err := decodeObject(body, &b)
		if err == nil {
			return
		}
		var re *requestError
		if !errors.As(err, &re) || re.status != 400 || re.message == "" {
			t.Fatalf("%q: %v", body, err)
		}
	})
}
