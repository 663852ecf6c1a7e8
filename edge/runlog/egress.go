package runlog

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/egress"
)

// A run's egress ledger (issue 31) lives beside its events: bucket
// "egress" holds one nested bucket per run whose values are chunks of
// consecutive records, each keyed by the big-endian sequence of its first
// record and holding the records as the ledger wrote them (egress.Record's
// JSON, hash included, each followed by a newline), read back byte for
// byte; bucket "egressHeads" maps a run id to its EgressHead. A chunk, not
// a record, per key: a busy run's records cost one put per chunk, not one
// each. The ledger (edge/ledger) numbers, chains and bounds the records;
// this file keeps them, contiguous from 1, and never rewrites one.
var (
	bucketEgress      = []byte("egress")
	bucketEgressHeads = []byte("egressHeads")
)

// EgressHead is where a run's ledger stands, as stored: what the ledger
// needs to continue the chain after a restart, and what a page serves
// beside the records. It is a stored format: fields may be added, never
// renamed.
type EgressHead struct {
	// Count is how many records are kept: the last sequence.
	Count int64 `json:"count"`
	// LastHash is the chain's hash after record Count, hex; empty while
	// there is none (the chain starts at egress.Genesis).
	LastHash string `json:"lastHash,omitempty"`
	// Tally counts every decision of the run, those past the bound too.
	Tally egress.Tally `json:"tally"`
	// DroppedSinceLast counts the records not kept since the last Dropped
	// record: the count the next one carries.
	DroppedSinceLast int64 `json:"droppedSinceLast,omitempty"`
	// Ended tells that the run's last attempt has ended: its chain is
	// sealed, and sealed again when a late record arrives.
	Ended bool `json:"ended,omitempty"`
	// Seal is the host's latest seal over the chain; nil while an attempt
	// is live.
	Seal *egress.Seal `json:"seal,omitempty"`
}

// EgressChunk is consecutive records stored together: First is the first
// one's sequence, Data each record's JSON followed by a newline (JSON
// escapes every newline inside a record).
type EgressChunk struct {
	First int64
	Data  []byte
}

// Records counts the chunk's records.
func (c EgressChunk) Records() int64 { return int64(bytes.Count(c.Data, newline)) }

var newline = []byte{'\n'}

// EgressWrite is one run's share of a WriteEgress: the chunks of records
// that follow those stored, in order, and the head after them.
type EgressWrite struct {
	RunID  string
	Chunks []EgressChunk
	Head   EgressHead
}

// EgressPage is a stretch of a run's ledger (Log.EgressPage), read in one
// transaction with the head, so the summary and seal served beside the
// records are of the same moment.
type EgressPage struct {
	Records []json.RawMessage
	// NextCursor is the sequence of the last record returned (after, when
	// none was).
	NextCursor int64
	// HasMore tells whether a further record exists now.
	HasMore bool
	// PastEnd: after is past the ledger's last record.
	PastEnd bool
	// Head is the run's head; zero for a run with no ledger yet.
	Head EgressHead
}

// errNotContiguous refuses a write whose records do not follow those
// stored, one by one up to its head's count: a record once written is
// never replaced, and none is ever missing.
var errNotContiguous = errors.New("the records do not follow those stored")

