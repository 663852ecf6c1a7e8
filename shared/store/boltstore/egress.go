package boltstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/internal/cursor"
)

// egressItem is one mirrored ledger record. Data is a string, not a
// json.RawMessage: encoding/json compacts and re-escapes a RawMessage, and
// the record must come back byte for byte.
type egressItem struct {
	V         int    `json:"v"`
	Seq       int64  `json:"seq"`
	Data      string `json:"data"`
	ExpiresAt int64  `json:"expiresAt,omitempty"`
}

func (it egressItem) version() int { return it.V }

func (it egressItem) record() store.EgressRecord {
	return store.EgressRecord{Seq: it.Seq, Data: []byte(it.Data)}
}

// egressHeadItem is a run's ledger mirror head.
type egressHeadItem struct {
	V          int    `json:"v"`
	FleetRunID string `json:"fleetRunId"`
	Version    int64  `json:"version"`
	Cursor     int64  `json:"cursor"`
	Summary    string `json:"summary,omitempty"`
	Seal       string `json:"seal,omitempty"`
	HostID     string `json:"hostId,omitempty"`
	Alerts     int64  `json:"alerts,omitempty"`
	// FirstAlertAt is in Unix nanoseconds; zero: no alert yet.
	FirstAlertAt int64     `json:"firstAlertAt,omitempty"`
	UpdatedAt    time.Time `json:"updatedAt"`
	ExpiresAt    int64     `json:"expiresAt,omitempty"`
}

func (it egressHeadItem) version() int { return it.V }

func (it egressHeadItem) record() store.EgressHead {
	return store.EgressHead{
		FleetRunID: it.FleetRunID, Version: it.Version, Cursor: it.Cursor,
		Summary: rawOrNil(it.Summary), Seal: rawOrNil(it.Seal), HostID: it.HostID, Alerts: it.Alerts,
		FirstAlertAt: fromUnixNanos(it.FirstAlertAt), UpdatedAt: utc(it.UpdatedAt), ExpiresAt: expiryTime(it.ExpiresAt),
	}
}

func toEgressHeadItem(h store.EgressHead) egressHeadItem {
	return egressHeadItem{
		V: formatVersion, FleetRunID: h.FleetRunID, Version: h.Version, Cursor: h.Cursor,
		Summary: string(h.Summary), Seal: string(h.Seal), HostID: h.HostID, Alerts: h.Alerts,
		FirstAlertAt: unixNanos(h.FirstAlertAt), UpdatedAt: utc(h.UpdatedAt), ExpiresAt: expirySeconds(h.ExpiresAt),
	}
}

func rawOrNil(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// PutEgress mirrors records in one transaction; a Seq already stored (and
// unexpired) is left untouched.
func (s *Store) PutEgress(ctx context.Context, fleetRunID string, records []store.EgressRecord, expiresAt time.Time) error {
	if err := store.CheckEgressRecords(fleetRunID, records); err != nil {
		return wrap("put egress", err)
	}
	if len(records) == 0 {
		return nil
	}
	now, exp := s.now(), expirySeconds(expiresAt)
	err := s.update(ctx, func(tx *bolt.Tx) error {
		b, err := tx.Bucket(bucketEgress).CreateBucketIfNotExists([]byte(fleetRunID))
		if err != nil {
			return err
		}
		for _, r := range records {
			key := sequenceKey(r.Seq)
			if v := b.Get(key); v != nil {
				old, err := decode[egressItem](v)
				if err != nil {
					return err
				}
				if !store.Expired(expiryTime(old.ExpiresAt), now) {
					continue
				}
			}
			it := egressItem{V: formatVersion, Seq: r.Seq, Data: string(r.Data), ExpiresAt: exp}
			if err := putItem(b, key, it); err != nil {
				return err
			}
		}
		return nil
	})
	return wrap("put egress", err)
}

// ListEgress returns unexpired records with Seq > after, ascending.
func (s *Store) ListEgress(ctx context.Context, fleetRunID string, after int64, limit int) (store.EgressPage, error) {
	if after < 0 {
		after = 0
	}
	limit = store.PageLimit(limit)
	now := s.now()
	var page store.EgressPage
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEgress).Bucket([]byte(fleetRunID))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(sequenceKey(after + 1)); k != nil; k, v = c.Next() {
			it, err := decode[egressItem](v)
			if err != nil {
				return err
			}
			if store.Expired(expiryTime(it.ExpiresAt), now) {
				continue
			}
			if len(page.Records) == limit {
				page.HasMore = true
				return nil
			}
			page.Records = append(page.Records, it.record())
		}
		return nil
	})
	if err != nil {
		return store.EgressPage{}, wrap("list egress", err)
	}
	return page, nil
}

// GetEgressHead reads the run's head; ErrNotFound when absent or expired.
func (s *Store) GetEgressHead(ctx context.Context, fleetRunID string) (store.EgressHead, error) {
	now := s.now()
	var h store.EgressHead
	err := s.view(ctx, func(tx *bolt.Tx) error {
		it, err := getEgressHead(tx, fleetRunID, now)
		if err != nil {
			return err
		}
		if it == nil {
			return notFound("egress head", fleetRunID)
		}
		h = it.record()
		return nil
	})
	return h, wrap("get egress head", err)
}

