package tests

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/scheduled"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
)

// The assumptions that turn measured units and durations into a day's
// bill (README "Cost at scale" lists them beside the table).
const (
	// costDispatchesPerDay: a million dispatches a day (11.6/s).
	costDispatchesPerDay = 1e6
	// costRunMinutes is a run's average life: each dispatch keeps a run
	// in the live index this long, so the sweep syncs it this many times
	// and a million a day keep ~6,944 live at once.
	costRunMinutes = 10
	// costHostLatency is what one host call takes in AWS (dispatch's
	// POST /runs, a probe's /healthz, a sweep's GET /runs/{id}): the
	// host's answer dominates a request and cannot be measured here,
	// where the fake host answers on loopback in microseconds.
	costHostLatency = 100 * time.Millisecond
	// costPassesPerDay: the probe and the sweep are each rate(1 minute).
	costPassesPerDay = 24 * 60
	// costDispatchSample is how many dispatches one iteration measures,
	// so a single iteration (-benchtime 1x) is not one noisy sample.
	costDispatchSample = 20
)

// costRow is one host count's measured cost.
type costRow struct {
	hosts int
	// dispatch: dispatches routed dispatches with an idempotency key;
	// dispatchTook their handler wall time in-process (moto, loopback host).
	dispatch     dynamostore.Usage
	dispatches   int
	dispatchTook time.Duration
	// pass: passes probe passes (Scan of the hosts, RecordProbe per host,
	// the routing view's writes); passTook their wall time here.
	pass     dynamostore.Usage
	passes   int
	passTook time.Duration
	// passScale multiplies pass (1 when measured at this host count).
	passScale float64
}

// BenchmarkCostPerMillionDispatches prices a million dispatches a day at
// 10, 1,000 and 10,000 hosts, from units metered on moto_server
// (dynamostore.Meter, priced at OnDemandUSEast1) and durations measured
// in-process plus costHostLatency per host call:
//
//   - DynamoDB per million dispatches: the routed dispatch itself, and the
//     sweep's syncs of the runs they keep live (costRunMinutes steady
//     syncs each, BenchmarkSweepCost's units per live run per sweep):
//     every live run synced every minute, an upper bound, since a sweep
//     reaches at most sweep-reach-runs/pass of them (reported);
//   - fixed DynamoDB per day, growing with hosts and not with dispatches:
//     costPassesPerDay probe passes, each measured whole at 10 and 1,000
//     hosts; at 10,000 from the 1,000-host pass's units per host (the
//     Scan and RecordProbe are linear in hosts; the view's writes are
//     bounded, so this overstates them);
//   - Lambda: the api function per dispatch (billed the handler's wall
//     time plus costHostLatency), the sweep per day (the live runs' sync
//     time, bounded by its Timeout), the probe per day (the pass's time
//     plus costHostLatency per ProbeConcurrency hosts, bounded by its
//     Timeout);
//   - API Gateway: one HTTP API request per dispatch.
//
// One iteration is costDispatchSample dispatches and one probe pass per
// host count; run it with -benchtime 1x.
func BenchmarkCostPerMillionDispatches(b *testing.B) {
	var sweep sweepCost
	// 200 live runs, so the sweep's own reads and cursor writes are
	// spread as thinly as over thousands.
	b.Run("sweep-steady", func(b *testing.B) { sweep = benchSweep(b, 300, 200, false) })
	var rows []costRow
	var at1000 costRow
	for _, hosts := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			r := benchCostAt(b, hosts, hosts <= 1000)
			if hosts == 1000 {
				at1000 = r
			}
			if hosts > 1000 {
				if at1000.passes == 0 {
					b.Fatal("the 1,000-host pass was not measured (a -bench filter?)")
				}
				r.pass, r.passes, r.passTook, r.passScale = at1000.pass, at1000.passes, at1000.passTook, float64(hosts)/1000
			}
			rows = append(rows, r)
			reportCost(b, priceCost(b, r, sweep))
		})
	}
	if len(rows) == 0 {
		return // a -bench filter left every host count out
	}
	b.Run("table", func(b *testing.B) { logCostTable(b, rows, sweep) })
}

