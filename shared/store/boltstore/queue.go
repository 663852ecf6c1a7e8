package boltstore

import (
	"context"
	"errors"

	"github.com/runfleet/runfleet/shared/store"
)

// errQueueTODO marks the queue index before it is built (issue 34).
var errQueueTODO = errors.New("boltstore: the queue index is not built yet")

// QueueClasses implements store.Queue.
func (s *Store) QueueClasses(ctx context.Context) ([]string, error) { return nil, errQueueTODO }

// ListQueue implements store.Queue.
func (s *Store) ListQueue(ctx context.Context, class, after string, limit int) (store.QueuePage, error) {
	return store.QueuePage{}, errQueueTODO
}

// QueueAhead implements store.Queue.
func (s *Store) QueueAhead(ctx context.Context, class, order string) (int, error) {
	return 0, errQueueTODO
}

// QueueStats implements store.Queue.
func (s *Store) QueueStats(ctx context.Context, class string) (store.QueueStats, error) {
	return store.QueueStats{}, errQueueTODO
}
