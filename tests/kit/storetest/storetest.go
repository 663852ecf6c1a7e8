// Package storetest owns the contract of store.Store: one suite that every
// implementation runs in its own tests (boltstore on a temp file, dynamostore
// on a real moto_server), so both behave alike down to the sentinel errors,
// the page order and the expiry rules.
package storetest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// NewStore returns an empty store that reads the time from clk. It is called
// once per subtest; the store is released in t.Cleanup by the caller.
type NewStore func(t *testing.T, clk *clock.Fake) store.Store

// Start is the fake clock's starting time in every subtest: nanoseconds set,
// so a store that loses precision shows it.
var Start = time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)

// Run runs the contract suite against the store newStore makes. Subtests
// run in parallel, each on its own store.
func Run(t *testing.T, newStore NewStore) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store, clk *clock.Fake)
	}{
		{"Hosts/CreateGetList", testHostsCreateGetList},
		{"Hosts/CreateExisting", testHostsCreateExisting},
		{"Hosts/NotFound", testHostsNotFound},
		{"Hosts/SetEnabledKeepsProbe", testHostsSetEnabled},
		{"Hosts/RecordProbe", testHostsRecordProbe},
		{"Hosts/DeleteInUseAndForce", testHostsDeleteInUse},
		{"Hosts/DeleteIgnoresExpiredRuns", testHostsDeleteExpiredRuns},
		{"Hosts/DeleteInBoundedSteps", testHostsDeleteInSteps},
		{"Hosts/ListPages", testHostsListPages},
		{"Callers/CreateLookupList", testCallersCreateLookupList},
		{"Callers/CreateExisting", testCallersCreateExisting},
		{"Callers/ConcurrentCreate", testCallersConcurrentCreate},
		{"Callers/Delete", testCallersDelete},
		{"Idempotency/PutGet", testIdempotencyPutGet},
		{"Idempotency/ExistingReturned", testIdempotencyExisting},
		{"Idempotency/Expiry", testIdempotencyExpiry},
		{"Idempotency/Concurrent", testIdempotencyConcurrent},
		{"Runs/CreateGet", testRunsCreateGet},
		{"Runs/CreateRequiresKeys", testRunsCreateRequiresKeys},
		{"Runs/ConcurrentCreate", testRunsConcurrentCreate},
		{"Runs/NotFound", testRunsNotFound},
		{"Runs/UpdateVersion", testRunsUpdateVersion},
		{"Runs/ConcurrentUpdate", testRunsConcurrentUpdate},
		{"Runs/LiveFollowsLive", testRunsLiveIndex},
		{"Runs/ListLivePages", testRunsListLivePages},
		{"Runs/ListRunsPages", testRunsListRunsPages},
		{"Runs/ListRunsStableUnderWrites", testRunsListRunsStable},
		{"Runs/BadCursor", testRunsBadCursor},
		{"Runs/OwnerAndHostRefused", testRunsOwnerAndHost},
		{"Runs/Expiry", testRunsExpiry},
		{"Events/PutList", testEventsPutList},
		{"Events/Idempotent", testEventsIdempotent},
		{"Events/Expiry", testEventsExpiry},
		{"Events/LargeData", testEventsLargeData},
		{"Events/ExtendExpiry", testEventsExtendExpiry},
		{"Context/Canceled", testContextCanceled},
	}
	tests = append(tests, sweepCursorCases...)
	tests = append(tests, streamLeaseTests...)
	tests = append(tests, routeViewTests...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewFake(Start)
			tc.fn(t, newStore(t, clk), clk)
		})
	}
}

var bg = context.Background()

// --- helpers ---------------------------------------------------------------

// sameJSON compares two records through their JSON form, which shows every
// field (times included, to the nanosecond) in the failure message.
func sameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	g, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if string(g) != string(w) {
		t.Fatalf("%s:\n got  %s\n want %s", what, g, w)
	}
}

func wantErr(t *testing.T, what string, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("%s: error %v, want %v", what, err, sentinel)
	}
}

func noErr(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func host(id string, at time.Time) store.Host {
	return store.Host{
		ID:            id,
		BaseURL:       "https://" + id + ".example.test:7070",
		CredentialRef: "cred-" + id,
		Labels:        map[string]string{"gpu": "a100", "zone": "eu"},
		LocalPaths:    []string{"/srv/work/" + id, "/srv/other"},
		CAPEM:         "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
		Enabled:       true,
		CreatedAt:     at,
	}
}

func probe(at time.Time, status string) store.Probe {
	succ := at.Add(90 * 24 * time.Hour)
	return store.Probe{
		Status:    status,
		At:        at,
		LatencyMs: 42,
		Version:   "1.2.3",
		Agents:    []string{"claude", "shell"},
		Features:  store.Features{SecretsProxy: true, ExecRequire: true},
		CA:        &store.CAInfo{NotAfter: at.Add(365 * 24 * time.Hour), SuccessorNotAfter: &succ},
		Draining:  true,
		Storage:   &store.Storage{FreeBytes: 3 << 30, MinFreeBytes: 1 << 30},
		Limits:    &store.Limits{Enforced: "cgroup1", MemoryBytes: 2 << 30, Pids: 512, CPU: 1.5},
		Detail:    "ok after 1 retry",
	}
}

func run(id, owner, hostID string, created time.Time) store.Run {
	return store.Run{
		FleetRunID: id,
		OwnerID:    owner,
		HostID:     hostID,
		Status:     store.StatusDispatching,
		Agent:      "shell",
		CreatedAt:  created,
		UpdatedAt:  created,
		Deadline:   created.Add(30 * time.Second),
	}
}

func createRun(t *testing.T, s store.Store, r store.Run) store.Run {
	t.Helper()
	noErr(t, "CreateRun "+r.FleetRunID, s.CreateRun(bg, r))
	r.Version = 1
	return r
}

// ended returns r terminal at `at`, drained or not, with a TTL `keep` later.
func ended(r store.Run, status string, at time.Time, drained bool, keep time.Duration) store.Run {
	code := 0
	r.Status = status
	r.ExitCode = &code
	r.EndedAt = &at
	r.UpdatedAt = at
	r.Drained = drained
	r.ExpiresAt = store.RoundExpiry(at.Add(keep))
	return r
}

func event(runID string, seq int64, at time.Time, data string) store.Event {
	raw, _ := json.Marshal(data)
	return store.Event{FleetRunID: runID, Sequence: seq, Type: hostproto.EventOutput, Data: raw, TS: at}
}

func ids(runs []store.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.FleetRunID
	}
	return out
}

