package wake

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/fleet"
)

// The dispatcher's delivery settings, as template.yaml deploys them: the
// local queue's defaults, so the local stack redelivers as AWS does
// (tests/template_test.go holds the template to them).
const (
	// DispatcherTimeout is the dispatcher function's timeout: each
	// delivery's deadline.
	DispatcherTimeout = 30 * time.Second
	// VisibilityTimeout is how long a delivered message stays hidden: a
	// delivery not acknowledged by then (failed, or its dispatcher died)
	// comes again. Six times the function's timeout, AWS's guidance for
	// a queue a function consumes (the mapping's own retries included).
	VisibilityTimeout = 6 * DispatcherTimeout
	// BatchSize is the most messages one delivery carries.
	BatchSize = 10
	// MaxReceiveCount is how many deliveries a message gets before it is
	// dead-lettered (the queue's redrive policy).
	MaxReceiveCount = 5
)

// localSource names the local queue in its events, as an ARN names a queue.
const localSource = "arn:aws:sqs:local:000000000000:runfleet-dispatch-wakes"

// LocalConfig configures the local stack's queue. Zero values are the
// template's settings.
type LocalConfig struct {
	// Logger gets a line per failed delivery and per dead letter. Required.
	Logger *slog.Logger
	// Clock times visibility and deadlines; nil is the wall clock (tests
	// move a fake one to pass a visibility timeout).
	Clock clock.Clock
	// Timeout is each delivery's deadline; zero is DispatcherTimeout.
	Timeout time.Duration
	// VisibilityTimeout: zero is VisibilityTimeout.
	VisibilityTimeout time.Duration
	// BatchSize: zero is BatchSize.
	BatchSize int
	// MaxReceiveCount: zero is MaxReceiveCount.
	MaxReceiveCount int
}

// Handler is what the queue delivers to: Dispatcher.Handle.
type Handler func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error)

// Local is the local stack's wake queue: Fleet wakes into it in process,
// and Run delivers its messages to the dispatcher's handler as SQS's event
// source mapping does: batches of SQS-shaped events, one at a time, each
// message hidden for the visibility timeout once delivered and deleted
// when the handler does not report it failed; a handler error or panic
// fails the whole batch, which comes again once its visibility timeout
// passes on the clock; a message delivered MaxReceiveCount times is
// dead-lettered (logged at ERROR, then dropped: the local stack has no
// dead-letter queue to keep it in). Messages live in memory: a restart
// loses them, and the probe pass wakes the hosts with room again. Safe for
// concurrent use.
type Local struct {
	cfg   LocalConfig
	clock clock.Clock
	log   *slog.Logger

	mu     sync.Mutex
	msgs   []*localMessage // in the order sent
	nextID int
	kick   chan struct{} // a new message: Run looks again
}

// localMessage is one message and its delivery state.
type localMessage struct {
	id        string
	body      string
	sentAt    time.Time
	firstAt   time.Time // first delivery
	receives  int
	visibleAt time.Time // hidden until then once delivered
}

var _ fleet.Waker = (*Local)(nil)

// NewLocal checks cfg and returns an empty queue.
func NewLocal(cfg LocalConfig) (*Local, error) {
	if cfg.Logger == nil {
		return nil, errors.New("wake: LocalConfig.Logger is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DispatcherTimeout
	}
	if cfg.VisibilityTimeout <= 0 {
		cfg.VisibilityTimeout = VisibilityTimeout
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = BatchSize
	}
	if cfg.MaxReceiveCount <= 0 {
		cfg.MaxReceiveCount = MaxReceiveCount
	}
	return &Local{cfg: cfg, clock: cfg.Clock, log: cfg.Logger, kick: make(chan struct{}, 1)}, nil
}

// Wake queues wakes, one message per host (coalesced), visible at once.
func (l *Local) Wake(_ context.Context, wakes []fleet.Wake) error {
	bodies, err := encodeAll(wakes)
	if err != nil {
		return err
	}
	now := l.clock.Now()
	l.mu.Lock()
	for _, b := range bodies {
		l.nextID++
		l.msgs = append(l.msgs, &localMessage{id: "local-" + strconv.Itoa(l.nextID), body: b, sentAt: now, visibleAt: now})
	}
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return nil
}

// Pending counts the messages not yet deleted or dead-lettered, hidden
// ones included.
func (l *Local) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.msgs)
}

