package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// The budget for runs that wait: what queuing may add to a run
// that waits, over one that starts at once.
const (
	queueBudgetWCU = 3
	queueBudgetRCU = 2
)

// queueCostSample is how many runs each case measures per iteration.
const queueCostSample = 5

// take returns the wakes held and forgets them, for the benchmark to
// deliver as it chooses.
func (w *heldWakes) take() []fleet.Wake {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.wakes
	w.wakes = nil
	return out
}

// queueCost is a case's DynamoDB units per run.
type queueCost struct {
	usage dynamostore.Usage
	runs  int
}

// add counts what the meter holds (then resets it) toward one more run
// when run.
func (c *queueCost) add(m *dynamostore.Meter, run bool) {
	u := m.Snapshot()
	m.Reset()
	c.usage.Calls = addCounts(c.usage.Calls, u.Calls)
	c.usage.RCU = addUnits(c.usage.RCU, u.RCU)
	c.usage.WCU = addUnits(c.usage.WCU, u.WCU)
	if run {
		c.runs++
	}
}

func (c queueCost) rcu() float64   { return c.usage.TotalRCU() / float64(c.runs) }
func (c queueCost) wcu() float64   { return c.usage.TotalWCU() / float64(c.runs) }
func (c queueCost) calls() float64 { return float64(c.usage.TotalCalls()) / float64(c.runs) }

// dollarsPerM is the case's DynamoDB bill per million runs.
func (c queueCost) dollarsPerM() float64 {
	return c.usage.Dollars(dynamostore.OnDemandUSEast1) / float64(c.runs) * 1e6
}

func (c queueCost) report(b *testing.B) {
	b.ReportMetric(c.rcu(), "RCU/run")
	b.ReportMetric(c.wcu(), "WCU/run")
	b.ReportMetric(c.calls(), "ddbcalls/run")
	b.ReportMetric(c.dollarsPerM(), "$ddb/M")
}

// queueBench is Fleet on DynamoDB (moto, metered) with one fake host of
// one slot (h1, pool=ci), a caller alice, and the wakes Fleet sends held.
type queueBench struct {
	s     *stack
	host  *fakehost.Host
	alice string
	waker *heldWakes
	n     int // numbers the Idempotency-Keys
}

func newQueueBench(b *testing.B) *queueBench {
	w := &heldWakes{}
	s := newStack(b, "dynamodb", stackOptions{meter: &dynamostore.Meter{}, waker: w})
	host := s.addHost(b, "h1", fakehost.Config{MaxConcurrent: 1}, map[string]any{"labels": map[string]string{"pool": "ci"}})
	s.probe(b, "h1")
	return &queueBench{s: s, host: host, alice: s.mint(b, "alice", "*", "*"), waker: w}
}

// dispatch is alice's dispatch of a shell run (with a key, as clients
// send), asking to wait an hour when wait; it wants status, and returns
// the answer.
func (q *queueBench) dispatch(b *testing.B, wait bool, status int) answer {
	b.Helper()
	q.n++
	body := `{"agent":"shell","prompt":"make test","labels":{"pool":"ci"}}`
	if wait {
		body = `{"agent":"shell","prompt":"make test","labels":{"pool":"ci"},"queue":{"timeout":"1h"}}`
	}
	return q.s.must(b, status, "POST", "/fleet/runs", q.alice, body, "Idempotency-Key", fmt.Sprintf("q-%d", q.n))
}

// end ends child on the host and lets the sweep record it; it returns the
// wakes the sweep sent.
func (q *queueBench) end(b *testing.B, child string) []fleet.Wake {
	b.Helper()
	q.host.SetRun(child, hostproto.StatusSucceeded, new(int), "")
	if _, err := q.s.app.Fleet.Sweep(context.Background(), fleet.SweepOptions{}); err != nil {
		b.Fatalf("sweep: %v", err)
	}
	return q.waker.take()
}

// fill delivers wakes to FillHosts, as the dispatcher does.
func (q *queueBench) fill(b *testing.B, wakes []fleet.Wake) fleet.FillReport {
	b.Helper()
	rep, err := q.s.app.Fleet.FillHosts(context.Background(), wakes)
	if err != nil {
		b.Fatalf("fill %+v: %v", wakes, err)
	}
	return rep
}

