package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/internal/cursor"
)

// GetIdempotency returns the item for key; ErrNotFound when absent or expired.
func (s *Store) GetIdempotency(ctx context.Context, key string) (store.Idempotency, error) {
	now := s.now()
	var it idempotencyItem
	err := s.view(ctx, func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketIdempotency).Get([]byte(key))
		if v == nil {
			return notFound("idempotency key", key)
		}
		var err error
		if it, err = decode[idempotencyItem](v); err != nil {
			return err
		}
		if store.Expired(expiryTime(it.ExpiresAt), now) {
			return notFound("idempotency key", key)
		}
		return nil
	})
	if err != nil {
		return store.Idempotency{}, wrap("get idempotency", err)
	}
	return it.record(), nil
}

// PutIdempotency creates the item unless an unexpired one holds the key; then
// it returns that one with ErrExists. The check and the write share one
// transaction.
func (s *Store) PutIdempotency(ctx context.Context, i store.Idempotency) (store.Idempotency, error) {
	if i.Key == "" {
		return store.Idempotency{}, errors.New("boltstore: put idempotency: empty key")
	}
	now := s.now()
	var existing *idempotencyItem
	err := s.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketIdempotency)
		if v := b.Get([]byte(i.Key)); v != nil {
			it, err := decode[idempotencyItem](v)
			if err != nil {
				return err
			}
			if !store.Expired(expiryTime(it.ExpiresAt), now) {
				existing = &it
				return exists("idempotency key", i.Key)
			}
		}
		return putItem(b, []byte(i.Key), toIdempotencyItem(i))
	})
	if existing != nil {
		return existing.record(), err
	}
	if err != nil {
		return store.Idempotency{}, wrap("put idempotency", err)
	}
	return toIdempotencyItem(i).record(), nil
}

// CreateRun writes a new run at Version 1 with its index entries; ErrExists
// if an unexpired run holds the id (an expired one is replaced).
func (s *Store) CreateRun(ctx context.Context, r store.Run) error {
	if r.FleetRunID == "" || r.OwnerID == "" || (r.HostID == "" && r.Status != store.StatusQueued) || r.CreatedAt.IsZero() {
		return errors.New("boltstore: create run: fleetRunId, ownerId, hostId (unless queued) and createdAt are required")
	}
	if err := store.CheckRun(r); err != nil {
		return fmt.Errorf("boltstore: create run: %w", err)
	}
	now := s.now()
	err := s.update(ctx, func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketRuns).Get([]byte(r.FleetRunID)); v != nil {
			old, err := decode[runItem](v)
			if err != nil {
				return err
			}
			if !store.Expired(expiryTime(old.ExpiresAt), now) {
				return exists("run", r.FleetRunID)
			}
			if err := deleteRun(tx, r.FleetRunID); err != nil {
				return err
			}
		}
		it := toRunItem(r)
		it.Version = 1
		if err := putItem(tx.Bucket(bucketRuns), []byte(it.FleetRunID), it); err != nil {
			return err
		}
		key := orderKey(it.CreatedAt, it.FleetRunID)
		id := []byte(it.FleetRunID)
		if err := tx.Bucket(bucketRunsCreated).Put(key, id); err != nil {
			return err
		}
		owner, err := tx.Bucket(bucketRunsByOwner).CreateBucketIfNotExists([]byte(it.OwnerID))
		if err != nil {
			return err
		}
		if err := owner.Put(key, id); err != nil {
			return err
		}
		if err := moveByHost(tx, it.CreatedAt, it.FleetRunID, "", it.HostID); err != nil {
			return err
		}
		if err := setQueue(tx, nil, it); err != nil {
			return err
		}
		return setLive(tx, it)
	})
	return wrap("create run", err)
}

// GetRun reads a run; ErrNotFound when absent or expired.
func (s *Store) GetRun(ctx context.Context, id string) (store.Run, error) {
	now := s.now()
	var r store.Run
	err := s.view(ctx, func(tx *bolt.Tx) error {
		it, err := getRun(tx, id)
		if err != nil {
			return err
		}
		if store.Expired(expiryTime(it.ExpiresAt), now) {
			return notFound("run", id)
		}
		r = it.record()
		return nil
	})
	return r, wrap("get run", err)
}

