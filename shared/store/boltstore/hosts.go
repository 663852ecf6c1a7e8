package boltstore

import (
	"context"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
)

// CreateHost adds h; ErrExists if the id is taken.
func (s *Store) CreateHost(ctx context.Context, h store.Host) error {
	if h.ID == "" {
		return errors.New("boltstore: create host: empty id")
	}
	err := s.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketHosts)
		if b.Get([]byte(h.ID)) != nil {
			return exists("host", h.ID)
		}
		return putItem(b, []byte(h.ID), toHostItem(h))
	})
	return wrap("create host", err)
}

// GetHost returns the host with its last probe; ErrNotFound.
func (s *Store) GetHost(ctx context.Context, id string) (store.Host, error) {
	var h store.Host
	err := s.view(ctx, func(tx *bolt.Tx) error {
		it, err := getHost(tx, id)
		h = it.record()
		return err
	})
	return h, wrap("get host", err)
}

// ListHosts returns every host, ordered by id.
func (s *Store) ListHosts(ctx context.Context) ([]store.Host, error) {
	var hosts []store.Host
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketHosts).ForEach(func(_, v []byte) error {
			it, err := decode[hostItem](v)
			if err != nil {
				return err
			}
			hosts = append(hosts, it.record())
			return nil
		})
	})
	return hosts, wrap("list hosts", err)
}

// SetHostEnabled flips enabled; ErrNotFound.
func (s *Store) SetHostEnabled(ctx context.Context, id string, enabled bool) (store.Host, error) {
	var h store.Host
	err := s.update(ctx, func(tx *bolt.Tx) error {
		it, err := getHost(tx, id)
		if err != nil {
			return err
		}
		it.Enabled = enabled
		h = it.record()
		return putItem(tx.Bucket(bucketHosts), []byte(id), it)
	})
	return h, wrap("set host enabled", err)
}

// RecordProbe stores p as the host's last probe; ErrNotFound.
func (s *Store) RecordProbe(ctx context.Context, id string, p store.Probe) error {
	err := s.update(ctx, func(tx *bolt.Tx) error {
		it, err := getHost(tx, id)
		if err != nil {
			return err
		}
		pi := toProbeItem(p)
		it.Probe = &pi
		return putItem(tx.Bucket(bucketHosts), []byte(id), it)
	})
	return wrap("record probe", err)
}

// DeleteHost removes a host in steps (store.Store), each one transaction:
// at most store.DeleteHostRunsPerStep of its runs (newest first) with
// their events and ledger mirrors, then, when none is left, the host. Without force,
// ErrInUse while an unexpired run references it; expired runs never block
// it and are removed with it.
func (s *Store) DeleteHost(ctx context.Context, id string, force bool) (store.HostDeletion, error) {
	now := s.now()
	var res store.HostDeletion
	err := s.update(ctx, func(tx *bolt.Tx) error {
		res = store.HostDeletion{}
		if _, err := getHost(tx, id); err != nil {
			return err
		}
		var runIDs []string
		more := false
		if byHost := tx.Bucket(bucketRunsByHost).Bucket([]byte(id)); byHost != nil {
			c := byHost.Cursor()
			for k, v := c.Last(); k != nil; k, v = c.Prev() {
				if len(runIDs) == store.DeleteHostRunsPerStep {
					more = true
					break
				}
				runIDs = append(runIDs, string(v))
			}
		}
		for _, rid := range runIDs {
			r, err := getRun(tx, rid)
			if err != nil {
				return fmt.Errorf("reading run %q of host %q: %w", rid, id, err)
			}
			if !force && !store.Expired(expiryTime(r.ExpiresAt), now) {
				return fmt.Errorf("boltstore: host %q is referenced by run %q: %w", id, rid, store.ErrInUse)
			}
		}
		for _, rid := range runIDs {
			if err := deleteRun(tx, rid); err != nil {
				return err
			}
		}
		res.RunsDeleted = len(runIDs)
		if more {
			return nil
		}
		res.Done = true
		return tx.Bucket(bucketHosts).Delete([]byte(id))
	})
	if err != nil {
		return store.HostDeletion{}, wrap("delete host", err)
	}
	return res, nil
}

func getHost(tx *bolt.Tx, id string) (hostItem, error) {
	v := tx.Bucket(bucketHosts).Get([]byte(id))
	if v == nil {
		return hostItem{}, notFound("host", id)
	}
	return decode[hostItem](v)
}

func putItem(b *bolt.Bucket, key []byte, item any) error {
	v, err := encode(item)
	if err != nil {
		return err
	}
	return b.Put(key, v)
}