// BenchmarkQueueCostPerWaitingRun measures what runs that wait cost on
// DynamoDB (moto_server, dynamostore.Meter), each case beside a baseline
// in the same run, one fake host of one slot:
//
//   - dispatch/baseline: a dispatch that does not ask to wait and starts
//     at once (201); its end, recorded by a sweep pass with nothing
//     waiting, must send no wake (run-end/nothing-waiting: asserted);
//   - dispatch/asks-to-wait: one that asks to wait (queue.timeout 1h) and
//     starts at once: it must cost exactly the baseline (queuing adds
//     nothing to a run that does not wait);
//   - waits/only-full-hosts: one whose only eligible host's last probe
//     showed it full: routing leaves the host out for a run that may wait
//     (host_busy, no host call: asserted) and the run is queued at once
//     (202); the sweep pass that records the end of the run holding the
//     slot wakes the host, and FillHosts starts it. Its units are the
//     dispatch's and the fill's, up to the start's answer recorded; the
//     other run's end is not its own (the baseline's run ends alike);
//   - waits/no-eligible-host: one that routing finds no host for (the host
//     drained: queued without a host call), started by the wake of the
//     host's resume (as a host that joins or comes back): the same path
//     as only-full-hosts, from the dispatch on;
//   - sweep/*: what waiting runs add to a sweep pass, which reads the
//     queue index (its classes, then each class's pages) and no waiting
//     run (reading one only once its timeout passed): per class that has
//     waiting runs (the pass that ends the run holding the slot, with one
//     run waiting, against the baseline's with none), and per waiting run
//     (a pass with queueSweepRuns waiting in one class against one with a
//     single run: its share of the index's pages);
//   - vs-baseline/*: a waits case less the baseline, per run that waits,
//     plus its share of a sweep pass's reads (sweep/per-waiting-run, for
//     each pass it waits through: one here); fails past the budget
//     (queueBudgetWCU, queueBudgetRCU), a unit count and not a time, or
//     when dispatch/asks-to-wait differs from the baseline in anything;
//   - waits/host-busy-race: one whose host's last probe showed room that
//     refuses it host_busy (the slot was taken since the probe: a race
//     the probe's age allows), put back to queued, then started by the
//     wake of the holder's end. Reported without the budget: it pays the
//     dispatch of a run that starts at once (routing, the host read, the
//     run written dispatching), the refused start and the write back to
//     the queue, then the fill; a run that may wait is offered only to a
//     host whose probe showed room, so this is the case of a probe that
//     is out of date, as the fallback's refusals are.
func BenchmarkQueueCostPerWaitingRun(b *testing.B) {
	q := newQueueBench(b)
	m := q.s.meter
	var base, asks, full, none, busy, sweepBase, sweepWaiting queueCost
	idleEnds := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < queueCostSample; j++ {
			// The baseline and its end, with nothing waiting: no wake.
			m.Reset()
			a := q.dispatch(b, false, http.StatusCreated)
			base.add(m, true)
			if wakes := q.end(b, a.str("childRunId")); len(wakes) != 0 {
				b.Fatalf("the baseline's end, with nothing waiting, sent wakes %+v", wakes)
			}
			sweepBase.add(m, true)
			idleEnds++

			// Asks to wait, starts at once.
			a = q.dispatch(b, true, http.StatusCreated)
			asks.add(m, true)
			q.fill(b, q.end(b, a.str("childRunId")))

			// Waits: the host's last probe shows it full.
			holder := q.dispatch(b, false, http.StatusCreated)
			q.s.probe(b, "h1")
			calls := q.host.StartCalls()
			m.Reset()
			id := q.queued(b)
			if n := q.host.StartCalls(); n != calls {
				b.Fatalf("a run that may wait was offered to a host whose probe showed it full (%d start calls)", n-calls)
			}
			full.add(m, false)
			wakes := q.end(b, holder.str("childRunId"))
			sweepWaiting.add(m, true)
			q.started(b, id, wakes)
			full.add(m, true)
			q.fill(b, q.end(b, q.child(b, id)))
			q.s.probe(b, "h1") // room again, as routing sees it

			// Waits: the host's probe showed room; it refuses host_busy.
			holder = q.dispatch(b, false, http.StatusCreated)
			m.Reset()
			id = q.queued(b)
			busy.add(m, false)
			wakes = q.end(b, holder.str("childRunId"))
			m.Reset()
			q.started(b, id, wakes)
			busy.add(m, true)
			q.fill(b, q.end(b, q.child(b, id)))

			// Waits: no eligible host (drained), until it resumes.
			q.s.must(b, http.StatusOK, "POST", "/fleet/hosts/h1/drain", adminToken, "")
			m.Reset()
			id = q.queued(b)
			none.add(m, false)
			q.s.must(b, http.StatusOK, "POST", "/fleet/hosts/h1/resume", adminToken, "")
			m.Reset()
			q.started(b, id, q.waker.take())
			none.add(m, true)
			q.fill(b, q.end(b, q.child(b, id)))
		}
	}
	b.StopTimer()
	perRun, perClass := q.sweepShare(b)
	b.Run("dispatch/baseline", func(b *testing.B) { reportOnce(b, base) })
	b.Run("dispatch/asks-to-wait", func(b *testing.B) { reportOnce(b, asks) })
	b.Run("waits/only-full-hosts", func(b *testing.B) { reportOnce(b, full) })
	b.Run("waits/no-eligible-host", func(b *testing.B) { reportOnce(b, none) })
	b.Run("waits/host-busy-race", func(b *testing.B) { reportOnce(b, busy) })
	b.Run("run-end/nothing-waiting", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
		}
		// Asserted above: none sent, so no dispatcher runs either.
		b.ReportMetric(0, "wakes/runend")
		b.ReportMetric(float64(idleEnds), "runends")
	})
	b.Run("sweep/per-class-waiting", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
		}
		b.ReportMetric(sweepWaiting.rcu()-sweepBase.rcu(), "RCU/class/pass")
		b.ReportMetric(sweepWaiting.wcu()-sweepBase.wcu(), "WCU/class/pass")
		b.ReportMetric(perClass, "RCU/class/pass-alone")
	})
	b.Run("sweep/per-waiting-run", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
		}
		b.ReportMetric(perRun, "RCU/waitingrun/pass")
	})
	b.Logf("per run: baseline dispatch: %s", perMinute(base.usage, float64(base.runs)))
	b.Logf("per run: waits/only-full-hosts (dispatch + fill): %s", perMinute(full.usage, float64(full.runs)))
	b.Logf("per run: waits/no-eligible-host (dispatch + fill): %s", perMinute(none.usage, float64(none.runs)))
	b.Logf("per run: waits/host-busy-race (dispatch + fill): %s", perMinute(busy.usage, float64(busy.runs)))
	b.Logf("per pass: the sweep with nothing waiting: %s", perMinute(sweepBase.usage, float64(sweepBase.runs)))
	b.Logf("per pass: the sweep with one run waiting: %s", perMinute(sweepWaiting.usage, float64(sweepWaiting.runs)))
	if asks.rcu() != base.rcu() || asks.wcu() != base.wcu() || asks.calls() != base.calls() {
		b.Fatalf("a dispatch that asks to wait and starts at once costs %.2f RCU %.2f WCU %.1f calls, the baseline %.2f RCU %.2f WCU %.1f calls: "+
			"queuing must add nothing to a run that does not wait", asks.rcu(), asks.wcu(), asks.calls(), base.rcu(), base.wcu(), base.calls())
	}
	var over []string
	for _, c := range []struct {
		name   string
		cost   queueCost
		budget bool
	}{{"only-full-hosts", full, true}, {"no-eligible-host", none, true}, {"host-busy-race", busy, false}} {
		rcu, wcu := c.cost.rcu()-base.rcu()+perRun, c.cost.wcu()-base.wcu()
		b.Run("vs-baseline/"+c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
			}
			b.ReportMetric(rcu, "RCU/waitingrun")
			b.ReportMetric(wcu, "WCU/waitingrun")
			b.ReportMetric(c.cost.calls()-base.calls(), "ddbcalls/waitingrun")
			b.ReportMetric(c.cost.dollarsPerM()-base.dollarsPerM(), "$ddb/M-waitingruns")
		})
		if c.budget && (wcu > queueBudgetWCU || rcu > queueBudgetRCU) {
			over = append(over, fmt.Sprintf("%s: %.2f RCU and %.2f WCU", c.name, rcu, wcu))
		}
	}
	if len(over) > 0 {
		b.Fatalf("a run that waits costs more than one that does not (%s): the budget is %d RCU and %d WCU",
			strings.Join(over, "; "), queueBudgetRCU, queueBudgetWCU)
	}
}

