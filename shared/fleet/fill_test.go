package fleet

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// testWaker keeps the wakes Fleet sends, for the test to deliver to
// FillHosts when it chooses (as the dispatcher's queue would).
type testWaker struct {
	mu    sync.Mutex
	wakes []Wake
	fail  error
}

func (w *testWaker) Wake(_ context.Context, wakes []Wake) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail != nil {
		return w.fail
	}
	w.wakes = append(w.wakes, wakes...)
	return nil
}

// take returns the wakes sent since the last take.
func (w *testWaker) take() []Wake {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.wakes
	w.wakes = nil
	return out
}

// withWaker rebuilds e's Fleet with w as its Waker.
func (e *testEnv) withWaker(t *testing.T, w Waker) {
	t.Helper()
	cfg := e.f.cfg
	cfg.Waker = w
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.f = f
}

// waitHour asks to wait up to an hour.
var waitHour = &QueueRequest{Timeout: time.Hour}

// queued dispatches a shell run of alice's that asks to wait, and checks
// it is recorded queued.
func queued(t *testing.T, e *testEnv, key string, q *QueueRequest) DispatchResult {
	t.Helper()
	req := shellRun
	req.Queue = q
	res, err := e.f.Dispatch(context.Background(), caller("alice"), req, key)
	if err != nil || res.Run.Status != store.StatusQueued || res.Run.HostID != "" || res.Run.Queue == nil {
		t.Fatalf("dispatch that waits: %+v, %v", res, err)
	}
	return res
}

// withoutRoom runs f while host offers no agent (as probed), so that a
// dispatch that waits is queued without a host call; the host offers
// shell again after, as probed.
func withoutRoom[T any](t *testing.T, e *testEnv, host *fakehost.Host, f func() T) T {
	t.Helper()
	reprobe := func() {
		if _, err := e.f.ProbeAll(context.Background(), true); err != nil {
			t.Fatal(err)
		}
	}
	host.SetAgents()
	reprobe()
	defer reprobe()
	defer host.SetAgents("shell")
	return f()
}

// stored reads a run as stored now.
func stored(t *testing.T, e *testEnv, id string) store.Run {
	t.Helper()
	r, err := e.st.GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// position reads a run's place as GET reports it.
func position(t *testing.T, e *testEnv, id string) int {
	t.Helper()
	st, err := e.f.Run(context.Background(), caller("alice"), id)
	if err != nil {
		t.Fatal(err)
	}
	return st.Position
}

// TestADispatchThatWaitsIsQueued: with its only host full, a dispatch
// without queue is refused as before, one that asks to wait is recorded
// queued on no host after the host refused it busy (a fresh token for
// its next offer, the refusal in Excluded), a second one queues behind
// it, and a retry with the same key answers the queued run.
func TestADispatchThatWaitsIsQueued(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{MaxConcurrent: 1})
	ctx := context.Background()
	if _, err := e.f.Dispatch(ctx, caller("alice"), shellRun, ""); err != nil {
		t.Fatal(err)
	}
	res, err := e.f.Dispatch(ctx, caller("alice"), shellRun, "")
	if err != nil || !res.Refused || res.Run.Reason != hostproto.ReasonHostBusy {
		t.Fatalf("a dispatch without queue on a full host: %+v, %v; want refused host_busy", res, err)
	}

	first := queued(t, e, "k1", waitHour)
	q := first.Run.Queue
	if q.Class != "shell" || !q.Since.Equal(t0) || !q.Until.Equal(t0.Add(time.Hour)) || q.Offers != 1 || first.Position != 1 ||
		first.Run.ClientToken() != first.Run.FleetRunID+".q1" || !strings.Contains(first.Note, "waits") {
		t.Fatalf("queued: %+v queue %+v position %d", first, q, first.Position)
	}
	if got := excludedHosts(first); !reflect.DeepEqual(got, []string{"h1:host_busy"}) {
		t.Errorf("excluded %v", got)
	}
	e.clk.Advance(time.Second)
	second := queued(t, e, "k2", &QueueRequest{Timeout: time.Hour})
	if second.Position != 2 || position(t, e, first.Run.FleetRunID) != 1 {
		t.Fatalf("positions: second %d, first %d", second.Position, position(t, e, first.Run.FleetRunID))
	}
	again, err := e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Run: shellRun.Run, Queue: waitHour}, "k1")
	if err != nil || !again.Reused || again.Run.FleetRunID != first.Run.FleetRunID || again.Run.Status != store.StatusQueued || again.Position != 1 {
		t.Fatalf("retry with the key: %+v, %v", again, err)
	}
	if host.Created() != 1 {
		t.Fatalf("the host created %d runs; the queued ones must not have started", host.Created())
	}

	// No host at all (none offers the agent): waits too, for a host yet to come.
	claude := DispatchRequest{Run: runspec.Request{Agent: "claude"}, Queue: waitHour}
	res, err = e.f.Dispatch(ctx, caller("alice"), claude, "")
	if err != nil || res.Run.Status != store.StatusQueued || res.Run.Queue.Offers != 0 || res.Position != 1 {
		t.Fatalf("no eligible host: %+v, %v", res, err)
	}
	claude.Queue = nil
	if _, err := e.f.Dispatch(ctx, caller("alice"), claude, ""); !isCode(err, CodeNoEligibleHost) {
		t.Fatalf("without queue: %v, want 409 %s", err, CodeNoEligibleHost)
	}
}

