package store

import "time"

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