// UpdateRun replaces the run if its stored Version equals r.Version; its
// host by store.UpdatedHost.
func (s *Store) UpdateRun(ctx context.Context, r store.Run) (store.Run, error) {
	if err := store.CheckRun(r); err != nil {
		return store.Run{}, fmt.Errorf("boltstore: update run: %w", err)
	}
	now := s.now()
	var stored store.Run
	err := s.update(ctx, func(tx *bolt.Tx) error {
		old, err := getRun(tx, r.FleetRunID)
		if err != nil {
			return err
		}
		if store.Expired(expiryTime(old.ExpiresAt), now) {
			return notFound("run", r.FleetRunID)
		}
		if old.Version != r.Version {
			return fmt.Errorf("boltstore: run %q is at version %d, not %d: %w", r.FleetRunID, old.Version, r.Version, store.ErrConflict)
		}
		it := toRunItem(r)
		it.OwnerID, it.CreatedAt, it.IdempotencyKey, it.Repository = old.OwnerID, old.CreatedAt, old.IdempotencyKey, old.Repository
		if it.HostID, err = store.UpdatedHost(old.record(), r); err != nil {
			return fmt.Errorf("boltstore: %w", err)
		}
		it.Version = old.Version + 1
		if err := putItem(tx.Bucket(bucketRuns), []byte(it.FleetRunID), it); err != nil {
			return err
		}
		if it.HostID != old.HostID {
			if err := moveByHost(tx, old.CreatedAt, old.FleetRunID, old.HostID, it.HostID); err != nil {
				return err
			}
		}
		if err := setQueue(tx, &old, it); err != nil {
			return err
		}
		stored = it.record()
		return setLive(tx, it)
	})
	return stored, wrap("update run", err)
}

// moveByHost moves run id's by-host entry from host from to host to; an
// empty host has no entry (a queued run, or one that ended queued).
func moveByHost(tx *bolt.Tx, createdAt time.Time, id, from, to string) error {
	key := orderKey(createdAt, id)
	byHost := tx.Bucket(bucketRunsByHost)
	if from != "" {
		if b := byHost.Bucket([]byte(from)); b != nil {
			if err := b.Delete(key); err != nil {
				return err
			}
		}
	}
	if to == "" {
		return nil
	}
	dst, err := byHost.CreateBucketIfNotExists([]byte(to))
	if err != nil {
		return err
	}
	return dst.Put(key, []byte(id))
}

// ListRuns pages runs newest first within the query's scope.
func (s *Store) ListRuns(ctx context.Context, q store.RunQuery) (store.RunPage, error) {
	if q.OwnerID != "" && q.HostID != "" {
		return store.RunPage{}, errors.New("boltstore: list runs: ownerId and hostId together are not supported")
	}
	scope := cursor.Scope(q)
	var from []byte
	if q.Cursor != "" {
		pos, err := cursor.DecodeRuns(q.Cursor, scope)
		if err != nil {
			return store.RunPage{}, err
		}
		from = orderKey(pos.CreatedAt, pos.FleetRunID)
	}
	limit := store.PageLimit(q.Limit)
	now := s.now()
	var page store.RunPage
	err := s.view(ctx, func(tx *bolt.Tx) error {
		var idx *bolt.Bucket
		switch {
		case q.OwnerID != "":
			idx = tx.Bucket(bucketRunsByOwner).Bucket([]byte(q.OwnerID))
		case q.HostID != "":
			idx = tx.Bucket(bucketRunsByHost).Bucket([]byte(q.HostID))
		default:
			idx = tx.Bucket(bucketRunsCreated)
		}
		if idx == nil {
			return nil
		}
		c := idx.Cursor()
		var k, v []byte
		if from == nil {
			k, v = c.Last()
		} else if k, _ = c.Seek(from); k == nil {
			k, v = c.Last()
		} else {
			// Seek lands on the first key >= from; the page starts strictly before it.
			k, v = c.Prev()
		}
		for ; k != nil; k, v = c.Prev() {
			it, err := getRun(tx, string(v))
			if err != nil {
				return fmt.Errorf("index entry for run %q: %w", v, err)
			}
			if store.Expired(expiryTime(it.ExpiresAt), now) {
				continue
			}
			if len(page.Runs) == limit {
				last := page.Runs[limit-1]
				page.NextCursor = cursor.EncodeRuns(cursor.Runs{Scope: scope, CreatedAt: last.CreatedAt, FleetRunID: last.FleetRunID})
				return nil
			}
			page.Runs = append(page.Runs, it.record())
		}
		return nil
	})
	if err != nil {
		return store.RunPage{}, wrap("list runs", err)
	}
	return page, nil
}

// ListLive pages the ids of live runs in id order.
func (s *Store) ListLive(ctx context.Context, cur string, limit int) (store.LivePage, error) {
	var after []byte
	if cur != "" {
		id, err := cursor.DecodeLive(cur)
		if err != nil {
			return store.LivePage{}, err
		}
		after = []byte(id)
	}
	limit = store.PageLimit(limit)
	var page store.LivePage
	err := s.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRunsLive).Cursor()
		k, _ := c.First()
		if after != nil {
			if k, _ = c.Seek(after); bytes.Equal(k, after) {
				k, _ = c.Next()
			}
		}
		for ; k != nil; k, _ = c.Next() {
			if len(page.FleetRunIDs) == limit {
				page.NextCursor = cursor.EncodeLive(page.FleetRunIDs[limit-1])
				return nil
			}
			page.FleetRunIDs = append(page.FleetRunIDs, string(k))
		}
		return nil
	})
	if err != nil {
		return store.LivePage{}, wrap("list live runs", err)
	}
	return page, nil
}

