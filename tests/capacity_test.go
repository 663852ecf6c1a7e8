package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
	"github.com/runfleet/runfleet/tests/kit/storetest"
)

// A dispatch's DynamoDB capacity, asserted exactly so that any regression
// fails. The units are DynamoDB's documented rules as dynamostore.Meter
// prices them (its doc comment cites the Developer Guide: 4 KB a read unit,
// halved when eventually consistent; 1 KB a write unit; one write for each
// global secondary index an item enters), counted on the calls a dispatch
// makes on moto_server. README's "Cost at scale" is these figures priced.
//
// Writes, 7: on the tables 3 (the idempotency item, the run, the update
// recording the host's answer); on indexes 4, because the runs table has
// four global secondary indexes (live, byOwner, byHost and all: template.yaml's
// RunsTable, dynamostore's tables.go) and a run's creation enters each,
// while the answer's update touches no index key or projected attribute.
//
// Reads, whatever the number of hosts: 3 units. The caller's token item,
// strongly consistent, 1; the idempotency item, eventually consistent,
// 0.5; on the hosts table, shard 0 of the routing view (under 4 KB,
// eventually consistent) 0.5 and the chosen host's item, strongly
// consistent, 1. A reused dispatch: 2 read units (the token item 1, the
// idempotency item and the run, eventually consistent, 0.5 each), no
// write, no host read.
var (
	newDispatchRCU = map[string]float64{"callers": 1, "idempotency": 0.5, "hosts": 1.5}
	newDispatchWCU = map[string]float64{"idempotency": 1, "runs": 2, "runs/live": 1, "runs/byOwner": 1, "runs/byHost": 1, "runs/all": 1}
	reusedRCU      = map[string]float64{"callers": 1, "idempotency": 0.5, "runs": 0.5}
)

// capacityStack is a DynamoDB stack with a meter and nHosts healthy hosts.
func capacityStack(tb testing.TB, nHosts int) (*stack, string) {
	meter := &dynamostore.Meter{}
	s := newStack(tb, "dynamodb", stackOptions{meter: meter})
	for i := 0; i < nHosts; i++ {
		id := fmt.Sprintf("h%02d", i)
		s.addHost(tb, id, fakehost.Config{}, map[string]any{"labels": map[string]string{"pool": "ci"}})
		s.probe(tb, id)
	}
	return s, s.mint(tb, "alice", "*", "*")
}

// routedStack is a DynamoDB stack of nHosts hosts, all probed ok: h00 a
// real fake host registered and probed through the API, the others copies
// of its item (same address, another id, latency and label) written
// straight into the table with BatchWriteItem; then the routing view is
// written from those records as the probe pass writes it
// (fleet.BuildRouteView, Store.PutRouteView), without the pass's scan,
// which moto serves slowly. It returns the units the view's write cost.
func routedStack(tb testing.TB, nHosts int) (*stack, string, dynamostore.Usage) {
	s, token := capacityStack(tb, 1)
	ctx := context.Background()
	hosts := seedHosts(tb, s, "h00", nHosts-1)
	s.meter.Reset()
	v := fleet.BuildRouteView(hosts, s.clk.Now(), fleet.DefaultProbeMaxAge)
	if _, err := s.app.Fleet.Store().PutRouteView(ctx, v); err != nil {
		tb.Fatal(err)
	}
	return s, token, s.meter.Snapshot()
}

// seedHosts writes n copies of host template's item, ids "s00000"...,
// latencies 1-50 ms (the template's is that of a loopback probe, ~0) and
// a label of its own, and returns every host, the template's first, as
// the store holds them.
func seedHosts(tb testing.TB, s *stack, template string, n int) []store.Host {
	tb.Helper()
	table := s.app.Config.Tables.Hosts
	stored := getItem(tb, table, "id", template)
	if stored["probe"] == nil {
		tb.Fatalf("the template host %s was never probed", template)
	}
	tmpl, err := s.app.Fleet.Store().GetHost(context.Background(), template)
	if err != nil {
		tb.Fatal(err)
	}
	hosts := []store.Host{tmpl}
	items := make([]map[string]types.AttributeValue, 0, n)
	for i := 0; i < n; i++ {
		h := tmpl
		h.ID = fmt.Sprintf("s%05d", i)
		// A label of its own, as real hosts have (a rack, a zone): the
		// view compresses no better than it would in a real fleet.
		h.Labels = map[string]string{"pool": "ci", "rack": fmt.Sprintf("r%x", uint32(i)*2654435761)}
		p := *tmpl.Probe
		p.LatencyMs = int64(1 + i%50)
		h.Probe = &p
		hosts = append(hosts, h)

		item := maps.Clone(stored)
		probe := maps.Clone(stored["probe"].(*types.AttributeValueMemberM).Value)
		probe["latencyMs"] = &types.AttributeValueMemberN{Value: fmt.Sprint(p.LatencyMs)}
		item["probe"] = &types.AttributeValueMemberM{Value: probe}
		item["id"] = &types.AttributeValueMemberS{Value: h.ID}
		labels := map[string]types.AttributeValue{}
		for k, v := range h.Labels {
			labels[k] = &types.AttributeValueMemberS{Value: v}
		}
		item["labels"] = &types.AttributeValueMemberM{Value: labels}
		items = append(items, item)
	}
	batchPut(tb, table, items)
	return hosts
}

