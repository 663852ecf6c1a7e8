package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// queueAPI is Fleet's API for a run that waits, its answers built from
// fleetapi's types: the dispatch's 202, the run's stream connection by
// connection (queued, then what its host recorded), the run as GET and
// the list show it, and the capacity route. Each case is exact, so what
// is checked is the CLI's reading of them; Fleet's queueing itself is
// tested with Fleet.
type queueAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu         sync.Mutex
	run        fleetapi.Run
	streams    [][]sseFrame // one per connection; the last repeats
	capacity   fleetapi.Capacity
	dispatched []fleetapi.DispatchRequest
	connected  []string // each stream connection's Last-Event-ID
}

type sseFrame struct {
	event, id string
	data      any
}

// The run's wait: queued at since behind one run of its class, for 30
// minutes; a host took it 9 minutes later.
var (
	since   = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	started = since.Add(9 * time.Minute)
)

const queuedRunID = "fr-01jd3k2m4n5p6q7r8s9t0v1w2q"

func newQueueAPI(t *testing.T) *queueAPI {
	q := &queueAPI{t: t}
	q.srv = httptest.NewServer(http.HandlerFunc(q.serve))
	t.Cleanup(q.srv.Close)
	q.run = fleetapi.Run{FleetRunID: queuedRunID, OwnerID: "alice", Status: fleetapi.StatusQueued, Agent: "shell",
		CreatedAt: since, UpdatedAt: since,
		Links: fleetapi.RunLinks{Self: q.srv.URL + "/fleet/runs/" + queuedRunID, Events: q.srv.URL + "/fleet/runs/" + queuedRunID + "/events",
			Stream: q.srv.URL + "/fleet/runs/" + queuedRunID + "/stream", Egress: q.srv.URL + "/fleet/runs/" + queuedRunID + "/egress"},
		Queue: &fleetapi.RunQueue{Class: "shell", Position: 2, Priority: 5, Since: since, Timeout: "30m", Until: since.Add(30 * time.Minute), WaitedSeconds: 60}}
	return q
}

// cli is a runfleet on this API, its clock at the run's first minute.
func (q *queueAPI) cli() *cli {
	f := &fleet{t: q.t, clk: clock.NewFake(since.Add(time.Minute))}
	return f.newCLI(map[string]string{EnvAPI: q.srv.URL, EnvToken: "tok"})
}

func (q *queueAPI) serve(w http.ResponseWriter, r *http.Request) {
	run := "/fleet/runs/" + queuedRunID
	if r.Method+" "+r.URL.Path == "GET "+run+"/stream" {
		q.stream(w, r)
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	switch r.Method + " " + r.URL.Path {
	case "POST /fleet/runs":
		var d fleetapi.DispatchRequest
		if err := json.NewDecoder(r.Body).Decode(&d); err != nil {
			q.t.Errorf("the dispatch's body: %v", err)
		}
		q.dispatched = append(q.dispatched, d)
		writeAPI(w, http.StatusAccepted, fleetapi.DispatchAnswer{FleetRunID: q.run.FleetRunID, Status: q.run.Status, Links: q.run.Links, Queue: q.run.Queue})
	case "GET " + run:
		writeAPI(w, http.StatusOK, fleetapi.RunAnswer{Run: q.run})
	case "GET /fleet/runs":
		writeAPI(w, http.StatusOK, fleetapi.RunPage{Runs: []fleetapi.Run{q.run}})
	case "GET /fleet/capacity":
		writeAPI(w, http.StatusOK, q.capacity)
	case "POST " + run + "/cancel":
		// No host has the run: Fleet ends it itself.
		q.run.Status, q.run.Reason = fleetapi.StatusCanceled, "canceled"
		writeAPI(w, http.StatusOK, fleetapi.Interaction{FleetRunID: q.run.FleetRunID, Outcome: fleetapi.Outcome{Accepted: fleetapi.Accepted}, Run: q.run})
	default:
		writeAPI(w, http.StatusNotFound, fleetapi.Error{Error: "no route " + r.Method + " " + r.URL.Path, Code: "not_found"})
	}
}

// peek counts the dispatches and stream connections so far.
func (q *queueAPI) peek() (dispatched, connected int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.dispatched), len(q.connected)
}

// seen returns the dispatches the API got and each stream connection's
// Last-Event-ID, and forgets the connections (the next run's stream
// starts the script again).
func (q *queueAPI) seen() ([]fleetapi.DispatchRequest, []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	connected := q.connected
	q.connected = nil
	return append([]fleetapi.DispatchRequest(nil), q.dispatched...), connected
}

