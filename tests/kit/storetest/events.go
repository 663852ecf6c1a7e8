package storetest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// eventsContract is store.Events' contract.
var eventsContract = []contractCase{
	roleCase("Events/PutList", testEventsPutList),
	roleCase("Events/Idempotent", testEventsIdempotent),
	roleCase("Events/Expiry", testEventsExpiry),
	roleCase("Events/LargeData", testEventsLargeData),
	roleCase("Events/ExtendExpiry", testEventsExtendExpiry),
}

func event(runID string, seq int64, at time.Time, data string) store.Event {
	raw, _ := json.Marshal(data)
	return store.Event{FleetRunID: runID, Sequence: seq, Type: hostproto.EventOutput, Data: raw, TS: at}
}

func seqs(events []store.Event) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.Sequence
	}
	return out
}

func testEventsPutList(t *testing.T, s store.Events, clk *clock.Fake) {
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

func testEventsIdempotent(t *testing.T, s store.Events, clk *clock.Fake) {
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

func testEventsExpiry(t *testing.T, s store.Events, clk *clock.Fake) {
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
func testEventsExtendExpiry(t *testing.T, s store.Events, clk *clock.Fake) {
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

func testEventsLargeData(t *testing.T, s store.Events, clk *clock.Fake) {
	// The largest event a host sends: 32 KiB of output, JSON-encoded.
	text := strings.Repeat("é", hostproto.MaxEventData/2)
	e := event("r1", 1, clk.Now(), text)
	noErr(t, "PutEvents", s.PutEvents(bg, []store.Event{e}))
	p, err := s.ListEvents(bg, "r1", 0, 1)
	noErr(t, "ListEvents", err)
	sameJSON(t, "large event", p.Events, []store.Event{e})
}
