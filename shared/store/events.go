package store

import (
	"encoding/json"
	"time"
)

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
