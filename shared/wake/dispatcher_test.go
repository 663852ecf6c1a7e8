package wake

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// scriptedFiller stands in for Fleet where a test needs FillHosts to fail
// or panic for chosen hosts (the tests in tests/ run the real one): it
// records each call and starts one run per slot.
type scriptedFiller struct {
	mu    sync.Mutex
	calls [][]fleet.Wake
	fail  map[string]error // host -> FillHosts' error
	panic map[string]bool  // host -> FillHosts panics
}

func (f *scriptedFiller) FillHosts(_ context.Context, wakes []fleet.Wake) (fleet.FillReport, error) {
	f.mu.Lock()
	f.calls = append(f.calls, wakes)
	f.mu.Unlock()
	var rep fleet.FillReport
	for _, w := range wakes {
		if f.panic[w.HostID] {
			panic("scripted panic on " + w.HostID)
		}
		if err := f.fail[w.HostID]; err != nil {
			return rep, err
		}
		for range w.Slots {
			rep.Started = append(rep.Started, "run-on-"+w.HostID)
			rep.Offered++
		}
	}
	return rep, nil
}

// sqsEvent is a batch as the mapping delivers it: message i has id "m<i>".
func sqsEvent(bodies ...string) events.SQSEvent {
	var ev events.SQSEvent
	for i, b := range bodies {
		ev.Records = append(ev.Records, events.SQSMessage{MessageId: "m" + string(rune('0'+i)), Body: b, EventSource: "aws:sqs",
			Attributes: map[string]string{"ApproximateReceiveCount": "1"}})
	}
	return ev
}

func body(t *testing.T, host string, slots int, reason string) string {
	t.Helper()
	b, err := encode(fleet.Wake{HostID: host, Slots: slots, Reason: reason})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func failedIDs(resp events.SQSEventResponse) []string {
	ids := []string{}
	for _, f := range resp.BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	sort.Strings(ids)
	return ids
}

// TestDispatcherFailsOnlyTheMessagesOfAFailedHost: a batch's messages are
// grouped by host (one FillHosts each, slots added); a host whose fill
// errs or panics fails exactly its messages, a message that is not a wake
// fails alone, and the other hosts are filled and acknowledged.
func TestDispatcherFailsOnlyTheMessagesOfAFailedHost(t *testing.T) {
	filler := &scriptedFiller{fail: map[string]error{"sick": errors.New("store unavailable")}, panic: map[string]bool{"buggy": true}}
	var logs syncbuf.Buffer
	d, err := NewDispatcher(DispatcherConfig{Fleet: filler, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := d.Handle(context.Background(), sqsEvent(
		body(t, "edge-1", 1, fleet.WakeRunEnded), // m0
		body(t, "sick", 1, fleet.WakeRunEnded),   // m1
		`{"not":"a wake","token":"s3cr3t"}`,      // m2
		body(t, "edge-1", 2, fleet.WakeProbe),    // m3
		body(t, "buggy", 1, fleet.WakeProbe),     // m4
		body(t, "sick", 1, fleet.WakeProbe),      // m5
		body(t, "edge-2", 1, fleet.WakeResumed),  // m6
	))
	if err != nil {
		t.Fatalf("Handle returned %v: the whole batch would come again", err)
	}
	if got, want := failedIDs(resp), []string{"m1", "m2", "m4", "m5"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("failed %v, want %v (the sick and buggy hosts' messages, and the one that is no wake)", got, want)
	}
	calls := map[string]fleet.Wake{}
	for _, c := range filler.calls {
		if len(c) != 1 {
			t.Fatalf("FillHosts called with %+v: want one host a call", c)
		}
		if _, dup := calls[c[0].HostID]; dup {
			t.Fatalf("%s filled twice in one batch", c[0].HostID)
		}
		calls[c[0].HostID] = c[0]
	}
	if w := calls["edge-1"]; w.Slots != 3 || w.Reason != fleet.WakeRunEnded || len(calls) != 4 {
		t.Fatalf("FillHosts calls %+v: want edge-1 once with 3 slots, and sick, buggy, edge-2", calls)
	}
	out := logs.String()
	if strings.Contains(out, "s3cr3t") {
		t.Fatalf("a message's body reached the log:\n%s", out)
	}
	for _, want := range []string{`"msg":"dispatcher: filling a host panicked","hostId":"buggy"`, `"msg":"dispatcher: a message that is not a wake","messageId":"m2"`,
		`"hostId":"sick","messages":2,"err":"store unavailable"`, `"msg":"dispatcher","messages":7,"hosts":4,"started":4,"offered":4,"resumed":0,"failed":4`} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %s:\n%s", want, out)
		}
	}
}

// TestDispatcherAnswerIsTheMappingsFormat: the answer is what a mapping
// with ReportBatchItemFailures reads: an empty list when all went well
// (never null), itemIdentifier per failed message.
func TestDispatcherAnswerIsTheMappingsFormat(t *testing.T) {
	d, err := NewDispatcher(DispatcherConfig{Fleet: &scriptedFiller{fail: map[string]error{"sick": errors.New("x")}},
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ev   events.SQSEvent
		want string
	}{
		{sqsEvent(body(t, "edge-1", 1, fleet.WakeProbe)), `{"batchItemFailures":[]}`},
		{events.SQSEvent{}, `{"batchItemFailures":[]}`},
		{sqsEvent(body(t, "edge-1", 1, fleet.WakeProbe), body(t, "sick", 1, fleet.WakeProbe)), `{"batchItemFailures":[{"itemIdentifier":"m1"}]}`},
	} {
		resp, err := d.Handle(context.Background(), tc.ev)
		b, _ := json.Marshal(resp)
		if err != nil || string(b) != tc.want {
			t.Errorf("answer %s, %v; want %s", b, err, tc.want)
		}
	}
	if _, err := NewDispatcher(DispatcherConfig{}); err == nil || !strings.Contains(err.Error(), "Fleet") || !strings.Contains(err.Error(), "Logger") {
		t.Fatalf("NewDispatcher without its fields: %v", err)
	}
}
