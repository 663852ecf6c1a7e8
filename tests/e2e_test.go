package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/host"
	"github.com/runfleet/runfleet/infra/localstack/demo"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// The end-to-end tests put together what `make dev` runs: Fleet as
// deployed (fleetapp on DynamoDB, the api behind the API Gateway v2
// adapter, the stream handler, the sweep handler) and a real edge host
// (edge/host in this process) with the demo upstream, the demo secret and
// its policy (infra/localstack/demo). Tasks run as nobody: root only.

const (
	e2eHostRef   = "e2e-edge"
	e2eHostToken = "e2e-host-token-7c1d9a4e2b6f08d3"
	// markerDir is where a task writes its marker first thing: its absence
	// shows that no process started.
)

// e2eEdge is one edge host and its demo surroundings, in the test's
// directory: the data dir private to edge, the tasks' work dir and the
// marker dir reachable by nobody.
type e2eEdge struct {
	t        *testing.T
	dir      string
	markers  string
	spec     demo.Edge
	cfgPath  string
	secret   string
	upstream *demo.Upstream
	upLogs   *syncbuf.Buffer
	logs     *syncbuf.Buffer // every edge log line, across restarts
	host     *host.Host
	client   *hostproto.Client
}

func newE2EEdge(t *testing.T) *e2eEdge {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("edge runs tasks as nobody: these tests must run as root (as in CI)")
	}
	dir := t.TempDir()
	for p := dir; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		must(t, os.Chmod(p, 0o755))
	}
	etc := filepath.Join(dir, "etc")
	must(t, os.Mkdir(etc, 0o700))
	// Tasks get a /tmp of their own, so a marker must lie outside it to
	// be seen from here.
	markers, err := os.MkdirTemp("/var/lib", "runfleet-e2e-markers-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(markers) })
	must(t, os.Chmod(markers, 0o777))
	secret, err := demo.NewSecret(nil)
	must(t, err)
	e := &e2eEdge{t: t, dir: dir, markers: markers, secret: secret, upLogs: &syncbuf.Buffer{}, logs: &syncbuf.Buffer{}, cfgPath: filepath.Join(etc, "edge.json")}
	e.upstream, err = demo.StartUpstream(demo.UpstreamConfig{Secret: secret, Logger: slog.New(slog.NewJSONHandler(e.upLogs, nil))})
	must(t, err)
	t.Cleanup(func() { e.upstream.Close(context.Background()) })
	e.spec = demo.Edge{
		DataDir: filepath.Join(dir, "edge-data"), WorkDir: filepath.Join(dir, "work"),
		TokenFile: filepath.Join(etc, "host-token"), SecretsFile: filepath.Join(etc, "secrets.json"),
		UpstreamCAFile: filepath.Join(etc, "upstream-ca.pem"), APIListen: freeAddr(), Upstream: e.upstream,
	}
	must(t, os.WriteFile(e.spec.TokenFile, []byte(e2eHostToken+"\n"), 0o600))
	must(t, demo.WriteSecretsFile(e.spec.SecretsFile, secret))
	e.client, err = hostproto.NewClient(hostproto.ClientConfig{BaseURL: e.baseURL(), Token: e2eHostToken})
	must(t, err)
	t.Cleanup(e.shutdown)
	return e
}

func (e *e2eEdge) baseURL() string { return "http://" + e.spec.APIListen }

// open writes edge.json (the demo's, the demo key granted or, with grant
// false, another key in its place) and opens the host.
func (e *e2eEdge) open(grant, killSwitch bool) {
	e.t.Helper()
	e.openWith(killSwitch, func(cfg *config.Config) {
		if !grant {
			keys := cfg.Policy.Projects[demo.Project].Keys
			keys["OTHER_KEY"] = keys[demo.Key]
			delete(keys, demo.Key)
		}
	})
}

