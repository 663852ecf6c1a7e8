package wake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/fleet"
)

// Filler fills hosts with waiting runs: *fleet.Fleet. An error means the
// wakes should come again (what FillHosts already offered stays offered);
// it honours ctx and is safe for concurrent use on different hosts.
type Filler interface {
	FillHosts(ctx context.Context, wakes []fleet.Wake) (fleet.FillReport, error)
}

var _ Filler = (*fleet.Fleet)(nil)

// DefaultDispatcherConcurrency bounds the hosts one invocation fills at
// once: the mapping's batch size (template.yaml's BatchSize), so a batch
// of ten hosts is filled together.
const DefaultDispatcherConcurrency = 10

// Log field names of the dispatcher's lines.
const (
	logMessages  = "messages"
	logHosts     = "hosts"
	logStarted   = "started"
	logOffered   = "offered"
	logResumed   = "resumed"
	logFailed    = "failed"
	logDuration  = "durationMs"
	logMessageID = "messageId"
	logReceives  = "receiveCount"
	logHost      = "hostId"
	logErr       = "err"
	logStack     = "stack"
)

// DispatcherConfig configures the dispatcher.
type DispatcherConfig struct {
	// Fleet fills the hosts. Required.
	Fleet Filler
	// Logger gets one line per invocation and one per failure. Required.
	Logger *slog.Logger
	// Clock times invocations; nil is the wall clock.
	Clock clock.Clock
	// Concurrency bounds the hosts filled at once; zero is
	// DefaultDispatcherConcurrency.
	Concurrency int
}

// Dispatcher is the dispatcher function's handler: a batch of wake
// messages from the DispatchWakes queue (the event source mapping, with
// ReportBatchItemFailures) in, FillHosts per host, and the messages that
// must come again out. Safe for concurrent use.
type Dispatcher struct {
	cfg   DispatcherConfig
	clock clock.Clock
}

// NewDispatcher checks cfg and returns the handler.
func NewDispatcher(cfg DispatcherConfig) (*Dispatcher, error) {
	var errs []error
	if cfg.Fleet == nil {
		errs = append(errs, errors.New("wake: DispatcherConfig.Fleet is required"))
	}
	if cfg.Logger == nil {
		errs = append(errs, errors.New("wake: DispatcherConfig.Logger is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultDispatcherConcurrency
	}
	c := cfg.Clock
	if c == nil {
		c = clock.Real{}
	}
	return &Dispatcher{cfg: cfg, clock: c}, nil
}

// hostFill is one host's share of a batch: its wakes, coalesced, and the
// messages that carried them.
type hostFill struct {
	wake     fleet.Wake
	messages []string
	report   fleet.FillReport
	err      error
}

// Handle fills the hosts a batch of messages wakes. The messages of a host
// are filled together (one FillHosts, their slots added) and fail
// together; the hosts are filled concurrently, so one slow or failing host
// neither delays nor redelivers another's. A message that is not a wake
// fails alone: after the queue's maxReceiveCount it rests in the
// dead-letter queue, where an alarm shows it. The answer lists exactly the
// failed messages (batchItemFailures: SQS deletes the others); Handle never
// returns an error, which would redeliver the whole batch.
func (d *Dispatcher) Handle(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	begun := d.clock.Now()
	resp := events.SQSEventResponse{BatchItemFailures: []events.SQSBatchItemFailure{}}
	fail := func(id string) {
		resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: id})
	}
	var fills []*hostFill
	byHost := map[string]*hostFill{}
	for _, rec := range ev.Records {
		w, err := decode(rec.Body)
		if err != nil {
			// The body is not logged: whatever it is, it is not ours.
			d.cfg.Logger.ErrorContext(ctx, "dispatcher: a message that is not a wake", logMessageID, rec.MessageId,
				logReceives, rec.Attributes["ApproximateReceiveCount"], logErr, err.Error())
			fail(rec.MessageId)
			continue
		}
		f, ok := byHost[w.HostID]
		if !ok {
			f = &hostFill{wake: w}
			byHost[w.HostID] = f
			fills = append(fills, f)
		} else {
			f.wake.Slots += w.Slots
		}
		f.messages = append(f.messages, rec.MessageId)
	}

	var wg sync.WaitGroup
	sem := make(chan struct{}, d.cfg.Concurrency)
	for _, f := range fills {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f.report, f.err = d.fill(ctx, f.wake)
		}()
	}
	wg.Wait()

	var sum fleet.FillReport
	failedHosts := 0
	for _, f := range fills {
		sum.Started = append(sum.Started, f.report.Started...)
		sum.Offered += f.report.Offered
		sum.Resumed += f.report.Resumed
		if f.err != nil {
			failedHosts++
			d.cfg.Logger.WarnContext(ctx, "dispatcher: filling a host failed; its wakes come again after the visibility timeout",
				logHost, f.wake.HostID, logMessages, len(f.messages), logErr, f.err.Error())
			for _, id := range f.messages {
				fail(id)
			}
		}
	}
	attrs := []any{logMessages, len(ev.Records), logHosts, len(fills), logStarted, len(sum.Started), logOffered, sum.Offered,
		logResumed, sum.Resumed, logFailed, len(resp.BatchItemFailures), logDuration, d.clock.Now().Sub(begun).Milliseconds()}
	if len(sum.Started) > 0 || sum.Offered > 0 || len(resp.BatchItemFailures) > 0 {
		d.cfg.Logger.InfoContext(ctx, "dispatcher", attrs...)
	} else {
		// Woken with nothing to start (a probe's wake, a host full again):
		// routine, and a quiet fleet's log stays quiet.
		d.cfg.Logger.DebugContext(ctx, "dispatcher", attrs...)
	}
	return resp, nil
}

// fill is FillHosts for one host, a panic in it turned into that host's
// failure (logged with its stack): the batch's other hosts are unaffected.
func (d *Dispatcher) fill(ctx context.Context, w fleet.Wake) (rep fleet.FillReport, err error) {
	defer func() {
		if p := recover(); p != nil {
			d.cfg.Logger.ErrorContext(ctx, "dispatcher: filling a host panicked", logHost, w.HostID,
				logErr, fmt.Sprint(p), logStack, string(debug.Stack()))
			err = fmt.Errorf("wake: filling %s panicked: %v", w.HostID, p)
		}
	}()
	return d.cfg.Fleet.FillHosts(ctx, []fleet.Wake{w})
}