// idsOf are the ids of hosts, in order.
func idsOf(hosts []store.Host) []string {
	ids := make([]string, len(hosts))
	for i, h := range hosts {
		ids[i] = h.ID
	}
	return ids
}

func TestDispatchCapacityOnDynamoDB(t *testing.T) {
	s, token := capacityStack(t, 3)
	body := `{"agent":"shell","prompt":"make test","labels":{"pool":"ci"}}`

	s.meter.Reset()
	s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, body, "Idempotency-Key", "cap-1")
	u := s.meter.Snapshot()
	t.Logf("new dispatch: %s", u)
	if !sameUnits(u.RCU, newDispatchRCU) || !sameUnits(u.WCU, newDispatchWCU) {
		t.Errorf("new dispatch: RCU %v, WCU %v; want RCU %v and WCU %v", u.RCU, u.WCU, newDispatchRCU, newDispatchWCU)
	}
	if u.TableWCU() != 3 || u.TotalWCU()-u.TableWCU() != 4 || u.TotalRCU() != 3 {
		t.Errorf("new dispatch: %g table + %g index WCU, %g RCU; want 3 + 4, 3", u.TableWCU(), u.TotalWCU()-u.TableWCU(), u.TotalRCU())
	}
	// The hosts table: two GetItems (the view's shard, the chosen host),
	// never a Scan.
	if u.Calls["Scan"] != 0 || u.Calls["GetItem"] != 4 {
		t.Errorf("new dispatch calls %v; want 4 GetItems (token, idempotency, the view's shard, the host) and no Scan", u.Calls)
	}

	s.meter.Reset()
	s.must(t, http.StatusOK, "POST", "/fleet/runs", token, body, "Idempotency-Key", "cap-1")
	u = s.meter.Snapshot()
	t.Logf("reused dispatch: %s", u)
	if !sameUnits(u.RCU, reusedRCU) || u.TotalWCU() != 0 {
		t.Errorf("reused dispatch: RCU %v, %g WCU; want RCU %v (no host read) and no write", u.RCU, u.TotalWCU(), reusedRCU)
	}
}

// TestRoutedDispatchReadsAreFlatInHosts: at 1,000 hosts a routed dispatch
// reads exactly what it reads at 3 (the routing view's first shard and the
// chosen host), where a scan of the hosts table read ~40-118 units.
func TestRoutedDispatchReadsAreFlatInHosts(t *testing.T) {
	s, token, build := routedStack(t, 1000)
	t.Logf("routing view build at 1,000 hosts: %s", build)
	body := `{"agent":"shell","prompt":"make test","labels":{"pool":"ci"}}`
	s.meter.Reset()
	a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, body, "Idempotency-Key", "flat-1")
	u := s.meter.Snapshot()
	t.Logf("new dispatch over 1,000 hosts: %s", u)
	if !sameUnits(u.RCU, newDispatchRCU) || u.Calls["Scan"] != 0 {
		t.Errorf("new dispatch over 1,000 hosts: RCU %v, calls %v; want RCU %v and no Scan", u.RCU, u.Calls, newDispatchRCU)
	}
	// The fastest host is the template (a loopback probe, 0 ms): Route's
	// choice over every host.
	if a.str("hostId") != "h00" {
		t.Errorf("routed to %s, want h00 (the lowest latency)", a.str("hostId"))
	}
}

