package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// Issue 32: GET /fleet/runs' status, agent and host filters, and the
// run's repository, through the api handler on both stores.

// listedRun is a run the test dispatched, with what the listing must show.
type listedRun struct {
	id, owner, host, agent, status string
}

// newestFirst is the ids of the runs that keep passes, newest first (runs
// are dispatched oldest first, a second apart).
func newestFirst(runs []listedRun, keep func(listedRun) bool) []string {
	var ids []string
	for _, r := range slices.Backward(runs) {
		if keep(r) {
			ids = append(ids, r.id)
		}
	}
	return ids
}

// runPage is one GET /fleet/runs as the client package decodes it.
func runPage(t testing.TB, s *stack, token, query string) fleetapi.RunPage {
	t.Helper()
	a := s.must(t, http.StatusOK, "GET", "/fleet/runs?"+query, token, "")
	var page fleetapi.RunPage
	if err := json.Unmarshal([]byte(a.raw), &page); err != nil {
		t.Fatal(err)
	}
	if page.HasMore != (page.NextCursor != "") {
		t.Fatalf("%s: hasMore %v with nextCursor %q", query, page.HasMore, page.NextCursor)
	}
	return page
}

// everyPage follows a filtered listing to its end and returns the ids in
// order, failing on a run listed twice; pages counts the requests.
func everyPage(t testing.TB, s *stack, token, query string) (ids []string, pages int) {
	t.Helper()
	cursor := ""
	for pages = 1; ; pages++ {
		if pages > 50 {
			t.Fatalf("%s: the listing never ended", query)
		}
		q := query
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		page := runPage(t, s, token, q)
		for _, r := range page.Runs {
			if slices.Contains(ids, r.FleetRunID) {
				t.Fatalf("%s: run %s listed twice (page %d)", query, r.FleetRunID, pages)
			}
			ids = append(ids, r.FleetRunID)
		}
		if cursor = page.NextCursor; cursor == "" {
			return ids, pages
		}
	}
}

