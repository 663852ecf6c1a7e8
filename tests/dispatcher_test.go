package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/shared/wake"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/lambdatest"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// wakeMapping does with a wake queue on moto what SQS's event source
// mapping does with DispatchWakes in AWS, one poll at a time: receive a
// batch (hidden for the queue's visibility timeout), invoke the
// dispatcher with it as an SQS event, delete the messages the answer does
// not report failed. A message the dispatcher never answered for (it
// died) stays hidden until its visibility timeout passes, which a test
// makes happen at once with ChangeMessageVisibility 0 instead of waiting.
type wakeMapping struct {
	client   *sqs.Client
	url, arn string
}

// newWakeQueue creates a queue of the test's own on moto, and the mapping
// that polls it.
func newWakeQueue(t *testing.T) *wakeMapping {
	t.Helper()
	ctx := context.Background()
	q, err := sqs.NewFromConfig(moto.AWSConfig()).CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(motoserver.Unique("wakes")),
		Attributes: map[string]string{"VisibilityTimeout": strconv.Itoa(int(wake.VisibilityTimeout.Seconds()))}})
	must(t, err)
	return mappingOf(t, aws.ToString(q.QueueUrl))
}

// mappingOf is the mapping of the existing queue url (on moto).
func mappingOf(t *testing.T, url string) *wakeMapping {
	t.Helper()
	client := sqs.NewFromConfig(moto.AWSConfig())
	attrs, err := client.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	must(t, err)
	return &wakeMapping{client: client, url: url, arn: attrs.Attributes["QueueArn"]}
}

// receive polls once, as the mapping does: at most a batch, each message
// hidden for the visibility timeout, as the SQS event's records.
func (m *wakeMapping) receive(t *testing.T) []events.SQSMessage {
	t.Helper()
	out, err := m.client.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(m.url),
		MaxNumberOfMessages: wake.BatchSize, VisibilityTimeout: int32(wake.VisibilityTimeout.Seconds()),
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
	must(t, err)
	var recs []events.SQSMessage
	for _, msg := range out.Messages {
		recs = append(recs, events.SQSMessage{MessageId: aws.ToString(msg.MessageId), ReceiptHandle: aws.ToString(msg.ReceiptHandle),
			Body: aws.ToString(msg.Body), Md5OfBody: aws.ToString(msg.MD5OfBody), Attributes: msg.Attributes,
			EventSource: "aws:sqs", EventSourceARN: m.arn, AWSRegion: testRegion})
	}
	return recs
}

// wakes decodes messages' bodies, as a reader checks what was sent.
func wakesOf(t *testing.T, recs []events.SQSMessage) []fleet.Wake {
	t.Helper()
	var out []fleet.Wake
	for _, r := range recs {
		var w fleet.Wake
		must(t, json.Unmarshal([]byte(r.Body), &w))
		out = append(out, w)
	}
	return out
}

// acknowledge deletes the messages of recs the answer does not report
// failed, as the mapping does with ReportBatchItemFailures.
func (m *wakeMapping) acknowledge(t *testing.T, recs []events.SQSMessage, resp events.SQSEventResponse) {
	t.Helper()
	for _, r := range recs {
		if slices.ContainsFunc(resp.BatchItemFailures, func(f events.SQSBatchItemFailure) bool { return f.ItemIdentifier == r.MessageId }) {
			continue
		}
		_, err := m.client.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(m.url), ReceiptHandle: aws.String(r.ReceiptHandle)})
		must(t, err)
	}
}

// deliver invokes fn with recs and acknowledges what it answered.
func (m *wakeMapping) deliver(t *testing.T, fn *lambdatest.Function, recs []events.SQSMessage) events.SQSEventResponse {
	t.Helper()
	raw := fn.Invoke(t, events.SQSEvent{Records: recs})
	var resp events.SQSEventResponse
	if err := json.Unmarshal(raw, &resp); err != nil || resp.BatchItemFailures == nil {
		t.Fatalf("the dispatcher answered %s (%v): want {\"batchItemFailures\": [...]}", raw, err)
	}
	m.acknowledge(t, recs, resp)
	return resp
}