// sameUnits compares units per table and index (a unit of zero is absent).
func sameUnits(got, want map[string]float64) bool {
	for k, v := range got {
		if v != want[k] {
			return false
		}
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// BenchmarkDispatchCapacity reports, per dispatch on DynamoDB (moto_server,
// priced by dynamostore.Meter): the calls, the read units (the hosts
// table's apart) and the write units on tables and on indexes; for routed
// dispatch at 10, 1,000 and 10,000 hosts, also what one probe pass's write
// of the routing view costs at that size.
func BenchmarkDispatchCapacity(b *testing.B) {
	body := `{"agent":"shell","prompt":"make test","labels":{"pool":"ci"}}`
	named := `{"host":"h00","agent":"shell","prompt":"make test"}`
	for _, hosts := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("new/routed-over-%d-hosts", hosts), func(b *testing.B) {
			s, token, build := routedStack(b, hosts)
			s.meter.Reset()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.must(b, http.StatusCreated, "POST", "/fleet/runs", token, body, "Idempotency-Key", fmt.Sprintf("n-%d", i))
			}
			b.StopTimer()
			u := s.meter.Snapshot()
			report(b, u, hosts)
			if rcu := u.TotalRCU() / float64(b.N); rcu > 3 {
				b.Errorf("%g RCU per routed dispatch over %d hosts; the bound is 3", rcu, hosts)
			}
			// The pass's own scan of the hosts is the probe's cost, not
			// the view's: the view is its writes.
			b.ReportMetric(build.WCU["hosts"], "viewWCU/pass")
			b.ReportMetric(float64(build.Calls["BatchWriteItem"]+build.Calls["PutItem"]), "viewWrites/pass")
			b.Logf("view build at %d hosts: %s", hosts, build)
		})
	}
	b.Run("new/named-host", func(b *testing.B) {
		s, token := capacityStack(b, 10)
		s.meter.Reset()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			s.must(b, http.StatusCreated, "POST", "/fleet/runs", token, named, "Idempotency-Key", fmt.Sprintf("n-%d", i))
		}
		b.StopTimer()
		report(b, s.meter.Snapshot(), 1)
	})
	b.Run("reused", func(b *testing.B) {
		s, token := capacityStack(b, 1)
		s.must(b, http.StatusCreated, "POST", "/fleet/runs", token, body, "Idempotency-Key", "r")
		s.meter.Reset()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			s.must(b, http.StatusOK, "POST", "/fleet/runs", token, body, "Idempotency-Key", "r")
		}
		b.StopTimer()
		report(b, s.meter.Snapshot(), 0)
	})
}

func report(b *testing.B, u dynamostore.Usage, hosts int) {
	n := float64(b.N)
	gsiWCU := u.TotalWCU() - u.TableWCU()
	b.ReportMetric(float64(u.TotalCalls())/n, "calls/op")
	b.ReportMetric(u.TotalRCU()/n, "RCU/op")
	b.ReportMetric(u.RCU["hosts"]/n, "hostsRCU/op")
	b.ReportMetric(u.TotalWCU()/n, "WCU/op")
	b.ReportMetric(u.TableWCU()/n, "tableWCU/op")
	b.ReportMetric(gsiWCU/n, "gsiWCU/op")
	var parts []string
	for k, v := range u.Calls {
		parts = append(parts, fmt.Sprintf("%s=%.2f", k, float64(v)/n))
	}
	for k, v := range u.RCU {
		parts = append(parts, fmt.Sprintf("RCU[%s]=%.2f", k, v/n))
	}
	for k, v := range u.WCU {
		parts = append(parts, fmt.Sprintf("WCU[%s]=%.2f", k, v/n))
	}
	sort.Strings(parts)
	b.Logf("per op over %d hosts: %s", hosts, strings.Join(parts, " "))
}