// TestFillHostsStartsTheQueueInOrderOnceEach: a run ending on the host
// wakes it (once the sweep records the end); each wake starts the next
// waiting run, best first, with its token and its wait in the start, and
// no run twice.
func TestFillHostsStartsTheQueueInOrderOnceEach(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	w := &testWaker{}
	e.withWaker(t, w)
	host := e.addHost(t, "h1", fakehost.Config{MaxConcurrent: 1})
	ctx := context.Background()
	busy, err := e.f.Dispatch(ctx, caller("alice"), shellRun, "")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 3 {
		e.clk.Advance(time.Second)
		ids = append(ids, queued(t, e, "", waitHour).Run.FleetRunID)
	}
	if ws := w.take(); len(ws) != 0 {
		t.Fatalf("wakes before any run ended: %+v", ws)
	}
	child := busy.Run.ChildRunID
	for i, id := range ids {
		host.SetRun(child, hostproto.StatusSucceeded, new(int), "")
		if _, err := e.f.Sweep(ctx, SweepOptions{}); err != nil {
			t.Fatal(err)
		}
		wakes := w.take()
		if !reflect.DeepEqual(wakes, []Wake{{HostID: "h1", Slots: 1, Reason: WakeRunEnded}}) {
			t.Fatalf("after run %d ended: wakes %+v", i, wakes)
		}
		rep, err := e.f.FillHosts(ctx, wakes)
		if err != nil || !reflect.DeepEqual(rep.Started, []string{id}) || rep.Offered != 1 {
			t.Fatalf("fill %d: %+v, %v; want %s started", i, rep, err, id)
		}
		r := stored(t, e, id)
		if r.Status != hostproto.StatusPending || r.HostID != "h1" || r.Queue.StartedAt == nil || r.Queue.StartedOn != "h1" || r.Queue.Request != nil {
			t.Fatalf("started run: %+v queue %+v", r, r.Queue)
		}
		starts := host.Starts()
		st := starts[len(starts)-1]
		if st.ClientToken != id+".q1" || st.Queued == nil || st.Queued.HostID != "h1" || st.Queued.Offers != 1 ||
			!st.Queued.Since.Equal(r.Queue.Since) {
			t.Fatalf("start %d: token %s queued %+v", i, st.ClientToken, st.Queued)
		}
		for j, rest := range ids[i+1:] {
			if p := position(t, e, rest); p != j+1 {
				t.Errorf("after %d started: %s at position %d, want %d", i+1, rest, p, j+1)
			}
		}
		child = r.ChildRunID
	}
	if host.Created() != 4 {
		t.Fatalf("the host created %d runs, want 4 (each once)", host.Created())
	}
	// Nothing waits now: a wake finds nothing to start.
	if rep, err := e.f.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}}); err != nil || rep.Offered != 0 {
		t.Fatalf("fill with nothing waiting: %+v, %v", rep, err)
	}
}

