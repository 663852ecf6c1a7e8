package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// sweep runs the scheduled sweep handler, as the sweep function's Lambda
// invocation does (a minute's deadline).
func (s *stack) sweep(t testing.TB) fleet.SweepReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := s.app.Jobs.Sweep(ctx, events.EventBridgeEvent{DetailType: "Scheduled Event", Source: "aws.scheduler"})
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	return rep
}

// fleetOn is a second Fleet over the stack's credentials and clock, on st
// (the stack's store wrapped by a test).
func (s *stack) fleetOn(t testing.TB, st store.Store) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(fleet.Config{Store: st, Credentials: s.app.Credentials, Clock: s.clk, DialContext: dialLoopbackOnly,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// interrupting is the stack's store with a sweep interrupted midway: on
// the n-th PutEvents it writes the first half of the batch (all of it with
// whole) and then calls stop.
type interrupting struct {
	store.Store
	n     int
	whole bool
	stop  func()

	mu   sync.Mutex
	puts int
}

func (s *interrupting) PutEvents(ctx context.Context, evs []store.Event) error {
	s.mu.Lock()
	s.puts++
	hit := s.puts == s.n
	s.mu.Unlock()
	if !hit {
		return s.Store.PutEvents(ctx, evs)
	}
	if !s.whole {
		evs = evs[:len(evs)/2]
	}
	if err := s.Store.PutEvents(ctx, evs); err != nil {
		return err
	}
	s.stop()
	if s.whole {
		return nil
	}
	return errors.New("interrupted after half a batch")
}

// allEvents pages GET /fleet/runs/{id}/events to the end.
func (s *stack) allEvents(t testing.TB, token, id string) []hostproto.Event {
	t.Helper()
	var out []hostproto.Event
	after := int64(0)
	for {
		a := s.must(t, http.StatusOK, "GET", fmt.Sprintf("/fleet/runs/%s/events?after=%d&limit=7", id, after), token, "")
		var page struct {
			Events     []hostproto.Event `json:"events"`
			NextCursor int64             `json:"nextCursor"`
			HasMore    bool              `json:"hasMore"`
		}
		if err := json.Unmarshal([]byte(a.raw), &page); err != nil {
			t.Fatal(err)
		}
		out = append(out, page.Events...)
		after = page.NextCursor
		if !page.HasMore {
			return out
		}
	}
}

// sameAsHost checks that the mirror holds every host event exactly once,
// in order, as the host recorded it.
func sameAsHost(t testing.TB, mirror, host []hostproto.Event) {
	t.Helper()
	if len(mirror) != len(host) {
		t.Fatalf("the mirror has %d events, the host %d", len(mirror), len(host))
	}
	for i := range host {
		m, h := mirror[i], host[i]
		if m.Sequence != h.Sequence || m.Type != h.Type || string(m.Data) != string(h.Data) || !m.TS.Equal(h.TS) {
			t.Fatalf("event %d: mirror %+v, host %+v", i, m, h)
		}
	}
}

func (s *stack) live(t testing.TB) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	cur := ""
	for {
		p, err := s.app.Store.ListLive(context.Background(), cur, 0)
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

// TestARunFollowedPurelyBySweeps dispatches a run and follows it to its end
// with sweeps alone, two of them interrupted midway (a crash in the middle
// of a batch of event writes; the budget spent between pages), then
// retries it: every host event is in the mirror exactly once, in order,
// attempt 2 on the same sequence.
func TestARunFollowedPurelyBySweeps(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { followedBySweeps(t, kind) })
	}
}

func followedBySweeps(t *testing.T, kind string) {
	s := newStack(t, kind, stackOptions{})
	host := s.addHost(t, "h1", fakehost.Config{MaxEventPage: 5}, nil)
	s.probe(t, "h1")
	alice := s.mint(t, "alice", "*", "*")
	a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell","prompt":"make test"}`)
	id, child := a.str("fleetRunId"), a.str("childRunId")
	host.SetRun(child, hostproto.StatusRunning, nil, "")
	for i := 0; i < 30; i++ {
		host.AppendOutput(child, fmt.Sprintf("line %02d\n", i))
	}
	// 32 events on the host, in pages of 5.

	// Sweep 1 crashes in the middle of its third batch of writes.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	crash := &interrupting{Store: s.app.Store, n: 3, stop: cancel}
	s.fleetOn(t, crash).Sweep(ctx, fleet.SweepOptions{})
	run, err := s.app.Store.GetRun(context.Background(), id)
	if err != nil || run.EventCursor != 10 {
		t.Fatalf("after the crash: cursor %d, %v; want the two whole pages recorded", run.EventCursor, err)
	}
	if got := s.allEvents(t, alice, id); len(got) != 10 {
		t.Fatalf("readers see %d events past a crash, want the 10 up to the cursor", len(got))
	}

	// Sweep 2 runs out of budget after two more batches.
	spend := &interrupting{Store: s.app.Store, n: 2, whole: true, stop: func() { s.clk.Advance(time.Hour) }}
	rep, err := s.fleetOn(t, spend).Sweep(context.Background(), fleet.SweepOptions{Until: s.clk.Now().Add(time.Minute)})
	if err != nil || rep.Partial != 1 {
		t.Fatalf("budget sweep = %+v, %v", rep, err)
	}
	if run, _ = s.app.Store.GetRun(context.Background(), id); run.EventCursor != 20 {
		t.Fatalf("after the budget ran out: cursor %d, want 20", run.EventCursor)
	}

	// The scheduled sweep finishes the job.
	if rep := s.sweep(t); rep.Current != 1 || rep.Events != 12 {
		t.Fatalf("third sweep = %+v", rep)
	}
	sameAsHost(t, s.allEvents(t, alice, id), host.Events(child))

	// The run ends; the next sweep mirrors the final event and drains it.
	host.AppendOutput(child, "all tests passed\n")
	zero := 0
	host.SetRun(child, hostproto.StatusSucceeded, &zero, "")
	if rep := s.sweep(t); rep.Drained != 1 {
		t.Fatalf("final sweep = %+v", rep)
	}
	sameAsHost(t, s.allEvents(t, alice, id), host.Events(child))
	got := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id, alice, "")
	if r := got.body["run"].(map[string]any); r["status"] != "succeeded" || r["endedAt"] == nil {
		t.Fatalf("run %s", got.raw)
	}
	if s.live(t)[id] {
		t.Fatal("a drained run is still in the live index")
	}
	if rep := s.sweep(t); rep.Live != 0 {
		t.Fatalf("a sweep after the end read %d live runs", rep.Live)
	}

	// A retry after the end: attempt 2 on the same sequence.
	firstEnd := len(host.Events(child))
	r := s.must(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/retry", alice, "")
	if r.body["accepted"] != true || r.body["run"].(map[string]any)["attempt"] != 2.0 || r.body["run"].(map[string]any)["status"] != "pending" {
		t.Fatalf("retry %s", r.raw)
	}
	if !s.live(t)[id] {
		t.Fatal("an accepted retry did not make the run live again")
	}
	host.SetRun(child, hostproto.StatusRunning, nil, "")
	host.AppendOutput(child, "second attempt\n")
	one := 1
	host.SetRun(child, hostproto.StatusFailed, &one, "")
	if rep := s.sweep(t); rep.Drained != 1 {
		t.Fatalf("sweep after the retry = %+v", rep)
	}
	mirror := s.allEvents(t, alice, id)
	sameAsHost(t, mirror, host.Events(child))
	var st hostproto.StateChange
	json.Unmarshal(mirror[firstEnd].Data, &st)
	if mirror[firstEnd].Sequence != int64(firstEnd+1) || st.Attempt != 2 || st.Status != hostproto.StatusPending {
		t.Fatalf("attempt 2 starts with %+v", mirror[firstEnd])
	}
	if s.live(t)[id] {
		t.Fatal("attempt 2 ended but the run is still live")
	}
}

// TestSweepResolvesDispatchingRunsAndLostOnes: a dispatching run past its
// deadline is resolved from the host when the host knows it, failed
// dispatch_lost when it does not; a run its host denies is lost.
func TestSweepResolvesDispatchingRunsAndLostOnes(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{hostTimeout: 300 * time.Millisecond})
			host := s.addHost(t, "h1", fakehost.Config{}, nil)
			s.probe(t, "h1")
			alice := s.mint(t, "alice", "*", "*")

			host.FaultStarts(fakehost.DieAfterAccept, 1)
			known := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			host.FaultStarts(fakehost.HangBeforeAccept, 1)
			unknown := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			normal := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			if known.body["pending"] != true || unknown.body["pending"] != true || normal.body["pending"] != false {
				t.Fatalf("dispatches: %s / %s / %s", known.raw, unknown.raw, normal.raw)
			}
			host.Forget(normal.str("childRunId"))

			s.clk.Advance(time.Second) // past both deadlines
			rep := s.sweep(t)
			if rep.Recovered != 1 || rep.Lost != 1 || rep.InFlight != 1 {
				t.Fatalf("first sweep = %+v", rep)
			}
			run := func(a answer) map[string]any {
				return s.must(t, http.StatusOK, "GET", "/fleet/runs/"+a.str("fleetRunId"), alice, "").body["run"].(map[string]any)
			}
			if r := run(known); r["status"] != "pending" || r["childRunId"] == nil {
				t.Fatalf("the run the host knows: %v", r)
			}
			if r := run(normal); r["status"] != "lost" || r["reason"] != hostproto.CodeRunNotFound {
				t.Fatalf("the run the host denies: %v", r)
			}
			s.clk.Advance(fleet.LostGrace)
			if rep := s.sweep(t); rep.Recovered != 1 || rep.Drained != 1 {
				t.Fatalf("a minute later = %+v", rep)
			}
			if r := run(unknown); r["status"] != "failed" || r["reason"] != store.ReasonDispatchLost {
				t.Fatalf("the run the host never received: %v", r)
			}
			live := s.live(t)
			if live[unknown.str("fleetRunId")] || live[normal.str("fleetRunId")] || !live[known.str("fleetRunId")] {
				t.Fatalf("live index %v", live)
			}
		})
	}
}

