package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// BenchmarkAdminListPage reports what one admin GET /fleet/runs page (the
// default 100 runs) costs on DynamoDB (moto_server, priced by the Meter)
// with 20,000 ended runs spread over 10 and over 10,000 hosts: DynamoDB
// calls and read units per page, the first page and the next (by cursor).
// Neither may grow with the hosts. (moto answers an index Query by reading
// the whole table, so its pages take seconds here; DynamoDB's do not.)
func BenchmarkAdminListPage(b *testing.B) {
	const runs = 20000
	for _, nHosts := range []int{10, 10000} {
		b.Run(fmt.Sprintf("hosts=%d/runs=%d", nHosts, runs), func(b *testing.B) {
			s := newStack(b, "dynamodb", stackOptions{meter: &dynamostore.Meter{}})
			host := s.addHost(b, "h1", fakehost.Config{}, nil)
			s.probe(b, "h1")
			alice := s.mint(b, "alice", "*", "*")
			template := endedRun(b, s, host, alice)
			hosts := idsOf(seedHosts(b, s, "h1", nHosts-1))
			seeded := time.Now()
			seedRunsOver(b, s, template, hosts, 0, runs-1)
			b.Logf("seeded %d runs over %d hosts in %s", runs, nHosts, time.Since(seeded).Round(time.Second))
			// A later page: where it starts is a key condition on the index,
			// so any later page costs what the second does.
			_, a := listPage(b, s, "")
			middle := "?cursor=" + a.str("nextCursor")

			var first, mid dynamostore.Usage
			b.ResetTimer()
			for b.Loop() {
				u, a := listPage(b, s, "")
				if n := len(runIDs(b, a)); n != store.DefaultLimit {
					b.Fatalf("a page of %d runs", n)
				}
				first = u
				mid, _ = listPage(b, s, middle)
			}
			b.StopTimer()
			b.ReportMetric(float64(first.TotalCalls()), "ddbcalls/page")
			b.ReportMetric(first.TotalRCU(), "RCU/page")
			b.ReportMetric(float64(mid.TotalCalls()), "ddbcalls/nextpage")
			b.ReportMetric(mid.TotalRCU(), "RCU/nextpage")
			b.ReportMetric(first.RCU["hosts"], "hostsRCU/page")
			b.Logf("first page: %s", first)
			b.Logf("next page: %s", mid)
		})
	}
}

// BenchmarkDeleteHostStep reports what a forced DELETE /fleet/hosts/{id}
// costs per run deleted, on DynamoDB priced by the Meter: a host with 350
// ended runs, each with 4 mirrored events (~0.1 KB), deleted in steps of at
// most store.DeleteHostRunsPerStep runs; DynamoDB calls per step and read
// and write units per run over the whole deletion.
func BenchmarkDeleteHostStep(b *testing.B) {
	const runs, eventsPerRun = 350, 4
	var total dynamostore.Usage
	steps, deleted := 0, 0
	for b.Loop() {
		b.StopTimer()
		s := newStack(b, "dynamodb", stackOptions{meter: &dynamostore.Meter{}})
		host := s.addHost(b, "h1", fakehost.Config{}, nil)
		s.probe(b, "h1")
		alice := s.mint(b, "alice", "*", "*")
		template := endedRun(b, s, host, alice)
		ids := append([]string{template}, seedRunsOver(b, s, template, []string{"h1"}, 0, runs-1)...)
		ctx, now := context.Background(), s.clk.Now()
		for _, id := range ids {
			var evs []store.Event
			for seq := int64(1); seq <= eventsPerRun; seq++ {
				evs = append(evs, store.Event{FleetRunID: id, Sequence: seq, Type: "output",
					Data: json.RawMessage(`"make: building target number ` + fmt.Sprint(seq) + `\n"`), TS: now})
			}
			if err := s.app.Store.PutEvents(ctx, evs); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		for {
			s.meter.Reset()
			a := s.do(b, "DELETE", "/fleet/hosts/h1?force=1", adminToken, "")
			u := s.meter.Snapshot()
			total.Calls = addCounts(total.Calls, u.Calls)
			total.RCU = addUnits(total.RCU, u.RCU)
			total.WCU = addUnits(total.WCU, u.WCU)
			steps++
			n, _ := a.body["runsDeleted"].(float64)
			deleted += int(n)
			if a.status == http.StatusOK {
				break
			}
			if a.status != http.StatusAccepted {
				b.Fatalf("DELETE: %d %s", a.status, a.raw)
			}
		}
	}
	if deleted == 0 {
		b.Fatal("nothing deleted")
	}
	b.ReportMetric(float64(total.TotalCalls())/float64(steps), "ddbcalls/step")
	b.ReportMetric(float64(deleted)/float64(steps), "runs/step")
	b.ReportMetric(total.TotalRCU()/float64(deleted), "RCU/run")
	b.ReportMetric(total.TotalWCU()/float64(deleted), "WCU/run")
	b.Logf("%d steps, %d runs: %s", steps, deleted, total)
}

// BenchmarkMetricsPage reports what an admin's GET /metrics costs with
// 10 and 10,000 hosts registered: host calls (scrapes), DynamoDB calls and
// read units per call. The seeded hosts are copies of h1, so every scrape
// reaches h1's fake host.
func BenchmarkMetricsPage(b *testing.B) {
	for _, nHosts := range []int{10, 10000} {
		b.Run(fmt.Sprintf("hosts=%d", nHosts), func(b *testing.B) {
			s := newStack(b, "dynamodb", stackOptions{meter: &dynamostore.Meter{}})
			host := s.addHost(b, "h1", fakehost.Config{}, nil)
			host.SetMetrics("# TYPE edge_tasks_live gauge\nedge_tasks_live 1\n")
			s.probe(b, "h1") // seedHosts copies h1's probe
			seedHosts(b, s, "h1", nHosts-1)
			var u dynamostore.Usage
			scrapes := 0
			for b.Loop() {
				host.ResetRequests()
				s.meter.Reset()
				s.must(b, http.StatusOK, "GET", "/metrics", adminToken, "")
				u = s.meter.Snapshot()
				scrapes = host.Requests()["GET /metrics"]
			}
			b.ReportMetric(float64(scrapes), "hostcalls/call")
			b.ReportMetric(float64(u.TotalCalls()), "ddbcalls/call")
			b.ReportMetric(u.TotalRCU(), "RCU/call")
			b.Logf("GET /metrics at %d hosts: %d scrapes; %s", nHosts, scrapes, u)
		})
	}
}
