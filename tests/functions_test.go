package tests

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/runfleet/runfleet/shared/api"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/shared/stream"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/lambdatest"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
)

// The sample events (infra/sam/events, README: SAM local) are the events
// each function receives in AWS; the tests and sam local users share them.
const (
	samEvents = "../infra/sam/events/"
	// apiGatewayFixture is an API Gateway v2 HTTP event (payload 2.0) for
	// the explicit route POST /fleet/runs (routeKey as API Gateway sets
	// it), with a JSON body.
	apiGatewayFixture = samEvents + "api/dispatch.json"
	// probeFixture and sweepFixture are EventBridge Scheduler's default
	// payload to a Lambda target (ScheduleV2 without Input): its detail is
	// the string "{}".
	probeFixture = samEvents + "probe/scheduled.json"
	sweepFixture = samEvents + "sweep/scheduled.json"
	// functionURLFixture is a Function URL request (payload 2.0) for the
	// stream's path.
	functionURLFixture = samEvents + "stream/stream.json"
)

// templateFunction is the function name (functions/<name>) of each of
// template.yaml's functions, by logical id.
func templateFunction(name string) string {
	for id, pkg := range templateFunctions {
		if filepath.Base(pkg) == name {
			return id
		}
	}
	panic("no function " + name + " in templateFunctions")
}

// functionTimeout is the timeout template.yaml gives function name, as
// SAM deploys it (Globals applied).
func functionTimeout(t testing.TB, name string) time.Duration {
	t.Helper()
	_, tpl := templates(t)
	secs, ok := jsonObj(tpl, "Resources", templateFunction(name), "Properties")["Timeout"].(float64)
	if !ok || secs <= 0 {
		t.Fatalf("template.yaml gives %s no timeout", name)
	}
	return time.Duration(secs) * time.Second
}

// emulatorEnv is function name's environment as template.yaml deploys it
// (default parameters) with only what must point at this test's moto
// instead of AWS substituted: the tables' names (this test's, prefixed),
// the secrets' names (the template's "runfleet/" prefix becomes
// secretsPrefix, unique on the shared moto), the wake queue (one of moto's
// for these tables), and AWS_ENDPOINT_URL, which the template declares
// empty for sam local to set (here moto's URL).
// The region and credentials are what Lambda's runtime gives every
// function, not the template.
func emulatorEnv(t *testing.T, name string, tables dynamostore.TableNames, secretsPrefix string) map[string]string {
	t.Helper()
	_, tpl := templates(t)
	r := newResolver(tpl, nil)
	r.refs["HostsTable"], r.refs["RunsTable"], r.refs["EventsTable"] = tables.Hosts, tables.Runs, tables.Events
	r.refs["EgressTable"], r.refs["CallersTable"], r.refs["IdempotencyTable"] = tables.Egress, tables.Callers, tables.Idempotency
	env := functionEnv(t, r, tpl, templateFunction(name))
	for _, secret := range []string{config.EnvCredentials, config.EnvAdminTokenSecret} {
		v, set := env[secret]
		if !set {
			continue
		}
		if !strings.Contains(v, "runfleet/") {
			t.Fatalf("template.yaml's %s for %s is %q: no runfleet/ secret name to move onto this test's", secret, name, v)
		}
		env[secret] = strings.Replace(v, "runfleet/", secretsPrefix, 1)
	}
	if v, set := env[envAWSEndpoint]; !set || v != "" {
		t.Fatalf("template.yaml's %s for %s is %q (declared: %v), want it declared empty", envAWSEndpoint, name, v, set)
	}
	env[envAWSEndpoint] = moto.URL
	if _, set := env[config.EnvWakeQueue]; set {
		q, err := sqs.NewFromConfig(moto.AWSConfig()).CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(tables.Runs + "-wakes")})
		must(t, err)
		env[config.EnvWakeQueue] = aws.ToString(q.QueueUrl)
	}
	env["AWS_REGION"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = "us-east-1", "test", "test"
	return env
}

