package fleetapi

import (
	"encoding/json"
	"time"
)

// Event types.
const (
	EventOutput    = "output"
	EventState     = "state"
	EventInput     = "input"
	EventAdmission = "admission"
	EventLimit     = "limit"
	// EventQueued is a run's first event when it waited in Fleet's queue:
	// data {since, startedAt, waitedMs, hostId, offers?} (hostproto.Queued).
	EventQueued = "queued"
)

// Event is one entry of a run's event sequence, as its host recorded it:
// sequences start at 1 and run on across attempts. Data is a JSON string
// for output, the value sent for input, and an object for state ({status,
// attempt, exitCode?, reason?, detail?}), admission, limit and queued.
type Event struct {
	Sequence int64           `json:"sequence"`
	Type     string          `json:"type"`
	Data     json.RawMessage `json:"data"`
	TS       time.Time       `json:"ts"`
}

// EventPage is GET /fleet/runs/{id}/events: the mirrored events after the
// asked sequence. HasMore: more are mirrored past this page now (ask again
// at once). NextCursor is the last event's sequence (the asked one when
// none came): the next page's after; nil (absent) when the asked sequence
// is past the run's last mirrored event, a position Fleet never served,
// from which no page continues. Live: the run may yet have events the
// mirror lacks: false once the run has ended and the mirror holds every
// event of it, whatever this page's place in them (HasMore says that). Its
// keys are in the order Fleet writes them.
type EventPage struct {
	Events     []Event `json:"events"`
	HasMore    bool    `json:"hasMore"`
	Live       bool    `json:"live"`
	NextCursor *int64  `json:"nextCursor,omitempty"`
}

// The stream's SSE event names (GET /fleet/runs/{id}/stream). An "event"
// message's id is the event's sequence and its data an Event; "snapshot",
// "done" and "idle" carry a StreamSnapshot, a StreamDone and a StreamIdle.
// With ?egress=true the stream also carries "egress" messages, one per
// ledger record (data: an EgressRecord), and every id is then
// "<event sequence>:<ledger seq>", the two cursors after the message,
// which Last-Event-ID gives back to resume both.
const (
	SSEEvent    = "event"
	SSESnapshot = "snapshot"
	SSEDone     = "done"
	SSEIdle     = "idle"
	SSEEgress   = "egress"
)

// StreamSnapshot is a "snapshot" message's data, sent once the backlog is: where
// the stream stands.
type StreamSnapshot struct {
	// Cursor is the last event sent (the resume point when none was).
	Cursor  int64  `json:"cursor"`
	Status  string `json:"status"`
	Attempt int    `json:"attempt"`
	// Live: more may come (done follows otherwise).
	Live bool `json:"live"`
	// EgressCursor is the last ledger record sent, on a stream with
	// ?egress=true only.
	EgressCursor *int64 `json:"egressCursor,omitempty"`
}

// StreamDone is a "done" message's data, the stream's last: the run is over and
// every event was sent.
type StreamDone struct {
	Cursor   int64  `json:"cursor"`
	Status   string `json:"status"`
	Attempt  int    `json:"attempt"`
	ExitCode *int   `json:"exitCode,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Detail says what Reason means for this run, and what to change.
	Detail string `json:"detail,omitempty"`
	// EgressCursor is the last ledger record sent, on a stream with
	// ?egress=true only: every record of the run's ledger was.
	EgressCursor *int64 `json:"egressCursor,omitempty"`
}

// StreamIdle is an "idle" message's data: the run was silent for IdleSeconds,
// so the stream ends; reconnect after RetryMs to Resume (this stream's path
// with ?after=Cursor, and egress=true&egressAfter=EgressCursor on a stream
// with egress), or with Last-Event-ID (the message's id).
type StreamIdle struct {
	Cursor      int64  `json:"cursor"`
	Status      string `json:"status"`
	IdleSeconds int64  `json:"idleSeconds"`
	RetryMs     int64  `json:"retryMs"`
	Resume      string `json:"resume"`
	// EgressCursor is the last ledger record sent, on a stream with
	// ?egress=true only.
	EgressCursor *int64 `json:"egressCursor,omitempty"`
}

// CodeTooManyStreams is the code of the stream's 429: the caller holds
// its cap of open streams already.
const CodeTooManyStreams = "too_many_streams"

// TooManyStreams is the stream's 429 (too_many_streams), with the
// Retry-After header: an Error whose Details are a StreamCap. Its keys
// are in the order Fleet writes them (it decodes as an Error too).
type TooManyStreams struct {
	Code    string    `json:"code"`
	Details StreamCap `json:"details"`
	Error   string    `json:"error"`
}

// StreamCap is the Details of too_many_streams: the cap, and the seconds
// until the caller's earliest stream slot would lapse.
type StreamCap struct {
	MaxStreamsPerCaller int   `json:"maxStreamsPerCaller"`
	RetryAfterSeconds   int64 `json:"retryAfterSeconds"`
}
