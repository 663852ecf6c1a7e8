package wake

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// delivery is one call of the handler, held until the test answers it.
type delivery struct {
	ctx    context.Context
	ev     events.SQSEvent
	answer chan func() (events.SQSEventResponse, error)
}

// localQueue runs a Local on a fake clock whose handler hands each
// delivery to the test.
type localQueue struct {
	*Local
	clk        *clock.Fake
	deliveries chan delivery
	logs       *syncbuf.Buffer
}

func newLocalQueue(t *testing.T) *localQueue {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	logs := &syncbuf.Buffer{}
	l, err := NewLocal(LocalConfig{Logger: slog.New(slog.NewJSONHandler(logs, nil)), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	q := &localQueue{Local: l, clk: clk, deliveries: make(chan delivery), logs: logs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx, func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
			d := delivery{ctx: ctx, ev: ev, answer: make(chan func() (events.SQSEventResponse, error))}
			select {
			case q.deliveries <- d:
			case <-ctx.Done():
				return events.SQSEventResponse{}, ctx.Err()
			}
			select {
			case answer := <-d.answer:
				return answer()
			case <-ctx.Done():
				return events.SQSEventResponse{}, ctx.Err()
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		await.Recv(t, "the local queue's Run to return", done)
	})
	return q
}

// next is the next delivery; the test answers it.
func (q *localQueue) next(t *testing.T) delivery {
	t.Helper()
	return await.Recv(t, "a delivery", q.deliveries)
}

// hidden waits until Run, the delivery done, waits for a message hidden
// until at to show again: its one timer.
func (q *localQueue) hidden(t *testing.T, at time.Time) {
	t.Helper()
	await.Cond(t, await.Limit, "the queue to wait for a hidden message", func() bool {
		next, ok := q.clk.Next()
		return ok && next.Equal(at) && q.clk.Timers() == 1
	})
}

func ok(ids ...string) func() (events.SQSEventResponse, error) {
	return func() (events.SQSEventResponse, error) {
		resp := events.SQSEventResponse{BatchItemFailures: []events.SQSBatchItemFailure{}}
		for _, id := range ids {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: id})
		}
		return resp, nil
	}
}

func hostsOf(t *testing.T, ev events.SQSEvent) []string {
	t.Helper()
	var hosts []string
	for _, r := range ev.Records {
		w, err := decode(r.Body)
		if err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, w.HostID)
	}
	return hosts
}

// TestLocalRedeliversAFailedDeliveryAfterTheVisibilityTimeout: a delivery
// whose handler errs, panics or outlives its deadline comes again, whole,
// once the visibility timeout has passed on the clock and not before,
// with its receive count; an acknowledged one never does.
func TestLocalRedeliversAFailedDeliveryAfterTheVisibilityTimeout(t *testing.T) {
	q := newLocalQueue(t)
	ctx := context.Background()
	if err := q.Wake(ctx, []fleet.Wake{{HostID: "edge-1", Slots: 1, Reason: fleet.WakeRunEnded}}); err != nil {
		t.Fatal(err)
	}
	d, at := q.next(t), q.clk.Now()
	rec := d.ev.Records[0]
	if rec.EventSource != "aws:sqs" || rec.Attributes["ApproximateReceiveCount"] != "1" || rec.MessageId == "" || rec.Md5OfBody == "" {
		t.Fatalf("the record is not as the mapping delivers it: %+v", rec)
	}
	for i, fail := range []func() (events.SQSEventResponse, error){
		func() (events.SQSEventResponse, error) {
			return events.SQSEventResponse{}, errors.New("store unavailable")
		},
		func() (events.SQSEventResponse, error) { panic("dispatcher bug") },
	} {
		d.answer <- fail
		q.hidden(t, at.Add(VisibilityTimeout))
		q.clk.Advance(VisibilityTimeout - time.Second)
		select {
		case d := <-q.deliveries:
			t.Fatalf("delivered again before the visibility timeout: %+v", d.ev)
		default:
		}
		q.clk.Advance(time.Second)
		d, at = q.next(t), q.clk.Now()
		if got := d.ev.Records[0]; got.MessageId != rec.MessageId || got.Body != rec.Body || got.Attributes["ApproximateReceiveCount"] != string(rune('2'+i)) {
			t.Fatalf("redelivery %d: %+v, want the same message, receive %d", i+1, got, i+2)
		}
	}
	// A delivery outliving its deadline (the function's timeout, on the
	// clock) fails as a Lambda timeout does: the handler above returns
	// its context's end.
	q.clk.Advance(DispatcherTimeout - time.Second)
	if d.ctx.Err() != nil {
		t.Fatal("the delivery's context ended before the function's timeout")
	}
	q.clk.Advance(time.Second)
	await.Recv(t, "the delivery's deadline", d.ctx.Done())
	q.hidden(t, at.Add(VisibilityTimeout))
	q.clk.Set(at.Add(VisibilityTimeout))
	d = q.next(t)
	d.answer <- ok()
	await.Cond(t, await.Limit, "the acknowledged message to be deleted", func() bool { return q.Pending() == 0 })
	logs := q.logs.String()
	if !strings.Contains(logs, "store unavailable") || !strings.Contains(logs, "the handler panicked: dispatcher bug") {
		t.Fatalf("the failed deliveries are not logged:\n%s", logs)
	}
}