// queueSweepRuns is how many runs wait in one class for sweepShare's
// second pass: a page of the queue index holds them all.
const queueSweepRuns = 40

// sweepShare measures a sweep pass with one run waiting (the host
// drained) and one with queueSweepRuns waiting, both in one class: what a
// waiting run adds to a pass (perRun, its share of the index's pages) and
// what a class with waiting runs adds over nothing waiting (perClass, its
// queries). It leaves the runs waiting and the host drained.
func (q *queueBench) sweepShare(b *testing.B) (perRun, perClass float64) {
	b.Helper()
	m := q.s.meter
	pass := func() float64 {
		m.Reset()
		rep, err := q.s.app.Fleet.Sweep(context.Background(), fleet.SweepOptions{})
		if err != nil {
			b.Fatalf("sweep: %v", err)
		}
		u := m.Snapshot()
		if rep.Current+rep.Drained+rep.Lost+rep.InFlight+rep.Unreachable+rep.Partial+rep.Failed != 0 {
			b.Fatalf("a sweep of waiting runs read runs: %+v", rep)
		}
		return u.TotalRCU()
	}
	q.s.must(b, http.StatusOK, "POST", "/fleet/hosts/h1/drain", adminToken, "")
	empty := pass()
	q.queued(b)
	one := pass()
	for range queueSweepRuns - 1 {
		q.queued(b)
	}
	many := pass()
	return (many - one) / (queueSweepRuns - 1), one - empty
}

