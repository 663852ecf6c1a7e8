package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/api"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/stream"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

const openAPIDoc = "../infra/openapi.yaml"

// openAPIPython is a Python with openapi-spec-validator and what it brings
// (PyYAML, jsonschema, referencing).
func openAPIPython(t *testing.T) string {
	return pythonWith(t, "openapi-spec-validator", "yaml", "jsonschema", "referencing", "openapi_spec_validator")
}

// loadOpenAPI reads infra/openapi.yaml as JSON.
func loadOpenAPI(t *testing.T) map[string]any {
	t.Helper()
	out, err := exec.Command(openAPIPython(t), "-c",
		"import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))", openAPIDoc).Output()
	if err != nil {
		t.Fatalf("reading %s: %v", openAPIDoc, err)
	}
	var doc map[string]any
	must(t, json.Unmarshal(out, &doc))
	return doc
}

// TestOpenAPIValidates: infra/openapi.yaml is a valid OpenAPI 3.1 document.
func TestOpenAPIValidates(t *testing.T) {
	out, err := exec.Command(pyTool(t, "openapi-spec-validator", "openapi-spec-validator"), openAPIDoc).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("openapi-spec-validator: %v\n%s", err, out)
	}
	if v := loadOpenAPI(t)["openapi"]; v != "3.1.0" {
		t.Errorf("openapi %v, want 3.1.0", v)
	}
}

// streamPath is the stream's path template: on the stream function's URL,
// so the one path of the document with servers of its own.
const streamPath = "/fleet/runs/{id}/stream"

var pathParam = regexp.MustCompile(`\{([^}]+)\}`)

// TestOpenAPIRoutesAreTheAPIsRoutes: the document describes exactly the
// api handler's routes, with their access and query parameters, plus the
// stream on its own server.
func TestOpenAPIRoutesAreTheAPIsRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	specs := map[string]api.RouteSpec{}
	for _, r := range api.Routes() {
		specs[r.Method+" "+r.Pattern] = r
	}
	var documented []string
	for path, item := range jsonObj(doc, "paths") {
		ownServer := len(jsonList(jsonObj(item)["servers"])) > 0
		if path == streamPath {
			if !ownServer {
				t.Errorf("%s is documented on the API's servers: it is on the stream function's URL", path)
			}
			if _, ok := stream.Path(pathParam.ReplaceAllString(path, "run-1")); !ok {
				t.Errorf("the stream handler does not serve %s", path)
			}
			continue
		}
		if ownServer {
			t.Errorf("%s has servers of its own: only the stream is elsewhere", path)
		}
		for method, op := range jsonObj(item) {
			if method == "servers" || method == "parameters" {
				continue
			}
			route := strings.ToUpper(method) + " " + path
			documented = append(documented, route)
			spec, ok := specs[route]
			if !ok {
				continue // reported by diffRoutes
			}
			o := jsonObj(op)
			access := "caller"
			switch {
			case spec.Public:
				access = "public"
			case spec.Admin:
				access = "admin"
			}
			if o["x-access"] != access {
				t.Errorf("%s: x-access %v, the route is %s", route, o["x-access"], access)
			}
			if sec, set := o["security"]; spec.Public != (set && len(jsonList(sec)) == 0) {
				t.Errorf("%s: security %v, public %v", route, sec, spec.Public)
			}
			var query, pathParams []string
			for _, p := range jsonList(o["parameters"]) {
				p := resolveRef(doc, p)
				switch p["in"] {
				case "query":
					query = append(query, fmt.Sprint(p["name"]))
				case "path":
					pathParams = append(pathParams, fmt.Sprint(p["name"]))
				}
			}
			sort.Strings(query)
			want := append([]string(nil), spec.Query...)
			sort.Strings(want)
			if strings.Join(query, ",") != strings.Join(want, ",") {
				t.Errorf("%s: query parameters %v documented, the route takes %v", route, query, want)
			}
			var inPath []string
			for _, m := range pathParam.FindAllStringSubmatch(path, -1) {
				inPath = append(inPath, m[1])
			}
			if strings.Join(pathParams, ",") != strings.Join(inPath, ",") {
				t.Errorf("%s: path parameters %v documented, the path has %v", route, pathParams, inPath)
			}
		}
	}
	sort.Strings(documented)
	diffRoutes(t, "infra/openapi.yaml", documented, apiRoutes())
}