// openWith writes edge.json, the demo's as change leaves it, and opens the
// host.
func (e *e2eEdge) openWith(killSwitch bool, change func(*config.Config)) {
	e.t.Helper()
	cfg := e.spec.Config()
	change(cfg)
	must(e.t, e.spec.Write(e.cfgPath, cfg))
	loaded, err := config.Load(e.cfgPath)
	must(e.t, err)
	e.host, err = host.Open(context.Background(), host.Options{Config: loaded, KillSwitch: killSwitch,
		Logger: slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	must(e.t, err)
	e.host.Start(nil)
}

func (e *e2eEdge) shutdown() {
	if e.host == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.host.Shutdown(ctx); err != nil {
		e.t.Errorf("edge shutdown: %v", err)
	}
	e.host = nil
}

// marker is the path a task named name writes first; the prompt does it.
func (e *e2eEdge) marker(name string) string { return filepath.Join(e.markers, name) }

// events reads a run's events from edge itself.
func (e *e2eEdge) events(runID string) []hostproto.Event {
	e.t.Helper()
	var all []hostproto.Event
	after := int64(0)
	for {
		p, err := e.client.Events(context.Background(), runID, after, 1000)
		must(e.t, err)
		all = append(all, p.Events...)
		after = *p.NextCursor
		if !p.HasMore {
			return all
		}
	}
}

// starts counts the starts edge's host API received (its request log).
func (e *e2eEdge) starts() int {
	return strings.Count(e.logs.String(), `"route":"POST /runs"`)
}

// e2eFleet is the stack with the edge registered, and every answer Fleet
// gave kept to search for the real value.
type e2eFleet struct {
	*stack
	logs      *syncbuf.Buffer
	responses []string
}

func newE2EFleet(t *testing.T) *e2eFleet { return newE2EFleetOn(t, "dynamodb") }

// newE2EFleetOn is newE2EFleet on the store kind given.
func newE2EFleetOn(t *testing.T, kind string) *e2eFleet {
	logs := &syncbuf.Buffer{}
	s := newStack(t, kind, stackOptions{realClock: true, log: logs, hostCredentials: map[string]string{e2eHostRef: e2eHostToken}})
	return &e2eFleet{stack: s, logs: logs}
}

func (f *e2eFleet) call(t *testing.T, want int, method, path, token, body string) answer {
	t.Helper()
	a := f.must(t, want, method, path, token, body)
	f.responses = append(f.responses, a.raw)
	return a
}

// register is the admin registering and probing the edge host.
func (f *e2eFleet) register(t *testing.T, e *e2eEdge) {
	t.Helper()
	f.call(t, http.StatusCreated, "POST", "/fleet/hosts", adminToken,
		fmt.Sprintf(`{"id":"edge-1","baseUrl":%q,"credentialRef":%q}`, e.baseURL(), e2eHostRef))
	f.probe(t, true)
}

// probe is the admin probing edge-1; it reports the secrets proxy as wanted.
func (f *e2eFleet) probe(t *testing.T, secretsProxy bool) {
	t.Helper()
	p := jsonObj(f.call(t, http.StatusOK, "POST", "/fleet/hosts/edge-1/probe", adminToken, "").body, "probe")
	if p["status"] != "ok" || jsonObj(p, "features")["secretsProxy"] != secretsProxy || jsonObj(p, "features")["execRequire"] != true {
		t.Fatalf("probe of edge: %v", p)
	}
}

// sweep runs the sweep handler once, as its schedule would.
func (f *e2eFleet) sweep(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()
	if _, err := f.app.Jobs.Sweep(ctx, events.EventBridgeEvent{Source: "aws.scheduler", DetailType: "Scheduled Event", Detail: json.RawMessage(`"{}"`)}); err != nil {
		t.Fatalf("sweep: %v", err)
	}
}

// run reads the caller's view of a run.
func (f *e2eFleet) run(t *testing.T, token, id string) map[string]any {
	t.Helper()
	return jsonObj(f.call(t, http.StatusOK, "GET", "/fleet/runs/"+id, token, "").body, "run")
}

// TestEndToEndASecretReachesTheUpstreamAndNothingElse: the admin registers
// the edge host and mints a caller; the caller dispatches, through the api,
// a run whose task calls the demo upstream with curl and its placeholder;
// the upstream receives the real value; the run succeeds; its events reach
// the mirror by sweeps and the SSE stream; the proxy's audit log records the
// substitution; and the real value is in no event, log, answer or the
// task's process environment.
func TestEndToEndASecretReachesTheUpstreamAndNothingElse(t *testing.T) {
	e := newE2EEdge(t)
	e.open(true, false)
	f := newE2EFleet(t)
	f.register(t, e)
	caller := f.call(t, http.StatusCreated, "POST", "/fleet/callers", adminToken,
		`{"ownerId":"alice","allowedHosts":["edge-1"],"allowedProjects":["demo"]}`).str("token")

	// The task calls the upstream, then waits for input: its environment is
	// read while it runs.
	tag := fmt.Sprintf("e2e-task-%d", time.Now().UnixNano())
	prompt := fmt.Sprintf(`echo %s
curl -sS --fail-with-body -H "Authorization: Bearer $%s" %s; echo
echo waiting for input
read line
echo "got $line"`, tag, demo.Key, e.upstream.URL())
	d := f.call(t, http.StatusCreated, "POST", "/fleet/runs", caller, demo.DispatchBody(e.upstream, demo.ShellAgent, prompt))
	id, child := d.str("fleetRunId"), d.str("childRunId")
	if d.str("hostId") != "edge-1" || child == "" {
		t.Fatalf("dispatch: %s", d.raw)
	}

	pid := taskProcess(t, tag)
	deadline := time.Now().Add(30 * time.Second)
	for e.upstream.Authorized()+e.upstream.Refused() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the task never called the upstream; edge log:\n%s", e.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	must(t, err)
	env := map[string]string{}
	for _, kv := range strings.Split(string(environ), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	placeholder := env[demo.Key]
	if !strings.HasPrefix(placeholder, demo.PlaceholderPrefix) || len(placeholder) != demo.PlaceholderLength || env["HTTPS_PROXY"] == "" {
		t.Fatalf("the task's env has %s=%q, HTTPS_PROXY=%q", demo.Key, placeholder, env["HTTPS_PROXY"])
	}
	if strings.Contains(string(environ), e.secret) {
		t.Fatal("the real value is in the task's process environment")
	}
	if a := f.call(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/input", caller, `{"input":"go\n"}`); a.body["accepted"] != true {
		t.Fatalf("input: %s", a.raw)
	}

	// The upstream got the real value, exactly once, and nothing else.
	if e.upstream.Authorized() != 1 || e.upstream.Refused() != 0 {
		t.Fatalf("the upstream saw %d requests with the real value, %d without", e.upstream.Authorized(), e.upstream.Refused())
	}

	// Sweeps bring the run's events into the mirror until it is drained.
	var mirror hostproto.EventPage
	deadline = time.Now().Add(30 * time.Second)
	for {
		f.sweep(t)
		a := f.call(t, http.StatusOK, "GET", "/fleet/runs/"+id+"/events?after=0&limit=1000", caller, "")
		must(t, json.Unmarshal([]byte(a.raw), &mirror))
		if n := len(mirror.Events); n > 0 && mirror.Events[n-1].Type == hostproto.EventState && strings.Contains(string(mirror.Events[n-1].Data), `"succeeded"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mirror never reached the run's end: %s", a.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	sameAsHost(t, mirror.Events, e.events(child))
	out := outputOf(mirror.Events)
	if !strings.Contains(out, `{"authorized": true}`) || !strings.Contains(out, "got go") {
		t.Fatalf("the task's output: %q", out)
	}
	if !strings.Contains(string(mirror.Events[0].Data), `"admitted":true`) || !strings.Contains(string(mirror.Events[0].Data), demo.SecretsRef) {
		t.Fatalf("the first event is not the admission with the key: %s", mirror.Events[0].Data)
	}
	if r := f.run(t, caller, id); r["status"] != "succeeded" {
		t.Fatalf("the run: %v", r)
	}

	// The SSE stream serves the same events, then done.
	req, _ := http.NewRequest("GET", f.srv.URL+"/fleet/runs/"+id+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+caller)
	resp, err := f.srv.Client().Do(req)
	must(t, err)
	sse := &bytes.Buffer{}
	var streamed []hostproto.Event
	var done string
	for m := range ssetest.Read(io.TeeReader(resp.Body, sse)) {
		switch m.Event {
		case "event":
			var ev hostproto.Event
			must(t, json.Unmarshal([]byte(m.Data), &ev))
			if m.ID != strconv.FormatInt(ev.Sequence, 10) {
				t.Fatalf("event id %s for sequence %d", m.ID, ev.Sequence)
			}
			streamed = append(streamed, ev)
		case "done":
			done = m.Data
		}
	}
	resp.Body.Close()
	if !strings.Contains(done, `"status":"succeeded"`) {
		t.Fatalf("the stream ended without done succeeded:\n%s", sse)
	}
	sameAsHost(t, streamed, mirror.Events)

	// The audit log records the substitution: the task, the key, where.
	auditPath := filepath.Join(e.spec.DataDir, "logs", audit.FileName)
	var entry map[string]any
	deadline = time.Now().Add(10 * time.Second)
	for entry == nil {
		b, _ := os.ReadFile(auditPath)
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["action"] == "substituted" {
				entry = m
			}
		}
		if entry == nil && time.Now().After(deadline) {
			t.Fatalf("no substitution in the audit log:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if entry["task"] != child || fmt.Sprint(entry["keys"]) != "["+demo.SecretsRef+"]" || entry["host"] != e.upstream.Domain() ||
		entry["status"] != float64(200) || entry["path"] != demo.UpstreamPath {
		t.Fatalf("audit entry %v", entry)
	}

	// The real value is nowhere but where it must be; the placeholder and
	// the tokens reach no log.
	auditLog, _ := os.ReadFile(auditPath)
	mirrorJSON, _ := json.Marshal(mirror)
	places := map[string]string{
		"Fleet's answers": strings.Join(f.responses, "\n"), "the mirror": string(mirrorJSON), "the stream": sse.String(),
		"Fleet's log": f.logs.String(), "edge's log": e.logs.String(), "the upstream's log": e.upLogs.String(),
		"the audit log": string(auditLog), "the task's env": string(environ),
	}
	for where, text := range places {
		if strings.Contains(text, e.secret) {
			t.Errorf("the real value is in %s", where)
		}
	}
	for _, where := range []string{"Fleet's log", "edge's log", "the upstream's log", "the audit log"} {
		for what, s := range map[string]string{"the placeholder": placeholder, "the caller's token": caller, "the host token": e2eHostToken, "the admin token": adminToken} {
			if strings.Contains(places[where], s) {
				t.Errorf("%s is in %s", what, where)
			}
		}
	}
	if !strings.Contains(f.logs.String(), `"msg":"request"`) || !strings.Contains(e.logs.String(), `"msg":"host api"`) {
		t.Fatal("the logs searched are empty: Fleet's and edge's logs were not captured")
	}
}

// TestEndToEndSecretsRefusals: a real edge refuses runs at admission and
// the caller reads why where it looks, on both stores: the dispatch answer
// is 409 with the reason as its code, a detail naming what to change, and
// the run's links; the run itself (GET, the list, the stream's done) carries
// the same reason and detail. The refusals: the key not granted by the host
// policy; a domain the key may not reach (named with its port, beside the
// policy's own); the host's concurrency limit; the kill switch with Fleet's
// last probe from before it (broker_not_ready); once re-probed, routing's
// secrets_unsupported. No process starts in any case.
func TestEndToEndSecretsRefusals(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { secretsRefusals(t, kind) })
	}
}

func secretsRefusals(t *testing.T, kind string) {
	e := newE2EEdge(t)
	e.openWith(false, func(cfg *config.Config) {
		keys := cfg.Policy.Projects[demo.Project].Keys
		keys["OTHER_KEY"] = keys[demo.Key] // the demo key is not in the policy
		delete(keys, demo.Key)
		cfg.Runner.MaxConcurrent = 1
	})
	f := newE2EFleetOn(t, kind)
	f.register(t, e)
	caller := f.call(t, http.StatusCreated, "POST", "/fleet/callers", adminToken,
		`{"ownerId":"alice","allowedHosts":["edge-1"],"allowedProjects":["demo"]}`).str("token")
	dispatchTo := func(name string, domains []string) answer {
		prompt := fmt.Sprintf(`touch %s
curl -sS -H "Authorization: Bearer $%s" %s`, e.marker(name), demo.Key, e.upstream.URL())
		body, _ := json.Marshal(map[string]any{"agent": demo.ShellAgent, "prompt": prompt,
			"secrets": []demo.Secret{{ProjectID: demo.Project, Key: demo.Key, Domains: domains}}})
		return f.do(t, "POST", "/fleet/runs", caller, string(body))
	}
	dispatch := func(name string) answer { return dispatchTo(name, []string{e.upstream.Domain()}) }
	// refused checks that the dispatch answered 409 with the refusal, that
	// the run reads the same in GET, the list and the stream, and that
	// nothing ran: no marker, no running state, an admission refusal.
	refused := func(a answer, name, reason, detail string) {
		t.Helper()
		id := a.str("fleetRunId")
		links, _ := a.body["links"].(map[string]any)
		if a.status != http.StatusConflict || a.str("code") != reason || a.str("reason") != reason || a.str("status") != "failed" ||
			a.str("hostId") != "edge-1" || !strings.Contains(a.str("detail"), detail) || !strings.Contains(a.errorText(), detail) ||
			links["self"] != f.srv.URL+"/fleet/runs/"+id || links["stream"] != f.srv.URL+"/fleet/runs/"+id+"/stream" {
			t.Fatalf("dispatch %s: %d %s, want 409 %s naming %q with the run's links", name, a.status, a.raw, reason, detail)
		}
		r := f.run(t, caller, id)
		if r["status"] != "failed" || r["reason"] != reason || r["detail"] != a.str("detail") {
			t.Fatalf("run %s: %v, want failed %s with the answer's detail", name, r, reason)
		}
		listed := false
		for _, x := range f.call(t, http.StatusOK, "GET", "/fleet/runs", caller, "").body["runs"].([]any) {
			if x := x.(map[string]any); x["fleetRunId"] == id {
				listed = x["reason"] == reason && x["detail"] == a.str("detail")
			}
		}
		if !listed {
			t.Fatalf("the list does not show run %s with its reason and detail", name)
		}
		sse := f.do(t, "GET", "/fleet/runs/"+id+"/stream", caller, "")
		if !strings.Contains(sse.raw, "event: done") || !strings.Contains(sse.raw, `"reason":"`+reason+`"`) || !strings.Contains(sse.raw, `"detail":`) {
			t.Fatalf("the stream of run %s: %s", name, sse.raw)
		}
		evs := e.events(a.str("childRunId"))
		raw, _ := json.Marshal(evs)
		if len(evs) == 0 || evs[0].Type != hostproto.EventAdmission || !strings.Contains(string(evs[0].Data), `"admitted":false`) ||
			!strings.Contains(string(evs[0].Data), reason) || strings.Contains(string(raw), `"running"`) || outputOf(evs) != "" {
			t.Fatalf("run %s's events on edge: %s", name, raw)
		}
		if _, err := os.Stat(e.marker(name)); !os.IsNotExist(err) {
			t.Fatalf("run %s's task started (its marker: %v)", name, err)
		}
	}

	refused(dispatch("not-granted"), "not-granted", hostproto.ReasonKeyNotGranted,
		"the host policy does not grant demo/DEMO_API_KEY: this host's policy does not proxy this key")

	// The key granted, but declared for its name alone: port 443, which
	// the policy does not give it.
	e.shutdown()
	e.openWith(false, func(cfg *config.Config) { cfg.Runner.MaxConcurrent = 1 })
	refused(dispatchTo("wrong-port", []string{demo.UpstreamName}), "wrong-port", hostproto.ReasonKeyNotGranted,
		fmt.Sprintf("it may not reach %s (port 443); this host's policy lets it reach only %s: declare those domains", demo.UpstreamName, e.upstream.Domain()))

	// The one slot taken by a run that waits: the next is host_busy.
	slot := f.call(t, http.StatusCreated, "POST", "/fleet/runs", caller, fmt.Sprintf(`{"agent":"shell","prompt":"touch %s; sleep 600"}`, e.marker("slot")))
	refused(dispatch("busy"), "busy", hostproto.ReasonHostBusy, "the host already runs 1 task, its runner.maxConcurrent")
	f.call(t, http.StatusOK, "POST", "/fleet/runs/"+slot.str("fleetRunId")+"/cancel", caller, "")

	// The kill switch: edge restarts with its secrets proxy down; Fleet's
	// last probe is from before.
	e.shutdown()
	e.open(true, true)
	refused(dispatch("stale-probe"), "stale-probe", hostproto.ReasonBrokerNotReady, "secrets proxy")

	// Re-probed, edge reports no secrets proxy: routing excludes it and
	// nothing reaches edge.
	f.probe(t, false)
	before := e.starts()
	a := dispatch("re-probed")
	if a.status != http.StatusConflict || !reflect.DeepEqual(excludedReasons(t, a), map[string][]string{"edge-1": {"secrets_unsupported"}}) ||
		!strings.Contains(a.errorText(), "edge-1 (secrets_unsupported)") {
		t.Fatalf("dispatch with the kill switch on, re-probed: %d %s", a.status, a.raw)
	}
	if e.starts() != before {
		t.Fatal("a start reached edge although routing refused the run")
	}
	if _, err := os.Stat(e.marker("re-probed")); !os.IsNotExist(err) {
		t.Fatalf("the refused run's task started (its marker: %v)", err)
	}
	// A run without secrets still goes there and runs.
	plain := f.call(t, http.StatusCreated, "POST", "/fleet/runs", caller, fmt.Sprintf(`{"agent":"shell","prompt":"touch %s"}`, e.marker("plain")))
	deadline := time.Now().Add(30 * time.Second)
	for f.run(t, caller, plain.str("fleetRunId"))["status"] != "succeeded" {
		if time.Now().After(deadline) {
			t.Fatal("the run without secrets did not succeed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(e.marker("plain")); err != nil {
		t.Fatalf("the run without secrets left no marker, so the markers prove nothing: %v", err)
	}
}

// taskProcess finds the process whose command line holds tag (a task's
// sh -c with its prompt), waiting for it to start.
func taskProcess(t *testing.T, tag string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		entries, _ := os.ReadDir("/proc")
		for _, ent := range entries {
			pid, err := strconv.Atoi(ent.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			cmdline, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
			if err == nil && bytes.HasPrefix(cmdline, []byte("sh\x00-c\x00")) && bytes.Contains(cmdline, []byte(tag)) {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no task process with %q", tag)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// outputOf joins a run's output events.
func outputOf(evs []hostproto.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		var s string
		if ev.Type == hostproto.EventOutput && json.Unmarshal(ev.Data, &s) == nil {
			b.WriteString(s)
		}
	}
	return b.String()
}
