package boltstore

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/store"
)

// The queue index is runsQueue/<class>: store.QueueOrder -> the run's
// "<until>|<hosts>": QueueInfo.Until (RFC 3339 with nanoseconds, UTC;
// empty when zero), then QueueInfo.Hosts comma-separated ("" when nil),
// for every run whose Waiting() is true, written in the transaction that
// writes the run. A class's bucket goes with its last entry, so the
// classes listed are those with waiting runs.

// queueSlot is where a run stands in the queue index, and what its entry
// holds.
type queueSlot struct {
	class, order string
	value        []byte
}

// queueSlotOf is the run's place in the queue index; ok is false for a run
// that is not in it.
func queueSlotOf(it runItem) (slot queueSlot, ok bool, err error) {
	r := it.record()
	if !r.Waiting() {
		return queueSlot{}, false, nil
	}
	slot = queueSlot{class: r.Queue.Class, order: store.QueueOrder(*r.Queue, r.FleetRunID)}
	var until []byte
	if !r.Queue.Until.IsZero() {
		if until, err = r.Queue.Until.UTC().MarshalText(); err != nil {
			return queueSlot{}, false, fmt.Errorf("run %q: queue until: %w", r.FleetRunID, err)
		}
	}
	slot.value = append(append(until, '|'), strings.Join(r.Queue.Hosts, ",")...)
	return slot, true, nil
}

// setQueue moves a run's queue entry from where old had it (nil: a new
// run) to where it now belongs.
func setQueue(tx *bolt.Tx, old *runItem, it runItem) error {
	var was queueSlot
	wasIn := false
	if old != nil {
		var err error
		if was, wasIn, err = queueSlotOf(*old); err != nil {
			return err
		}
	}
	now, in, err := queueSlotOf(it)
	if err != nil {
		return err
	}
	if wasIn == in && was.class == now.class && was.order == now.order && bytes.Equal(was.value, now.value) {
		return nil
	}
	q := tx.Bucket(bucketRunsQueue)
	if wasIn {
		if b := q.Bucket([]byte(was.class)); b != nil {
			if err := b.Delete([]byte(was.order)); err != nil {
				return err
			}
			if k, _ := b.Cursor().First(); k == nil {
				if err := q.DeleteBucket([]byte(was.class)); err != nil {
					return err
				}
			}
		}
	}
	if !in {
		return nil
	}
	b, err := q.CreateBucketIfNotExists([]byte(now.class))
	if err != nil {
		return err
	}
	return b.Put([]byte(now.order), now.value)
}

// entryOf is the QueueEntry of an index key and its value.
func entryOf(order, value []byte) (store.QueueEntry, error) {
	since, id, err := store.ParseQueueOrder(string(order))
	if err != nil {
		return store.QueueEntry{}, err
	}
	e := store.QueueEntry{FleetRunID: id, Order: string(order), Since: since}
	until, hosts, _ := bytes.Cut(value, []byte("|"))
	if len(until) > 0 {
		if err := e.Until.UnmarshalText(until); err != nil {
			return store.QueueEntry{}, fmt.Errorf("queue entry %q: until: %w", order, err)
		}
	}
	if len(hosts) > 0 {
		e.Hosts = strings.Split(string(hosts), ",")
	}
	return e, nil
}

// QueueHeads implements store.Queue.
func (s *Store) QueueHeads(ctx context.Context) ([]store.QueueHead, error) {
	var heads []store.QueueHead
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRunsQueue).ForEachBucket(func(k []byte) error {
			first, value := tx.Bucket(bucketRunsQueue).Bucket(k).Cursor().First()
			e, err := entryOf(first, value)
			if err != nil {
				return fmt.Errorf("queue class %q: %w", k, err)
			}
			heads = append(heads, store.QueueHead{Class: string(k), Head: e})
			return nil
		})
	})
	if err != nil {
		return nil, wrap("queue heads", err)
	}
	sort.Slice(heads, func(i, j int) bool { return heads[i].Class < heads[j].Class })
	return heads, nil
}

// QueueClasses implements store.Queue.
func (s *Store) QueueClasses(ctx context.Context) ([]string, error) {
	var classes []string
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRunsQueue).ForEachBucket(func(k []byte) error {
			classes = append(classes, string(k))
			return nil
		})
	})
	if err != nil {
		return nil, wrap("queue classes", err)
	}
	sort.Strings(classes)
	return classes, nil
}

// ListQueue implements store.Queue.
func (s *Store) ListQueue(ctx context.Context, class, after string, limit int) (store.QueuePage, error) {
	limit = store.PageLimit(limit)
	var page store.QueuePage
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRunsQueue).Bucket([]byte(class))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		k, v := c.First()
		if after != "" {
			if k, v = c.Seek([]byte(after)); bytes.Equal(k, []byte(after)) {
				k, v = c.Next()
			}
		}
		for ; k != nil; k, v = c.Next() {
			if len(page.Entries) == limit {
				page.Next = page.Entries[limit-1].Order
				return nil
			}
			e, err := entryOf(k, v)
			if err != nil {
				return fmt.Errorf("queue class %q: %w", class, err)
			}
			page.Entries = append(page.Entries, e)
		}
		return nil
	})
	if err != nil {
		return store.QueuePage{}, wrap("list queue", err)
	}
	return page, nil
}

// QueueAhead implements store.Queue.
func (s *Store) QueueAhead(ctx context.Context, class, order string) (int, error) {
	n := 0
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRunsQueue).Bucket([]byte(class))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, _ := c.First(); k != nil && bytes.Compare(k, []byte(order)) < 0; k, _ = c.Next() {
			n++
		}
		return nil
	})
	if err != nil {
		return 0, wrap("queue ahead", err)
	}
	return n, nil
}

// QueueStats implements store.Queue.
func (s *Store) QueueStats(ctx context.Context, class string) (store.QueueStats, error) {
	var st store.QueueStats
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRunsQueue).Bucket([]byte(class))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			since, _, err := store.ParseQueueOrder(string(k))
			if err != nil {
				return fmt.Errorf("queue class %q: %w", class, err)
			}
			st.Waiting++
			st.Oldest = earlier(st.Oldest, since)
			return nil
		})
	})
	if err != nil {
		return store.QueueStats{}, wrap("queue stats", err)
	}
	return st, nil
}

// earlier is the earlier of a (zero: none yet) and b.
func earlier(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}