func seqs(events []store.Event) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.Sequence
	}
	return out
}

// allRuns pages through q with the given page size and returns every run in
// order, failing on a duplicate or on a page larger than asked.
func allRuns(t *testing.T, s store.Store, q store.RunQuery, pageSize int) []string {
	t.Helper()
	q.Limit = pageSize
	var out []string
	seen := map[string]bool{}
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("ListRuns never ended")
		}
		p, err := s.ListRuns(bg, q)
		noErr(t, "ListRuns", err)
		if len(p.Runs) > pageSize {
			t.Fatalf("page of %d runs, limit %d", len(p.Runs), pageSize)
		}
		if p.NextCursor != "" && len(p.Runs) == 0 {
			t.Fatal("an empty page with a next cursor")
		}
		for _, r := range p.Runs {
			if seen[r.FleetRunID] {
				t.Fatalf("run %s listed twice", r.FleetRunID)
			}
			seen[r.FleetRunID] = true
			out = append(out, r.FleetRunID)
		}
		if p.NextCursor == "" {
			return out
		}
		q.Cursor = p.NextCursor
	}
}

func allLive(t *testing.T, s store.Store, pageSize int) []string {
	t.Helper()
	var out []string
	seen := map[string]bool{}
	cur := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("ListLive never ended")
		}
		p, err := s.ListLive(bg, cur, pageSize)
		noErr(t, "ListLive", err)
		if len(p.FleetRunIDs) > pageSize {
			t.Fatalf("live page of %d, limit %d", len(p.FleetRunIDs), pageSize)
		}
		for _, id := range p.FleetRunIDs {
			if seen[id] {
				t.Fatalf("live run %s listed twice", id)
			}
			seen[id] = true
			out = append(out, id)
		}
		if p.NextCursor == "" {
			sort.Strings(out)
			return out
		}
		cur = p.NextCursor
	}
}

func sameIDs(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s:\n got  %v\n want %v", what, got, want)
	}
}

// --- hosts -----------------------------------------------------------------

func testHostsCreateGetList(t *testing.T, s store.Store, clk *clock.Fake) {
	for _, id := range []string{"hb", "hc", "ha"} {
		noErr(t, "CreateHost", s.CreateHost(bg, host(id, clk.Now())))
	}
	got, err := s.GetHost(bg, "hb")
	noErr(t, "GetHost", err)
	sameJSON(t, "GetHost", got, host("hb", clk.Now()))

	bare := store.Host{ID: "hd", BaseURL: "http://127.0.0.1:7070", CredentialRef: "c", CreatedAt: clk.Now()}
	noErr(t, "CreateHost bare", s.CreateHost(bg, bare))
	got, err = s.GetHost(bg, "hd")
	noErr(t, "GetHost bare", err)
	sameJSON(t, "GetHost bare", got, bare)

	list, err := s.ListHosts(bg)
	noErr(t, "ListHosts", err)
	var names []string
	for _, h := range list {
		names = append(names, h.ID)
	}
	sameIDs(t, "ListHosts order", names, []string{"ha", "hb", "hc", "hd"})
	sameJSON(t, "ListHosts[0]", list[0], host("ha", clk.Now()))
}

func testHostsCreateExisting(t *testing.T, s store.Store, clk *clock.Fake) {
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", clk.Now())))
	other := host("h1", clk.Now().Add(time.Hour))
	other.BaseURL = "https://elsewhere.example.test"
	wantErr(t, "CreateHost again", s.CreateHost(bg, other), store.ErrExists)
	got, err := s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	sameJSON(t, "host after refused create", got, host("h1", clk.Now()))
}

func testHostsNotFound(t *testing.T, s store.Store, clk *clock.Fake) {
	_, err := s.GetHost(bg, "nope")
	wantErr(t, "GetHost", err, store.ErrNotFound)
	_, err = s.SetHostEnabled(bg, "nope", false)
	wantErr(t, "SetHostEnabled", err, store.ErrNotFound)
	wantErr(t, "RecordProbe", s.RecordProbe(bg, "nope", probe(clk.Now(), store.ProbeOK)), store.ErrNotFound)
	wantErr(t, "DeleteHost", deleteHost(s, "nope", false), store.ErrNotFound)
	wantErr(t, "DeleteHost force", deleteHost(s, "nope", true), store.ErrNotFound)
	// A write to a missing host must not create it.
	_, err = s.GetHost(bg, "nope")
	wantErr(t, "GetHost after writes", err, store.ErrNotFound)
	list, err := s.ListHosts(bg)
	noErr(t, "ListHosts", err)
	if len(list) != 0 {
		t.Fatalf("ListHosts of an empty store: %v", list)
	}
}

func testHostsSetEnabled(t *testing.T, s store.Store, clk *clock.Fake) {
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", clk.Now())))
	p := probe(clk.Now(), store.ProbeOK)
	noErr(t, "RecordProbe", s.RecordProbe(bg, "h1", p))

	got, err := s.SetHostEnabled(bg, "h1", false)
	noErr(t, "SetHostEnabled", err)
	want := host("h1", clk.Now())
	want.Enabled = false
	want.Probe = &p
	sameJSON(t, "SetHostEnabled result", got, want)
	read, err := s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	sameJSON(t, "GetHost after disable", read, want)

	got, err = s.SetHostEnabled(bg, "h1", true)
	noErr(t, "SetHostEnabled true", err)
	if !got.Enabled || got.Probe == nil {
		t.Fatalf("re-enabled host: %+v", got)
	}
}

func testHostsRecordProbe(t *testing.T, s store.Store, clk *clock.Fake) {
	h := host("h1", clk.Now())
	h.Enabled = false
	noErr(t, "CreateHost", s.CreateHost(bg, h))
	first := probe(clk.Now(), store.ProbeOK)
	noErr(t, "RecordProbe", s.RecordProbe(bg, "h1", first))
	got, err := s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	want := h
	want.Probe = &first
	sameJSON(t, "host with probe", got, want)

	clk.Advance(time.Minute)
	second := store.Probe{Status: store.ProbeUnreachable, At: clk.Now(), LatencyMs: 5000, Detail: "dial tcp: connection refused"}
	noErr(t, "RecordProbe again", s.RecordProbe(bg, "h1", second))
	got, err = s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	want.Probe = &second
	sameJSON(t, "host with replaced probe", got, want)

	// A full disk is zero free bytes, kept as such (not as an absent
	// field); limits a host cannot enforce keep their detail.
	clk.Advance(time.Minute)
	third := probe(clk.Now(), store.ProbeBadResponse)
	third.Storage = &store.Storage{FreeBytes: 0, MinFreeBytes: 64 << 20, Low: true}
	third.Limits = &store.Limits{Enforced: "unavailable", Detail: "no cgroup v2 or v1 controllers are mounted"}
	noErr(t, "RecordProbe a third time", s.RecordProbe(bg, "h1", third))
	got, err = s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	want.Probe = &third
	sameJSON(t, "host with low storage", got, want)
}