// queued dispatches a run that asks to wait and finds no host that takes
// it now: 202, queued on no host; it returns the run's id.
func (q *queueBench) queued(b *testing.B) string {
	b.Helper()
	a := q.dispatch(b, true, http.StatusAccepted)
	if a.str("status") != store.StatusQueued || a.str("hostId") != "" {
		b.Fatalf("a dispatch that waits: %s", a.raw)
	}
	return a.str("fleetRunId")
}

// started delivers wakes to FillHosts, which must start run id with one
// host call.
func (q *queueBench) started(b *testing.B, id string, wakes []fleet.Wake) {
	b.Helper()
	if rep := q.fill(b, wakes); !reflect.DeepEqual(rep.Started, []string{id}) || rep.Offered != 1 {
		b.Fatalf("the fill of wakes %+v: %+v, want %s started with one host call", wakes, rep, id)
	}
}

// child is the host's run id of run id, started.
func (q *queueBench) child(b *testing.B, id string) string {
	b.Helper()
	r, err := q.s.app.Store.GetRun(context.Background(), id)
	if err != nil || r.Status != hostproto.StatusPending || r.Queue == nil || r.Queue.StartedAt == nil || r.ChildRunID == "" {
		b.Fatalf("the started run: %+v, %v", r, err)
	}
	return r.ChildRunID
}

// reportOnce reports c as a sub-benchmark's figures.
func reportOnce(b *testing.B, c queueCost) {
	for i := 0; i < b.N; i++ {
	}
	c.report(b)
}

// queueBurstEnv sets BenchmarkQueueBurstDrain's burst, queueBurstDefault
// runs when unset. 1,000, not the 10,000: moto serves one call at
// a time (tests/kit/motoserver), a start and an end take some 20 calls with
// the Meter's reads, and moto slows as the runs table grows (a round of
// ~50 starts took ~4 s at 1,000 runs, ~12 s at 10,000), so 10,000 take
// most of an hour a mode (RUNFLEET_BENCH_QUEUE_BURST=10000). What it
// measures per start does not grow with the queue: a fill reads a page of
// each class's head, whatever its length; the sweep's read of the queue
// index grows with the waiting runs (a share of its pages each, ~40
// entries a read unit: no run is read until its timeout passed).
const (
	queueBurstEnv     = "RUNFLEET_BENCH_QUEUE_BURST"
	queueBurstDefault = 1000
)

// The burst's fleet: queueBurstHosts hosts of queueBurstSlots slots each,
// half labelled pool=a, half pool=b; its runs are spread over three
// classes, "shell" (any host) and "shell?pool=a" and "shell?pool=b" (half
// the hosts each), so a host merges two classes by their heads.
const (
	queueBurstHosts = 20
	queueBurstSlots = 5
	// queueBurstBatch is the dispatcher's batch (template.yaml's
	// BatchSize on the DispatchWakes mapping).
	queueBurstBatch = 10
)

