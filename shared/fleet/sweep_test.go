package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// dispatched starts a run on host h1 of e and returns it.
func dispatched(t *testing.T, e *testEnv, owner string) store.Run {
	t.Helper()
	res, err := e.f.Dispatch(context.Background(), caller(owner), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil || res.Run.ChildRunID == "" {
		t.Fatalf("dispatch = %+v, %v", res, err)
	}
	return res.Run
}

func liveIDs(t *testing.T, st store.Store) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	cur := ""
	for {
		p, err := st.ListLive(context.Background(), cur, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range p.FleetRunIDs {
			out[id] = true
		}
		if p.NextCursor == "" {
			return out
		}
		cur = p.NextCursor
	}
}

// mirrored reads a run's whole mirror (every stored event, past the cursor too).
func mirrored(t *testing.T, st store.Store, id string) []hostproto.Event {
	t.Helper()
	p, err := st.ListEvents(context.Background(), id, 0, store.MaxLimit)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]hostproto.Event, len(p.Events))
	for i, e := range p.Events {
		out[i] = eventToWire(e)
	}
	return out
}

func sameEvents(t *testing.T, got, want []hostproto.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("mirror has %d events, the host %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Sequence != want[i].Sequence || got[i].Type != want[i].Type || string(got[i].Data) != string(want[i].Data) ||
			!got[i].TS.Equal(want[i].TS) {
			t.Fatalf("event %d: mirror %+v, host %+v", i, got[i], want[i])
		}
	}
}

func TestSweepMirrorsEventsByCursorAndDrainsAtTheEnd(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{MaxEventPage: 3})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.SetRun(run.ChildRunID, hostproto.StatusRunning, nil, "")
	for i := 0; i < 5; i++ {
		host.AppendOutput(run.ChildRunID, fmt.Sprintf("line %d\n", i))
	}

	rep, err := e.f.Sweep(ctx, SweepOptions{})
	if err != nil || rep.Live != 1 || rep.Current != 1 || rep.Events != 7 {
		t.Fatalf("first sweep = %+v, %v", rep, err)
	}
	sameEvents(t, mirrored(t, e.st, run.FleetRunID), host.Events(run.ChildRunID))
	got, _ := e.st.GetRun(ctx, run.FleetRunID)
	if got.Status != hostproto.StatusRunning || got.EventCursor != 7 || got.Drained || !liveIDs(t, e.st)[run.FleetRunID] {
		t.Fatalf("after the first sweep: %+v", got)
	}

	// Nothing new: a sweep writes nothing.
	rep, _ = e.f.Sweep(ctx, SweepOptions{})
	if again, _ := e.st.GetRun(ctx, run.FleetRunID); again.Version != got.Version || rep.Events != 0 {
		t.Fatalf("an idle sweep wrote: %+v (report %+v)", again, rep)
	}

	code := 0
	host.AppendOutput(run.ChildRunID, "bye\n")
	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &code, "")
	rep, err = e.f.Sweep(ctx, SweepOptions{})
	if err != nil || rep.Drained != 1 || rep.Events != 2 {
		t.Fatalf("final sweep = %+v, %v", rep, err)
	}
	sameEvents(t, mirrored(t, e.st, run.FleetRunID), host.Events(run.ChildRunID))
	got, _ = e.st.GetRun(ctx, run.FleetRunID)
	if got.Status != hostproto.StatusSucceeded || !got.Drained || got.EventCursor != 9 || got.EndedAt == nil || liveIDs(t, e.st)[run.FleetRunID] {
		t.Fatalf("after the end: %+v", got)
	}
	var last hostproto.StateChange
	all := mirrored(t, e.st, run.FleetRunID)
	json.Unmarshal(all[len(all)-1].Data, &last)
	if all[len(all)-1].Type != hostproto.EventState || last.Status != hostproto.StatusSucceeded {
		t.Fatalf("the final event mirrored is %+v", all[len(all)-1])
	}
	if rep, _ := e.f.Sweep(ctx, SweepOptions{}); rep.Live != 0 {
		t.Fatalf("a drained run is still swept: %+v", rep)
	}
}