// LiveCursorAfter is the ListLive cursor continuing after fleetRunID.
func (s *Store) LiveCursorAfter(fleetRunID string) string { return cursor.EncodeLive(fleetRunID) }

// PutEvents mirrors events in one transaction; a sequence already stored
// (and unexpired) is left untouched.
func (s *Store) PutEvents(ctx context.Context, events []store.Event) error {
	for _, e := range events {
		if e.FleetRunID == "" || e.Sequence < 1 {
			return fmt.Errorf("boltstore: put events: event needs a fleetRunId and a sequence >= 1 (got %q, %d)", e.FleetRunID, e.Sequence)
		}
	}
	if len(events) == 0 {
		return nil
	}
	now := s.now()
	err := s.update(ctx, func(tx *bolt.Tx) error {
		for _, e := range events {
			b, err := tx.Bucket(bucketEvents).CreateBucketIfNotExists([]byte(e.FleetRunID))
			if err != nil {
				return err
			}
			key := sequenceKey(e.Sequence)
			if v := b.Get(key); v != nil {
				old, err := decode[eventItem](v)
				if err != nil {
					return err
				}
				if !store.Expired(expiryTime(old.ExpiresAt), now) {
					continue
				}
			}
			if err := putItem(b, key, toEventItem(e)); err != nil {
				return err
			}
		}
		return nil
	})
	return wrap("put events", err)
}

// ExtendEventsExpiry moves the expiry of the run's unexpired events that
// expire before to, in one transaction.
func (s *Store) ExtendEventsExpiry(ctx context.Context, fleetRunID string, to time.Time) error {
	now, target := s.now(), expirySeconds(to)
	err := s.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEvents).Bucket([]byte(fleetRunID))
		if b == nil {
			return nil
		}
		type change struct {
			key []byte
			it  eventItem
		}
		var changes []change
		err := b.ForEach(func(k, v []byte) error {
			it, err := decode[eventItem](v)
			if err != nil {
				return err
			}
			if it.ExpiresAt != 0 && it.ExpiresAt < target && !store.Expired(expiryTime(it.ExpiresAt), now) {
				it.ExpiresAt = target
				changes = append(changes, change{append([]byte(nil), k...), it})
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, c := range changes {
			if err := putItem(b, c.key, c.it); err != nil {
				return err
			}
		}
		return nil
	})
	return wrap("extend events' expiry", err)
}

// ListEvents returns unexpired events with sequence > after, ascending.
func (s *Store) ListEvents(ctx context.Context, fleetRunID string, after int64, limit int) (store.EventPage, error) {
	if after < 0 {
		after = 0
	}
	limit = store.PageLimit(limit)
	now := s.now()
	var page store.EventPage
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEvents).Bucket([]byte(fleetRunID))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(sequenceKey(after + 1)); k != nil; k, v = c.Next() {
			it, err := decode[eventItem](v)
			if err != nil {
				return err
			}
			if store.Expired(expiryTime(it.ExpiresAt), now) {
				continue
			}
			if len(page.Events) == limit {
				page.HasMore = true
				return nil
			}
			page.Events = append(page.Events, it.record())
		}
		return nil
	})
	if err != nil {
		return store.EventPage{}, wrap("list events", err)
	}
	return page, nil
}

func getRun(tx *bolt.Tx, id string) (runItem, error) {
	v := tx.Bucket(bucketRuns).Get([]byte(id))
	if v == nil {
		return runItem{}, notFound("run", id)
	}
	return decode[runItem](v)
}

// setLive keeps the live bucket in step with the run's Live().
func setLive(tx *bolt.Tx, it runItem) error {
	b := tx.Bucket(bucketRunsLive)
	if it.record().Live() {
		return b.Put([]byte(it.FleetRunID), nil)
	}
	return b.Delete([]byte(it.FleetRunID))
}

// deleteRun removes a run, its index entries, its events and its ledger
// mirror.
func deleteRun(tx *bolt.Tx, id string) error {
	it, err := getRun(tx, id)
	if err != nil {
		return err
	}
	key := orderKey(it.CreatedAt, it.FleetRunID)
	if err := tx.Bucket(bucketRunsCreated).Delete(key); err != nil {
		return err
	}
	if b := tx.Bucket(bucketRunsByOwner).Bucket([]byte(it.OwnerID)); b != nil {
		if err := b.Delete(key); err != nil {
			return err
		}
	}
	if err := moveByHost(tx, it.CreatedAt, it.FleetRunID, it.HostID, ""); err != nil {
		return err
	}
	if err := tx.Bucket(bucketRunsLive).Delete([]byte(id)); err != nil {
		return err
	}
	if err := setQueue(tx, &it, runItem{}); err != nil {
		return err
	}
	if tx.Bucket(bucketEvents).Bucket([]byte(id)) != nil {
		if err := tx.Bucket(bucketEvents).DeleteBucket([]byte(id)); err != nil {
			return err
		}
	}
	if err := deleteEgress(tx, id); err != nil {
		return err
	}
	return tx.Bucket(bucketRuns).Delete([]byte(id))
}