// resolveRef follows a local $ref ("#/components/...") to its object.
func resolveRef(doc map[string]any, v any) map[string]any {
	m := jsonObj(v)
	ref, ok := m["$ref"].(string)
	if !ok {
		return m
	}
	return jsonObj(doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/")...)
}

// apiSample is one exchange with Fleet, for the schema check.
type apiSample struct {
	Method      string `json:"method"`
	Path        string `json:"path"` // the documented path template
	Status      int    `json:"status"`
	ContentType string `json:"contentType"`
	Request     any    `json:"request,omitempty"`
	Response    any    `json:"response,omitempty"`
	// SSE holds a stream's frames as (event, data JSON) pairs.
	SSE [][2]string `json:"sse,omitempty"`

	// body and raw are the request and answer as sent, for the check
	// against fleetapi's types.
	body string
	raw  []byte
}

// sampler sends requests to a stack and keeps each exchange.
type sampler struct {
	t       *testing.T
	base    string
	samples []apiSample
}

func (s *sampler) do(method, template, path, token, body string, want int, headers ...string) map[string]any {
	s.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	must(s.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	must(s.t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		s.t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, raw, want)
	}
	sm := apiSample{Method: method, Path: template, Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), body: body, raw: raw}
	if body != "" {
		must(s.t, json.Unmarshal([]byte(body), &sm.Request))
	}
	var answer map[string]any
	switch {
	case strings.HasPrefix(sm.ContentType, "application/json"):
		must(s.t, json.Unmarshal(raw, &sm.Response))
		answer, _ = sm.Response.(map[string]any)
	case strings.HasPrefix(sm.ContentType, "text/event-stream"):
		sm.SSE = sseFrames(raw)
	default:
		sm.Response = string(raw)
	}
	s.samples = append(s.samples, sm)
	return answer
}

// sseFrames splits a stream into (event, data) pairs; comments and retry
// hints carry no data.
func sseFrames(raw []byte) [][2]string {
	var frames [][2]string
	event, data := "", ""
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if event != "" {
				frames = append(frames, [2]string{event, data})
			}
			event, data = "", ""
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		}
	}
	return frames
}

// validateScript checks each sample against the document: its status and
// media type are documented for the operation, and its request and
// response bodies (and a stream's event data) validate against the schemas,
// $refs resolved, as JSON Schema 2020-12 (OpenAPI 3.1's dialect).
const validateScript = `import copy, json, sys, yaml
from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
doc = yaml.safe_load(open(sys.argv[1]))
samples = json.load(open(sys.argv[2]))
BASE = "urn:runfleet:openapi"
registry = Registry().with_resource(BASE, Resource.from_contents(doc, default_specification=DRAFT202012))
def absolute(v):
    if isinstance(v, dict):
        return {k: (BASE + x if k == "$ref" and isinstance(x, str) and x.startswith("#") else absolute(x)) for k, x in v.items()}
    if isinstance(v, list):
        return [absolute(x) for x in v]
    return v
def deref(v):
    while isinstance(v, dict) and "$ref" in v:
        node = doc
        for part in v["$ref"][2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        v = node
    return v
def check(schema, value, what):
    v = Draft202012Validator(absolute(schema), registry=registry, format_checker=FormatChecker())
    return ["%s: %s at %s" % (what, e.message, "/".join(map(str, e.absolute_path)) or "the top") for e in v.iter_errors(value)]
errors = []
for s in samples:
    name = "%s %s %d" % (s["method"], s["path"], s["status"])
    op = doc["paths"].get(s["path"], {}).get(s["method"].lower())
    if op is None:
        errors.append("%s: no such operation" % name); continue
    resp = deref(op["responses"].get(str(s["status"])))
    if resp is None:
        errors.append("%s: status not documented" % name); continue
    media = s["contentType"].split(";")[0].strip()
    content = resp.get("content", {})
    if media not in content:
        errors.append("%s: %s not documented (have %s)" % (name, media, list(content))); continue
    if "request" in s and s["status"] < 300:
        body = op["requestBody"]["content"]["application/json"]["schema"]
        errors += check(body, s["request"], name + " request")
    if media == "application/json":
        errors += check(content[media]["schema"], s["response"], name + " response")
    for event, data in s.get("sse") or []:
        schema = {"event": {"$ref": "#/components/schemas/Event"}, "snapshot": {"$ref": "#/components/schemas/StreamSnapshot"},
                  "done": {"$ref": "#/components/schemas/StreamDone"}, "egress": {"$ref": "#/components/schemas/EgressRecord"}}.get(event)
        if schema is None:
            errors.append("%s: undocumented stream event %r" % (name, event)); continue
        errors += check(schema, json.loads(data), "%s event %s" % (name, event))
print("\n".join(errors))
sys.exit(1 if errors else 0)`

