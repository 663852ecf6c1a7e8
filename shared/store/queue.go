package store

import (
	"context"
	"fmt"
	"time"
)

// Queue is the index of runs waiting for capacity (DESIGN.md, "Runs that
// wait"): every Run whose Waiting() is true, per routing class, in queue
// order (QueueOrder: higher Priority first, then earlier Since, then the
// run id). The store keeps it in step with every CreateRun and UpdateRun,
// as it keeps the live index: a run enters when written Waiting and leaves
// when written otherwise (started, ended, timed out, canceled). Reads are
// eventually consistent: a run written a moment ago may be missing, one
// that left may still show, so a caller acts on a run only through a
// versioned UpdateRun of the run it read.
type Queue interface {
	// QueueClasses returns the routing classes that have at least one
	// waiting run, in ascending order.
	QueueClasses(ctx context.Context) ([]string, error)
	// ListQueue pages class's waiting runs in queue order: up to limit
	// entries (PageLimit applies) after the entry whose Order is after
	// ("" starts at the head). Next is the Order to continue after,
	// empty when no entry follows.
	ListQueue(ctx context.Context, class, after string, limit int) (QueuePage, error)
	// QueueAhead counts class's waiting runs ordered before order (a
	// QueueOrder): a run's position is QueueAhead+1.
	QueueAhead(ctx context.Context, class, order string) (int, error)
	// QueueStats counts class's waiting runs and finds the earliest Since.
	QueueStats(ctx context.Context, class string) (QueueStats, error)
}

// StatusQueued: the run waits for an eligible host with room; no host has
// it. It is live (the sweep ends it queue_timeout at Queue.Until).
const StatusQueued = "queued"

// ReasonQueueTimeout ends a queued run whose Queue.Until passed.
const ReasonQueueTimeout = "queue_timeout"

// QueueInfo is a run's wait for capacity, kept after it started so that
// the run still says how long it waited.
type QueueInfo struct {
	// Class is the routing class (fleet.ClassOf: the agent and labels).
	Class string
	// Priority orders the class: higher first (0 by default).
	Priority int
	// Since is when the run began to wait.
	Since time.Time
	// Timeout is the wait the dispatch asked for; Until = Since + Timeout.
	Timeout time.Duration
	Until   time.Time
	// Offers counts the starts offered to hosts that refused them (each
	// refusal is recorded on its host under the token used): the next
	// start uses ClientToken(), a token no host has seen refused.
	Offers int
	// Request is the dispatch as Fleet keeps it while the run waits
	// (fleet's JSON form); nil once a host took the run.
	Request []byte
	// StartedAt is when a host took the run; nil while it waits.
	StartedAt *time.Time
	// StartedOn is the host that took it.
	StartedOn string
}

// Waiting reports whether r is in the queue index: it asked to wait, no
// host has taken it yet, and it is queued or being offered to a host
// (dispatching, kept in the index so that a dispatcher that died offering
// it leaves it where the next delivery finds it).
func (r Run) Waiting() bool {
	return r.Queue != nil && r.Queue.StartedAt == nil && (r.Status == StatusQueued || r.Status == StatusDispatching)
}

// ClientToken is the token the run is started with on a host: the run id
// for the first offer, then the run id and the offer number, so that a
// host that refused an earlier offer (and keeps that refusal under its
// token) is offered the run afresh.
func (r Run) ClientToken() string {
	if r.Queue == nil || r.Queue.Offers == 0 {
		return r.FleetRunID
	}
	return fmt.Sprintf("%s.q%d", r.FleetRunID, r.Queue.Offers)
}

// QueuePriorityMin and QueuePriorityMax bound QueueInfo.Priority.
const (
	QueuePriorityMin = -100
	QueuePriorityMax = 100
)

// QueueOrder is the run's sort key in its class: priority descending,
// then Since, then the id; fixed width, so byte order is queue order.
func QueueOrder(q QueueInfo, fleetRunID string) string {
	return fmt.Sprintf("%03d|%020d|%s", QueuePriorityMax-q.Priority, q.Since.UTC().UnixNano(), fleetRunID)
}

// QueueEntry is one waiting run as the index holds it.
type QueueEntry struct {
	FleetRunID string
	Order      string
	Since      time.Time
}

// QueuePage is one page of ListQueue.
type QueuePage struct {
	Entries []QueueEntry
	// Next is the after of the next page; empty when there is none.
	Next string
}

// QueueStats are one class's waiting runs.
type QueueStats struct {
	Waiting int
	// Oldest is the earliest Since; zero when none waits.
	Oldest time.Time
}
