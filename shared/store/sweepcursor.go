package store

import (
	"context"
	"time"
)

// SweepCursorStore keeps the sweep cursor: where the sweep's walk of the
// live index stands between invocations, and the lease that lets one sweep
// at a time move it (SweepCursor). One item, SweepCursorKey in the
// idempotency table.
type SweepCursorStore interface {
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
