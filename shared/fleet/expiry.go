package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// Event expiry. A run expires Retention after it ends (DESIGN.md), and its
// events must stay as long as it does: readers reach events only through
// their run, and a run whose events vanished first would read as having
// none. The store expires (and DynamoDB's TTL deletes) each event item on
// its own, so each carries an ExpiresAt that Fleet keeps at or past its
// run's, at the least cost in writes:
//
//   - An event is mirrored to expire Retention + EventMargin after it is
//     mirrored. A run that ends within EventMargin of its first events
//     (nearly every run: edge ends an attempt at runner.maxDuration, 2 h by
//     default) so needs no write to its events, ever.
//   - A run records a lower bound of its events' expiry (EventsExpireAfter,
//     set when its first events are mirrored). While a run is live and that
//     bound is less than Retention away, the sweep extends the run's events
//     to Retention + EventMargin from now: a run live for over a week, and
//     a run retried after its end (a retry may come at any moment before the
//     run expires, and the new attempt would outlive the earlier ones'
//     events).
//   - Before a run is drained, the sweep extends its events, when the bound
//     falls short, to the run's own expiry plus eventsLag (room for a retry
//     just before the run expires to reach the next sweep's extension).
//
// A run's egress ledger mirror (egress.go) is kept exactly as its events
// are: its records and head are written to expire as an event mirrored then
// would, and every extension of the events extends them too
// (ExtendEgressExpiry), so the ledger outlives its run as the events do.
// Its records are mirrored no earlier than the run's first events (a run's
// first event is its start's), so the run's events bound covers them.
//
// An extension reads the run's events and writes each one it extends: a
// cost paid by runs live over a week and by retried runs, not by the rest.
// Extending is the sweep's alone: the stream's pull-through leaves a run
// that needs it live for the sweep (a minute at most), so only the sweep
// function may update events.
const (
	// EventMargin is how much longer than Retention a mirrored event is
	// first kept (see above).
	EventMargin = 7 * 24 * time.Hour
	// eventsLag is how long a drained run's events outlive the run at least.
	eventsLag = time.Hour
)

// eventExpiry is the expiry of an event mirrored at now.
func (f *Fleet) eventExpiry(now time.Time) time.Time {
	return now.Add(f.cfg.Retention + EventMargin)
}

// eventsFloor is a time before which none of r's mirrored events expires.
// A run whose events were mirrored before it recorded one has its
// creation plus Retention: events were then kept Retention after their
// mirroring.
func (f *Fleet) eventsFloor(r store.Run) time.Time {
	if !r.EventsExpireAfter.IsZero() {
		return r.EventsExpireAfter
	}
	return r.CreatedAt.Add(f.cfg.Retention)
}

// liveEventsShort reports whether a live run's events may expire within
// Retention of now.
func (f *Fleet) liveEventsShort(r store.Run, now time.Time) bool {
	return r.EventCursor > 0 && f.eventsFloor(r).Before(now.Add(f.cfg.Retention))
}

// drainEventsShort reports whether a run about to be drained has events
// that may expire before eventsLag past the run.
func (f *Fleet) drainEventsShort(r store.Run) bool {
	return r.EventCursor > 0 && f.eventsFloor(r).Before(r.ExpiresAt.Add(eventsLag))
}

// extendEvents extends run's events and egress ledger to expire no
// earlier than to, then records the bound on the run.
func (f *Fleet) extendEvents(ctx context.Context, run store.Run, to time.Time) (store.Run, error) {
	if err := f.store.ExtendEventsExpiry(ctx, run.FleetRunID, to); err != nil {
		return run, fmt.Errorf("fleet: extending the expiry of the events of %s: %w", run.FleetRunID, err)
	}
	if err := f.store.ExtendEgressExpiry(ctx, run.FleetRunID, to); err != nil {
		return run, fmt.Errorf("fleet: extending the expiry of the egress ledger of %s: %w", run.FleetRunID, err)
	}
	f.log.Info("events' expiry extended", logRun, run.FleetRunID, "to", to, logAttempt, run.Attempt, logStatus, run.Status)
	stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
		if !cur.EventsExpireAfter.Before(to) {
			return false
		}
		cur.EventsExpireAfter = to
		return true
	})
	if err != nil {
		return run, fmt.Errorf("fleet: recording the events' expiry of %s: %w", run.FleetRunID, err)
	}
	return stored, nil
}

// drainLost drains a lost run whose events had to be extended first
// (markLost leaves such a run in the live index for the sweep).
func (f *Fleet) drainLost(ctx context.Context, run store.Run) (store.Run, error) {
	run, err := f.extendEvents(ctx, run, run.ExpiresAt.Add(eventsLag))
	if err != nil {
		return run, err
	}
	return f.settle(ctx, run, func(cur *store.Run) bool {
		if cur.Status != store.StatusLost || cur.Drained || f.drainEventsShort(*cur) {
			return false
		}
		cur.Drained = true
		return true
	})
}