// TestEveryFunctionUnderTheEmulator builds each of the five functions as it
// ships (for this machine's architecture), runs each under the Lambda
// runtime interface emulator with the environment template.yaml gives it
// (tables on moto_server created by dynamostore, the admin token and the
// host credentials in Secrets Manager on moto, the wake queue on moto's
// SQS), and drives a run through them with the events AWS sends: the api
// answers API Gateway v2 HTTP events for its routes, probe and sweep do
// their work on EventBridge Scheduler's payload, the dispatcher takes the
// wake the run's end sent as the queue's event source mapping delivers it,
// and stream answers a Function URL event in the streaming wire format. It
// logs each function's init duration (the emulator's REPORT line) and
// bootstrap size.
func TestEveryFunctionUnderTheEmulator(t *testing.T) {
	ctx := context.Background()
	id := motoserver.Unique("fn")
	prefix := id + "-"
	tables := dynamostore.Prefixed(prefix)
	st, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: tables})
	must(t, err)
	must(t, st.CreateTables(ctx))

	host := fakehost.New(fakehost.Config{})
	t.Cleanup(host.Close)
	const adminTok = "emulator-admin-token-0123456789abcdef"
	secretsPrefix := "runfleet-" + id + "/"
	sm := secretsmanager.NewFromConfig(moto.AWSConfig())
	for name, value := range map[string]string{secretsPrefix + "admin-token": adminTok, secretsPrefix + "hosts/edge-1": host.Token()} {
		_, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name), SecretString: aws.String(value)})
		must(t, err)
	}
	fns := map[string]*lambdatest.Function{}
	var wakes *wakeMapping
	for _, name := range []string{"api", "probe", "sweep", "stream", "dispatcher"} {
		env := emulatorEnv(t, name, tables, secretsPrefix)
		wakes = mappingOf(t, env[config.EnvWakeQueue])
		fns[name] = lambdatest.Start(t, functionBootstrap(t, name), env, functionTimeout(t, name))
	}
	gw := newAPIGateway(t)
	call := func(want int, method, path, token, body string, headers ...string) map[string]any {
		t.Helper()
		status, out, raw := gw.invoke(fns["api"], method, path, token, body, headers...)
		if status != want {
			t.Fatalf("api: %s %s: %d %s, want %d", method, path, status, raw, want)
		}
		return out
	}

	// The api: public, refused and admin routes.
	if h := call(200, "GET", "/healthz", "", ""); h["ok"] != true || h["product"] != "runfleet" {
		t.Fatalf("healthz %v", h)
	}
	if e := call(401, "GET", "/fleet/hosts", "", ""); e["code"] != "unauthenticated" {
		t.Fatalf("no token: %v", e)
	}
	call(401, "POST", "/fleet/runs", "rft_never-minted-000000000000000000000", `{"agent":"shell"}`)
	reg := call(201, "POST", "/fleet/hosts", adminTok, fmt.Sprintf(`{"id":"edge-1","baseUrl":%q,"credentialRef":"edge-1"}`, host.URL))
	if jsonObj(reg, "host")["id"] != "edge-1" {
		t.Fatalf("register: %v", reg)
	}

	// probe, on the scheduler's payload: the host's probe is recorded.
	var probed struct {
		Probed int            `json:"probed"`
		Status map[string]int `json:"status"`
	}
	must(t, json.Unmarshal(fns["probe"].Invoke(t, fixture(t, probeFixture)), &probed))
	if probed.Probed != 1 || probed.Status["ok"] != 1 {
		t.Fatalf("probe answered %+v", probed)
	}
	hosts := jsonList(call(200, "GET", "/fleet/hosts", adminTok, "")["hosts"])
	if len(hosts) != 1 || jsonObj(hosts[0].(map[string]any), "probe")["status"] != "ok" {
		t.Fatalf("hosts after the scheduled probe: %v", hosts)
	}

	// A caller dispatches; get and list show the run.
	tok := fmt.Sprint(call(201, "POST", "/fleet/callers", adminTok, `{"ownerId":"ci","allowedHosts":["edge-1"],"allowedProjects":"*"}`)["token"])
	run := call(201, "POST", "/fleet/runs", tok, `{"agent":"shell","prompt":"echo hello"}`, "idempotency-key", "build-4711")
	id, child := fmt.Sprint(run["fleetRunId"]), fmt.Sprint(run["childRunId"])
	if run["hostId"] != "edge-1" || child == "" || host.StartCalls() != 1 {
		t.Fatalf("dispatch: %v (host saw %d starts)", run, host.StartCalls())
	}
	if again := call(200, "POST", "/fleet/runs", tok, `{"agent":"shell","prompt":"echo hello"}`, "idempotency-key", "build-4711"); again["reused"] != true || again["fleetRunId"] != id {
		t.Fatalf("the same key again: %v", again)
	}
	if got := jsonObj(call(200, "GET", "/fleet/runs/"+id, tok, ""), "run"); got["fleetRunId"] != id || got["childRunId"] != child || got["status"] != "pending" {
		t.Fatalf("get: %v", got)
	}
	listed := jsonList(call(200, "GET", "/fleet/runs?limit=10", tok, "")["runs"])
	if len(listed) != 1 || listed[0].(map[string]any)["fleetRunId"] != id {
		t.Fatalf("list: %v", listed)
	}
	call(404, "GET", "/fleet/runs/r-unknown", tok, "")
	call(404, "GET", "/fleet/unknown-route", tok, "")
	call(403, "POST", "/fleet/callers", tok, `{"ownerId":"x","allowedHosts":"*","allowedProjects":"*"}`)

	// A run waits for an agent no host offers yet: while it waits, a
	// run's end wakes its host.
	if waiting := call(202, "POST", "/fleet/runs", tok, `{"agent":"later","queue":{"timeout":"1h"}}`); waiting["status"] != "queued" {
		t.Fatalf("a dispatch that waits: %v", waiting)
	}

	// sweep, on the scheduler's payload: the host's new events and the
	// run's end reach the mirror, which the api serves.
	host.AppendOutput(child, "hello from the host\n")
	zero := 0
	host.SetRun(child, hostproto.StatusSucceeded, &zero, "")
	var swept struct {
		Events  int `json:"events"`
		Drained int `json:"drained"`
	}
	sweepAnswer := fns["sweep"].Invoke(t, fixture(t, sweepFixture))
	must(t, json.Unmarshal(sweepAnswer, &swept))
	if swept.Events < 2 || swept.Drained != 1 {
		t.Fatalf("sweep answered %s", sweepAnswer)
	}
	status, _, raw := gw.invoke(fns["api"], "GET", "/fleet/runs/"+id+"/events?after=0&limit=100", tok, "")
	var page hostproto.EventPage
	if err := json.Unmarshal([]byte(raw), &page); status != 200 || err != nil ||
		!strings.Contains(raw, "hello from the host") || !strings.Contains(raw, `"status":"succeeded"`) {
		t.Fatalf("mirrored events: %d %s %v", status, raw, err)
	}
	sameAsHost(t, page.Events, host.Events(child))
	evs := page.Events

	// The sweep recorded the run's end while a run waits, and so woke its
	// host through the queue; the dispatcher, handed the wake as the
	// mapping hands it, finds no waiting run the host can take and
	// acknowledges it.
	recs := wakes.receive(t)
	if got := wakesOf(t, recs); len(got) != 1 || got[0].HostID != "edge-1" || got[0].Reason != "run_ended" {
		t.Fatalf("the wake queue after the run's end: %+v", got)
	}
	if resp := wakes.deliver(t, fns["dispatcher"], recs); len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the dispatcher failed %+v", resp.BatchItemFailures)
	}

	// stream, on a Function URL event: the streaming wire format.
	ev := fixture(t, functionURLFixture)
	var furl map[string]any
	must(t, json.Unmarshal(ev, &furl))
	path := "/fleet/runs/" + id + "/stream"
	furl["rawPath"] = path
	jsonObj(furl, "requestContext", "http")["path"] = path
	jsonObj(furl, "headers")["authorization"] = "Bearer " + tok
	prelude, body, err := lambdatest.StreamedResponse(fns["stream"].Invoke(t, furl))
	if err != nil {
		t.Fatal(err)
	}
	if prelude.StatusCode != 200 || prelude.Headers["content-type"] != "text/event-stream" {
		t.Fatalf("stream prelude %+v", prelude)
	}
	var kinds []string
	for m := range ssetest.Read(bytes.NewReader(body)) {
		kinds = append(kinds, m.Event)
		if m.Event == "done" && !strings.Contains(m.Data, `"status":"succeeded"`) {
			t.Fatalf("done %s", m.Data)
		}
	}
	if want := strings.Repeat("event ", len(evs)) + "snapshot done"; strings.Join(kinds, " ") != want {
		t.Fatalf("stream messages %v, want %s:\n%s", kinds, want, body)
	}

	// Lambda's deadline reaches the stream through the runtime: under a
	// 17 s timeout, the stream of a live run ends 15 s before it (about 2 s
	// in) with the planned end's retry hint, where Lambda would have cut it
	// off at 17 s without one. (shared/stream's tests pin the margin to the
	// millisecond on a fake clock; this bounds it on the real one.)
	const shortTimeout = 17 * time.Second
	fns["stream (17 s)"] = lambdatest.Start(t, functionBootstrap(t, "stream"), emulatorEnv(t, "stream", tables, secretsPrefix), shortTimeout)
	live := fmt.Sprint(call(201, "POST", "/fleet/runs", tok, `{"agent":"shell","prompt":"sleep 60"}`, "idempotency-key", "build-4712")["fleetRunId"])
	path = "/fleet/runs/" + live + "/stream"
	furl["rawPath"] = path
	jsonObj(furl, "requestContext", "http")["path"] = path
	invoked := time.Now()
	prelude, body, err = lambdatest.StreamedResponse(fns["stream (17 s)"].Invoke(t, furl))
	took := time.Since(invoked)
	if err != nil || prelude.StatusCode != 200 {
		t.Fatalf("the live run's stream: %+v, %v", prelude, err)
	}
	var last ssetest.Message
	for m := range ssetest.Read(bytes.NewReader(body)) {
		last = m
	}
	if last.Retry == "" || len(last.Comments) != 1 || !strings.Contains(last.Comments[0], "maximum duration") {
		t.Fatalf("the live run's stream under a %s timeout ended with %+v, want the retry hint:\n%s", shortTimeout, last, body)
	}
	if margin := shortTimeout - took; took < shortTimeout-stream.DefaultEndMargin || margin < 10*time.Second {
		t.Fatalf("the live run's stream ended %s into a %s invocation (%s before its deadline), want %s before it", took, shortTimeout, margin, stream.DefaultEndMargin)
	}
	t.Logf("under a %s timeout the stream ended %s in, %s before the deadline", shortTimeout, took.Round(time.Millisecond), (shortTimeout - took).Round(time.Millisecond))

	for name, fn := range fns {
		out := fn.Output()
		for _, secret := range []string{adminTok, tok, host.Token()} {
			if strings.Contains(out, secret) {
				t.Errorf("a token reached the %s function's log", name)
			}
		}
	}
	for _, name := range []string{"api", "probe", "sweep", "stream", "dispatcher"} {
		reps := fns[name].Reports()
		init, ok := fns[name].Init()
		if len(reps) == 0 || reps[0].InitDuration <= 0 || !ok || init <= 0 {
			t.Fatalf("%s: no REPORT line with an init duration, or no INIT REPORT line:\n%s", name, fns[name].Output())
		}
		st, err := os.Stat(functionBootstrap(t, name))
		must(t, err)
		t.Logf("%-10s init %5.1f ms (INIT REPORT; the REPORT line's Init Duration says %.2f ms), first invoke %5.1f ms, %2d invokes, bootstrap %s, %s",
			name, ms(init), ms(reps[0].InitDuration), ms(reps[0].Duration), len(reps), mib(st.Size()), hostArch())
	}
}

