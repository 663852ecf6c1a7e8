package store

import "context"

type eventualReadKey struct{}

// EventualRead marks ctx so that the single-item reads made with it (GetRun,
// GetIdempotency, GetHost) may be eventually consistent. A store that can serve such
// a read cheaper that way does (DynamoDB: half the read units); a store that
// is always consistent (bbolt) ignores the mark. Callers use it only where a
// conditional write, not the read, guards the invariant, and where a stale
// answer is harmless: dispatch's reuse check (a missed idempotency item is
// caught by PutIdempotency's condition; a stale run answers 409 "in flight"
// or a reused run's previous state), and a listing's refresh of its live
// runs (a host read a moment stale at worst fails to reach the host, and the
// run shows as recorded).
func EventualRead(ctx context.Context) context.Context {
	return context.WithValue(ctx, eventualReadKey{}, true)
}

// AllowsEventualRead reports whether ctx carries EventualRead's mark.
func AllowsEventualRead(ctx context.Context) bool {
	v, _ := ctx.Value(eventualReadKey{}).(bool)
	return v
}
