package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// Issue 15, item 2: the admin listing and a host's deletion in bounded
// calls whatever the size of the fleet.

// batchPut writes items to a table 25 at a time (BatchWriteItem), re-sending
// what DynamoDB leaves unprocessed: seeding at batch speed.
func batchPut(t testing.TB, table string, items []map[string]types.AttributeValue) {
	t.Helper()
	db, ctx := moto.DynamoDB(), context.Background()
	for start := 0; start < len(items); start += 25 {
		var reqs []types.WriteRequest
		for _, it := range items[start:min(start+25, len(items))] {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: it}})
		}
		pending := map[string][]types.WriteRequest{table: reqs}
		for len(pending[table]) > 0 {
			out, err := db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
			if err != nil {
				t.Fatalf("seeding %s: %v", table, err)
			}
			pending = out.UnprocessedItems
		}
	}
}

// getItem reads one item as stored.
func getItem(t testing.TB, table, keyName, key string) map[string]types.AttributeValue {
	t.Helper()
	out, err := moto.DynamoDB().GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table),
		Key: map[string]types.AttributeValue{keyName: &types.AttributeValueMemberS{Value: key}}, ConsistentRead: aws.Bool(true)})
	if err != nil || out.Item == nil {
		t.Fatalf("reading %s %s: %v", table, key, err)
	}
	return out.Item
}

// seedRunsOver writes n ended runs, copies of the ended run template as the
// store wrote it, spread round-robin over hosts: "fr-seeded-<i>" for i from
// first, each created i+1 ms before the template; it returns their ids.
func seedRunsOver(t testing.TB, s *stack, template string, hosts []string, first, n int) []string {
	t.Helper()
	table := s.app.Config.Tables.Runs
	tmpl := getItem(t, table, "fleetRunId", template)
	if _, live := tmpl["live"]; live {
		t.Fatal("the template run is live")
	}
	created, _, _ := strings.Cut(tmpl["createdAt"].(*types.AttributeValueMemberS).Value, "#")
	at, err := time.Parse("2006-01-02T15:04:05.000000000Z", created)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	items := make([]map[string]types.AttributeValue, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("fr-seeded-%05d", first+i)
		it := maps.Clone(tmpl)
		it["fleetRunId"] = &types.AttributeValueMemberS{Value: ids[i]}
		it["hostId"] = &types.AttributeValueMemberS{Value: hosts[i%len(hosts)]}
		key := at.Add(-time.Duration(first+i+1)*time.Millisecond).Format("2006-01-02T15:04:05.000000000Z") + "#" + ids[i]
		it["createdAt"] = &types.AttributeValueMemberS{Value: key}
		items[i] = it
	}
	batchPut(t, table, items)
	return ids
}

// endedRun dispatches one run of alice's to h1, ends it on the host and
// sweeps it out of the live index: the template for seeded runs.
func endedRun(t testing.TB, s *stack, host *fakehost.Host, alice string) string {
	t.Helper()
	a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell","host":"h1"}`)
	zero := 0
	host.SetRun(a.str("childRunId"), hostproto.StatusSucceeded, &zero, "")
	s.sweep(t)
	return a.str("fleetRunId")
}

// listPage is one admin GET /fleet/runs, metered.
func listPage(t testing.TB, s *stack, query string) (dynamostore.Usage, answer) {
	t.Helper()
	s.meter.Reset()
	a := s.must(t, http.StatusOK, "GET", "/fleet/runs"+query, adminToken, "")
	return s.meter.Snapshot(), a
}