// TestOpenAPIDescribesRealAnswers drives every route of a real stack (and
// the stream) through its successes and a sample of its refusals, and
// validates each exchange against infra/openapi.yaml. Response schemas
// forbid undocumented fields, so a field the API adds or renames fails here.
func TestOpenAPIDescribesRealAnswers(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{})
	sm := &sampler{t: t, base: s.srv.URL}
	host := s.addHost(t, "edge-1", fakehost.Config{Features: fakeFeatures, TLS: true}, map[string]any{"labels": map[string]string{"pool": "a"}})
	host.SetStorage(&hostproto.Storage{FreeBytes: 10 << 30, MinFreeBytes: 256 << 20})
	host.SetLimits(&hostproto.Limits{Enforced: hostproto.LimitsCgroup1, MemoryBytes: 2 << 30, Pids: 1024, CPU: 1.5})
	host.SetLoad(&hostproto.Load{Active: 1, MaxConcurrent: 8})
	adm := adminToken

	sm.do("GET", "/healthz", "/healthz", "", "", 200)
	// The dashboard: its page, each asset the page names, and a name none has.
	sm.do("GET", "/ui", "/ui", "", "", 200)
	for _, m := range assetRef.FindAllStringSubmatch(fmt.Sprint(sm.samples[len(sm.samples)-1].Response), -1) {
		sm.do("GET", "/ui/{file}", m[1], "", "", 200)
	}
	sm.do("GET", "/ui/{file}", "/ui/app.js", "", "", 404)
	sm.do("POST", "/fleet/hosts", "/fleet/hosts", adm, jsonBody(map[string]any{"id": "edge-2", "baseUrl": host.URL, "credentialRef": hostCredRef,
		"caPem": host.CAPEM(), "localPaths": []string{"/srv/work/a"}, "enabled": false}), 201)
	sm.do("POST", "/fleet/hosts", "/fleet/hosts", adm, fmt.Sprintf(`{"id":"edge-2","baseUrl":%q,"credentialRef":%q}`, host.URL, hostCredRef), 409)
	sm.do("POST", "/fleet/hosts", "/fleet/hosts", adm, `{"id":"edge-3","baseUrl":"http://10.0.0.1:7070","credentialRef":"nope","Labels":{}}`, 400)
	sm.do("POST", "/fleet/hosts/{id}/enable", "/fleet/hosts/edge-2/enable", adm, `{"enabled":true}`, 200)
	sm.do("POST", "/fleet/hosts/{id}/probe", "/fleet/hosts/edge-1/probe", adm, "", 200)
	sm.do("POST", "/fleet/hosts/{id}/probe", "/fleet/hosts/nope/probe", adm, "", 404)
	sm.do("POST", "/fleet/probe", "/fleet/probe", adm, "{}", 200)
	sm.do("GET", "/fleet/hosts", "/fleet/hosts", adm, "", 200)
	sm.do("GET", "/fleet/hosts", "/fleet/hosts", "", "", 401)

	caller := sm.do("POST", "/fleet/callers", "/fleet/callers", adm, `{"ownerId":"ci","allowedHosts":["edge-1","edge-2"],"allowedProjects":["acme"]}`, 201)
	tok := fmt.Sprint(caller["token"])
	sm.do("POST", "/fleet/callers", "/fleet/callers", adm, `{"ownerId":"ops","admin":true}`, 201)
	sm.do("POST", "/fleet/callers", "/fleet/callers", adm, `{"ownerId":"ci","allowedHosts":"*","allowedProjects":"*"}`, 409)
	sm.do("GET", "/fleet/callers", "/fleet/callers", adm, "", 200)
	sm.do("GET", "/fleet/callers", "/fleet/callers", tok, "", 403)
	sm.do("GET", "/fleet/hosts", "/fleet/hosts", tok, "", 200)

	dispatch := `{"host":"edge-1","agent":"shell","prompt":"make test","labels":{"pool":"a"},"env":{"CI":"1"},` +
		`"secrets":[{"projectId":"acme","key":"API_KEY","domains":["api.example.com"]}],"idempotency":"build-1"}`
	run := sm.do("POST", "/fleet/runs", "/fleet/runs", tok, dispatch, 201)
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, dispatch, 200)
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, `{"agent":"shell","prompt":"x","repository":"acme/app"}`, 201, "Idempotency-Key", "build-2")
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, `{"agent":"nope"}`, 409)
	// A run that waits: no host offers its agent.
	waiting := sm.do("POST", "/fleet/runs", "/fleet/runs", tok, `{"agent":"nope","queue":{"timeout":"10m","priority":5}}`, 202, "Idempotency-Key", "wait-1")
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, `{"agent":"nope","queue":{"timeout":"10m","priority":5}}`, 200, "Idempotency-Key", "wait-1")
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, `{"agent":"nope","queue":{"timeout":"soon"}}`, 400)
	sm.do("GET", "/fleet/runs/{id}", "/fleet/runs/"+fmt.Sprint(waiting["fleetRunId"]), tok, "", 200)
	sm.do("POST", "/fleet/runs/{id}/cancel", "/fleet/runs/"+fmt.Sprint(waiting["fleetRunId"])+"/cancel", tok, "", 200)
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, `{"agent":"shell","secrets":[{"projectId":"other","key":"K","domains":["a.example.com"]}]}`, 403)
	// A start the host refuses: 409 with the run, its reason and detail;
	// again with the key, 200 with the run as it stands.
	host.RefuseStarts(http.StatusConflict, "draining")
	refused := sm.do("POST", "/fleet/runs", "/fleet/runs", tok, `{"agent":"shell"}`, 409, "Idempotency-Key", "refused-1")
	host.RefuseStarts(0, "")
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, `{"agent":"shell"}`, 200, "Idempotency-Key", "refused-1")
	sm.do("GET", "/fleet/runs/{id}", "/fleet/runs/"+fmt.Sprint(refused["fleetRunId"]), tok, "", 200)
	id, child := fmt.Sprint(run["fleetRunId"]), fmt.Sprint(run["childRunId"])
	sm.do("GET", "/fleet/runs", "/fleet/runs", tok, "", 200)
	sm.do("GET", "/fleet/runs", "/fleet/runs?limit=1", adm, "", 200)
	sm.do("GET", "/fleet/runs", "/fleet/runs?limit=-1", tok, "", 400)
	sm.do("GET", "/fleet/runs", "/fleet/runs?limit=0", tok, "", 400)
	sm.do("GET", "/fleet/runs", "/fleet/runs?status=pending&agent=shell&host=edge-1&limit=1", tok, "", 200)
	sm.do("GET", "/fleet/runs", "/fleet/runs?status=done", tok, "", 400)
	sm.do("GET", "/fleet/runs", "/fleet/runs?host=edge-3", tok, "", 403)
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, `{"agent":"shell","agent":"shell"}`, 400)
	sm.do("GET", "/fleet/runs/{id}", "/fleet/runs/"+id, tok, "", 200)
	sm.do("GET", "/fleet/runs/{id}", "/fleet/runs/nope", tok, "", 404)
	sm.do("POST", "/fleet/runs/{id}/input", "/fleet/runs/"+id+"/input", tok, `{"input":{"answer":"yes"}}`, 200)
	host.AppendOutput(child, "building\n")
	leak := egress.Record{Via: egress.ViaProxy, Authority: "paste.example.com:443", Method: "POST", Path: "/upload?t=*",
		Status: 403, BytesUp: 512, Keys: []string{"acme/API_KEY"}, Action: egress.Blocked, Reason: egress.AlertRealValue, Alert: egress.AlertRealValue}
	host.AddEgress(child, egress.Record{Via: egress.ViaProxy, Authority: "api.example.com:443", Method: "GET", Path: "/v1/items?page=*",
		Status: 200, BytesUp: 120, BytesDown: 2048, DurationUs: 3100, Keys: []string{"acme/API_KEY"}, Action: egress.Substituted}, leak,
		egress.Record{Via: egress.ViaDNS, Authority: "exfil.example.net", Action: egress.Blocked, Reason: "name_not_granted"})
	host.SetRun(child, "failed", new(int), "")
	sm.do("POST", "/fleet/runs/{id}/retry", "/fleet/runs/"+id+"/retry", tok, "", 200)
	sm.do("POST", "/fleet/runs/{id}/retry", "/fleet/runs/"+id+"/retry", tok, "", 409)
	sm.do("POST", "/fleet/runs/{id}/cancel", "/fleet/runs/"+id+"/cancel", tok, "{}", 200)
	sm.do("POST", "/fleet/runs/{id}/cancel", "/fleet/runs/"+id+"/cancel", tok, "", 409)
	sm.do("POST", "/fleet/runs/{id}/input", "/fleet/runs/"+id+"/input", tok, `{"input":"late"}`, 409)
	host.FaultVerbs(fakehost.VerbsFail)
	sm.do("POST", "/fleet/runs/{id}/cancel", "/fleet/runs/"+id+"/cancel", tok, "", 202)
	host.FaultVerbs(fakehost.VerbsNormal)
	sm.do("GET", "/metrics", "/metrics", tok, "", 200)
	sm.do("GET", "/fleet/capacity", "/fleet/capacity", adm, "", 200)
	sm.do("GET", "/fleet/capacity", "/fleet/capacity", tok, "", 403)

	// The mirror, through the sync the sweep and the stream do.
	if _, err := s.app.Fleet.SyncRun(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	sm.do("GET", "/fleet/runs/{id}/events", "/fleet/runs/"+id+"/events?after=0&limit=2", tok, "", 200)
	sm.do("GET", "/fleet/runs/{id}/events", "/fleet/runs/"+id+"/events?after=1000", tok, "", 200)
	sm.do("GET", "/fleet/runs/{id}/events", "/fleet/runs/"+id+"/events?after=x", tok, "", 400)
	sm.do("GET", "/fleet/runs/{id}/events", "/fleet/runs/"+id+"/events?limit=1001", tok, "", 400)

	// The egress ledger mirrored with the run's end, its summary on GET,
	// the alerts listing.
	sm.do("GET", "/fleet/runs/{id}", "/fleet/runs/"+id, tok, "", 200)
	sm.do("GET", "/fleet/runs/{id}/egress", "/fleet/runs/"+id+"/egress?limit=2", tok, "", 200)
	sm.do("GET", "/fleet/runs/{id}/egress", "/fleet/runs/"+id+"/egress?cursor=2&verify=true", tok, "", 200)
	sm.do("GET", "/fleet/runs/{id}/egress", "/fleet/runs/"+id+"/egress?cursor=99", tok, "", 200)
	sm.do("GET", "/fleet/runs/{id}/egress", "/fleet/runs/"+fmt.Sprint(refused["fleetRunId"])+"/egress?verify=1", tok, "", 200)
	sm.do("GET", "/fleet/runs/{id}/egress", "/fleet/runs/"+id+"/egress?limit=0", tok, "", 400)
	sm.do("GET", "/fleet/runs/{id}/egress", "/fleet/runs/"+id+"/egress?verify=maybe", tok, "", 400)
	sm.do("GET", "/fleet/runs/{id}/egress", "/fleet/runs/nope/egress", tok, "", 404)
	sm.do("GET", "/fleet/runs", "/fleet/runs?alerts=true", adm, "", 200)
	sm.do("GET", "/fleet/runs", "/fleet/runs?alerts=true", tok, "", 403)

	// The stream, as the local stack serves it, of the run now ended.
	handler, err := s.app.HTTPHandler(slog.New(slog.NewJSONHandler(io.Discard, nil)), s.clk)
	must(t, err)
	streamSrv := httptest.NewServer(handler)
	t.Cleanup(streamSrv.Close)
	streams := &sampler{t: t, base: streamSrv.URL}
	streams.do("GET", streamPath, "/fleet/runs/"+id+"/stream?token="+tok, "", "", 200)
	streams.do("GET", streamPath, "/fleet/runs/"+id+"/stream?after=1", tok, "", 200, "Last-Event-ID", "2")
	streams.do("GET", streamPath, "/fleet/runs/"+id+"/stream?egress=true", tok, "", 200, "Last-Event-ID", "3:1")
	streams.do("GET", streamPath, "/fleet/runs/"+id+"/stream", "", "", 401)
	streams.do("GET", streamPath, "/fleet/runs/nope/stream", tok, "", 404)
	if f := streams.samples[0].SSE; len(f) < 3 || f[len(f)-1][0] != "done" {
		t.Fatalf("stream frames %v", f)
	}
	if f := streams.samples[2].SSE; len(f) < 3 || !slices.ContainsFunc(f, func(x [2]string) bool { return x[0] == "egress" }) || f[len(f)-1][0] != "done" {
		t.Fatalf("stream frames with egress %v", f)
	}
	sm.samples = append(sm.samples, streams.samples...)

	sm.do("POST", "/fleet/hosts/{id}/drain", "/fleet/hosts/edge-2/drain", adm, "", 200)
	sm.do("POST", "/fleet/hosts/{id}/drain", "/fleet/hosts/nope/drain", adm, "", 404)
	sm.do("POST", "/fleet/hosts/{id}/drain", "/fleet/hosts/edge-2/drain", tok, "", 403)
	sm.do("POST", "/fleet/hosts/{id}/resume", "/fleet/hosts/edge-2/resume", adm, "{}", 200)
	// A host that is gone: its drain and resume are refused (409), the
	// drain recorded all the same.
	gone := s.addHost(t, "edge-3", fakehost.Config{}, nil)
	gone.Close()
	sm.do("POST", "/fleet/hosts/{id}/drain", "/fleet/hosts/edge-3/drain", adm, "", 409)
	sm.do("POST", "/fleet/hosts/{id}/resume", "/fleet/hosts/edge-3/resume", adm, `{"x":1,"x":2}`, 400)
	sm.do("POST", "/fleet/hosts/{id}/resume", "/fleet/hosts/edge-3/resume", adm, "", 409)
	sm.do("DELETE", "/fleet/hosts/{id}", "/fleet/hosts/edge-1", adm, "", 409)
	sm.do("DELETE", "/fleet/hosts/{id}", "/fleet/hosts/edge-1?force=1", adm, "", 200)
	sm.do("DELETE", "/fleet/callers/{ownerId}", "/fleet/callers/ci", adm, "", 200)
	sm.do("DELETE", "/fleet/callers/{ownerId}", "/fleet/callers/ci", adm, "", 404)

	// Every route answered at least once with success.
	ok := map[string]bool{}
	for _, x := range sm.samples {
		if x.Status < 300 {
			ok[x.Method+" "+x.Path] = true
		}
	}
	for _, r := range apiRoutes() {
		if !ok[r] {
			t.Errorf("no successful sample of %s", r)
		}
	}

	for _, x := range sm.samples {
		checkAPITypes(t, x)
	}

	path := filepath.Join(t.TempDir(), "samples.json")
	b, _ := json.Marshal(sm.samples)
	must(t, os.WriteFile(path, b, 0o600))
	out, err := exec.Command(openAPIPython(t), "-c", validateScript, openAPIDoc, path).CombinedOutput()
	if err != nil {
		t.Fatalf("answers the document does not describe (%v):\n%s", err, out)
	}
}