func TestReadersNeverSeePastTheCursor(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	if _, err := e.f.Sweep(ctx, SweepOptions{}); err != nil {
		t.Fatal(err)
	}
	run, _ = e.st.GetRun(ctx, run.FleetRunID)
	// A put that a crash left half done: events 3 and 5 stored, 2 and 4 not, cursor at 1.
	ts := e.clk.Now()
	for _, seq := range []int64{3, 5} {
		if err := e.st.PutEvents(ctx, []store.Event{{FleetRunID: run.FleetRunID, Sequence: seq, Type: "output", Data: json.RawMessage(`"x"`), TS: ts}}); err != nil {
			t.Fatal(err)
		}
	}
	page, err := e.f.Events(ctx, caller("alice"), run.FleetRunID, 0, 0)
	if err != nil || len(page.Events) != 1 || page.Events[0].Sequence != 1 || page.NextCursor != 1 || page.HasMore {
		t.Fatalf("page = %+v, %v", page, err)
	}
	if page, _ := e.f.Events(ctx, caller("alice"), run.FleetRunID, 1, 0); len(page.Events) != 0 || page.NextCursor != 1 {
		t.Fatalf("after the cursor: %+v", page)
	}
}

func TestEventsPagesAndScopes(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	for i := 0; i < 9; i++ {
		host.AppendOutput(run.ChildRunID, "x")
	}
	e.f.Sweep(ctx, SweepOptions{})
	var seqs []int64
	after := int64(0)
	for {
		page, err := e.f.Events(ctx, caller("alice"), run.FleetRunID, after, 4)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page.Events {
			seqs = append(seqs, ev.Sequence)
		}
		after = page.NextCursor
		if !page.HasMore {
			break
		}
	}
	if fmt.Sprint(seqs) != "[1 2 3 4 5 6 7 8 9 10]" {
		t.Fatalf("paged %v", seqs)
	}
	if _, err := e.f.Events(ctx, caller("bob"), run.FleetRunID, 0, 0); !isKind(err, KindNotFound) {
		t.Fatalf("another owner: %v", err)
	}
	if _, err := e.f.Events(ctx, caller("alice", "h2"), run.FleetRunID, 0, 0); !isKind(err, KindForbidden) || !strings.Contains(err.Error(), `"h1"`) {
		t.Fatalf("host out of scope: %v", err)
	}
}

func TestSweepMarksARunItsHostDeniesLostAndLogsIt(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	logs := &syncbuf.Buffer{}
	e.f.log = newJSONLogger(logs)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.Forget(run.ChildRunID)
	rep, err := e.f.Sweep(ctx, SweepOptions{})
	if err != nil || rep.Lost != 1 {
		t.Fatalf("sweep = %+v, %v", rep, err)
	}
	got, _ := e.st.GetRun(ctx, run.FleetRunID)
	if got.Status != store.StatusLost || got.Reason != hostproto.CodeRunNotFound || got.Live() {
		t.Fatalf("run = %+v", got)
	}
	if !strings.Contains(logs.String(), `"level":"ERROR","msg":"run lost: its host denies it"`) || !strings.Contains(logs.String(), run.FleetRunID) {
		t.Fatalf("no loud log line: %s", logs.String())
	}
}

func TestSweepLeavesRunsOfAnUnreachableHostLive(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	a, b := dispatched(t, e, "alice"), dispatched(t, e, "alice")
	host.Close()
	rep, err := e.f.Sweep(ctx, SweepOptions{Concurrency: 1})
	if err != nil || rep.Unreachable != 2 || rep.Lost != 0 {
		t.Fatalf("sweep = %+v, %v", rep, err)
	}
	live := liveIDs(t, e.st)
	if !live[a.FleetRunID] || !live[b.FleetRunID] {
		t.Fatalf("live = %v", live)
	}
}