// burstRuns is the burst's size: queueBurstEnv, else queueBurstDefault.
func burstRuns(b *testing.B) int {
	v := os.Getenv(queueBurstEnv)
	if v == "" {
		return queueBurstDefault
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < queueBurstHosts*queueBurstSlots {
		b.Fatalf("%s=%q: want a number of runs, at least the fleet's %d slots", queueBurstEnv, v, queueBurstHosts*queueBurstSlots)
	}
	return n
}

// BenchmarkQueueBurstDrain drains a burst of queued runs (burstRuns) on
// moto with fake hosts whose slots (fakehost MaxConcurrent) free as runs
// end. The runs are queued first (three by dispatches that found no host,
// the rest copies of them written to the store: what enqueueing costs is
// BenchmarkQueueCostPerWaitingRun's), then the hosts join (registered,
// probed), each probe waking its host with its free slots. Each round the
// test ends about half the running runs on their hosts, at random, and
// GETs each (Fleet pulls the run through from its host: the end written,
// its host woken); the wakes Fleet sent (held: the stack's Waker) are
// delivered as the dispatcher function takes them, in batches of
// queueBurstBatch:
//
//   - per-host: one FillHosts per host of a batch, the batch's hosts at
//     once, as wake.Dispatcher does (a failing host redelivers its own
//     wakes only): fills of hosts that share a class race for its head;
//   - per-batch: one FillHosts of the batch's wakes, which shares the
//     heads it reads among the batch's hosts: the comparison.
//
// Asserted, every round: no host has a free slot while a run it can take
// waits (the queue drains at the rate hosts free slots: the starts of a
// round are the slots its ends freed while every class has more waiting
// than the fleet has slots); each class's started runs are its first in
// queue order (FIFO). Over the burst: every run started exactly once,
// with one host start call (nothing is redelivered here: none beyond).
// Reported: DynamoDB units per start (the fills), per end recorded (the
// GET), dispatcher invocations, FillHosts calls and host start calls per
// start, the rounds, and one sweep pass over the whole queue before the
// drain (each pass reads the queue index for timeouts, not the waiting
// runs). One drain per mode per call, whatever b.N.
func BenchmarkQueueBurstDrain(b *testing.B) {
	n := burstRuns(b)
	for _, mode := range []string{"per-host", "per-batch"} {
		b.Run(fmt.Sprintf("runs=%d/%s", n, mode), func(b *testing.B) { drainBurst(b, n, mode == "per-host") })
	}
}

func drainBurst(b *testing.B, n int, perHost bool) {
	d := newBurst(b, n)
	d.perHost = perHost
	ctx := context.Background()

	// A sweep of the burst, waiting, as the sweep function runs it each
	// minute.
	d.s.meter.Reset()
	began := time.Now()
	rep, err := d.s.app.Fleet.Sweep(ctx, fleet.SweepOptions{})
	sweepTook := time.Since(began)
	if err != nil || rep.Queued != n {
		b.Fatalf("a sweep of %d waiting runs: %+v, %v", n, rep, err)
	}
	sweep := d.s.meter.Snapshot()
	b.Logf("a sweep pass over %d waiting runs, in %s on moto: %s", n, sweepTook.Round(time.Millisecond), sweep)

	b.ResetTimer()
	began = time.Now()
	wakes := d.waker.take()
	if len(wakes) != queueBurstHosts {
		b.Fatalf("the hosts' probes woke %+v, want each host with its free slots", wakes)
	}
	freed, steadyStarts, steadyFreed := 0, 0, 0
	for round := 0; d.started < n; round++ {
		if len(wakes) == 0 {
			b.Fatalf("round %d: %d of %d runs started and nothing running to end", round, d.started, n)
		}
		before := d.started
		steady := d.minWaiting() >= queueBurstHosts*queueBurstSlots
		d.deliver(b, wakes, round)
		d.check(b, round)
		if round > 0 && steady {
			if d.started-before != freed {
				b.Fatalf("round %d: %d started for %d slots freed, with every class waiting", round, d.started-before, freed)
			}
			steadyStarts, steadyFreed = steadyStarts+d.started-before, steadyFreed+freed
		}
		d.starts = append(d.starts, d.started-before)
		freed, wakes = d.endSome(b, round)
		d.ends = append(d.ends, freed)
	}
	b.StopTimer()
	took := time.Since(began)
	d.finish(b)

	starts := float64(n)
	b.ReportMetric(d.fills.TotalRCU()/starts, "RCU/start")
	b.ReportMetric(d.fills.TotalWCU()/starts, "WCU/start")
	b.ReportMetric(float64(d.fills.TotalCalls())/starts, "ddbcalls/start")
	b.ReportMetric(d.fills.Dollars(dynamostore.OnDemandUSEast1)/starts*1e6, "$ddb-fill/M")
	b.ReportMetric(d.recorded.TotalRCU()/float64(d.endsRecorded), "RCU/endrecorded")
	b.ReportMetric(d.recorded.TotalWCU()/float64(d.endsRecorded), "WCU/endrecorded")
	b.ReportMetric(float64(d.hostStartCalls())/starts, "hoststarts/start")
	b.ReportMetric(float64(d.invocations)/starts, "invocations/start")
	b.ReportMetric(float64(d.fillCalls)/starts, "fillhosts/start")
	b.ReportMetric(float64(len(d.starts)), "rounds")
	if steadyFreed > 0 {
		// The rounds with more waiting in every class than the fleet has
		// slots (asserted equal): the drain's rate against the slots'.
		b.ReportMetric(float64(steadyStarts)/float64(steadyFreed), "starts/slotfreed")
	}
	b.ReportMetric(starts/took.Seconds(), "starts/s")
	b.ReportMetric(sweep.TotalRCU()/float64(n), "sweepRCU/waitingrun")
	b.ReportMetric(sweepTook.Seconds(), "sweep-s/pass")
	b.Logf("%d runs drained in %d rounds in %s on moto; fills per start: %s", n, len(d.starts), took.Round(time.Millisecond),
		perMinute(d.fills, starts))
	b.Logf("ends recorded (GET) per end: %s", perMinute(d.recorded, float64(d.endsRecorded)))
	b.Logf("starts per round (the first from the hosts' free slots): %v", d.starts)
	b.Logf("slots freed per round: %v", d.ends)
}

// burstHost is one of the burst's hosts and the runs it runs.
type burstHost struct {
	id      string
	pool    string
	host    *fakehost.Host
	running map[string]string // Fleet's run id -> the host's
	seen    int               // the host's starts already noted
}

// burst is a drain in progress: the stack (its wakes held), the hosts,
// the queue as the test wrote it, and what has been counted.
type burst struct {
	s     *stack
	waker *heldWakes
	hosts []*burstHost
	rng   *rand.Rand
	// perHost: one FillHosts per host of a batch (deliver).
	perHost bool
	// alice is the runs' owner's token.
	alice string
	// classes are the burst's: agentOnly, poolA, poolB.
	classes                 []string
	agentOnly, poolA, poolB string

	// order is each class's runs in queue order; next, how many of them
	// have started; classOf, each run's class.
	order   map[string][]string
	next    map[string]int
	classOf map[string]string
	// startedIn is the round each run started in.
	startedIn map[string]int
	started   int

	// fills and recorded are the DynamoDB units of the fills and of the
	// ends recorded; starts and ends, each round's.
	fills, recorded dynamostore.Usage
	endsRecorded    int
	invocations     int
	fillCalls       int
	starts, ends    []int
}

// newBurst queues n runs, then registers the hosts, all idle: each joins
// as a host does (registered, then probed), and its probe wakes it with
// its free slots (the wakes held, the drain's first).
func newBurst(b *testing.B, n int) *burst {
	b.Helper()
	w := &heldWakes{}
	s := newStack(b, "dynamodb", stackOptions{meter: &dynamostore.Meter{}, waker: w})
	d := &burst{s: s, waker: w, rng: rand.New(rand.NewPCG(34, 10000)), alice: s.mint(b, "alice", "*", "*"),
		order: map[string][]string{}, next: map[string]int{}, classOf: map[string]string{}, startedIn: map[string]int{}}
	d.agentOnly, d.poolA, d.poolB = fleet.ClassOf("shell", nil), fleet.ClassOf("shell", map[string]string{"pool": "a"}),
		fleet.ClassOf("shell", map[string]string{"pool": "b"})
	d.classes = []string{d.agentOnly, d.poolA, d.poolB}

	// One dispatch per class while no host exists: queued without a host
	// call, each the template of its class's copies.
	ctx := context.Background()
	templates := map[string]store.Run{}
	for _, labels := range []string{``, `,"labels":{"pool":"a"}`, `,"labels":{"pool":"b"}`} {
		a := s.must(b, http.StatusAccepted, "POST", "/fleet/runs", d.alice,
			`{"agent":"shell","prompt":"make test"`+labels+`,"queue":{"timeout":"24h"}}`)
		r, err := s.app.Store.GetRun(ctx, a.str("fleetRunId"))
		if err != nil || r.Queue == nil {
			b.Fatalf("template %s: %+v, %v", a.raw, r, err)
		}
		templates[r.Queue.Class] = r
		d.queue(r)
	}
	// The copies, each a microsecond after the one before, in turn over
	// the classes.
	began := time.Now()
	copies := make(chan int)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range copies {
				r := templates[d.classes[i%3]]
				q := *r.Queue
				q.Since = r.Queue.Since.Add(time.Duration(i) * time.Microsecond)
				q.Until = q.Since.Add(q.Timeout)
				r.Queue = &q
				r.FleetRunID = burstRunID(i)
				r.CreatedAt, r.UpdatedAt, r.Version = q.Since, q.Since, 0
				if err := s.app.Store.CreateRun(ctx, r); err != nil {
					failed.Store(&err)
				}
			}
		}()
	}
	for i := 3; i < n; i++ {
		copies <- i
		d.classOf[burstRunID(i)] = d.classes[i%3]
	}
	close(copies)
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatalf("queueing the burst: %v", *err)
	}
	for i := 3; i < n; i++ {
		c := d.classes[i%3]
		d.order[c] = append(d.order[c], burstRunID(i))
	}
	b.Logf("queued %d runs in %s", n, time.Since(began).Round(time.Millisecond))

	for i := range queueBurstHosts {
		pool := []string{"a", "b"}[i%2]
		id := fmt.Sprintf("b%02d", i)
		h := s.addHost(b, id, fakehost.Config{MaxConcurrent: queueBurstSlots}, map[string]any{"labels": map[string]string{"pool": pool}})
		s.probe(b, id)
		d.hosts = append(d.hosts, &burstHost{id: id, pool: pool, host: h, running: map[string]string{}})
	}
	return d
}

