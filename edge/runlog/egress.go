package runlog

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/runfleet/runfleet/shared/egress"
)

// A run's egress ledger (issue 31) lives beside its events: bucket
// "egress" holds one nested bucket per run whose keys are big-endian
// sequences and whose values are the records as the ledger wrote them
// (egress.Record's JSON, hash included), read back byte for byte; bucket
// "egressHeads" maps a run id to its EgressHead. The ledger (edge/ledger)
// numbers, chains and bounds the records; this file only keeps them, and
// never rewrites one.
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

// EgressRecord is one stored record: its sequence and its JSON.
type EgressRecord struct {
	Seq  int64
	Data json.RawMessage
}

// EgressWrite is one run's share of a WriteEgress: the records that follow
// those stored, and the head after them.
type EgressWrite struct {
	RunID   string
	Records []EgressRecord
	Head    EgressHead
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

// errRecordExists refuses a write over a stored record: a record once
// written is never replaced.
var errRecordExists = errors.New("a record of that sequence is stored already")

// WriteEgress stores every write's records and head in one transaction
// (one fsync for every run a flush touched). A run the log does not hold
// (purged meanwhile, or never created) is skipped, its id returned in
// gone. A record whose sequence is stored already fails the whole write:
// the ledger never rewrites a record.
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
			if len(w.Records) > 0 {
				b, err := tx.Bucket(bucketEgress).CreateBucketIfNotExists([]byte(w.RunID))
				if err != nil {
					return err
				}
				for _, r := range w.Records {
					k := seqKey(r.Seq)
					if b.Get(k) != nil {
						return fmt.Errorf("run %s, record %d: %w", w.RunID, r.Seq, errRecordExists)
					}
					if err := b.Put(k, r.Data); err != nil {
						return err
					}
				}
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
		b := tx.Bucket(bucketEgress).Bucket([]byte(runID))
		if b == nil {
			page.PastEnd = after > 0
			return nil
		}
		c := b.Cursor()
		k, v := c.Seek(seqKey(after + 1))
		for ; k != nil && len(page.Records) < limit; k, v = c.Next() {
			page.Records = append(page.Records, json.RawMessage(append([]byte(nil), v...)))
			page.NextCursor = int64(binary.BigEndian.Uint64(k))
		}
		page.HasMore = k != nil
		if len(page.Records) == 0 && after > 0 {
			last, _ := c.Last()
			page.PastEnd = last == nil || int64(binary.BigEndian.Uint64(last)) < after
		}
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