func TestSweepResolvesDispatchesPastTheirDeadline(t *testing.T) {
	e := newTestEnv(t, 200*time.Millisecond)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	host.FaultStarts(fakehost.DieAfterAccept, 1)
	known, err := e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil || known.Run.Status != store.StatusDispatching {
		t.Fatalf("dispatch = %+v, %v", known, err)
	}
	host.FaultStarts(fakehost.HangBeforeAccept, 1)
	unknown, err := e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil || unknown.Run.Status != store.StatusDispatching {
		t.Fatalf("dispatch = %+v, %v", unknown, err)
	}

	// Before the deadline both are in flight.
	if rep, _ := e.f.Sweep(ctx, SweepOptions{}); rep.InFlight != 2 {
		t.Fatalf("before the deadline: %+v", rep)
	}
	e.clk.Advance(time.Second)
	rep, _ := e.f.Sweep(ctx, SweepOptions{})
	if rep.Recovered != 1 || rep.InFlight != 1 {
		t.Fatalf("past the deadline: %+v", rep)
	}
	got, _ := e.st.GetRun(ctx, known.Run.FleetRunID)
	if got.Status != hostproto.StatusPending || got.ChildRunID == "" || got.EventCursor != 1 {
		t.Fatalf("the run the host knows: %+v", got)
	}
	e.clk.Advance(LostGrace)
	rep, _ = e.f.Sweep(ctx, SweepOptions{})
	got, _ = e.st.GetRun(ctx, unknown.Run.FleetRunID)
	if rep.Recovered != 1 || rep.Drained != 1 || got.Status != hostproto.StatusFailed || got.Reason != store.ReasonDispatchLost || got.Live() {
		t.Fatalf("a minute past: %+v, run %+v", rep, got)
	}
}

func TestSweepStopsAtItsBudgetAndTheNextOneContinues(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	var runs []store.Run
	for i := 0; i < 5; i++ {
		r := dispatched(t, e, "alice")
		host.AppendOutput(r.ChildRunID, "x")
		runs = append(runs, r)
	}
	rep, err := e.f.Sweep(ctx, SweepOptions{Until: e.clk.Now()})
	if err != nil || !rep.BudgetExhausted || rep.Events != 0 {
		t.Fatalf("a spent budget: %+v, %v", rep, err)
	}
	rep, err = e.f.Sweep(ctx, SweepOptions{Until: e.clk.Now().Add(time.Minute)})
	if err != nil || rep.BudgetExhausted || rep.Current != 5 || rep.Events != 10 {
		t.Fatalf("the next sweep: %+v, %v", rep, err)
	}
}

// failedAndDrained dispatches a run for alice, has its host end it failed
// (exit 1), and sweeps once: the run comes back drained, as stored.
func failedAndDrained(t *testing.T, e *testEnv, host *fakehost.Host) store.Run {
	t.Helper()
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	one := 1
	host.SetRun(run.ChildRunID, hostproto.StatusFailed, &one, "")
	if rep, err := e.f.Sweep(ctx, SweepOptions{}); err != nil || rep.Drained != 1 {
		t.Fatalf("sweep = %+v, %v; want the failed run drained", rep, err)
	}
	got, err := e.st.GetRun(ctx, run.FleetRunID)
	if err != nil || !got.Drained {
		t.Fatalf("not drained: %+v, %v", got, err)
	}
	return got
}

func TestRetryAfterTheEndMirrorsTheNextAttemptOnTheSameSequence(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := failedAndDrained(t, e, host)

	res, err := e.f.Retry(ctx, caller("alice"), run.FleetRunID)
	if err != nil || res.Outcome.Accepted != hostproto.Accepted || res.Run.Attempt != 2 || res.Run.Status != hostproto.StatusPending ||
		res.Run.Drained || res.Run.EndedAt != nil || !liveIDs(t, e.st)[run.FleetRunID] {
		t.Fatalf("retry = %+v, %v", res, err)
	}
	host.AppendOutput(run.ChildRunID, "second try\n")
	zero := 0
	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &zero, "")
	e.f.Sweep(ctx, SweepOptions{})
	sameEvents(t, mirrored(t, e.st, run.FleetRunID), host.Events(run.ChildRunID))
	got, _ := e.st.GetRun(ctx, run.FleetRunID)
	if got.Attempt != 2 || got.Status != hostproto.StatusSucceeded || !got.Drained || got.EventCursor != 5 {
		t.Fatalf("after attempt 2: %+v", got)
	}
}

