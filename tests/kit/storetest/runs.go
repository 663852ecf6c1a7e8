package storetest

import (
	"encoding/base64"
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

// runsContract is store.Runs' contract; the listing's cases run on
// registered hosts, as dispatch writes runs.
var runsContract = []contractCase{
	roleCase("Runs/CreateGet", testRunsCreateGet),
	roleCase("Runs/CreateRequiresKeys", testRunsCreateRequiresKeys),
	roleCase("Runs/ConcurrentCreate", testRunsConcurrentCreate),
	roleCase("Runs/NotFound", testRunsNotFound),
	roleCase("Runs/UpdateVersion", testRunsUpdateVersion),
	roleCase("Runs/HostMovesOnlyWhileDispatching", testRunsHostMoves),
	roleCase("Runs/ConcurrentUpdate", testRunsConcurrentUpdate),
	roleCase("Runs/LiveFollowsLive", testRunsLiveIndex),
	roleCase("Runs/ListLivePages", testRunsListLivePages),
	roleCase("Runs/LiveCursorAfterAnyID", testRunsLiveCursorAfter),
	roleCase("Runs/ListRunsPages", testRunsListRunsPages),
	roleCase("Runs/ListRunsStableUnderWrites", testRunsListRunsStable),
	roleCase("Runs/BadCursor", testRunsBadCursor),
	roleCase("Runs/OwnerAndHostRefused", testRunsOwnerAndHost),
	roleCase("Runs/Expiry", testRunsExpiry),
	roleCase("Runs/BrokeredKeysRoundTrip", testRunsBrokered),
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

func createRun(t *testing.T, s store.Runs, r store.Run) store.Run {
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

func ids(runs []store.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.FleetRunID
	}
	return out
}

// allRuns pages through q with the given page size and returns every run in
// order, failing on a duplicate or on a page larger than asked.
func allRuns(t *testing.T, s store.Runs, q store.RunQuery, pageSize int) []string {
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

func allLive(t *testing.T, s store.Runs, pageSize int) []string {
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

func testRunsCreateGet(t *testing.T, s store.Runs, clk *clock.Fake) {
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
	full.Repository = "acme/app"
	full.ExpiresAt = store.RoundExpiry(endedAt.Add(30 * 24 * time.Hour))
	full.EventsExpireAfter = clk.Now().Add(37*24*time.Hour + 123*time.Nanosecond).UTC()
	noErr(t, "CreateRun full", s.CreateRun(bg, full))
	got, err = s.GetRun(bg, "r2")
	noErr(t, "GetRun full", err)
	full.Version = 1
	sameJSON(t, "GetRun full", got, full)
}

func testRunsCreateRequiresKeys(t *testing.T, s store.Runs, clk *clock.Fake) {
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

func testRunsConcurrentCreate(t *testing.T, s store.Runs, clk *clock.Fake) {
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

func testRunsNotFound(t *testing.T, s store.Runs, clk *clock.Fake) {
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

func testRunsUpdateVersion(t *testing.T, s store.Runs, clk *clock.Fake) {
	first := run("r1", "alice", "h1", clk.Now())
	first.Repository = "acme/app"
	r := createRun(t, s, first)
	clk.Advance(time.Second)
	next := r
	next.Status, next.ChildRunID, next.Attempt, next.UpdatedAt = store.StatusRunning, "child-1", 1, clk.Now()
	// Fields fixed at creation cannot be moved by an update.
	next.OwnerID, next.CreatedAt, next.IdempotencyKey, next.Repository = "mallory", clk.Now(), "other", "acme/other"
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

// testRunsHostMoves: a dispatching run moves to another host (a dispatch
// going past a refusal), listed under the new host only; once it left
// dispatching its host is fixed, and an update that would move it is
// ErrConflict and changes nothing.
func testRunsHostMoves(t *testing.T, s store.Runs, clk *clock.Fake) {
	r := createRun(t, s, run("r1", "alice", "h1", clk.Now()))
	moved := r
	moved.HostID, moved.Deadline = "h2", clk.Now().Add(time.Minute)
	got, err := s.UpdateRun(bg, moved)
	noErr(t, "UpdateRun moving the host", err)
	moved.Version = 2
	sameJSON(t, "moved run", got, moved)
	sameIDs(t, "listed under the new host", allRuns(t, s, store.RunQuery{HostID: "h2"}, 10), []string{"r1"})
	sameIDs(t, "not under the old", allRuns(t, s, store.RunQuery{HostID: "h1"}, 10), nil)

	running := got
	running.Status, running.ChildRunID = store.StatusRunning, "child-1"
	running, err = s.UpdateRun(bg, running)
	noErr(t, "UpdateRun to running", err)
	away := running
	away.HostID = "h3"
	_, err = s.UpdateRun(bg, away)
	wantErr(t, "UpdateRun moving a running run", err, store.ErrConflict)
	read, err := s.GetRun(bg, "r1")
	noErr(t, "GetRun", err)
	sameJSON(t, "run after the refused move", read, running)
	sameIDs(t, "still under h2", allRuns(t, s, store.RunQuery{HostID: "h2"}, 10), []string{"r1"})
}

func testRunsConcurrentUpdate(t *testing.T, s store.Runs, clk *clock.Fake) {
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

func testRunsLiveIndex(t *testing.T, s store.Runs, clk *clock.Fake) {
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

func testRunsListLivePages(t *testing.T, s store.Runs, clk *clock.Fake) {
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

func testRunsLiveCursorAfter(t *testing.T, s store.Runs, clk *clock.Fake) {
	now := clk.Now()
	for _, id := range []string{"r1", "r3", "r5"} {
		createRun(t, s, run(id, "alice", "h1", now))
	}
	for after, want := range map[string][]string{"r1": {"r3", "r5"}, "r2": {"r3", "r5"}, "r5": nil, "r0": {"r1", "r3", "r5"}} {
		p, err := s.ListLive(bg, s.LiveCursorAfter(after), 10)
		noErr(t, "ListLive after "+after, err)
		sameIDs(t, "ListLive after "+after, p.FleetRunIDs, want)
	}
}

// listFixture writes runs across two owners and two hosts, several sharing
// one CreatedAt, and returns each scope's expected order.
func listFixture(t *testing.T, s hostsAndRuns, clk *clock.Fake) (all, alice, h1 []string) {
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

func testRunsListRunsPages(t *testing.T, s hostsAndRuns, clk *clock.Fake) {
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

func testRunsListRunsStable(t *testing.T, s hostsAndRuns, clk *clock.Fake) {
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

func testRunsBadCursor(t *testing.T, s hostsAndRuns, clk *clock.Fake) {
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

func testRunsOwnerAndHost(t *testing.T, s hostsAndRuns, clk *clock.Fake) {
	listFixture(t, s, clk)
	if _, err := s.ListRuns(bg, store.RunQuery{OwnerID: "alice", HostID: "h1"}); err == nil {
		t.Fatal("ListRuns by owner and host together succeeded; the contract refuses it")
	}
}

func testRunsExpiry(t *testing.T, s hostsAndRuns, clk *clock.Fake) {
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

// testRunsBrokered: a run's brokered keys round-trip through every write
// and read of a run, the sealed value byte for byte and the revocation
// time to the nanosecond; a run without any reads back nil.
func testRunsBrokered(t *testing.T, s store.Runs, clk *clock.Fake) {
	now := clk.Now()
	r := run("r1", "alice", "h1", now)
	r.Repository = "acme/app"
	r.Brokered = []store.BrokeredKey{
		{ProjectID: "acme", Key: "GITHUB_TOKEN", Kind: "githubApp", ExpiresAt: now.Add(time.Hour + 123*time.Nanosecond), Sealed: sealed(1)},
		{ProjectID: "acme", Key: "GOOGLE_TOKEN", Kind: "oauth2", ExpiresAt: now.Add(50 * time.Minute)},
	}
	r = createRun(t, s, r)
	plain := createRun(t, s, run("r2", "alice", "h1", now.Add(time.Second)))
	check := func(what string, want ...store.Run) {
		t.Helper()
		for _, w := range want {
			got, err := s.GetRun(bg, w.FleetRunID)
			noErr(t, what+": GetRun "+w.FleetRunID, err)
			sameJSON(t, what+": GetRun "+w.FleetRunID, got, w)
		}
		for _, q := range []store.RunQuery{{}, {OwnerID: "alice"}, {HostID: "h1"}} {
			p, err := s.ListRuns(bg, q)
			noErr(t, what+": ListRuns", err)
			byID := map[string]store.Run{}
			for _, got := range p.Runs {
				byID[got.FleetRunID] = got
			}
			for _, w := range want {
				sameJSON(t, fmt.Sprintf("%s: ListRuns %+v, run %s", what, q, w.FleetRunID), byID[w.FleetRunID], w)
			}
		}
	}
	check("created", r, plain)
	if got, _ := s.GetRun(bg, "r2"); got.Brokered != nil {
		t.Fatalf("a run without brokered keys reads back %#v", got.Brokered)
	}

	// The sweep refreshed the GitHub token (a new value, sealed) and the
	// run ended: Fleet revoked it.
	clk.Advance(time.Minute)
	revoked := clk.Now().Add(7 * time.Nanosecond)
	next := r
	next.Brokered = []store.BrokeredKey{r.Brokered[0], r.Brokered[1]}
	next.Brokered[0].Sealed, next.Brokered[0].ExpiresAt, next.Brokered[0].RevokedAt = sealed(2), clk.Now().Add(time.Hour), &revoked
	next.Status, next.UpdatedAt = store.StatusSucceeded, clk.Now()
	got, err := s.UpdateRun(bg, next)
	noErr(t, "UpdateRun", err)
	next.Version = 2
	sameJSON(t, "UpdateRun's answer", got, next)
	check("updated", next, plain)

	// An update without them removes them.
	none := got
	none.Brokered = nil
	got, err = s.UpdateRun(bg, none)
	noErr(t, "UpdateRun without brokered keys", err)
	none.Version = 3
	sameJSON(t, "UpdateRun's answer without brokered keys", got, none)
	check("brokered keys removed", none)
}
