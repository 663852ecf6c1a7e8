package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// queueContract is store.Queue's contract, with what it asks of
// store.Runs: the index follows every write of a run (Waiting()), and a
// queued run has no host.
var queueContract = []contractCase{
	roleCase("Queue/EntersAndLeaves", testQueueEntersAndLeaves),
	roleCase("Queue/OrderAndPages", testQueueOrderAndPages),
	roleCase("Queue/Ahead", testQueueAhead),
	roleCase("Queue/Stats", testQueueStats),
	roleCase("Queue/Classes", testQueueClasses),
	roleCase("Queue/BackToQueuedKeepsItsPlace", testQueueBackToQueued),
	roleCase("Queue/HostRules", testQueueHostRules),
	roleCase("Queue/ConcurrentOffers", testQueueConcurrentOffers),
	roleCase("Queue/InfoRoundTrips", testQueueInfoRoundTrips),
	roleCase("Queue/RefusesWhatItCannotIndex", testQueueRefuses),
	roleCase("Queue/DeleteHostTakesAnOfferedRun", testQueueDeleteHost),
	roleCase("Queue/EntriesCarryTheirHosts", testQueueEntriesCarryHosts),
}

// runsAndQueue is what a queue case takes: the runs it writes and the
// index that follows them.
type runsAndQueue interface {
	store.Runs
	store.Queue
}

// QueueRequest is the request a queued run of these cases keeps: a
// dispatch of a few hundred bytes in Fleet's JSON form, with a byte that
// is not UTF-8 (the store keeps bytes, not text).
var QueueRequest = []byte(`{"agent":"claude","prompt":"Fix the flaky test in pkg/api and open a pull request","labels":{"pool":"build"},` +
	`"repository":"https://github.com/acme/app","env":{"CI":"true","GOFLAGS":"-mod=mod"},"secrets":[{"name":"GITHUB_TOKEN"}],` +
	`"queue":{"timeout":"30m"}}` + "\xff")

// queuedRun is a run waiting in class since `since`, as Fleet records one
// that found no host.
func queuedRun(id, class string, priority int, since time.Time) store.Run {
	return store.Run{
		FleetRunID: id, OwnerID: "alice", Status: store.StatusQueued, Agent: "claude",
		CreatedAt: since, UpdatedAt: since,
		Queue: &store.QueueInfo{
			Class: class, Priority: priority, Since: since, Timeout: 30 * time.Minute, Until: since.Add(30 * time.Minute),
			Request: QueueRequest,
		},
	}
}

// offered is r as a dispatcher offers it to host: dispatching there until
// deadline, still waiting.
func offered(r store.Run, host string, deadline time.Time) store.Run {
	r.Status, r.HostID, r.Deadline = store.StatusDispatching, host, deadline
	return r
}

// started is r as the host took it at `at`: out of the queue, its request
// dropped.
func started(r store.Run, at time.Time) store.Run {
	q := *r.Queue
	q.StartedAt, q.StartedOn, q.Request = &at, r.HostID, nil
	r.Queue = &q
	r.Status, r.ChildRunID, r.UpdatedAt = store.StatusRunning, "child-"+r.FleetRunID, at
	return r
}

func update(t *testing.T, s store.Runs, r store.Run) store.Run {
	t.Helper()
	got, err := s.UpdateRun(bg, r)
	noErr(t, "UpdateRun "+r.FleetRunID+" to "+r.Status, err)
	return got
}

// queueIDs pages through class's queue pageSize at a time, checking each
// page's Next, and returns the run ids in order.
func queueIDs(t *testing.T, s store.Queue, class string, pageSize int) []string {
	t.Helper()
	var out []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("ListQueue never ended")
		}
		p, err := s.ListQueue(bg, class, after, pageSize)
		noErr(t, "ListQueue", err)
		if len(p.Entries) > pageSize {
			t.Fatalf("queue page of %d, limit %d", len(p.Entries), pageSize)
		}
		for i, e := range p.Entries {
			since, id, err := store.ParseQueueOrder(e.Order)
			if err != nil || id != e.FleetRunID || !since.Equal(e.Since) {
				t.Fatalf("entry %+v: its order says %s since %v (%v)", e, id, since, err)
			}
			if !e.Until.Equal(e.Since.Add(30 * time.Minute)) {
				t.Fatalf("entry %+v: until, want since + 30m (queuedRun's)", e)
			}
			if i > 0 && p.Entries[i-1].Order >= e.Order {
				t.Fatalf("entries out of order: %q then %q", p.Entries[i-1].Order, e.Order)
			}
			out = append(out, e.FleetRunID)
		}
		if p.Next == "" {
			return out
		}
		if len(p.Entries) == 0 || p.Next != p.Entries[len(p.Entries)-1].Order {
			t.Fatalf("page %v: Next %q is not its last entry's order", p.Entries, p.Next)
		}
		after = p.Next
	}
}