// queue notes r, just queued, at the end of its class.
func (d *burst) queue(r store.Run) {
	d.order[r.Queue.Class] = append(d.order[r.Queue.Class], r.FleetRunID)
	d.classOf[r.FleetRunID] = r.Queue.Class
}

// burstRunID is the i-th copy's run id, of the form Fleet makes its own
// (fr- and 26 of [a-z2-7]): its digits as letters.
func burstRunID(i int) string {
	digits := []byte(fmt.Sprintf("%06d", i))
	for k := range digits {
		digits[k] += 'a' - '0'
	}
	return "fr-queuedburstrunabcdef" + string(digits)
}

// deliver hands wakes to FillHosts as the dispatcher function does: in
// batches of queueBurstBatch messages (one invocation each), a batch's
// wakes of one host added up; with d.perHost one FillHosts per host, the
// batch's hosts filled at once (wake.Dispatcher), else one FillHosts of
// the whole batch. The fills' DynamoDB units are counted in d.fills.
func (d *burst) deliver(b *testing.B, wakes []fleet.Wake, round int) {
	b.Helper()
	d.s.meter.Reset()
	for len(wakes) > 0 {
		batch := wakes[:min(queueBurstBatch, len(wakes))]
		wakes = wakes[len(batch):]
		d.invocations++
		var hosts []fleet.Wake
		at := map[string]int{}
		for _, w := range batch {
			if i, ok := at[w.HostID]; ok {
				hosts[i].Slots += w.Slots
				continue
			}
			at[w.HostID] = len(hosts)
			hosts = append(hosts, w)
		}
		calls := [][]fleet.Wake{hosts}
		if d.perHost {
			calls = calls[:0]
			for _, w := range hosts {
				calls = append(calls, []fleet.Wake{w})
			}
		}
		reps := make([]fleet.FillReport, len(calls))
		errs := make([]error, len(calls))
		var wg sync.WaitGroup
		for i, ws := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				reps[i], errs[i] = d.s.app.Fleet.FillHosts(context.Background(), ws)
			}()
		}
		wg.Wait()
		d.fillCalls += len(calls)
		for i, rep := range reps {
			if errs[i] != nil {
				b.Fatalf("round %d: filling %+v: %v", round, calls[i], errs[i])
			}
			for _, id := range rep.Started {
				if _, again := d.startedIn[id]; again {
					b.Fatalf("round %d: run %s started again (first in round %d)", round, id, d.startedIn[id])
				}
				d.startedIn[id] = round
				d.started++
				d.next[d.classOf[id]]++
			}
		}
	}
	u := d.s.meter.Snapshot()
	d.fills.Calls, d.fills.RCU, d.fills.WCU = addCounts(d.fills.Calls, u.Calls), addUnits(d.fills.RCU, u.RCU), addUnits(d.fills.WCU, u.WCU)

	// What the hosts run now, from their own starts: a host names its
	// runs run-1, run-2, ... in the order it created them.
	for _, h := range d.hosts {
		starts := h.host.Starts()
		for k := h.seen; k < len(starts); k++ {
			id, _, _ := strings.Cut(starts[k].ClientToken, ".q")
			child := fmt.Sprintf("run-%d", k+1)
			if r, ok := h.host.Run(child); !ok || r.ClientToken != starts[k].ClientToken {
				b.Fatalf("host %s: start %d (token %s) is not its run %s: %+v", h.id, k, starts[k].ClientToken, child, r)
			}
			if r, ok := d.startedIn[id]; !ok || r != round {
				b.Fatalf("round %d: host %s created a run for %s, which no fill reported started", round, h.id, id)
			}
			h.running[id] = child
		}
		h.seen = len(starts)
	}
}

