package hostapi

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/runner"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/leakcheck"
)

// A start with every field set is stored as the run log stored it when the
// record held the wire request itself: the same JSON, byte for byte.
func TestAStartIsStoredAsTheWireRequestWas(t *testing.T) {
	e := newEdge(t)
	deadline := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	req := hostproto.StartRequest{ClientToken: "every-field", Request: runspec.Request{
		Deadline: &deadline, Agent: "shell", Prompt: "true", Argv: []string{"a", "é"},
		Repository: "acme/app", CloneURL: "file:///nonexistent/app.git", Env: map[string]string{"B": "2", "A": "1"},
		Secrets: []runspec.Secret{{ProjectID: "acme", Key: "API_TOKEN", Domains: []string{"api.example"}}, {ProjectID: "acme", Key: "OTHER", Domains: []string{"other.example"}}},
	}}
	run, err := e.client.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := e.runs.Get(run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(rec.Request)
	want, _ := json.Marshal(req)
	if string(got) != string(want) {
		t.Fatalf("stored request\n%s\nwant the wire request's\n%s", got, want)
	}
}

// The values from Fleet a start carries are no part of the run's record:
// it is stored as the wire request without them, and no byte of the run
// log, the run's events or the answer holds a value.
func TestAStartsValuesFromFleetAreStoredNowhere(t *testing.T) {
	e := newEdge(t)
	const value = "ghs_valueFromFleet0123456789abcdefABCDEF"
	req := hostproto.StartRequest{ClientToken: "with-values", Request: runspec.Request{Agent: "shell", Prompt: "true",
		Secrets: []runspec.Secret{{ProjectID: "acme", Key: "GH", Domains: []string{"api.github.com"}}}},
		Credentials: []hostproto.BrokeredValue{{ProjectID: "acme", Key: "GH", Value: value, ExpiresAt: time.Now().Add(time.Hour)}}}
	run, err := e.client.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// This edge has no proxy: refused, and the refusal recorded.
	if run.Reason != hostproto.ReasonBrokerNotReady {
		t.Fatalf("the start answered %+v, want broker_not_ready", run)
	}
	rec, err := e.runs.Get(run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(rec.Request)
	bare := req
	bare.Credentials = nil
	want, _ := json.Marshal(bare)
	if string(got) != string(want) {
		t.Fatalf("stored request\n%s\nwant the wire request without its values\n%s", got, want)
	}
	events, _ := json.Marshal(e.allEvents(run.RunID, 100))
	e.down()
	db, err := os.ReadFile(e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	real := leakcheck.Real{Key: "the value from Fleet", Value: value, Public: len("ghs_")}
	leakcheck.AssertClean(t, "the run log", db, real)
	leakcheck.AssertClean(t, "the run's events", events, real)
}

// A start that waited in Fleet's queue carries its wait: the run's first
// event on the wire is queued with the wait's JSON as Fleet sent it, the
// stored request is the wire's without it, and the same start again
// (Fleet resuming an offer) adds no event.
func TestAQueuedStartsWaitIsItsFirstEventOnTheWire(t *testing.T) {
	e := newEdge(t)
	since := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	req := hostproto.StartRequest{ClientToken: "waited", Request: runspec.Request{Agent: "shell", Prompt: "true"},
		Queued: &hostproto.Queued{Since: since, StartedAt: since.Add(1500 * time.Millisecond), WaitedMs: 1500, HostID: "host-a", Offers: 1}}
	run, err := e.client.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	e.waitStatus(run.RunID, ended)
	again, err := e.client.Start(ctx, req)
	if err != nil || !again.Reused || again.RunID != run.RunID {
		t.Fatalf("the same start again = %+v, %v; want the run reused", again, err)
	}
	events := e.allEvents(run.RunID, 100)
	if len(events) < 2 || events[0].Sequence != 1 || events[0].Type != hostproto.EventQueued || events[1].Type != hostproto.EventAdmission {
		t.Fatalf("the run's events begin %+v, want queued then the admission", events)
	}
	const want = `{"since":"2026-12-06T09:00:00Z","startedAt":"2026-12-06T09:00:01.5Z","waitedMs":1500,"hostId":"host-a","offers":1}`
	if string(events[0].Data) != want {
		t.Fatalf("the queued event's data is %s, want %s", events[0].Data, want)
	}
	queued := 0
	for _, ev := range events {
		if ev.Type == hostproto.EventQueued {
			queued++
		}
	}
	if queued != 1 {
		t.Fatalf("%d queued events, want 1", queued)
	}
	rec, err := e.runs.Get(run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(rec.Request)
	bare := req
	bare.Queued = nil
	if wantReq, _ := json.Marshal(bare); string(got) != string(wantReq) {
		t.Fatalf("stored request\n%s\nwant the wire request without its wait\n%s", got, wantReq)
	}
}

// Runs, event pages, limits and storage answer the protocol's JSON, every
// field carried, lists never null.
func TestTheAnswersAreTheWireJSON(t *testing.T) {
	code := 3
	ts := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for name, c := range map[string]struct {
		got  any
		want string
	}{
		"run": {wireRun(runner.Run{RunID: "run-1", ClientToken: "tok", Status: "failed", Attempt: 2, ExitCode: &code, Reason: "timed_out", Detail: "too long", Reused: true}),
			`{"runId":"run-1","clientToken":"tok","status":"failed","attempt":2,"exitCode":3,"reason":"timed_out","detail":"too long","reused":true}`},
		"bare run": {wireRun(runner.Run{RunID: "run-1", ClientToken: "tok", Status: "pending", Attempt: 1}),
			`{"runId":"run-1","clientToken":"tok","status":"pending","attempt":1}`},
		"a live run missing values from Fleet": {wireRun(runner.Run{RunID: "run-1", ClientToken: "tok", Status: "running", Attempt: 2, MissingCredentials: []string{"acme/GH", "acme/OAUTH"}}),
			`{"runId":"run-1","clientToken":"tok","status":"running","attempt":2,"missingCredentials":["acme/GH","acme/OAUTH"]}`},
		"no runs": {hostproto.RunList{Runs: wireRuns([]runner.Run{})}, `{"runs":[]}`},
		"page": {wirePage(runlog.Page{Events: []runlog.Event{{Sequence: 4, Type: "output", Data: json.RawMessage(`"hi"`), TS: ts}}, NextCursor: 4, HasMore: true}),
			`{"events":[{"sequence":4,"type":"output","data":"hi","ts":"2026-11-30T12:00:00Z"}],"nextCursor":4,"hasMore":true}`},
		"empty page":   {wirePage(runlog.Page{Events: []runlog.Event{}, NextCursor: 7}), `{"events":[],"nextCursor":7,"hasMore":false}`},
		"past the end": {wirePage(runlog.Page{Events: []runlog.Event{}, NextCursor: 9, PastEnd: true}), `{"events":[],"hasMore":false}`},
		"limits": {wireLimits(runner.LimitsReport{Enforced: "cgroup2", MemoryBytes: 1 << 30, Pids: 512, CPU: 1.5}),
			`{"enforced":"cgroup2","memoryBytes":1073741824,"pids":512,"cpu":1.5}`},
		"limits unavailable": {wireLimits(runner.LimitsReport{Enforced: "unavailable", Detail: "no cgroup"}), `{"enforced":"unavailable","detail":"no cgroup"}`},
		"storage":            {wireStorage(runner.StorageReport{FreeBytes: 10, MinFreeBytes: 20, Low: true}), `{"freeBytes":10,"minFreeBytes":20,"low":true}`},
	} {
		b, err := json.Marshal(c.got)
		if err != nil || string(b) != c.want {
			t.Errorf("%s: %s (%v), want %s", name, b, err, c.want)
		}
	}
}