// classes is QueueClasses, checked against QueueHeads: the same classes,
// each head its class's first entry.
func classes(t *testing.T, s store.Queue) []string {
	t.Helper()
	got, err := s.QueueClasses(bg)
	noErr(t, "QueueClasses", err)
	heads, err := s.QueueHeads(bg)
	noErr(t, "QueueHeads", err)
	if len(heads) != len(got) {
		t.Fatalf("QueueHeads %+v, QueueClasses %v", heads, got)
	}
	for i, h := range heads {
		first, err := s.ListQueue(bg, h.Class, "", 1)
		noErr(t, "ListQueue", err)
		if h.Class != got[i] || len(first.Entries) != 1 || !reflect.DeepEqual(h.Head, first.Entries[0]) {
			t.Fatalf("QueueHeads[%d] %+v: want class %q and its first entry %+v", i, h, got[i], first.Entries)
		}
	}
	return got
}

// testQueueEntersAndLeaves: the queue index follows Waiting() and the
// live index Live() on every path a waiting run takes: a queued run is
// in the queue and not live; an offer makes it live (a host may run it)
// and keeps it in the queue; taken back to queued it leaves the live
// index; started it leaves the queue; ended while queued (drained at
// once: no host ran it) it is in neither.
func testQueueEntersAndLeaves(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	now := clk.Now()
	const class = "claude?pool=build"
	q1 := createRun(t, s, queuedRun("q1", class, 0, now))
	createRun(t, s, run("r1", "alice", "h1", now)) // never waits
	sameIDs(t, "the queue after a queued create", queueIDs(t, s, class, 10), []string{"q1"})
	sameIDs(t, "classes", classes(t, s), []string{class})
	sameIDs(t, "a queued run is not live", allLive(t, s, 10), []string{"r1"})

	clk.Advance(time.Second)
	q1 = update(t, s, offered(q1, "h1", clk.Now().Add(30*time.Second)))
	sameIDs(t, "an offered run stays in the queue", queueIDs(t, s, class, 10), []string{"q1"})
	sameIDs(t, "an offered run is live", allLive(t, s, 10), []string{"q1", "r1"})
	back := q1
	back.Status, back.HostID, back.Deadline = store.StatusQueued, "", time.Time{}
	q := *q1.Queue
	q.Offers++
	back.Queue = &q
	q1 = update(t, s, back)
	sameIDs(t, "a run taken back stays in the queue", queueIDs(t, s, class, 10), []string{"q1"})
	sameIDs(t, "a run taken back is not live", allLive(t, s, 10), []string{"r1"})
	q1 = update(t, s, offered(q1, "h1", clk.Now().Add(30*time.Second)))
	sameIDs(t, "offered again: live", allLive(t, s, 10), []string{"q1", "r1"})
	update(t, s, started(q1, clk.Now()))
	sameIDs(t, "a started run left the queue", queueIDs(t, s, class, 10), nil)
	sameIDs(t, "no class is left", classes(t, s), nil)
	sameIDs(t, "the started run is live", allLive(t, s, 10), []string{"q1", "r1"})

	// Ended while waiting: canceled or timed out while queued (drained
	// at once), or after an offer (its host may hold events).
	for i, tc := range []struct {
		end  func(r store.Run) store.Run
		live bool
	}{
		{func(r store.Run) store.Run {
			r = ended(r, store.StatusCanceled, clk.Now(), true, 0)
			r.ExpiresAt = time.Time{}
			return r
		}, false},
		{func(r store.Run) store.Run {
			r = ended(r, store.StatusFailed, clk.Now(), true, 0)
			r.Reason, r.ExpiresAt, r.ExitCode = store.ReasonQueueTimeout, time.Time{}, nil
			return r
		}, false},
		{func(r store.Run) store.Run {
			r = update(t, s, offered(r, "h2", clk.Now().Add(time.Minute)))
			r = ended(r, store.StatusFailed, clk.Now(), false, time.Hour)
			return r
		}, true},
	} {
		id := fmt.Sprintf("e%d", i)
		r := createRun(t, s, queuedRun(id, class, 0, clk.Now()))
		sameIDs(t, id+" waits", queueIDs(t, s, class, 10), []string{id})
		got := update(t, s, tc.end(r))
		sameIDs(t, id+" ended: out of the queue", queueIDs(t, s, class, 10), nil)
		if got.Queue == nil || got.Queue.StartedAt != nil || got.Waiting() {
			t.Fatalf("%s ended: queue info %+v", id, got.Queue)
		}
		want := []string{"q1", "r1"}
		if tc.live {
			want = []string{id, "q1", "r1"}
		}
		sameIDs(t, id+" ended: the live index", allLive(t, s, 10), want)
		if tc.live {
			got.Drained = true
			update(t, s, got)
			sameIDs(t, id+" drained: the live index", allLive(t, s, 10), []string{"q1", "r1"})
		}
	}
	sameIDs(t, "no class is left", classes(t, s), nil)
}