func testHostsDeleteInUse(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost h1", s.CreateHost(bg, host("h1", now)))
	noErr(t, "CreateHost h2", s.CreateHost(bg, host("h2", now)))
	r1 := createRun(t, s, run("r1", "alice", "h1", now))
	r2 := createRun(t, s, run("r2", "bob", "h1", now.Add(time.Second)))
	createRun(t, s, run("r3", "alice", "h2", now.Add(2*time.Second)))
	noErr(t, "PutEvents", s.PutEvents(bg, []store.Event{event("r1", 1, now, "a"), event("r2", 1, now, "b"), event("r3", 1, now, "c")}))
	// A terminal, drained run still references its host.
	_, err := s.UpdateRun(bg, ended(r2, store.StatusSucceeded, now, true, time.Hour))
	noErr(t, "UpdateRun r2", err)

	wantErr(t, "DeleteHost in use", deleteHost(s, "h1", false), store.ErrInUse)
	_, err = s.GetHost(bg, "h1")
	noErr(t, "host after refused delete", err)
	_, err = s.GetRun(bg, r1.FleetRunID)
	noErr(t, "run after refused delete", err)

	noErr(t, "DeleteHost force", deleteHost(s, "h1", true))
	_, err = s.GetHost(bg, "h1")
	wantErr(t, "GetHost after force delete", err, store.ErrNotFound)
	for _, id := range []string{"r1", "r2"} {
		_, err = s.GetRun(bg, id)
		wantErr(t, "GetRun "+id+" after force delete", err, store.ErrNotFound)
		page, err := s.ListEvents(bg, id, 0, 10)
		noErr(t, "ListEvents", err)
		if len(page.Events) != 0 {
			t.Fatalf("events of %s survive the force delete: %v", id, seqs(page.Events))
		}
	}
	sameIDs(t, "ListRuns all after force delete", allRuns(t, s, store.RunQuery{}, 10), []string{"r3"})
	sameIDs(t, "ListRuns host h1", allRuns(t, s, store.RunQuery{HostID: "h1"}, 10), nil)
	sameIDs(t, "ListRuns alice", allRuns(t, s, store.RunQuery{OwnerID: "alice"}, 10), []string{"r3"})
	sameIDs(t, "ListLive after force delete", allLive(t, s, 10), []string{"r3"})
	page, err := s.ListEvents(bg, "r3", 0, 10)
	noErr(t, "ListEvents r3", err)
	if len(page.Events) != 1 {
		t.Fatalf("events of another host's run: %v", seqs(page.Events))
	}

	noErr(t, "DeleteHost h2 force", deleteHost(s, "h2", true))
	wantErr(t, "DeleteHost twice", deleteHost(s, "h2", false), store.ErrNotFound)

	noErr(t, "CreateHost h3", s.CreateHost(bg, host("h3", now)))
	noErr(t, "DeleteHost unused", deleteHost(s, "h3", false))
}

func testHostsDeleteExpiredRuns(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", now)))
	r := createRun(t, s, run("r1", "alice", "h1", now))
	_, err := s.UpdateRun(bg, ended(r, store.StatusFailed, now, true, time.Hour))
	noErr(t, "UpdateRun", err)
	wantErr(t, "DeleteHost before expiry", deleteHost(s, "h1", false), store.ErrInUse)
	clk.Advance(2 * time.Hour)
	noErr(t, "DeleteHost after the run expired", deleteHost(s, "h1", false))
}

// --- callers ---------------------------------------------------------------

func caller(owner string, at time.Time) store.Caller {
	return store.Caller{
		OwnerID:         owner,
		TokenHash:       fmt.Sprintf("%064x", len(owner)*1000+int(owner[0])),
		AllowedHosts:    store.Scope{IDs: []string{"h1", "h2"}},
		AllowedProjects: store.Scope{All: true},
		CreatedAt:       at,
	}
}

func testCallersCreateLookupList(t *testing.T, s store.Store, clk *clock.Fake) {
	bob := caller("bob", clk.Now())
	admin := store.Caller{OwnerID: "admin", TokenHash: strings.Repeat("ab", 32), Admin: true,
		AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{All: true}, CreatedAt: clk.Now()}
	carol := caller("carol", clk.Now())
	carol.AllowedProjects = store.Scope{IDs: []string{"acme"}}
	carol.AllowedHosts = store.Scope{}
	for _, c := range []store.Caller{bob, admin, carol} {
		noErr(t, "CreateCaller "+c.OwnerID, s.CreateCaller(bg, c))
	}
	got, err := s.CallerByTokenHash(bg, carol.TokenHash)
	noErr(t, "CallerByTokenHash", err)
	sameJSON(t, "caller by token", got, carol)
	got, err = s.CallerByTokenHash(bg, admin.TokenHash)
	noErr(t, "CallerByTokenHash admin", err)
	sameJSON(t, "admin by token", got, admin)
	_, err = s.CallerByTokenHash(bg, strings.Repeat("0", 64))
	wantErr(t, "unknown token", err, store.ErrNotFound)

	list, err := s.ListCallers(bg)
	noErr(t, "ListCallers", err)
	sameJSON(t, "ListCallers", list, []store.Caller{admin, bob, carol})
}

func testCallersCreateExisting(t *testing.T, s store.Store, clk *clock.Fake) {
	bob := caller("bob", clk.Now())
	noErr(t, "CreateCaller", s.CreateCaller(bg, bob))

	sameOwner := bob
	sameOwner.TokenHash = strings.Repeat("cd", 32)
	wantErr(t, "CreateCaller same ownerId", s.CreateCaller(bg, sameOwner), store.ErrExists)
	_, err := s.CallerByTokenHash(bg, sameOwner.TokenHash)
	wantErr(t, "token of the refused caller", err, store.ErrNotFound)

	sameToken := caller("dave", clk.Now())
	sameToken.TokenHash = bob.TokenHash
	wantErr(t, "CreateCaller same token", s.CreateCaller(bg, sameToken), store.ErrExists)
	got, err := s.CallerByTokenHash(bg, bob.TokenHash)
	noErr(t, "CallerByTokenHash", err)
	sameJSON(t, "token still maps to bob", got, bob)
	list, err := s.ListCallers(bg)
	noErr(t, "ListCallers", err)
	sameJSON(t, "no half-written caller", list, []store.Caller{bob})
}

