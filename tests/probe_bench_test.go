package tests

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
)

// probeBenchTarget is the fleet BenchmarkProbeCostQuietFleet prices
// from its largest measured one; probeBenchBeforePasses are the passes
// it measures writing every probe.
const (
	probeBenchTarget       = 10000
	probeBenchBeforePasses = 3
)

// passUnits are the DynamoDB units of probe passes: on the hosts table
// (the scan, the probes' writes, the routing view), split so that it
// scales, and on any other table (the queue's classes).
type passUnits struct {
	passes int
	// hostsRCU is the scan's (and the view's index read): linear in hosts.
	hostsRCU float64
	// probeWCU are the probes' writes: linear in hosts; viewWCU the
	// routing view's: bounded (at most RouteShardsMax shards a list).
	probeWCU, viewWCU float64
	// otherRCU, otherWCU: other tables, whatever the fleet's size.
	otherRCU, otherWCU float64
}

// add adds one pass's usage u, whose view cost view WCU (a quiet pass's
// hosts WCU: it writes no probe).
func (p *passUnits) add(u dynamostore.Usage, view float64) {
	p.passes++
	p.hostsRCU += u.RCU["hosts"]
	p.viewWCU += view
	p.probeWCU += u.WCU["hosts"] - view
	p.otherRCU += u.TotalRCU() - u.RCU["hosts"]
	p.otherWCU += u.TotalWCU() - u.WCU["hosts"]
}

// perDay is a day of passes (costPassesPerDay) at hosts hosts, measured
// at measured: the linear parts scaled, the view and other tables not.
func (p passUnits) perDay(hosts, measured int) (rcu, wcu float64) {
	k := float64(hosts) / float64(measured)
	perPass := float64(costPassesPerDay) / float64(p.passes)
	return (p.hostsRCU*k + p.otherRCU) * perPass, (p.probeWCU*k + p.viewWCU + p.otherWCU) * perPass
}

func dollars(rcu, wcu float64) float64 {
	p := dynamostore.OnDemandUSEast1
	return (rcu*p.ReadPerMillion + wcu*p.WritePerMillion) / 1e6
}

// BenchmarkProbeCostQuietFleet prices a day of probe passes (one a
// minute) over quiet hosts in DynamoDB, now and before the probe wrote
// only what changed, both measured in the same run on moto at 10 and
// 1,000 hosts (dynamostore.Meter, priced at OnDemandUSEast1), and at
// 10,000 from the 1,000-host passes (a pass at that size takes minutes
// on moto):
//
//   - now: the passes of one refresh interval (ProbeRefresh, 15 minutes of
//     the default 30-minute ProbeMaxAge, one pass a minute) after every
//     host was written: 14 passes that write no probe and the one that
//     rewrites every record, as a fleet whose records are spread over the
//     interval writes a fifteenth of them each pass;
//   - before: passes by a Fleet on the same store with ProbeRefresh 1 ns,
//     which records every probe, as every pass did (each such pass costs
//     the same: probeBenchBeforePasses of them are averaged).
//
// At 10,000 the scan and the probes' writes are scaled; the routing view,
// bounded whatever the fleet's size (store.RouteShardsMax shards a list),
// is not. It fails when now costs more than a tenth of before at 10,000
// hosts; it asserts nothing timed. Run it with -benchtime 1x.
func BenchmarkProbeCostQuietFleet(b *testing.B) {
	var at1000 [2]passUnits
	for _, hosts := range []int{10, 1000, probeBenchTarget} {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			var now, old passUnits
			measured := hosts
			if hosts > 1000 {
				if at1000[0].passes == 0 {
					b.Fatal("the 1,000-host passes were not measured (a -bench filter?)")
				}
				now, old, measured = at1000[0], at1000[1], 1000
			} else {
				now, old = benchProbePasses(b, hosts)
				if hosts == 1000 {
					at1000 = [2]passUnits{now, old}
				}
			}
			nowRCU, nowWCU := now.perDay(hosts, measured)
			oldRCU, oldWCU := old.perDay(hosts, measured)
			nowUSD, oldUSD := dollars(nowRCU, nowWCU), dollars(oldRCU, oldWCU)
			b.ReportMetric(nowRCU, "RCU/day-now")
			b.ReportMetric(nowWCU, "WCU/day-now")
			b.ReportMetric(nowUSD, "$/day-now")
			b.ReportMetric(oldRCU, "RCU/day-before")
			b.ReportMetric(oldWCU, "WCU/day-before")
			b.ReportMetric(oldUSD, "$/day-before")
			b.ReportMetric(nowUSD/oldUSD, "now/before")
			perPass := func(p passUnits) string {
				n := float64(p.passes)
				return fmt.Sprintf("scan %.1f RCU, probes %.1f WCU, view %.1f WCU, other %.2f RCU %.2f WCU", p.hostsRCU/n, p.probeWCU/n, p.viewWCU/n, p.otherRCU/n, p.otherWCU/n)
			}
			b.Logf("a pass at %d hosts, averaged over a refresh interval: now %s; before %s", measured, perPass(now), perPass(old))
			b.Logf("a day at %d quiet hosts: now %.0f RCU + %.0f WCU = $%.3f; before %.0f RCU + %.0f WCU = $%.3f (%.3f of before)",
				hosts, nowRCU, nowWCU, nowUSD, oldRCU, oldWCU, oldUSD, nowUSD/oldUSD)
			if hosts == probeBenchTarget && nowUSD > oldUSD/10 {
				b.Fatalf("the probe's DynamoDB at %d quiet hosts costs $%.2f a day, more than a tenth of $%.2f", hosts, nowUSD, oldUSD)
			}
		})
	}
}

// benchProbePasses measures, b.N times over n quiet hosts, the passes of a
// refresh interval (now) and probeBenchBeforePasses passes that record
// every probe (old).
func benchProbePasses(b *testing.B, n int) (now, old passUnits) {
	s, _ := quietFleet(b, n)
	before, err := fleet.New(fleet.Config{
		Store: s.app.Store, Credentials: s.app.Credentials, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Clock: s.clk, DialContext: dialLoopbackOnly, ProbeMaxAge: probeMaxAge, ProbeRefresh: time.Nanosecond,
	})
	if err != nil {
		b.Fatal(err)
	}
	interval := int(probeRefresh / time.Minute)
	b.ResetTimer()
	for range b.N {
		// Every record due, written; then the interval.
		s.clk.Advance(probeRefresh)
		probePass(b, s, s.app.Fleet, n)
		var passes []dynamostore.Usage
		view := -1.0
		for range interval {
			s.clk.Advance(time.Minute)
			rep, u := probePass(b, s, s.app.Fleet, n)
			if rep.Written == 0 {
				view = u.WCU["hosts"]
			}
			passes = append(passes, u)
		}
		if view < 0 {
			b.Fatal("no pass of the interval was quiet")
		}
		for _, u := range passes {
			now.add(u, view)
		}
		for range probeBenchBeforePasses {
			s.clk.Advance(time.Minute)
			rep, u := probePass(b, s, before, n)
			if rep.Written != n {
				b.Fatalf("a pass recording every probe recorded %d of %d", rep.Written, n)
			}
			old.add(u, view)
		}
	}
	b.StopTimer()
	return now, old
}
