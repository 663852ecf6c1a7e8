package store

import (
	"context"
	"time"
)

// BrokerStates keeps what Fleet's broker shares across every invocation for
// one fleet-wide credential (an OAuth2 recipe): its rotating refresh token,
// its current access token, both sealed (encrypted by the broker's sealer,
// never plain text), and the lease that lets one refresher at a time act
// for the whole fleet. One item per credential, BrokerStateKey(ID) in the
// idempotency table.
type BrokerStates interface {
	// GetBrokerState reads the credential's state, strongly consistent;
	// ErrNotFound when there is none yet.
	GetBrokerState(ctx context.Context, id string) (BrokerState, error)
	// AcquireBrokerLease takes the credential's lease for holder until
	// until, in one conditional write, when no lease is held, the held one
	// has expired at the store's now, or holder holds it already; a first
	// acquire creates the item at Generation 0 with no tokens. It returns
	// the state as stored. When another holder's lease is current it
	// changes nothing and returns that state with ErrConflict.
	AcquireBrokerLease(ctx context.Context, id, holder string, until time.Time) (BrokerState, error)
	// CommitBrokerState stores s's tokens, expiry and seed as Generation
	// s.Generation+1 when the stored Generation still equals s.Generation
	// (a stale writer, whose generation moved on, can never overwrite a
	// newer token), and releases the lease if s.LeaseHolder holds it. It
	// returns what it stored; ErrConflict when the generation moved on,
	// ErrNotFound when there is no item.
	CommitBrokerState(ctx context.Context, s BrokerState) (BrokerState, error)
	// ReleaseBrokerLease frees the lease if holder holds it; otherwise it
	// changes nothing, without an error.
	ReleaseBrokerLease(ctx context.Context, id, holder string) error
}

// BrokerStateKey is a credential's item id in the idempotency table: "#"
// never begins an idempotency key.
func BrokerStateKey(id string) string { return "#broker#" + id }

// BrokerState is one fleet-wide brokered credential.
type BrokerState struct {
	// ID names the credential: "<project>/<KEY>".
	ID string
	// Generation counts committed refreshes; 0 before the first.
	Generation int64
	// SealedRefreshToken and SealedAccessToken are sealed by the broker's
	// sealer, bound to ID; nil before the first refresh.
	SealedRefreshToken []byte
	SealedAccessToken  []byte
	// AccessExpiresAt is when the access token stops being honoured.
	AccessExpiresAt time.Time
	// Seed fingerprints the configured refresh token the stored family
	// descends from (not the token: a keyed digest of it), so that an
	// operator who stores a new one is noticed and the family restarts
	// from it.
	Seed string
	// LeaseHolder holds the lease until LeaseExpiresAt; empty: free.
	LeaseHolder    string
	LeaseExpiresAt time.Time
	// UpdatedAt is the store's now at the item's last write (an acquire,
	// a commit or a release).
	UpdatedAt time.Time
}

// BrokeredKey is one brokered key of a run (Run.Brokered): what Fleet
// minted for it and sent to the run's host.
type BrokeredKey struct {
	ProjectID string
	Key       string
	// Kind is the recipe's kind (broker.KindGitHubApp, broker.KindOAuth2).
	Kind string
	// ExpiresAt is when the value the host holds stops being honoured;
	// Fleet sends a fresh one before.
	ExpiresAt time.Time
	// Sealed is the run's own value, sealed, when Fleet must act on it
	// later (a GitHub token is revoked when the run ends); nil for a value
	// shared by the fleet (OAuth2). Never plain text.
	Sealed []byte
	// RevokedAt is when Fleet revoked Sealed's value; nil: not yet.
	RevokedAt *time.Time
}