// TestFillHostsRacingForOneRunStartItOnce: two dispatchers fill the same
// host at once for the one waiting run. The second reads the run while
// the first's start is on its way, before the offer's deadline, and leaves
// the offer to the first (which may yet move it past a refusal): it calls
// no host, and the host creates the run once; and a dispatcher that read
// the run queued before the other offered it loses the versioned offer
// and calls no host.
func TestFillHostsRacingForOneRunStartItOnce(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	arrived, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	host := e.addHost(t, "h1", fakehost.Config{OnRequest: func(r *http.Request) {
		// The first start once armed waits for release; the others pass.
		if r.Method == http.MethodPost && r.URL.Path == "/runs" && armed.CompareAndSwap(true, false) {
			close(arrived)
			<-release
		}
	}})
	host.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
	id := queued(t, e, "", waitHour).Run.FleetRunID
	host.RefuseStarts(0, "")
	waiting := stored(t, e, id)
	armed.Store(true)

	ctx := context.Background()
	wake := []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}}
	var wg sync.WaitGroup
	var first FillReport
	wg.Add(1)
	go func() {
		defer wg.Done()
		first, _ = e.f.FillHosts(ctx, wake)
	}()
	<-arrived // the first start is at the host, not yet taken

	// A dispatcher whose read of the run predates the first's offer.
	late := e.fleetOver(t, &staleEventualReads{Store: e.st, snapshot: waiting})
	rep, err := late.FillHosts(ctx, wake)
	if err != nil || rep.Offered != 0 || len(rep.Started) != 0 {
		t.Fatalf("the stale dispatcher: %+v, %v; want no start", rep, err)
	}
	// One that reads the offer in flight leaves it be.
	second, err := e.f.FillHosts(ctx, wake)
	if err != nil || second.Resumed != 0 || second.Offered != 0 || host.StartCalls() != 1 { // the refusal; the first's start is not in yet
		t.Fatalf("the second dispatcher: %+v, %v; host start calls %d", second, err, host.StartCalls())
	}
	close(release)
	await.Group(t, "the first dispatcher to finish", &wg)
	r := stored(t, e, id)
	if host.Created() != 1 || r.Status != hostproto.StatusPending || r.ChildRunID != "run-1" || r.Queue.StartedAt == nil {
		t.Fatalf("host created %d runs; stored %+v", host.Created(), r)
	}
	starts := host.Starts()
	if len(starts) != 1 || starts[0].ClientToken != id+".q1" || first.Offered != 1 {
		t.Fatalf("starts %+v, first %+v", starts, first)
	}
}

// offeredByHand writes what a dispatcher that died right after its offer
// leaves: the run dispatching on host, in the queue index, its start never
// sent.
func offeredByHand(t *testing.T, e *testEnv, id, host string) store.Run {
	t.Helper()
	r := stored(t, e, id)
	now := e.clk.Now().UTC()
	r.Status, r.HostID, r.Deadline, r.UpdatedAt = store.StatusDispatching, host, now.Add(e.f.cfg.HostTimeout), now
	out, err := e.st.UpdateRun(context.Background(), r)
	if err != nil || !out.Waiting() {
		t.Fatalf("offer: %+v, %v", out, err)
	}
	return out
}

// TestAFillReachesPastRunsOfferedElsewhere: fills of hosts that share a
// class walk the same head at once; the runs the others are offering do
// not count against a fill's bound on the runs it passes over, so it
// starts the first run still queued behind more of them than that bound.
func TestAFillReachesPastRunsOfferedElsewhere(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	h1 := e.addHost(t, "h1", fakehost.Config{})
	h2 := e.addHost(t, "h2", fakehost.Config{})
	ahead := fillScanPerSlot*1 + fillScanBase
	ids := withoutRoom(t, e, h1, func() []string {
		return withoutRoom(t, e, h2, func() []string {
			var ids []string
			for range ahead + 1 {
				e.clk.Advance(time.Millisecond)
				ids = append(ids, queued(t, e, "", waitHour).Run.FleetRunID)
			}
			return ids
		})
	})
	for _, id := range ids[:ahead] {
		offeredByHand(t, e, id, "h1")
	}
	rep, err := e.f.FillHosts(context.Background(), []Wake{{HostID: "h2", Slots: 1, Reason: WakeRunEnded}})
	if err != nil || !reflect.DeepEqual(rep.Started, []string{ids[ahead]}) {
		t.Fatalf("fill of h2 behind %d runs offered to h1: %+v, %v; want %s started", ahead, rep, err, ids[ahead])
	}
}

