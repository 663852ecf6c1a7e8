package dynamostore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
	"github.com/runfleet/runfleet/tests/kit/storetest"
)

// expect is what one store operation should cost by the documented rules,
// worked out by hand in the comments of TestMeteredCosts.
type expect struct {
	calls map[string]int
	rcu   map[string]float64
	wcu   map[string]float64
}

func checkUsage(t *testing.T, what string, got dynamostore.Usage, want expect) {
	t.Helper()
	if fmt.Sprint(got.Calls) != fmt.Sprint(want.calls) ||
		fmt.Sprint(got.RCU) != fmt.Sprint(orEmpty(want.rcu)) ||
		fmt.Sprint(got.WCU) != fmt.Sprint(orEmpty(want.wcu)) {
		t.Errorf("%s:\n got  %s\n want calls %v RCU %v WCU %v", what, got, want.calls, want.rcu, want.wcu)
	}
}

func orEmpty(m map[string]float64) map[string]float64 {
	if m == nil {
		return map[string]float64{}
	}
	return m
}

func TestMeteredCosts(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.Start)
	m := &dynamostore.Meter{}
	s := newStore(t, clk, m)
	measure := func(what string, want expect, op func() error) {
		t.Helper()
		m.Reset()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		checkUsage(t, what, m.Snapshot(), want)
	}
	now := clk.Now()

	// Items here are all well under 1 KB (a run is ~0.3 KB), so each base
	// write is 1 WCU and each strongly consistent read 1 RCU.
	r := store.Run{FleetRunID: "r1", OwnerID: "alice", HostID: "h1", Status: store.StatusDispatching,
		Agent: "shell", CreatedAt: now, UpdatedAt: now, Deadline: now.Add(30 * time.Second)}
	// A new run enters all four indexes: 1 + 1 + 1 + 1 + 1.
	measure("CreateRun", expect{
		calls: map[string]int{"PutItem": 1},
		wcu:   map[string]float64{"runs": 1, "runs/live": 1, "runs/byOwner": 1, "runs/byHost": 1, "runs/all": 1},
	}, func() error { return s.CreateRun(ctx, r) })
	r.Version = 1

	// The host answered: status and child change, keys do not, nothing
	// projected changes (KEYS_ONLY): the base write only.
	r.Status, r.ChildRunID = store.StatusRunning, "child-1"
	measure("UpdateRun, stays live", expect{
		calls: map[string]int{"UpdateItem": 1},
		wcu:   map[string]float64{"runs": 1},
	}, func() (err error) { r, err = s.UpdateRun(ctx, r); return err })

	// Ended and drained: it leaves the live index, one more write.
	end := clk.Now()
	r.Status, r.EndedAt, r.Drained, r.ExpiresAt = store.StatusSucceeded, &end, true, end.Add(24*time.Hour)
	measure("UpdateRun, leaves live", expect{
		calls: map[string]int{"UpdateItem": 1},
		wcu:   map[string]float64{"runs": 1, "runs/live": 1},
	}, func() (err error) { r, err = s.UpdateRun(ctx, r); return err })

	// A lost race still costs the write (the stored run, < 1 KB).
	stale := r
	stale.Version = 1
	m.Reset()
	if _, err := s.UpdateRun(ctx, stale); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale UpdateRun: %v", err)
	}
	checkUsage(t, "UpdateRun, conflict", m.Snapshot(), expect{
		calls: map[string]int{"UpdateItem": 1}, wcu: map[string]float64{"runs": 1},
	})

	measure("GetRun strong", expect{calls: map[string]int{"GetItem": 1}, rcu: map[string]float64{"runs": 1}},
		func() error { _, err := s.GetRun(ctx, "r1"); return err })
	measure("GetRun eventual", expect{calls: map[string]int{"GetItem": 1}, rcu: map[string]float64{"runs": 0.5}},
		func() error { _, err := s.GetRun(store.EventualRead(ctx), "r1"); return err })

	it := store.Idempotency{Key: "alice#k1", FleetRunID: "r1", RequestHash: strings.Repeat("f", 64), CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour)}
	measure("PutIdempotency, new", expect{calls: map[string]int{"PutItem": 1}, wcu: map[string]float64{"idempotency": 1}},
		func() error { _, err := s.PutIdempotency(ctx, it); return err })
	// Lost: 1 WCU for the failed condition, and the holder comes back on
	// the error (ALL_OLD): no read.
	m.Reset()
	if got, err := s.PutIdempotency(ctx, it); !errors.Is(err, store.ErrExists) || got.FleetRunID != "r1" {
		t.Fatalf("PutIdempotency again: %v %v", got, err)
	}
	checkUsage(t, "PutIdempotency, held", m.Snapshot(), expect{
		calls: map[string]int{"PutItem": 1}, wcu: map[string]float64{"idempotency": 1},
	})
	measure("GetIdempotency eventual", expect{calls: map[string]int{"GetItem": 1}, rcu: map[string]float64{"idempotency": 0.5}},
		func() error { _, err := s.GetIdempotency(store.EventualRead(ctx), "alice#k1"); return err })
	m.Reset()
	if _, err := s.GetIdempotency(ctx, "alice#absent"); !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	checkUsage(t, "GetIdempotency of a missing key costs the minimum", m.Snapshot(), expect{
		calls: map[string]int{"GetItem": 1}, rcu: map[string]float64{"idempotency": 1},
	})

	c := store.Caller{OwnerID: "bob", TokenHash: strings.Repeat("ab", 32), AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{All: true}, CreatedAt: now}
	// Two puts in a transaction: 2 x 1 WCU, doubled.
	measure("CreateCaller", expect{calls: map[string]int{"TransactWriteItems": 1}, wcu: map[string]float64{"callers": 4}},
		func() error { return s.CreateCaller(ctx, c) })
	measure("CallerByTokenHash", expect{calls: map[string]int{"GetItem": 1}, rcu: map[string]float64{"callers": 1}},
		func() error { _, err := s.CallerByTokenHash(ctx, c.TokenHash); return err })
	measure("DeleteCaller", expect{
		calls: map[string]int{"GetItem": 1, "TransactWriteItems": 1},
		rcu:   map[string]float64{"callers": 1}, wcu: map[string]float64{"callers": 4},
	}, func() error { return s.DeleteCaller(ctx, "bob") })

	// Listing an owner's three runs: one index query (three ~0.1 KB keys,
	// eventual: 0.5) and one BatchGetItem (three runs, eventual: 3 x 0.5).
	for i := 2; i <= 3; i++ {
		if err := s.CreateRun(ctx, store.Run{FleetRunID: fmt.Sprintf("r%d", i), OwnerID: "alice", HostID: "h1", Status: "running", CreatedAt: now.Add(time.Duration(i) * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	measure("ListRuns of an owner", expect{
		calls: map[string]int{"Query": 1, "BatchGetItem": 1},
		rcu:   map[string]float64{"runs/byOwner": 0.5, "runs": 1.5},
	}, func() error {
		p, err := s.ListRuns(ctx, store.RunQuery{OwnerID: "alice"})
		if err == nil && len(p.Runs) != 3 {
			err = fmt.Errorf("%d runs", len(p.Runs))
		}
		return err
	})

	// An event of 4500 bytes of data plus ~70 bytes of names and keys:
	// ceil(4.57 KB) = 5 WCU; re-putting it costs 5 again (the existing
	// item's size, condition failed).
	data, _ := json.Marshal(strings.Repeat("x", 4498))
	ev := store.Event{FleetRunID: "r1", Sequence: 1, Type: "output", Data: data, TS: now}
	for _, what := range []string{"PutEvents, new", "PutEvents, stored already"} {
		measure(what, expect{calls: map[string]int{"PutItem": 1}, wcu: map[string]float64{"events": 5}},
			func() error { return s.PutEvents(ctx, []store.Event{ev}) })
	}
	// Reading it back strongly consistent: 4.57 KB -> 8 KB -> 2 RCU.
	measure("ListEvents", expect{calls: map[string]int{"Query": 1}, rcu: map[string]float64{"events": 2}},
		func() error { _, err := s.ListEvents(ctx, "r1", 0, 10); return err })

	// A run holding a sealed GitHub token (KMS ciphertext of a 40-byte
	// token: ~200 bytes) stays under 1 KB: CreateRun costs what it did.
	gh := store.Run{FleetRunID: "r-gh", OwnerID: "alice", HostID: "h1", Status: store.StatusDispatching,
		Agent: "shell", Repository: "acme/app", CreatedAt: now, UpdatedAt: now, Deadline: now.Add(30 * time.Second),
		Brokered: []store.BrokeredKey{{ProjectID: "acme", Key: "GITHUB_TOKEN", Kind: "githubApp",
			ExpiresAt: now.Add(time.Hour), Sealed: []byte(strings.Repeat("k", 200))}}}
	measure("CreateRun with a sealed GitHub token", expect{
		calls: map[string]int{"PutItem": 1},
		wcu:   map[string]float64{"runs": 1, "runs/live": 1, "runs/byOwner": 1, "runs/byHost": 1, "runs/all": 1},
	}, func() error { return s.CreateRun(ctx, gh) })

	// A broker state with KMS-sealed tokens (~0.5 KB together): each
	// lease or commit write 1 WCU, a read 1 RCU (strong).
	var st store.BrokerState
	measure("AcquireBrokerLease, new", expect{calls: map[string]int{"UpdateItem": 1}, wcu: map[string]float64{"idempotency": 1}},
		func() (err error) {
			st, err = s.AcquireBrokerLease(ctx, "acme/GOOGLE", "a", now.Add(time.Minute))
			return err
		})
	m.Reset()
	if _, err := s.AcquireBrokerLease(ctx, "acme/GOOGLE", "b", now.Add(time.Minute)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("AcquireBrokerLease while held: %v", err)
	}
	checkUsage(t, "AcquireBrokerLease, held (the holder comes back: no read)", m.Snapshot(), expect{
		calls: map[string]int{"UpdateItem": 1}, wcu: map[string]float64{"idempotency": 1},
	})
	st.SealedRefreshToken, st.SealedAccessToken = []byte(strings.Repeat("r", 250)), []byte(strings.Repeat("a", 250))
	st.AccessExpiresAt, st.Seed = now.Add(time.Hour), strings.Repeat("s", 43)
	measure("CommitBrokerState by the holder", expect{calls: map[string]int{"UpdateItem": 1}, wcu: map[string]float64{"idempotency": 1}},
		func() (err error) { st, err = s.CommitBrokerState(ctx, st); return err })
	measure("GetBrokerState", expect{calls: map[string]int{"GetItem": 1}, rcu: map[string]float64{"idempotency": 1}},
		func() error { _, err := s.GetBrokerState(ctx, "acme/GOOGLE"); return err })
	if _, err := s.AcquireBrokerLease(ctx, "acme/GOOGLE", "b", now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	// A committer whose lease another took: the write naming it fails,
	// the second commits.
	st.LeaseHolder = "a"
	measure("CommitBrokerState by a former holder", expect{calls: map[string]int{"UpdateItem": 2}, wcu: map[string]float64{"idempotency": 2}},
		func() (err error) { st, err = s.CommitBrokerState(ctx, st); return err })
	measure("ReleaseBrokerLease", expect{calls: map[string]int{"UpdateItem": 1}, wcu: map[string]float64{"idempotency": 1}},
		func() error { return s.ReleaseBrokerLease(ctx, "acme/GOOGLE", "b") })
}

// TestMeteredQueueCosts: what waiting adds to a run's writes, by the
// documented rules (issue 34's budget: at most 3 WCU more than a run that
// never waited, and no read): a run that waits is created queued (its
// queue entry, but no byHost or live one yet), offered (it enters byHost
// and the live index; its queue entry unchanged, so no queue write) and
// started (it leaves the queue); one that never waited is created
// dispatching (live at once) and answered.
// Both items stay under 1 KB with a typical request held while queued,
// and with a GitHub key Fleet minted (a KMS-sealed token, ~200 bytes: at
// the offer for the run that waits, at the dispatch for the other).
func TestMeteredQueueCosts(t *testing.T) {
	for _, brokered := range []bool{false, true} {
		t.Run(fmt.Sprintf("brokered=%v", brokered), func(t *testing.T) { meterQueueLifecycles(t, brokered) })
	}
}

func meterQueueLifecycles(t *testing.T, brokered bool) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.Start)
	m := &dynamostore.Meter{}
	names := dynamostore.Prefixed(motoserver.Unique("qcost") + "-")
	s, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: names, Clock: clk, Meter: m})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTables(ctx); err != nil {
		t.Fatal(err)
	}
	now := clk.Now()
	var keys []store.BrokeredKey
	if brokered {
		keys = []store.BrokeredKey{{ProjectID: "acme", Key: "GITHUB_TOKEN", Kind: "githubApp",
			ExpiresAt: now.Add(time.Hour), Sealed: []byte(strings.Repeat("k", 200))}}
	}
	itemSize := func(what, id string) {
		t.Helper()
		size := dynamostore.ItemSize(rawItem(t, names.Runs, map[string]types.AttributeValue{"fleetRunId": &types.AttributeValueMemberS{Value: id}}))
		t.Logf("%s: %d bytes", what, size)
		if size > 1024 {
			t.Errorf("%s of %d bytes: over 1 KB, each of its writes costs 2 WCU", what, size)
		}
	}
	lifecycle := func(what string, steps ...func() error) dynamostore.Usage {
		t.Helper()
		m.Reset()
		for i, step := range steps {
			if err := step(); err != nil {
				t.Fatalf("%s, step %d: %v", what, i, err)
			}
		}
		u := m.Snapshot()
		t.Logf("%s: %s", what, u)
		return u
	}
	const id = "fr-0123456789abcdef0123456789abcdef"

	direct := store.Run{FleetRunID: id + "d", OwnerID: "alice", HostID: "h-0123456789", Status: store.StatusDispatching,
		Agent: "claude", Repository: "https://github.com/acme/app", IdempotencyKey: "ci-1234",
		CreatedAt: now, UpdatedAt: now, Deadline: now.Add(30 * time.Second), Brokered: keys}
	never := lifecycle("a run that never waits",
		func() error { return s.CreateRun(ctx, direct) },
		func() error {
			r := direct
			r.Version, r.Status, r.ChildRunID, r.Attempt = 1, store.StatusRunning, "run-0123456789", 1
			_, err := s.UpdateRun(ctx, r)
			return err
		})

	waiting := store.Run{FleetRunID: id + "q", OwnerID: "alice", Status: store.StatusQueued,
		Agent: "claude", Repository: "https://github.com/acme/app", IdempotencyKey: "ci-1235",
		CreatedAt: now, UpdatedAt: now,
		Queue: &store.QueueInfo{Class: "claude?pool=build", Since: now, Timeout: 30 * time.Minute, Until: now.Add(30 * time.Minute),
			Request: storetest.QueueRequest}}
	var r store.Run
	waited := lifecycle("a run that waits",
		func() error { return s.CreateRun(ctx, waiting) },
		func() (err error) {
			itemSize("the queued run", waiting.FleetRunID)
			o := waiting
			o.Version, o.Status, o.HostID, o.Deadline, o.Brokered = 1, store.StatusDispatching, "h-0123456789", now.Add(30*time.Second), keys
			o.UpdatedAt = now.Add(time.Second)
			r, err = s.UpdateRun(ctx, o)
			itemSize("the offered run", waiting.FleetRunID)
			return err
		},
		func() (err error) {
			at := now.Add(time.Second)
			q := *r.Queue
			q.StartedAt, q.StartedOn, q.Request = &at, r.HostID, nil
			r.Queue, r.Status, r.ChildRunID, r.Attempt = &q, store.StatusRunning, "run-0123456789", 1
			r, err = s.UpdateRun(ctx, r)
			return err
		})

	extraWCU := waited.TotalWCU() - never.TotalWCU()
	t.Logf("waiting adds %g WCU (%g against %g) and %g RCU", extraWCU, waited.TotalWCU(), never.TotalWCU(), waited.TotalRCU()-never.TotalRCU())
	if extraWCU > 3 {
		t.Errorf("a run that waits costs %g WCU more than one that does not, over the budget of 3", extraWCU)
	}
	if waited.TotalRCU() != 0 || never.TotalRCU() != 0 {
		t.Errorf("the lifecycles read: %g and %g RCU, want none", waited.TotalRCU(), never.TotalRCU())
	}
	checkUsage(t, "a run that waits", waited, expect{
		calls: map[string]int{"PutItem": 1, "UpdateItem": 2},
		wcu:   map[string]float64{"runs": 3, "runs/live": 1, "runs/byOwner": 1, "runs/byHost": 1, "runs/all": 1, "runs/queue": 2},
	})
	checkUsage(t, "a run that never waits", never, expect{
		calls: map[string]int{"PutItem": 1, "UpdateItem": 1},
		wcu:   map[string]float64{"runs": 2, "runs/live": 1, "runs/byOwner": 1, "runs/byHost": 1, "runs/all": 1},
	})
}

