package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// ledgerRecords is n records as a busy agent's traffic makes them: a few
// authorities, API paths with masked query values, keys, sizes and times
// that vary.
func ledgerRecords(from, n int) []egress.Record {
	authorities := []string{"api.github.com:443", "github.com:443", "registry.npmjs.org:443", "api.openai.com:443", "s3.eu-west-1.amazonaws.com:443"}
	paths := []string{"/repos/acme/app/pulls?state=*&per_page=*", "/acme/app.git/info/refs?service=*", "/@types%2fnode",
		"/v1/chat/completions", "/acme-artifacts/builds/2026/12/06/app.tar.gz?X-Amz-Expires=*"}
	out := make([]egress.Record, n)
	for i := range out {
		k := from + i
		out[i] = egress.Record{Via: egress.ViaProxy, Authority: authorities[k%5], Method: []string{"GET", "POST"}[k%2], Path: paths[k%5],
			Status: []int{200, 200, 201, 304, 403}[k%5], BytesUp: int64(200 + k*37%4000), BytesDown: int64(1000 + k*7919%500000),
			DurationUs: int64(3000 + k*104729%900000), Keys: []string{[]string{"acme/GITHUB_TOKEN", "acme/NPM_TOKEN", "acme/OPENAI_KEY", "acme/AWS_BUILD"}[k%4]},
			Action: []string{egress.Substituted, egress.Substituted, egress.Forwarded, egress.Substituted, egress.Blocked}[k%5]}
		if out[i].Action == egress.Blocked {
			out[i].Reason, out[i].Rule = "rule", "projects.acme.keys.GITHUB_TOKEN.rules[1]"
		}
	}
	return out
}

// egressUnits sums a usage's units on the egress table and its index.
func egressUnits(m map[string]float64) float64 {
	var sum float64
	for k, v := range m {
		if k == "egress" || strings.HasPrefix(k, "egress/") {
			sum += v
		}
	}
	return sum
}

// BenchmarkEgressMirrorCost reports what Fleet's egress ledger mirror
// costs on DynamoDB (moto_server, priced by dynamostore.Meter), per ten
// records, for a run of 1,000 records: "sweep", an unwatched run whose
// ledger the sweep copies as it grows by 25 records a minute (batched) and
// at its end; "watched", a run followed by a stream with egress=true,
// copied at every poll as it grows by 2 records a second. Then reading it
// back through the API: a page of 1,000 records, and verify=true. Units
// are the egress table's (records, heads, the alerted index); the sweep's
// own run and events writes are the sweep's cost, reported apart.
func BenchmarkEgressMirrorCost(b *testing.B) {
	const records = 1000
	for _, mode := range []struct {
		name    string
		perStep int
	}{{"sweep", 25}, {"watched", 2}} {
		b.Run(mode.name, func(b *testing.B) {
			meter := &dynamostore.Meter{}
			s := newStack(b, "dynamodb", stackOptions{meter: meter})
			host := s.addHost(b, "h1", fakehost.Config{}, nil)
			s.probe(b, "h1")
			alice := s.mint(b, "alice", "*", "*")
			var wcu, pageRCU, verifyRCU float64
			for i := 0; i < b.N; i++ {
				run := s.must(b, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
				id, child := run.str("fleetRunId"), run.str("childRunId")
				s.sweep(b)
				meter.Reset()
				for added := 0; added < records; added += mode.perStep {
					host.AddEgress(child, ledgerRecords(added, mode.perStep)...)
					if mode.name == "sweep" {
						s.sweep(b)
					} else if _, err := s.app.Fleet.SyncRunEgress(context.Background(), id); err != nil {
						b.Fatal(err)
					}
				}
				host.SetRun(child, hostproto.StatusSucceeded, new(int), "")
				if rep := s.sweep(b); rep.Drained != 1 {
					b.Fatalf("the last sweep = %+v", rep)
				}
				wcu += egressUnits(meter.Snapshot().WCU)

				meter.Reset()
				page := s.must(b, http.StatusOK, "GET", "/fleet/runs/"+id+"/egress?limit=1000", alice, "")
				if n := len(page.body["records"].([]any)); n != records {
					b.Fatalf("a page of %d records, want %d", n, records)
				}
				pageRCU += egressUnits(meter.Snapshot().RCU)
				meter.Reset()
				verified := s.must(b, http.StatusOK, "GET", "/fleet/runs/"+id+"/egress?limit=1&verify=true", alice, "")
				if v := verified.body["verification"].(map[string]any); v["ok"] != true {
					b.Fatalf("verification %v", v)
				}
				verifyRCU += egressUnits(meter.Snapshot().RCU)
			}
			per10 := float64(b.N*records) / 10
			b.ReportMetric(wcu/per10, "WCU/10records")
			b.ReportMetric(pageRCU/per10, "pageRCU/10records")
			b.ReportMetric(verifyRCU/per10, "verifyRCU/10records")
			b.Log(fmt.Sprintf("%s: %.2f WCU, a page %.2f RCU, verify %.2f RCU, per 10 records", mode.name, wcu/per10, pageRCU/per10, verifyRCU/per10))
		})
	}
}