func testCallersConcurrentCreate(t *testing.T, s store.Store, clk *clock.Fake) {
	const n = 10
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := caller("erin", clk.Now())
			c.TokenHash = fmt.Sprintf("%064x", i+1)
			errs[i] = s.CreateCaller(bg, c)
		}()
	}
	await.Group(t, "the concurrent CreateCallers", &wg)
	winners := 0
	for _, err := range errs {
		switch {
		case err == nil:
			winners++
		case !errors.Is(err, store.ErrExists):
			t.Fatalf("CreateCaller: %v", err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d concurrent creates of one ownerId succeeded, want 1", winners)
	}
	found := 0
	for i := range n {
		if _, err := s.CallerByTokenHash(bg, fmt.Sprintf("%064x", i+1)); err == nil {
			found++
		}
	}
	if found != 1 {
		t.Fatalf("%d tokens resolve, want 1", found)
	}
}

func testCallersDelete(t *testing.T, s store.Store, clk *clock.Fake) {
	bob, carol := caller("bob", clk.Now()), caller("carol", clk.Now())
	noErr(t, "CreateCaller bob", s.CreateCaller(bg, bob))
	noErr(t, "CreateCaller carol", s.CreateCaller(bg, carol))
	noErr(t, "DeleteCaller", s.DeleteCaller(bg, "bob"))
	_, err := s.CallerByTokenHash(bg, bob.TokenHash)
	wantErr(t, "token after delete", err, store.ErrNotFound)
	list, err := s.ListCallers(bg)
	noErr(t, "ListCallers", err)
	sameJSON(t, "ListCallers after delete", list, []store.Caller{carol})
	wantErr(t, "DeleteCaller twice", s.DeleteCaller(bg, "bob"), store.ErrNotFound)

	// The ownerId is free again, with a new token; the old one stays dead.
	again := bob
	again.TokenHash = strings.Repeat("ef", 32)
	noErr(t, "CreateCaller again", s.CreateCaller(bg, again))
	_, err = s.CallerByTokenHash(bg, bob.TokenHash)
	wantErr(t, "old token after re-create", err, store.ErrNotFound)
	got, err := s.CallerByTokenHash(bg, again.TokenHash)
	noErr(t, "new token", err)
	sameJSON(t, "re-created caller", got, again)
}

// --- idempotency -----------------------------------------------------------

func idem(key, runID string, now time.Time) store.Idempotency {
	return store.Idempotency{
		Key: key, FleetRunID: runID, RequestHash: "sha256:" + runID,
		CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour),
	}
}

// stored is what a store keeps of an idempotency item.
func stored(i store.Idempotency) store.Idempotency {
	i.ExpiresAt = store.RoundExpiry(i.ExpiresAt)
	return i
}

func testIdempotencyPutGet(t *testing.T, s store.Store, clk *clock.Fake) {
	_, err := s.GetIdempotency(bg, "alice#k1")
	wantErr(t, "GetIdempotency absent", err, store.ErrNotFound)
	it := idem("alice#k1", "r1", clk.Now())
	got, err := s.PutIdempotency(bg, it)
	noErr(t, "PutIdempotency", err)
	sameJSON(t, "PutIdempotency result", got, stored(it))
	got, err = s.GetIdempotency(bg, "alice#k1")
	noErr(t, "GetIdempotency", err)
	sameJSON(t, "GetIdempotency", got, stored(it))
	_, err = s.GetIdempotency(bg, "bob#k1")
	wantErr(t, "another owner's key", err, store.ErrNotFound)
}

func testIdempotencyExisting(t *testing.T, s store.Store, clk *clock.Fake) {
	first := idem("alice#k1", "r1", clk.Now())
	_, err := s.PutIdempotency(bg, first)
	noErr(t, "PutIdempotency", err)
	clk.Advance(time.Minute)
	got, err := s.PutIdempotency(bg, idem("alice#k1", "r2", clk.Now()))
	wantErr(t, "PutIdempotency again", err, store.ErrExists)
	sameJSON(t, "the existing item comes back", got, stored(first))
	read, err := s.GetIdempotency(bg, "alice#k1")
	noErr(t, "GetIdempotency", err)
	sameJSON(t, "item unchanged", read, stored(first))
}

func testIdempotencyExpiry(t *testing.T, s store.Store, clk *clock.Fake) {
	first := idem("alice#k1", "r1", clk.Now())
	_, err := s.PutIdempotency(bg, first)
	noErr(t, "PutIdempotency", err)

	// Just before the expiry it still holds.
	clk.Set(stored(first).ExpiresAt.Add(-time.Nanosecond))
	_, err = s.GetIdempotency(bg, "alice#k1")
	noErr(t, "GetIdempotency just before expiry", err)
	_, err = s.PutIdempotency(bg, idem("alice#k1", "r0", clk.Now()))
	wantErr(t, "PutIdempotency just before expiry", err, store.ErrExists)

	clk.Set(stored(first).ExpiresAt)
	_, err = s.GetIdempotency(bg, "alice#k1")
	wantErr(t, "GetIdempotency at expiry", err, store.ErrNotFound)
	second := idem("alice#k1", "r2", clk.Now())
	got, err := s.PutIdempotency(bg, second)
	noErr(t, "PutIdempotency over an expired item", err)
	sameJSON(t, "replacement", got, stored(second))
	read, err := s.GetIdempotency(bg, "alice#k1")
	noErr(t, "GetIdempotency", err)
	sameJSON(t, "GetIdempotency after replace", read, stored(second))
}

func testIdempotencyConcurrent(t *testing.T, s store.Store, clk *clock.Fake) {
	const n = 50
	type result struct {
		it  store.Idempotency
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			it, err := s.PutIdempotency(bg, idem("alice#same", fmt.Sprintf("run-%02d", i), clk.Now()))
			results[i] = result{it, err}
		}()
	}
	close(start)
	await.Group(t, "the concurrent PutIdempotencys", &wg)
	var winner string
	for _, r := range results {
		if r.err == nil {
			if winner != "" {
				t.Fatalf("two winners: %s and %s", winner, r.it.FleetRunID)
			}
			winner = r.it.FleetRunID
		} else if !errors.Is(r.err, store.ErrExists) {
			t.Fatalf("PutIdempotency: %v", r.err)
		}
	}
	if winner == "" {
		t.Fatal("no winner among 50 concurrent puts")
	}
	for _, r := range results {
		if r.it.FleetRunID != winner {
			t.Fatalf("a loser was told %q, the winner is %q", r.it.FleetRunID, winner)
		}
	}
	got, err := s.GetIdempotency(bg, "alice#same")
	noErr(t, "GetIdempotency", err)
	if got.FleetRunID != winner {
		t.Fatalf("stored %q, winner %q", got.FleetRunID, winner)
	}
}