// check asserts, after a round's fills, that no host has a free slot while
// a run it can take waits, and that each class's started runs are its
// first in queue order.
func (d *burst) check(b *testing.B, round int) {
	b.Helper()
	for _, h := range d.hosts {
		if free := queueBurstSlots - len(h.running); free > 0 {
			for _, c := range []string{d.agentOnly, h.poolClass(d)} {
				if left := len(d.order[c]) - d.next[c]; left > 0 {
					b.Fatalf("round %d: host %s has %d free slots while %d runs of %s it can take wait", round, h.id, free, left, c)
				}
			}
		}
	}
	for _, c := range d.classes {
		k := d.next[c]
		for i, id := range d.order[c] {
			if _, started := d.startedIn[id]; started != (i < k) {
				b.Fatalf("round %d: class %s: run %d of the queue (%s) started %v with %d started: not in queue order", round, c, i+1, id, started, k)
			}
		}
	}
}

// poolClass is the class only h's half of the fleet serves.
func (h *burstHost) poolClass(d *burst) string {
	if h.pool == "a" {
		return d.poolA
	}
	return d.poolB
}

// minWaiting is the fewest runs any class has waiting.
func (d *burst) minWaiting() int {
	least := -1
	for _, c := range d.classes {
		if left := len(d.order[c]) - d.next[c]; least < 0 || left < least {
			least = left
		}
	}
	return least
}

