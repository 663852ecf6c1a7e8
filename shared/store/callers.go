package store

import (
	"context"
	"slices"
	"time"
)

// Callers are the API's callers, each kept as two items written and removed
// together: one by ownerId, one by token hash (the token itself is never
// stored). CallerByTokenHash reads strongly consistent, so a deleted
// caller's token stops working at once.
type Callers interface {
	// CreateCaller writes the caller's owner and token items together;
	// ErrExists if the ownerId (or the token hash) is taken.
	CreateCaller(ctx context.Context, c Caller) error
	// CallerByTokenHash looks a caller up by token hash; ErrNotFound.
	CallerByTokenHash(ctx context.Context, tokenHash string) (Caller, error)
	// ListCallers returns every caller, ordered by ownerId.
	ListCallers(ctx context.Context) ([]Caller, error)
	// DeleteCaller removes both items together; ErrNotFound.
	DeleteCaller(ctx context.Context, ownerID string) error
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
