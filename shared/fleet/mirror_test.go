package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/storetest"
)

func TestFitEventKeepsEventDataWithinTheLimit(t *testing.T) {
	text := func(s string) json.RawMessage { return jsonString(s) }
	for _, c := range []struct {
		name string
		data json.RawMessage
		// head is what the fitted text must start with ("" for an object).
		head string
	}{
		{"ascii", text(strings.Repeat("a", 100<<10)), "aaaa"},
		{"two-byte runes", text(strings.Repeat("é", 50<<10)), "éé"},
		{"four-byte runes", text(strings.Repeat("😀", 20<<10)), "😀😀"},
		{"control characters", text(strings.Repeat("\x01", 100<<10)), "\x01\x01"},
		{"html", text(strings.Repeat("<&>", 30<<10)), "<&>"},
		{"an object", json.RawMessage(`{"status":"running","detail":"` + strings.Repeat("d", 40<<10) + `"}`), ""},
	} {
		e, cut := fitEvent(hostproto.Event{Sequence: 7, Type: hostproto.EventOutput, Data: c.data})
		var got string
		if err := json.Unmarshal(e.Data, &got); err != nil {
			t.Fatalf("%s: the fitted data is not a JSON string: %v", c.name, err)
		}
		if len(e.Data) > hostproto.MaxEventData || cut <= 0 || !utf8.ValidString(got) || e.Sequence != 7 {
			t.Errorf("%s: %d bytes, cut %d, valid UTF-8 %v", c.name, len(e.Data), cut, utf8.ValidString(got))
		}
		if c.head != "" && (!strings.HasPrefix(got, c.head) || !strings.HasSuffix(got, fmt.Sprintf(truncatedMark, cut))) {
			t.Errorf("%s: fitted text %.40q...%q", c.name, got, got[max(0, len(got)-90):])
		}
		if c.head != "" && len(e.Data) < hostproto.MaxEventData-4<<10 {
			t.Errorf("%s: kept only %d bytes of %d", c.name, len(e.Data), hostproto.MaxEventData)
		}
		if c.head == "" && !strings.Contains(got, "was dropped") {
			t.Errorf("%s: %q", c.name, got)
		}
	}
	small := hostproto.Event{Sequence: 1, Data: text(strings.Repeat("a", hostproto.MaxEventData-2))}
	if e, cut := fitEvent(small); cut != 0 || string(e.Data) != string(small.Data) {
		t.Errorf("data at the limit was changed (cut %d)", cut)
	}
}

// TestAnOversizedEventOrPageDoesNotWedgeTheRun: a host sending an event
// over 32 KiB has it mirrored truncated; a page over the bound is asked
// again for fewer events; an event alone over it is mirrored as a marker;
// the run goes on to its end and drains.
func TestAnOversizedEventOrPageDoesNotWedgeTheRun(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	f, err := New(Config{Store: e.st, Credentials: e.f.cfg.Credentials, Logger: e.f.log, Clock: e.clk, MaxEventPageBytes: 100 << 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	run := dispatched(t, e, "alice")
	host.AppendOutput(run.ChildRunID, strings.Repeat("x", 80<<10)) // 2: over 32 KiB
	for i := 0; i < 10; i++ {
		host.AppendOutput(run.ChildRunID, fmt.Sprintf("%02d %s", i, strings.Repeat("y", 20<<10))) // 3-12: 200 KiB in all
	}
	host.AppendOutput(run.ChildRunID, strings.Repeat("z", 150<<10)) // 13: alone over the page bound
	host.AppendOutput(run.ChildRunID, "last line\n")                // 14
	zero := 0
	host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &zero, "") // 15

	rep, err := f.Sweep(ctx, SweepOptions{})
	if err != nil || rep.Drained != 1 || rep.Events != 15 {
		t.Fatalf("sweep = %+v, %v", rep, err)
	}
	got, onHost := mirrored(t, e.st, run.FleetRunID), host.Events(run.ChildRunID)
	if len(got) != 15 {
		t.Fatalf("mirrored %d events, want 15", len(got))
	}
	for i, ev := range got {
		var text string
		json.Unmarshal(ev.Data, &text)
		switch seq := ev.Sequence; {
		case seq != int64(i+1) || len(ev.Data) > hostproto.MaxEventData:
			t.Fatalf("event %d: sequence %d, %d bytes", i, seq, len(ev.Data))
		case seq == 2:
			if !strings.HasPrefix(text, "xxxx") || !strings.Contains(text, "bytes of this event were cut") {
				t.Errorf("the oversized event: %.40q...", text)
			}
		case seq == 13:
			if !strings.Contains(text, "event 13 could not be mirrored") {
				t.Errorf("the event over the page bound: %q", text)
			}
		default:
			if string(ev.Data) != string(onHost[i].Data) || ev.Type != onHost[i].Type {
				t.Errorf("event %d differs from the host's", seq)
			}
		}
	}
	if r, _ := e.st.GetRun(ctx, run.FleetRunID); !r.Drained || r.Status != hostproto.StatusSucceeded || r.EventCursor != 15 {
		t.Fatalf("run after the sweep: %+v", r)
	}
}

// TestMirroredEventsKeepTheHostsShape pins the bytes of a mirrored event
// as the events answer and the stream send it: the host's event as it came
// (DESIGN.md), whatever the record the store keeps it in.
func TestMirroredEventsKeepTheHostsShape(t *testing.T) {
	e := newTestEnv(t, time.Second)
	ev := storetest.StoredFormEvent()
	if err := e.st.PutEvents(context.Background(), []store.Event{ev}); err != nil {
		t.Fatal(err)
	}
	page, err := e.f.MirroredEvents(context.Background(), store.Run{FleetRunID: ev.FleetRunID, EventCursor: ev.Sequence}, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(page.Events)
	if err != nil {
		t.Fatal(err)
	}
	const want = `[{"sequence":7,"type":"output","data":"hello","ts":"2026-05-04T03:02:01.123456789Z"}]`
	if string(got) != want {
		t.Errorf("mirrored events:\n got  %s\n want %s", got, want)
	}
}

func TestDispatchWaitLeavesARunOnlyForItsReasons(t *testing.T) {
	run := store.Run{Status: store.StatusDispatching, Deadline: t0}
	for _, c := range []struct {
		name            string
		now             time.Time
		hostDown, spent bool
		want            syncOutcome
		wait            bool
	}{
		{"before its deadline, whatever else", t0.Add(-time.Nanosecond), true, true, syncInFlight, true},
		{"its host down in this pass", t0, true, true, syncUnreachable, true},
		{"the budget spent", t0, false, true, syncPartial, true},
		{"at its deadline: recover it", t0, false, false, syncCurrent, false},
	} {
		if got, wait := dispatchWait(run, c.now, c.hostDown, c.spent); got != c.want || wait != c.wait {
			t.Errorf("%s: %v, wait %v; want %v, %v", c.name, got, wait, c.want, c.wait)
		}
	}
}

func TestShrinkPageAsksForATenthDownToOneThenAMarker(t *testing.T) {
	for _, c := range []struct {
		limit, next int
		marker      bool
	}{{1000, 100, false}, {100, 10, false}, {10, 1, false}, {5, 1, false}, {1, 1, true}} {
		if next, marker := shrinkPage(c.limit); next != c.next || marker != c.marker {
			t.Errorf("shrinkPage(%d) = %d, %v; want %d, %v", c.limit, next, marker, c.next, c.marker)
		}
	}
}
