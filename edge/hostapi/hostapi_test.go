package hostapi

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runfleet/runfleet/edge/ledger"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/runner"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

const token = "host-credential-for-tests"

type edge struct {
	t      *testing.T
	dbPath string
	work   string
	proxy  error
	disk   runner.Disk // nil: the real one
	runs   *runlog.Log
	runner *runner.Runner
	ledger *ledger.Ledger
	key    ed25519.PrivateKey // the ledger's, kept across restarts
	srv    *httptest.Server
	client *hostproto.Client
}

func newEdge(t *testing.T) *edge {
	t.Helper()
	edgetest.RequireRoot(t)
	e := &edge{t: t, dbPath: filepath.Join(t.TempDir(), "runs.db"), work: filepath.Join(edgetest.TraversableDir(t), "work")}
	e.up()
	return e
}

// up starts edge (again): the run log, the runner, and the API over real TLS.
func (e *edge) up() {
	e.t.Helper()
	runs, err := runlog.Open(e.dbPath, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := runner.New(runner.Config{
		Agents:  map[string]runner.Agent{"shell": {Argv: []string{"sh", "-c", "{prompt}"}}},
		WorkDir: e.work,
		Disk:    e.disk,
	}, runs, nil, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.key == nil {
		_, e.key, _ = ed25519.GenerateKey(nil)
	}
	lg, err := ledger.New(ledger.Config{Store: runs, Key: e.key})
	if err != nil {
		e.t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.Collectors()...)
	api, err := New(Config{
		Runner:       r,
		Ledger:       lg,
		Token:        token,
		SecretsProxy: func() error { return e.proxy },
		CA: func() *hostproto.CAInfo {
			return &hostproto.CAInfo{NotAfter: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)}
		},
		Gatherer: reg,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(api)
	srv.StartTLS()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	client, err := hostproto.NewClient(hostproto.ClientConfig{BaseURL: srv.URL, Token: token, CAPEM: string(caPEM)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.runs, e.runner, e.ledger, e.srv, e.client = runs, r, lg, srv, client
	e.t.Cleanup(e.down)
}

func (e *edge) down() {
	if e.srv == nil {
		return
	}
	e.srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.runner.Shutdown(ctx, 0)
	e.ledger.Close()
	e.runs.Close()
	e.srv = nil
}

var ctx = context.Background()

func (e *edge) start(prompt string) hostproto.Run {
	e.t.Helper()
	run, err := e.client.Start(ctx, hostproto.StartRequest{ClientToken: fmt.Sprintf("t-%d", time.Now().UnixNano()), Request: runspec.Request{Agent: "shell", Prompt: prompt}})
	if err != nil {
		e.t.Fatal(err)
	}
	return run
}

// waitStatus polls the API (a real process is being waited for) until the
// run's status satisfies done.
func (e *edge) waitStatus(runID string, done func(hostproto.Run) bool) hostproto.Run {
	e.t.Helper()
	var run hostproto.Run
	if !await.Within(20*time.Second, func() bool {
		var err error
		if run, err = e.client.Get(ctx, runID); err != nil {
			e.t.Fatal(err)
		}
		return done(run)
	}) {
		e.t.Fatalf("run %s stuck at %+v", runID, run)
	}
	return run
}

func ended(run hostproto.Run) bool { return hostproto.TerminalStatus(run.Status) }

func (e *edge) allEvents(runID string, pageSize int) []hostproto.Event {
	e.t.Helper()
	var all []hostproto.Event
	after := int64(0)
	for {
		page, err := e.client.Events(ctx, runID, after, pageSize)
		if err != nil {
			e.t.Fatal(err)
		}
		all = append(all, page.Events...)
		after = *page.NextCursor
		if !page.HasMore {
			return all
		}
	}
}

func TestEveryRouteRequiresTheBearerToken(t *testing.T) {
	e := newEdge(t)
	routes := []struct{ method, path string }{
		{"GET", "/healthz"}, {"POST", "/runs"}, {"GET", "/runs?clientToken=x"}, {"GET", "/runs/x"},
		{"GET", "/runs/x/events"}, {"GET", "/runs/x/egress"}, {"POST", "/runs/x/input"}, {"POST", "/runs/x/cancel"}, {"POST", "/runs/x/retry"},
		{"PUT", "/runs/x/credentials"}, {"POST", "/host/drain"}, {"POST", "/host/resume"}, {"GET", "/metrics"}, {"GET", "/nowhere"},
	}
	for _, rt := range routes {
		for _, auth := range []string{"", "Bearer wrong", "Bearer " + token + "x", token} {
			req, _ := http.NewRequest(rt.method, e.srv.URL+rt.path, strings.NewReader("{}"))
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body hostproto.ErrorBody
			json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || body.Code != hostproto.CodeUnauthorized {
				t.Errorf("%s %s with %q answered %d %+v, want 401 unauthorized", rt.method, rt.path, auth, resp.StatusCode, body)
			}
		}
	}
	if !e.runner.Idle() || e.runner.Draining() {
		t.Fatal("an unauthenticated request had an effect")
	}
}

func TestHealthReportsFeaturesAsTheyAre(t *testing.T) {
	e := newEdge(t)
	h, err := e.client.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !h.OK || h.Draining || !h.Features.SecretsProxy || !h.Features.ExecRequire || fmt.Sprint(h.Agents) != "[shell]" || h.CA == nil || h.InsecureSameUser || !h.EgressConfined {
		t.Fatalf("health %+v", h)
	}
	e.proxy = errors.New("killed")
	if h, _ = e.client.Health(ctx); h.Features.SecretsProxy {
		t.Fatalf("health with the proxy down still reports secretsProxy: %+v", h)
	}
	if _, err := e.client.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if h, _ = e.client.Health(ctx); !h.Draining || h.Idle == nil || !*h.Idle {
		t.Fatalf("health after a drain with nothing running: %+v, want draining and idle", h)
	}
}

// freeSpace is a Disk whose free space the test sets.
type freeSpace struct{ free atomic.Int64 }

func (d *freeSpace) FreeBytes() (int64, error) { return d.free.Load(), nil }

func TestHealthReportsStorageAndStartsAreRefusedUnderTheReserve(t *testing.T) {
	edgetest.RequireRoot(t)
	disk := &freeSpace{}
	disk.free.Store(5 << 30)
	e := &edge{t: t, dbPath: filepath.Join(t.TempDir(), "runs.db"), work: filepath.Join(edgetest.TraversableDir(t), "work"), disk: disk}
	e.up()
	h, err := e.client.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.Storage == nil || h.Storage.Low || h.Storage.FreeBytes != 5<<30 || h.Storage.MinFreeBytes != runner.DefaultMinFreeBytes {
		t.Fatalf("health storage %+v, want 5 GiB free of a 1 GiB reserve, not low", h.Storage)
	}

	disk.free.Store(100 << 20)
	if h, _ = e.client.Health(ctx); h.Storage == nil || !h.Storage.Low || h.Storage.FreeBytes != 100<<20 {
		t.Fatalf("health storage %+v, want low at 100 MiB free", h.Storage)
	}
	run := e.start(`echo never`)
	if run.Status != hostproto.StatusFailed || run.Reason != hostproto.ReasonHostStorageLow || !strings.Contains(run.Detail, "100.0 MiB free, under its reserve of 1.0 GiB") {
		t.Fatalf("a start under the reserve answered %+v, want failed host_storage_low naming both sizes", run)
	}
	if _, err := e.client.Retry(ctx, run.RunID); err != nil {
		t.Fatal(err)
	}
	if again := e.waitStatus(run.RunID, ended); again.Reason != hostproto.ReasonHostStorageLow || again.Attempt != 2 {
		t.Fatalf("a retry under the reserve ended %+v, want host_storage_low", again)
	}

	disk.free.Store(2 << 30)
	if h, _ = e.client.Health(ctx); h.Storage.Low {
		t.Fatalf("health storage %+v once space returned, want not low", h.Storage)
	}
	run = e.start(`echo admitted`)
	if end := e.waitStatus(run.RunID, ended); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("a start once space returned ended %+v", end)
	}
}

func TestRunLifecycleThroughTheClient(t *testing.T) {
	e := newEdge(t)
	run := e.start(`read line; echo "said:$line"`)
	if run.Status != hostproto.StatusAdmitted || run.Attempt != 1 {
		t.Fatalf("start answered %+v", run)
	}
	e.waitStatus(run.RunID, func(r hostproto.Run) bool { return r.Status == hostproto.StatusRunning })
	answer, err := e.client.Input(ctx, run.RunID, json.RawMessage(`"hello"`))
	if err != nil {
		t.Fatal(err)
	}
	var echoed hostproto.Run
	if json.Unmarshal(answer, &echoed); echoed.RunID != run.RunID {
		t.Fatalf("input answered %s", answer)
	}
	end := e.waitStatus(run.RunID, ended)
	if end.Status != hostproto.StatusSucceeded || *end.ExitCode != 0 {
		t.Fatalf("run ended %+v", end)
	}
	if out := edgetest.Output(e.allEvents(run.RunID, 0)); !strings.Contains(out, "said:hello") {
		t.Fatalf("output %q", out)
	}
	if _, err := e.client.Cancel(ctx, run.RunID); !hasCode(err, http.StatusConflict, hostproto.CodeNotRunning) {
		t.Fatalf("cancel of an ended run = %v", err)
	}
	if _, err := e.client.Input(ctx, run.RunID, json.RawMessage(`1`)); !hasCode(err, http.StatusConflict, hostproto.CodeNotRunning) {
		t.Fatalf("input to an ended run = %v", err)
	}
	again, err := e.client.Retry(ctx, run.RunID)
	if err != nil || again.Attempt != 2 {
		t.Fatalf("retry = %+v, %v", again, err)
	}
	if _, err := e.client.Retry(ctx, run.RunID); !hasCode(err, http.StatusConflict, hostproto.CodeNotRetryable) {
		t.Fatalf("retry of a live attempt = %v", err)
	}
	e.client.Cancel(ctx, run.RunID)
	end = e.waitStatus(run.RunID, ended)
	if end.Attempt != 2 || end.Status != hostproto.StatusCanceled {
		t.Fatalf("canceled retry ended %+v", end)
	}
	if _, err := e.client.Get(ctx, "run-nope"); !errors.Is(err, hostproto.ErrRunNotFound) {
		t.Fatalf("get of an unknown run = %v", err)
	}
	found, ok, err := e.client.FindByClientToken(ctx, run.ClientToken)
	if err != nil || !ok || found.RunID != run.RunID {
		t.Fatalf("find by client token = %+v %v %v", found, ok, err)
	}
	if _, ok, err := e.client.FindByClientToken(ctx, "unknown"); err != nil || ok {
		t.Fatalf("find of an unknown token = %v %v", ok, err)
	}
}

func TestConcurrentStartsWithOneClientTokenStartOneProcess(t *testing.T) {
	e := newEdge(t)
	// Outside /tmp, which a task has its own of.
	dir := edgetest.HostDir(t)
	os.Chmod(dir, 0o777)
	marker := filepath.Join(dir, "starts")
	req := hostproto.StartRequest{ClientToken: "one-token", Request: runspec.Request{Agent: "shell", Prompt: "echo started >> " + marker}}
	var wg sync.WaitGroup
	answers := make([]hostproto.Run, 20)
	errs := make([]error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = e.client.Start(ctx, req)
		}()
	}
	await.Group(t, "the concurrent requests", &wg)
	fresh := 0
	for i, a := range answers {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if a.RunID != answers[0].RunID {
			t.Fatalf("starts with one client token answered runs %s and %s", answers[0].RunID, a.RunID)
		}
		if !a.Reused {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("%d answers were 201 (new), want exactly 1", fresh)
	}
	e.waitStatus(answers[0].RunID, ended)
	b, _ := os.ReadFile(marker)
	if got := strings.Count(string(b), "started"); got != 1 {
		t.Fatalf("the task's process ran %d times", got)
	}
	metrics, _ := e.client.Metrics(ctx)
	if !strings.Contains(string(metrics), "edge_task_processes_started_total 1\n") {
		t.Fatalf("metrics do not show one process started:\n%s", metrics)
	}
}

func TestStartAfterItsDeadlineIsRefused(t *testing.T) {
	e := newEdge(t)
	past := time.Now().Add(-time.Minute)
	_, err := e.client.Start(ctx, hostproto.StartRequest{ClientToken: "late", Request: runspec.Request{Agent: "shell", Prompt: "true", Deadline: &past}})
	if !hasCode(err, http.StatusConflict, hostproto.CodeDeadlinePassed) {
		t.Fatalf("late start = %v, want 409 deadline_passed", err)
	}
	if _, ok, _ := e.client.FindByClientToken(ctx, "late"); ok {
		t.Fatal("the refused start left a run")
	}
	if !e.runner.Idle() {
		t.Fatal("the refused start holds a slot")
	}
}

func TestDrainAndResume(t *testing.T) {
	e := newEdge(t)
	if st, err := e.client.Drain(ctx); err != nil || !st.Draining || st.Idle == nil || !*st.Idle {
		t.Fatalf("drain = %+v, %v; want draining and idle", st, err)
	}
	_, err := e.client.Start(ctx, hostproto.StartRequest{ClientToken: "d", Request: runspec.Request{Agent: "shell", Prompt: "true"}})
	if !hasCode(err, http.StatusConflict, hostproto.CodeDraining) {
		t.Fatalf("start while draining = %v", err)
	}
	if st, err := e.client.Resume(ctx); err != nil || st.Draining {
		t.Fatalf("resume = %+v, %v; want not draining", st, err)
	}
	run := e.start("true")
	if end := e.waitStatus(run.RunID, ended); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("run after resume %+v", end)
	}
}

func TestEventsPageByCursorAcrossARestart(t *testing.T) {
	e := newEdge(t)
	run := e.start(`for i in $(seq 1 30); do echo line-$i; sleep 0.001; done`)
	e.waitStatus(run.RunID, ended)
	before := e.allEvents(run.RunID, 7)
	// Read part of the log, restart edge, and carry on from the cursor.
	first, err := e.client.Events(ctx, run.RunID, 0, 5)
	if err != nil || len(first.Events) != 5 || !first.HasMore || first.NextCursor == nil || *first.NextCursor != 5 {
		t.Fatalf("first page %+v %v", first, err)
	}
	e.down()
	e.up()
	rest := []hostproto.Event{}
	after := *first.NextCursor
	for {
		page, err := e.client.Events(ctx, run.RunID, after, 4)
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, page.Events...)
		after = *page.NextCursor
		if !page.HasMore {
			break
		}
	}
	got := append(first.Events, rest...)
	if len(got) != len(before) {
		t.Fatalf("paged %d events across the restart, %d before it", len(got), len(before))
	}
	for i := range got {
		if got[i].Sequence != int64(i+1) || string(got[i].Data) != string(before[i].Data) {
			t.Fatalf("event %d differs across the restart: %+v vs %+v", i, got[i], before[i])
		}
	}
	if out := edgetest.Output(got); !strings.Contains(out, "line-1\r\n") || !strings.Contains(out, "line-30\r\n") {
		t.Fatalf("output %q", out)
	}
}

func TestBadRequestsNameTheField(t *testing.T) {
	e := newEdge(t)
	run := e.start("true")
	events := "/runs/" + run.RunID + "/events"
	const inRange = "want an integer from 1 to 1000"
	tests := []struct {
		method, path, body string
		status             int
		code, mention      string
	}{
		{"GET", events + "?after=-1", "", 400, hostproto.CodeBadRequest, "after"},
		{"GET", events + "?after=", "", 400, hostproto.CodeBadRequest, "after"},
		{"GET", events + "?after=1e3", "", 400, hostproto.CodeBadRequest, "after"},
		{"GET", events + "?limit=x", "", 400, hostproto.CodeBadRequest, `limit: "x": ` + inRange},
		{"GET", events + "?limit=0", "", 400, hostproto.CodeBadRequest, `limit: "0": ` + inRange},
		{"GET", events + "?limit=-1", "", 400, hostproto.CodeBadRequest, `limit: "-1": ` + inRange},
		{"GET", events + "?limit=1001", "", 400, hostproto.CodeBadRequest, `limit: "1001": ` + inRange},
		{"GET", events + "?limit=99999999999999999999", "", 400, hostproto.CodeBadRequest, inRange},
		{"GET", events + "?limit=2.5", "", 400, hostproto.CodeBadRequest, inRange},
		{"GET", events + "?limit=", "", 400, hostproto.CodeBadRequest, inRange},
		{"GET", "/runs", "", 400, hostproto.CodeBadRequest, "clientToken"},
		{"POST", "/runs", `{"clientToken": "a", "agent": "nope"}`, 400, hostproto.CodeBadRequest, "agent"},
		{"POST", "/runs", `{"clientToken": 5}`, 400, hostproto.CodeBadRequest, "clientToken: want a string"},
		{"POST", "/runs", ``, 400, hostproto.CodeInvalidJSON, "body: is empty"},
		{"POST", "/runs", `{"clientToken": "a", "agent": "shell"`, 400, hostproto.CodeInvalidJSON, "body: is truncated JSON"},
		{"POST", "/runs", `{"clientToken" "a"}`, 400, hostproto.CodeInvalidJSON, "body: is not valid JSON (at byte 16)"},
		{"POST", "/runs/" + run.RunID + "/input", `{}`, 400, hostproto.CodeBadRequest, "input"},
		{"GET", "/runs/nope/events", "", 404, hostproto.CodeRunNotFound, "no such run"},
		{"POST", "/runs", `{"clientToken": "big", "agent": "shell", "prompt": "` + strings.Repeat("x", maxBodyBytes) + `"}`, 413, hostproto.CodeBadRequest, "larger"},
		// A key given twice, on every route that reads a body: refused,
		// named by its path, its values never quoted.
		{"POST", "/runs", `{"clientToken": "dup-1", "agent": "shell", "agent": "sk-live-secret"}`, 400, hostproto.CodeInvalidJSON, "agent: the key is given more than once"},
		{"POST", "/runs", `{"clientToken": "dup-2", "agent": "shell", "env": {"A": "1", "A": "sk-live-secret"}}`, 400, hostproto.CodeInvalidJSON, `env.A: the key is given more than once`},
		{"POST", "/runs", `{"clientToken": "dup-3", "agent": "shell", "secrets": [{"projectId": "p", "key": "K", "domains": ["a.b"], "key": "L"}]}`, 400, hostproto.CodeInvalidJSON, "secrets[0].key"},
		{"POST", "/runs/" + run.RunID + "/input", `{"input": "a", "input": "sk-live-secret"}`, 400, hostproto.CodeInvalidJSON, "input: the key is given more than once"},
		{"POST", "/runs/" + run.RunID + "/input", `{"input": {"x": 1, "x": 2}}`, 400, hostproto.CodeInvalidJSON, "input.x"},
		{"POST", "/runs/" + run.RunID + "/cancel", `{"why": 1, "why": 2}`, 400, hostproto.CodeInvalidJSON, "why"},
		{"POST", "/runs/" + run.RunID + "/retry", `{"why": 1, "why": 2}`, 400, hostproto.CodeInvalidJSON, "why"},
		{"POST", "/runs/" + run.RunID + "/retry", `{"why":`, 400, hostproto.CodeInvalidJSON, "truncated"},
		// Values from Fleet: each for a well-formed key the run declares,
		// once, not empty; a value never quoted.
		{"POST", "/runs", `{"clientToken": "cred-1", "agent": "shell", "credentials": [{"projectId": "acme", "key": "GH", "value": "sk-live-secret"}]}`, 400, hostproto.CodeBadRequest, "credentials[0]: acme/GH is not a secret the run declares"},
		{"POST", "/runs", `{"clientToken": "cred-2", "agent": "shell", "secrets": [{"projectId": "acme", "key": "GH", "domains": ["a.example"]}], "credentials": [{"projectId": "ac/me", "key": "GH", "value": "sk-live-secret"}]}`, 400, hostproto.CodeBadRequest, "credentials[0].projectId"},
		{"POST", "/runs", `{"clientToken": "cred-3", "agent": "shell", "secrets": [{"projectId": "acme", "key": "GH", "domains": ["a.example"]}], "credentials": [{"projectId": "acme", "key": "G-H", "value": "sk-live-secret"}]}`, 400, hostproto.CodeBadRequest, "credentials[0].key"},
		{"POST", "/runs", `{"clientToken": "cred-4", "agent": "shell", "secrets": [{"projectId": "acme", "key": "GH", "domains": ["a.example"]}], "credentials": [{"projectId": "acme", "key": "GH", "value": "sk-live-secret"}, {"projectId": "acme", "key": "GH", "value": "sk-live-secret2"}]}`, 400, hostproto.CodeBadRequest, "credentials[1]: acme/GH is given more than once"},
		{"POST", "/runs", `{"clientToken": "cred-5", "agent": "shell", "secrets": [{"projectId": "acme", "key": "GH", "domains": ["a.example"]}], "credentials": [{"projectId": "acme", "key": "GH", "value": ""}]}`, 400, hostproto.CodeBadRequest, "credentials[0].value: the value of acme/GH is empty"},
		{"POST", "/runs", `{"clientToken": "cred-6", "agent": "shell", "credentials": [{"projectId": "acme", "key": "GH", "value": 5}]}`, 400, hostproto.CodeBadRequest, "credentials.value: want a string"},
		{"PUT", "/runs/nope/credentials", `{"credentials": [{"projectId": "acme", "key": "GH", "value": "sk-live-secret"}]}`, 404, hostproto.CodeRunNotFound, "no such run"},
		{"PUT", "/runs/" + run.RunID + "/credentials", `{"credentials": []}`, 400, hostproto.CodeBadRequest, "credentials: is required"},
		{"PUT", "/runs/" + run.RunID + "/credentials", `{"credentials": [{"projectId": "acme", "key": "GH", "value": "sk-live-secret"}]}`, 400, hostproto.CodeBadRequest, "credentials[0]: acme/GH is not a secret the run declares"},
		{"PUT", "/runs/" + run.RunID + "/credentials", `{"credentials": [{"projectId": "acme", "key": "GH", "value": "a", "value": "sk-live-secret"}]}`, 400, hostproto.CodeInvalidJSON, "credentials[0].value: the key is given more than once"},
		{"PUT", "/runs/" + run.RunID + "/credentials", ``, 400, hostproto.CodeInvalidJSON, "body: is empty"},
		{"POST", "/host/drain", `{"why": 1, "why": 2}`, 400, hostproto.CodeInvalidJSON, "why"},
		{"POST", "/host/resume", `{"why": 1, "why": 2}`, 400, hostproto.CodeInvalidJSON, "why"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, e.srv.URL+tt.path, strings.NewReader(tt.body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body hostproto.ErrorBody
		json.Unmarshal(b, &body)
		if resp.StatusCode != tt.status || body.Code != tt.code || !strings.Contains(body.Error, tt.mention) || strings.Contains(string(b), "sk-live") {
			t.Errorf("%s %s answered %d %s; want %d %s mentioning %q", tt.method, tt.path[:min(len(tt.path), 60)], resp.StatusCode, b[:min(len(b), 200)], tt.status, tt.code, tt.mention)
		}
	}
	for _, token := range []string{"dup-1", "dup-2", "dup-3", "cred-1", "cred-2", "cred-3", "cred-4", "cred-5", "cred-6"} {
		if _, ok, _ := e.client.FindByClientToken(ctx, token); ok {
			t.Errorf("the start with a key given twice (%s) left a run", token)
		}
	}
	if e.runner.Draining() {
		t.Error("a drain with a key given twice drained the host")
	}
	page, err := e.client.Events(ctx, run.RunID, 0, runner.MaxEventPage)
	if err != nil || len(page.Events) == 0 {
		t.Fatalf("a limit of the maximum: %d events, %v", len(page.Events), err)
	}
}

// TestEventsPastTheEnd: a page asked after the run's last event is empty
// with no nextCursor (no page continues from a place no event reached); at
// the last event it is empty with nextCursor there, to poll from.
func TestEventsPastTheEnd(t *testing.T) {
	e := newEdge(t)
	run := e.waitStatus(e.start("echo one; echo two").RunID, ended)
	last := int64(len(e.allEvents(run.RunID, 0)))
	for _, c := range []struct {
		after int64
		want  string
	}{
		{last, fmt.Sprintf(`{"events":[],"nextCursor":%d,"hasMore":false}`, last)},
		{last + 1, `{"events":[],"hasMore":false}`},
		{last + 100, `{"events":[],"hasMore":false}`},
	} {
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/runs/%s/events?after=%d", e.srv.URL, run.RunID, c.after), nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := strings.TrimSpace(string(b)); resp.StatusCode != 200 || got != c.want {
			t.Errorf("after=%d of %d events: %d %s, want %s", c.after, last, resp.StatusCode, got, c.want)
		}
	}
}

func TestMetrics(t *testing.T) {
	e := newEdge(t)
	run := e.start("true")
	e.waitStatus(run.RunID, ended)
	m, err := e.client.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`edge_runs{status="succeeded"} 1`, `edge_admissions_total{reason="",verdict="admit"} 1`, "edge_tasks_live 0"} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q:\n%s", want, m)
		}
	}
}

func hasCode(err error, status int, code string) bool {
	var he *hostproto.Error
	return errors.As(err, &he) && he.Status == status && he.Code == code
}
