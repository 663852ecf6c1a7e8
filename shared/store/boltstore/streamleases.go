package boltstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
)

// Stream leases live in the idempotency bucket under
// store.StreamLeaseKey, as in DynamoDB's idempotency table; each operation
// is one transaction, so the check and the write are one step.

type leaseItem struct {
	V      int    `json:"v"`
	Holder string `json:"holder"`
	// ExpiresAt is epoch seconds, as in DynamoDB.
	ExpiresAt int64 `json:"expiresAt"`
}

func (it leaseItem) version() int { return it.V }

// readLease returns the slot's holder when it is held (present and
// unexpired).
func readLease(b *bolt.Bucket, key string, now time.Time) (leaseItem, bool, error) {
	v := b.Get([]byte(key))
	if v == nil {
		return leaseItem{}, false, nil
	}
	it, err := decode[leaseItem](v)
	if err != nil {
		return leaseItem{}, false, err
	}
	return it, !store.Expired(expiryTime(it.ExpiresAt), now), nil
}

// AcquireStreamLease takes the first free slot in one transaction.
func (s *Store) AcquireStreamLease(ctx context.Context, l store.StreamLease, slots int) (store.StreamLease, error) {
	if l.OwnerID == "" || l.Holder == "" || slots < 1 || slots > store.MaxStreamSlots {
		return store.StreamLease{}, fmt.Errorf("boltstore: acquire stream lease: want an owner, a holder and 1..%d slots", store.MaxStreamSlots)
	}
	now := s.now()
	got := store.StreamLease{OwnerID: l.OwnerID}
	err := s.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketIdempotency)
		for slot := 0; slot < slots; slot++ {
			key := store.StreamLeaseKey(l.OwnerID, slot)
			it, held, err := readLease(b, key, now)
			if err != nil {
				return err
			}
			if held {
				if exp := expiryTime(it.ExpiresAt); got.ExpiresAt.IsZero() || exp.Before(got.ExpiresAt) {
					got.ExpiresAt = exp
				}
				continue
			}
			got = l
			got.Slot = slot
			got.ExpiresAt = store.RoundExpiry(l.ExpiresAt)
			return putItem(b, []byte(key), leaseItem{V: formatVersion, Holder: l.Holder, ExpiresAt: expirySeconds(l.ExpiresAt)})
		}
		return exists("stream leases of", l.OwnerID)
	})
	if err != nil && !errors.Is(err, store.ErrExists) {
		return store.StreamLease{}, wrap("acquire stream lease", err)
	}
	return got, err
}

// RenewStreamLease rewrites the lease while its slot is free or l.Holder's.
func (s *Store) RenewStreamLease(ctx context.Context, l store.StreamLease) error {
	if l.OwnerID == "" || l.Holder == "" {
		return errors.New("boltstore: renew stream lease: want an owner and a holder")
	}
	now := s.now()
	key := store.StreamLeaseKey(l.OwnerID, l.Slot)
	err := s.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketIdempotency)
		it, held, err := readLease(b, key, now)
		if err != nil {
			return err
		}
		if held && it.Holder != l.Holder {
			return exists("stream lease", key)
		}
		return putItem(b, []byte(key), leaseItem{V: formatVersion, Holder: l.Holder, ExpiresAt: expirySeconds(l.ExpiresAt)})
	})
	return wrap("renew stream lease", err)
}

// ReleaseStreamLease deletes the lease if l.Holder holds it.
func (s *Store) ReleaseStreamLease(ctx context.Context, l store.StreamLease) error {
	key := store.StreamLeaseKey(l.OwnerID, l.Slot)
	err := s.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketIdempotency)
		v := b.Get([]byte(key))
		if v == nil {
			return nil
		}
		it, err := decode[leaseItem](v)
		if err != nil {
			return err
		}
		if it.Holder != l.Holder {
			return nil
		}
		return b.Delete([]byte(key))
	})
	return wrap("release stream lease", err)
}
