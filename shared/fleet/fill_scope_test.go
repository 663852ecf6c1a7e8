package fleet

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// countedRunReads is a store that counts the runs read.
type countedRunReads struct {
	store.Store
	reads atomic.Int64
}

func (s *countedRunReads) GetRun(ctx context.Context, id string) (store.Run, error) {
	s.reads.Add(1)
	return s.Store.GetRun(ctx, id)
}

// TestRunsOnlyAnotherHostMayTakeDoNotHideTheRest: a caller scoped to h2
// queues more runs than one fill reads, at a higher priority; a run of
// another caller queued behind them starts on h1, idle, at h1's next
// wake, and that fill reads no run but the one it starts (the scoped
// runs' hosts are in their index entries). h2's wake starts the first
// scoped run.
func TestRunsOnlyAnotherHostMayTakeDoNotHideTheRest(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	h1 := e.addHost(t, "h1", fakehost.Config{})
	h2 := e.addHost(t, "h2", fakehost.Config{})
	ctx := context.Background()
	req := shellRun
	req.Queue = &QueueRequest{Timeout: time.Hour, Priority: 50}
	var scoped []string
	last := withoutRoom(t, e, h1, func() string {
		return withoutRoom(t, e, h2, func() string {
			for range 3 * (fillScanPerSlot + fillScanBase) {
				e.clk.Advance(time.Millisecond)
				res, err := e.f.Dispatch(ctx, caller("bob", "h2"), req, "")
				if err != nil || res.Run.Status != store.StatusQueued || !reflect.DeepEqual(res.Run.Queue.Hosts, []string{"h2"}) {
					t.Fatalf("bob's dispatch: %+v, %v", res, err)
				}
				scoped = append(scoped, res.Run.FleetRunID)
			}
			return queued(t, e, "", waitHour).Run.FleetRunID
		})
	})
	counted := &countedRunReads{Store: e.st}
	rep, err := e.fleetOver(t, counted).FillHosts(ctx, []Wake{{HostID: "h1", Slots: 1, Reason: WakeProbe}})
	if err != nil || !reflect.DeepEqual(rep.Started, []string{last}) || h1.Created() != 1 || h2.Created() != 0 {
		t.Fatalf("fill of h1: %+v, %v (h1 created %d, h2 %d); want alice's %s started", rep, err, h1.Created(), h2.Created(), last)
	}
	if n := counted.reads.Load(); n > 2 { // the run, and its record's re-read at most
		t.Errorf("the fill of h1 read %d runs", n)
	}
	rep, err = e.f.FillHosts(ctx, []Wake{{HostID: "h2", Slots: 1, Reason: WakeProbe}})
	if err != nil || !reflect.DeepEqual(rep.Started, scoped[:1]) || h2.Created() != 1 {
		t.Fatalf("fill of h2: %+v, %v; want bob's first started", rep, err)
	}
}
