// Package store owns Fleet's persistent state: hosts with their last probe,
// callers, idempotency items, runs and their mirrored events, the sweep's
// cursor, stream leases and the routing view. For each kind it defines the
// records and a role interface with its contract (Hosts, Callers,
// IdempotencyKeys, Runs, Events, Egress, SweepCursorStore, StreamLeases,
// RouteStore, BrokerStates, Queue), one file per kind; Store is their union. dynamostore
// (production) and boltstore (the local stack) implement every role, and
// tests/kit/storetest is the contract both pass, role by role.
//
// Every role also promises this. Implementations are safe for concurrent
// use and honour ctx. They read the time from an injected clock.Clock: an
// item whose ExpiresAt has passed (Expired) reads as absent, whatever the
// backend's TTL sweeper has done (moto and DynamoDB alike may keep it for a
// while), and a write treats it as absent too. Times come back in UTC;
// every ExpiresAt is stored as RoundExpiry(ExpiresAt). Errors wrap the
// sentinels below. Every invariant is enforced by a conditional write
// inside the store, never by a read followed by a write in the caller.
//
// The records are the store's own, apart from the host protocol's wire
// types (shared/hostproto, which this package and its implementations never
// import): a protocol change is never a data migration. Fleet maps one to
// the other in one place (shared/fleet, records.go).
package store

import (
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

// Store is every role together: Fleet's state as the domain (shared/fleet)
// uses it, whole. A component that needs only part of the store takes only
// that role (the stream its StreamLeases); a new record kind is a role of
// its own, embedded here, with its contract cases in tests/kit/storetest.
type Store interface {
	Hosts
	Callers
	IdempotencyKeys
	Runs
	Events
	Egress
	SweepCursorStore
	StreamLeases
	RouteStore
	BrokerStates
	Queue
}