// queueFixture writes runs of class "shell" (and one of "other") whose
// queue order is c (priority 5, latest), a and b (equal Since: by id), d,
// then e (priority -3, earliest): the order a priority overtakes in.
func queueFixture(t *testing.T, s runsAndQueue, t0 time.Time) map[string]store.Run {
	t.Helper()
	runs := map[string]store.Run{}
	for _, r := range []store.Run{
		queuedRun("b", "shell", 0, t0),
		queuedRun("a", "shell", 0, t0),
		queuedRun("d", "shell", 0, t0.Add(time.Second)),
		queuedRun("c", "shell", 5, t0.Add(2*time.Second)),
		queuedRun("e", "shell", -3, t0.Add(-time.Second)),
		queuedRun("f", "other", 0, t0.Add(time.Second)),
	} {
		runs[r.FleetRunID] = createRun(t, s, r)
	}
	return runs
}

func testQueueOrderAndPages(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	queueFixture(t, s, clk.Now())
	want := []string{"c", "a", "b", "d", "e"}
	for _, size := range []int{1, 2, 3, 5, 6, 100} {
		sameIDs(t, fmt.Sprintf("pages of %d", size), queueIDs(t, s, "shell", size), want)
	}
	sameIDs(t, "the other class", queueIDs(t, s, "other", 10), []string{"f"})
	sameIDs(t, "a class without runs", queueIDs(t, s, "nobody", 10), nil)

	// Exactly a page: nothing follows, Next is empty.
	p, err := s.ListQueue(bg, "shell", "", 5)
	noErr(t, "ListQueue", err)
	if len(p.Entries) != 5 || p.Next != "" {
		t.Fatalf("a page of exactly the class: %d entries, next %q", len(p.Entries), p.Next)
	}
	// After an order no run holds: from the next one on.
	between := store.QueueOrder(store.QueueInfo{Since: clk.Now().Add(500 * time.Millisecond)}, "zz")
	p, err = s.ListQueue(bg, "shell", between, 10)
	noErr(t, "ListQueue after a free order", err)
	got := make([]string, len(p.Entries))
	for i, e := range p.Entries {
		got[i] = e.FleetRunID
	}
	sameIDs(t, "after an order between b and d", got, []string{"d", "e"})
}

func testQueueAhead(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	t0 := clk.Now()
	runs := queueFixture(t, s, t0)
	ahead := func(what, class, order string, want int) {
		t.Helper()
		n, err := s.QueueAhead(bg, class, order)
		noErr(t, "QueueAhead "+what, err)
		if n != want {
			t.Fatalf("QueueAhead %s: %d, want %d", what, n, want)
		}
	}
	order := func(id string) string { return store.QueueOrder(*runs[id].Queue, id) }
	for i, id := range []string{"c", "a", "b", "d", "e"} {
		ahead(id, "shell", order(id), i)
	}
	ahead("f in its class", "other", order("f"), 0)
	ahead("an order between b and d", "shell", store.QueueOrder(store.QueueInfo{Since: t0.Add(500 * time.Millisecond)}, "zz"), 3)
	ahead("an order before every run", "shell", store.QueueOrder(store.QueueInfo{Priority: store.QueuePriorityMax, Since: t0}, "a"), 0)
	ahead("an order after every run", "shell", store.QueueOrder(store.QueueInfo{Priority: store.QueuePriorityMin, Since: t0}, "a"), 5)
	ahead("a class without runs", "nobody", order("a"), 0)

	// c starts: everyone moves up.
	c := update(t, s, offered(runs["c"], "h1", t0.Add(time.Minute)))
	ahead("a while c is offered", "shell", order("a"), 1)
	update(t, s, started(c, t0.Add(time.Second)))
	ahead("a once c started", "shell", order("a"), 0)
	ahead("e once c started", "shell", order("e"), 3)
}

