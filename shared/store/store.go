// Package store owns Fleet's persistent state: hosts with their last probe,
// callers, runs and their mirrored events, and idempotency items. It defines
// the records and the Store interface; dynamostore (production) and boltstore
// (the local stack) implement it, and tests/kit/storetest is the contract
// both pass.
//
// The records are the store's own, apart from the host protocol's wire
// types (shared/hostproto, which this package and its implementations never
// import): a protocol change is never a data migration. Fleet maps one to
// the other in one place (shared/fleet, records.go).
//
// Every invariant is enforced by a conditional write inside the store, never
// by a read followed by a write in the caller.
package store

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors. Implementations wrap them; callers test with errors.Is.
var (
	// ErrNotFound: the item does not exist (or has expired).
	ErrNotFound = errors.New("not found")
	// ErrExists: a create found the key taken.
	ErrExists = errors.New("already exists")
	// ErrConflict: a conditional update lost a race (the version moved on).
	ErrConflict = errors.New("conflict")
	// ErrInUse: a host is still referenced by runs.
	ErrInUse = errors.New("in use")
	// ErrBadCursor: a list cursor that this store did not issue.
	ErrBadCursor = errors.New("invalid cursor")
)

// Page sizes for ListRuns, ListLive and ListEvents: a limit of zero or less
// means DefaultLimit, one above MaxLimit is clamped to it (PageLimit).
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// PageLimit returns the page size a store uses for a requested limit.
func PageLimit(n int) int {
	switch {
	case n <= 0:
		return DefaultLimit
	case n > MaxLimit:
		return MaxLimit
	}
	return n
}

// RoundExpiry is how every store keeps an ExpiresAt: in UTC, rounded up to
// the whole second, because DynamoDB's TTL attribute holds epoch seconds and
// both stores must read back the same value. The zero time stays zero.
func RoundExpiry(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	r := t.UTC().Truncate(time.Second)
	if r.Before(t) {
		r = r.Add(time.Second)
	}
	return r
}

// Expired reports whether an item with this ExpiresAt reads as absent at
// now: from the ExpiresAt instant on. A zero ExpiresAt never expires.
func Expired(expiresAt, now time.Time) bool {
	return !expiresAt.IsZero() && !now.Before(expiresAt)
}

