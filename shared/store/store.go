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
	"encoding/json"
	"errors"
	"slices"
	"strconv"
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
	switch status {
	case StatusSucceeded, StatusFailed, StatusCanceled, StatusLost:
		return true
	}
	return false
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
	Status    string    `json:"status"`
	At        time.Time `json:"at"`
	LatencyMs int64     `json:"latencyMs"`
	Version   string    `json:"version,omitempty"`
	Agents    []string  `json:"agents,omitempty"`
	Features  Features  `json:"features"`
	CA        *CAInfo   `json:"ca,omitempty"`
	Draining  bool      `json:"draining"`
	// Idle is whether the host runs no task, when it says (nil: a host
	// older than the field). A draining host that is idle can be
	// suspended ("suspend only when idle").
	Idle *bool `json:"idle,omitempty"`
	// Storage is the host's free space against its reserve; nil from a
	// host older than the field, which routing takes as not low.
	Storage *Storage `json:"storage,omitempty"`
	// Limits is how the host bounds each task's resources; nil from a host
	// older than the field. Never an empty Limits: the probe records nil.
	Limits *Limits `json:"limits,omitempty"`
	// Detail explains a status other than ok; never carries a credential.
	Detail string `json:"detail,omitempty"`
}

// Features are what a host can do for a run that declares secrets; routing
// sends such a run only where both are true.
type Features struct {
	SecretsProxy bool `json:"secretsProxy"`
	ExecRequire  bool `json:"execRequire"`
}

// CAInfo dates the host's proxy CA.
type CAInfo struct {
	NotAfter          time.Time  `json:"notAfter"`
	SuccessorNotAfter *time.Time `json:"successorNotAfter,omitempty"`
}

// Storage is a host's free space where it records runs, against its
// reserve.
type Storage struct {
	FreeBytes    int64 `json:"freeBytes"`
	MinFreeBytes int64 `json:"minFreeBytes"`
	// Low: FreeBytes is under MinFreeBytes; routing goes around the host.
	Low bool `json:"low"`
}