func testQueueStats(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	t0 := clk.Now()
	runs := queueFixture(t, s, t0)
	stats := func(what, class string, want store.QueueStats) {
		t.Helper()
		got, err := s.QueueStats(bg, class)
		noErr(t, "QueueStats "+what, err)
		sameJSON(t, "QueueStats "+what, got, want)
	}
	// The oldest is e, last in the order: not the head's Since.
	stats("shell", "shell", store.QueueStats{Waiting: 5, Oldest: t0.Add(-time.Second)})
	stats("other", "other", store.QueueStats{Waiting: 1, Oldest: t0.Add(time.Second)})
	stats("a class without runs", "nobody", store.QueueStats{})
	e := update(t, s, offered(runs["e"], "h1", t0.Add(time.Minute)))
	stats("shell with e offered", "shell", store.QueueStats{Waiting: 5, Oldest: t0.Add(-time.Second)})
	update(t, s, started(e, t0))
	stats("shell once e started", "shell", store.QueueStats{Waiting: 4, Oldest: t0})
}

// testQueueClasses: classes as fleet.ClassOf escapes them, some a prefix
// of another, some with bytes that sort below and just above the
// separator ("!" escaped, "$" kept, "%" of escapes, "&", "+", "="); each
// listed once, in ascending order, and only while a run waits in it.
func testQueueClasses(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	all := []string{
		"claude", "claude?gpu=a100&pool=build", "claude?pool=build", "claude?pool=build+x", "shell",
		"a", "a$b", "a%21", "a%21b", "cl%C3%A9", "claude?team=a%23b",
	}
	now := clk.Now()
	var runs []store.Run
	for i, class := range all {
		for j := range 2 {
			runs = append(runs, createRun(t, s, queuedRun(fmt.Sprintf("r%02d-%d", i, j), class, j, now.Add(time.Duration(i)*time.Second))))
		}
	}
	want := append([]string(nil), all...)
	sort.Strings(want)
	sameIDs(t, "classes", classes(t, s), want)
	for i, class := range all {
		sameIDs(t, "class "+class, queueIDs(t, s, class, 1), []string{fmt.Sprintf("r%02d-1", i), fmt.Sprintf("r%02d-0", i)})
	}

	// Every run of "claude?pool=build" and of "a" starts: those classes go.
	for _, r := range runs {
		if c := r.Queue.Class; c == "claude?pool=build" || c == "a" {
			update(t, s, started(update(t, s, offered(r, "h1", now.Add(time.Minute))), now))
		}
	}
	var left []string
	for _, c := range want {
		if c != "claude?pool=build" && c != "a" {
			left = append(left, c)
		}
	}
	sameIDs(t, "classes once two emptied", classes(t, s), left)
}

// testQueueBackToQueued: a run offered and taken back (the host refused,
// or never got the start) keeps its place, under a fresh token, and is
// under no host again.
func testQueueBackToQueued(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	now := clk.Now()
	createRun(t, s, queuedRun("a", "shell", 0, now))
	b := createRun(t, s, queuedRun("b", "shell", 0, now.Add(time.Second)))
	createRun(t, s, queuedRun("c", "shell", 0, now.Add(2*time.Second)))
	order := store.QueueOrder(*b.Queue, "b")
	if b.ClientToken() != "b" {
		t.Fatalf("first token %q", b.ClientToken())
	}

	clk.Advance(time.Minute)
	b = update(t, s, offered(b, "h1", clk.Now().Add(30*time.Second)))
	sameIDs(t, "listed under the host offered it", allRuns(t, s, store.RunQuery{HostID: "h1"}, 10), []string{"b"})
	back := b
	back.Status, back.HostID, back.Deadline = store.StatusQueued, "", time.Time{}
	q := *b.Queue
	q.Offers++
	back.Queue = &q
	b = update(t, s, back)
	if b.HostID != "" || b.Status != store.StatusQueued || b.ClientToken() != "b.q1" {
		t.Fatalf("back to queued: host %q status %s token %q", b.HostID, b.Status, b.ClientToken())
	}
	read, err := s.GetRun(bg, "b")
	noErr(t, "GetRun", err)
	sameJSON(t, "run back in the queue", read, b)
	sameIDs(t, "in its place", queueIDs(t, s, "shell", 10), []string{"a", "b", "c"})
	n, err := s.QueueAhead(bg, "shell", order)
	noErr(t, "QueueAhead", err)
	if n != 1 {
		t.Fatalf("back in the queue: %d ahead, want 1", n)
	}
	sameIDs(t, "under no host", allRuns(t, s, store.RunQuery{HostID: "h1"}, 10), nil)
	sameIDs(t, "listed with its owner's", allRuns(t, s, store.RunQuery{OwnerID: "alice"}, 10), []string{"c", "b", "a"})
	sameIDs(t, "listed with everyone's", allRuns(t, s, store.RunQuery{}, 10), []string{"c", "b", "a"})
}

