// Package store owns Fleet's persistent state: hosts with their last probe,
// callers, runs and their mirrored events, and idempotency items. It defines
// the records and the Store interface; dynamostore (production) and boltstore
// (the local stack) implement it, and storetest is the contract both pass.
//
// Every invariant is enforced by a conditional write inside the store, never
// by a read followed by a write in the caller.
package store

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
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

// Fleet run statuses beyond the host's (hostproto.Status*).
const (
	// StatusDispatching: the run is written, the host has not answered yet.
	StatusDispatching = "dispatching"
	// StatusLost: the host denies the run.
	StatusLost = "lost"
)

// ReasonDispatchLost marks a dispatching run the host never received.
const ReasonDispatchLost = "dispatch_lost"

// Probe statuses.
const (
	ProbeOK          = "ok"
	ProbeAuthFail    = "auth_fail"
	ProbeUnreachable = "unreachable"
	ProbeBadResponse = "bad_response"
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

// Terminal reports whether a Fleet run status is final.
func Terminal(status string) bool {
	return hostproto.TerminalStatus(status) || status == StatusLost
}

// Host is a registered runner host.
type Host struct {
	ID            string            `json:"id"`
	BaseURL       string            `json:"baseUrl"`
	CredentialRef string            `json:"credentialRef"`
	Labels        map[string]string `json:"labels,omitempty"`
	LocalPaths    []string          `json:"localPaths,omitempty"`
	// CAPEM, when set, is trusted (in addition to nothing else) for the host's TLS.
	CAPEM     string    `json:"caPem,omitempty"`
	Enabled   bool      `json:"enabled"`
	CreatedAt time.Time `json:"createdAt"`
	// Probe is the last probe, nil before the first.
	Probe *Probe `json:"probe,omitempty"`
}

// Probe is one probe of a host, as recorded.
type Probe struct {
	Status    string             `json:"status"`
	At        time.Time          `json:"at"`
	LatencyMs int64              `json:"latencyMs"`
	Version   string             `json:"version,omitempty"`
	Agents    []string           `json:"agents,omitempty"`
	Features  hostproto.Features `json:"features"`
	CA        *hostproto.CAInfo  `json:"ca,omitempty"`
	Draining  bool               `json:"draining"`
	// Storage is the host's free space against its reserve; nil from a
	// host older than the field, which routing takes as not low.
	Storage *hostproto.Storage `json:"storage,omitempty"`
	// Limits is how the host bounds each task's resources; nil from a host
	// older than the field. Never an empty Limits: the probe records nil.
	Limits *hostproto.Limits `json:"limits,omitempty"`
	// Detail explains a status other than ok; never carries a credential.
	Detail string `json:"detail,omitempty"`
}

// Scope is an allow list: every id, or the listed ones.
type Scope struct {
	All bool
	IDs []string
}

// Allows reports whether id is in the scope.
func (s Scope) Allows(id string) bool { return s.All || slices.Contains(s.IDs, id) }

// Caller is an API caller, found by the SHA-256 of its token. The token itself
// is never stored.
type Caller struct {
	OwnerID string
	// TokenHash is the lowercase hex SHA-256 of the token.
	TokenHash       string
	Admin           bool
	AllowedHosts    Scope
	AllowedProjects Scope
	CreatedAt       time.Time
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
	// Version increments on every write; UpdateRun is conditional on it.
	Version int64
}

// Live reports whether the run belongs in the live index: not terminal, or
// terminal with events still to mirror.
func (r Run) Live() bool { return !Terminal(r.Status) || !r.Drained }

// Event is one mirrored host event.
type Event struct {
	FleetRunID string
	hostproto.Event
	// ExpiresAt is the TTL.
	ExpiresAt time.Time
}

// Idempotency binds (ownerId, key) to the run it created.
type Idempotency struct {
	// Key is "ownerId#key".
	Key         string
	FleetRunID  string
	RequestHash string
	CreatedAt   time.Time
	ExpiresAt   time.Time
}

// DeleteHost's bounds on one call (one step).
const (
	// DeleteHostRunsPerStep bounds the runs one DeleteHost call deletes.
	DeleteHostRunsPerStep = 100
	// DeleteHostEventsPerStep bounds, roughly, the events one call deletes
	// in a store that deletes them one item at a time: a run whose events
	// would take the step past it is left (its events partly deleted) for
	// the next call.
	DeleteHostEventsPerStep = 2000
)

// HostDeletion is what one DeleteHost call did.
type HostDeletion struct {
	// Done: the host is gone, and so is every run that referenced it.
	Done bool
	// RunsDeleted counts the runs this call deleted.
	RunsDeleted int
}

// RunQuery selects runs for listing, newest first.
type RunQuery struct {
	// OwnerID limits to one owner. With HostID empty too, the listing is
	// every run (dynamostore reads its "all" index, boltstore its creation
	// order).
	OwnerID string
	// HostID limits to one host. Setting both OwnerID and HostID is not
	// supported (neither store has an index for it); ListRuns refuses it.
	// Empty: any host.
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

// EventPage is one page of a run's mirror.
type EventPage struct {
	Events  []Event
	HasMore bool
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

	// Host pages: the registry read in bounded pages (issue 15), for
	// callers that must not read every host at once (the metrics rollup).

	// ListHostsPage returns up to limit hosts (PageLimit applies) that
	// follow the host id after in the store's own order (dynamostore: the
	// table's, which is not sorted; boltstore: by id), and in Next the id to
	// continue after, empty when no host follows. after "" starts at the
	// first. A page may hold fewer than limit hosts while Next is set.
	ListHostsPage(ctx context.Context, after string, limit int) (HostPage, error)
}

// HostPage is one page of ListHostsPage.
type HostPage struct {
	Hosts []Host
	// Next is the after of the next page; empty when there is none.
	Next string
}