func runIDs(t testing.TB, a answer) []string {
	t.Helper()
	var page struct {
		Runs []struct {
			FleetRunID string `json:"fleetRunId"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(a.raw), &page); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range page.Runs {
		ids = append(ids, r.FleetRunID)
	}
	return ids
}

// TestAdminListingIsFlatInHosts: an admin's page of every run costs the
// same calls and units with 1 host and with 1,001 (no call per host, no
// read of the hosts table), at most 5 calls; and the pages list every run
// once, newest first.
func TestAdminListingIsFlatInHosts(t *testing.T) {
	s := newStack(t, "dynamodb", stackOptions{meter: &dynamostore.Meter{}})
	host := s.addHost(t, "h1", fakehost.Config{}, nil)
	s.probe(t, "h1")
	alice := s.mint(t, "alice", "*", "*")
	template := endedRun(t, s, host, alice)
	early := seedRunsOver(t, s, template, []string{"h1"}, 0, 300)

	one, a := listPage(t, s, "")
	if n := len(runIDs(t, a)); n != store.DefaultLimit {
		t.Fatalf("a default page of %d runs, want %d", n, store.DefaultLimit)
	}

	hosts := idsOf(seedHosts(t, s, "h1", 1000)[1:])
	later := seedRunsOver(t, s, template, hosts, 300, 1000)
	many, a := listPage(t, s, "")
	t.Logf("a page of 100 at 1 host: %s", one)
	t.Logf("a page of 100 at 1,001 hosts: %s", many)
	if many.TotalCalls() > 5 || many.TotalCalls() != one.TotalCalls() || many.TotalRCU() != one.TotalRCU() || many.RCU["hosts"] != 0 {
		t.Fatalf("a page at 1,001 hosts: %d calls, %g RCU (hosts %g); at 1 host: %d calls, %g RCU; want the same, <= 5 calls, no hosts read",
			many.TotalCalls(), many.TotalRCU(), many.RCU["hosts"], one.TotalCalls(), one.TotalRCU())
	}

	// Every run, once, newest first.
	var got []string
	query := "?limit=1000"
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("the listing never ended")
		}
		_, a := listPage(t, s, query)
		got = append(got, runIDs(t, a)...)
		next := a.str("nextCursor")
		if next == "" {
			break
		}
		query = "?limit=1000&cursor=" + next
	}
	want := append(append([]string{template}, early...), later...)
	if !slices.Equal(got, want) {
		t.Fatalf("listing: %d runs, first %v; want %d, first %v", len(got), got[:min(3, len(got))], len(want), want[:3])
	}
	// A cursor of another listing is refused, not followed.
	mine := s.must(t, http.StatusOK, "GET", "/fleet/runs?limit=1", alice, "").str("nextCursor")
	if mine == "" {
		t.Fatal("alice's page of 1 has no cursor")
	}
	s.must(t, http.StatusBadRequest, "GET", "/fleet/runs?cursor="+mine, adminToken, "")
}

// TestDeleteHostInSteps: DELETE /fleet/hosts/{id}?force=1 on a host with
// more runs than one call deletes answers 202 until the last call, which
// answers 200; from the first call the host is disabled and routing
// excludes it; a delete without force is 409 meanwhile; at the end the
// host's runs and events are gone and another host's are not.
func TestDeleteHostInSteps(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			s.addHost(t, "h1", fakehost.Config{}, nil)
			s.probe(t, "h1")
			s.addHost(t, "h2", fakehost.Config{}, nil)
			s.probe(t, "h2")
			alice := s.mint(t, "alice", "*", "*")
			other := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell","host":"h2"}`).str("fleetRunId")
			live := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell","host":"h1"}`).str("fleetRunId")

			const seeded = 2*store.DeleteHostRunsPerStep + 30
			ctx, st, now := context.Background(), s.app.Store, s.clk.Now()
			var wg sync.WaitGroup
			errs := make(chan error, 2*seeded)
			sem := make(chan struct{}, 8)
			for i := range seeded {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					id := fmt.Sprintf("fr-seeded-%05d", i)
					errs <- st.CreateRun(ctx, store.Run{FleetRunID: id, OwnerID: "alice", HostID: "h1", Status: hostproto.StatusRunning,
						Agent: "shell", CreatedAt: now.Add(-time.Duration(i+1) * time.Millisecond), UpdatedAt: now})
					errs <- st.PutEvents(ctx, []store.Event{{FleetRunID: id, Sequence: 1, Type: "output", Data: json.RawMessage(`"x"`), TS: now}})
				}()
			}
			await.Group(t, "the seeding writers", &wg)
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("seeding: %v", err)
				}
			}
			total := seeded + 1

			if a := s.must(t, http.StatusConflict, "DELETE", "/fleet/hosts/h1", adminToken, ""); a.str("code") != "host_in_use" {
				t.Fatalf("delete without force: %s", a.raw)
			}
			deleted, steps := 0, 0
			for {
				a := s.do(t, "DELETE", "/fleet/hosts/h1?force=1", adminToken, "")
				steps++
				n, _ := a.body["runsDeleted"].(float64)
				deleted += int(n)
				if n > store.DeleteHostRunsPerStep {
					t.Fatalf("step %d deleted %g runs, more than its bound", steps, n)
				}
				if a.status == http.StatusOK {
					if a.str("removed") != "h1" || a.body["forced"] != true {
						t.Fatalf("last step: %s", a.raw)
					}
					break
				}
				if a.status != http.StatusAccepted || a.str("id") != "h1" || a.body["deleting"] != true || a.body["forced"] != true || n == 0 {
					t.Fatalf("step %d: %d %s, want 202 deleting h1 with runs deleted", steps, a.status, a.raw)
				}
				if steps > total {
					t.Fatal("the deletion never finished")
				}
				if steps > 1 {
					continue
				}
				// Between steps: the host is disabled, routing excludes it at
				// once (named or not), and a delete without force is refused.
				var listed struct {
					Hosts []struct {
						ID      string `json:"id"`
						Enabled bool   `json:"enabled"`
					} `json:"hosts"`
				}
				json.Unmarshal([]byte(s.must(t, http.StatusOK, "GET", "/fleet/hosts", adminToken, "").raw), &listed)
				enabled := map[string]bool{}
				for _, h := range listed.Hosts {
					enabled[h.ID] = h.Enabled
				}
				if e, ok := enabled["h1"]; !ok || e || !enabled["h2"] {
					t.Fatalf("hosts while h1 is deleting: %+v, want h1 listed and disabled", listed.Hosts)
				}
				named := s.must(t, http.StatusConflict, "POST", "/fleet/runs", alice, `{"agent":"shell","host":"h1"}`)
				if !strings.Contains(named.raw, `"hostId":"h1","reasons":["disabled"]`) {
					t.Fatalf("a dispatch to h1 while deleting: %s", named.raw)
				}
				if a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`); a.str("hostId") != "h2" {
					t.Fatalf("a routed dispatch while h1 is deleting: %s", a.raw)
				}
				s.must(t, http.StatusConflict, "DELETE", "/fleet/hosts/h1", adminToken, "")
			}
			if steps < 3 || deleted != total {
				t.Fatalf("%d steps deleted %d runs; want >= 3 steps and %d runs", steps, deleted, total)
			}
			s.must(t, http.StatusNotFound, "DELETE", "/fleet/hosts/h1?force=1", adminToken, "")
			s.must(t, http.StatusNotFound, "GET", "/fleet/runs/"+live, adminToken, "")
			for _, id := range []string{"fr-seeded-00000", "fr-seeded-00229"} {
				if _, err := st.GetRun(ctx, id); err == nil {
					t.Fatalf("run %s survived its host", id)
				}
				if p, err := st.ListEvents(ctx, id, 0, 10); err != nil || len(p.Events) != 0 {
					t.Fatalf("events of %s after the deletion: %v, %v", id, p.Events, err)
				}
			}
			var left []string
			for _, id := range runIDs(t, s.must(t, http.StatusOK, "GET", "/fleet/runs?limit=1000", adminToken, "")) {
				if r, err := st.GetRun(ctx, id); err != nil || r.HostID != "h2" {
					t.Fatalf("listed after the deletion: %s (%+v, %v)", id, r, err)
				}
				left = append(left, id)
			}
			if !slices.Contains(left, other) || len(left) != 2 {
				t.Fatalf("h2's runs after the deletion: %v, want %s and the one routed there", left, other)
			}
		})
	}
}

// TestListsOfEventsTellTheTruth (issue 30): an events page's live is the
// run's, not the page's, so a finished run's page says live false even
// with more after it (hasMore says that); a page at the run's last event
// names it as nextCursor, to poll from; one past it has no nextCursor (no
// page continues from a place no event reached), at once even as a
// long-poll, whose wait would otherwise hide events up to that place.
func TestListsOfEventsTellTheTruth(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host, alice, id, child := s.aliceRun(t)
			events := "/fleet/runs/" + id + "/events"
			for i := range 5 {
				host.AppendOutput(child, fmt.Sprintf("line %d\n", i))
			}
			s.sweep(t)

			// Live: every page says so, and past the end is refused a
			// cursor at once.
			a := s.must(t, http.StatusOK, "GET", events+"?limit=1", alice, "")
			if a.body["live"] != true || a.body["hasMore"] != true || a.body["nextCursor"] != 1.0 {
				t.Fatalf("a live run's first page: %s", a.raw)
			}
			last := int64(a.body["nextCursor"].(float64))
			for a.body["hasMore"] == true {
				a = s.must(t, http.StatusOK, "GET", fmt.Sprintf("%s?after=%d&limit=2", events, last), alice, "")
				last = int64(a.body["nextCursor"].(float64))
			}
			a, waited := s.longPoll(t, fmt.Sprintf("%s?after=%d&wait=20", events, last+50), alice, nil)
			if _, has := a.body["nextCursor"]; a.status != 200 || has || a.body["live"] != true || a.body["hasMore"] != false || waited != 0 {
				t.Fatalf("a long-poll past a live run's end: %d %s after %v; want an empty page without nextCursor, at once", a.status, a.raw, waited)
			}

			// Finished and mirrored to its end: live false on every page,
			// the first of several included.
			zero := 0
			host.SetRun(child, hostproto.StatusSucceeded, &zero, "")
			s.sweep(t)
			a = s.must(t, http.StatusOK, "GET", events+"?limit=1", alice, "")
			if a.body["live"] != false || a.body["hasMore"] != true || a.body["nextCursor"] != 1.0 {
				t.Fatalf("a finished run's partial page: %s, want live false, hasMore true", a.raw)
			}
			for a.body["hasMore"] == true {
				a = s.must(t, http.StatusOK, "GET", fmt.Sprintf("%s?after=%d&limit=3", events, int64(a.body["nextCursor"].(float64))), alice, "")
				if a.body["live"] != false {
					t.Fatalf("a finished run's page: %s, want live false", a.raw)
				}
			}
			end := int64(a.body["nextCursor"].(float64))
			if end <= last {
				t.Fatalf("the finished run's last event %d, want past %d (its state event)", end, last)
			}
			a = s.must(t, http.StatusOK, "GET", fmt.Sprintf("%s?after=%d", events, end), alice, "")
			if evs, _ := a.body["events"].([]any); len(evs) != 0 || a.body["nextCursor"] != float64(end) || a.body["live"] != false || a.body["hasMore"] != false {
				t.Fatalf("a page at the finished run's end: %s, want empty with nextCursor %d", a.raw, end)
			}
			for _, after := range []int64{end + 1, 100, 1 << 40} {
				a = s.must(t, http.StatusOK, "GET", fmt.Sprintf("%s?after=%d&wait=5", events, after), alice, "")
				if _, has := a.body["nextCursor"]; has || a.raw != `{"events":[],"hasMore":false,"live":false}`+"\n" {
					t.Fatalf("after=%d past the finished run's end (%d): %s, want an empty page without nextCursor", after, end, a.raw)
				}
			}
		})
	}
}
