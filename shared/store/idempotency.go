package store

import (
	"context"
	"time"
)

// IdempotencyKeys binds each caller's idempotency key to the run its first
// request created, until the binding expires: of concurrent puts of one key
// exactly one wins, and each other learns the winner from its own
// conditional write. GetIdempotency may read eventually consistent under
// EventualRead (PutIdempotency's condition, not the read, guards the key).
type IdempotencyKeys interface {
	// GetIdempotency returns the item for key; ErrNotFound when absent or expired.
	GetIdempotency(ctx context.Context, key string) (Idempotency, error)
	// PutIdempotency creates the item unless an unexpired one exists; then it
	// returns that one with ErrExists, in the same conditional write. An
	// expired item counts as absent and is replaced.
	PutIdempotency(ctx context.Context, it Idempotency) (Idempotency, error)
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
