package fleet

import (
	"context"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// pausedMoves is a store whose UpdateRun of a run onto host waits, once,
// for release (after telling paused): a dispatcher paused between a host's
// refusal and its move of the run to the next host.
type pausedMoves struct {
	store.Store
	host            string
	paused, release chan struct{}
	once            sync.Once
}

func (s *pausedMoves) UpdateRun(ctx context.Context, r store.Run) (store.Run, error) {
	if r.HostID == s.host && r.Status == store.StatusDispatching {
		s.once.Do(func() {
			close(s.paused)
			<-s.release
		})
	}
	return s.Store.UpdateRun(ctx, r)
}

// TestAnOfferMovedOnIsNeverStartedWhereItWas: dispatcher D1 offers a run
// to h1, which refuses it at its door (draining), and D1 moves it to h2.
// Dispatcher D2, woken for h1 (resumed meanwhile) while D1 is between the
// refusal and the move, finds the offer on h1 unanswered, before the
// offer's deadline or after it. The run starts on one host, once, and the
// run records the host that has it.
func TestAnOfferMovedOnIsNeverStartedWhereItWas(t *testing.T) {
	for _, c := range []struct {
		name    string
		advance time.Duration
	}{{"before the offer's deadline", 0}, {"after it", 10 * time.Second}} {
		t.Run(c.name, func(t *testing.T) {
			e := newTestEnv(t, 10*time.Second)
			arrived, release := make(chan struct{}), make(chan struct{})
			var armed atomic.Bool
			h1 := e.addHost(t, "h1", fakehost.Config{OnRequest: func(r *http.Request) {
				if r.Method == http.MethodPost && r.URL.Path == "/runs" && armed.CompareAndSwap(true, false) {
					close(arrived)
					<-release
				}
			}})
			h2 := e.addHost(t, "h2", fakehost.Config{})
			ctx := context.Background()
			id := withoutRoom(t, e, h1, func() string {
				return withoutRoom(t, e, h2, func() string { return queued(t, e, "", waitHour).Run.FleetRunID })
			})

			h1.RefuseStarts(http.StatusConflict, hostproto.CodeDraining)
			moves := &pausedMoves{Store: e.st, host: "h2", paused: make(chan struct{}), release: make(chan struct{})}
			d1 := e.fleetOver(t, moves)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				d1.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}, {HostID: "h2", Slots: 1, Reason: WakeProbe}})
			}()
			await.Recv(t, "D1 to move the run after h1's refusal", moves.paused)
			h1.RefuseStarts(0, "") // h1 resumed
			e.clk.Advance(c.advance)

			armed.Store(true)
			d2 := make(chan struct{})
			go func() {
				defer close(d2)
				e.f.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 1, Reason: WakeResumed}})
			}()
			// D2's start, if it makes one, reaches h1 only after D1 moved on.
			select {
			case <-arrived:
			case <-d2:
			}
			close(moves.release)
			await.Group(t, "D1", &wg)
			close(release)
			await.Recv(t, "D2", d2)

			r := stored(t, e, id)
			if n := h1.Created() + h2.Created(); n != 1 {
				t.Fatalf("the run was created %d times (h1 %d, h2 %d); stored on %s as %s", n, h1.Created(), h2.Created(), r.HostID, r.ChildRunID)
			}
			host := map[string]*fakehost.Host{"h1": h1, "h2": h2}[r.HostID]
			if hr, ok := host.Run(r.ChildRunID); !ok || hr.ClientToken != r.ClientToken() || r.Queue.StartedOn != r.HostID {
				t.Fatalf("stored on %s as %s (queue %+v), which that host does not have", r.HostID, r.ChildRunID, r.Queue)
			}
		})
	}
}