// apiRequestTypes are the fleetapi types of the routes' request bodies, by
// "METHOD path template". A route that takes no fields takes struct{}.
var apiRequestTypes = map[string]func() any{
	"POST /fleet/hosts":             func() any { return new(fleetapi.RegisterHost) },
	"POST /fleet/hosts/{id}/enable": func() any { return new(fleetapi.SetEnabled) },
	"POST /fleet/hosts/{id}/probe":  func() any { return new(struct{}) },
	"POST /fleet/probe":             func() any { return new(struct{}) },
	"POST /fleet/hosts/{id}/drain":  func() any { return new(struct{}) },
	"POST /fleet/hosts/{id}/resume": func() any { return new(struct{}) },
	"POST /fleet/callers":           func() any { return new(fleetapi.MintCaller) },
	"POST /fleet/runs":              func() any { return new(fleetapi.DispatchRequest) },
	"POST /fleet/runs/{id}/input":   func() any { return new(fleetapi.InputRequest) },
	"POST /fleet/runs/{id}/cancel":  func() any { return new(struct{}) },
	"POST /fleet/runs/{id}/retry":   func() any { return new(struct{}) },
}

// apiAnswerTypes are the fleetapi types of the answers, by "METHOD path
// template status". Any other status of 400 and above is a fleetapi.Error
// (a dispatch's 409 that names its run is a DispatchRefused, a verb's 409
// that says accepted an InteractionRefused or a HostDrainRefused; the
// stream's 429 a TooManyStreams).
var apiAnswerTypes = map[string]func() any{
	"GET /healthz 200":                    func() any { return new(fleetapi.Health) },
	"GET /fleet/hosts 200":                func() any { return new(fleetapi.HostList) },
	"POST /fleet/hosts 201":               func() any { return new(fleetapi.HostAnswer) },
	"POST /fleet/hosts/{id}/enable 200":   func() any { return new(fleetapi.HostAnswer) },
	"DELETE /fleet/hosts/{id} 200":        func() any { return new(fleetapi.HostDeleted) },
	"DELETE /fleet/hosts/{id} 202":        func() any { return new(fleetapi.HostDeleting) },
	"POST /fleet/hosts/{id}/probe 200":    func() any { return new(fleetapi.ProbeAnswer) },
	"POST /fleet/probe 200":               func() any { return new(fleetapi.ProbeAll) },
	"POST /fleet/hosts/{id}/drain 200":    func() any { return new(fleetapi.HostDrain) },
	"POST /fleet/hosts/{id}/resume 200":   func() any { return new(fleetapi.HostDrain) },
	"POST /fleet/callers 201":             func() any { return new(fleetapi.Minted) },
	"GET /fleet/callers 200":              func() any { return new(fleetapi.CallerList) },
	"DELETE /fleet/callers/{ownerId} 200": func() any { return new(fleetapi.Revoked) },
	"POST /fleet/runs 200":                func() any { return new(fleetapi.DispatchAnswer) },
	"POST /fleet/runs 201":                func() any { return new(fleetapi.DispatchAnswer) },
	"POST /fleet/runs 202":                func() any { return new(fleetapi.DispatchAnswer) },
	"GET /fleet/runs 200":                 func() any { return new(fleetapi.RunPage) },
	"GET /fleet/capacity 200":             func() any { return new(fleetapi.Capacity) },
	"GET /fleet/runs/{id} 200":            func() any { return new(fleetapi.RunAnswer) },
	"POST /fleet/runs/{id}/input 200":     func() any { return new(fleetapi.Interaction) },
	"POST /fleet/runs/{id}/cancel 200":    func() any { return new(fleetapi.Interaction) },
	"POST /fleet/runs/{id}/retry 200":     func() any { return new(fleetapi.Interaction) },
	"POST /fleet/runs/{id}/input 202":     func() any { return new(fleetapi.Interaction) },
	"POST /fleet/runs/{id}/cancel 202":    func() any { return new(fleetapi.Interaction) },
	"POST /fleet/runs/{id}/retry 202":     func() any { return new(fleetapi.Interaction) },
	"POST /fleet/hosts/{id}/drain 202":    func() any { return new(fleetapi.HostDrain) },
	"POST /fleet/hosts/{id}/resume 202":   func() any { return new(fleetapi.HostDrain) },
	"GET /fleet/runs/{id}/events 200":     func() any { return new(fleetapi.EventPage) },
	"GET /fleet/runs/{id}/egress 200":     func() any { return new(fleetapi.EgressPage) },
	"GET " + streamPath + " 429":          func() any { return new(fleetapi.TooManyStreams) },
}