// testQueueHostRules: store.CheckRun and store.UpdatedHost, in both
// stores; a refused write changes nothing.
func testQueueHostRules(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	now := clk.Now()
	withHost := queuedRun("x", "shell", 0, now)
	withHost.HostID = "h1"
	if err := s.CreateRun(bg, withHost); err == nil {
		t.Fatal("CreateRun of a queued run with a host succeeded")
	}
	noInfo := queuedRun("x", "shell", 0, now)
	noInfo.Queue = nil
	if err := s.CreateRun(bg, noInfo); err == nil {
		t.Fatal("CreateRun of a queued run without its queue info succeeded")
	}
	_, err := s.GetRun(bg, "x")
	wantErr(t, "GetRun of refused creates", err, store.ErrNotFound)

	q := createRun(t, s, queuedRun("q", "shell", 0, now))
	unchanged := func(what string, want store.Run) {
		t.Helper()
		got, err := s.GetRun(bg, want.FleetRunID)
		noErr(t, "GetRun", err)
		sameJSON(t, what, got, want)
	}
	running := q
	running.Status = store.StatusRunning
	_, err = s.UpdateRun(bg, running)
	wantErr(t, "a queued run running without a host", err, store.ErrConflict)
	unchanged("after the refused update", q)
	hosted := q
	hosted.HostID = "h1"
	if _, err := s.UpdateRun(bg, hosted); err == nil || errors.Is(err, store.ErrConflict) {
		t.Fatalf("UpdateRun of a queued run naming a host: %v, want a refusal of the run itself", err)
	}
	unchanged("after the refused update", q)

	// Offered to h1, then moved on to h2 while dispatching (the
	// fallback's next host).
	q = update(t, s, offered(q, "h1", now.Add(time.Minute)))
	q.HostID = "h2"
	q = update(t, s, q)
	sameIDs(t, "moved to h2", allRuns(t, s, store.RunQuery{HostID: "h2"}, 10), []string{"q"})
	sameIDs(t, "not under h1", allRuns(t, s, store.RunQuery{HostID: "h1"}, 10), nil)
	q = update(t, s, started(q, now))
	if q.HostID != "h2" || q.Queue.StartedOn != "h2" {
		t.Fatalf("started on %q (%q)", q.HostID, q.Queue.StartedOn)
	}
	// Started: its host is fixed, and it cannot go back to the queue.
	back := q
	back.Status, back.HostID = store.StatusQueued, ""
	back.Queue = &store.QueueInfo{Class: "shell", Since: now, Timeout: time.Minute, Until: now.Add(time.Minute)}
	_, err = s.UpdateRun(bg, back)
	wantErr(t, "a running run back to queued", err, store.ErrConflict)
	away := q
	away.HostID = "h3"
	_, err = s.UpdateRun(bg, away)
	wantErr(t, "a running run moved", err, store.ErrConflict)
	unchanged("after the refused updates", q)
	// An empty host keeps the stored one.
	keep := q
	keep.HostID = ""
	keep = ended(keep, store.StatusSucceeded, now, false, time.Hour)
	got := update(t, s, keep)
	if got.HostID != "h2" {
		t.Fatalf("an update without a host stored host %q, want h2 kept", got.HostID)
	}

	// Canceled while queued: it ends without a host, listed under none.
	c := createRun(t, s, queuedRun("c", "shell", 0, now))
	c = update(t, s, ended(c, store.StatusCanceled, now, true, time.Hour))
	if c.HostID != "" {
		t.Fatalf("canceled while queued: host %q", c.HostID)
	}
	unchanged("the canceled run", c)
	sameIDs(t, "everyone's runs", allRuns(t, s, store.RunQuery{}, 10), []string{"q", "c"})
}