// TestRunListFilters: status, agent and host narrow the listing, alone and
// combined, on pages of any size, each run listed once; a caller sees only
// what it saw unfiltered (its own runs on hosts in its scope), whatever it
// filters on; an admin's host filter spans every owner.
func TestRunListFilters(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			hosts := map[string]*fakehost.Host{}
			for _, id := range []string{"h1", "h2"} {
				hosts[id] = s.addHost(t, id, fakehost.Config{Agents: []string{"shell", "codex"}}, nil)
				s.probe(t, id)
			}
			tokens := map[string]string{
				"alice": s.mint(t, "alice", "*", "*"), "bob": s.mint(t, "bob", "*", "*"), "dave": s.mint(t, "dave", "*", "*"),
			}
			var runs []listedRun
			dispatch := func(owner, host, agent, status string) {
				a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", tokens[owner], jsonBody(map[string]string{"host": host, "agent": agent}))
				switch status {
				case hostproto.StatusPending:
				case hostproto.StatusFailed:
					one := 1
					hosts[host].SetRun(a.str("childRunId"), status, &one, "")
				case hostproto.StatusSucceeded:
					zero := 0
					hosts[host].SetRun(a.str("childRunId"), status, &zero, "")
				default:
					hosts[host].SetRun(a.str("childRunId"), status, nil, "")
				}
				runs = append(runs, listedRun{id: a.str("fleetRunId"), owner: owner, host: host, agent: agent, status: status})
				s.clk.Advance(time.Second)
			}
			// alice's oldest run is her only failed one, under 12 newer
			// ones; bob's runs are interleaved with hers.
			for i := range 12 {
				host, agent, status := "h1", "shell", hostproto.StatusPending
				if i%3 == 2 {
					host = "h2"
				}
				if i%2 == 1 {
					agent = "codex"
				}
				switch {
				case i == 0:
					status = hostproto.StatusFailed
				case i%4 == 1:
					status = hostproto.StatusSucceeded
				case i%4 == 3:
					status = hostproto.StatusRunning
				}
				dispatch("alice", host, agent, status)
				if i%3 == 0 {
					dispatch("bob", []string{"h1", "h2"}[i%2], "shell", hostproto.StatusSucceeded)
				}
			}
			dispatch("dave", "h1", "shell", hostproto.StatusPending)
			dispatch("dave", "h2", "shell", hostproto.StatusPending)
			// dave re-minted to h1 alone still owns his run on h2.
			s.must(t, http.StatusOK, "DELETE", "/fleet/callers/dave", adminToken, "")
			tokens["dave"] = s.mint(t, "dave", []string{"h1"}, "*")
			tokens["admin"] = adminToken
			// The statuses the hosts report are recorded (within a minute in
			// production): a status filter reads the recorded status.
			s.sweep(t)

			for _, tc := range []struct {
				caller, query string
				keep          func(listedRun) bool
			}{
				{"alice", "agent=shell", func(r listedRun) bool { return r.owner == "alice" && r.agent == "shell" }},
				{"alice", "host=h2&status=pending", func(r listedRun) bool {
					return r.owner == "alice" && r.host == "h2" && r.status == "pending"
				}},
				{"alice", "status=running&agent=codex&host=h1", func(r listedRun) bool {
					return r.owner == "alice" && r.status == "running" && r.agent == "codex" && r.host == "h1"
				}},
				{"alice", "status=lost", func(listedRun) bool { return false }},
				{"bob", "agent=codex", func(listedRun) bool { return false }},
				{"bob", "host=h1", func(r listedRun) bool { return r.owner == "bob" && r.host == "h1" }},
				{"bob", "status=succeeded", func(r listedRun) bool { return r.owner == "bob" }},
				{"dave", "agent=shell", func(r listedRun) bool { return r.owner == "dave" && r.host == "h1" }},
				{"dave", "status=pending", func(r listedRun) bool { return r.owner == "dave" && r.host == "h1" }},
				{"admin", "host=h1", func(r listedRun) bool { return r.host == "h1" }},
				{"admin", "host=h2&agent=shell", func(r listedRun) bool { return r.host == "h2" && r.agent == "shell" }},
				{"admin", "status=succeeded&agent=codex", func(r listedRun) bool { return r.status == "succeeded" && r.agent == "codex" }},
			} {
				want := newestFirst(runs, tc.keep)
				for _, limit := range []int{1, 2, 100} {
					query := fmt.Sprintf("%s&limit=%d", tc.query, limit)
					got, _ := everyPage(t, s, tokens[tc.caller], query)
					if !slices.Equal(got, want) {
						t.Errorf("%s %s: listed %v, want %v", tc.caller, query, got, want)
					}
				}
			}

			// A filter few runs pass: a page read on to its bound of store
			// pages and found none is empty with more to come, and the next
			// pages find the run.
			first := runPage(t, s, tokens["alice"], "status=failed&limit=1")
			if len(first.Runs) != 0 || !first.HasMore {
				t.Errorf("status=failed, limit=1, 12 newer runs: first page %d runs, hasMore %v; want empty with more", len(first.Runs), first.HasMore)
			}
			got, pages := everyPage(t, s, tokens["alice"], "status=failed&limit=1")
			if want := []string{runs[0].id}; !slices.Equal(got, want) || pages < 2 {
				t.Errorf("status=failed: %v in %d pages, want %v in more than one", got, pages, want)
			}

			// A host outside the caller's scope is refused, not answered
			// with an empty listing.
			a := s.must(t, http.StatusForbidden, "GET", "/fleet/runs?host=h2", tokens["dave"], "")
			if !strings.Contains(a.errorText(), `"h2"`) || !strings.Contains(a.errorText(), "allowedHosts") {
				t.Errorf("dave host=h2: %s", a.raw)
			}
		})
	}
}