// logCostTable logs the README's "Cost at scale" table.
func logCostTable(b *testing.B, rows []costRow, sweep sweepCost) {
	var table strings.Builder
	fmt.Fprintf(&table, "\n| hosts | DynamoDB per M dispatches (dispatch + sweep) | fixed DynamoDB per day (probe) | Lambda per M dispatches (api + sweep) | fixed Lambda per day (probe) | API Gateway per M dispatches | a day of 1 M dispatches |\n")
	fmt.Fprintf(&table, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		c := priceCost(b, r, sweep)
		fmt.Fprintf(&table, "| %d | $%.2f ($%.2f + $%.2f) | $%.2f | $%.2f ($%.2f + $%.2f) | $%.2f | $%.2f | $%.2f |\n",
			r.hosts, c.ddbDispatch+c.ddbSweep, c.ddbDispatch, c.ddbSweep, c.ddbProbeDay,
			c.lambdaAPI+c.lambdaSweep, c.lambdaAPI, c.lambdaSweep, c.lambdaProbeDay, c.apigw, c.day())
	}
	b.Logf("cost at scale (sweep per live run per sweep: %.3f RCU, %.3f WCU, %.1f host calls, %.1f ms here):%s",
		sweep.rcu, sweep.wcu, sweep.hostCalls, sweep.seconds*1e3, table.String())
}

// benchCostAt measures, over nHosts hosts, costDispatchSample routed
// dispatches per iteration and, when pass, one probe pass per iteration.
func benchCostAt(b *testing.B, nHosts int, pass bool) costRow {
	s, token, _ := routedStack(b, nHosts)
	r := costRow{hosts: nHosts, passScale: 1}
	body := `{"agent":"shell","prompt":"make test","labels":{"pool":"ci"}}`
	var took time.Duration
	s.meter.Reset()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < costDispatchSample; j++ {
			began := time.Now()
			s.must(b, http.StatusCreated, "POST", "/fleet/runs", token, body, "Idempotency-Key", fmt.Sprintf("c-%d-%d", i, j))
			took += time.Since(began)
		}
	}
	b.StopTimer()
	r.dispatch, r.dispatches, r.dispatchTook = s.meter.Snapshot(), b.N*costDispatchSample, took
	b.Logf("per dispatch over %d hosts: %s", nHosts, perMinute(r.dispatch, float64(r.dispatches)))
	if !pass {
		return r
	}
	// The scheduled pass as the probe function runs it, without its
	// budget (the fake clock would not spend it; the Lambda bound is
	// applied in priceCost).
	took = 0
	s.meter.Reset()
	for i := 0; i < b.N; i++ {
		began := time.Now()
		rep, err := s.app.Fleet.ProbeEnabled(context.Background(), time.Time{})
		took += time.Since(began)
		if err != nil || len(rep.Probed) != nHosts {
			b.Fatalf("probe pass over %d hosts: %d probed, %v", nHosts, len(rep.Probed), err)
		}
		for _, p := range rep.Probed {
			if p.Probe.Status != store.ProbeOK {
				b.Fatalf("probe of %s: %+v", p.HostID, p.Probe)
			}
		}
	}
	r.pass, r.passes, r.passTook = s.meter.Snapshot(), b.N, took
	b.Logf("probe pass over %d hosts, in %s: %s", nHosts, (took / time.Duration(b.N)).Round(time.Millisecond), perMinute(r.pass, float64(b.N)))
	return r
}

// cost is one host count's bill in dollars: per million dispatches, or
// per day whatever the dispatches.
type cost struct {
	ddbDispatch, ddbSweep, lambdaAPI, lambdaSweep, apigw float64 // per M dispatches
	ddbProbeDay, lambdaProbeDay                          float64 // per day
	apiSeconds, probeSeconds, sweepSeconds               float64 // billed per invocation
	liveRuns, sweepReach                                 float64
}