func TestUnknownRetryPutsTheRunBackInTheLiveIndex(t *testing.T) {
	e := newTestEnv(t, 200*time.Millisecond)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.SetRun(run.ChildRunID, hostproto.StatusCanceled, nil, hostproto.ReasonCanceled)
	e.f.Sweep(ctx, SweepOptions{})
	host.FaultVerbs(fakehost.VerbsFail)
	res, err := e.f.Retry(ctx, caller("alice"), run.FleetRunID)
	if err != nil || res.Outcome.Accepted != hostproto.Unknown || res.Outcome.HostStatus != 500 || !liveIDs(t, e.st)[run.FleetRunID] {
		t.Fatalf("retry = %+v, %v", res, err)
	}
	// The next sweep learns the retry never began and drains the run again.
	if rep, _ := e.f.Sweep(ctx, SweepOptions{}); rep.Drained != 1 || liveIDs(t, e.st)[run.FleetRunID] {
		t.Fatalf("sweep = %+v", rep)
	}
}

// A stream's pull-through (SyncRun) reads the run's state (running) and is
// slow to read its events; meanwhile the run ends and a sweep records it
// succeeded and drains it. The pull-through's record of what it read must
// not roll the run back to running.
func TestAStaleLiveStateNeverUndoesTheSameAttemptsEnd(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	host := e.addHost(t, "h1", fakehost.Config{OnRequest: func(r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/events") && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
	}})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.SetRun(run.ChildRunID, hostproto.StatusRunning, nil, "")
	host.AppendOutput(run.ChildRunID, "working\n")

	armed.Store(true)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := e.f.SyncRun(ctx, run.FleetRunID); err != nil {
			t.Error(err)
		}
	}()
	await.Recv(t, "the pull-through to read \"running\" and wait in its events read", entered)

	zero := 0
	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &zero, "")
	if rep, err := e.f.Sweep(ctx, SweepOptions{}); err != nil || rep.Drained != 1 {
		t.Fatalf("sweep = %+v, %v; want the run drained", rep, err)
	}
	close(release)
	await.Group(t, "the released pull-through to return", &wg)

	got, err := e.st.GetRun(ctx, run.FleetRunID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != hostproto.StatusSucceeded || !got.Drained || got.EndedAt == nil || liveIDs(t, e.st)[run.FleetRunID] {
		t.Fatalf("after the stale pull-through: status %s drained %v endedAt %v live %v; want succeeded, drained, ended",
			got.Status, got.Drained, got.EndedAt, liveIDs(t, e.st)[run.FleetRunID])
	}
}

// failingUpdatesAfter lets the first n UpdateRun calls through once armed,
// then fails every one, as a store fault (or the API function timing out)
// right after the host answered would.
type failingUpdatesAfter struct {
	store.Store
	armed atomic.Bool
	n     atomic.Int32
}

func (s *failingUpdatesAfter) UpdateRun(ctx context.Context, r store.Run) (store.Run, error) {
	if s.armed.Load() && s.n.Add(-1) < 0 {
		return store.Run{}, errors.New("injected: DynamoDB unavailable")
	}
	return s.Store.UpdateRun(ctx, r)
}

// retryAcceptedButUnrecorded retries run through a Fleet whose store fails
// every write after the first (the put-back into the live index): the host
// accepts and starts attempt 2, and recording its answer fails.
func retryAcceptedButUnrecorded(t *testing.T, e *testEnv, host *fakehost.Host, run store.Run) {
	t.Helper()
	faulty := &failingUpdatesAfter{Store: e.st}
	faulty.n.Store(1)
	f := e.fleetOver(t, faulty)
	faulty.armed.Store(true)
	_, err := f.Retry(context.Background(), caller("alice"), run.FleetRunID)
	faulty.armed.Store(false)
	if err == nil || !strings.Contains(err.Error(), "recording the host's answer") {
		t.Fatalf("retry whose answer cannot be recorded = %v, want the store's failure", err)
	}
	if hr, _ := host.Run(run.ChildRunID); hr.Attempt != 2 {
		t.Fatalf("host run = %+v; want the retry accepted (attempt 2)", hr)
	}
}