// Limits are how a host bounds each task's resources.
type Limits struct {
	// Enforced names the mechanism (cgroup2, cgroup1, none, unavailable).
	Enforced string `json:"enforced"`
	// MemoryBytes, Pids and CPU (cores) are each task's limits; zero where
	// that limit is not set.
	MemoryBytes int64   `json:"memoryBytes,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	CPU         float64 `json:"cpu,omitempty"`
	// Detail says why limits are unavailable.
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
	// Sequence numbers a run's events from 1, contiguous across attempts.
	Sequence int64
	Type     string
	// Data is the event's JSON value, as the host sent it.
	Data json.RawMessage
	TS   time.Time
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

// SweepCursorKey is the sweep cursor's id in the idempotency table: "#"
// never begins an idempotency key, so it cannot collide with one.
const SweepCursorKey = "#sweep"

// SweepCursor is the sweep's position in laps over the live index (in run
// id order). A lap visits every run in the live index from its start to
// its end; the next lap starts over. The lag bound rests on it: a run the
// current lap has not reached yet was visited by the previous lap, or
// created after that lap passed its id, so at or after PrevLapStarted.
type SweepCursor struct {
	// Lap counts laps from 1.
	Lap int64
	// After is the last run id the current lap reached; empty at its start.
	After string
	// LapStarted is when the current lap began.
	LapStarted time.Time
	// PrevLapStarted and PrevLapEnded bound the previous lap; zero during
	// the first.
	PrevLapStarted time.Time
	PrevLapEnded   time.Time
	// Holder is the sweep holding the lease, empty when none; the lease
	// lapses at LeaseUntil.
	Holder     string
	LeaseUntil time.Time
	// Version increments on every write; SaveSweepCursor is conditional
	// on it.
	Version int64
}

// StreamLease is one of a caller's stream slots, held by one open stream
// (a per-caller cap on open streams, counted across the stream
// function's instances). It lives in the idempotency table's
// keyspace as StreamLeaseKey(OwnerID, Slot): Fleet-internal ids begin with
// "#", which no "<ownerId>#<key>" does.
type StreamLease struct {
	OwnerID string
	// Slot is 0..slots-1; AcquireStreamLease chooses it.
	Slot int
	// Holder identifies the stream holding the slot (random, per stream):
	// only its holder renews or releases a slot.
	Holder string
	// ExpiresAt frees the slot if the holder stops renewing (a crashed
	// stream); stored as RoundExpiry(ExpiresAt).
	ExpiresAt time.Time
}

// StreamLeaseKey is the item id of a caller's stream slot.
func StreamLeaseKey(ownerID string, slot int) string {
	return "#stream#" + ownerID + "#" + strconv.Itoa(slot)
}

// MaxStreamSlots bounds the slots AcquireStreamLease looks at (one
// BatchGetItem in DynamoDB).
const MaxStreamSlots = 100

// StreamLeases is the per-caller cap on open streams: a store.Store method
// set of its own, so the stream depends on nothing else of the store.
type StreamLeases interface {
	// AcquireStreamLease takes a free slot among 0..slots-1 (1 <= slots <=
	// MaxStreamSlots) of l.OwnerID for l.Holder until l.ExpiresAt and
	// returns the lease with its Slot. A slot is free when absent or
	// expired. When every slot is held it returns ErrExists with a lease
	// whose ExpiresAt is the earliest of the holders' (when a slot frees
	// itself if its holder stops renewing).
	AcquireStreamLease(ctx context.Context, l StreamLease, slots int) (StreamLease, error)
	// RenewStreamLease sets the expiry of l's slot to l.ExpiresAt while the
	// slot is l.Holder's or free (a lapsed lease nobody took is taken
	// again); ErrExists when another holder has it now.
	RenewStreamLease(ctx context.Context, l StreamLease) error
	// ReleaseStreamLease frees l's slot if l.Holder holds it; a slot that
	// is absent or another's is left as it is, without an error.
	ReleaseStreamLease(ctx context.Context, l StreamLease) error
}

// RouteShardsMax is how many shards a list of the routing view holds at
// most: the hosts that do not fit are left out of it.
const RouteShardsMax = 3

// RouteView is the routing view as the probe pass writes it: for each list
// ("a:<agent>" or "any"), every host in the order routing should consider
// them. The view keeps of each host only what routing decides from (see
// RouteStore); never its address, credential or CA.
type RouteView struct {
	Lists map[string][]Host
	// Total is how many hosts the fleet had when the view was built.
	Total int
	// At is when it was built.
	At time.Time
}

// RouteShard is one shard of a list of the routing view.
type RouteShard struct {
	// Hosts are the shard's entries, in the list's order.
	Hosts []Host
	// Shards is how many shards the list has; Kept how many hosts they
	// hold together; Total how many the fleet had (Kept < Total: the list
	// was truncated).
	Shards, Kept, Total int
	// At is when the view was built.
	At time.Time
}

// RouteStore keeps the routing view: bounded reads for dispatch, in place
// of a scan of every host.
//
// An entry keeps of a Host its ID, Enabled, Labels and LocalPaths and, of
// its probe, Status, At, LatencyMs, Draining, Agents, Features and
// Storage.Low (a Storage holding only Low, nil when not low); a probe that
// is not ok keeps Status and At only. Everything else is left out.
type RouteStore interface {
	// PutRouteView replaces the view: each list's hosts, in order, are
	// packed into at most RouteShardsMax shards of at most 4 KB each (a
	// DynamoDB item an eventually consistent GetItem reads for half a
	// unit); the hosts that do not fit are left out, and so is a host
	// whose entry alone outgrows a shard. Lists of the previous
	// view that v lacks are deleted, and so are shards a list no longer
	// fills. It returns, per list, how many hosts were kept. Lists are
	// written one after the other: a reader may see a list of the new view
	// beside one of the old.
	PutRouteView(ctx context.Context, v RouteView) (map[string]int, error)
	// RouteShard reads shard n of list, eventually consistent; ErrNotFound
	// when the view has no such list or shard.
	RouteShard(ctx context.Context, list string, n int) (RouteShard, error)
}

// HostPage is one page of ListHostsPage.
type HostPage struct {
	Hosts []Host
	// Next is the after of the next page; empty when there is none.
	Next string
}