// --- runs ------------------------------------------------------------------

func testRunsCreateGet(t *testing.T, s store.Store, clk *clock.Fake) {
	r := run("r1", "alice", "h1", clk.Now())
	r.ChildRunID = ""
	r.IdempotencyKey = "k1"
	r.RewroteLocalPath = true
	r.Version = 7 // ignored: a new run is version 1
	noErr(t, "CreateRun", s.CreateRun(bg, r))
	got, err := s.GetRun(bg, "r1")
	noErr(t, "GetRun", err)
	want := r
	want.Version = 1
	sameJSON(t, "GetRun", got, want)
	wantErr(t, "CreateRun again", s.CreateRun(bg, run("r1", "bob", "h2", clk.Now())), store.ErrExists)
	got, err = s.GetRun(bg, "r1")
	noErr(t, "GetRun", err)
	sameJSON(t, "run after refused create", got, want)

	// Every field round-trips, the optional ones set.
	full := run("r2", "alice", "h1", clk.Now())
	code := 3
	endedAt := clk.Now().Add(time.Minute)
	full.ChildRunID, full.Status, full.Attempt, full.ExitCode = "child-9", store.StatusFailed, 2, &code
	full.Reason, full.EndedAt, full.EventCursor, full.Drained = hostproto.ReasonTimedOut, &endedAt, 1234, false
	full.Detail = "the attempt ran longer than runner.maxDuration (2h0m0s)"
	full.ExpiresAt = store.RoundExpiry(endedAt.Add(30 * 24 * time.Hour))
	full.EventsExpireAfter = clk.Now().Add(37*24*time.Hour + 123*time.Nanosecond).UTC()
	noErr(t, "CreateRun full", s.CreateRun(bg, full))
	got, err = s.GetRun(bg, "r2")
	noErr(t, "GetRun full", err)
	full.Version = 1
	sameJSON(t, "GetRun full", got, full)
}

func testRunsCreateRequiresKeys(t *testing.T, s store.Store, clk *clock.Fake) {
	for name, mutate := range map[string]func(*store.Run){
		"no id":        func(r *store.Run) { r.FleetRunID = "" },
		"no owner":     func(r *store.Run) { r.OwnerID = "" },
		"no host":      func(r *store.Run) { r.HostID = "" },
		"no createdAt": func(r *store.Run) { r.CreatedAt = time.Time{} },
	} {
		r := run("r1", "alice", "h1", clk.Now())
		mutate(&r)
		if err := s.CreateRun(bg, r); err == nil {
			t.Fatalf("CreateRun with %s succeeded", name)
		}
	}
}