// Store is Fleet's state. Implementations are safe for concurrent use and
// honour ctx. They read the time from an injected clock.Clock: an item whose
// ExpiresAt has passed (Expired) reads as absent, whatever the backend's TTL
// sweeper has done (moto and DynamoDB alike may keep it for a while), and a
// write treats it as absent too. Times come back in UTC; every ExpiresAt is
// stored as RoundExpiry(ExpiresAt).
type Store interface {
	// CreateHost adds h; ErrExists if the id is taken.
	CreateHost(ctx context.Context, h Host) error
	// GetHost returns the host with its last probe; ErrNotFound.
	GetHost(ctx context.Context, id string) (Host, error)
	// ListHosts returns every host, ordered by id.
	ListHosts(ctx context.Context) ([]Host, error)
	// SetHostEnabled flips enabled; ErrNotFound.
	SetHostEnabled(ctx context.Context, id string, enabled bool) (Host, error)
	// RecordProbe stores p as the host's last probe; ErrNotFound if the host is gone.
	RecordProbe(ctx context.Context, id string, p Probe) error
	// DeleteHost removes a host in bounded, resumable steps. One call deletes
	// at most DeleteHostRunsPerStep of the host's runs, each with its
	// events (a store may stop sooner: dynamostore after about
	// DeleteHostEventsPerStep events), and answers Done false while runs
	// remain; the call that finds none left removes the host too and
	// answers Done true. A run's events go before the run and the host goes
	// last, so a call cut short anywhere loses nothing a repeat cannot
	// finish. Without force it fails with ErrInUse while an unexpired run
	// references the host (expired runs never block it and are deleted
	// like the others). ErrNotFound if absent.
	DeleteHost(ctx context.Context, id string, force bool) (HostDeletion, error)

	// CreateCaller writes the caller's owner and token items together;
	// ErrExists if the ownerId (or the token hash) is taken.
	CreateCaller(ctx context.Context, c Caller) error
	// CallerByTokenHash looks a caller up by token hash; ErrNotFound.
	CallerByTokenHash(ctx context.Context, tokenHash string) (Caller, error)
	// ListCallers returns every caller, ordered by ownerId.
	ListCallers(ctx context.Context) ([]Caller, error)
	// DeleteCaller removes both items together; ErrNotFound.
	DeleteCaller(ctx context.Context, ownerID string) error

	// GetIdempotency returns the item for key; ErrNotFound when absent or expired.
	GetIdempotency(ctx context.Context, key string) (Idempotency, error)
	// PutIdempotency creates the item unless an unexpired one exists; then it
	// returns that one with ErrExists, in the same conditional write. An
	// expired item counts as absent and is replaced.
	PutIdempotency(ctx context.Context, it Idempotency) (Idempotency, error)

	// CreateRun writes a new run (Version 1, whatever r.Version says);
	// ErrExists. FleetRunID, OwnerID, HostID and CreatedAt are required.
	CreateRun(ctx context.Context, r Run) error
	// GetRun reads a run; ErrNotFound.
	GetRun(ctx context.Context, id string) (Run, error)
	// UpdateRun replaces the run if its stored Version still equals r.Version,
	// storing Version+1 and returning what it stored; ErrConflict when the
	// version moved on, ErrNotFound when the run is gone. The store keeps the
	// live index in step with r.Live(). OwnerID, HostID, CreatedAt and
	// IdempotencyKey are fixed at creation: the stored ones are kept.
	UpdateRun(ctx context.Context, r Run) (Run, error)
	// ListRuns pages runs newest first (CreatedAt, then FleetRunID, descending).
	ListRuns(ctx context.Context, q RunQuery) (RunPage, error)
	// ListLive pages the ids of live runs only, never scanning the rest.
	ListLive(ctx context.Context, cursor string, limit int) (LivePage, error)

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

	// Sweep cursor: where the sweep's walk of the live index stands between
	// invocations, and the lease that lets one sweep at a time move it
	// (SweepCursor). One item, SweepCursorKey in the idempotency table.

	// ClaimSweepCursor takes the lease for holder until leaseUntil, in one
	// conditional write, when no lease is held or the held one has expired
	// at the store's now (or holder already holds it); a first claim
	// creates the cursor at lap 1, starting now. It returns the cursor as
	// stored. When another holder's lease is current it changes nothing
	// and returns that cursor with ErrConflict.
	ClaimSweepCursor(ctx context.Context, holder string, leaseUntil time.Time) (SweepCursor, error)
	// SaveSweepCursor replaces the cursor if its stored Version still
	// equals c.Version (only the lease holder's writes move it, so a
	// holder whose lease was taken over fails), storing Version+1 and
	// returning what it stored; ErrConflict otherwise, ErrNotFound if
	// there is no cursor. Clearing Holder releases the lease.
	SaveSweepCursor(ctx context.Context, c SweepCursor) (SweepCursor, error)
	// LiveCursorAfter is the ListLive cursor that continues after the run
	// id, live or not (the sweep resumes from a run id it stored).
	LiveCursorAfter(fleetRunID string) string

	// Stream leases: the per-caller cap on open streams (see StreamLease).
	StreamLeases

	// Routing view and drain.

	RouteStore
	// RecordDrain records on the host's probe what a drain or resume
	// answered, at once: draining, and idle when the host said (nil: it
	// did not). A host never probed keeps no probe, and none is made.
	// ErrNotFound if the host is gone. The next probe overwrites both.
	RecordDrain(ctx context.Context, id string, draining bool, idle *bool) (Host, error)

	// Host pages: the registry read in bounded pages, for
	// callers that must not read every host at once (the metrics rollup).

	// ListHostsPage returns up to limit hosts (PageLimit applies) that
	// follow the host id after in the store's own order (dynamostore: the
	// table's, which is not sorted; boltstore: by id), and in Next the id to
	// continue after, empty when no host follows. after "" starts at the
	// first. A page may hold fewer than limit hosts while Next is set.
	ListHostsPage(ctx context.Context, after string, limit int) (HostPage, error)
}
