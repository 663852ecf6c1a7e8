package tests

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// sweepCost is one sub-benchmark's cost per live run per sweep; seconds
// is the sweep's wall time per live run (loopback host, moto).
type sweepCost struct{ rcu, wcu, calls, hostCalls, seconds float64 }

// BenchmarkSweepCost reports what one sweep costs per live run on DynamoDB
// (moto_server, priced by dynamostore.Meter) and in host calls, with 20
// live runs among 100 and among 10,000 runs in all: the cost must not grow
// with the ended runs. "steady": nothing new on the hosts; "active": one
// new output event per live run per sweep. The ratios of the two totals
// are logged at the end.
func BenchmarkSweepCost(b *testing.B) {
	const liveRuns = 20
	costs := map[string]sweepCost{}
	for _, total := range []int{100, 10000} {
		for _, mode := range []string{"steady", "active"} {
			name := fmt.Sprintf("total=%d/live=%d/%s", total, liveRuns, mode)
			b.Run(name, func(b *testing.B) {
				costs[fmt.Sprintf("%s/%d", mode, total)] = benchSweep(b, total, liveRuns, mode == "active")
			})
		}
	}
	// The growth from 100 to 10,000 runs, per live run (1 = none), in the
	// benchmark's own output format.
	for _, mode := range []string{"steady", "active"} {
		small, large := costs[mode+"/100"], costs[mode+"/10000"]
		if small.calls == 0 || large.calls == 0 {
			continue // a -bench filter left one out
		}
		b.Run("growth-10000-vs-100/"+mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
			}
			b.ReportMetric(large.rcu/small.rcu, "xRCU")
			b.ReportMetric(large.calls/small.calls, "xddbcalls")
			b.ReportMetric(large.hostCalls/small.hostCalls, "xhostcalls")
			if small.wcu > 0 {
				b.ReportMetric(large.wcu/small.wcu, "xWCU")
			}
		})
	}
}

// BenchmarkSweepReach proves the sweep's reach at 20,000 live runs on
// moto, with a budget of 2,000 runs per sweep: every run synced within
// N = 10 sweeps of the start and of its previous sync (N+1 for runs created
// behind the cursor), over 2N+1 sweeps (sweepReach), and what a steady
// sweep costs per run synced. One proof per call, whatever b.N.
func BenchmarkSweepReach(b *testing.B) {
	const live, perSweep = 20000, 2000
	r := sweepReach(b, live, perSweep)
	b.ReportMetric(float64(r.bound), "N")
	b.ReportMetric(float64(r.worstGap), "worstgap-sweeps")
	b.ReportMetric(r.rcu, "RCU/runsynced")
	b.ReportMetric(r.wcu, "WCU/runsynced")
	b.ReportMetric(r.maxLag, "maxlag-s")
	b.ReportMetric(r.maxTruth, "maxtrueage-s")
	b.ReportMetric(r.took.Seconds(), "s-for-2N+1-sweeps")
}