// TestMakeBuildBuildsEveryFunctionForArm64 runs `make build` into a
// directory of its own: every function a static, stripped linux/arm64
// bootstrap, and edge for this machine. It logs the sizes that ship.
func TestMakeBuildBuildsEveryFunctionForArm64(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("make", "-s", "build", "BUILD="+dir)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	check := func(path string, machine elf.Machine) int64 {
		t.Helper()
		f, err := elf.Open(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer f.Close()
		if f.Machine != machine || f.Type != elf.ET_EXEC {
			t.Fatalf("%s is %v %v, want a %v executable", path, f.Machine, f.Type, machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Fatalf("%s is dynamically linked", path)
			}
		}
		if f.Section(".symtab") != nil {
			t.Fatalf("%s is not stripped (-s -w)", path)
		}
		st, err := os.Stat(path)
		must(t, err)
		return st.Size()
	}
	for _, fn := range []string{"api", "probe", "sweep", "stream", "dispatcher"} {
		size := check(filepath.Join(dir, "functions", fn, "bootstrap"), elf.EM_AARCH64)
		t.Logf("%-6s bootstrap %s (linux/arm64, stripped, as make build ships it)", fn, mib(size))
	}
	native := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[hostArch()]
	t.Logf("edge %s (%s)", mib(check(filepath.Join(dir, "edge"), native)), hostArch())
}

// apiGateway makes the api function's events from the fixture, as API
// Gateway sends them for the explicit route a request matches.
type apiGateway struct {
	t    *testing.T
	base []byte
	n    int
}

func newAPIGateway(t *testing.T) *apiGateway {
	return &apiGateway{t: t, base: fixture(t, apiGatewayFixture)}
}

// event is the fixture made into one request: method, path and query,
// routeKey and pathParameters from the route table (API Gateway's "$default"
// when no route matches, as a catch-all would send), the bearer token, a
// base64 body as API Gateway passes JSON, and extra header pairs.
func (g *apiGateway) event(method, target, token, body string, headers ...string) map[string]any {
	g.t.Helper()
	var ev map[string]any
	must(g.t, json.Unmarshal(g.base, &ev))
	path, query, _ := strings.Cut(target, "?")
	routeKey, params := matchRoute(method, path)
	g.n++
	rc := jsonObj(ev, "requestContext")
	ev["routeKey"], rc["routeKey"] = routeKey, routeKey
	ev["rawPath"], ev["rawQueryString"] = path, query
	rc["requestId"] = fmt.Sprintf("C8xY2hRKoAMEbY%d=", g.n)
	now := time.Now().UTC()
	rc["time"], rc["timeEpoch"] = now.Format("02/Jan/2006:15:04:05 -0700"), now.UnixMilli()
	httpCtx := jsonObj(rc, "http")
	httpCtx["method"], httpCtx["path"] = method, path
	h := jsonObj(ev, "headers")
	delete(h, "idempotency-key")
	if token == "" {
		delete(h, "authorization")
	} else {
		h["authorization"] = "Bearer " + token
	}
	for i := 0; i+1 < len(headers); i += 2 {
		h[headers[i]] = headers[i+1]
	}
	if body == "" {
		delete(ev, "body")
		delete(h, "content-length")
		delete(h, "content-type")
		ev["isBase64Encoded"] = false
	} else {
		ev["body"] = base64.StdEncoding.EncodeToString([]byte(body))
		ev["isBase64Encoded"] = true
		h["content-length"] = strconv.Itoa(len(body))
	}
	if qs, err := url.ParseQuery(query); err == nil && len(qs) > 0 {
		m := map[string]any{}
		for k, v := range qs {
			m[k] = strings.Join(v, ",")
		}
		ev["queryStringParameters"] = m
	} else {
		delete(ev, "queryStringParameters")
	}
	if len(params) > 0 {
		ev["pathParameters"] = params
	} else {
		delete(ev, "pathParameters")
	}
	return ev
}

// invoke sends one request through the api function and decodes its answer.
func (g *apiGateway) invoke(fn *lambdatest.Function, method, target, token, body string, headers ...string) (int, map[string]any, string) {
	g.t.Helper()
	return apiAnswer(g.t, method+" "+target, fn.Invoke(g.t, g.event(method, target, token, body, headers...)))
}

// apiAnswer decodes the api function's answer to one request (what names
// it in failures): an API Gateway v2 response with a JSON body.
func apiAnswer(t testing.TB, what string, answer []byte) (int, map[string]any, string) {
	t.Helper()
	var resp events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(answer, &resp); err != nil || resp.StatusCode == 0 {
		t.Fatalf("%s: the api answered %s (%v), not an API Gateway response", what, answer, err)
	}
	raw := resp.Body
	if resp.IsBase64Encoded {
		b, err := base64.StdEncoding.DecodeString(raw)
		must(t, err)
		raw = string(b)
	}
	if ct := resp.Headers["content-type"]; !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s answered content-type %q", what, ct)
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		t.Fatalf("%s answered %q: %v", what, raw, err)
	}
	return resp.StatusCode, out, raw
}

// matchRoute finds path's route in the api's table: its routeKey as API
// Gateway sets it ("GET /fleet/runs/{id}") and the path parameters.
func matchRoute(method, path string) (string, map[string]string) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for _, r := range api.Routes() {
		pat := strings.Split(strings.Trim(r.Pattern, "/"), "/")
		if r.Method != method || len(pat) != len(segs) {
			continue
		}
		params := map[string]string{}
		ok := true
		for i, p := range pat {
			if strings.HasPrefix(p, "{") {
				params[strings.Trim(p, "{}")] = segs[i]
			} else if p != segs[i] {
				ok = false
				break
			}
		}
		if ok {
			return r.Method + " " + r.Pattern, params
		}
	}
	return "$default", nil
}

func fixture(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	if !json.Valid(b) {
		t.Fatalf("%s is not JSON", path)
	}
	return b
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func mib(n int64) string { return fmt.Sprintf("%.1f MiB (%d bytes)", float64(n)/(1<<20), n) }

func hostArch() string {
	out, err := exec.Command("go", "env", "GOARCH").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
