package boltstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
)

// sweepCursorItem is the sweep cursor, stored under store.SweepCursorKey in
// the idempotency bucket (no idempotency key begins with "#"). Field names
// are a contract with files on disk.
type sweepCursorItem struct {
	V              int       `json:"v"`
	Lap            int64     `json:"lap"`
	After          string    `json:"after,omitempty"`
	LapStarted     time.Time `json:"lapStarted"`
	PrevLapStarted time.Time `json:"prevLapStarted"`
	PrevLapEnded   time.Time `json:"prevLapEnded"`
	Holder         string    `json:"holder,omitempty"`
	LeaseUntil     time.Time `json:"leaseUntil"`
	Version        int64     `json:"version"`
}

func (it sweepCursorItem) version() int { return it.V }

func (it sweepCursorItem) record() store.SweepCursor {
	return store.SweepCursor{
		Lap: it.Lap, After: it.After, LapStarted: utc(it.LapStarted),
		PrevLapStarted: utc(it.PrevLapStarted), PrevLapEnded: utc(it.PrevLapEnded),
		Holder: it.Holder, LeaseUntil: utc(it.LeaseUntil), Version: it.Version,
	}
}

func toSweepCursorItem(c store.SweepCursor) sweepCursorItem {
	it := sweepCursorItem{
		V: formatVersion, Lap: c.Lap, After: c.After, LapStarted: c.LapStarted,
		PrevLapStarted: c.PrevLapStarted, PrevLapEnded: c.PrevLapEnded, Holder: c.Holder, Version: c.Version,
	}
	if c.Holder != "" {
		it.LeaseUntil = c.LeaseUntil
	}
	return it
}

var sweepCursorKey = []byte(store.SweepCursorKey)

// getSweepCursor reads the cursor inside tx; nil when there is none.
func getSweepCursor(tx *bolt.Tx) (*sweepCursorItem, error) {
	v := tx.Bucket(bucketIdempotency).Get(sweepCursorKey)
	if v == nil {
		return nil, nil
	}
	it, err := decode[sweepCursorItem](v)
	if err != nil {
		return nil, err
	}
	return &it, nil
}

// ClaimSweepCursor takes the lease in one transaction, creating the cursor
// at lap 1 when there is none.
func (s *Store) ClaimSweepCursor(ctx context.Context, holder string, leaseUntil time.Time) (store.SweepCursor, error) {
	if holder == "" {
		return store.SweepCursor{}, errors.New("boltstore: claim sweep cursor: empty holder")
	}
	now := s.now()
	var out sweepCursorItem
	err := s.update(ctx, func(tx *bolt.Tx) error {
		cur, err := getSweepCursor(tx)
		if err != nil {
			return err
		}
		if cur == nil {
			cur = &sweepCursorItem{V: formatVersion, Lap: 1, LapStarted: now.UTC()}
		} else if cur.Holder != "" && cur.Holder != holder && now.Before(cur.LeaseUntil) {
			out = *cur
			return fmt.Errorf("boltstore: sweep cursor held by another sweep: %w", store.ErrConflict)
		}
		cur.Holder, cur.LeaseUntil = holder, leaseUntil.UTC()
		cur.Version++
		out = *cur
		return putItem(tx.Bucket(bucketIdempotency), sweepCursorKey, cur)
	})
	if errors.Is(err, store.ErrConflict) {
		return out.record(), err
	}
	if err != nil {
		return store.SweepCursor{}, wrap("claim sweep cursor", err)
	}
	return out.record(), nil
}

// SaveSweepCursor replaces the cursor if its version is still c.Version.
func (s *Store) SaveSweepCursor(ctx context.Context, c store.SweepCursor) (store.SweepCursor, error) {
	next := toSweepCursorItem(c)
	next.Version = c.Version + 1
	err := s.update(ctx, func(tx *bolt.Tx) error {
		cur, err := getSweepCursor(tx)
		if err != nil {
			return err
		}
		if cur == nil {
			return notFound("sweep cursor", store.SweepCursorKey)
		}
		if cur.Version != c.Version {
			return fmt.Errorf("boltstore: sweep cursor version %d moved on: %w", c.Version, store.ErrConflict)
		}
		return putItem(tx.Bucket(bucketIdempotency), sweepCursorKey, next)
	})
	if err != nil {
		return store.SweepCursor{}, wrap("save sweep cursor", err)
	}
	return next.record(), nil
}