// TestLocalRedeliversOnlyTheMessagesReportedFailed: batchItemFailures
// keeps exactly those; a failure naming a message not in the batch fails
// it whole, as Lambda reads it.
func TestLocalRedeliversOnlyTheMessagesReportedFailed(t *testing.T) {
	q := newLocalQueue(t)
	if err := q.Wake(context.Background(), []fleet.Wake{{HostID: "a", Slots: 1}, {HostID: "b", Slots: 1}, {HostID: "c", Slots: 1}}); err != nil {
		t.Fatal(err)
	}
	d, at := q.next(t), q.clk.Now()
	if got := strings.Join(hostsOf(t, d.ev), " "); got != "a b c" {
		t.Fatalf("one batch of %s, want a b c", got)
	}
	d.answer <- ok(d.ev.Records[1].MessageId)
	q.hidden(t, at.Add(VisibilityTimeout))
	if q.Pending() != 1 {
		t.Fatalf("%d messages pending, want b's alone", q.Pending())
	}
	q.clk.Advance(VisibilityTimeout)
	d, at = q.next(t), q.clk.Now()
	if got := strings.Join(hostsOf(t, d.ev), " "); got != "b" {
		t.Fatalf("redelivered %s, want b alone", got)
	}
	d.answer <- ok("not-in-the-batch")
	q.hidden(t, at.Add(VisibilityTimeout))
	q.clk.Advance(VisibilityTimeout)
	d = q.next(t)
	if got := strings.Join(hostsOf(t, d.ev), " "); got != "b" || d.ev.Records[0].Attributes["ApproximateReceiveCount"] != "3" {
		t.Fatalf("after a failure naming another message: %s %v, want b, third receive", got, d.ev.Records[0].Attributes)
	}
	d.answer <- ok()
	await.Cond(t, await.Limit, "the queue to empty", func() bool { return q.Pending() == 0 })
}

// TestLocalDeadLettersAfterMaxReceiveCount: a message that fails every
// delivery is dropped once it has had MaxReceiveCount, with an ERROR line
// naming its host; the others go on.
func TestLocalDeadLettersAfterMaxReceiveCount(t *testing.T) {
	q := newLocalQueue(t)
	if err := q.Wake(context.Background(), []fleet.Wake{{HostID: "doomed", Slots: 1}}); err != nil {
		t.Fatal(err)
	}
	for i := range MaxReceiveCount {
		d, at := q.next(t), q.clk.Now()
		if n := d.ev.Records[0].Attributes["ApproximateReceiveCount"]; n != string(rune('1'+i)) {
			t.Fatalf("delivery %d has receive count %s", i+1, n)
		}
		d.answer <- ok(d.ev.Records[0].MessageId)
		q.hidden(t, at.Add(VisibilityTimeout))
		q.clk.Advance(VisibilityTimeout)
	}
	await.Cond(t, await.Limit, "the dead letter to be dropped", func() bool { return q.Pending() == 0 })
	if logs := q.logs.String(); !strings.Contains(logs, `"level":"ERROR"`) || !strings.Contains(logs, `"hostId":"doomed"`) {
		t.Fatalf("the dead letter is not logged at ERROR with its host:\n%s", logs)
	}
	if err := q.Wake(context.Background(), []fleet.Wake{{HostID: "next", Slots: 1}}); err != nil {
		t.Fatal(err)
	}
	if d := q.next(t); hostsOf(t, d.ev)[0] != "next" {
		t.Fatalf("after the dead letter: %+v", d.ev)
	} else {
		d.answer <- ok()
	}
}