// TestFillHostsResumesADeadDispatchersOffer: a run left offered to a host
// is started by the next fill of that host once the offer's deadline
// passed (before it, the dispatcher that made it may still be at work: the
// offer is left to it, and holds the host's slot), with a fresh deadline,
// under the same token; one the host took already (the dispatcher died
// after the call) is recorded without a second start.
func TestFillHostsResumesADeadDispatchersOffer(t *testing.T) {
	ctx := context.Background()
	wake := []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}}
	t.Run("the host never got it", func(t *testing.T) {
		e := newTestEnv(t, 10*time.Second)
		host := e.addHost(t, "h1", fakehost.Config{})
		ids := withoutRoom(t, e, host, func() (ids []string) {
			for range 2 {
				ids = append(ids, queued(t, e, "", waitHour).Run.FleetRunID)
				e.clk.Advance(time.Second)
			}
			return ids
		})
		id := ids[0]
		offer := offeredByHand(t, e, id, "h1")
		rep, err := e.f.FillHosts(ctx, wake)
		if err != nil || rep.Resumed != 0 || rep.Offered != 0 || len(host.Starts()) != 0 || stored(t, e, id).Version != offer.Version {
			t.Fatalf("fill before the offer's deadline: %+v, %v; host starts %+v", rep, err, host.Starts())
		}
		e.clk.Advance(30 * time.Second)
		rep, err = e.f.FillHosts(ctx, wake)
		if err != nil || rep.Resumed != 1 || !reflect.DeepEqual(rep.Started, []string{id}) {
			t.Fatalf("fill after the deadline: %+v, %v", rep, err)
		}
		starts := host.Starts()
		wantDeadline := e.clk.Now().Add(10 * time.Second)
		if len(starts) != 1 || starts[0].ClientToken != id || !starts[0].Deadline.Equal(wantDeadline) {
			t.Fatalf("starts %+v, want one with token %s and deadline %s", starts, id, wantDeadline)
		}
	})
	t.Run("the host took it", func(t *testing.T) {
		e := newTestEnv(t, 10*time.Second)
		host := e.addHost(t, "h1", fakehost.Config{})
		host.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
		id := queued(t, e, "", waitHour).Run.FleetRunID
		host.RefuseStarts(0, "")
		host.FaultStarts(fakehost.DieAfterAccept, 1)
		// The first fill's start is taken, its answer lost: unknown.
		rep, err := e.f.FillHosts(ctx, wake)
		if err != nil || rep.Offered != 1 || len(rep.Started) != 0 || stored(t, e, id).Status != store.StatusDispatching {
			t.Fatalf("first fill: %+v, %v", rep, err)
		}
		e.clk.Advance(10 * time.Second) // the offer's deadline
		rep, err = e.f.FillHosts(ctx, wake)
		if err != nil || rep.Resumed != 1 || rep.Offered != 0 || !reflect.DeepEqual(rep.Started, []string{id}) {
			t.Fatalf("second fill: %+v, %v", rep, err)
		}
		if host.StartCalls() != 2 || host.Created() != 1 { // the refusal, then the one start
			t.Fatalf("host: %d start calls, %d created", host.StartCalls(), host.Created())
		}
	})
}

