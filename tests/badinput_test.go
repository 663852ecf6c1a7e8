package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// TestBadInputCorpus sends malformed input to every route that takes input:
// each answer is a 4xx whose message names the field or parameter, never a
// 5xx. It runs on both stores: input a store cannot hold (an item over
// DynamoDB's 400 KB, a key over its 2048 bytes) must be refused before it
// reaches one, the same way on bbolt, which would hold it.
func TestBadInputCorpus(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { badInputCorpus(t, kind) })
	}
}

func badInputCorpus(t *testing.T, kind string) {
	s := newStack(t, kind, stackOptions{})
	host := s.addHost(t, "h1", fakehost.Config{Features: fakeFeatures}, nil)
	s.probe(t, "h1")
	acme := s.mint(t, "acme-ci", "*", []string{"acme"})
	run := "/fleet/runs/" + s.must(t, http.StatusCreated, "POST", "/fleet/runs", acme, `{"agent":"shell"}`).str("fleetRunId")
	hugeInput := `{"input":"` + strings.Repeat("z", 1<<20) + `"}`

	huge := fmt.Sprintf(`{"agent":"shell","prompt":%q}`, strings.Repeat("x", 1<<20+10))
	hugeHost := fmt.Sprintf(`{"id":"big","baseUrl":"https://h","credentialRef":%q,"caPem":%q}`, hostCredRef, strings.Repeat("x", 1<<20))
	reg := func(fields string) string {
		return `{"id":"nh","baseUrl":"https://runner.example","credentialRef":"` + hostCredRef + `"` + fields + `}`
	}
	mint := func(fields string) string { return `{"ownerId":"new-owner"` + fields + `}` }
	scopes := `,"allowedHosts":"*","allowedProjects":"*"`
	secret := `"secrets":[{"projectId":"acme","key":"OPENAI_API_KEY","domains":["api.openai.com"]}]`

	// Input within 1 MiB that no store item can hold, or that the host
	// would refuse: each bounded, with a 400 naming the field.
	paths := make([]string, 700)
	for i := range paths {
		paths[i] = fmt.Sprintf("/srv/%04d/%s", i, strings.Repeat("p", 990))
	}
	manyPaths := reg(`,"localPaths":` + jsonBody(paths))
	manyHosts := make([]string, 12000)
	for i := range manyHosts {
		manyHosts[i] = fmt.Sprintf("h%05d", i)
	}
	manyLabels := map[string]string{}
	for i := 0; i < 65; i++ {
		manyLabels[fmt.Sprintf("l%d", i)] = "v"
	}
	manyArgs := make([]string, 300)
	for i := range manyArgs {
		manyArgs[i] = "a"
	}
	manyEnv := map[string]string{}
	for i := 0; i < 300; i++ {
		manyEnv[fmt.Sprintf("V%d", i)] = "v"
	}
	var manySecrets []map[string]any
	for i := 0; i < 65; i++ {
		manySecrets = append(manySecrets, map[string]any{"projectId": "acme", "key": fmt.Sprintf("K%d", i), "domains": []string{"a.example"}})
	}
	privateKey := "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
	longID := strings.Repeat("x", 3000)
	dispatch := func(fields map[string]any) string {
		fields["agent"] = "shell"
		return jsonBody(fields)
	}

	const limitRange = "want an integer from 1 to 1000"
	type tc struct {
		name, method, path, token, body string
		headers                         []string
		status                          int
		mention                         string
	}
	cases := []tc{
		// POST /fleet/hosts
		{"hosts malformed", "POST", "/fleet/hosts", adminToken, `{"id": "x",`, nil, 400, "the request body is truncated JSON"},
		{"hosts array", "POST", "/fleet/hosts", adminToken, `[{"id":"x"}]`, nil, 400, "JSON object"},
		{"hosts wrong type", "POST", "/fleet/hosts", adminToken, `{"id":5,"baseUrl":"https://h","credentialRef":"x"}`, nil, 400, "id: want a string"},
		{"hosts empty id", "POST", "/fleet/hosts", adminToken, `{"id":"","baseUrl":"https://h","credentialRef":"x"}`, nil, 400, "id is required"},
		{"hosts empty baseUrl", "POST", "/fleet/hosts", adminToken, `{"id":"x","baseUrl":"","credentialRef":"x"}`, nil, 400, "baseUrl is required"},
		{"hosts empty credentialRef", "POST", "/fleet/hosts", adminToken, `{"id":"x","baseUrl":"https://h","credentialRef":""}`, nil, 400, "credentialRef is required"},
		{"hosts unknown field", "POST", "/fleet/hosts", adminToken, reg(`,"extra":1`), nil, 400, `unknown field "extra"`},
		{"hosts field case", "POST", "/fleet/hosts", adminToken, reg(`,"BaseURL":"x"`), nil, 400, `"BaseURL"`},
		{"hosts labels array", "POST", "/fleet/hosts", adminToken, reg(`,"labels":["a"]`), nil, 400, "labels"},
		{"hosts localPaths string", "POST", "/fleet/hosts", adminToken, reg(`,"localPaths":"/srv"`), nil, 400, "localPaths"},
		{"hosts localPaths relative", "POST", "/fleet/hosts", adminToken, reg(`,"localPaths":["srv"]`), nil, 400, "localPaths[0]"},
		{"hosts enabled string", "POST", "/fleet/hosts", adminToken, reg(`,"enabled":"yes"`), nil, 400, "enabled: want true or false"},
		{"hosts http off loopback", "POST", "/fleet/hosts", adminToken, `{"id":"x","baseUrl":"http://10.1.2.3:7070","credentialRef":"` + hostCredRef + `"}`, nil, 400, "baseUrl"},
		{"hosts unknown credentialRef", "POST", "/fleet/hosts", adminToken, `{"id":"x","baseUrl":"https://h","credentialRef":"nope"}`, nil, 400, "credentialRef"},
		{"hosts bad caPem", "POST", "/fleet/hosts", adminToken, reg(`,"caPem":"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"`), nil, 400, "caPem"},
		{"hosts over 1 MiB", "POST", "/fleet/hosts", adminToken, hugeHost, nil, 413, "larger than"},
		{"hosts 700 KB of localPaths", "POST", "/fleet/hosts", adminToken, manyPaths, nil, 400, "localPaths: 700 paths"},
		{"hosts long localPath", "POST", "/fleet/hosts", adminToken, reg(`,"localPaths":["/` + strings.Repeat("p", 1100) + `"]`), nil, 400, "localPaths[0]"},
		{"hosts 65 labels", "POST", "/fleet/hosts", adminToken, reg(`,"labels":` + jsonBody(manyLabels)), nil, 400, "labels: 65 labels"},
		{"hosts long label value", "POST", "/fleet/hosts", adminToken, reg(`,"labels":{"pool":"` + strings.Repeat("v", 300) + `"}`), nil, 400, `labels["pool"]`},
		{"hosts long label key", "POST", "/fleet/hosts", adminToken, reg(`,"labels":{"` + strings.Repeat("k", 300) + `":"v"}`), nil, 400, "labels key"},
		{"hosts caPem private key", "POST", "/fleet/hosts", adminToken, reg(`,"caPem":` + jsonBody(privateKey)), nil, 400, "want only CERTIFICATE blocks"},
		{"hosts caPem over 64 KiB", "POST", "/fleet/hosts", adminToken, reg(`,"caPem":"` + strings.Repeat("x", 70<<10) + `"`), nil, 400, "caPem: 71680 bytes"},
		{"hosts long baseUrl", "POST", "/fleet/hosts", adminToken, `{"id":"x","baseUrl":"https://h/` + strings.Repeat("u", 3000) + `","credentialRef":"` + hostCredRef + `"}`, nil, 400, "baseUrl: 3010 bytes"},
		{"hosts long id", "POST", "/fleet/hosts", adminToken, `{"id":"` + longID + `","baseUrl":"https://h","credentialRef":"` + hostCredRef + `"}`, nil, 400, "id"},
		// /fleet/hosts/{id}/...: an id no registration could have is unknown
		{"enable long id", "POST", "/fleet/hosts/" + longID + "/enable", adminToken, `{"enabled":true}`, nil, 404, "is not registered"},
		{"probe long id", "POST", "/fleet/hosts/" + longID + "/probe", adminToken, ``, nil, 404, "is not registered"},
		{"delete long id", "DELETE", "/fleet/hosts/" + longID, adminToken, ``, nil, 404, "is not registered"},
		{"delete odd id", "DELETE", "/fleet/hosts/a%20b", adminToken, ``, nil, 404, `"a b"`},
		// POST /fleet/hosts/{id}/enable
		{"enable missing", "POST", "/fleet/hosts/h1/enable", adminToken, `{}`, nil, 400, "enabled is required"},
		{"enable no body", "POST", "/fleet/hosts/h1/enable", adminToken, ``, nil, 400, "JSON object"},
		{"enable string", "POST", "/fleet/hosts/h1/enable", adminToken, `{"enabled":"true"}`, nil, 400, "enabled: want true or false"},
		{"enable array", "POST", "/fleet/hosts/h1/enable", adminToken, `[true]`, nil, 400, "JSON object"},
		{"enable unknown field", "POST", "/fleet/hosts/h1/enable", adminToken, `{"enabled":true,"why":"x"}`, nil, 400, `unknown field "why"`},
		{"enable malformed", "POST", "/fleet/hosts/h1/enable", adminToken, `{"enabled":tru}`, nil, 400, "malformed JSON"},
		// DELETE /fleet/hosts/{id}
		{"delete force value", "DELETE", "/fleet/hosts/h1?force=yes", adminToken, ``, nil, 400, "force"},
		{"delete unknown parameter", "DELETE", "/fleet/hosts/h1?forse=1", adminToken, ``, nil, 400, `"forse"`},
		{"delete with a body", "DELETE", "/fleet/hosts/h1", adminToken, `{"force":true}`, nil, 400, "no request body"},
		// probes
		{"probe unknown field", "POST", "/fleet/hosts/h1/probe", adminToken, `{"x":1}`, nil, 400, `unknown field "x"`},
		{"probe array", "POST", "/fleet/hosts/h1/probe", adminToken, `[]`, nil, 400, "JSON object"},
		{"probe all unknown field", "POST", "/fleet/probe", adminToken, `{"all":true}`, nil, 400, `unknown field "all"`},
		// POST /fleet/callers
		{"mint malformed", "POST", "/fleet/callers", adminToken, `{"ownerId":`, nil, 400, "the request body is truncated JSON"},
		{"mint array", "POST", "/fleet/callers", adminToken, `["x"]`, nil, 400, "JSON object"},
		{"mint empty owner", "POST", "/fleet/callers", adminToken, `{"ownerId":""` + scopes + `}`, nil, 400, "ownerId"},
		{"mint owner shape", "POST", "/fleet/callers", adminToken, `{"ownerId":"a b"` + scopes + `}`, nil, 400, "ownerId"},
		{"mint owner type", "POST", "/fleet/callers", adminToken, `{"ownerId":7` + scopes + `}`, nil, 400, "ownerId"},
		{"mint hosts string", "POST", "/fleet/callers", adminToken, mint(`,"allowedHosts":"all","allowedProjects":"*"`), nil, 400, "allowedHosts"},
		{"mint hosts numbers", "POST", "/fleet/callers", adminToken, mint(`,"allowedHosts":[1],"allowedProjects":"*"`), nil, 400, "allowedHosts"},
		{"mint hosts object", "POST", "/fleet/callers", adminToken, mint(`,"allowedHosts":{"h1":true},"allowedProjects":"*"`), nil, 400, "allowedHosts"},
		{"mint hosts missing", "POST", "/fleet/callers", adminToken, mint(`,"allowedProjects":"*"`), nil, 400, "allowedHosts"},
		{"mint projects empty id", "POST", "/fleet/callers", adminToken, mint(`,"allowedHosts":"*","allowedProjects":[""]`), nil, 400, "allowedProjects[0]"},
		{"mint admin string", "POST", "/fleet/callers", adminToken, mint(scopes + `,"admin":"yes"`), nil, 400, "admin"},
		{"mint unknown field", "POST", "/fleet/callers", adminToken, mint(scopes + `,"token":"mine"`), nil, 400, `unknown field "token"`},
		{"mint reserved owner", "POST", "/fleet/callers", adminToken, `{"ownerId":"admin"` + scopes + `}`, nil, 409, "admin"},
		{"mint over 1 MiB", "POST", "/fleet/callers", adminToken, mint(scopes + `,"x":"` + strings.Repeat("y", 1<<20) + `"`), nil, 413, "larger than"},
		{"mint 12,000 allowedHosts", "POST", "/fleet/callers", adminToken, mint(`,"allowedHosts":` + jsonBody(manyHosts) + `,"allowedProjects":"*"`), nil, 400, "allowedHosts: 12000 ids"},
		{"mint 12,000 allowedProjects", "POST", "/fleet/callers", adminToken, mint(`,"allowedHosts":"*","allowedProjects":` + jsonBody(manyHosts)), nil, 400, "allowedProjects: 12000 ids"},
		{"mint long scope id", "POST", "/fleet/callers", adminToken, mint(`,"allowedHosts":["` + longID + `"],"allowedProjects":"*"`), nil, 400, "allowedHosts[0]"},
		{"mint long owner", "POST", "/fleet/callers", adminToken, `{"ownerId":"` + longID + `"` + scopes + `}`, nil, 400, "ownerId"},
		// DELETE /fleet/callers/{ownerId}
		{"revoke long owner", "DELETE", "/fleet/callers/" + longID, adminToken, ``, nil, 404, "does not exist"},
		{"revoke odd owner", "DELETE", "/fleet/callers/a%2Fb", adminToken, ``, nil, 404, `"a/b"`},
		// POST /fleet/runs
		{"runs malformed", "POST", "/fleet/runs", acme, `{"agent":"shell"`, nil, 400, "the request body is truncated JSON"},
		{"runs array", "POST", "/fleet/runs", acme, `[{"agent":"shell"}]`, nil, 400, "JSON object"},
		{"runs null", "POST", "/fleet/runs", acme, `null`, nil, 400, "JSON object"},
		{"runs agent type", "POST", "/fleet/runs", acme, `{"agent":1}`, nil, 400, "agent"},
		{"runs argv string", "POST", "/fleet/runs", acme, `{"agent":"shell","argv":"ls -l"}`, nil, 400, "argv"},
		{"runs argv empty", "POST", "/fleet/runs", acme, `{"agent":"shell","argv":[]}`, nil, 400, "argv"},
		{"runs env array", "POST", "/fleet/runs", acme, `{"agent":"shell","env":["A=1"]}`, nil, 400, "env"},
		{"runs env number", "POST", "/fleet/runs", acme, `{"agent":"shell","env":{"A":1}}`, nil, 400, "env"},
		{"runs labels array", "POST", "/fleet/runs", acme, `{"agent":"shell","labels":["gpu"]}`, nil, 400, "labels"},
		{"runs secrets object", "POST", "/fleet/runs", acme, `{"agent":"shell","secrets":{"projectId":"acme"}}`, nil, 400, "secrets"},
		{"runs secret unknown field", "POST", "/fleet/runs", acme, `{"agent":"shell","secrets":[{"projectId":"acme","key":"K","domains":["a.b"],"value":"x"}]}`, nil, 400, `"secrets[0].value"`},
		{"runs secret empty project", "POST", "/fleet/runs", acme, `{"agent":"shell","secrets":[{"projectId":"","key":"K","domains":["a.b"]}]}`, nil, 400, "secrets[0].projectId"},
		{"runs secret no domains", "POST", "/fleet/runs", acme, `{"agent":"shell","secrets":[{"projectId":"acme","key":"K","domains":[]}]}`, nil, 400, "secrets[0].domains"},
		{"runs prompt type", "POST", "/fleet/runs", acme, `{"agent":"shell","prompt":5}`, nil, 400, "prompt"},
		{"runs empty agent", "POST", "/fleet/runs", acme, `{"agent":""}`, nil, 400, "agent"},
		{"runs no agent", "POST", "/fleet/runs", acme, `{}`, nil, 400, "agent"},
		{"runs empty prompt", "POST", "/fleet/runs", acme, `{"agent":"shell","prompt":""}`, nil, 400, "prompt"},
		{"runs empty host", "POST", "/fleet/runs", acme, `{"agent":"shell","host":""}`, nil, 400, "host"},
		{"runs empty repository", "POST", "/fleet/runs", acme, `{"agent":"shell","repository":""}`, nil, 400, "repository"},
		{"runs empty localPath", "POST", "/fleet/runs", acme, `{"agent":"shell","localPath":""}`, nil, 400, "localPath"},
		{"runs relative localPath", "POST", "/fleet/runs", acme, `{"agent":"shell","localPath":"src"}`, nil, 400, "localPath"},
		{"runs empty idempotency", "POST", "/fleet/runs", acme, `{"agent":"shell","idempotency":""}`, nil, 400, "idempotency"},
		{"runs empty key header", "POST", "/fleet/runs", acme, `{"agent":"shell"}`, []string{"Idempotency-Key", ""}, 400, "Idempotency-Key"},
		{"runs keys differ", "POST", "/fleet/runs", acme, `{"agent":"shell","idempotency":"a"}`, []string{"Idempotency-Key", "b"}, 400, "Idempotency-Key"},
		{"runs unknown field", "POST", "/fleet/runs", acme, `{"agent":"shell","hots":"h1"}`, nil, 400, `unknown field "hots"`},
		{"runs field case", "POST", "/fleet/runs", acme, `{"Agent":"shell"}`, nil, 400, `"Agent"`},
		{"runs env granted key", "POST", "/fleet/runs", acme, `{"agent":"shell",` + secret + `,"env":{"OPENAI_API_KEY":"sk-real"}}`, nil, 400, "env OPENAI_API_KEY"},
		{"runs env proxy", "POST", "/fleet/runs", acme, `{"agent":"shell","env":{"HTTPS_PROXY":"http://elsewhere:3128"}}`, nil, 400, "env HTTPS_PROXY"},
		{"runs env trust", "POST", "/fleet/runs", acme, `{"agent":"shell","env":{"SSL_CERT_FILE":"/tmp/mine.pem"}}`, nil, 400, "env SSL_CERT_FILE"},
		{"runs env runfleet", "POST", "/fleet/runs", acme, `{"agent":"shell","env":{"RUNFLEET_PROXIED_KEYS":"{}"}}`, nil, 400, "env RUNFLEET_PROXIED_KEYS"},
		{"runs project out of scope", "POST", "/fleet/runs", acme, `{"agent":"shell","secrets":[{"projectId":"globex","key":"K","domains":["a.b"]}]}`, nil, 403, `project "globex"`},
		{"runs over 1 MiB", "POST", "/fleet/runs", acme, huge, nil, 413, "larger than"},
		{"runs long prompt", "POST", "/fleet/runs", acme, dispatch(map[string]any{"prompt": strings.Repeat("x", 300<<10)}), nil, 400, "prompt: 307200 bytes"},
		{"runs 300 argv", "POST", "/fleet/runs", acme, dispatch(map[string]any{"argv": manyArgs}), nil, 400, "argv: 300 entries"},
		{"runs 300 env", "POST", "/fleet/runs", acme, dispatch(map[string]any{"env": manyEnv}), nil, 400, "env: 300 variables"},
		{"runs 65 labels", "POST", "/fleet/runs", acme, dispatch(map[string]any{"labels": manyLabels}), nil, 400, "labels: 65 labels"},
		{"runs 65 secrets", "POST", "/fleet/runs", acme, dispatch(map[string]any{"secrets": manySecrets}), nil, 400, "secrets: 65 secrets"},
		{"runs escapes past the host's limit", "POST", "/fleet/runs", acme, `{"agent":"shell","prompt":"` + strings.Repeat("<", 200<<10) + `"}`, nil, 400, "encode to"},
		{"runs long host", "POST", "/fleet/runs", acme, dispatch(map[string]any{"host": longID}), nil, 400, "host"},
		// GET /fleet/runs
		{"list limit Infinity", "GET", "/fleet/runs?limit=Infinity", acme, ``, nil, 400, "limit"},
		{"list limit 2.5", "GET", "/fleet/runs?limit=2.5", acme, ``, nil, 400, "limit"},
		{"list limit -1", "GET", "/fleet/runs?limit=-1", acme, ``, nil, 400, "limit"},
		{"list limit twice", "GET", "/fleet/runs?limit=1&limit=2", acme, ``, nil, 400, "limit"},
		{"list limit 0", "GET", "/fleet/runs?limit=0", acme, ``, nil, 400, `limit="0": ` + limitRange},
		{"list limit -5", "GET", "/fleet/runs?limit=-5", acme, ``, nil, 400, `limit="-5": ` + limitRange},
		{"list limit 1001", "GET", "/fleet/runs?limit=1001", acme, ``, nil, 400, `limit="1001": ` + limitRange},
		{"list limit huge", "GET", "/fleet/runs?limit=99999999999999999999999", acme, ``, nil, 400, limitRange},
		{"list limit text", "GET", "/fleet/runs?limit=ten", acme, ``, nil, 400, `limit="ten": ` + limitRange},
		{"list limit empty", "GET", "/fleet/runs?limit=", acme, ``, nil, 400, `limit="": ` + limitRange},
		// The other lists are not paged: a limit is a parameter they do not take.
		{"hosts limit", "GET", "/fleet/hosts?limit=10", acme, ``, nil, 400, `unknown query parameter "limit"`},
		{"callers limit", "GET", "/fleet/callers?limit=10", adminToken, ``, nil, 400, `unknown query parameter "limit"`},
		{"list after -1", "GET", "/fleet/runs?after=-1", acme, ``, nil, 400, "after"},
		{"list cursor garbage", "GET", "/fleet/runs?cursor=not-a-cursor", acme, ``, nil, 400, "cursor"},
		{"list cursor empty", "GET", "/fleet/runs?cursor=", acme, ``, nil, 400, "cursor"},
		// GET /fleet/runs/{id}, GET /fleet/hosts
		{"run unknown parameter", "GET", "/fleet/runs/fr-x?after=-1", acme, ``, nil, 400, "after"},
		{"run unknown id", "GET", "/fleet/runs/fr-unknown", acme, ``, nil, 404, "fr-unknown"},
		{"run long id", "GET", "/fleet/runs/" + longID, acme, ``, nil, 404, "does not exist"},
		{"input long id", "POST", "/fleet/runs/" + longID + "/input", acme, `"x"`, nil, 404, "does not exist"},
		{"cancel long id", "POST", "/fleet/runs/" + longID + "/cancel", acme, ``, nil, 404, "does not exist"},
		{"retry long id", "POST", "/fleet/runs/" + longID + "/retry", acme, ``, nil, 404, "does not exist"},
		{"events long id", "GET", "/fleet/runs/" + longID + "/events", acme, ``, nil, 404, "does not exist"},
		{"stream long id", "GET", "/fleet/runs/" + longID + "/stream", acme, ``, nil, 404, "does not exist"},
		{"hosts with a body", "GET", "/fleet/hosts", acme, `{}`, nil, 400, "no request body"},
		// POST /fleet/runs/{id}/input, /cancel, /retry
		{"input no body", "POST", run + "/input", acme, ``, nil, 400, "JSON body is required"},
		{"input malformed", "POST", run + "/input", acme, `{"input":`, nil, 400, "the request body is truncated JSON"},
		{"input not JSON", "POST", run + "/input", acme, `ls -l`, nil, 400, "the request body is not JSON"},
		{"input beside another field", "POST", run + "/input", acme, `{"input":"x","echo":true}`, nil, 400, `unknown field "echo"`},
		{"input over 1 MiB", "POST", run + "/input", acme, hugeInput, nil, 413, "larger than"},
		{"input unknown run", "POST", "/fleet/runs/fr-unknown/input", acme, `"x"`, nil, 404, "fr-unknown"},
		{"input query", "POST", run + "/input?wait=1", acme, `"x"`, nil, 400, `"wait"`},
		{"cancel unknown field", "POST", run + "/cancel", acme, `{"signal":"KILL"}`, nil, 400, `unknown field "signal"`},
		{"cancel array", "POST", run + "/cancel", acme, `[]`, nil, 400, "JSON object"},
		{"retry unknown field", "POST", run + "/retry", acme, `{"attempt":2}`, nil, 400, `unknown field "attempt"`},
		{"retry malformed", "POST", run + "/retry", acme, `{`, nil, 400, "the request body is truncated JSON"},
		{"verb GET", "GET", run + "/retry", acme, ``, nil, 405, "GET"},
		// GET /fleet/runs/{id}/events
		{"events after -1", "GET", run + "/events?after=-1", acme, ``, nil, 400, "after"},
		{"events after Infinity", "GET", run + "/events?after=Infinity", acme, ``, nil, 400, "after"},
		{"events after 1e3", "GET", run + "/events?after=1e3", acme, ``, nil, 400, "after"},
		{"events after empty", "GET", run + "/events?after=", acme, ``, nil, 400, "after"},
		{"events limit 2.5", "GET", run + "/events?limit=2.5", acme, ``, nil, 400, "limit"},
		{"events limit -5", "GET", run + "/events?limit=-5", acme, ``, nil, 400, `limit="-5": ` + limitRange},
		{"events limit twice", "GET", run + "/events?limit=1&limit=2", acme, ``, nil, 400, "limit"},
		{"events limit 0", "GET", run + "/events?limit=0", acme, ``, nil, 400, `limit="0": ` + limitRange},
		{"events limit 1001", "GET", run + "/events?limit=1001", acme, ``, nil, 400, `limit="1001": ` + limitRange},
		{"events limit huge", "GET", run + "/events?limit=99999999999999999999999", acme, ``, nil, 400, limitRange},
		{"events limit text", "GET", run + "/events?limit=all", acme, ``, nil, 400, `limit="all": ` + limitRange},
		{"events limit empty", "GET", run + "/events?limit=", acme, ``, nil, 400, `limit="": ` + limitRange},
		{"events limit 0 waiting", "GET", run + "/events?limit=0&wait=5", acme, ``, nil, 400, `limit="0": ` + limitRange},
		{"events cursor", "GET", run + "/events?cursor=abc", acme, ``, nil, 400, `"cursor"`},
		{"events with a body", "GET", run + "/events", acme, `{"after":1}`, nil, 400, "no request body"},
		{"events unknown run", "GET", "/fleet/runs/fr-unknown/events", acme, ``, nil, 404, "fr-unknown"},
		// GET /metrics
		{"metrics parameter", "GET", "/metrics?hosts=h1", acme, ``, nil, 400, `"hosts"`},
		{"metrics host twice", "GET", "/metrics?host=h1&host=h1", acme, ``, nil, 400, `"host"`},
		{"metrics host and after", "GET", "/metrics?host=h1&after=h0", acme, ``, nil, 400, "after"},
		{"metrics after empty", "GET", "/metrics?after=", acme, ``, nil, 400, "after"},
		{"metrics with a body", "GET", "/metrics", acme, `{}`, nil, 400, "no request body"},
		// GET /fleet/runs/{id}/stream
		{"stream after abc", "GET", run + "/stream?after=abc", acme, ``, nil, 400, "after"},
		{"stream after -1", "GET", run + "/stream?after=-1", acme, ``, nil, 400, "after"},
		{"stream unknown parameter", "GET", run + "/stream?since=4", acme, ``, nil, 400, `"since"`},
		{"stream Last-Event-ID", "GET", run + "/stream", acme, ``, []string{"Last-Event-ID", "-1"}, 400, "Last-Event-ID"},
		{"stream Last-Event-ID text", "GET", run + "/stream", acme, ``, []string{"Last-Event-ID", "abc"}, 400, "Last-Event-ID"},
		{"stream token twice", "GET", run + "/stream?token=" + acme, acme, ``, nil, 400, "not both"},
		{"stream POST", "POST", run + "/stream", acme, `{}`, nil, 405, "POST"},
		{"stream unknown run", "GET", "/fleet/runs/fr-unknown/stream", acme, ``, nil, 404, "fr-unknown"},
	}
	// A key given twice, on every route that takes a body: refused before
	// anything is done, invalid_json, the key named by its path and no
	// value of it quoted (encoding/json alone would take the last value).
	dupKey := "the key is given more than once"
	dups := []tc{
		{"hosts duplicate id", "POST", "/fleet/hosts", adminToken, `{"id":"dup-a","id":"dup-b","baseUrl":"https://h","credentialRef":"` + hostCredRef + `"}`, nil, 400, "id: " + dupKey},
		{"hosts duplicate label", "POST", "/fleet/hosts", adminToken, reg(`,"labels":{"pool":"a","pool":"b"}`), nil, 400, "labels.pool: " + dupKey},
		{"hosts duplicate odd label", "POST", "/fleet/hosts", adminToken, reg(`,"labels":{"k.8s":"a","k.8s":"b"}`), nil, 400, `labels["k.8s"]: ` + dupKey},
		{"enable duplicate", "POST", "/fleet/hosts/h1/enable", adminToken, `{"enabled":true,"enabled":false}`, nil, 400, "enabled: " + dupKey},
		{"probe duplicate", "POST", "/fleet/hosts/h1/probe", adminToken, `{"x":1,"x":2}`, nil, 400, "x: " + dupKey},
		{"probe all duplicate", "POST", "/fleet/probe", adminToken, `{"x":1,"x":2}`, nil, 400, "x: " + dupKey},
		{"drain duplicate", "POST", "/fleet/hosts/h1/drain", adminToken, `{"x":1,"x":2}`, nil, 400, "x: " + dupKey},
		{"resume duplicate", "POST", "/fleet/hosts/h1/resume", adminToken, `{"x":1,"x":2}`, nil, 400, "x: " + dupKey},
		{"mint duplicate admin", "POST", "/fleet/callers", adminToken, mint(scopes + `,"admin":false,"admin":true`), nil, 400, "admin: " + dupKey},
		{"mint duplicate owner", "POST", "/fleet/callers", adminToken, `{"ownerId":"dup-a","ownerId":"dup-b"` + scopes + `}`, nil, 400, "ownerId: " + dupKey},
		{"runs duplicate host", "POST", "/fleet/runs", acme, `{"agent":"shell","host":"h1","host":"h2"}`, nil, 400, "host: " + dupKey},
		{"runs duplicate env", "POST", "/fleet/runs", acme, `{"agent":"shell","env":{"TOKEN":"sk-live-1","TOKEN":"sk-live-2"}}`, nil, 400, "env.TOKEN: " + dupKey},
		{"runs duplicate secret key", "POST", "/fleet/runs", acme, `{"agent":"shell","secrets":[{"projectId":"acme","key":"A","key":"B","domains":["a.b"]}]}`, nil, 400, "secrets[0].key: " + dupKey},
		{"runs duplicate idempotency", "POST", "/fleet/runs", acme, `{"agent":"shell","idempotency":"a","idempotency":"b"}`, nil, 400, "idempotency: " + dupKey},
		{"input duplicate", "POST", run + "/input", acme, `{"input":"ls\n","input":"sk-live-rm"}`, nil, 400, "input: " + dupKey},
		{"input duplicate inside", "POST", run + "/input", acme, `{"input":{"answer":"yes","answer":"no"}}`, nil, 400, "input.answer: " + dupKey},
		{"input duplicate bare", "POST", run + "/input", acme, `{"answer":"yes","answer":"no"}`, nil, 400, "answer: " + dupKey},
		{"cancel duplicate", "POST", run + "/cancel", acme, `{"x":1,"x":2}`, nil, 400, "x: " + dupKey},
		{"retry duplicate", "POST", run + "/retry", acme, `{"x":1,"x":2}`, nil, 400, "x: " + dupKey},
	}
	// Codes: JSON that is not one well-formed value, or gives a key twice,
	// is invalid_json; JSON that is not what the route takes, and a limit
	// out of its range, invalid_request.
	codes := map[string]string{
		"hosts malformed": "invalid_json", "enable no body": "invalid_json", "enable malformed": "invalid_json",
		"mint malformed": "invalid_json", "runs malformed": "invalid_json", "input no body": "invalid_json",
		"input malformed": "invalid_json", "input not JSON": "invalid_json", "retry malformed": "invalid_json",
		"hosts array": "invalid_request", "runs null": "invalid_request", "runs unknown field": "invalid_request",
		"list limit 0": "invalid_request", "list limit 1001": "invalid_request", "events limit 0": "invalid_request",
	}
	for _, c := range dups {
		codes[c.name] = "invalid_json"
	}
	for _, c := range append(cases, dups...) {
		a := s.do(t, c.method, c.path, c.token, c.body, c.headers...)
		if a.status >= 500 {
			t.Errorf("%s: %d %s: a 5xx", c.name, a.status, a.raw)
			continue
		}
		if a.status != c.status || !strings.Contains(a.errorText(), c.mention) {
			t.Errorf("%s: %d %s, want %d naming %q", c.name, a.status, truncate(a.raw), c.status, c.mention)
		}
		if code, ok := codes[c.name]; ok && a.str("code") != code {
			t.Errorf("%s: code %q, want %q", c.name, a.str("code"), code)
		}
		if strings.Contains(a.raw, "sk-live") {
			t.Errorf("%s: the answer quotes a value of the body: %s", c.name, a.raw)
		}
	}
	// Nothing a refused body asked for was done.
	if hosts := s.must(t, http.StatusOK, "GET", "/fleet/hosts", adminToken, "").raw; strings.Contains(hosts, "dup-") {
		t.Errorf("a registration with a key given twice registered a host: %s", hosts)
	}
	if callers := s.must(t, http.StatusOK, "GET", "/fleet/callers", adminToken, "").raw; strings.Contains(callers, "dup-") {
		t.Errorf("a mint with a key given twice minted a caller: %s", callers)
	}
	if got := host.Inputs(s.must(t, http.StatusOK, "GET", run, acme, "").body["run"].(map[string]any)["childRunId"].(string)); len(got) != 0 {
		t.Errorf("inputs with a key given twice reached the host: %s", got)
	}

	// A limit of 1000, the most a page holds, over more than 1000 runs and
	// events: one page of 1000 that says there is more (1001 is refused
	// above, not clamped).
	ctx := context.Background()
	var wg sync.WaitGroup
	seeded := make(chan int)
	now := s.clk.Now()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range seeded {
				r := store.Run{FleetRunID: fmt.Sprintf("fr-seeded%017d", i), OwnerID: "acme-ci", HostID: "h1", Agent: "shell",
					Status: hostproto.StatusSucceeded, Drained: true, CreatedAt: now, UpdatedAt: now}
				if err := s.app.Store.CreateRun(ctx, r); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	for i := 0; i < 1001; i++ {
		seeded <- i
	}
	close(seeded)
	await.Group(t, "the seeding writers", &wg)
	list := s.must(t, http.StatusOK, "GET", "/fleet/runs?limit=1000", acme, "")
	if runs, _ := list.body["runs"].([]any); len(runs) != 1000 || list.body["hasMore"] != true {
		t.Errorf("limit=1000 over 1002 runs: %d runs, hasMore %v; want 1000 and true", len(runs), list.body["hasMore"])
	}
	child := strings.TrimPrefix(run, "/fleet/runs/")
	childRunID := s.must(t, http.StatusOK, "GET", run, acme, "").body["run"].(map[string]any)["childRunId"].(string)
	for i := 0; i < 1001; i++ {
		host.AppendOutput(childRunID, "line\n")
	}
	if _, err := s.app.Fleet.SyncRun(ctx, child); err != nil {
		t.Fatal(err)
	}
	page := s.must(t, http.StatusOK, "GET", run+"/events?limit=1000&after=0", acme, "")
	if evs, _ := page.body["events"].([]any); len(evs) != 1000 || page.body["hasMore"] != true || page.body["nextCursor"] != 1000.0 {
		t.Errorf("limit=1000 over 1002 events: %d events, hasMore %v, nextCursor %v; want 1000, true, 1000",
			len(evs), page.body["hasMore"], page.body["nextCursor"])
	}
}

func truncate(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