// TestListRefreshCapacityOnDynamoDB measures what a list page's refresh of
// its live runs costs: host calls, and DynamoDB units beside the listing's
// own reads. A page of six runs on two hosts: two ended on the host since
// Fleet last looked, two live, two already ended in the record.
func TestListRefreshCapacityOnDynamoDB(t *testing.T) {
	s, token := capacityStack(t, 0)
	hosts := map[string]*fakehost.Host{}
	for _, id := range []string{"h00", "h01"} {
		hosts[id] = s.addHost(t, id, fakehost.Config{}, nil)
		s.probe(t, id)
	}
	type run struct{ host, id, child string }
	var runs []run
	for i := 0; i < 6; i++ {
		h := []string{"h00", "h01"}[i%2]
		a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, fmt.Sprintf(`{"host":%q,"agent":"shell"}`, h))
		runs = append(runs, run{h, a.str("fleetRunId"), a.str("childRunId")})
	}
	zero := 0
	// Two ended before the first listing, which records their end.
	hosts[runs[0].host].SetRun(runs[0].child, "succeeded", &zero, "")
	hosts[runs[1].host].SetRun(runs[1].child, "succeeded", &zero, "")
	s.must(t, http.StatusOK, "GET", "/fleet/runs", token, "")
	// Two end now; two stay live.
	hosts[runs[2].host].SetRun(runs[2].child, "failed", &zero, "")
	hosts[runs[3].host].SetRun(runs[3].child, "failed", &zero, "")
	for _, h := range hosts {
		h.ResetRequests()
	}

	s.meter.Reset()
	s.must(t, http.StatusOK, "GET", "/fleet/runs", token, "")
	u := s.meter.Snapshot()
	calls := hosts["h00"].Requests()["GET /runs/{id}"] + hosts["h01"].Requests()["GET /runs/{id}"]
	t.Logf("list of 6 runs (4 live in the record, 2 of them ended on the host): %d host calls; %s", calls, u)
	// One host call per run live in the record, none for those ended.
	if calls != 4 {
		t.Errorf("%d host calls, want 4: one per run live in Fleet's record", calls)
	}
	// The refresh's reads: one eventually consistent host item per host
	// (0.5 each); its writes: one conditional update of the run item per
	// run whose state changed (no index key or projected attribute moves:
	// an ended run stays in the live index until the sweep drains it).
	if u.RCU["hosts"] != 1 {
		t.Errorf("host reads %g RCU, want 1 (0.5 per distinct host)", u.RCU["hosts"])
	}
	if u.WCU["runs"] != 2 {
		t.Errorf("run writes %g WCU, want 2 (one per run that ended)", u.WCU["runs"])
	}
}

// TestFallbackDispatchCapacity: a dispatch that goes past one busy host
// costs, beside a plain dispatch's units, one more routing: the view's
// shard again (0.5 RCU) and the next host strongly (1 RCU); and one more
// write of the run moving it (1 WCU on the table, 2 on byHost, whose key
// changes: out of one host's entries, into the other's). Every other
// index's key and projection is unchanged by the move.
func TestFallbackDispatchCapacity(t *testing.T) {
	meter := &dynamostore.Meter{}
	s := newStack(t, "dynamodb", stackOptions{meter: meter})
	busy := s.addHost(t, "h00", fakehost.Config{}, nil)
	s.addHost(t, "h01", fakehost.Config{}, nil)
	s.probe(t, "h00")
	s.probe(t, "h01")
	token := s.mint(t, "alice", "*", "*")
	busy.RefuseStarts(http.StatusConflict, "host_busy")

	meter.Reset()
	a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, `{"agent":"shell"}`, "Idempotency-Key", "fb-1")
	u := meter.Snapshot()
	t.Logf("dispatch past one busy host: %s", u)
	if a.str("hostId") != "h01" {
		t.Fatalf("landed on %s: %s", a.str("hostId"), a.raw)
	}
	wantRCU := map[string]float64{"callers": 1, "idempotency": 0.5, "hosts": 3}
	wantWCU := maps.Clone(newDispatchWCU)
	wantWCU["runs"]++
	wantWCU["runs/byHost"] += 2
	if !sameUnits(u.RCU, wantRCU) || !sameUnits(u.WCU, wantWCU) {
		t.Errorf("dispatch past a busy host: RCU %v, WCU %v; want RCU %v and WCU %v", u.RCU, u.WCU, wantRCU, wantWCU)
	}
}

