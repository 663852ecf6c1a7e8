package fleetapi

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// TestScopeRoundTrips pins a scope's two wire forms and what a wrong one
// reports.
func TestScopeRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Scope
		out  string
	}{
		{`"*"`, Scope{All: true}, `"*"`},
		{`["h1","h2"]`, Scope{IDs: []string{"h1", "h2"}}, `["h1","h2"]`},
		{`[]`, Scope{IDs: []string{}}, `[]`},
	} {
		var s Scope
		if err := json.Unmarshal([]byte(tc.in), &s); err != nil || !reflect.DeepEqual(s, tc.want) {
			t.Errorf("%s: decoded %+v, %v; want %+v", tc.in, s, err, tc.want)
		}
		if b, err := json.Marshal(s); err != nil || string(b) != tc.out {
			t.Errorf("%s: encoded %s, %v; want %s", tc.in, b, err, tc.out)
		}
	}
	if b, _ := json.Marshal(Scope{}); string(b) != `[]` {
		t.Errorf("the zero scope encodes %s, want []", b)
	}
	for in, value := range map[string]string{
		`"all"`: `string "all"`,
		`"x12345678901234567890123456789012345678901"`: `string "x123456789012345678901234567890123456789..."`,
		`[1]`:         "array",
		`{"h1":true}`: "object",
		`5`:           "number",
		`true`:        "bool",
	} {
		var m MintCaller
		err := json.Unmarshal([]byte(`{"ownerId":"o","allowedHosts":`+in+`}`), &m)
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) || te.Field != "allowedHosts" || te.Value != value || te.Type != reflect.TypeFor[Scope]() {
			t.Errorf("%s: %v (%+v), want a type error of allowedHosts with value %s", in, err, te, value)
		}
	}
	var m MintCaller
	if err := json.Unmarshal([]byte(`{"ownerId":"o","allowedHosts":null}`), &m); err != nil || m.AllowedHosts != nil {
		t.Errorf("null: %+v, %v; want no scope", m.AllowedHosts, err)
	}
}

// TestAcceptanceRoundTrips pins accepted's three values.
func TestAcceptanceRoundTrips(t *testing.T) {
	for a, wire := range map[Acceptance]string{Accepted: "true", Refused: "false", Unknown: `"unknown"`} {
		b, err := json.Marshal(Outcome{Accepted: a})
		if err != nil || string(b) != `{"accepted":`+wire+`}` {
			t.Errorf("%d encodes %s, %v", a, b, err)
		}
		var o Outcome
		if err := json.Unmarshal(b, &o); err != nil || o.Accepted != a {
			t.Errorf("%s decodes %d, %v; want %d", b, o.Accepted, err, a)
		}
	}
	var o Outcome
	if err := json.Unmarshal([]byte(`{"accepted":"yes"}`), &o); err == nil {
		t.Error(`accepted "yes" decoded`)
	}
}

// TestDispatchRequestIsTheRunRequest: the caller fields are the run
// request's; Fleet's own stay out of it.
func TestDispatchRequestIsTheRunRequest(t *testing.T) {
	d := DispatchRequest{Host: "h1", Agent: "shell", Prompt: "p", Argv: []string{"-x"}, Labels: map[string]string{"a": "b"},
		Repository: "r", LocalPath: "/w", Env: map[string]string{"E": "1"}, Idempotency: "k"}
	got, _ := json.Marshal(d.RunRequest())
	if want := `{"agent":"shell","prompt":"p","argv":["-x"],"repository":"r","localPath":"/w","env":{"E":"1"}}`; string(got) != want {
		t.Errorf("run request %s\nwant        %s", got, want)
	}
	if b, _ := json.Marshal(DispatchRequest{Agent: "shell"}); string(b) != `{"agent":"shell"}` {
		t.Errorf("a zero field is sent: %s", b)
	}
}

// TestErrorDetailsDecode: a client reads a refusal's details into the type
// its code names.
func TestErrorDetailsDecode(t *testing.T) {
	const body = `{"error":"no eligible host","code":"no_eligible_host","details":{"considered":2,"excluded":[{"hostId":"h1","reasons":["agent_unsupported"],"agents":["shell"]}],"hosts":9}}`
	var e Error
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != CodeNoEligibleHost {
		t.Fatalf("%+v, %v", e, err)
	}
	var d NoEligibleHost
	if err := json.Unmarshal(e.Details, &d); err != nil || *d.Considered != 2 || *d.Hosts != 9 || d.Excluded[0].Agents[0] != "shell" {
		t.Fatalf("%+v, %v", d, err)
	}
	if b, _ := json.Marshal(e); string(b) != body {
		t.Errorf("re-encoded %s\nwant        %s", b, body)
	}
}

func TestCheckBaseURL(t *testing.T) {
	for raw, ok := range map[string]bool{
		"https://s.lambda-url.eu-west-1.on.aws/": true,
		"http://127.0.0.1:8080":                  true,
		"https://example.com/runfleet":           true,
		"s.lambda-url.eu-west-1.on.aws":          false,
		"ftp://example.com":                      false,
		"https://example.com/?x=1":               false,
		"https://user:pw@example.com":            false,
		"https://":                               false,
	} {
		if err := CheckBaseURL(raw); (err == nil) != ok {
			t.Errorf("%q: %v", raw, err)
		}
	}
}
