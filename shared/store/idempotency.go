package store

import "time"

// Idempotency binds (ownerId, key) to the run it created.
type Idempotency struct {
	// Key is "ownerId#key".
	Key         string
	FleetRunID  string
	RequestHash string
	CreatedAt   time.Time
	ExpiresAt   time.Time
}