// expire makes hidden messages visible again: their visibility timeout
// passing, without the wait.
func (m *wakeMapping) expire(t *testing.T, recs []events.SQSMessage) {
	t.Helper()
	for _, r := range recs {
		_, err := m.client.ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(m.url),
			ReceiptHandle: aws.String(r.ReceiptHandle), VisibilityTimeout: 0})
		must(t, err)
	}
}

// queuedStack is Fleet (the api in process, on the real clock, as the
// dispatcher's Lambda is) on moto's DynamoDB with its wakes going to a
// queue of moto's, two fake hosts of one slot each, both busy with a run,
// and a third run queued (202) behind them.
type queuedStack struct {
	*stack
	wakes        *wakeMapping
	tables       dynamostore.TableNames
	a, b         *fakehost.Host
	caller       string
	busyA, busyB map[string]any // the runs on a and b
	queued       string         // the waiting run's fleetRunId
	// startsOn receives a host's id when a start request reaches it.
	startsOn chan string
}

func newQueuedStack(t *testing.T) *queuedStack {
	t.Helper()
	q := &queuedStack{wakes: newWakeQueue(t), startsOn: make(chan string, 16)}
	prefix := motoserver.Unique("disp") + "-"
	q.tables = dynamostore.Prefixed(prefix)
	q.stack = newStack(t, "dynamodb", stackOptions{realClock: true, tablePrefix: prefix,
		env: map[string]string{config.EnvWakeQueue: q.wakes.url}})
	host := func(id string) *fakehost.Host {
		h := q.addHost(t, id, fakehost.Config{MaxConcurrent: 1, OnRequest: func(r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/runs" {
				q.startsOn <- id
			}
		}}, nil)
		q.probe(t, id)
		return h
	}
	q.a, q.b = host("host-a"), host("host-b")
	q.caller = q.mint(t, "ci", "*", "*")
	run := func(body string, want int) answer {
		return q.must(t, want, "POST", "/fleet/runs", q.caller, body)
	}
	q.busyA = run(`{"agent":"shell","prompt":"one"}`, http.StatusCreated).body
	q.busyB = run(`{"agent":"shell","prompt":"two"}`, http.StatusCreated).body
	if q.busyA["hostId"] == q.busyB["hostId"] {
		t.Fatalf("both runs on %v: want one on each host", q.busyA["hostId"])
	}
	if q.busyA["hostId"] != "host-a" {
		q.busyA, q.busyB = q.busyB, q.busyA
	}
	waiting := run(`{"agent":"shell","prompt":"three","queue":{"timeout":"1h"}}`, http.StatusAccepted)
	if waiting.str("status") != store.StatusQueued || waiting.str("hostId") != "" {
		t.Fatalf("the third run: %s, want it queued behind the two busy hosts", waiting.raw)
	}
	q.queued = waiting.str("fleetRunId")
	for len(q.startsOn) > 0 {
		<-q.startsOn
	}
	return q
}

// endOnA ends host-a's run and has Fleet record it (a GET refreshes it
// from the host), which frees host-a's slot and wakes it.
func (q *queuedStack) endOnA(t *testing.T) {
	t.Helper()
	zero := 0
	q.a.SetRun(fmt.Sprint(q.busyA["childRunId"]), hostproto.StatusSucceeded, &zero, "")
	got := q.must(t, http.StatusOK, "GET", "/fleet/runs/"+fmt.Sprint(q.busyA["fleetRunId"]), q.caller, "")
	if status := jsonObj(got.body, "run")["status"]; status != store.StatusSucceeded {
		t.Fatalf("host-a's run after its end: %s", got.raw)
	}
}

// startsOf counts the starts host h created for the run whose clientToken
// is token.
func startsOf(h *fakehost.Host, token string) int {
	n := 0
	for _, s := range h.Starts() {
		if s.ClientToken == token {
			n++
		}
	}
	return n
}