// TestMeteredQueueReads: the queue index's reads, eventually consistent
// over ~100-byte KEYS_ONLY entries: a position, a class's stats or a page
// of its queue is one Query (0.5 RCU up to ~35 entries), the classes one
// per class and one to find no more.
func TestMeteredQueueReads(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.Start)
	m := &dynamostore.Meter{}
	s := newStore(t, clk, m)
	now := clk.Now()
	var last store.Run
	for i, class := range []string{"claude", "claude", "claude", "shell?pool=build"} {
		last = store.Run{FleetRunID: fmt.Sprintf("fr-%032d", i), OwnerID: "alice", Status: store.StatusQueued, CreatedAt: now,
			Queue: &store.QueueInfo{Class: class, Since: now.Add(time.Duration(i) * time.Second), Timeout: time.Hour, Until: now.Add(time.Hour)}}
		if i == 2 {
			last.Queue.Priority = -1
		}
		if err := s.CreateRun(ctx, last); err != nil {
			t.Fatal(err)
		}
	}
	measure := func(what string, want expect, op func() error) {
		t.Helper()
		m.Reset()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		checkUsage(t, what, m.Snapshot(), want)
	}
	one := expect{calls: map[string]int{"Query": 1}, rcu: map[string]float64{"runs/queue": 0.5}}
	measure("QueueAhead", one, func() error {
		n, err := s.QueueAhead(ctx, "claude", store.QueueOrder(store.QueueInfo{Priority: -1, Since: now}, "x"))
		if err == nil && n != 2 {
			err = fmt.Errorf("%d ahead, want 2", n)
		}
		return err
	})
	measure("QueueStats", one, func() error { _, err := s.QueueStats(ctx, "claude"); return err })
	measure("ListQueue", one, func() error { _, err := s.ListQueue(ctx, "claude", "", 10); return err })
	measure("QueueClasses of 2", expect{calls: map[string]int{"Query": 3}, rcu: map[string]float64{"runs/queue": 1.5}}, func() error {
		c, err := s.QueueClasses(ctx)
		if err == nil && len(c) != 2 {
			err = fmt.Errorf("classes %v", c)
		}
		return err
	})
}