// refusedVerbTypes are the types of a forwarded verb's 409 when the host
// refused it (an error and the verb's answer in one object).
var refusedVerbTypes = map[string]func() any{
	"POST /fleet/runs/{id}/input":   func() any { return new(fleetapi.InteractionRefused) },
	"POST /fleet/runs/{id}/cancel":  func() any { return new(fleetapi.InteractionRefused) },
	"POST /fleet/runs/{id}/retry":   func() any { return new(fleetapi.InteractionRefused) },
	"POST /fleet/hosts/{id}/drain":  func() any { return new(fleetapi.HostDrainRefused) },
	"POST /fleet/hosts/{id}/resume": func() any { return new(fleetapi.HostDrainRefused) },
}

// apiStreamTypes are the data types of the stream's SSE events.
var apiStreamTypes = map[string]func() any{
	fleetapi.SSEEvent:    func() any { return new(fleetapi.Event) },
	fleetapi.SSESnapshot: func() any { return new(fleetapi.StreamSnapshot) },
	fleetapi.SSEDone:     func() any { return new(fleetapi.StreamDone) },
	fleetapi.SSEIdle:     func() any { return new(fleetapi.StreamIdle) },
	fleetapi.SSEEgress:   func() any { return new(fleetapi.EgressRecord) },
}

