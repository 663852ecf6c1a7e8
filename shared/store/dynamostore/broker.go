package dynamostore

import (
	"context"
	"errors"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// TODO(issue 33, store helper): implement.
var errBrokerTODO = errors.New("dynamostore: broker states not implemented yet")

func (s *Store) GetBrokerState(ctx context.Context, id string) (store.BrokerState, error) {
	return store.BrokerState{}, errBrokerTODO
}

func (s *Store) AcquireBrokerLease(ctx context.Context, id, holder string, until time.Time) (store.BrokerState, error) {
	return store.BrokerState{}, errBrokerTODO
}

func (s *Store) CommitBrokerState(ctx context.Context, st store.BrokerState) (store.BrokerState, error) {
	return store.BrokerState{}, errBrokerTODO
}

func (s *Store) ReleaseBrokerLease(ctx context.Context, id, holder string) error { return errBrokerTODO }