// testQueueConcurrentOffers: dispatchers racing to offer one queued run
// to their hosts, each from the version it read: exactly one wins, and
// the run is on the winner's host alone.
func testQueueConcurrentOffers(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	const racers = 4
	for round := range 3 {
		r := createRun(t, s, queuedRun(fmt.Sprintf("q%d", round), "shell", 0, clk.Now()))
		var wg sync.WaitGroup
		errs := make([]error, racers)
		start := make(chan struct{})
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = s.UpdateRun(bg, offered(r, fmt.Sprintf("h%d-%d", round, i), clk.Now().Add(time.Minute)))
			}()
		}
		close(start)
		await.Group(t, "the concurrent offers", &wg)
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: offers to h%d and h%d both won", round, winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, store.ErrConflict):
				t.Fatalf("round %d: offer to h%d: %v", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no offer won", round)
		}
		got, err := s.GetRun(bg, r.FleetRunID)
		noErr(t, "GetRun", err)
		if want := fmt.Sprintf("h%d-%d", round, winner); got.HostID != want || got.Version != 2 || got.Status != store.StatusDispatching {
			t.Fatalf("round %d: stored %s on %q at version %d, want dispatching on %s at 2", round, got.Status, got.HostID, got.Version, want)
		}
		for i := range racers {
			want := []string(nil)
			if i == winner {
				want = []string{r.FleetRunID}
			}
			sameIDs(t, fmt.Sprintf("round %d: runs of h%d", round, i), allRuns(t, s, store.RunQuery{HostID: fmt.Sprintf("h%d-%d", round, i)}, 10), want)
		}
	}
}

func testQueueInfoRoundTrips(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	now := clk.Now()
	r := queuedRun("q", "claude?gpu=a100", -7, now)
	r.Queue.Timeout, r.Queue.Until, r.Queue.Offers = 45*time.Minute+time.Nanosecond, now.Add(45*time.Minute+time.Nanosecond), 2
	r.IdempotencyKey, r.Repository = "k1", "acme/app"
	r = createRun(t, s, r)
	got, err := s.GetRun(bg, "q")
	noErr(t, "GetRun", err)
	sameJSON(t, "queued run read", got, r)
	if string(got.Queue.Request) != string(QueueRequest) {
		t.Fatalf("request bytes %q", got.Queue.Request)
	}
	page, err := s.ListRuns(bg, store.RunQuery{OwnerID: "alice"})
	noErr(t, "ListRuns", err)
	sameJSON(t, "queued run listed", page.Runs, []store.Run{r})
	// The index entry carries Until, to the nanosecond, queued and
	// offered alike: the sweep times runs out from it.
	entry := []store.QueueEntry{{FleetRunID: "q", Order: store.QueueOrder(*r.Queue, "q"), Since: now, Until: r.Queue.Until}}
	listed, err := s.ListQueue(bg, "claude?gpu=a100", "", 10)
	noErr(t, "ListQueue", err)
	sameJSON(t, "queued run's entry", listed.Entries, entry)

	clk.Advance(90 * time.Second)
	r = update(t, s, offered(r, "h1", clk.Now().Add(time.Minute)))
	listed, err = s.ListQueue(bg, "claude?gpu=a100", "", 10)
	noErr(t, "ListQueue", err)
	sameJSON(t, "offered run's entry", listed.Entries, entry)
	r = update(t, s, started(r, clk.Now()))
	got, err = s.GetRun(bg, "q")
	noErr(t, "GetRun", err)
	sameJSON(t, "started run read", got, r)
	if got.Queue.Request != nil || got.Queue.StartedAt == nil || !got.Queue.StartedAt.Equal(clk.Now()) || got.Queue.StartedOn != "h1" {
		t.Fatalf("started run's queue info %+v", got.Queue)
	}
}