// TestTheSweepPutsAnUnfinishedOfferBackAtItsPlace: an offer its host never
// received goes back to queued once its deadline and LostGrace passed, at
// the place it had and with the same token (no host has it), never
// dispatch_lost; a refused offer goes back with a fresh token.
func TestTheSweepPutsAnUnfinishedOfferBackAtItsPlace(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	ids := withoutRoom(t, e, host, func() (ids []string) {
		for range 3 {
			e.clk.Advance(time.Second)
			ids = append(ids, queued(t, e, "", &QueueRequest{Timeout: time.Hour}).Run.FleetRunID)
		}
		return ids
	})
	offeredByHand(t, e, ids[1], "h1")
	e.clk.Advance(10*time.Second + LostGrace)
	if _, err := e.f.Sweep(ctx, SweepOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := stored(t, e, ids[1]); r.Status != store.StatusDispatching {
		t.Fatalf("within the grace: %s", r.Status)
	}
	e.clk.Advance(time.Second)
	rep, err := e.f.Sweep(ctx, SweepOptions{})
	if err != nil || rep.Queued != 3 {
		t.Fatalf("sweep: %+v, %v; want 3 queued", rep, err)
	}
	r := stored(t, e, ids[1])
	if r.Status != store.StatusQueued || r.HostID != "" || r.Queue.Offers != 0 || r.ClientToken() != ids[1] || r.Reason != "" {
		t.Fatalf("back in the queue: %+v queue %+v", r, r.Queue)
	}
	for i, id := range ids {
		if p := position(t, e, id); p != i+1 {
			t.Errorf("%s at %d, want %d", id, p, i+1)
		}
	}
}

// TestAQueuedRunEndsAtItsTimeout: the sweep ends a queued run whose
// timeout passed failed/queue_timeout, out of the queue, never started;
// a fill never starts it either.
func TestAQueuedRunEndsAtItsTimeout(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	ids := withoutRoom(t, e, host, func() []string {
		return []string{queued(t, e, "", &QueueRequest{Timeout: time.Minute}).Run.FleetRunID, queued(t, e, "", waitHour).Run.FleetRunID}
	})
	short, long := ids[0], ids[1]
	e.clk.Advance(time.Minute)
	rep, err := e.f.Sweep(ctx, SweepOptions{})
	if err != nil || rep.Drained != 1 || rep.Queued != 1 {
		t.Fatalf("sweep: %+v, %v", rep, err)
	}
	r := stored(t, e, short)
	if r.Status != store.StatusFailed || r.Reason != store.ReasonQueueTimeout || !r.Drained || r.Queue.StartedAt != nil ||
		!strings.Contains(r.Detail, "1m0s") {
		t.Fatalf("timed out: %+v", r)
	}
	if position(t, e, long) != 1 {
		t.Error("the timed-out run still counts in the queue")
	}
	fill, err := e.f.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 2, Reason: WakeProbe}})
	if err != nil || !reflect.DeepEqual(fill.Started, []string{long}) || host.Created() != 1 {
		t.Fatalf("fill: %+v, %v; host created %d", fill, err, host.Created())
	}
}

// TestCancelOfAWaitingRun: a queued run cancels at once, never started;
// input and retry on a queued run are 409 saying it waits.
func TestCancelOfAWaitingRun(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	alice := caller("alice")
	ids := withoutRoom(t, e, host, func() []string {
		return []string{queued(t, e, "", waitHour).Run.FleetRunID, queued(t, e, "", waitHour).Run.FleetRunID}
	})
	id, other := ids[0], ids[1]
	if _, err := e.f.Input(ctx, alice, id, []byte(`"hi"`)); !isCode(err, CodeNotOnHost) || !strings.Contains(err.Error(), "waits in the queue") {
		t.Fatalf("input: %v", err)
	}
	if _, err := e.f.Retry(ctx, alice, id); !isCode(err, CodeNotOnHost) {
		t.Fatalf("retry: %v", err)
	}
	res, err := e.f.Cancel(ctx, alice, id)
	if err != nil || res.Outcome.Accepted != hostproto.Accepted || res.Run.Status != store.StatusCanceled ||
		res.Run.Reason != hostproto.ReasonCanceled || !strings.Contains(res.Run.Detail, "never started") || res.Run.Live() {
		t.Fatalf("cancel: %+v, %v", res, err)
	}
	fill, err := e.f.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 2, Reason: WakeProbe}})
	if err != nil || !reflect.DeepEqual(fill.Started, []string{other}) || host.Created() != 1 {
		t.Fatalf("fill: %+v, %v", fill, err)
	}
}

