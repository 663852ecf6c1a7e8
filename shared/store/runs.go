package store

import (
	"context"
	"time"
)

// Runs are Fleet's runs, each bound to a host, and the live index: the
// runs not queued and not ended, or ended with events still to mirror
// (Run.Live), which
// the store keeps in step with every write and the sweep walks without
// scanning the rest. GetRun may read eventually consistent under
// EventualRead.
type Runs interface {
	// CreateRun writes a new run (Version 1, whatever r.Version says);
	// ErrExists. FleetRunID, OwnerID, HostID and CreatedAt are required;
	// HostID is empty exactly when Status is StatusQueued (CheckRun). The
	// run enters the live index when Live (not queued) and the queue
	// index when Waiting.
	CreateRun(ctx context.Context, r Run) error
	// GetRun reads a run; ErrNotFound.
	GetRun(ctx context.Context, id string) (Run, error)
	// UpdateRun replaces the run if its stored Version still equals r.Version,
	// storing Version+1 and returning what it stored; ErrConflict when the
	// version moved on, ErrNotFound when the run is gone. The store keeps the
	// live index in step with r.Live(). OwnerID, CreatedAt, IdempotencyKey
	// and Repository are fixed at creation: the stored ones are kept.
	// HostID changes only on a run stored dispatching (a dispatch moving
	// it past a host that refused it) or queued (a dispatcher offering it
	// to a host, or taking it back: HostID empty exactly when the new
	// Status is StatusQueued); on any other run a different HostID is
	// ErrConflict. An empty HostID with another status keeps the stored
	// one; a run that never had one (queued, then ended: canceled or
	// timed out) may end without, and any other status without a host is
	// ErrConflict (UpdatedHost states the rule; CheckRun what is refused
	// whatever is stored). The by-host listing follows the change (a run
	// without a host is listed under none), and the queue index follows
	// Waiting().
	UpdateRun(ctx context.Context, r Run) (Run, error)
	// ListRuns pages runs newest first (CreatedAt, then FleetRunID, descending).
	ListRuns(ctx context.Context, q RunQuery) (RunPage, error)
	// ListLive pages the ids of live runs only, never scanning the rest.
	ListLive(ctx context.Context, cursor string, limit int) (LivePage, error)
	// LiveCursorAfter is the ListLive cursor that continues after the run
	// id, live or not (the sweep resumes from a run id it stored).
	LiveCursorAfter(fleetRunID string) string
}

// Run statuses: the host's, recorded as the host reports them (the host
// protocol's names), then Fleet's own.
const (
	StatusPending   = "pending"
	StatusAdmitted  = "admitted"
	StatusRunning   = "running"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusCanceled  = "canceled"
	// StatusDispatching: the run is written, the host has not answered yet.
	StatusDispatching = "dispatching"
	// StatusLost: the host denies the run.
	StatusLost = "lost"
)

// ReasonDispatchLost marks a dispatching run the host never received.
const ReasonDispatchLost = "dispatch_lost"

// Terminal reports whether a Fleet run status is final.
func Terminal(status string) bool {
	switch status {
	case StatusSucceeded, StatusFailed, StatusCanceled, StatusLost:
		return true
	}
	return false
}

// Run is Fleet's binding of a run to a host, with its last known state.
type Run struct {
	FleetRunID string
	OwnerID    string
	HostID     string
	// ChildRunID is the host's runId, once the host answered.
	ChildRunID string
	Status     string
	Attempt    int
	ExitCode   *int
	Reason     string
	// Detail is the human explanation of Reason (a refusal names what to
	// change); Fleet bounds it to a kilobyte.
	Detail string
	Agent  string
	// Repository is the run request's repository as the caller named it
	// (a URL's password redacted, see fleet.Dispatch); empty: none, or a
	// run recorded before runs kept it.
	Repository string
	// IdempotencyKey is the caller's key, if any.
	IdempotencyKey string
	// RewroteLocalPath records that the localPath was replaced by a clone URL.
	RewroteLocalPath bool
	CreatedAt        time.Time
	UpdatedAt        time.Time
	// Deadline is when the host must have received the start (dispatch).
	Deadline time.Time
	EndedAt  *time.Time
	// EventCursor is the sequence of the last mirrored event.
	EventCursor int64
	// Drained: terminal and the final event is mirrored; the run leaves the live index.
	Drained bool
	// ExpiresAt is the TTL (retention after the end); zero while live.
	ExpiresAt time.Time
	// EventsExpireAfter is a lower bound of its events' expiry, kept by
	// Fleet so that a run's events outlive it; zero: none recorded.
	EventsExpireAfter time.Time
	// Brokered are the run's keys whose values Fleet minted (DESIGN.md,
	// "Credentials Fleet mints"); nil when none.
	Brokered []BrokeredKey
	// Queue is the run's wait for capacity (queue.go); nil for a run that
	// never waited. HostID is empty while it is queued, and stays empty if
	// it ends before a host is offered it.
	Queue *QueueInfo
	// Version increments on every write; UpdateRun is conditional on it.
	Version int64
}

// Live reports whether the run belongs in the live index: not terminal, or
// terminal with events still to mirror; never queued (no host has it, so
// the sweep has nothing to sync: a queued run is found through the queue
// index, whose entries carry Until for its timeout).
func (r Run) Live() bool {
	return r.Status != StatusQueued && (!Terminal(r.Status) || !r.Drained)
}

// RunQuery selects runs for listing, newest first.
type RunQuery struct {
	// OwnerID limits to one owner. With HostID empty too, the listing is
	// every run (dynamostore reads its "all" index, boltstore its creation
	// order).
	OwnerID string
	// HostID limits to one host. Setting both OwnerID and HostID is not
	// supported (neither store has an index for it); ListRuns refuses it.
	// Empty: any host (and runs without one: queued, or ended before a
	// host was offered them).
	HostID string
	// Cursor continues a previous page of the same query (same OwnerID and
	// HostID); empty starts at the newest. Any other cursor is ErrBadCursor.
	Cursor string
	// Limit is the page size (PageLimit applies).
	Limit int
}

// RunPage is one page of runs.
type RunPage struct {
	Runs []Run
	// NextCursor continues after the last run; empty when there is no more.
	NextCursor string
}

// LivePage is one page of the live index.
type LivePage struct {
	FleetRunIDs []string
	NextCursor  string
}