// checkAPITypes decodes a sample's request body, answer and stream data
// into their fleetapi types, strictly, and re-encodes them: a field the
// types lack fails the decoding, one they would add or drop (or a value
// they would change) fails the comparison. An answer must come back to its
// very bytes, as the API encodes it (so its keys' order is pinned too); a
// request, which the test wrote, to the same JSON.
func checkAPITypes(t *testing.T, x apiSample) {
	t.Helper()
	route := x.Method + " " + x.Path
	name := fmt.Sprintf("%s %d", route, x.Status)
	if x.body != "" && x.Status != http.StatusBadRequest && x.Status != http.StatusRequestEntityTooLarge {
		// A 400's body is malformed on purpose.
		newReq, ok := apiRequestTypes[route]
		if !ok {
			t.Errorf("%s: the request has no fleetapi type", name)
		} else if out, err := roundTrip([]byte(x.body), newReq(), json.Marshal); err != nil {
			t.Errorf("%s request: %v", name, err)
		} else if !sameJSON([]byte(x.body), out) {
			t.Errorf("%s request: fleetapi re-encodes\n%s\nas\n%s", name, x.body, out)
		}
	}
	for _, f := range x.SSE {
		newData, ok := apiStreamTypes[f[0]]
		if !ok {
			t.Errorf("%s: stream event %q has no fleetapi type", name, f[0])
			continue
		}
		// The stream writes data with encoding/json's defaults.
		if out, err := roundTrip([]byte(f[1]), newData(), json.Marshal); err != nil || !bytes.Equal(out, []byte(f[1])) {
			t.Errorf("%s event %s: fleetapi re-encodes\n%s\nas\n%s (%v)", name, f[0], f[1], out, err)
		}
	}
	if !strings.HasPrefix(x.ContentType, "application/json") {
		return
	}
	newAnswer, ok := apiAnswerTypes[name]
	switch {
	case ok:
	case x.Status == http.StatusConflict && route == "POST /fleet/runs" && bytes.Contains(x.raw, []byte(`"fleetRunId"`)):
		newAnswer = func() any { return new(fleetapi.DispatchRefused) }
	case x.Status == http.StatusConflict && refusedVerbTypes[route] != nil && bytes.Contains(x.raw, []byte(`"accepted"`)):
		newAnswer = refusedVerbTypes[route]
	case x.Status >= 400:
		newAnswer = func() any { return new(fleetapi.Error) }
	default:
		t.Errorf("%s: the answer has no fleetapi type", name)
		return
	}
	v := newAnswer()
	if out, err := roundTrip(x.raw, v, api.EncodeJSON); err != nil || !bytes.Equal(out, x.raw) {
		t.Errorf("%s answer: fleetapi re-encodes\n%s\nas\n%s (%v)", name, x.raw, out, err)
	}
	if e, ok := v.(*fleetapi.Error); ok && e.Code == fleetapi.CodeNoEligibleHost {
		var d fleetapi.NoEligibleHost
		if out, err := roundTrip(e.Details, &d, json.Marshal); err != nil || !bytes.Equal(out, e.Details) || len(d.Excluded) == 0 {
			t.Errorf("%s details: fleetapi.NoEligibleHost re-encodes\n%s\nas\n%s (%v)", name, e.Details, out, err)
		}
	}
}

// roundTrip decodes raw into v, refusing unknown fields, and encodes it again.
func roundTrip(raw []byte, v any, encode func(any) ([]byte, error)) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, fmt.Errorf("decoding into %T: %w", v, err)
	}
	return encode(v)
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b []byte) bool {
	var va, vb any
	return json.Unmarshal(a, &va) == nil && json.Unmarshal(b, &vb) == nil && reflect.DeepEqual(va, vb)
}
