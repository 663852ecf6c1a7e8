package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
	// QueueHeads is QueueClasses with each class's first entry in queue
	// order, which the classes' skip-scan reads anyway: a reader that
	// takes a class's head (a fill of one slot) then reads no page of it.
	QueueHeads(ctx context.Context) ([]QueueHead, error)
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
// it. It is not live (Run.Live): the sweep finds it through the queue
// index, whose entries carry Until, and ends it queue_timeout then.
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
	// Hosts, when not nil, are the only hosts the run may be offered to
	// (its caller's host scope, sorted), at most QueueHostsMax. The queue
	// index keeps them with the run's entry (QueueEntry.Hosts), so that a
	// reader passes over a run none of its hosts may take without reading
	// the run: runs only other hosts may take never hide, from a host
	// with room, the runs behind them. Nil says nothing (any host, as far
	// as the index knows).
	Hosts []string
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

// queueOrderPrefix is QueueOrder's width before the run id: the
// priority (3 digits), "|", Since in nanoseconds (20 digits), "|".
const queueOrderPrefix = 3 + 1 + 20 + 1

// ParseQueueOrder reads back what QueueOrder wrote: the run's Since and
// id. An index entry carries nothing else, so both stores build a
// QueueEntry from its order alone.
func ParseQueueOrder(order string) (since time.Time, fleetRunID string, err error) {
	if len(order) <= queueOrderPrefix || order[3] != '|' || order[24] != '|' {
		return time.Time{}, "", fmt.Errorf("queue order %q: not a QueueOrder", order)
	}
	ns, err := strconv.ParseInt(order[4:24], 10, 64)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("queue order %q: %w", order, err)
	}
	return time.Unix(0, ns).UTC(), order[queueOrderPrefix:], nil
}

// QueueClassMaxBytes bounds a waiting run's Class: the index keys a run
// by its class and order together, and DynamoDB bounds a sort key to
// 1,024 bytes. Fleet refuses a longer class before it writes the run.
const QueueClassMaxBytes = 768

// QueueHostsMax bounds QueueInfo.Hosts: each is in the run's index entry,
// a few hundred bytes at most (a wider scope is not indexed: Fleet leaves
// Hosts nil).
const QueueHostsMax = 16

// QueueClassSeparator ends a class in the index key (class, separator,
// order): a class never holds it (fleet.ClassOf escapes it), so each
// class's entries are one contiguous range that no other class's share.
const QueueClassSeparator = "#"

// CheckRun refuses a run that no store may write, whatever is stored
// (both stores call it on CreateRun and UpdateRun): a queued run has no
// host and has its QueueInfo, not started; a waiting run's QueueInfo can
// be indexed (a class of at most QueueClassMaxBytes without
// QueueClassSeparator, a priority within bounds, a Since after 1970).
func CheckRun(r Run) error {
	if r.Status == StatusQueued {
		switch {
		case r.HostID != "":
			return fmt.Errorf("run %q: a queued run has no host (got %q)", r.FleetRunID, r.HostID)
		case r.Queue == nil || r.Queue.StartedAt != nil:
			return fmt.Errorf("run %q: a queued run needs its queue info, not started", r.FleetRunID)
		}
	}
	if !r.Waiting() {
		return nil
	}
	q := r.Queue
	switch {
	case q.Class == "" || len(q.Class) > QueueClassMaxBytes || strings.Contains(q.Class, QueueClassSeparator):
		return fmt.Errorf("run %q: queue class of %d bytes: want 1 to %d, without %q", r.FleetRunID, len(q.Class), QueueClassMaxBytes, QueueClassSeparator)
	case q.Priority < QueuePriorityMin || q.Priority > QueuePriorityMax:
		return fmt.Errorf("run %q: queue priority %d outside %d..%d", r.FleetRunID, q.Priority, QueuePriorityMin, QueuePriorityMax)
	case q.Since.UnixNano() <= 0:
		return fmt.Errorf("run %q: queue since %v: want a time after 1970", r.FleetRunID, q.Since)
	case q.Hosts != nil && (len(q.Hosts) == 0 || len(q.Hosts) > QueueHostsMax):
		return fmt.Errorf("run %q: %d queue hosts: want nil or 1 to %d", r.FleetRunID, len(q.Hosts), QueueHostsMax)
	}
	for _, h := range q.Hosts {
		if h == "" || strings.Contains(h, ",") {
			return fmt.Errorf("run %q: a queue host of %d bytes: want a host id, without \",\"", r.FleetRunID, len(h))
		}
	}
	return nil
}

// UpdatedHost is the HostID an UpdateRun of r over stored keeps, by the
// rule both stores implement (Runs.UpdateRun): a queued r has none; an
// empty r.HostID otherwise keeps the stored one; the host changes only
// on a run stored dispatching or queued; and a run that is neither
// queued nor ended needs one. Anything else is ErrConflict (the stored
// run moved on from what r was read from). r passed CheckRun.
func UpdatedHost(stored, r Run) (string, error) {
	movable := stored.Status == StatusDispatching || stored.Status == StatusQueued
	host := r.HostID
	if host == "" && r.Status != StatusQueued {
		host = stored.HostID
	}
	switch {
	case host != stored.HostID && !movable:
		return "", fmt.Errorf("run %q is %s on %q: its host is fixed: %w", r.FleetRunID, stored.Status, stored.HostID, ErrConflict)
	case host == "" && r.Status != StatusQueued && !Terminal(r.Status):
		return "", fmt.Errorf("run %q is %s without a host: it cannot be %s without one: %w", r.FleetRunID, stored.Status, r.Status, ErrConflict)
	}
	return host, nil
}

// QueueEntry is one waiting run as the index holds it.
type QueueEntry struct {
	FleetRunID string
	Order      string
	Since      time.Time
	// Until is the run's QueueInfo.Until: the sweep times queued runs out
	// from the index alone, reading a run only when its Until passed.
	Until time.Time
	// Hosts is the run's QueueInfo.Hosts.
	Hosts []string
}

// QueueHead is a class with waiting runs and its first entry.
type QueueHead struct {
	Class string
	Head  QueueEntry
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