// endSome ends about half the running runs on their hosts, at random, and
// has Fleet record each end as a GET does (at most 8 at once); it returns
// how many slots that freed and the wakes Fleet sent. The recording's
// DynamoDB units are counted in d.recorded.
func (d *burst) endSome(b *testing.B, round int) (int, []fleet.Wake) {
	b.Helper()
	type ended struct {
		h  *burstHost
		id string
	}
	var ends []ended
	for _, h := range d.hosts {
		ids := make([]string, 0, len(h.running))
		for id := range h.running {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			if d.rng.IntN(2) == 0 {
				continue
			}
			h.host.SetRun(h.running[id], hostproto.StatusSucceeded, new(int), "")
			delete(h.running, id)
			ends = append(ends, ended{h, id})
		}
	}
	if len(ends) == 0 && d.started < len(d.classOf) {
		// Let one run end at least: a round frees a slot.
		for _, h := range d.hosts {
			for id, child := range h.running {
				h.host.SetRun(child, hostproto.StatusSucceeded, new(int), "")
				delete(h.running, id)
				ends = append(ends, ended{h, id})
				break
			}
			if len(ends) > 0 {
				break
			}
		}
	}
	d.s.meter.Reset()
	jobs := make(chan ended)
	errs := make(chan error, len(ends))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range jobs {
				a, err := d.s.send("GET", "/fleet/runs/"+e.id, d.alice, "")
				run, _ := a.body["run"].(map[string]any)
				if err == nil && (a.status != http.StatusOK || run["status"] != hostproto.StatusSucceeded) {
					err = fmt.Errorf("run %s, ended on %s, read %d %s", e.id, e.h.id, a.status, a.raw)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	for _, e := range ends {
		jobs <- e
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("round %d: recording an end: %v", round, err)
	}
	u := d.s.meter.Snapshot()
	d.recorded.Calls, d.recorded.RCU, d.recorded.WCU = addCounts(d.recorded.Calls, u.Calls), addUnits(d.recorded.RCU, u.RCU), addUnits(d.recorded.WCU, u.WCU)
	d.endsRecorded += len(ends)
	wakes := d.waker.take()
	// While runs wait, every end wakes its host; once every run started,
	// an end may find that nothing waits and wake nobody.
	if len(wakes) != len(ends) && (d.started < len(d.classOf) || len(wakes) > len(ends)) {
		b.Fatalf("round %d: %d runs ended, %d wakes sent", round, len(ends), len(wakes))
	}
	return len(ends), wakes
}

// hostStartCalls counts every start call the hosts answered.
func (d *burst) hostStartCalls() int {
	n := 0
	for _, h := range d.hosts {
		n += h.host.StartCalls()
	}
	return n
}

// finish asserts what the whole drain must show: every run started
// exactly once, with one host start call each, and a wake with nothing
// waiting starts nothing.
func (d *burst) finish(b *testing.B) {
	b.Helper()
	created := 0
	for _, h := range d.hosts {
		created += h.host.Created()
	}
	if n := len(d.classOf); d.started != n || len(d.startedIn) != n || created != n {
		b.Fatalf("%d runs queued, %d started, %d distinct, %d created on the hosts", n, d.started, len(d.startedIn), created)
	}
	if calls := d.hostStartCalls(); calls != d.started {
		b.Fatalf("%d host start calls for %d starts: want one a start (nothing redelivered here)", calls, d.started)
	}
	for _, h := range d.hosts {
		rep, err := d.s.app.Fleet.FillHosts(context.Background(), []fleet.Wake{{HostID: h.id, Slots: queueBurstSlots, Reason: fleet.WakeProbe}})
		if err != nil || rep.Offered != 0 {
			b.Fatalf("a fill of %s with nothing waiting: %+v, %v", h.id, rep, err)
		}
	}
}
