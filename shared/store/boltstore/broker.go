package boltstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
)

// brokerStateItem is a broker state, stored under store.BrokerStateKey(ID)
// in the idempotency bucket, as in DynamoDB's idempotency table. Field
// names are a contract with files on disk. The sealed tokens are JSON's
// base64.
type brokerStateItem struct {
	V                  int       `json:"v"`
	ID                 string    `json:"id"`
	Generation         int64     `json:"generation"`
	SealedRefreshToken []byte    `json:"sealedRefreshToken,omitempty"`
	SealedAccessToken  []byte    `json:"sealedAccessToken,omitempty"`
	AccessExpiresAt    time.Time `json:"accessExpiresAt"`
	Seed               string    `json:"seed,omitempty"`
	Holder             string    `json:"holder,omitempty"`
	LeaseUntil         time.Time `json:"leaseUntil"`
	UpdatedAt          time.Time `json:"updatedAt"`
}

func (it brokerStateItem) version() int { return it.V }

func (it brokerStateItem) record() store.BrokerState {
	return store.BrokerState{
		ID: it.ID, Generation: it.Generation,
		SealedRefreshToken: cloneBytes(it.SealedRefreshToken), SealedAccessToken: cloneBytes(it.SealedAccessToken),
		AccessExpiresAt: utc(it.AccessExpiresAt), Seed: it.Seed,
		LeaseHolder: it.Holder, LeaseExpiresAt: utc(it.LeaseUntil), UpdatedAt: utc(it.UpdatedAt),
	}
}

// getBrokerState reads the item inside tx; nil when there is none.
func getBrokerState(tx *bolt.Tx, id string) (*brokerStateItem, error) {
	v := tx.Bucket(bucketIdempotency).Get([]byte(store.BrokerStateKey(id)))
	if v == nil {
		return nil, nil
	}
	it, err := decode[brokerStateItem](v)
	if err != nil {
		return nil, err
	}
	return &it, nil
}

func putBrokerState(tx *bolt.Tx, it *brokerStateItem) error {
	return putItem(tx.Bucket(bucketIdempotency), []byte(store.BrokerStateKey(it.ID)), it)
}

// GetBrokerState reads the item.
func (s *Store) GetBrokerState(ctx context.Context, id string) (store.BrokerState, error) {
	var out store.BrokerState
	err := s.view(ctx, func(tx *bolt.Tx) error {
		it, err := getBrokerState(tx, id)
		if err != nil {
			return err
		}
		if it == nil {
			return notFound("broker state", id)
		}
		out = it.record()
		return nil
	})
	return out, wrap("get broker state", err)
}

// AcquireBrokerLease takes the lease in one transaction, creating the
// item at generation 0 when there is none.
func (s *Store) AcquireBrokerLease(ctx context.Context, id, holder string, until time.Time) (store.BrokerState, error) {
	if id == "" || holder == "" || until.IsZero() {
		return store.BrokerState{}, errors.New("boltstore: acquire broker lease: want an id, a holder and an expiry")
	}
	now := s.now()
	var out store.BrokerState
	err := s.update(ctx, func(tx *bolt.Tx) error {
		it, err := getBrokerState(tx, id)
		if err != nil {
			return err
		}
		if it == nil {
			it = &brokerStateItem{V: formatVersion, ID: id}
		} else if it.Holder != "" && it.Holder != holder && now.Before(it.LeaseUntil) {
			out = it.record()
			return fmt.Errorf("boltstore: broker state %q: lease held by another holder: %w", id, store.ErrConflict)
		}
		it.Holder, it.LeaseUntil, it.UpdatedAt = holder, until.UTC(), now.UTC()
		out = it.record()
		return putBrokerState(tx, it)
	})
	if errors.Is(err, store.ErrConflict) {
		return out, err
	}
	if err != nil {
		return store.BrokerState{}, wrap("acquire broker lease", err)
	}
	return out, nil
}

// CommitBrokerState stores st as the next generation if the stored one is
// still st.Generation, releasing the lease if st.LeaseHolder holds it.
func (s *Store) CommitBrokerState(ctx context.Context, st store.BrokerState) (store.BrokerState, error) {
	if st.ID == "" || st.Generation < 0 {
		return store.BrokerState{}, errors.New("boltstore: commit broker state: want an id and a generation >= 0")
	}
	now := s.now()
	var out store.BrokerState
	err := s.update(ctx, func(tx *bolt.Tx) error {
		it, err := getBrokerState(tx, st.ID)
		if err != nil {
			return err
		}
		if it == nil {
			return notFound("broker state", st.ID)
		}
		if it.Generation != st.Generation {
			return fmt.Errorf("boltstore: broker state %q is at generation %d, not %d: %w", st.ID, it.Generation, st.Generation, store.ErrConflict)
		}
		it.Generation = st.Generation + 1
		it.SealedRefreshToken, it.SealedAccessToken = cloneBytes(st.SealedRefreshToken), cloneBytes(st.SealedAccessToken)
		it.AccessExpiresAt, it.Seed, it.UpdatedAt = st.AccessExpiresAt.UTC(), st.Seed, now.UTC()
		if st.LeaseHolder != "" && it.Holder == st.LeaseHolder {
			it.Holder, it.LeaseUntil = "", time.Time{}
		}
		out = it.record()
		return putBrokerState(tx, it)
	})
	if err != nil {
		return store.BrokerState{}, wrap("commit broker state", err)
	}
	return out, nil
}

// ReleaseBrokerLease frees the lease if holder holds it.
func (s *Store) ReleaseBrokerLease(ctx context.Context, id, holder string) error {
	if id == "" || holder == "" {
		return errors.New("boltstore: release broker lease: want an id and a holder")
	}
	now := s.now()
	err := s.update(ctx, func(tx *bolt.Tx) error {
		it, err := getBrokerState(tx, id)
		if err != nil || it == nil || it.Holder != holder {
			return err
		}
		it.Holder, it.LeaseUntil, it.UpdatedAt = "", time.Time{}, now.UTC()
		return putBrokerState(tx, it)
	})
	return wrap("release broker lease", err)
}

// cloneBytes copies b, so an item never shares a record's memory; nil for
// none.
func cloneBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}