// Run delivers messages to handle until ctx ends: a batch as soon as one
// is visible, the next once handle returned. A delivery's context ends at
// its deadline (Timeout) or when ctx does.
func (l *Local) Run(ctx context.Context, handle Handler) {
	for {
		batch, wait := l.receive()
		if len(batch) > 0 {
			l.deliver(ctx, handle, batch)
			continue
		}
		var timer clock.Timer
		var shows <-chan time.Time // nil: nothing hidden, only a wake or the end
		if wait > 0 {
			timer = l.clock.NewTimer(wait)
			shows = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-l.kick:
		case <-shows:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// receive takes the visible messages, at most a batch, and hides them for
// the visibility timeout; a message past its last receive is dead-lettered
// instead. wait is how long until a hidden message shows again (zero: none
// is hidden).
func (l *Local) receive() (batch []events.SQSMessage, wait time.Duration) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var dead []*localMessage
	for _, m := range l.msgs {
		if len(batch) == l.cfg.BatchSize {
			break
		}
		if m.visibleAt.After(now) {
			continue
		}
		if m.receives >= l.cfg.MaxReceiveCount {
			dead = append(dead, m)
			continue
		}
		m.receives++
		if m.receives == 1 {
			m.firstAt = now
		}
		m.visibleAt = now.Add(l.cfg.VisibilityTimeout)
		batch = append(batch, m.event())
	}
	for _, m := range dead {
		l.removeLocked(m.id)
		w, _ := decode(m.body)
		l.log.Error("wake: a wake failed every delivery and is dropped (the local stack's dead letter)",
			logMessageID, m.id, logReceives, m.receives, logHost, w.HostID)
	}
	for _, m := range l.msgs {
		if d := m.visibleAt.Sub(now); d > 0 && (wait == 0 || d < wait) {
			wait = d
		}
	}
	return batch, wait
}

// event is m as the mapping delivers it.
func (m *localMessage) event() events.SQSMessage {
	sum := md5.Sum([]byte(m.body))
	ms := func(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
	return events.SQSMessage{
		MessageId: m.id, ReceiptHandle: m.id + "#" + strconv.Itoa(m.receives), Body: m.body,
		Md5OfBody: hex.EncodeToString(sum[:]), EventSource: "aws:sqs", EventSourceARN: localSource, AWSRegion: "local",
		Attributes: map[string]string{
			"ApproximateReceiveCount": strconv.Itoa(m.receives), "SentTimestamp": ms(m.sentAt),
			"ApproximateFirstReceiveTimestamp": ms(m.firstAt),
		},
	}
}

// deliver runs handle on batch and deletes what it acknowledged: every
// message it did not report failed, unless it failed (an error, a panic,
// or a failure naming a message not in the batch, which Lambda reads as
// the whole batch failed).
func (l *Local) deliver(ctx context.Context, handle Handler, batch []events.SQSMessage) {
	dctx, cancel := clock.WithTimeout(ctx, l.clock, l.cfg.Timeout)
	resp, err := call(dctx, handle, events.SQSEvent{Records: batch})
	cancel()
	ids := make([]string, len(batch))
	for i, m := range batch {
		ids[i] = m.MessageId
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		if err == nil && !slices.Contains(ids, f.ItemIdentifier) {
			err = fmt.Errorf("wake: the handler reported %q failed, which the batch does not hold", f.ItemIdentifier)
		}
		failed = append(failed, f.ItemIdentifier)
	}
	if err != nil {
		l.log.Warn("wake: a delivery failed; its wakes come again after the visibility timeout",
			logMessages, len(batch), logErr, err.Error())
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if !slices.Contains(failed, id) {
			l.removeLocked(id)
		}
	}
}

// call is handle(ctx, ev), a panic in it returned as an error (with its
// stack, logged by the caller's line), as Lambda reports a function that
// panicked.
func call(ctx context.Context, handle Handler, ev events.SQSEvent) (resp events.SQSEventResponse, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("wake: the handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return handle(ctx, ev)
}

func (l *Local) removeLocked(id string) {
	l.msgs = slices.DeleteFunc(l.msgs, func(m *localMessage) bool { return m.id == id })
}
