// Package boltstore owns the bbolt implementation of store.Store: Fleet's
// state in one local file, the local stack's default (RUNFLEET_STORE=bolt:<path>).
//
// Every invariant holds because each mutation runs in one bbolt Update
// transaction (bbolt serialises writers): the check and the write cannot be
// separated by another writer. Secondary orderings (live runs, runs by
// creation, by owner, by host, waiting runs by class) are buckets kept in
// step by the same transaction that writes the run they index.
//
// Layout (bucket: key -> value):
//
//	hosts:                 id -> hostItem
//	callers:               ownerId -> callerItem
//	callerTokens:          tokenHash -> ownerId
//	idempotency:           "ownerId#key" -> idempotencyItem; and the
//	                       "#"-keyed sweep cursor, stream leases and
//	                       broker states (store.BrokerStateKey)
//	runs:                  fleetRunId -> runItem
//	runsLive:              fleetRunId -> "" (the runs whose Live() is true: never a queued one)
//	runsByCreated:         orderKey -> fleetRunId
//	runsByOwner/<ownerId>: orderKey -> fleetRunId
//	runsByHost/<hostId>:   orderKey -> fleetRunId (none while the run has no host)
//	runsQueue/<class>:     store.QueueOrder -> Queue.Until as text (the runs whose Waiting() is true)
//	events/<fleetRunId>:   sequence (8 bytes, big endian) -> eventItem
//	egress/<fleetRunId>:   seq (8 bytes, big endian) -> egressItem
//	egressHeads:           fleetRunId -> egressHeadItem
//	egressAlerted:         alertKey -> fleetRunId
//
// orderKey is CreatedAt (8 bytes, order-preserving) followed by the run id,
// so a bucket's byte order is ListRuns' order reversed; alertKey is the
// same of FirstAlertAt and the run id (ListAlertedRuns' order reversed).
package boltstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
)

var (
	bucketHosts         = []byte("hosts")
	bucketCallers       = []byte("callers")
	bucketCallerTokens  = []byte("callerTokens")
	bucketIdempotency   = []byte("idempotency")
	bucketRuns          = []byte("runs")
	bucketRunsLive      = []byte("runsLive")
	bucketRunsCreated   = []byte("runsByCreated")
	bucketRunsByOwner   = []byte("runsByOwner")
	bucketRunsByHost    = []byte("runsByHost")
	bucketRunsQueue     = []byte("runsQueue")
	bucketEvents        = []byte("events")
	bucketEgress        = []byte("egress")
	bucketEgressHeads   = []byte("egressHeads")
	bucketEgressAlerted = []byte("egressAlerted")

	allBuckets = [][]byte{
		bucketHosts, bucketCallers, bucketCallerTokens, bucketIdempotency, bucketRuns,
		bucketRunsLive, bucketRunsCreated, bucketRunsByOwner, bucketRunsByHost, bucketRunsQueue, bucketEvents,
		bucketEgress, bucketEgressHeads, bucketEgressAlerted,
	}
)

// lockTimeout bounds the wait for the file lock another process holds, so a
// second local stack on the same data dir fails instead of hanging.
const lockTimeout = 5 * time.Second

// Store is the bbolt store. It is safe for concurrent use; Close it when done.
type Store struct {
	db    *bolt.DB
	clock clock.Clock
}

// Store plays every role of the store (store.Store is their union); each
// is checked here so that a role's contract names its implementation.
var (
	_ store.Store            = (*Store)(nil)
	_ store.Hosts            = (*Store)(nil)
	_ store.Callers          = (*Store)(nil)
	_ store.IdempotencyKeys  = (*Store)(nil)
	_ store.Runs             = (*Store)(nil)
	_ store.Events           = (*Store)(nil)
	_ store.Egress           = (*Store)(nil)
	_ store.SweepCursorStore = (*Store)(nil)
	_ store.StreamLeases     = (*Store)(nil)
	_ store.RouteStore       = (*Store)(nil)
	_ store.BrokerStates     = (*Store)(nil)
	_ store.Queue            = (*Store)(nil)
)

// Option configures Open.
type Option func(*Store)

// WithClock sets the clock that decides expiry (default: the wall clock).
func WithClock(c clock.Clock) Option { return func(s *Store) { s.clock = c } }

// Open opens (creating if needed, mode 0600) the bbolt file at path.
func Open(path string, opts ...Option) (*Store, error) {
	s := &Store{clock: clock.Real{}}
	for _, o := range opts {
		o(s)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		return nil, fmt.Errorf("boltstore: opening %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("creating bucket %s: %w", b, err)
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("boltstore: initialising %s: %w", path, err)
	}
	s.db = db
	return s, nil
}

// Close releases the file.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("boltstore: closing: %w", err)
	}
	return nil
}

// update runs fn in one write transaction, after checking ctx: bbolt cannot
// abandon a transaction midway, so ctx is honoured at its start.
func (s *Store) update(ctx context.Context, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(fn)
}

// view runs fn in one read transaction, after checking ctx.
func (s *Store) view(ctx context.Context, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(fn)
}

func (s *Store) now() time.Time { return s.clock.Now() }

// notFound and friends wrap the sentinels with the subject, so a log line
// says what was missing.
func notFound(what, id string) error {
	return fmt.Errorf("boltstore: %s %q: %w", what, id, store.ErrNotFound)
}
func exists(what, id string) error {
	return fmt.Errorf("boltstore: %s %q: %w", what, id, store.ErrExists)
}

// isSentinel reports whether err is one of the store's sentinels, which
// pass through unwrapped by a second "boltstore:" prefix.
func isSentinel(err error) bool {
	return errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrExists) ||
		errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrInUse) ||
		errors.Is(err, store.ErrBadCursor)
}

// wrap adds the operation to an unexpected error (a decode or bbolt fault).
func wrap(op string, err error) error {
	if err == nil || isSentinel(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("boltstore: %s: %w", op, err)
}