func testRunsConcurrentCreate(t *testing.T, s store.Store, clk *clock.Fake) {
	const n = 10
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.CreateRun(bg, run("r1", fmt.Sprintf("owner%d", i), "h1", clk.Now()))
		}()
	}
	await.Group(t, "the concurrent CreateRuns", &wg)
	winners := 0
	for _, err := range errs {
		if err == nil {
			winners++
		} else if !errors.Is(err, store.ErrExists) {
			t.Fatalf("CreateRun: %v", err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d concurrent creates of one run id succeeded", winners)
	}
}

func testRunsNotFound(t *testing.T, s store.Store, clk *clock.Fake) {
	_, err := s.GetRun(bg, "nope")
	wantErr(t, "GetRun", err, store.ErrNotFound)
	r := run("nope", "alice", "h1", clk.Now())
	r.Version = 1
	_, err = s.UpdateRun(bg, r)
	wantErr(t, "UpdateRun of a missing run", err, store.ErrNotFound)
	_, err = s.GetRun(bg, "nope")
	wantErr(t, "UpdateRun must not create", err, store.ErrNotFound)
	sameIDs(t, "no live entry from a failed update", allLive(t, s, 10), nil)
}

func testRunsUpdateVersion(t *testing.T, s store.Store, clk *clock.Fake) {
	r := createRun(t, s, run("r1", "alice", "h1", clk.Now()))
	clk.Advance(time.Second)
	next := r
	next.Status, next.ChildRunID, next.Attempt, next.UpdatedAt = store.StatusRunning, "child-1", 1, clk.Now()
	// Fields fixed at creation cannot be moved by an update.
	next.OwnerID, next.HostID, next.CreatedAt, next.IdempotencyKey = "mallory", "h9", clk.Now(), "other"
	got, err := s.UpdateRun(bg, next)
	noErr(t, "UpdateRun", err)
	want := r
	want.Status, want.ChildRunID, want.Attempt, want.UpdatedAt = store.StatusRunning, "child-1", 1, clk.Now()
	want.Version = 2
	sameJSON(t, "UpdateRun result", got, want)
	read, err := s.GetRun(bg, "r1")
	noErr(t, "GetRun", err)
	sameJSON(t, "GetRun after update", read, want)
	sameIDs(t, "still listed under its owner", allRuns(t, s, store.RunQuery{OwnerID: "alice"}, 10), []string{"r1"})
	sameIDs(t, "not listed under the other owner", allRuns(t, s, store.RunQuery{OwnerID: "mallory"}, 10), nil)

	stale := next // still version 1
	stale.Status = store.StatusFailed
	_, err = s.UpdateRun(bg, stale)
	wantErr(t, "UpdateRun from a stale version", err, store.ErrConflict)
	read, err = s.GetRun(bg, "r1")
	noErr(t, "GetRun", err)
	sameJSON(t, "run after refused update", read, want)

	got.Status = store.StatusSucceeded
	got, err = s.UpdateRun(bg, got)
	noErr(t, "UpdateRun from the returned run", err)
	if got.Version != 3 || got.Status != store.StatusSucceeded {
		t.Fatalf("second update stored version %d status %s", got.Version, got.Status)
	}
}

func testRunsConcurrentUpdate(t *testing.T, s store.Store, clk *clock.Fake) {
	for round := range 5 {
		r := createRun(t, s, run(fmt.Sprintf("r%d", round), "alice", "h1", clk.Now()))
		var wg sync.WaitGroup
		errs := make([]error, 2)
		start := make(chan struct{})
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				u := r
				u.Status = store.StatusRunning
				u.ChildRunID = fmt.Sprintf("child-%d", i)
				<-start
				_, errs[i] = s.UpdateRun(bg, u)
			}()
		}
		close(start)
		await.Group(t, "the concurrent UpdateRuns", &wg)
		wins := 0
		for _, err := range errs {
			if err == nil {
				wins++
			} else if !errors.Is(err, store.ErrConflict) {
				t.Fatalf("UpdateRun: %v", err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d of 2 updates from one version won", round, wins)
		}
		got, err := s.GetRun(bg, r.FleetRunID)
		noErr(t, "GetRun", err)
		if got.Version != 2 {
			t.Fatalf("version %d after one winning update", got.Version)
		}
	}
}

func testRunsLiveIndex(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	r := createRun(t, s, run("r1", "alice", "h1", now))
	createRun(t, s, run("other", "alice", "h1", now))
	sameIDs(t, "dispatching is live", allLive(t, s, 10), []string{"other", "r1"})

	step := func(what string, mutate func(*store.Run), live bool) {
		t.Helper()
		mutate(&r)
		var err error
		r, err = s.UpdateRun(bg, r)
		noErr(t, "UpdateRun "+what, err)
		want := []string{"other"}
		if live {
			want = []string{"other", "r1"}
		}
		if r.Live() != live {
			t.Fatalf("%s: the record says Live()=%v", what, r.Live())
		}
		sameIDs(t, what, allLive(t, s, 10), want)
	}
	step("running", func(r *store.Run) { r.Status = store.StatusRunning }, true)
	step("terminal, undrained", func(r *store.Run) {
		*r = ended(*r, store.StatusSucceeded, clk.Now(), false, 24*time.Hour)
	}, true)
	step("terminal, drained", func(r *store.Run) { r.Drained = true }, false)
	step("retried", func(r *store.Run) {
		r.Status, r.Drained, r.EndedAt, r.ExpiresAt, r.Attempt = store.StatusRunning, false, nil, time.Time{}, 2
	}, true)
	step("lost and drained", func(r *store.Run) {
		*r = ended(*r, store.StatusLost, clk.Now(), true, 24*time.Hour)
	}, false)
}

func testRunsListLivePages(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	var want []string
	for i := range 11 {
		r := createRun(t, s, run(fmt.Sprintf("r%02d", i), "alice", "h1", now))
		if i%4 == 3 { // r03, r07: done and drained
			_, err := s.UpdateRun(bg, ended(r, store.StatusCanceled, now, true, time.Hour))
			noErr(t, "UpdateRun", err)
			continue
		}
		want = append(want, r.FleetRunID)
	}
	for _, size := range []int{1, 3, 9, 100} {
		sameIDs(t, fmt.Sprintf("ListLive pages of %d", size), allLive(t, s, size), want)
	}
	p, err := s.ListLive(bg, "", 0)
	noErr(t, "ListLive default limit", err)
	if len(p.FleetRunIDs) != len(want) || p.NextCursor != "" {
		t.Fatalf("ListLive default limit: %d ids, cursor %q", len(p.FleetRunIDs), p.NextCursor)
	}
}

// listFixture writes runs across two owners and two hosts, several sharing
// one CreatedAt, and returns each scope's expected order.
func listFixture(t *testing.T, s store.Store, clk *clock.Fake) (all, alice, h1 []string) {
	base := clk.Now()
	type spec struct {
		id, owner, host string
		at              time.Duration
	}
	specs := []spec{
		{"r-a", "alice", "h1", 0},
		{"r-b", "bob", "h1", time.Second},
		{"r-c", "alice", "h2", time.Second},
		{"r-d", "alice", "h1", time.Second},
		{"r-e", "bob", "h2", 2 * time.Second},
		{"r-f", "alice", "h1", 3 * time.Second},
		{"r-g", "alice", "h2", 3 * time.Second},
		{"r-h", "bob", "h1", 3 * time.Second},
		{"r-i", "alice", "h1", 4 * time.Second},
		{"r-j", "bob", "h2", -time.Hour},
		{"r-k", "alice", "h1", time.Nanosecond},
	}
	// The hosts the runs name, as a dispatch would have them.
	noErr(t, "CreateHost h1", s.CreateHost(bg, host("h1", base)))
	noErr(t, "CreateHost h2", s.CreateHost(bg, host("h2", base)))
	for _, sp := range specs {
		createRun(t, s, run(sp.id, sp.owner, sp.host, base.Add(sp.at)))
	}
	sort.Slice(specs, func(i, j int) bool {
		if specs[i].at != specs[j].at {
			return specs[i].at > specs[j].at
		}
		return specs[i].id > specs[j].id
	})
	for _, sp := range specs {
		all = append(all, sp.id)
		if sp.owner == "alice" {
			alice = append(alice, sp.id)
		}
		if sp.host == "h1" {
			h1 = append(h1, sp.id)
		}
	}
	return all, alice, h1
}

func testRunsListRunsPages(t *testing.T, s store.Store, clk *clock.Fake) {
	all, alice, h1 := listFixture(t, s, clk)
	for _, size := range []int{1, 2, 3, 5, 11, 1000} {
		sameIDs(t, fmt.Sprintf("everyone, pages of %d", size), allRuns(t, s, store.RunQuery{}, size), all)
		sameIDs(t, fmt.Sprintf("alice, pages of %d", size), allRuns(t, s, store.RunQuery{OwnerID: "alice"}, size), alice)
		sameIDs(t, fmt.Sprintf("host h1, pages of %d", size), allRuns(t, s, store.RunQuery{HostID: "h1"}, size), h1)
	}
	sameIDs(t, "an owner without runs", allRuns(t, s, store.RunQuery{OwnerID: "nobody"}, 5), nil)
	sameIDs(t, "a host without runs", allRuns(t, s, store.RunQuery{HostID: "h9"}, 5), nil)

	p, err := s.ListRuns(bg, store.RunQuery{OwnerID: "alice"})
	noErr(t, "ListRuns default limit", err)
	sameIDs(t, "default limit", ids(p.Runs), alice)
	if p.NextCursor != "" {
		t.Fatal("a complete page carries a next cursor")
	}
	p, err = s.ListRuns(bg, store.RunQuery{Limit: 2})
	noErr(t, "ListRuns", err)
	got, err := s.GetRun(bg, p.Runs[0].FleetRunID)
	noErr(t, "GetRun", err)
	sameJSON(t, "a listed run is the whole run", p.Runs[0], got)
}

func testRunsListRunsStable(t *testing.T, s store.Store, clk *clock.Fake) {
	all, _, _ := listFixture(t, s, clk)
	p, err := s.ListRuns(bg, store.RunQuery{Limit: 4})
	noErr(t, "ListRuns", err)
	sameIDs(t, "first page", ids(p.Runs), all[:4])
	last := p.Runs[3]

	// Between pages: a newer run, two runs tied with the page's last one
	// (one sorting before it, one after), and every run of host h2 deleted.
	createRun(t, s, run("r-new", "alice", "h1", clk.Now().Add(time.Hour)))
	createRun(t, s, run(last.FleetRunID+"z", "bob", "h1", last.CreatedAt))
	createRun(t, s, run(last.FleetRunID[:len(last.FleetRunID)-1], "bob", "h1", last.CreatedAt))
	noErr(t, "DeleteHost h2", deleteHost(s, "h2", true))

	// What the second page must hold: every surviving run strictly older
	// than the last one listed, in order.
	type pos struct {
		at time.Time
		id string
	}
	var rest []pos
	for _, id := range append(all, "r-new", last.FleetRunID+"z", last.FleetRunID[:len(last.FleetRunID)-1]) {
		r, err := s.GetRun(bg, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		noErr(t, "GetRun", err)
		if r.CreatedAt.Before(last.CreatedAt) || (r.CreatedAt.Equal(last.CreatedAt) && r.FleetRunID < last.FleetRunID) {
			rest = append(rest, pos{r.CreatedAt, r.FleetRunID})
		}
	}
	sort.Slice(rest, func(i, j int) bool {
		if !rest[i].at.Equal(rest[j].at) {
			return rest[i].at.After(rest[j].at)
		}
		return rest[i].id > rest[j].id
	})
	var want []string
	for _, r := range rest {
		want = append(want, r.id)
	}
	p, err = s.ListRuns(bg, store.RunQuery{Limit: 100, Cursor: p.NextCursor})
	noErr(t, "ListRuns second page", err)
	sameIDs(t, "second page after writes", ids(p.Runs), want)
}

func testRunsBadCursor(t *testing.T, s store.Store, clk *clock.Fake) {
	listFixture(t, s, clk)
	p, err := s.ListRuns(bg, store.RunQuery{OwnerID: "alice", Limit: 2})
	noErr(t, "ListRuns", err)
	aliceCursor := p.NextCursor
	live, err := s.ListLive(bg, "", 2)
	noErr(t, "ListLive", err)
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	forged := map[string]store.RunQuery{
		"garbage":                   {Cursor: "!!not a cursor!!"},
		"base64 of text":            {Cursor: b64("hello")},
		"json of another shape":     {Cursor: b64(`{"lastEvaluatedKey":{"fleetRunId":"r-a"}}`)},
		"future version":            {Cursor: b64(`{"v":99,"k":"runs","s":"all","t":1,"id":"r-a"}`)},
		"another owner's cursor":    {OwnerID: "bob", Cursor: aliceCursor},
		"owner cursor for everyone": {Cursor: aliceCursor},
		"owner cursor for a host":   {HostID: "h1", Cursor: aliceCursor},
		"a live cursor":             {Cursor: live.NextCursor},
		"very long":                 {Cursor: strings.Repeat("A", 10000)},
	}
	for name, q := range forged {
		_, err := s.ListRuns(bg, q)
		wantErr(t, "ListRuns with "+name, err, store.ErrBadCursor)
	}
	for name, c := range map[string]string{"garbage": "%%%", "a runs cursor": aliceCursor, "base64 json": b64(`{"v":1}`)} {
		_, err := s.ListLive(bg, c, 2)
		wantErr(t, "ListLive with "+name, err, store.ErrBadCursor)
	}
}

func testRunsOwnerAndHost(t *testing.T, s store.Store, clk *clock.Fake) {
	listFixture(t, s, clk)
	if _, err := s.ListRuns(bg, store.RunQuery{OwnerID: "alice", HostID: "h1"}); err == nil {
		t.Fatal("ListRuns by owner and host together succeeded; the contract refuses it")
	}
}

func testRunsExpiry(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", now)))
	keep := createRun(t, s, run("keep", "alice", "h1", now))
	old := createRun(t, s, run("old", "alice", "h1", now.Add(time.Second)))
	old, err := s.UpdateRun(bg, ended(old, store.StatusSucceeded, now, true, time.Hour))
	noErr(t, "UpdateRun", err)
	_, err = s.GetRun(bg, "old")
	noErr(t, "GetRun before expiry", err)

	clk.Set(old.ExpiresAt)
	_, err = s.GetRun(bg, "old")
	wantErr(t, "GetRun after expiry", err, store.ErrNotFound)
	_, err = s.UpdateRun(bg, old)
	wantErr(t, "UpdateRun after expiry", err, store.ErrNotFound)
	for _, q := range []store.RunQuery{{}, {OwnerID: "alice"}, {HostID: "h1"}} {
		sameIDs(t, fmt.Sprintf("ListRuns %+v after expiry", q), allRuns(t, s, q, 1), []string{keep.FleetRunID})
	}
	// The id is free again.
	again := run("old", "bob", "h2", clk.Now())
	noErr(t, "CreateRun over an expired run", s.CreateRun(bg, again))
	got, err := s.GetRun(bg, "old")
	noErr(t, "GetRun re-created", err)
	again.Version = 1
	sameJSON(t, "re-created run", got, again)
	sameIDs(t, "old owner no longer lists it", allRuns(t, s, store.RunQuery{OwnerID: "alice"}, 10), []string{"keep"})
	sameIDs(t, "new owner lists it", allRuns(t, s, store.RunQuery{OwnerID: "bob"}, 10), []string{"old"})
}

// --- events ----------------------------------------------------------------

func testEventsPutList(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	var evs []store.Event
	for i := int64(1); i <= 5; i++ {
		evs = append(evs, event("r1", i, now.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("line %d\n", i)))
	}
	state, _ := json.Marshal(hostproto.StateChange{Status: store.StatusRunning, Attempt: 1})
	evs[4].Type, evs[4].Data = hostproto.EventState, state
	// Out of order and split across calls: the store orders by sequence.
	noErr(t, "PutEvents", s.PutEvents(bg, []store.Event{evs[3], evs[0], evs[4]}))
	noErr(t, "PutEvents", s.PutEvents(bg, []store.Event{evs[2], evs[1], event("r2", 1, now, "other run")}))
	noErr(t, "PutEvents empty", s.PutEvents(bg, nil))

	type step struct {
		after   int64
		limit   int
		want    []int64
		hasMore bool
	}
	for _, st := range []step{
		{0, 2, []int64{1, 2}, true},
		{2, 2, []int64{3, 4}, true},
		{4, 2, []int64{5}, false},
		{3, 2, []int64{4, 5}, false},
		{5, 2, nil, false},
		{0, 0, []int64{1, 2, 3, 4, 5}, false},
		{-1, 5, []int64{1, 2, 3, 4, 5}, false},
		{0, 4, []int64{1, 2, 3, 4}, true},
	} {
		p, err := s.ListEvents(bg, "r1", st.after, st.limit)
		noErr(t, "ListEvents", err)
		if fmt.Sprint(seqs(p.Events)) != fmt.Sprint(st.want) || p.HasMore != st.hasMore {
			t.Fatalf("ListEvents(after %d, limit %d) = %v hasMore %v, want %v hasMore %v",
				st.after, st.limit, seqs(p.Events), p.HasMore, st.want, st.hasMore)
		}
	}
	p, err := s.ListEvents(bg, "r1", 0, 10)
	noErr(t, "ListEvents", err)
	sameJSON(t, "events round-trip", p.Events, evs)
	p, err = s.ListEvents(bg, "unknown", 0, 10)
	noErr(t, "ListEvents of an unknown run", err)
	if len(p.Events) != 0 || p.HasMore {
		t.Fatalf("events of an unknown run: %v", seqs(p.Events))
	}
}

func testEventsIdempotent(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	first := []store.Event{event("r1", 1, now, "one"), event("r1", 2, now, "two"), event("r1", 3, now, "three")}
	noErr(t, "PutEvents", s.PutEvents(bg, first))
	rewrite := event("r1", 2, now.Add(time.Hour), "REWRITTEN")
	rewrite.Type = hostproto.EventInput
	noErr(t, "PutEvents again", s.PutEvents(bg, []store.Event{rewrite, first[2], event("r1", 4, now, "four")}))
	p, err := s.ListEvents(bg, "r1", 0, 100)
	noErr(t, "ListEvents", err)
	sameJSON(t, "events after a re-put", p.Events, append(first, event("r1", 4, now, "four")))
}

func testEventsExpiry(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	exp := store.RoundExpiry(now.Add(time.Hour))
	var evs []store.Event
	for i := int64(1); i <= 3; i++ {
		e := event("r1", i, now, "x")
		e.ExpiresAt = now.Add(time.Hour)
		evs = append(evs, e)
	}
	noErr(t, "PutEvents", s.PutEvents(bg, evs))
	p, err := s.ListEvents(bg, "r1", 0, 10)
	noErr(t, "ListEvents", err)
	if len(p.Events) != 3 || !p.Events[0].ExpiresAt.Equal(exp) {
		t.Fatalf("before expiry: %d events, expiresAt %v want %v", len(p.Events), p.Events[0].ExpiresAt, exp)
	}
	clk.Set(exp)
	p, err = s.ListEvents(bg, "r1", 0, 10)
	noErr(t, "ListEvents after expiry", err)
	if len(p.Events) != 0 || p.HasMore {
		t.Fatalf("expired events still listed: %v hasMore %v", seqs(p.Events), p.HasMore)
	}
	// An expired sequence reads as absent, so a put writes it afresh.
	fresh := event("r1", 2, clk.Now(), "fresh")
	noErr(t, "PutEvents over expired", s.PutEvents(bg, []store.Event{fresh}))
	p, err = s.ListEvents(bg, "r1", 0, 10)
	noErr(t, "ListEvents", err)
	sameJSON(t, "fresh event", p.Events, []store.Event{fresh})
}

// testEventsExtendExpiry: events expiring before the target move to it;
// later ones, ones that never expire and expired ones stay as they are;
// another run's are untouched; a second, earlier target shortens nothing.
func testEventsExtendExpiry(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	at := func(seq int64, exp time.Time) store.Event {
		e := event("r1", seq, now, fmt.Sprintf("e%d", seq))
		e.ExpiresAt = exp
		return e
	}
	soon, later, target := now.Add(time.Hour), now.Add(10*time.Hour), now.Add(5*time.Hour+time.Millisecond)
	other := event("r2", 1, now, "other")
	other.ExpiresAt = soon
	noErr(t, "PutEvents", s.PutEvents(bg, []store.Event{
		at(1, now.Add(time.Minute)), at(2, soon), at(3, later), at(4, time.Time{}), at(5, soon), other,
	}))
	clk.Advance(2 * time.Minute) // event 1 has expired
	noErr(t, "ExtendEventsExpiry", s.ExtendEventsExpiry(bg, "r1", target))
	noErr(t, "ExtendEventsExpiry to an earlier time", s.ExtendEventsExpiry(bg, "r1", soon.Add(time.Minute)))
	noErr(t, "ExtendEventsExpiry of a run without events", s.ExtendEventsExpiry(bg, "r9", target))
	clk.Set(store.RoundExpiry(soon)) // 2 and 5 would have expired
	p, err := s.ListEvents(bg, "r1", 0, 10)
	noErr(t, "ListEvents", err)
	got := map[int64]time.Time{}
	for _, e := range p.Events {
		got[e.Sequence] = e.ExpiresAt
	}
	want := map[int64]time.Time{2: store.RoundExpiry(target), 3: store.RoundExpiry(later), 4: {}, 5: store.RoundExpiry(target)}
	sameJSON(t, "expiries after the extension", got, want)
	p, err = s.ListEvents(bg, "r2", 0, 10)
	noErr(t, "ListEvents r2", err)
	if len(p.Events) != 0 {
		t.Fatalf("another run's event was extended: %+v", p.Events)
	}
}

func testEventsLargeData(t *testing.T, s store.Store, clk *clock.Fake) {
	// The largest event a host sends: 32 KiB of output, JSON-encoded.
	text := strings.Repeat("é", hostproto.MaxEventData/2)
	e := event("r1", 1, clk.Now(), text)
	noErr(t, "PutEvents", s.PutEvents(bg, []store.Event{e}))
	p, err := s.ListEvents(bg, "r1", 0, 1)
	noErr(t, "ListEvents", err)
	sameJSON(t, "large event", p.Events, []store.Event{e})
}

func testContextCanceled(t *testing.T, s store.Store, clk *clock.Fake) {
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := s.CreateHost(ctx, host("h1", clk.Now())); !errors.Is(err, context.Canceled) {
		t.Fatalf("CreateHost with a canceled context: %v", err)
	}
	if _, err := s.GetRun(ctx, "r1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("GetRun with a canceled context: %v", err)
	}
	if _, err := s.GetHost(bg, "h1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a canceled CreateHost wrote anyway: %v", err)
	}
}
