package store

import (
	"context"
	"strconv"
	"time"
)

// StreamLeases is the per-caller cap on open streams, counted across the
// stream function's instances: each open stream holds one of its caller's
// slots (StreamLease), renewed while it runs and released when it ends, and
// a slot whose holder stops renewing (a crashed stream) frees itself at its
// ExpiresAt. The stream takes its leases through this role alone
// (stream.Config.Leases).
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

// StreamLease is one of a caller's stream slots, held by one open stream.
// It lives in the idempotency table's keyspace as StreamLeaseKey(OwnerID,
// Slot): Fleet-internal ids begin with "#", which no "<ownerId>#<key>" does.
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