// TestCancelWhileOfferedRevokesTheOffersTokens: a run canceled while a
// dispatcher offers it to a host, which then refuses the start, never
// runs: the tokens minted for the offer are revoked at the cancel, as a
// canceled run's are, not left to expire.
func TestCancelWhileOfferedRevokesTheOffersTokens(t *testing.T) {
	e, b, host, _ := brokerEnv(t)
	ctx := context.Background()
	req := brokeredRun
	req.Queue = waitHour
	host.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
	res, err := e.f.Dispatch(ctx, caller("alice"), req, "")
	if err != nil || res.Run.Status != store.StatusQueued {
		t.Fatalf("dispatch: %+v, %v", res, err)
	}
	host.RefuseStarts(0, "")
	host.FaultStarts(fakehost.HangBeforeAccept, 1)
	filled := make(chan struct{})
	go func() {
		defer close(filled)
		e.f.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}})
	}()
	await.Cond(t, 5*time.Second, "the offer's start at the host", func() bool { return host.StartCalls() == 2 })
	in, err := e.f.Cancel(ctx, caller("alice"), res.Run.FleetRunID)
	if err != nil || in.Run.Status != store.StatusCanceled {
		t.Fatalf("cancel while offered: %+v, %v", in, err)
	}
	want := []string{"githubApp-value-1", "githubApp-value-3"} // the first attempt's, the offer's
	if got := b.revokedValues(); !reflect.DeepEqual(got, want) {
		t.Errorf("revoked at the cancel: %v, want %v", got, want)
	}
	host.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
	host.Release()
	await.Recv(t, "the dispatcher", filled)
	if r := stored(t, e, res.Run.FleetRunID); r.Status != store.StatusCanceled || r.Live() || host.Created() != 0 ||
		!reflect.DeepEqual(b.revokedValues(), want) {
		t.Fatalf("after the refusal: %+v; host created %d; revoked %v", r, host.Created(), b.revokedValues())
	}
}

// TestCancelWhileOfferedCancelsAStartWhoseAnswerWasLost: canceled while
// its start is on its way to the host, which takes it but whose answer is
// lost: the dispatcher finds the host's run by clientToken and cancels it
// there, so a canceled run never runs on; the run records the host's run
// until the sweep has mirrored it.
func TestCancelWhileOfferedCancelsAStartWhoseAnswerWasLost(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	arrived, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	host := e.addHost(t, "h1", fakehost.Config{OnRequest: func(r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/runs" && armed.CompareAndSwap(true, false) {
			close(arrived)
			<-release
		}
	}})
	id := withoutRoom(t, e, host, func() string { return queued(t, e, "", waitHour).Run.FleetRunID })
	ctx := context.Background()
	armed.Store(true)
	host.FaultStarts(fakehost.DieAfterAccept, 1)
	filled := make(chan struct{})
	go func() {
		defer close(filled)
		e.f.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}})
	}()
	<-arrived
	if in, err := e.f.Cancel(ctx, caller("alice"), id); err != nil || in.Run.Status != store.StatusCanceled {
		t.Fatalf("cancel while offered: %+v, %v", in, err)
	}
	close(release)
	await.Recv(t, "the dispatcher", filled)
	r := stored(t, e, id)
	hr, ok := host.Run("run-1")
	if !ok || hr.Status != hostproto.StatusCanceled || r.Status != store.StatusCanceled || r.ChildRunID != "run-1" {
		t.Fatalf("the host's run %+v (%v); stored %+v", hr, ok, r)
	}
	if _, err := e.f.Sweep(ctx, SweepOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := stored(t, e, id); r.Live() || r.Status != store.StatusCanceled {
		t.Fatalf("after a sweep: %+v", r)
	}
}

// TestAHostWhoseClockRunsAheadFailsNoWaitingRun: a host whose clock is
// ahead of Fleet's by more than HostTimeout refuses every start as past
// its deadline. A fill of it offers one waiting run, which goes on to the
// next woken host with room (or back to its place), and fills that host
// no further: no run that waited ends failed for the host's clock.
func TestAHostWhoseClockRunsAheadFailsNoWaitingRun(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	ahead := clock.NewFake(t0.Add(time.Minute))
	h1 := e.addHost(t, "h1", fakehost.Config{Clock: ahead})
	ctx := context.Background()
	ids := withoutRoom(t, e, h1, func() (ids []string) {
		for range 3 {
			e.clk.Advance(time.Second)
			ahead.Advance(time.Second)
			ids = append(ids, queued(t, e, "", waitHour).Run.FleetRunID)
		}
		return ids
	})
	rep, err := e.f.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}})
	if err != nil || rep.Offered != 1 || len(rep.Started) != 0 {
		t.Fatalf("fill of the host ahead: %+v, %v; want one offer", rep, err)
	}
	for i, id := range ids {
		if r := stored(t, e, id); r.Status != store.StatusQueued || position(t, e, id) != i+1 {
			t.Fatalf("run %d after the fill: %s (%s: %s), position %d", i, r.Status, r.Reason, r.Detail, position(t, e, id))
		}
	}

	h2 := e.addHost(t, "h2", fakehost.Config{})
	rep, err = e.f.FillHosts(ctx, []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}, {HostID: "h2", Slots: 1, Reason: WakeProbe}})
	if err != nil || !reflect.DeepEqual(rep.Started, ids[:1]) || h2.Created() != 1 || h1.Created() != 0 {
		t.Fatalf("fill of both: %+v, %v; want %s started on h2", rep, err, ids[0])
	}
}