// stream serves the connection's frames; a nil script holds the
// connection open after the queued snapshot, as a quiet run's stream does
// before its idle end.
func (q *queueAPI) stream(w http.ResponseWriter, r *http.Request) {
	q.mu.Lock()
	q.connected = append(q.connected, r.Header.Get("Last-Event-ID"))
	frames := q.streams[min(len(q.connected), len(q.streams))-1]
	q.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	if frames == nil {
		frames = stillQueued()[:1]
		defer func() { <-r.Context().Done() }()
	}
	for _, f := range frames {
		b, _ := json.Marshal(f.data)
		if f.id != "" {
			fmt.Fprintf(w, "id: %s\n", f.id)
		}
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", f.event, b)
	}
	w.(http.Flusher).Flush()
}

func writeAPI(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// stillQueued is a stream connection of the run while it waits: where it
// stands, then the idle end (nothing happens while a run waits).
func stillQueued() []sseFrame {
	return []sseFrame{
		{event: fleetapi.SSESnapshot, data: fleetapi.StreamSnapshot{Status: fleetapi.StatusQueued, Live: true}},
		{event: fleetapi.SSEIdle, id: "0", data: fleetapi.StreamIdle{Status: fleetapi.StatusQueued, IdleSeconds: 300, RetryMs: 30000, Resume: "after=0"}},
	}
}

func event(seq int64, typ string, data any) sseFrame {
	b, _ := json.Marshal(data)
	return sseFrame{event: fleetapi.SSEEvent, id: fmt.Sprint(seq), data: fleetapi.Event{Sequence: seq, Type: typ, Data: b, TS: started}}
}

// startedAndSucceeded is the connection after the run left the queue: its
// host's events, the queued one first, to its end.
func startedAndSucceeded() []sseFrame {
	return []sseFrame{
		event(1, fleetapi.EventQueued, map[string]any{"since": since, "startedAt": started, "waitedMs": 540000, "hostId": "h1", "offers": 1}),
		event(2, fleetapi.EventState, map[string]any{"status": "admitted", "attempt": 1}),
		event(3, fleetapi.EventOutput, "hello\n"),
		event(4, fleetapi.EventState, map[string]any{"status": "succeeded", "attempt": 1, "exitCode": 0}),
		{event: fleetapi.SSEDone, data: fleetapi.StreamDone{Cursor: 4, Status: fleetapi.StatusSucceeded, Attempt: 1, ExitCode: new(int)}},
	}
}

// TestRunWaitsInTheQueue: --queue and --priority reach the dispatch as
// the API takes them; a queued answer is said on stderr (off a terminal
// too), and run follows the run through its wait, across the stream's
// idle ends, until it starts and ends, with the task's output on stdout
// and its exit code.
func TestRunWaitsInTheQueue(t *testing.T) {
	q := newQueueAPI(t)
	q.streams = [][]sseFrame{stillQueued(), stillQueued(), startedAndSucceeded()}
	c := q.cli()
	r := c.run(t, "run", "--agent", "shell", "--queue", "30m", "--priority", "5", "--", "echo", "hello").want(t, 0)
	dispatched, connected := q.seen()
	if len(dispatched) != 1 || dispatched[0].Queue == nil || *dispatched[0].Queue != (fleetapi.QueueRequest{Timeout: "30m", Priority: 5}) {
		t.Fatalf("the API got %+v, want one dispatch waiting 30m at priority 5", dispatched)
	}
	if r.stdout.String() != "hello\n" {
		t.Errorf("stdout %q, want the task's output", r.stdout)
	}
	want := "queued: position 2 in shell, waiting up to 30m\n" +
		"run " + queuedRunID + " started on host h1 after 9m0s in the queue\n"
	if r.stderr.String() != want {
		t.Errorf("stderr\n%s\nwant\n%s", r.stderr, want)
	}
	if got := strings.Join(connected, ","); got != ",0,0" {
		t.Errorf("the stream was connected with Last-Event-IDs %q, want a resume after each idle end", got)
	}

	// On a terminal: the progress of the wait too.
	c.tty = true
	r = c.run(t, "run", "--agent", "shell", "--queue", "30m", "--", "true").want(t, 0)
	q.seen()
	for _, want := range []string{"dispatched run " + queuedRunID + " (queued)", "run " + queuedRunID + " is still queued after 300s",
		"run " + queuedRunID + ": admitted (attempt 1)"} {
		if !strings.Contains(r.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}

	// --json: the dispatch answer first, with the run's place, then every
	// stream message.
	c.tty = false
	lines := c.run(t, "run", "--agent", "shell", "--queue", "30m", "--json", "--", "true").want(t, 0).jsonLines(t)
	var types []string
	for _, l := range lines {
		types = append(types, l.Type)
	}
	if got := strings.Join(types, " "); got != "dispatched snapshot idle snapshot idle event event event event done" {
		t.Errorf("--json lines %s", got)
	}
	var d fleetapi.DispatchAnswer
	if err := json.Unmarshal(lines[0].Data.(json.RawMessage), &d); err != nil || d.Status != fleetapi.StatusQueued || d.Queue == nil || d.Queue.Position != 2 {
		t.Errorf("the dispatched line %s (%v): want the queued answer", lines[0].Data, err)
	}
}

// TestRunThatNeverStarts: a run whose wait ran out ends failed
// queue_timeout: exit 2, as a dispatch no host could take, the reason
// named on stderr, nothing on stdout.
func TestRunThatNeverStarts(t *testing.T) {
	q := newQueueAPI(t)
	q.streams = [][]sseFrame{stillQueued(), {
		{event: fleetapi.SSESnapshot, data: fleetapi.StreamSnapshot{Status: fleetapi.StatusFailed, Live: false}},
		{event: fleetapi.SSEDone, data: fleetapi.StreamDone{Status: fleetapi.StatusFailed, Reason: fleetapi.ReasonQueueTimeout,
			Detail: "no eligible host had a free slot within 30m; add hosts or raise the timeout"}},
	}}
	r := q.cli().run(t, "run", "--agent", "shell", "--queue", "30m", "--", "true").want(t, ExitRefused)
	if r.stdout.String() != "" {
		t.Errorf("stdout %q", r.stdout)
	}
	for _, want := range []string{"queued: position 2 in shell, waiting up to 30m",
		"run " + queuedRunID + " never started: no eligible host had room before its queue timeout (queue_timeout): no eligible host had a free slot within 30m"} {
		if !strings.Contains(r.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
}

// TestCancelOfAQueuedRun: a queued run canceled (Ctrl-C with
// --cancel-on-interrupt, or runs cancel) is said to end before it ever
// started, not to have been taken by a host.
func TestCancelOfAQueuedRun(t *testing.T) {
	q := newQueueAPI(t)
	q.streams = [][]sseFrame{nil}
	c := q.cli()
	r := c.start("", "run", "--agent", "shell", "--queue", "30m", "--cancel-on-interrupt", "--", "true")
	await.Cond(t, await.Limit, "the run's stream", func() bool { _, connected := q.peek(); return connected > 0 })
	r.interrupt <- os.Interrupt
	r.wait(t).want(t, ExitInterrupted)
	if !strings.Contains(r.stderr.String(), "Canceled run "+queuedRunID+" while it waited in the queue: it never started.") {
		t.Errorf("stderr lacks the cancel of the queued run:\n%s", r.stderr)
	}
	r = c.run(t, "runs", "cancel", queuedRunID).want(t, 0)
	if !strings.Contains(r.stderr.String(), "Cancel of run "+queuedRunID+": done while it waited in the queue; the run is canceled") {
		t.Errorf("runs cancel of a queued run:\n%s", r.stderr)
	}
}

// TestRunDetachOfAQueuedRun: --detach says where the run waits.
func TestRunDetachOfAQueuedRun(t *testing.T) {
	q := newQueueAPI(t)
	r := q.cli().run(t, "run", "--agent", "shell", "--queue", "30m", "--detach", "--", "true").want(t, 0)
	out := r.stdout.String()
	if !regexp.MustCompile(`(?m)^status +queued$`).MatchString(out) || strings.Contains(out, "\nhost ") ||
		!regexp.MustCompile(`(?m)^queue +position 2 in shell \(priority 5\), waiting since \S+ \(1m ago\), until \S+ \(in 29m0s\) \(timeout 30m\)$`).MatchString(out) {
		t.Errorf("--detach printed\n%s\nwant the run queued, no host, and its place", out)
	}
}

// TestRunsGetAndListOfAQueuedRun: get shows the run's place while it
// waits and its wait once it started; list shows it queued.
func TestRunsGetAndListOfAQueuedRun(t *testing.T) {
	q := newQueueAPI(t)
	c := q.cli()
	r := c.run(t, "runs", "get", queuedRunID).want(t, 0)
	if !regexp.MustCompile(`(?m)^queue +position 2 in shell \(priority 5\), waiting since 20\S+ \(1m ago\), until 20\S+ \(in 29m0s\) \(timeout 30m\)$`).MatchString(r.stdout.String()) ||
		!regexp.MustCompile(`(?m)^status +queued$`).MatchString(r.stdout.String()) {
		t.Errorf("runs get of a queued run:\n%s", r.stdout)
	}
	r = c.run(t, "runs", "list").want(t, 0)
	if !regexp.MustCompile(`(?m)^` + queuedRunID + ` +queued +shell +1m ago$`).MatchString(r.stdout.String()) {
		t.Errorf("runs list:\n%s", r.stdout)
	}

	q.mu.Lock()
	q.run.Status, q.run.HostID, q.run.Attempt = fleetapi.StatusRunning, "h1", 1
	q.run.Queue.Position, q.run.Queue.StartedAt, q.run.Queue.StartedOn, q.run.Queue.WaitedSeconds = 0, &started, "h1", 540
	q.mu.Unlock()
	r = c.run(t, "runs", "get", queuedRunID).want(t, 0)
	if !regexp.MustCompile(`(?m)^queue +waited 9m0s in shell \(priority 5\); started 20\S+ \([^)]*\) on h1$`).MatchString(r.stdout.String()) {
		t.Errorf("runs get of a run that waited:\n%s", r.stdout)
	}

	q.mu.Lock()
	q.run.Status, q.run.HostID, q.run.Reason = fleetapi.StatusFailed, "", fleetapi.ReasonQueueTimeout
	q.run.Queue.StartedAt, q.run.Queue.StartedOn, q.run.Queue.WaitedSeconds = nil, "", 1800
	q.mu.Unlock()
	r = c.run(t, "runs", "get", queuedRunID).want(t, 0)
	if !regexp.MustCompile(`(?m)^queue +waited 30m0s in shell \(priority 5\); never started$`).MatchString(r.stdout.String()) ||
		!regexp.MustCompile(`(?m)^reason +queue_timeout$`).MatchString(r.stdout.String()) {
		t.Errorf("runs get of a run that never started:\n%s", r.stdout)
	}
}

// TestCapacityCommand: the classes as a table (the oldest wait only where
// runs wait), --json as the API's answer, and a fleet with none.
func TestCapacityCommand(t *testing.T) {
	q := newQueueAPI(t)
	q.capacity = fleetapi.Capacity{At: since, Classes: []fleetapi.ClassCapacity{
		{Class: "claude?pool=gpu", Agent: "claude", Labels: map[string]string{"pool": "gpu"}, Queued: 4, OldestWaitSeconds: 95, BusySlots: 8, Hosts: 2, DrainingHosts: 1},
		{Class: "shell", Agent: "shell", FreeSlots: 3, BusySlots: 1, Hosts: 1},
	}}
	c := q.cli()
	r := c.run(t, "capacity").want(t, 0)
	want := "CLASS            QUEUED  OLDEST WAIT  FREE  BUSY  HOSTS  DRAINING\n" +
		"claude?pool=gpu  4       1m35s        0     8     2      1\n" +
		"shell            0                    3     1     1      0\n"
	if r.stdout.String() != want {
		t.Errorf("capacity printed\n%s\nwant\n%s", r.stdout, want)
	}
	var got fleetapi.Capacity
	r = c.run(t, "capacity", "--json").want(t, 0)
	if err := json.Unmarshal([]byte(r.stdout.String()), &got); err != nil || len(got.Classes) != 2 || got.Classes[0].Queued != 4 || !got.At.Equal(since) {
		t.Errorf("capacity --json printed %s (%v)", r.stdout, err)
	}

	q.mu.Lock()
	q.capacity = fleetapi.Capacity{At: since}
	q.mu.Unlock()
	r = c.run(t, "capacity").want(t, 0)
	if r.stdout.String() != "" || !strings.Contains(r.stderr.String(), "No routing class") {
		t.Errorf("capacity of an empty fleet: %q / %q", r.stdout, r.stderr)
	}
	if r = c.run(t, "capacity", "--json").want(t, 0); !strings.Contains(r.stdout.String(), `"classes": []`) {
		t.Errorf("capacity --json of an empty fleet: %s", r.stdout)
	}
}