func benchSweep(b *testing.B, total, liveRuns int, active bool) sweepCost {
	meter := &dynamostore.Meter{}
	s := newStack(b, "dynamodb", stackOptions{meter: meter})
	host := s.addHost(b, "h1", fakehost.Config{}, nil)
	s.probe(b, "h1")
	alice := s.mint(b, "alice", "*", "*")
	ended := s.must(b, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
	zero := 0
	host.SetRun(ended.str("childRunId"), hostproto.StatusSucceeded, &zero, "")
	s.sweep(b)
	seedEndedRuns(b, s, ended.str("fleetRunId"), total-liveRuns-1)
	var children []string
	for i := 0; i < liveRuns; i++ {
		children = append(children, s.must(b, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`).str("childRunId"))
	}
	s.sweep(b)

	var usage dynamostore.Usage
	hostCalls := 0
	var took time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if active {
			for _, c := range children {
				host.AppendOutput(c, fmt.Sprintf("line %d\n", i))
			}
		}
		meter.Reset()
		host.ResetRequests()
		b.StartTimer()
		began := time.Now()
		rep, err := s.app.Fleet.Sweep(context.Background(), fleet.SweepOptions{})
		took += time.Since(began)
		b.StopTimer()
		if err != nil || rep.Live != liveRuns {
			b.Fatalf("sweep = %+v, %v", rep, err)
		}
		u := meter.Snapshot()
		usage.Calls = addCounts(usage.Calls, u.Calls)
		usage.RCU = addUnits(usage.RCU, u.RCU)
		usage.WCU = addUnits(usage.WCU, u.WCU)
		for _, n := range host.Requests() {
			hostCalls += n
		}
		b.StartTimer()
	}
	b.StopTimer()
	per := float64(b.N * liveRuns)
	c := sweepCost{rcu: usage.TotalRCU() / per, wcu: usage.TotalWCU() / per, calls: float64(usage.TotalCalls()) / per, hostCalls: float64(hostCalls) / per, seconds: took.Seconds() / per}
	b.ReportMetric(c.rcu, "RCU/liverun")
	b.ReportMetric(c.wcu, "WCU/liverun")
	b.ReportMetric(c.calls, "ddbcalls/liverun")
	b.ReportMetric(c.hostCalls, "hostcalls/liverun")
	return c
}

func addCounts(a, b map[string]int) map[string]int {
	if a == nil {
		a = map[string]int{}
	}
	for k, v := range b {
		a[k] += v
	}
	return a
}

func addUnits(a, b map[string]float64) map[string]float64 {
	if a == nil {
		a = map[string]float64{}
	}
	for k, v := range b {
		a[k] += v
	}
	return a
}

// BenchmarkStreamEvents reports how fast the stream sends a mirror to a
// client over HTTP (the local stack's adapter): each iteration reads a
// finished run's 2,000 mirrored events (about 120 bytes of data each) from
// the first to done.
func BenchmarkStreamEvents(b *testing.B) {
	const n = 2000
	for _, kind := range storeKinds {
		b.Run(kind, func(b *testing.B) {
			s := newStack(b, kind, stackOptions{})
			host := s.addHost(b, "h1", fakehost.Config{}, nil)
			s.probe(b, "h1")
			alice := s.mint(b, "alice", "*", "*")
			a := s.must(b, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			id, child := a.str("fleetRunId"), a.str("childRunId")
			line := strings.Repeat("output ", 16)
			for i := 0; i < n-2; i++ {
				host.AppendOutput(child, fmt.Sprintf("%04d %s\n", i, line))
			}
			zero := 0
			host.SetRun(child, hostproto.StatusSucceeded, &zero, "")
			s.sweep(b)
			if run, _ := s.app.Store.GetRun(context.Background(), id); !run.Drained || run.EventCursor != n {
				b.Fatalf("setup: %+v", run)
			}
			b.ResetTimer()
			begun := time.Now()
			var bytes int64
			for i := 0; i < b.N; i++ {
				got, size := readWholeStream(b, s, id, alice)
				if got != n {
					b.Fatalf("read %d events, want %d", got, n)
				}
				bytes += size
			}
			elapsed := time.Since(begun)
			b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(bytes)/elapsed.Seconds()/1e6, "MB/s")
		})
	}
}

// readWholeStream reads a finished run's stream to done and counts its
// event messages and bytes.
func readWholeStream(b *testing.B, s *stack, id, token string) (int, int64) {
	req, _ := http.NewRequest("GET", s.srv.URL+"/fleet/runs/"+id+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := s.srv.Client().Do(req)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	events, size, done := 0, int64(0), false
	for sc.Scan() {
		line := sc.Text()
		size += int64(len(line)) + 1
		switch line {
		case "event: event":
			events++
		case "event: done":
			done = true
		}
	}
	if !done {
		b.Fatal("the stream ended without done")
	}
	return events, size
}
