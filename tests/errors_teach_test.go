package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// TestErrorsTeach: each error a newcomer meets first says what was wrong
// and what to send instead: an agent no host offers names the agents the
// hosts do offer; a body that is not JSON is named for what it is (empty,
// form-encoded, cut short, not JSON, another JSON value); an auth failure
// says whether the token is missing, malformed, or unknown or revoked, and
// an unknown token and a revoked one answer alike.
func TestErrorsTeach(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { errorsTeach(t, kind) })
	}
}

func errorsTeach(t *testing.T, kind string) {
	s := newStack(t, kind, stackOptions{})
	s.addHost(t, "h1", fakehost.Config{Agents: []string{"shell", "claude"}}, nil)
	s.probe(t, "h1")
	s.addHost(t, "h2", fakehost.Config{Agents: []string{"codex", "shell"}}, nil)
	s.probe(t, "h2")
	alice := s.mint(t, "alice", "*", "*")
	revoked := s.mint(t, "mallory", "*", "*")
	s.must(t, http.StatusOK, "DELETE", "/fleet/callers/mallory", adminToken, "")
	run := "/fleet/runs/" + s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`).str("fleetRunId")

	for _, c := range []struct {
		name, method, path string
		headers            []string
		body               string
		status             int
		error              string
	}{
		{"agent no host offers", "POST", "/fleet/runs", auth(alice), `{"agent":"cursor"}`, 409,
			`no eligible host: h1 (agent_unsupported); h2 (agent_unsupported); agent "cursor" is not offered: those hosts offer claude, codex, shell`},

		{"empty body", "POST", "/fleet/runs", auth(alice), ``, 400, "the request body is empty: a JSON object is required"},
		{"form-encoded body", "POST", "/fleet/runs", auth(alice), `agent=shell&prompt=make+test`, 400,
			"the request body is form-encoded (key=value), not JSON"},
		{"truncated body", "POST", "/fleet/runs", auth(alice), `{"agent":"shell","prompt":"make`, 400,
			"the request body is truncated JSON: it ends after 31 bytes, before the value closes"},
		{"text body", "POST", "/fleet/runs", auth(alice), `make test`, 400, "the request body is not JSON"},
		{"a number", "POST", "/fleet/runs", auth(alice), `42`, 400, "the request body must be a JSON object, not a number"},
		{"an array", "POST", "/fleet/callers", auth(adminToken), `["ci"]`, 400, "the request body must be a JSON object, not an array"},
		{"malformed inside", "POST", "/fleet/callers", auth(adminToken), `{"ownerId" "ci"}`, 400, "malformed JSON at byte 12"},
		{"input as text", "POST", run + "/input", auth(alice), `yes`, 400, "the request body is not JSON"},

		{"no Authorization", "GET", "/fleet/runs", nil, ``, 401, `no bearer token: send the header "Authorization: Bearer <token>"`},
		{"Basic credentials", "GET", "/fleet/runs", []string{"Authorization", "Basic YWxpY2U6cHc="}, ``, 401,
			`the Authorization header is not "Bearer <token>"`},
		{"Bearer without a token", "GET", "/fleet/runs", []string{"Authorization", "Bearer "}, ``, 401,
			`the Authorization header is not "Bearer <token>"`},
		{"token without Bearer", "GET", "/fleet/runs", []string{"Authorization", alice}, ``, 401,
			`the Authorization header is not "Bearer <token>"`},
		{"unknown token", "GET", "/fleet/runs", auth("rft_never-minted-0000000000000000000000000000"), ``, 401,
			"the bearer token is unknown or revoked"},
		{"revoked token", "GET", "/fleet/runs", auth(revoked), ``, 401, "the bearer token is unknown or revoked"},
		{"stream without a token", "GET", run + "/stream", nil, ``, 401, "no bearer token"},
		{"stream with a revoked token", "GET", run + "/stream?token=" + revoked, nil, ``, 401, "the bearer token is unknown or revoked"},
		{"stream with an empty token", "GET", run + "/stream?token=", nil, ``, 400, "the token parameter is empty"},
	} {
		a := s.do(t, c.method, c.path, "", c.body, append([]string{"Content-Type", "application/json"}, c.headers...)...)
		if a.status != c.status || !strings.Contains(a.errorText(), c.error) {
			t.Errorf("%s: %d %s, want %d with an error containing %q", c.name, a.status, a.raw, c.status, c.error)
		}
		if strings.Contains(a.raw, `\u003c`) {
			t.Errorf("%s: the answer escapes < for HTML, unreadable in a terminal: %s", c.name, a.raw)
		}
		for _, tok := range []string{alice, revoked} {
			if strings.Contains(a.raw, tok) {
				t.Errorf("%s: the answer quotes a token: %s", c.name, a.raw)
			}
		}
	}

	// The refusal's details carry, for each host, the agents it offers.
	a := s.must(t, http.StatusConflict, "POST", "/fleet/runs", alice, `{"agent":"cursor"}`)
	var body struct {
		Details struct {
			Excluded []struct {
				HostID string   `json:"hostId"`
				Agents []string `json:"agents"`
			} `json:"excluded"`
		} `json:"details"`
	}
	if err := json.Unmarshal([]byte(a.raw), &body); err != nil || len(body.Details.Excluded) != 2 ||
		strings.Join(body.Details.Excluded[0].Agents, ",") != "shell,claude" || strings.Join(body.Details.Excluded[1].Agents, ",") != "codex,shell" {
		t.Fatalf("the refusal's details: %s", a.raw)
	}
}

// auth is the Authorization header of a bearer token.
func auth(token string) []string { return []string{"Authorization", "Bearer " + token} }
