package fleet

import (
	"context"

	"github.com/runfleet/runfleet/shared/broker"
)

// Broker mints the values of a run's brokered keys (package broker; nil
// Config.Broker: no key is brokered, every key keeps its host's value).
type Broker interface {
	// Kind reports the recipe kind of projectID/key; ok false when there
	// is no recipe for it.
	Kind(projectID, key string) (kind string, ok bool)
	// Mint returns a value for req's key (errors are *broker.Error).
	Mint(ctx context.Context, req broker.MintRequest) (broker.Minted, error)
	// Revoke revokes a run's own value (broker.Minted.Sealed).
	Revoke(ctx context.Context, projectID, key string, sealed []byte) error
}
