package boltstore

import (
	"context"
	"errors"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
)

// CreateCaller writes the owner and token entries together; ErrExists if
// either the ownerId or the token hash is taken.
func (s *Store) CreateCaller(ctx context.Context, c store.Caller) error {
	if c.OwnerID == "" || c.TokenHash == "" {
		return errors.New("boltstore: create caller: empty ownerId or token hash")
	}
	err := s.update(ctx, func(tx *bolt.Tx) error {
		owners, tokens := tx.Bucket(bucketCallers), tx.Bucket(bucketCallerTokens)
		if owners.Get([]byte(c.OwnerID)) != nil {
			return exists("caller", c.OwnerID)
		}
		if tokens.Get([]byte(c.TokenHash)) != nil {
			// The hash is never echoed: it identifies a credential.
			return exists("caller token of", c.OwnerID)
		}
		if err := putItem(owners, []byte(c.OwnerID), toCallerItem(c)); err != nil {
			return err
		}
		return tokens.Put([]byte(c.TokenHash), []byte(c.OwnerID))
	})
	return wrap("create caller", err)
}

// CallerByTokenHash looks a caller up by token hash; ErrNotFound.
func (s *Store) CallerByTokenHash(ctx context.Context, tokenHash string) (store.Caller, error) {
	var c store.Caller
	err := s.view(ctx, func(tx *bolt.Tx) error {
		owner := tx.Bucket(bucketCallerTokens).Get([]byte(tokenHash))
		if owner == nil {
			return notFound("caller", "(by token)")
		}
		it, err := getCaller(tx, string(owner))
		c = it.record()
		return err
	})
	return c, wrap("caller by token", err)
}

// ListCallers returns every caller, ordered by ownerId.
func (s *Store) ListCallers(ctx context.Context) ([]store.Caller, error) {
	var callers []store.Caller
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCallers).ForEach(func(_, v []byte) error {
			it, err := decode[callerItem](v)
			if err != nil {
				return err
			}
			callers = append(callers, it.record())
			return nil
		})
	})
	return callers, wrap("list callers", err)
}

// DeleteCaller removes both entries together; ErrNotFound.
func (s *Store) DeleteCaller(ctx context.Context, ownerID string) error {
	err := s.update(ctx, func(tx *bolt.Tx) error {
		it, err := getCaller(tx, ownerID)
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucketCallerTokens).Delete([]byte(it.TokenHash)); err != nil {
			return err
		}
		return tx.Bucket(bucketCallers).Delete([]byte(ownerID))
	})
	return wrap("delete caller", err)
}

func getCaller(tx *bolt.Tx, ownerID string) (callerItem, error) {
	v := tx.Bucket(bucketCallers).Get([]byte(ownerID))
	if v == nil {
		return callerItem{}, notFound("caller", ownerID)
	}
	return decode[callerItem](v)
}