// TestRunEndWakesItsHostThroughSQS: when Fleet records the end of a run
// that ran on a host (here a GET that refreshes it from the host), it
// sends that host a wake for one slot through the real queue
// (RUNFLEET_WAKE_QUEUE on moto), in the message the dispatcher reads; a
// run that waits sends nothing until it ends on a host.
func TestRunEndWakesItsHostThroughSQS(t *testing.T) {
	q := newQueuedStack(t)
	if got := q.wakes.receive(t); len(got) != 0 {
		t.Fatalf("wakes before any run ended: %+v", wakesOf(t, got))
	}
	q.endOnA(t)
	recs := q.wakes.receive(t)
	if got := wakesOf(t, recs); len(got) != 1 || got[0] != (fleet.Wake{HostID: "host-a", Slots: 1, Reason: fleet.WakeRunEnded}) {
		t.Fatalf("the queue after host-a's run ended: %+v, want one run_ended wake of host-a for one slot", got)
	}
	if want := `{"v":1,"hostId":"host-a","slots":1,"reason":"run_ended"}`; recs[0].Body != want {
		t.Fatalf("the message %s, want %s", recs[0].Body, want)
	}
	// Recorded again (another GET), the end is not news: no second wake.
	q.must(t, http.StatusOK, "GET", "/fleet/runs/"+fmt.Sprint(q.busyA["fleetRunId"]), q.caller, "")
	q.wakes.acknowledge(t, recs, events.SQSEventResponse{})
	if got := q.wakes.receive(t); len(got) != 0 {
		t.Fatalf("a second read of an ended run woke its host again: %+v", wakesOf(t, got))
	}
}

// TestDispatcherKilledMidStartStartsOnceOnRedelivery: the dispatcher
// function, built as it ships and run under the Lambda runtime interface
// emulator with template.yaml's environment, takes the wake that host-a's
// run end sent through SQS (moto), offers the waiting run to host-a and
// calls its start, and dies (its process killed) before the host answers;
// host-a drops the start it was holding without starting anything. The
// wake's visibility timeout passes, a fresh dispatcher takes it again and
// resumes the same start: the run starts exactly once, on host-a (counted
// on the host by its clientToken), and Fleet shows it started there.
func TestDispatcherKilledMidStartStartsOnceOnRedelivery(t *testing.T) {
	q := newQueuedStack(t)
	ctx := context.Background()
	secretsPrefix := "runfleet-" + motoserver.Unique("disp") + "/"
	sm := secretsmanager.NewFromConfig(moto.AWSConfig())
	_, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(secretsPrefix + "hosts/" + hostCredRef),
		SecretString: aws.String(hostToken)})
	must(t, err)
	env := emulatorEnv(t, "dispatcher", q.tables, secretsPrefix)
	env[config.EnvWakeQueue] = q.wakes.url
	dispatcher := func() *lambdatest.Function {
		return lambdatest.Start(t, functionBootstrap(t, "dispatcher"), env, functionTimeout(t, "dispatcher"))
	}

	q.endOnA(t)
	recs := q.wakes.receive(t)
	if len(recs) != 1 || recs[0].Attributes["ApproximateReceiveCount"] != "1" {
		t.Fatalf("the mapping's first poll: %+v, want host-a's wake", recs)
	}

	// The first dispatcher offers the run to host-a, which holds the
	// start; then the dispatcher dies.
	q.a.FaultStarts(fakehost.HangBeforeAccept, 1)
	first := dispatcher()
	invoked := make(chan error, 1)
	go func() {
		_, err := first.TryInvoke(events.SQSEvent{Records: recs})
		invoked <- err
	}()
	if on := await.Recv(t, "the dispatcher's start of the waiting run", q.startsOn); on != "host-a" {
		t.Fatalf("the start went to %s, want host-a (the woken host)", on)
	}
	run, err := q.app.Store.GetRun(ctx, q.queued)
	must(t, err)
	if run.Status != store.StatusDispatching || run.HostID != "host-a" || !run.Waiting() {
		t.Fatalf("while host-a holds the start: %s on %q (waiting %v), want offered to host-a, still in the queue", run.Status, run.HostID, run.Waiting())
	}
	first.Kill()
	if err := await.Recv(t, "the killed dispatcher's invoke to fail", invoked); err == nil {
		t.Fatal("the killed dispatcher's invoke answered")
	}
	// The held start was never served (a held start records nothing, and
	// its connection died with the dispatcher): host-a knows nothing of
	// the run.
	if startsOf(q.a, run.ClientToken()) != 0 || q.a.Created() != 1 || q.b.Created() != 1 {
		t.Fatalf("after the kill: host-a started the run %d times, created %d runs, host-b %d; want 0, 1 and 1",
			startsOf(q.a, run.ClientToken()), q.a.Created(), q.b.Created())
	}

	// Nothing acknowledged the wake: once its visibility timeout passes
	// it comes again, to a fresh dispatcher, which resumes the offer. That
	// timeout (3 minutes) is far past the offer's deadline (HostTimeout),
	// after which a dispatcher resumes an offer (before it, the one that
	// made it may be at work); the test passes both at once.
	if got := q.wakes.receive(t); len(got) != 0 {
		t.Fatalf("the wake came again before its visibility timeout: %+v", got)
	}
	q.wakes.expire(t, recs)
	run.Deadline = time.Now().Add(-time.Second)
	_, err = q.app.Store.UpdateRun(ctx, run)
	must(t, err)
	again := q.wakes.receive(t)
	if len(again) != 1 || again[0].MessageId != recs[0].MessageId || again[0].Attributes["ApproximateReceiveCount"] != "2" {
		t.Fatalf("the redelivery: %+v, want the same wake, received a second time", again)
	}
	second := dispatcher()
	if resp := q.wakes.deliver(t, second, again); len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the second dispatcher failed the wake: %+v\n%s", resp, second.Output())
	}
	if got := q.wakes.receive(t); len(got) != 0 {
		t.Fatalf("the wake is still in the queue after the second dispatcher acknowledged it: %+v", got)
	}

	if n := startsOf(q.a, run.ClientToken()); n != 1 || q.a.Created() != 2 || q.b.Created() != 1 {
		t.Fatalf("host-a started the waiting run %d times (created %d runs in all), host-b %d; want once, 2 and 1", n, q.a.Created(), q.b.Created())
	}
	got := q.must(t, http.StatusOK, "GET", "/fleet/runs/"+q.queued, q.caller, "")
	r := jsonObj(got.body, "run")
	queue := jsonObj(r, "queue")
	if !slices.Contains([]string{store.StatusPending, store.StatusAdmitted, store.StatusRunning}, fmt.Sprint(r["status"])) ||
		r["hostId"] != "host-a" || queue["startedOn"] != "host-a" || queue["startedAt"] == nil {
		t.Fatalf("Fleet shows the waiting run as %s: want it started on host-a", got.raw)
	}
	if out := second.Output(); !strings.Contains(out, `"resumed":1`) || !strings.Contains(out, `"started":1`) {
		t.Errorf("the second dispatcher's log does not say it resumed and started the run:\n%s", out)
	}
	for _, fn := range []*lambdatest.Function{first, second} {
		if out := fn.Output(); strings.Contains(out, hostToken) || strings.Contains(out, q.caller) {
			t.Error("a token reached a dispatcher's log")
		}
	}
	t.Logf("the second dispatcher: %d invoke(s), first %.1f ms", len(second.Reports()), ms(second.Reports()[0].Duration))
}