// counting is a store.Store that counts what the sweep reads.
type counting struct {
	store.Store
	mu        sync.Mutex
	liveIDs   int
	runReads  map[string]int
	listRuns  int
	eventRead int
}

func (c *counting) ListLive(ctx context.Context, cur string, limit int) (store.LivePage, error) {
	p, err := c.Store.ListLive(ctx, cur, limit)
	c.mu.Lock()
	c.liveIDs += len(p.FleetRunIDs)
	c.mu.Unlock()
	return p, err
}

func (c *counting) GetRun(ctx context.Context, id string) (store.Run, error) {
	c.mu.Lock()
	c.runReads[id]++
	c.mu.Unlock()
	return c.Store.GetRun(ctx, id)
}

func (c *counting) ListRuns(ctx context.Context, q store.RunQuery) (store.RunPage, error) {
	c.mu.Lock()
	c.listRuns++
	c.mu.Unlock()
	return c.Store.ListRuns(ctx, q)
}

func (c *counting) ListEvents(ctx context.Context, id string, after int64, limit int) (store.EventPage, error) {
	c.mu.Lock()
	c.eventRead++
	c.mu.Unlock()
	return c.Store.ListEvents(ctx, id, after, limit)
}

// seedEndedRuns writes n ended, drained runs straight into the stack's
// DynamoDB runs table, each a copy of a real one's item (written by the
// store itself) under a new id, 25 to a BatchWriteItem: seeding 10,000
// runs through CreateRun would take moto half a minute. What the sweep
// then reads is measured through the store, not through this seeding.
func seedEndedRuns(t testing.TB, s *stack, template string, n int) []string {
	t.Helper()
	if _, live := getItem(t, s.app.Config.Tables.Runs, "fleetRunId", template)["live"]; live {
		t.Fatal("the template run is live")
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("fr-seeded-%05d", i)
	}
	copyRuns(t, s, template, ids, nil)
	return ids
}