// PutEgressHead writes the head if the stored Version still equals
// h.Version, keeping the alerted index in step in the same transaction.
func (s *Store) PutEgressHead(ctx context.Context, h store.EgressHead) (store.EgressHead, error) {
	if h.FleetRunID == "" {
		return store.EgressHead{}, errors.New("boltstore: put egress head: empty fleetRunId")
	}
	now := s.now()
	var stored store.EgressHead
	err := s.update(ctx, func(tx *bolt.Tx) error {
		old, err := getEgressHead(tx, h.FleetRunID, now)
		if err != nil {
			return err
		}
		var oldVersion int64
		var oldAlert time.Time
		if old != nil {
			oldVersion, oldAlert = old.Version, fromUnixNanos(old.FirstAlertAt)
		}
		if oldVersion != h.Version {
			return fmt.Errorf("boltstore: egress head of run %q is at version %d, not %d: %w", h.FleetRunID, oldVersion, h.Version, store.ErrConflict)
		}
		// An expired head reads as absent but may still hold an index entry.
		if err := unindexAlerted(tx, h.FleetRunID); err != nil {
			return err
		}
		h.FirstAlertAt = store.KeptFirstAlertAt(oldAlert, h, now)
		it := toEgressHeadItem(h)
		it.Version = oldVersion + 1
		if err := putItem(tx.Bucket(bucketEgressHeads), []byte(it.FleetRunID), it); err != nil {
			return err
		}
		if it.FirstAlertAt != 0 {
			if err := tx.Bucket(bucketEgressAlerted).Put(orderKey(h.FirstAlertAt, h.FleetRunID), []byte(h.FleetRunID)); err != nil {
				return err
			}
		}
		stored = it.record()
		return nil
	})
	if err != nil {
		return store.EgressHead{}, wrap("put egress head", err)
	}
	return stored, nil
}

// ExtendEgressExpiry moves the expiry of the run's unexpired records and
// head that expire before to, in one transaction.
func (s *Store) ExtendEgressExpiry(ctx context.Context, fleetRunID string, to time.Time) error {
	now, target := s.now(), expirySeconds(to)
	extends := func(exp int64) bool {
		return exp != 0 && exp < target && !store.Expired(expiryTime(exp), now)
	}
	err := s.update(ctx, func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketEgressHeads).Get([]byte(fleetRunID)); v != nil {
			it, err := decode[egressHeadItem](v)
			if err != nil {
				return err
			}
			if extends(it.ExpiresAt) {
				it.ExpiresAt = target
				if err := putItem(tx.Bucket(bucketEgressHeads), []byte(fleetRunID), it); err != nil {
					return err
				}
			}
		}
		b := tx.Bucket(bucketEgress).Bucket([]byte(fleetRunID))
		if b == nil {
			return nil
		}
		type change struct {
			key []byte
			it  egressItem
		}
		var changes []change
		err := b.ForEach(func(k, v []byte) error {
			it, err := decode[egressItem](v)
			if err != nil {
				return err
			}
			if extends(it.ExpiresAt) {
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
	return wrap("extend egress expiry", err)
}

// ListAlertedRuns pages the unexpired heads with alerts, newest
// FirstAlertAt first (ties by run id, descending).
func (s *Store) ListAlertedRuns(ctx context.Context, cur string, limit int) (store.AlertedPage, error) {
	var from []byte
	if cur != "" {
		pos, err := cursor.DecodeAlerted(cur)
		if err != nil {
			return store.AlertedPage{}, err
		}
		from = orderKey(pos.FirstAlertAt, pos.FleetRunID)
	}
	limit = store.PageLimit(limit)
	now := s.now()
	var page store.AlertedPage
	err := s.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEgressAlerted).Cursor()
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
			it, err := getEgressHead(tx, string(v), now)
			if err != nil {
				return err
			}
			if it == nil {
				continue
			}
			if len(page.Heads) == limit {
				last := page.Heads[limit-1]
				page.NextCursor = cursor.EncodeAlerted(cursor.Alerted{FirstAlertAt: last.FirstAlertAt, FleetRunID: last.FleetRunID})
				return nil
			}
			page.Heads = append(page.Heads, it.record())
		}
		return nil
	})
	if err != nil {
		return store.AlertedPage{}, wrap("list alerted runs", err)
	}
	return page, nil
}

// getEgressHead reads a run's head inside tx; nil when absent or expired.
func getEgressHead(tx *bolt.Tx, fleetRunID string, now time.Time) (*egressHeadItem, error) {
	v := tx.Bucket(bucketEgressHeads).Get([]byte(fleetRunID))
	if v == nil {
		return nil, nil
	}
	it, err := decode[egressHeadItem](v)
	if err != nil {
		return nil, err
	}
	if store.Expired(expiryTime(it.ExpiresAt), now) {
		return nil, nil
	}
	return &it, nil
}

// unindexAlerted removes the run's alerted index entry, if its stored head
// (expired or not) has one.
func unindexAlerted(tx *bolt.Tx, fleetRunID string) error {
	v := tx.Bucket(bucketEgressHeads).Get([]byte(fleetRunID))
	if v == nil {
		return nil
	}
	it, err := decode[egressHeadItem](v)
	if err != nil {
		return err
	}
	if it.FirstAlertAt == 0 {
		return nil
	}
	return tx.Bucket(bucketEgressAlerted).Delete(orderKey(fromUnixNanos(it.FirstAlertAt), fleetRunID))
}

// deleteEgress removes a run's ledger mirror: records, head and index entry.
func deleteEgress(tx *bolt.Tx, fleetRunID string) error {
	if err := unindexAlerted(tx, fleetRunID); err != nil {
		return err
	}
	if err := tx.Bucket(bucketEgressHeads).Delete([]byte(fleetRunID)); err != nil {
		return err
	}
	if tx.Bucket(bucketEgress).Bucket([]byte(fleetRunID)) != nil {
		return tx.Bucket(bucketEgress).DeleteBucket([]byte(fleetRunID))
	}
	return nil
}
