package store

import (
	"context"
	"encoding/json"
	"time"
)

// Events are each run's mirror of its host's events, numbered by Sequence:
// an event is written once and never rewritten, read in sequence order and
// strongly consistent (a stream never declares a drained run done before
// it sees the run's last event), and expires on its own ExpiresAt.
type Events interface {
	// PutEvents mirrors events; an event whose sequence is already stored is
	// left as it is (a re-run never duplicates or rewrites).
	PutEvents(ctx context.Context, events []Event) error
	// ListEvents returns events with sequence > after, ascending, at most limit.
	ListEvents(ctx context.Context, fleetRunID string, after int64, limit int) (EventPage, error)
	// ExtendEventsExpiry makes every unexpired event of the run whose
	// ExpiresAt is before to (RoundExpiry(to)) expire at to. It never
	// shortens an event's life, so concurrent calls commute; an expired
	// event stays expired (it reads as absent already).
	ExtendEventsExpiry(ctx context.Context, fleetRunID string, to time.Time) error
}

// Event is one mirrored host event.
type Event struct {
	FleetRunID string
	// Sequence numbers a run's events from 1, contiguous across attempts.
	Sequence int64
	Type     string
	// Data is the event's JSON value, as the host sent it.
	Data json.RawMessage
	TS   time.Time
	// ExpiresAt is the TTL.
	ExpiresAt time.Time
}

// EventPage is one page of a run's mirror.
type EventPage struct {
	Events  []Event
	HasMore bool
}