// day is a day of costDispatchesPerDay dispatches.
func (c cost) day() float64 {
	perM := c.ddbDispatch + c.ddbSweep + c.lambdaAPI + c.lambdaSweep + c.apigw
	return perM*costDispatchesPerDay/1e6 + c.ddbProbeDay + c.lambdaProbeDay
}

func priceCost(b *testing.B, r costRow, sweep sweepCost) cost {
	prices := dynamostore.OnDemandUSEast1
	host := costHostLatency.Seconds()
	var c cost
	c.ddbDispatch = r.dispatch.Dollars(prices) / float64(r.dispatches) * 1e6
	// Each run is synced once a minute while it lives: the steady units
	// per live run per sweep, costRunMinutes times per dispatch. (Those
	// units include the sweep's per-sweep reads and cursor writes spread
	// over its 20 live runs: more per run than at thousands.)
	c.ddbSweep = (sweep.rcu*prices.ReadPerMillion + sweep.wcu*prices.WritePerMillion) * costRunMinutes
	c.apiSeconds = r.dispatchTook.Seconds()/float64(r.dispatches) + host
	c.lambdaAPI = lambdaDollars(1, c.apiSeconds, functionInt(b, "ApiFunction", "MemorySize")) * 1e6
	c.apigw = priceHTTPAPIRequest * 1e6

	// The sweep: the live runs' sync time, each run's host calls
	// overlapping DefaultSweepConcurrency - 1 other runs', bounded by the
	// Timeout.
	c.liveRuns = costDispatchesPerDay * costRunMinutes / costPassesPerDay
	perRun := sweep.seconds + sweep.hostCalls*host/fleet.DefaultSweepConcurrency
	sweepTimeout := float64(functionInt(b, "SweepFunction", "Timeout"))
	c.sweepSeconds = math.Min(c.liveRuns*perRun, sweepTimeout)
	// What a sweep reaches within its budget: the Timeout less the host
	// timeout and margin (scheduled.Jobs.Sweep), 40 s.
	budget := sweepTimeout - (fleet.DefaultHostTimeout + scheduled.DefaultSweepMargin).Seconds()
	c.sweepReach = budget / perRun
	c.lambdaSweep = lambdaDollars(costPassesPerDay, costPassesPerDay*c.sweepSeconds, functionInt(b, "SweepFunction", "MemorySize")) * 1e6 / costDispatchesPerDay

	c.ddbProbeDay = r.pass.Dollars(prices) / float64(r.passes) * r.passScale * costPassesPerDay
	passSeconds := r.passTook.Seconds() / float64(r.passes) * r.passScale
	waves := math.Ceil(float64(r.hosts) / float64(fleet.DefaultProbeConcurrency))
	c.probeSeconds = math.Min(passSeconds+waves*host, float64(functionInt(b, "ProbeFunction", "Timeout")))
	c.lambdaProbeDay = lambdaDollars(costPassesPerDay, costPassesPerDay*c.probeSeconds, functionInt(b, "ProbeFunction", "MemorySize"))
	return c
}

func reportCost(b *testing.B, c cost) {
	b.ReportMetric(c.ddbDispatch, "$ddb-dispatch/M")
	b.ReportMetric(c.ddbSweep, "$ddb-sweep/M")
	b.ReportMetric(c.ddbProbeDay, "$ddb-probe/day")
	b.ReportMetric(c.lambdaAPI, "$lambda-api/M")
	b.ReportMetric(c.lambdaSweep, "$lambda-sweep/M")
	b.ReportMetric(c.lambdaProbeDay, "$lambda-probe/day")
	b.ReportMetric(c.apigw, "$apigw/M")
	b.ReportMetric(c.day(), "$/day-of-1M")
	b.ReportMetric(c.apiSeconds*1e3, "api-billed-ms/dispatch")
	b.ReportMetric(c.probeSeconds, "probe-billed-s/pass")
	b.ReportMetric(c.sweepSeconds, "sweep-billed-s/pass")
	b.ReportMetric(c.sweepReach, "sweep-reach-runs/pass")
}