// TestCancelOfARunBeingOffered: canceled while a dispatcher offers it,
// the run ends canceled; the start the host takes after all is canceled
// there, and the run records the host's run so that the sweep mirrors it.
func TestCancelOfARunBeingOffered(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	arrived, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	host := e.addHost(t, "h1", fakehost.Config{OnRequest: func(r *http.Request) {
		// The first start once armed waits for release; the others pass.
		if r.Method == http.MethodPost && r.URL.Path == "/runs" && armed.CompareAndSwap(true, false) {
			close(arrived)
			<-release
		}
	}})
	id := withoutRoom(t, e, host, func() string { return queued(t, e, "", waitHour).Run.FleetRunID })
	ctx := context.Background()
	armed.Store(true)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.f.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}})
	}()
	<-arrived
	res, err := e.f.Cancel(ctx, caller("alice"), id)
	if err != nil || res.Run.Status != store.StatusCanceled {
		t.Fatalf("cancel while offered: %+v, %v", res, err)
	}
	close(release)
	await.Group(t, "the dispatcher to record the start", &wg)
	r := stored(t, e, id)
	hr, ok := host.Run(r.ChildRunID)
	if r.Status != store.StatusCanceled || r.ChildRunID == "" || !ok || hr.Status != hostproto.StatusCanceled || !r.Live() {
		t.Fatalf("stored %+v; on the host %+v %v", r, hr, ok)
	}
	if _, err := e.f.Sweep(ctx, SweepOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := stored(t, e, id); r.Live() || r.Status != store.StatusCanceled {
		t.Fatalf("after a sweep: %+v", r)
	}
}

