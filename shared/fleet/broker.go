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
	// Revoke revokes a run's own value (broker.Minted.Sealed) given the
	// request that minted it: the value is sealed bound to the run and
	// the key, so a sealed value copied into another run's record cannot
	// be opened (nor revoked) there.
	Revoke(ctx context.Context, req broker.MintRequest, sealed []byte) error
}
