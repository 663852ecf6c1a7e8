package store

import (
	"slices"
	"time"
)

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