// TestRunListFilterValues: an unknown status is a 400 naming the allowed
// ones, an empty filter or a malformed agent or host a 400 naming the
// parameter, and the alerts listing takes no filter.
func TestRunListFilterValues(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{})
	alice := s.mint(t, "alice", "*", "*")
	statuses := "queued, dispatching, pending, admitted, running, succeeded, failed, canceled, lost"
	for _, tc := range []struct {
		token, query string
		says         []string
	}{
		{alice, "status=done", []string{"status", `"done"`, statuses}},
		{alice, "status=RUNNING", []string{"status", statuses}},
		{alice, "status=running&status=failed", []string{"status"}},
		{alice, "status=", []string{"status", "empty"}},
		{alice, "agent=", []string{"agent", "empty"}},
		{alice, "host=", []string{"host", "empty"}},
		{alice, "agent=" + url.QueryEscape("a b"), []string{"agent"}},
		{alice, "host=" + url.QueryEscape("../h1"), []string{"host"}},
		{adminToken, "alerts=true&status=running", []string{"status", "alerts=true"}},
		{adminToken, "alerts=true&agent=shell", []string{"agent", "alerts=true"}},
		{adminToken, "alerts=true&host=h1", []string{"host", "alerts=true"}},
	} {
		a := s.must(t, http.StatusBadRequest, "GET", "/fleet/runs?"+tc.query, tc.token, "")
		for _, want := range tc.says {
			if !strings.Contains(a.errorText(), want) {
				t.Errorf("%s: %q does not say %q", tc.query, a.errorText(), want)
			}
		}
	}
}

// TestRunShowsItsRepository: the dispatch's repository is stored with the
// run and shown on GET and in the listing, as the host got it except for a
// URL's credentials; a run without one shows none.
func TestRunShowsItsRepository(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host := s.addHost(t, "h1", fakehost.Config{}, nil)
			s.probe(t, "h1")
			alice := s.mint(t, "alice", "*", "*")
			const secret = "ghp_s3cr3tT0ken"
			given := map[string]string{
				"named": "acme/app",
				"url":   "https://x-access-token:" + secret + "@git.example/acme/app.git",
				"none":  "",
			}
			shown := map[string]string{
				"named": "acme/app",
				"url":   "https://x-access-token:xxxxx@git.example/acme/app.git",
				"none":  "",
			}
			ids, children := map[string]string{}, map[string]string{}
			for _, name := range []string{"named", "url", "none"} {
				body := map[string]string{"agent": "shell"}
				if given[name] != "" {
					body["repository"] = given[name]
				}
				a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, jsonBody(body))
				ids[name], children[name] = a.str("fleetRunId"), a.str("childRunId")
				s.clk.Advance(time.Second)
			}
			starts := host.Starts()
			for i, name := range []string{"named", "url", "none"} {
				if starts[i].Repository != given[name] {
					t.Errorf("%s: the host got repository %q, want %q", name, starts[i].Repository, given[name])
				}
			}

			// Past an update of the run (its end recorded by the sweep).
			zero := 0
			host.SetRun(children["url"], hostproto.StatusSucceeded, &zero, "")
			s.sweep(t)
			listed := s.must(t, http.StatusOK, "GET", "/fleet/runs", alice, "")
			var page fleetapi.RunPage
			if err := json.Unmarshal([]byte(listed.raw), &page); err != nil {
				t.Fatal(err)
			}
			for name, id := range ids {
				got := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id, alice, "")
				var one fleetapi.RunAnswer
				if err := json.Unmarshal([]byte(got.raw), &one); err != nil {
					t.Fatal(err)
				}
				if one.Run.Repository != shown[name] {
					t.Errorf("%s: GET shows repository %q, want %q", name, one.Run.Repository, shown[name])
				}
				if name == "none" && strings.Contains(got.raw, `"repository"`) {
					t.Errorf("a run without a repository shows one: %s", got.raw)
				}
				i := slices.IndexFunc(page.Runs, func(r fleetapi.Run) bool { return r.FleetRunID == id })
				if i < 0 {
					t.Errorf("%s: run %s not listed", name, id)
				} else if page.Runs[i].Repository != shown[name] {
					t.Errorf("%s: listed with repository %q, want %q", name, page.Runs[i].Repository, shown[name])
				}
			}
			if strings.Contains(listed.raw, secret) || strings.Contains(s.must(t, http.StatusOK, "GET", "/fleet/runs", adminToken, "").raw, secret) {
				t.Error("the listing shows the repository URL's token")
			}
		})
	}
}