// failingQueueReads is a store whose next queue reads fail (the fault a
// delivery must survive: DynamoDB unavailable for a moment).
type failingQueueReads struct {
	store.Store
	fails chan struct{} // one receive per failing read
}

func (s *failingQueueReads) QueueClasses(ctx context.Context) ([]string, error) {
	select {
	case <-s.fails:
		return nil, fmt.Errorf("store unavailable")
	default:
		return s.Store.QueueClasses(ctx)
	}
}

func (s *failingQueueReads) QueueHeads(ctx context.Context) ([]store.QueueHead, error) {
	select {
	case <-s.fails:
		return nil, fmt.Errorf("store unavailable")
	default:
		return s.Store.QueueHeads(ctx)
	}
}

// TestLocalWakeQueueRedeliversAFailedFill is the local stack's wake path:
// Fleet wakes into an in-process queue (wake.Local, as make dev runs it)
// when it records a run's end, and the queue delivers the wake to the
// dispatcher handler in an SQS event; a delivery whose fill fails (the
// store unavailable for a moment) is not acknowledged and comes again once
// its visibility timeout has passed on the clock, not before, and then the
// waiting run starts, once.
func TestLocalWakeQueueRedeliversAFailedFill(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			clk := clock.NewFake(time.Now().UTC().Truncate(time.Second))
			log := slog.New(slog.NewJSONHandler(io.Discard, nil))
			local, err := wake.NewLocal(wake.LocalConfig{Logger: log, Clock: clk})
			must(t, err)
			s := newStack(t, kind, stackOptions{clock: clk, waker: local})
			a := s.addHost(t, "host-a", fakehost.Config{MaxConcurrent: 1}, nil)
			s.probe(t, "host-a")
			caller := s.mint(t, "ci", "*", "*")
			busy := s.must(t, http.StatusCreated, "POST", "/fleet/runs", caller, `{"agent":"shell","prompt":"one"}`)
			waiting := s.must(t, http.StatusAccepted, "POST", "/fleet/runs", caller, `{"agent":"shell","prompt":"two","queue":{"timeout":"1h"}}`)

			// The dispatcher, as the local stack runs it, on a store whose
			// next queue read fails.
			faulty := &failingQueueReads{Store: s.app.Store, fails: make(chan struct{}, 1)}
			faulty.fails <- struct{}{}
			d, err := wake.NewDispatcher(wake.DispatcherConfig{Fleet: s.fleetOn(t, faulty), Logger: log, Clock: clk})
			must(t, err)
			type delivery struct {
				at   time.Time
				ev   events.SQSEvent
				resp events.SQSEventResponse
			}
			delivered := make(chan delivery, 4)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				local.Run(ctx, func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
					at := clk.Now()
					resp, err := d.Handle(ctx, ev)
					delivered <- delivery{at, ev, resp}
					return resp, err
				})
			}()
			t.Cleanup(func() { cancel(); await.Recv(t, "the local queue to stop", done) })

			zero := 0
			a.SetRun(busy.str("childRunId"), hostproto.StatusSucceeded, &zero, "")
			s.must(t, http.StatusOK, "GET", "/fleet/runs/"+busy.str("fleetRunId"), caller, "")
			first := await.Recv(t, "the run end's wake to be delivered", delivered)
			if got := wakesOf(t, first.ev.Records); len(got) != 1 || got[0] != (fleet.Wake{HostID: "host-a", Slots: 1, Reason: fleet.WakeRunEnded}) {
				t.Fatalf("delivered %+v, want host-a's run_ended wake", got)
			}
			if len(first.resp.BatchItemFailures) != 1 || local.Pending() != 1 {
				t.Fatalf("the failed fill answered %+v (%d pending): want its wake failed and kept", first.resp, local.Pending())
			}
			await.Cond(t, await.Limit, "the queue to wait out the visibility timeout", func() bool {
				next, ok := clk.Next()
				return ok && next.Equal(first.at.Add(wake.VisibilityTimeout))
			})
			clk.Advance(wake.VisibilityTimeout - time.Second)
			if len(delivered) != 0 || startsOf(a, waitingToken(t, s, waiting.str("fleetRunId"))) != 0 {
				t.Fatal("the wake came again before its visibility timeout")
			}
			clk.Advance(time.Second)
			second := await.Recv(t, "the wake's redelivery", delivered)
			if len(second.resp.BatchItemFailures) != 0 || second.ev.Records[0].MessageId != first.ev.Records[0].MessageId ||
				second.ev.Records[0].Attributes["ApproximateReceiveCount"] != "2" {
				t.Fatalf("the redelivery: %+v answered %+v, want the same wake, received twice, acknowledged", second.ev.Records, second.resp)
			}
			await.Cond(t, await.Limit, "the acknowledged wake to leave the queue", func() bool { return local.Pending() == 0 })
			if n := startsOf(a, waitingToken(t, s, waiting.str("fleetRunId"))); n != 1 {
				t.Fatalf("host-a started the waiting run %d times, want once", n)
			}
			got := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+waiting.str("fleetRunId"), caller, "")
			if q := jsonObj(got.body, "run", "queue"); q["startedOn"] != "host-a" {
				t.Fatalf("the waiting run after the redelivery: %s", got.raw)
			}
		})
	}
}

// waitingToken is the clientToken a waiting run is started with.
func waitingToken(t *testing.T, s *stack, id string) string {
	t.Helper()
	r, err := s.app.Store.GetRun(context.Background(), id)
	must(t, err)
	return r.ClientToken()
}