// TestASweepReadsOnlyTheLiveRuns: of 10,000 runs, 50 live; one sweep reads
// 50 ids from the live index and those 50 runs, nothing else, at the price
// of those reads.
func TestASweepReadsOnlyTheLiveRuns(t *testing.T) {
	const total, liveRuns = 10000, 50
	meter := &dynamostore.Meter{}
	s := newStack(t, "dynamodb", stackOptions{meter: meter})
	host := s.addHost(t, "h1", fakehost.Config{}, nil)
	s.probe(t, "h1")
	alice := s.mint(t, "alice", "*", "*")

	ended := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
	zero := 0
	host.SetRun(ended.str("childRunId"), hostproto.StatusSucceeded, &zero, "")
	s.sweep(t)
	begun := time.Now()
	seedEndedRuns(t, s, ended.str("fleetRunId"), total-liveRuns-1)
	t.Logf("seeded %d ended runs in %s", total-liveRuns-1, time.Since(begun).Round(time.Millisecond))
	live := map[string]bool{}
	for i := 0; i < liveRuns; i++ {
		live[s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`).str("fleetRunId")] = true
	}
	s.sweep(t) // mirror their first events, so the measured sweep is a steady one

	c := &counting{Store: s.app.Store, runReads: map[string]int{}}
	meter.Reset()
	rep, err := s.fleetOn(t, c).Sweep(context.Background(), fleet.SweepOptions{})
	if err != nil || rep.Live != liveRuns || rep.Current != liveRuns {
		t.Fatalf("sweep = %+v, %v", rep, err)
	}
	u := meter.Snapshot()
	t.Logf("one sweep of %d live runs among %d: %s", liveRuns, total, u)
	if c.liveIDs != liveRuns || len(c.runReads) != liveRuns || c.listRuns != 0 || c.eventRead != 0 {
		t.Fatalf("the sweep read %d live ids, %d runs, %d run listings, %d event pages", c.liveIDs, len(c.runReads), c.listRuns, c.eventRead)
	}
	for id, n := range c.runReads {
		if !live[id] || n != 1 {
			t.Fatalf("the sweep read run %s %d times (live: %v)", id, n, live[id])
		}
	}
	// 50 eventually consistent reads of ~0.4 KB runs (0.5 each), one page of
	// the live index, one host read: no scan of the runs table, nothing
	// that grows with the 9,950 ended runs. The only writes are the
	// cursor's: its claim and its release (1 WCU each).
	if u.Calls["Scan"] != 0 || u.RCU["runs"] > liveRuns*0.5 || u.RCU["runs/live"] > 1 ||
		u.TotalWCU() != 2 || u.WCU["idempotency"] != 2 || u.RCU["idempotency"] != 0 {
		t.Fatalf("sweep capacity: %s", u)
	}
	var n int
	for id := range live {
		if s.live(t)[id] {
			n++
		}
	}
	if n != liveRuns || len(s.live(t)) != liveRuns {
		t.Fatalf("live index holds %d runs, %d of them ours", len(s.live(t)), n)
	}
}

// TestAnOversizedEventIsMirroredTruncated: a host sending an event of
// 500 KB (over DynamoDB's 400 KB item limit, on which the sweep's put
// failed every time) has it mirrored cut to 32 KiB with a marker, on both
// stores; the events after it and the run's end follow.
func TestAnOversizedEventIsMirroredTruncated(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host, alice, id, child := s.aliceRun(t)
			host.AppendOutput(child, strings.Repeat("x", 500<<10))
			host.AppendOutput(child, "after the big one\n")
			zero := 0
			host.SetRun(child, hostproto.StatusSucceeded, &zero, "")
			if rep := s.sweep(t); rep.Drained != 1 || rep.Failed != 0 {
				t.Fatalf("sweep = %+v", rep)
			}
			mirror := s.allEvents(t, alice, id)
			if len(mirror) != 4 {
				t.Fatalf("mirrored %d events, want 4", len(mirror))
			}
			var big string
			json.Unmarshal(mirror[1].Data, &big)
			if len(mirror[1].Data) > hostproto.MaxEventData || !strings.HasPrefix(big, "xxxx") ||
				!strings.Contains(big, "bytes of this event were cut: event data is at most 32 KiB") {
				t.Fatalf("the big event: %d bytes, ends %q", len(mirror[1].Data), big[max(0, len(big)-100):])
			}
			sameAsHost(t, mirror[2:], host.Events(child)[2:])
		})
	}
}

// TestARetriedRunsEarlyEventsLastAsLongAsIt: a run ends, is retried 29
// days later (a day before it would expire), and its second attempt runs
// past the day its first events were first due to expire: on both stores,
// every event stays readable through the API while the run exists.
func TestARetriedRunsEarlyEventsLastAsLongAsIt(t *testing.T) {
	const day = 24 * time.Hour
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host, alice, id, child := s.aliceRun(t)
			host.AppendOutput(child, "attempt 1\n")
			one := 1
			host.SetRun(child, hostproto.StatusFailed, &one, "")
			s.sweep(t)

			s.clk.Advance(29 * day)
			if r := s.must(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/retry", alice, ""); r.body["accepted"] != true {
				t.Fatalf("retry %s", r.raw)
			}
			s.sweep(t)
			host.SetRun(child, hostproto.StatusRunning, nil, "")
			s.clk.Advance(11 * day) // +40 days: attempt 2 still runs
			host.AppendOutput(child, "attempt 2\n")
			s.sweep(t)
			sameAsHost(t, s.allEvents(t, alice, id), host.Events(child))

			host.SetRun(child, hostproto.StatusSucceeded, new(int), "")
			if rep := s.sweep(t); rep.Drained != 1 {
				t.Fatalf("sweep = %+v", rep)
			}
			s.clk.Advance(30*day - time.Minute) // the run's last minute
			sameAsHost(t, s.allEvents(t, alice, id), host.Events(child))
			s.clk.Advance(2 * time.Minute)
			s.must(t, http.StatusNotFound, "GET", "/fleet/runs/"+id, alice, "")
		})
	}
}

// syncHost is a runner host this file controls: it knows every run Fleet
// asks about (running, no events), checks Fleet's credential, and records
// at which sweep (and when, on the stack's clock) each run was asked for
// its state: a run synced. Seeded runs need no start on it.
type syncHost struct {
	srv *httptest.Server
	clk *clock.Fake

	mu     sync.Mutex
	sweep  int
	synced map[string][]int // run id -> the sweeps that synced it
	last   map[string]time.Time
	calls  int
}

func newSyncHost(t testing.TB, s *stack, id string) *syncHost {
	t.Helper()
	h := &syncHost{clk: s.clk, synced: map[string][]int{}, last: map[string]time.Time{}}
	mux := http.NewServeMux()
	authorized := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer "+hostToken {
			w.WriteHeader(http.StatusUnauthorized)
			return false
		}
		h.mu.Lock()
		h.calls++
		h.mu.Unlock()
		return true
	}
	mux.HandleFunc("GET /runs/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r) {
			return
		}
		id := r.PathValue("id")
		h.mu.Lock()
		h.synced[id] = append(h.synced[id], h.sweep)
		h.last[id] = h.clk.Now()
		h.mu.Unlock()
		writeJSONAnswer(w, hostproto.Run{RunID: id, ClientToken: "ct-" + id, Status: hostproto.StatusRunning, Attempt: 1})
	})
	mux.HandleFunc("GET /runs/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r) {
			return
		}
		after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
		writeJSONAnswer(w, hostproto.EventPage{Events: []hostproto.Event{}, NextCursor: &after})
	})
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	b, _ := json.Marshal(map[string]any{"id": id, "baseUrl": h.srv.URL, "credentialRef": hostCredRef})
	s.must(t, http.StatusCreated, "POST", "/fleet/hosts", adminToken, string(b))
	return h
}

func writeJSONAnswer(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// begin marks the sweeps that follow as sweep n.
func (h *syncHost) begin(n int) {
	h.mu.Lock()
	h.sweep = n
	h.mu.Unlock()
}

// liveFleet is a stack with n live runs on a syncHost: one created through
// the store, n-1 copies of it written straight into the runs table (ids
// fr-live-00000...), none synced yet.
func liveFleet(t testing.TB, n int, meter *dynamostore.Meter) (*stack, *syncHost, []string) {
	t.Helper()
	s := newStack(t, "dynamodb", stackOptions{meter: meter})
	h := newSyncHost(t, s, "sh")
	now := s.clk.Now()
	template := store.Run{FleetRunID: "fr-live-00000", OwnerID: "alice", HostID: "sh", ChildRunID: "fr-live-00000",
		Status: hostproto.StatusRunning, Agent: "shell", Attempt: 1, CreatedAt: now, UpdatedAt: now, Deadline: now.Add(30 * time.Second)}
	if err := s.app.Store.CreateRun(context.Background(), template); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n-1)
	for i := range ids {
		ids[i] = fmt.Sprintf("fr-live-%05d", i+1)
	}
	begun := time.Now()
	copyRuns(t, s, template.FleetRunID, ids, func(item map[string]types.AttributeValue, id string) {
		item["childRunId"] = &types.AttributeValueMemberS{Value: id}
	})
	t.Logf("seeded %d live runs in %s", n-1, time.Since(begun).Round(time.Millisecond))
	return s, h, append([]string{template.FleetRunID}, ids...)
}

// copyRuns writes a copy of the template run's item under each id (its
// creation time kept, so the index order follows the ids) at batch speed,
// edit adjusting each copy.
func copyRuns(t testing.TB, s *stack, template string, ids []string, edit func(item map[string]types.AttributeValue, id string)) {
	t.Helper()
	table := s.app.Config.Tables.Runs
	tmpl := getItem(t, table, "fleetRunId", template)
	prefix := strings.TrimSuffix(tmpl["createdAt"].(*types.AttributeValueMemberS).Value, template)
	items := make([]map[string]types.AttributeValue, len(ids))
	for i, id := range ids {
		item := maps.Clone(tmpl)
		item["fleetRunId"] = &types.AttributeValueMemberS{Value: id}
		item["createdAt"] = &types.AttributeValueMemberS{Value: prefix + id}
		if edit != nil {
			edit(item, id)
		}
		items[i] = item
	}
	batchPut(t, table, items)
}

// coverage is what a series of sweeps did to every run: the sweeps that
// synced it, checked against the bound.
type coverage struct {
	sweeps  int
	bound   int // N: no run goes more than N sweeps without a sync
	created map[string]int
	synced  map[string][]int
}

// check fails unless every run was synced within bound sweeps of the start
// (or of its creation, plus one for a run created behind the cursor), and
// again within bound sweeps of each sync, to the last sweep.
func (c coverage) check(t testing.TB, ids []string) int {
	t.Helper()
	worst, worstID := 0, ""
	for _, id := range ids {
		prev, bound := c.created[id], c.bound
		if prev > 0 {
			bound++ // created after sweep prev, maybe behind the cursor
		}
		for _, at := range append(append([]int(nil), c.synced[id]...), c.sweeps+1) {
			gap := at - prev
			if at == c.sweeps+1 && gap <= bound {
				break // not due yet
			}
			if gap > bound {
				t.Fatalf("run %s: synced at sweeps %v (created after sweep %d): a gap of %d sweeps, over the bound %d",
					id, c.synced[id], c.created[id], gap, bound)
			}
			if gap > worst {
				worst, worstID = gap, id
			}
			prev = at
		}
	}
	t.Logf("%d runs over %d sweeps: the longest gap between syncs is %d sweeps (run %s), the bound %d", len(ids), c.sweeps, worst, worstID, c.bound)
	return worst
}

// TestASweepReachesEveryLiveRunWithinNSweeps: 2,000 live runs, a budget of
// 300 runs per sweep: N = ceil(2000/300) = 7 (sweepReach). The 20,000-run
// proof is BenchmarkSweepReach.
func TestASweepReachesEveryLiveRunWithinNSweeps(t *testing.T) {
	r := sweepReach(t, 2000, 300)
	t.Logf("%d sweeps of %d runs each in %s: %.3f RCU, %.3f WCU per run synced", r.sweeps, r.perSweep, r.took.Round(time.Millisecond), r.rcu, r.wcu)
}

// reach is what sweepReach measured.
type reach struct {
	sweeps, perSweep, bound, worstGap int
	rcu, wcu                          float64 // per run synced
	maxLag, maxTruth                  float64 // seconds, after the first lap
	took                              time.Duration
}

// sweepReach proves the sweep's bound on live runs with a budget of
// perSweep runs per sweep: N = ceil(live/perSweep), live counting the runs
// created midway (the bound is in the most live runs at once). Over 2N+1 sweeps, a
// minute apart on the stack's clock, every run is synced within N sweeps
// of the start and of its previous sync, runs created behind the cursor
// midway within N+1; each sweep continues where the last stopped (no run
// synced twice in a sweep); the lag each sweep reports bounds the true age
// of the oldest sync once the first lap is over; and a steady sweep costs
// no more read units per run than the sweep of today (0.575 RCU,
// BenchmarkSweepCost).
func sweepReach(t testing.TB, live, perSweep int) reach {
	t.Helper()
	const late = 5 // of the live runs, created behind the cursor midway
	bound := (live + perSweep - 1) / perSweep
	meter := &dynamostore.Meter{}
	s, h, ids := liveFleet(t, live-late, meter)
	c := coverage{bound: bound, created: map[string]int{}}
	r := reach{sweeps: 2*bound + 1, perSweep: perSweep, bound: bound}
	var behind []string
	begun := time.Now()
	var rcu, wcu float64
	var syncedRuns int
	for n := 1; n <= r.sweeps; n++ {
		if n == bound/2+1 {
			// Behind the cursor (the first bound/2 sweeps reached past
			// them): ids that sort among the ones this lap synced.
			for i := range late {
				behind = append(behind, fmt.Sprintf("%s-late", ids[i*perSweep*(bound/2)/late]))
			}
			copyRuns(t, s, ids[0], behind, func(item map[string]types.AttributeValue, id string) {
				item["childRunId"] = &types.AttributeValueMemberS{Value: id}
			})
			for _, id := range behind {
				c.created[id] = n - 1
			}
		}
		s.clk.Advance(time.Minute)
		h.begin(n)
		meter.Reset()
		rep, err := s.app.Fleet.Sweep(context.Background(), fleet.SweepOptions{MaxRuns: perSweep})
		if err != nil || rep.Busy || rep.LeaseLost || rep.Current != perSweep || rep.Live != perSweep {
			t.Fatalf("sweep %d = %+v, %v", n, rep, err)
		}
		u := meter.Snapshot()
		rcu += u.TotalRCU()
		wcu += u.TotalWCU()
		syncedRuns += rep.Current
		if u.Calls["Scan"] != 0 || u.WCU["runs"] != 0 {
			t.Fatalf("sweep %d: %s", n, u)
		}
		// The lag bounds the truth: the oldest last sync among the runs,
		// once every run has been synced (after the first lap).
		if rep.Lap > 1 {
			h.mu.Lock()
			oldest := s.clk.Now()
			for _, id := range append(append([]string(nil), ids...), behind...) {
				at, ok := h.last[id]
				if !ok {
					at = s.clk.Now().Add(-time.Duration(n-c.created[id]) * time.Minute) // created since, never synced
				}
				if at.Before(oldest) {
					oldest = at
				}
			}
			h.mu.Unlock()
			truth := s.clk.Now().Sub(oldest).Seconds()
			if rep.LagSeconds < truth {
				t.Fatalf("sweep %d: lag %.0f s, but a run was last synced %.0f s ago", n, rep.LagSeconds, truth)
			}
			r.maxLag, r.maxTruth = max(r.maxLag, rep.LagSeconds), max(r.maxTruth, truth)
		}
	}
	h.mu.Lock()
	c.sweeps, c.synced = r.sweeps, h.synced
	for id, at := range h.synced {
		for i := 1; i < len(at); i++ {
			if at[i] == at[i-1] {
				t.Fatalf("run %s synced twice in sweep %d", id, at[i])
			}
		}
	}
	h.mu.Unlock()
	r.worstGap = c.check(t, append(append([]string(nil), ids...), behind...))
	r.took = time.Since(begun)
	r.rcu, r.wcu = rcu/float64(syncedRuns), wcu/float64(syncedRuns)
	if r.rcu > 0.575 {
		t.Fatalf("%.3f RCU per run synced, over today's 0.575", r.rcu)
	}
	return r
}
