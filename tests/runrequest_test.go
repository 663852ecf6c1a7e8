package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// runRequestRow is one run request, as a caller of either API writes it:
// Fleet's dispatch takes it as it is, edge's host API with a clientToken
// added. field names the field a refusal must name; "" is a request both
// accept.
type runRequestRow struct {
	name, body, field string
	// typed: a value of the wrong JSON type. Each API's decoder words it
	// its own way; both must refuse it naming the field.
	typed bool
}

// runRequestRows are every field's rules, and each disagreement the two
// halves had before they shared one validation (marked "was:").
func runRequestRows(localPath string) []runRequestRow {
	secret := func(key string, domains ...string) string {
		b, _ := json.Marshal(map[string]any{"projectId": "acme", "key": key, "domains": domains})
		return string(b)
	}
	granted := secret("API_KEY", "api.example.com")
	long := strings.Repeat("x", 300<<10)
	manyEnv := map[string]string{}
	for i := 0; i < 300; i++ {
		manyEnv[fmt.Sprintf("V%d", i)] = "v"
	}
	manySecrets := make([]string, 65)
	for i := range manySecrets {
		manySecrets[i] = secret(fmt.Sprintf("K%d", i), "api.example.com")
	}
	return []runRequestRow{
		{name: "bare", body: `{"agent":"shell"}`},
		{name: "prompt, argv and env", body: `{"agent":"shell","prompt":"true","argv":["x"],"env":{"CI":"1","HOME_X":"y"}}`},
		{name: "a granted secret", body: `{"agent":"shell","prompt":"true","secrets":[` + granted + `]}`},
		{name: "a repository checked out at a local path", body: fmt.Sprintf(`{"agent":"shell","repository":"acme/app","localPath":%q}`, localPath)},

		{name: "no agent", body: `{}`, field: "agent"},
		{name: "agent shape", body: `{"agent":"a b"}`, field: "agent"},                             // was: edge said "not in this host's agent table"
		{name: "empty prompt", body: `{"agent":"shell","prompt":""}`, field: "prompt"},             // was: edge took it for absent
		{name: "empty repository", body: `{"agent":"shell","repository":""}`, field: "repository"}, // was: edge took it for absent
		{name: "empty localPath", body: `{"agent":"shell","localPath":""}`, field: "localPath"},    // was: edge took it for absent
		{name: "empty argv", body: `{"agent":"shell","argv":[]}`, field: "argv"},                   // was: edge took it for absent
		{name: "prompt NUL", body: `{"agent":"shell","prompt":"a\u0000b"}`, field: "prompt"},
		{name: "argv NUL", body: `{"agent":"shell","argv":["a\u0000"]}`, field: "argv[0]"},
		{name: "long prompt", body: fmt.Sprintf(`{"agent":"shell","prompt":%q}`, long), field: "prompt"}, // was: edge had no bound
		{name: "relative localPath", body: `{"agent":"shell","localPath":"src"}`, field: "localPath"},
		{name: "repository as an option", body: `{"agent":"shell","repository":"--upload-pack=touch /tmp/x"}`, field: "repository"},               // was: Fleet passed it on
		{name: "secret without domains", body: `{"agent":"shell","secrets":[{"projectId":"acme","key":"API_KEY"}]}`, field: "secrets[0].domains"}, // was: edge granted every domain
		{name: "secret with empty domains", body: `{"agent":"shell","secrets":[` + secret("API_KEY") + `]}`, field: "secrets[0].domains"},
		{name: "secret without projectId", body: `{"agent":"shell","secrets":[{"key":"API_KEY","domains":["api.example.com"]}]}`, field: "secrets[0].projectId"},
		{name: "projectId too long", body: `{"agent":"shell","secrets":[{"projectId":"` + strings.Repeat("p", 100) + `","key":"K","domains":["api.example.com"]}]}`, field: "secrets[0].projectId"}, // was: edge took it
		{name: "key shape", body: `{"agent":"shell","secrets":[` + secret("1KEY", "api.example.com") + `]}`, field: "secrets[0].key"},
		{name: "key too long", body: `{"agent":"shell","secrets":[` + secret("K"+strings.Repeat("x", 200), "api.example.com") + `]}`, field: "secrets[0].key"},                 // was: both took it, no policy could grant it
		{name: "key names a proxy variable", body: `{"agent":"shell","secrets":[` + secret("HTTPS_PROXY", "api.example.com") + `]}`, field: "secrets[0].key"},                  // was: Fleet passed it on
		{name: "key declared twice in two cases", body: `{"agent":"shell","secrets":[` + granted + `,` + secret("api_key", "api.example.com") + `]}`, field: "secrets[1].key"}, // was: edge compared exactly
		{name: "wildcard domain", body: `{"agent":"shell","secrets":[` + secret("API_KEY", "*.example.com") + `]}`, field: "secrets[0].domains[0]"},                            // was: Fleet passed it on
		{name: "IP domain", body: `{"agent":"shell","secrets":[` + secret("API_KEY", "10.0.0.1") + `]}`, field: "secrets[0].domains[0]"},                                       // was: Fleet passed it on
		{name: "domain with a bad port", body: `{"agent":"shell","secrets":[` + secret("API_KEY", "api.example.com:0443") + `]}`, field: "secrets[0].domains[0]"},              // was: Fleet passed it on
		{name: "65 secrets", body: `{"agent":"shell","secrets":[` + strings.Join(manySecrets, ",") + `]}`, field: "secrets"},
		{name: "env HTTPS_PROXY", body: `{"agent":"shell","env":{"HTTPS_PROXY":"http://elsewhere:3128"}}`, field: "env.HTTPS_PROXY"},
		{name: "env proxy in mixed case", body: `{"agent":"shell","env":{"Https_Proxy":"http://elsewhere:3128"}}`, field: "env.Https_Proxy"},                        // was: edge compared exactly
		{name: "env GIT_SSL_NO_VERIFY", body: `{"agent":"shell","env":{"GIT_SSL_NO_VERIFY":"1"}}`, field: "env.GIT_SSL_NO_VERIFY"},                                  // was: edge took it
		{name: "env GIT_SSL_CAPATH", body: `{"agent":"shell","env":{"GIT_SSL_CAPATH":"/tmp"}}`, field: "env.GIT_SSL_CAPATH"},                                        // was: edge took it
		{name: "env NODE_TLS_REJECT_UNAUTHORIZED", body: `{"agent":"shell","env":{"NODE_TLS_REJECT_UNAUTHORIZED":"0"}}`, field: "env.NODE_TLS_REJECT_UNAUTHORIZED"}, // was: edge took it
		{name: "env runfleet in lower case", body: `{"agent":"shell","env":{"runfleet_proxied_keys":"{}"}}`, field: "env.runfleet_proxied_keys"},                    // was: edge compared exactly
		{name: "env names a declared key in another case", body: `{"agent":"shell","env":{"api_key":"sk-real"},"secrets":[` + granted + `]}`, field: "env.api_key"}, // was: edge compared exactly
		{name: "env name shape", body: `{"agent":"shell","env":{"1X":"y"}}`, field: "env"},
		{name: "env NUL", body: `{"agent":"shell","env":{"X":"a\u0000"}}`, field: "env.X"},
		{name: "300 env", body: `{"agent":"shell","env":` + jsonBody(manyEnv) + `}`, field: "env"}, // was: edge had no bound
		{name: "escapes past the bound", body: `{"agent":"shell","prompt":"` + strings.Repeat("<", 200<<10) + `"}`, field: "request"},

		{name: "prompt of the wrong type", body: `{"agent":"shell","prompt":5}`, field: "prompt", typed: true},
		{name: "env of the wrong type", body: `{"agent":"shell","env":{"A":1}}`, field: "env", typed: true},
		{name: "secrets of the wrong type", body: `{"agent":"shell","secrets":{"projectId":"acme"}}`, field: "secrets", typed: true},
	}
}