// A retry of a drained run that the host accepts, but whose answer Fleet
// fails to record, is still learnt: the run went back in the live index
// before the host was called, so the sweep finds attempt 2 and mirrors it.
func TestARetryTheHostAcceptedIsLearntThoughItsRecordFailed(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	alice := caller("alice")
	run := failedAndDrained(t, e, host)
	retryAcceptedButUnrecorded(t, e, host, run)
	host.SetRun(run.ChildRunID, hostproto.StatusRunning, nil, "")
	host.AppendOutput(run.ChildRunID, "attempt 2 output\n")

	if rep, err := e.f.Sweep(ctx, SweepOptions{}); err != nil || rep.Current != 1 {
		t.Fatalf("sweep = %+v, %v; want the run synced", rep, err)
	}
	got, err := e.f.Run(ctx, alice, run.FleetRunID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Run.Attempt != 2 || got.Run.Status != hostproto.StatusRunning || got.Run.Drained {
		t.Fatalf("Fleet says attempt %d %s (drained %v); the host runs attempt 2", got.Run.Attempt, got.Run.Status, got.Run.Drained)
	}
	sameEvents(t, mirrored(t, e.st, run.FleetRunID), host.Events(run.ChildRunID))
}

// staleFirstRead answers the first GetRun of the run with a snapshot taken
// before, as a read racing another request's write would have seen it.
type staleFirstRead struct {
	store.Store
	snapshot store.Run
	served   atomic.Bool
}

func (s *staleFirstRead) GetRun(ctx context.Context, id string) (store.Run, error) {
	if id == s.snapshot.FleetRunID && s.served.CompareAndSwap(false, true) {
		return s.snapshot, nil
	}
	return s.Store.GetRun(ctx, id)
}

// Two retries of one drained run, close together: A's is accepted (attempt
// 2 runs) but its answer goes unrecorded; B, which read the run still
// drained, is refused not_retryable. B must not drain the run again: the
// host's live attempt is the one the sweep has to find.
func TestARetryRefusedAsNotRetryableNeverHidesTheLiveAttempt(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	alice := caller("alice")
	drained := failedAndDrained(t, e, host)
	retryAcceptedButUnrecorded(t, e, host, drained) // A

	fb := e.fleetOver(t, &staleFirstRead{Store: e.st, snapshot: drained})
	res, err := fb.Retry(ctx, alice, drained.FleetRunID)
	if err != nil || res.Outcome.Accepted != hostproto.Refused || res.Outcome.Code != hostproto.CodeNotRetryable {
		t.Fatalf("retry B = %+v, %v; want refused not_retryable", res, err)
	}
	if !liveIDs(t, e.st)[drained.FleetRunID] {
		t.Fatal("retry B drained the run while the host runs attempt 2")
	}
	e.f.Sweep(ctx, SweepOptions{})
	if got, _ := e.st.GetRun(ctx, drained.FleetRunID); got.Attempt != 2 || got.Drained {
		t.Fatalf("after a sweep: attempt %d %s drained %v; want attempt 2 found", got.Attempt, got.Status, got.Drained)
	}
}

// A retry the host certainly refuses (here: it no longer knows the run)
// leaves the run as it was: drained, its status kept, and never taken for
// lost by a later sweep.
func TestARefusedRetryLeavesTheRunDrained(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := failedAndDrained(t, e, host)
	host.Forget(run.ChildRunID) // purged past the host's retention
	res, err := e.f.Retry(ctx, caller("alice"), run.FleetRunID)
	if err != nil || res.Outcome.Accepted != hostproto.Refused || res.Outcome.HostStatus != 404 {
		t.Fatalf("retry = %+v, %v; want refused with the host's 404", res, err)
	}
	if live := liveIDs(t, e.st); live[run.FleetRunID] {
		t.Fatal("the refused retry left the run in the live index")
	}
	e.f.Sweep(ctx, SweepOptions{})
	got, _ := e.st.GetRun(ctx, run.FleetRunID)
	if got.Status != hostproto.StatusFailed || got.Attempt != 1 || !got.Drained {
		t.Fatalf("after the refused retry and a sweep: %s attempt %d drained %v; want failed, attempt 1, drained", got.Status, got.Attempt, got.Drained)
	}
}

// staleEventualReads answers an eventually consistent GetRun with a
// snapshot taken before, as a DynamoDB replica that has not caught up would.
type staleEventualReads struct {
	store.Store
	snapshot store.Run
}

func (s *staleEventualReads) GetRun(ctx context.Context, id string) (store.Run, error) {
	if store.AllowsEventualRead(ctx) && id == s.snapshot.FleetRunID {
		return s.snapshot, nil
	}
	return s.Store.GetRun(ctx, id)
}

// A stream's pull-through right after an accepted retry may read the run
// as it was, drained: before it says the run is over it reads strongly,
// and finds the retry's attempt live.
func TestSyncRunNeverEndsARunOnAStaleRead(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	drained := failedAndDrained(t, e, host)
	run := drained
	if res, err := e.f.Retry(ctx, caller("alice"), run.FleetRunID); err != nil || res.Outcome.Accepted != hostproto.Accepted {
		t.Fatalf("retry = %+v, %v", res, err)
	}
	f2 := e.fleetOver(t, &staleEventualReads{Store: e.st, snapshot: drained})
	got, err := f2.SyncRun(ctx, run.FleetRunID)
	if err != nil || got.Attempt != 2 || !got.Live() {
		t.Fatalf("SyncRun on a stale replica = attempt %d %s (live %v), %v; want attempt 2 live", got.Attempt, got.Status, got.Live(), err)
	}
}

func TestVerbsOnARunNotOnItsHostAre409(t *testing.T) {
	e := newTestEnv(t, 200*time.Millisecond)
	host := e.addHost(t, "h1", fakehost.Config{})
	host.FaultStarts(fakehost.HangBeforeAccept, 1)
	res, err := e.f.Dispatch(context.Background(), caller("alice"), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.f.Cancel(context.Background(), caller("alice"), res.Run.FleetRunID)
	if !isCode(err, CodeNotOnHost) || !strings.Contains(err.Error(), "dispatching") {
		t.Fatalf("cancel = %v", err)
	}
}

func newJSONLogger(w *syncbuf.Buffer) *slog.Logger { return slog.New(slog.NewJSONHandler(w, nil)) }

// TestASweepStartsNoHostCallPastItsBudget: with a slow host (each call
// takes 4 s on the clock), a run that needs a recovery, its state and its
// events gets the calls that start before the budget's end and no more, so
// the sweep's host work ends within a host timeout of it; the next sweep
// goes on from there.
func TestASweepStartsNoHostCallPastItsBudget(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	var (
		slow  sync.Mutex
		on    bool
		calls []string
	)
	host := e.addHost(t, "h1", fakehost.Config{OnRequest: func(r *http.Request) {
		slow.Lock()
		defer slow.Unlock()
		if on {
			calls = append(calls, fmt.Sprintf("%s %s at +%s", r.Method, r.URL.Path, e.clk.Now().Sub(t0)))
			e.clk.Advance(4 * time.Second)
		}
	}})
	ctx := context.Background()
	host.FaultStarts(fakehost.DieAfterAccept, 1)
	res, err := e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil || res.Run.Status != store.StatusDispatching {
		t.Fatalf("dispatch = %+v, %v", res, err)
	}
	e.clk.Set(t0.Add(time.Minute)) // past the dispatch's deadline
	slow.Lock()
	on = true
	slow.Unlock()

	began := e.clk.Now()
	until := began.Add(5 * time.Second)
	rep, err := e.f.Sweep(ctx, SweepOptions{Until: until})
	if err != nil || rep.Recovered != 1 || rep.Partial != 1 {
		t.Fatalf("sweep = %+v, %v", rep, err)
	}
	// The recovery at +1m0s, the state at +1m4s; the events page would
	// start at +1m8s, past the budget's end at +1m5s: not asked.
	want := "[GET /runs at +1m0s GET /runs/run-1 at +1m4s]"
	if fmt.Sprint(calls) != want || e.clk.Now().After(until.Add(e.f.HostTimeout())) {
		t.Fatalf("host calls %v, ending at +%s; want %s", calls, e.clk.Now().Sub(t0), want)
	}

	// Three live runs, one sweep's budget: the calls that start in time.
	for i := 0; i < 2; i++ {
		slow.Lock()
		on = false
		slow.Unlock()
		dispatched(t, e, "alice")
		slow.Lock()
		on = true
		slow.Unlock()
	}
	calls = nil
	until = e.clk.Now().Add(5 * time.Second)
	rep, err = e.f.Sweep(ctx, SweepOptions{Until: until, Concurrency: 1})
	if err != nil || !rep.BudgetExhausted || rep.Live != 3 {
		t.Fatalf("second sweep = %+v, %v", rep, err)
	}
	for _, c := range calls {
		if d, _ := time.ParseDuration(c[strings.LastIndex(c, "+")+1:]); !t0.Add(d).Before(until) {
			t.Fatalf("a host call started at or past the budget's end (+%s): %v", until.Sub(t0), calls)
		}
	}
	if e.clk.Now().After(until.Add(e.f.HostTimeout())) {
		t.Fatalf("the sweep's host work ended at +%s, budget end +%s", e.clk.Now().Sub(t0), until.Sub(t0))
	}

	// Unbounded, the next sweep finishes the job.
	if rep, err := e.f.Sweep(ctx, SweepOptions{}); err != nil || rep.Current != 3 || rep.BudgetExhausted {
		t.Fatalf("last sweep = %+v, %v", rep, err)
	}
	for id := range liveIDs(t, e.st) {
		r, _ := e.st.GetRun(ctx, id)
		if r.EventCursor != int64(len(host.Events(r.ChildRunID))) {
			t.Fatalf("run %s mirrored up to %d of %d events", id, r.EventCursor, len(host.Events(r.ChildRunID)))
		}
	}
}

// takingOver is e.st with another sweep taking the cursor over once the
// sweep under test reads its second page: the clock passes the first
// sweep's lease, then "another" claims it.
type takingOver struct {
	store.Store
	clk   *clock.Fake
	reads int
}

func (s *takingOver) ListLive(ctx context.Context, cur string, limit int) (store.LivePage, error) {
	s.reads++
	if s.reads == 2 {
		s.clk.Advance(DefaultSweepLease)
		if _, err := s.Store.ClaimSweepCursor(ctx, "another", s.clk.Now().Add(time.Hour)); err != nil {
			return store.LivePage{}, err
		}
	}
	return s.Store.ListLive(ctx, cur, limit)
}

// TestASweepThatLostItsLeaseStops: a sweep outliving its lease finds, at
// its next save, that another sweep took the cursor; it stops there
// without moving the cursor (neither back nor forward), and the other
// sweep's claim stands.
func TestASweepThatLostItsLeaseStops(t *testing.T) {
	e := newTestEnv(t, 5*time.Second)
	e.addHost(t, "h1", fakehost.Config{})
	var ids []string
	for range 5 {
		ids = append(ids, dispatched(t, e, "alice").FleetRunID)
	}
	st := &takingOver{Store: e.st, clk: e.clk}
	rep, err := e.fleetOver(t, st).Sweep(context.Background(), SweepOptions{PageSize: 2})
	if err != nil || !rep.LeaseLost || rep.Pages != 2 || rep.Live != 4 {
		t.Fatalf("sweep = %+v, %v", rep, err)
	}
	c, err := e.st.ClaimSweepCursor(context.Background(), "another", e.clk.Now().Add(time.Hour))
	if err != nil || c.Holder != "another" || c.Lap != 1 || c.After != sortedIDs(ids)[1] {
		t.Fatalf("the cursor after the takeover: %+v, %v (want it where the first sweep saved it, after its first page)", c, err)
	}
	// Busy while "another" holds it.
	if rep, err := e.f.Sweep(context.Background(), SweepOptions{}); err != nil || !rep.Busy || rep.Live != 0 || rep.Cursor != c.After {
		t.Fatalf("a sweep while another holds the cursor: %+v, %v", rep, err)
	}
}

func sortedIDs(ids []string) []string {
	out := append([]string(nil), ids...)
	slices.Sort(out)
	return out
}