func testQueueRefuses(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	now := clk.Now()
	for name, mutate := range map[string]func(*store.QueueInfo){
		"no class":             func(q *store.QueueInfo) { q.Class = "" },
		"a class with #":       func(q *store.QueueInfo) { q.Class = "claude?x=a#b" },
		"a class too long":     func(q *store.QueueInfo) { q.Class = string(make([]byte, store.QueueClassMaxBytes+1)) },
		"a priority over max":  func(q *store.QueueInfo) { q.Priority = store.QueuePriorityMax + 1 },
		"a priority under min": func(q *store.QueueInfo) { q.Priority = store.QueuePriorityMin - 1 },
		"no since":             func(q *store.QueueInfo) { q.Since = time.Time{} },
		"queued, yet started":  func(q *store.QueueInfo) { q.StartedAt = &now },
	} {
		r := queuedRun("x", "shell", 0, now)
		mutate(r.Queue)
		if err := s.CreateRun(bg, r); err == nil {
			t.Fatalf("CreateRun with %s succeeded", name)
		}
	}
	_, err := s.GetRun(bg, "x")
	wantErr(t, "GetRun of refused creates", err, store.ErrNotFound)
	sameIDs(t, "no class", classes(t, s), nil)

	q := createRun(t, s, queuedRun("q", "shell", 0, now))
	bad := q
	bad.Queue = &store.QueueInfo{Class: "a#b", Since: now}
	if _, err := s.UpdateRun(bg, bad); err == nil {
		t.Fatal("UpdateRun to a class with # succeeded")
	}
	sameIDs(t, "classes", classes(t, s), []string{"shell"})
}

// hostsRunsAndQueue is what a host's deletion with a waiting run on it
// takes.
type hostsRunsAndQueue interface {
	store.Hosts
	runsAndQueue
}

// testQueueDeleteHost: a forced deletion of a host removes the runs on
// it, a waiting run offered to it too, and that run's queue entry with it.
func testQueueDeleteHost(t *testing.T, s hostsRunsAndQueue, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", now)))
	q := createRun(t, s, queuedRun("q", "shell", 0, now))
	createRun(t, s, queuedRun("w", "shell", 0, now.Add(time.Second)))
	update(t, s, offered(q, "h1", now.Add(time.Minute)))
	wantErr(t, "DeleteHost of a host offered a run", deleteHost(s, "h1", false), store.ErrInUse)
	noErr(t, "DeleteHost forced", deleteHost(s, "h1", true))
	_, err := s.GetRun(bg, "q")
	wantErr(t, "GetRun of the offered run", err, store.ErrNotFound)
	sameIDs(t, "the queue", queueIDs(t, s, "shell", 10), []string{"w"})
}

// testQueueEntriesCarryHosts: a waiting run's QueueInfo.Hosts round-trip
// and are in its index entry, offered or not (nil for a run without);
// hosts that cannot be indexed are refused.
func testQueueEntriesCarryHosts(t *testing.T, s runsAndQueue, clk *clock.Fake) {
	now := clk.Now()
	scoped := queuedRun("a", "shell", 0, now)
	scoped.Queue.Hosts = []string{"h1", "h2.example-3"}
	scoped = createRun(t, s, scoped)
	createRun(t, s, queuedRun("b", "shell", 0, now.Add(time.Second)))
	got, err := s.GetRun(bg, "a")
	noErr(t, "GetRun", err)
	sameJSON(t, "a scoped run read", got, scoped)
	entries := func(what string, want [][]string) {
		t.Helper()
		p, err := s.ListQueue(bg, "shell", "", 10)
		noErr(t, "ListQueue", err)
		var hosts [][]string
		for _, e := range p.Entries {
			hosts = append(hosts, e.Hosts)
		}
		sameJSON(t, what, hosts, want)
	}
	entries("entries", [][]string{{"h1", "h2.example-3"}, nil})
	update(t, s, offered(scoped, "h1", now.Add(time.Minute)))
	entries("entries with the scoped run offered", [][]string{{"h1", "h2.example-3"}, nil})

	for name, hosts := range map[string][]string{
		"no host":       {},
		"too many":      make([]string, store.QueueHostsMax+1),
		"an empty id":   {"h1", ""},
		"a comma in it": {"h1,h2"},
	} {
		r := queuedRun("x", "shell", 0, now)
		r.Queue.Hosts = hosts
		for i := range r.Queue.Hosts {
			if name == "too many" {
				r.Queue.Hosts[i] = fmt.Sprintf("h%d", i)
			}
		}
		if err := s.CreateRun(bg, r); err == nil {
			t.Fatalf("CreateRun with queue hosts %s succeeded", name)
		}
	}
}