// egressCapacityStore is a metered DynamoDB store on tables of its own,
// its clock at at.
func egressCapacityStore(t *testing.T, at time.Time) (*dynamostore.Store, *dynamostore.Meter) {
	meter := &dynamostore.Meter{}
	st, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{
		Tables: dynamostore.Prefixed(motoserver.Unique("egcap") + "-"), Meter: meter, Clock: clock.NewFake(at),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st, meter
}

// TestEgressMirrorCapacityOnDynamoDB: what mirroring a run's egress ledger
// costs, asserted exactly (README "Cost at scale", DESIGN "Costs"), on
// records as edge writes them (storetest.LedgerRecords: ~330 bytes of
// JSON each, its chain hash included). The bounds: the mirror at
// most 1 WCU per 10 records, a ledger page (100 records) at most 1 RCU per
// 10 records.
//
// Writes: records are packed into chunks of at most 4 KB, DEFLATE
// compressed (~80 bytes a record: the hash alone is 32 bytes of entropy),
// 50 to a chunk: 4 WCU per 50 records, 0.08 a record, in batches of 50
// (fleet.DefaultEgressBatch) or more. Each batch first reads which of its
// seqs are stored (a strong Query finding none: 1 RCU). The head, under 1
// KB with a few authorities in its summary, is 1 WCU a write, plus 1 on
// the alerted index when its first alert comes. So the mirror of 50
// records with its head is 5 WCU: 1 per 10 records.
//
// Reads: a page of 100 records reads the chunks keyed within the page (one
// Query) and the next (another): 3 chunks, 3 RCU, 0.3 per 10 records.
func TestEgressMirrorCapacityOnDynamoDB(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	const n = 1000
	recs := storetest.LedgerRecords("r-cap", 1, n, at)
	size := 0
	for _, r := range recs {
		size += len(r.Data)
	}
	t.Logf("%d records, %d bytes of JSON each on average", n, size/n)

	for _, batch := range []int{50, 100} {
		st, meter := egressCapacityStore(t, at)
		for start := 0; start < n; start += batch {
			if err := st.PutEgress(ctx, "r-cap", recs[start:start+batch], at.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		u := meter.Snapshot()
		t.Logf("mirror of %d records in batches of %d: %s", n, batch, u)
		if want := 0.08 * n; u.TotalWCU() != want || u.TotalRCU() != float64(n/batch) {
			t.Errorf("batches of %d: %g WCU and %g RCU, want %g (0.08 a record) and %d (one Query a batch)", batch, u.TotalWCU(), u.TotalRCU(), want, n/batch)
		}

		if batch != 50 {
			continue
		}
		var tally egress.Tally
		for _, r := range recs[:50] {
			var rec egress.Record
			if err := json.Unmarshal(r.Data, &rec); err != nil {
				t.Fatal(err)
			}
			tally.Add(rec)
		}
		summary, err := json.Marshal(tally.Summary())
		if err != nil {
			t.Fatal(err)
		}
		seal := `{"count":50,"lastHash":"` + strings.Repeat("ab", 32) + `","signature":"` + strings.Repeat("A", 86) +
			`==","publicKey":"ed25519:11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=","sealedAt":"2026-03-04T05:16:07Z"}`
		h := store.EgressHead{FleetRunID: "r-cap", Cursor: 50, Summary: summary, HostID: "h00", Alerts: 1, UpdatedAt: at, ExpiresAt: at.Add(time.Hour)}
		meter.Reset()
		stored, err := st.PutEgressHead(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		u = meter.Snapshot()
		t.Logf("the first head (%d bytes of summary, an alert): %s", len(summary), u)
		if !sameUnits(u.WCU, map[string]float64{"egress": 1, "egress/alerted": 1}) || u.TotalRCU() != 0 {
			t.Errorf("the first head: WCU %v RCU %g, want 1 and 1 on the alerted index, no read", u.WCU, u.TotalRCU())
		}
		stored.Cursor, stored.Seal = 100, json.RawMessage(seal)
		meter.Reset()
		if _, err := st.PutEgressHead(ctx, stored); err != nil {
			t.Fatal(err)
		}
		if u = meter.Snapshot(); !sameUnits(u.WCU, map[string]float64{"egress": 1}) || u.TotalRCU() != 0 {
			t.Errorf("a head update with the seal: %s, want 1 WCU", u)
		}

		for _, after := range []int64{0, 100, 450, 900} {
			meter.Reset()
			p, err := st.ListEgress(ctx, "r-cap", after, 0)
			if err != nil {
				t.Fatal(err)
			}
			u := meter.Snapshot()
			// The last page: two chunks, and a Query past the end finding
			// none, which costs the minimum, 1 RCU.
			if len(p.Records) != min(100, n-int(after)) || u.TotalRCU() != 3 || u.Calls["Query"] != 2 {
				t.Errorf("the page after %d: %d records, %s; want 3 RCU in 2 Queries", after, len(p.Records), u)
			}
		}
	}
}
