package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

const day = 24 * time.Hour

// readable reads every mirrored event of run id as a caller would, up to
// the cursor, or fails when the run itself is gone.
func readable(t *testing.T, e *testEnv, id string) []hostproto.Event {
	t.Helper()
	page, err := e.f.Events(context.Background(), caller("alice"), id, 0, MaxEventsLimit)
	if err != nil {
		t.Fatalf("reading the events of %s at +%s: %v", id, e.clk.Now().Sub(t0), err)
	}
	return page.Events
}

func sweepOnce(t *testing.T, e *testEnv) SweepReport {
	t.Helper()
	rep, err := e.f.Sweep(context.Background(), SweepOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestARetriedRunKeepsItsEarlyEventsWhileItExists: a run ends, is retried
// 29 days later (a day before it would have expired), and its second
// attempt runs past the day its first events were to expire: every event
// stays readable while the run exists, and all go with it.
func TestARetriedRunKeepsItsEarlyEventsWhileItExists(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.AppendOutput(run.ChildRunID, "attempt 1\n")
	one := 1
	host.SetRun(run.ChildRunID, hostproto.StatusFailed, &one, "")
	if rep := sweepOnce(t, e); rep.Drained != 1 || rep.Extended != 0 {
		t.Fatalf("first sweep = %+v: a run of minutes needs no extension", rep)
	}
	first := readable(t, e, run.FleetRunID)

	e.clk.Advance(29 * day)
	if res, err := e.f.Retry(ctx, caller("alice"), run.FleetRunID); err != nil || res.Outcome.Accepted != hostproto.Accepted {
		t.Fatalf("retry = %+v, %v", res, err)
	}
	if rep := sweepOnce(t, e); rep.Extended != 1 {
		t.Fatalf("the sweep after the retry = %+v, want the events extended", rep)
	}
	host.SetRun(run.ChildRunID, hostproto.StatusRunning, nil, "")
	// Past the 30 days of the first attempt's run and the 37 its events
	// were first given, attempt 2 still runs.
	e.clk.Advance(11 * day)
	host.AppendOutput(run.ChildRunID, "attempt 2\n")
	sweepOnce(t, e)
	if got := readable(t, e, run.FleetRunID); len(got) != len(host.Events(run.ChildRunID)) || got[0].Sequence != 1 {
		t.Fatalf("at +40 days, during attempt 2: %d events readable of %d", len(got), len(host.Events(run.ChildRunID)))
	}

	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	if rep := sweepOnce(t, e); rep.Drained != 1 {
		t.Fatalf("the last sweep = %+v", rep)
	}
	ended, _ := e.st.GetRun(ctx, run.FleetRunID)
	e.clk.Set(ended.ExpiresAt.Add(-time.Second))
	if got := readable(t, e, run.FleetRunID); len(got) != len(host.Events(run.ChildRunID)) || string(got[1].Data) != string(first[1].Data) {
		t.Fatalf("a second before the run expires: %d events readable", len(got))
	}
	e.clk.Set(ended.ExpiresAt)
	if _, err := e.f.RunFor(ctx, caller("alice"), run.FleetRunID); !isKind(err, KindNotFound) {
		t.Fatalf("the expired run: %v", err)
	}
	if p, _ := e.st.ListEvents(ctx, run.FleetRunID, 0, 100); len(p.Events) != 0 && p.Events[0].ExpiresAt.Before(ended.ExpiresAt) {
		t.Fatalf("an event expired before its run: %+v", p.Events[0])
	}
}

// TestALongRunsEventsOutliveIt: a run live for 8 days (its host out of
// reach, say) has its events extended while live, and at its end they
// outlive it; a lost one likewise, drained by the sweep alone.
func TestALongRunsEventsOutliveIt(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	long, lost := dispatched(t, e, "alice"), dispatched(t, e, "alice")
	host.AppendOutput(long.ChildRunID, "day 0\n")
	host.AppendOutput(lost.ChildRunID, "day 0\n")
	sweepOnce(t, e)

	e.clk.Advance(8 * day)
	host.Forget(lost.ChildRunID)
	// GET finds the run lost: it stays live, its events to be extended.
	st, err := e.f.Run(ctx, caller("alice"), lost.FleetRunID)
	if err != nil || st.Run.Status != store.StatusLost || !st.Run.Live() {
		t.Fatalf("lost by a read: %+v, %v", st.Run, err)
	}
	// The stream's pull-through does not extend, so it does not drain it.
	if r, _ := e.f.SyncRun(ctx, lost.FleetRunID); r.Drained {
		t.Fatalf("drained without its events extended: %+v", r)
	}
	host.SetRun(long.ChildRunID, hostproto.StatusSucceeded, new(int), "")
	if rep := sweepOnce(t, e); rep.Drained != 2 || rep.Extended != 2 {
		t.Fatalf("sweep = %+v", rep)
	}
	for _, id := range []string{long.FleetRunID, lost.FleetRunID} {
		r, _ := e.st.GetRun(ctx, id)
		e.clk.Set(r.ExpiresAt.Add(-time.Second))
		if got := readable(t, e, id); len(got) == 0 || got[0].Sequence != 1 {
			t.Fatalf("run %s (%s) a second before it expires: %d events", id, r.Status, len(got))
		}
	}
}