// TestOneRunRequestOneVerdict: every run request gets the same verdict from
// Fleet's dispatch (on either store) and from a real edge's host API
// directly, and a refusal names the same field in the same words: a caller
// of the host API meets no weaker checks than one of Fleet.
func TestOneRunRequestOneVerdict(t *testing.T) {
	root := edgetest.HostDir(t)
	localPath := filepath.Join(root, "app")
	must(t, os.Mkdir(localPath, 0o755))
	e := newEdgeProc(t)
	e.runner = fmt.Sprintf(`{"user": "nobody", "roots": [%q]}`, root)
	e.writeConfig()
	e.start()
	rows := runRequestRows(localPath)

	// Edge's verdicts, once: the host API has no store.
	edgeAnswers := make([]answer, len(rows))
	for i, row := range rows {
		token := fmt.Sprintf(`"clientToken":"row-%d"`, i)
		body := strings.Replace(row.body, "{", "{"+token+",", 1)
		if row.body == "{}" {
			body = "{" + token + "}"
		}
		edgeAnswers[i] = e.post(t, "/runs", body)
	}
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			s.addHost(t, "h1", fakehost.Config{Features: fakeFeatures}, map[string]any{"localPaths": []string{root}})
			s.probe(t, "h1")
			tok := s.mint(t, "ci", "*", []string{"acme"})
			for i, row := range rows {
				fleet, edge := s.do(t, "POST", "/fleet/runs", tok, row.body), edgeAnswers[i]
				if row.field == "" {
					if fleet.status != http.StatusCreated || edge.status != http.StatusCreated {
						t.Errorf("%s: Fleet %d %s, edge %d %s; want both to start it", row.name, fleet.status, clip(fleet.raw), edge.status, clip(edge.raw))
					}
					continue
				}
				fe, ee := fleet.errorText(), edge.errorText()
				if fleet.status != http.StatusBadRequest || edge.status != http.StatusBadRequest {
					t.Errorf("%s: Fleet %d %s, edge %d %s; want both 400 naming %s", row.name, fleet.status, clip(fleet.raw), edge.status, clip(edge.raw), row.field)
					continue
				}
				if !namesFirst(fe, row.field) {
					t.Errorf("%s: Fleet says %q, want it to name %s first", row.name, clip(fe), row.field)
				}
				if row.typed {
					if !namesFirst(ee, row.field) {
						t.Errorf("%s: edge says %q, want it to name %s first", row.name, clip(ee), row.field)
					}
					continue
				}
				if fe != ee {
					t.Errorf("%s: Fleet says %q, edge says %q; want the same words", row.name, clip(fe), clip(ee))
				}
			}
		})
	}
}

// namesFirst reports whether a refusal's message begins with the field it
// refuses: its path, or for a variable of env, "env NAME".
func namesFirst(msg, field string) bool {
	switch {
	case field == "request":
		return strings.Contains(msg, "encode to")
	case strings.HasPrefix(field, "env."):
		return strings.HasPrefix(msg, "env "+strings.TrimPrefix(field, "env.")+":")
	}
	return strings.HasPrefix(msg, field)
}

// post sends a raw JSON body to edge's host API with the host credential.
func (e *edgeProc) post(t *testing.T, path, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+e.apiAddr+path, strings.NewReader(body))
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+hostToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	must(t, err)
	a := answer{status: resp.StatusCode, raw: string(raw)}
	json.Unmarshal(raw, &a.body)
	return a
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