// TestWakesAreSentWhereRoomAppears: a run's end on its host wakes the
// host once, however many paths see the end, while a run waits, and not
// at all while none does; resume and enable wake the host with its free
// slots; a run refused for want of room wakes nothing; a Waker that fails
// never fails what Fleet was doing.
func TestWakesAreSentWhereRoomAppears(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	w := &testWaker{}
	e.withWaker(t, w)
	host := e.addHost(t, "h1", fakehost.Config{MaxConcurrent: 3})
	ctx := context.Background()
	alice := caller("alice")
	endRun := func() {
		t.Helper()
		res, err := e.f.Dispatch(ctx, alice, shellRun, "")
		if err != nil {
			t.Fatal(err)
		}
		host.SetRun(res.Run.ChildRunID, hostproto.StatusFailed, new(int), "")
		if _, err := e.f.Run(ctx, alice, res.Run.FleetRunID); err != nil {
			t.Fatal(err)
		}
		e.f.Sweep(ctx, SweepOptions{})
	}
	endRun()
	if got := w.take(); len(got) != 0 {
		t.Fatalf("a run ended with nothing waiting woke %+v", got)
	}

	// A run waits (for a label h1 lacks): queued by this Fleet, which
	// forgets at once that nothing waited.
	gpu := shellRun
	gpu.Labels, gpu.Queue = map[string]string{"pool": "gpu"}, waitHour
	if res, err := e.f.Dispatch(ctx, alice, gpu, ""); err != nil || res.Run.Status != store.StatusQueued {
		t.Fatalf("a run that waits: %+v, %v", res, err)
	}
	endRun()
	if got := w.take(); !reflect.DeepEqual(got, []Wake{{HostID: "h1", Slots: 1, Reason: WakeRunEnded}}) {
		t.Fatalf("wakes after a run ended: %+v", got)
	}

	host.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
	if res, err := e.f.Dispatch(ctx, alice, shellRun, ""); err != nil || !res.Refused {
		t.Fatalf("refused: %+v, %v", res, err)
	}
	host.RefuseStarts(0, "")
	if got := w.take(); len(got) != 0 {
		t.Fatalf("a busy refusal woke %+v", got)
	}

	if _, err := e.f.SetHostEnabled(ctx, "h1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.SetHostEnabled(ctx, "h1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.DrainHost(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.ResumeHost(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	want := []Wake{{HostID: "h1", Slots: 3, Reason: WakeEnabled}, {HostID: "h1", Slots: 3, Reason: WakeResumed}}
	if got := w.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("wakes of enable and resume: %+v, want %+v", got, want)
	}

	w.fail = errors.New("the queue is down")
	res, err := e.f.Dispatch(ctx, alice, shellRun, "")
	if err != nil {
		t.Fatal(err)
	}
	host.SetRun(res.Run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	st, err := e.f.Run(ctx, alice, res.Run.FleetRunID)
	if err != nil || st.Run.Status != hostproto.StatusSucceeded {
		t.Fatalf("GET with the Waker down: %+v, %v", st, err)
	}
}

// TestWaitingRunsAndTheirTokens: brokered keys of a waiting run are minted
// when a host is offered it, not at enqueue; those minted for an attempt
// that then queued, or for an offer the host refused, are revoked and the
// run records none while it waits.
func TestWaitingRunsAndTheirTokens(t *testing.T) {
	e, b, host, _ := brokerEnv(t)
	ctx := context.Background()
	req := brokeredRun
	req.Queue = waitHour
	host.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
	res, err := e.f.Dispatch(ctx, caller("alice"), req, "")
	if err != nil || res.Run.Status != store.StatusQueued || res.Run.Brokered != nil {
		t.Fatalf("dispatch: %+v, %v", res, err)
	}
	if got := b.revokedValues(); !reflect.DeepEqual(got, []string{"githubApp-value-1"}) {
		t.Fatalf("revoked %v, want the first attempt's token", got)
	}
	wake := []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}}
	rep, err := e.f.FillHosts(ctx, wake)
	if err != nil || rep.Offered != 1 || len(rep.Started) != 0 {
		t.Fatalf("a refused offer: %+v, %v", rep, err)
	}
	r := stored(t, e, res.Run.FleetRunID)
	if r.Status != store.StatusQueued || r.Queue.Offers != 2 || r.Brokered != nil ||
		!reflect.DeepEqual(b.revokedValues(), []string{"githubApp-value-1", "githubApp-value-3"}) {
		t.Fatalf("after the refused offer: %+v revoked %v", r, b.revokedValues())
	}
	host.RefuseStarts(0, "")
	if rep, err = e.f.FillHosts(ctx, wake); err != nil || len(rep.Started) != 1 {
		t.Fatalf("fill: %+v, %v", rep, err)
	}
	r = stored(t, e, res.Run.FleetRunID)
	starts := host.Starts()
	if len(r.Brokered) != 2 || len(starts) != 1 || starts[0].ClientToken != r.FleetRunID+".q2" ||
		!slices.Equal(valuesOf(starts[0].Credentials)[:1], []string{"acme/GITHUB_TOKEN=githubApp-value-5@" + e.clk.Now().Add(brokerTTL).Format(time.TimeOnly)}) {
		t.Fatalf("started: %+v; starts %+v", r, starts)
	}
}

// TestAQueuedRunHasNoHostToAsk: the paths that read a live run from its
// host (a stream's pull-through, GET, a listing's refresh, the egress
// mirror) take a queued run as it is stored, and ask no host.
func TestAQueuedRunHasNoHostToAsk(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	alice := caller("alice", "h1") // a scoped caller sees its queued run, on no host
	req := shellRun
	req.Queue = waitHour
	res := withoutRoom(t, e, host, func() DispatchResult {
		res, err := e.f.Dispatch(ctx, alice, req, "")
		if err != nil || res.Run.Status != store.StatusQueued {
			t.Fatalf("dispatch: %+v, %v", res, err)
		}
		return res
	})
	id := res.Run.FleetRunID
	host.ResetRequests()
	if r, err := e.f.SyncRun(ctx, id); err != nil || r.Status != store.StatusQueued {
		t.Fatalf("SyncRun: %+v, %v", r, err)
	}
	st, err := e.f.Run(ctx, alice, id)
	if err != nil || st.Run.Status != store.StatusQueued || st.Position != 1 || st.Refreshed {
		t.Fatalf("GET: %+v, %v", st, err)
	}
	page, err := e.f.Runs(ctx, alice, RunsQuery{Status: store.StatusQueued})
	if err != nil || len(page.Runs) != 1 || page.Runs[0].FleetRunID != id {
		t.Fatalf("listing: %+v, %v", page, err)
	}
	if eg, err := e.f.Egress(ctx, alice, id, 0, 0, true); err != nil || len(eg.Records) != 0 || eg.Verification == nil || eg.Verification.OK {
		t.Fatalf("egress: %+v, %v", eg, err)
	}
	if got := host.Requests(); len(got) != 0 {
		t.Fatalf("the host was asked %v", got)
	}
}