// WriteEgress stores every write's records and head in one transaction
// (one fsync for every run a flush touched). A run the log does not hold
// (purged meanwhile, or never created) is skipped, its id returned in
// gone. Records that do not start right after the stored ones, or do not
// end at the head's count, fail the whole write.
func (l *Log) WriteEgress(writes []EgressWrite) (gone []string, err error) {
	if len(writes) == 0 {
		return nil, nil
	}
	err = l.db.Update(func(tx *bolt.Tx) error {
		gone = gone[:0]
		runs, heads := tx.Bucket(bucketRuns), tx.Bucket(bucketEgressHeads)
		for _, w := range writes {
			if runs.Get([]byte(w.RunID)) == nil {
				gone = append(gone, w.RunID)
				continue
			}
			stored, _, err := getEgressHead(tx, w.RunID)
			if err != nil {
				return err
			}
			next := stored.Count + 1
			for _, c := range w.Chunks {
				if c.First != next || c.Records() == 0 {
					return fmt.Errorf("run %s: records from %d after %d stored: %w", w.RunID, c.First, next-1, errNotContiguous)
				}
				b, err := tx.Bucket(bucketEgress).CreateBucketIfNotExists([]byte(w.RunID))
				if err != nil {
					return err
				}
				// Appended in order and never changed: pages filled whole.
				b.FillPercent = 1
				if err := b.Put(seqKey(c.First), c.Data); err != nil {
					return err
				}
				next += c.Records()
			}
			if next-1 != w.Head.Count {
				return fmt.Errorf("run %s: records up to %d, a head of %d: %w", w.RunID, next-1, w.Head.Count, errNotContiguous)
			}
			v, err := json.Marshal(w.Head)
			if err != nil {
				return err
			}
			if err := heads.Put([]byte(w.RunID), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("runlog: writing egress records: %w", err)
	}
	return gone, nil
}

// EgressHead returns the run's stored head, and false when it has none.
func (l *Log) EgressHead(runID string) (EgressHead, bool, error) {
	var h EgressHead
	found := false
	err := l.db.View(func(tx *bolt.Tx) error {
		var err error
		h, found, err = getEgressHead(tx, runID)
		return err
	})
	return h, found, err
}

// EgressPage returns up to limit records with sequence greater than after,
// in order, with the run's head; ErrNotFound for a run the log does not
// hold.
func (l *Log) EgressPage(runID string, after int64, limit int) (EgressPage, error) {
	page := EgressPage{Records: []json.RawMessage{}, NextCursor: after}
	if after < 0 {
		after = 0
	}
	err := l.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketRuns).Get([]byte(runID)) == nil {
			return ErrNotFound
		}
		var err error
		if page.Head, _, err = getEgressHead(tx, runID); err != nil {
			return err
		}
		last := page.Head.Count
		page.PastEnd = after > last
		b := tx.Bucket(bucketEgress).Bucket([]byte(runID))
		if b == nil || after >= last {
			return nil
		}
		// The chunk holding record after+1 is the last one starting at or
		// before it.
		c := b.Cursor()
		k, v := c.Seek(seqKey(after + 1))
		if k == nil {
			k, v = c.Last()
		} else if int64(binary.BigEndian.Uint64(k)) > after+1 {
			k, v = c.Prev()
		}
		for ; k != nil && len(page.Records) < limit; k, v = c.Next() {
			seq := int64(binary.BigEndian.Uint64(k))
			for rest := v; len(rest) > 0 && len(page.Records) < limit; seq++ {
				rec, tail, _ := bytes.Cut(rest, newline)
				rest = tail
				if seq > after {
					page.Records = append(page.Records, json.RawMessage(bytes.Clone(rec)))
					page.NextCursor = seq
				}
			}
		}
		page.HasMore = page.NextCursor < last
		return nil
	})
	if err != nil {
		return EgressPage{}, err
	}
	return page, nil
}

func getEgressHead(tx *bolt.Tx, runID string) (EgressHead, bool, error) {
	var h EgressHead
	v := tx.Bucket(bucketEgressHeads).Get([]byte(runID))
	if v == nil {
		return h, false, nil
	}
	if err := json.Unmarshal(v, &h); err != nil {
		return EgressHead{}, false, fmt.Errorf("runlog: egress head of run %s: %w", runID, err)
	}
	return h, true, nil
}

// deleteEgress removes the run's ledger (Delete).
func deleteEgress(tx *bolt.Tx, runID string) error {
	if tx.Bucket(bucketEgress).Bucket([]byte(runID)) != nil {
		if err := tx.Bucket(bucketEgress).DeleteBucket([]byte(runID)); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketEgressHeads).Delete([]byte(runID))
}
