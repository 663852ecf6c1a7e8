// Package runlog owns what edge keeps about its runs: each run's record and
// its event sequence, in one bbolt file under the data dir. Sequences start at
// 1 and stay contiguous across attempts, so a reader paging by cursor never
// misses or repeats an event, before or after edge restarts.
//
// Layout (version 1): bucket "runs" maps a run id to its Record (JSON),
// "tokens" maps a clientToken to its run id, and "events" holds one nested
// bucket per run whose keys are big-endian sequences and whose values are
// Event (JSON). The nested bucket's own sequence counter numbers the events,
// so numbering and storing happen in one transaction. Buckets "egress" and
// "egressHeads" keep each run's egress ledger (egress.go); a file made
// before them gains them, empty, when opened.
//
// The stored forms (Record, Request, Secret, Event) are this package's own,
// apart from the host protocol's wire types: their JSON is the file's
// contract and changes only with layoutVersion. An event's Data is stored as
// the runner gave it and read back byte for byte.
package runlog

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// layoutVersion is written in the meta bucket; a file of another version is
// refused rather than misread.
const layoutVersion = "1"

var (
	bucketMeta   = []byte("meta")
	bucketRuns   = []byte("runs")
	bucketTokens = []byte("tokens")
	bucketEvents = []byte("events")
	keyVersion   = []byte("version")
	keyInstance  = []byte("instance")
)

// batchDelay is how long an append waits for others to share its
// transaction (bbolt's Batch). bbolt's default, 10 ms, made one run's
// appends wait that long each: its output was read from the terminal at a
// few KiB per 10 ms, about 400 KiB/s, whatever the disk. A millisecond
// still gathers the appends of many chatty runs, which arrive together.
const batchDelay = time.Millisecond

// ErrNotFound is returned for a run id the log does not hold.
var ErrNotFound = errors.New("runlog: run not found")

// Log is the run log. It is safe for concurrent use.
type Log struct {
	db       *bolt.DB
	instance uint64
}

// Open opens (creating when missing) the run log at path, made 0600 in a
// directory edge alone can read. random (nil: crypto/rand) draws the log's
// Instance when the file is created.
func Open(path string, random io.Reader) (*Log, error) {
	if random == nil {
		random = rand.Reader
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("runlog: creating %s: %w", filepath.Dir(path), err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("runlog: opening %s: %w", path, err)
	}
	db.MaxBatchDelay = batchDelay
	var instance uint64
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		switch v := meta.Get(keyVersion); {
		case v == nil:
			if err := meta.Put(keyVersion, []byte(layoutVersion)); err != nil {
				return err
			}
		case string(v) != layoutVersion:
			return fmt.Errorf("layout version %q, this edge reads %q", v, layoutVersion)
		}
		if meta.Get(keyInstance) == nil {
			b := make([]byte, 8)
			if _, err := io.ReadFull(random, b); err != nil {
				return fmt.Errorf("drawing the instance number: %w", err)
			}
			if err := meta.Put(keyInstance, b); err != nil {
				return err
			}
		}
		if v := meta.Get(keyInstance); len(v) == 8 {
			instance = binary.BigEndian.Uint64(v)
		}
		for _, name := range [][]byte{bucketRuns, bucketTokens, bucketEvents, bucketEgress, bucketEgressHeads} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("runlog: preparing %s: %w", path, err)
	}
	return &Log{db: db, instance: instance}, nil
}

// Instance is a random number drawn when the log's file was created and
// kept with it: it tells this edge's runs from another's that share a
// machine (the runner offsets its per-run group ids by it).
func (l *Log) Instance() uint64 { return l.instance }

// Path is the log's file.
func (l *Log) Path() string { return l.db.Path() }

// Close closes the file; calls after it fail.
func (l *Log) Close() error { return l.db.Close() }

// Record is a run as edge keeps it. It is a stored format: fields may be
// added, never renamed.
type Record struct {
	RunID       string `json:"runId"`
	ClientToken string `json:"clientToken"`
	// Serial numbers runs in creation order, from 1; the runner derives the
	// run's own group id from it.
	Serial   uint64 `json:"serial"`
	Status   string `json:"status"`
	Attempt  int    `json:"attempt"`
	ExitCode *int   `json:"exitCode,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Detail   string `json:"detail,omitempty"`
	// Request is the start as it was accepted.
	Request   Request   `json:"request"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// EndedAt is when the last attempt ended; nil while one is live.
	EndedAt *time.Time `json:"endedAt,omitempty"`
}

// Request is a run's start as stored with its record: what each attempt
// runs. Its JSON is the one files of layout version 1 hold.
type Request struct {
	ClientToken string            `json:"clientToken"`
	Deadline    *time.Time        `json:"deadline,omitempty"`
	Agent       string            `json:"agent"`
	Prompt      string            `json:"prompt,omitempty"`
	Argv        []string          `json:"argv,omitempty"`
	Repository  string            `json:"repository,omitempty"`
	CloneURL    string            `json:"cloneUrl,omitempty"`
	LocalPath   string            `json:"localPath,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Secrets     []Secret          `json:"secrets,omitempty"`
}

// Secret is one key a stored run declared. Domains has no omitempty: files
// of layout version 1 hold null for none.
type Secret struct {
	ProjectID string   `json:"projectId"`
	Key       string   `json:"key"`
	Domains   []string `json:"domains"`
}

// Event is one stored entry of a run's event sequence.
type Event struct {
	Sequence int64           `json:"sequence"`
	Type     string          `json:"type"`
	Data     json.RawMessage `json:"data"`
	TS       time.Time       `json:"ts"`
}

// Page is a stretch of a run's events (Log.Page).
type Page struct {
	Events []Event
	// NextCursor is the sequence of the last event returned (after, when
	// none was).
	NextCursor int64
	// HasMore tells whether a further event exists now.
	HasMore bool
	// PastEnd: after is past the run's last event (no event came, and
	// NextCursor names a place no event has reached).
	PastEnd bool
}

// Entry is an event to append; the log numbers it.
type Entry struct {
	Type string
	Data json.RawMessage
	TS   time.Time
}

// Create stores rec as a new run unless its ClientToken is already known, in
// which case it returns the known run and false. The check and the write are
// one transaction, so concurrent creates with one token make one run. Create
// sets rec.Serial.
func (l *Log) Create(rec Record, events ...Entry) (Record, bool, error) {
	created := false
	err := l.db.Update(func(tx *bolt.Tx) error {
		created = false
		tokens := tx.Bucket(bucketTokens)
		if id := tokens.Get([]byte(rec.ClientToken)); id != nil {
			known, err := getRecord(tx, string(id))
			if err != nil {
				return err
			}
			rec = known
			return nil
		}
		runs := tx.Bucket(bucketRuns)
		if runs.Get([]byte(rec.RunID)) != nil {
			return fmt.Errorf("run id %s already exists", rec.RunID)
		}
		serial, err := runs.NextSequence()
		if err != nil {
			return err
		}
		rec.Serial = serial
		if err := putRecord(tx, rec); err != nil {
			return err
		}
		if err := tokens.Put([]byte(rec.ClientToken), []byte(rec.RunID)); err != nil {
			return err
		}
		if _, err := tx.Bucket(bucketEvents).CreateBucket([]byte(rec.RunID)); err != nil {
			return err
		}
		if _, err := appendEvents(tx, rec.RunID, events); err != nil {
			return err
		}
		created = true
		return nil
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("runlog: creating run: %w", err)
	}
	return rec, created, nil
}

// Get returns the run's record, or ErrNotFound.
func (l *Log) Get(runID string) (Record, error) {
	var rec Record
	err := l.db.View(func(tx *bolt.Tx) error {
		var err error
		rec, err = getRecord(tx, runID)
		return err
	})
	return rec, err
}

// ByClientToken returns the run started with token and whether there is one.
func (l *Log) ByClientToken(token string) (Record, bool, error) {
	var rec Record
	found := false
	err := l.db.View(func(tx *bolt.Tx) error {
		id := tx.Bucket(bucketTokens).Get([]byte(token))
		if id == nil {
			return nil
		}
		var err error
		rec, err = getRecord(tx, string(id))
		found = err == nil
		return err
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("runlog: finding run by client token: %w", err)
	}
	return rec, found, nil
}

// Update applies change to the run's record and appends events, in one
// transaction: a state and the event announcing it are stored together or not
// at all. change may be called more than once and must depend only on the
// record it is given; an error from it aborts the update and is returned as is.
func (l *Log) Update(runID string, change func(*Record) error, events ...Entry) (Record, error) {
	var rec Record
	err := l.db.Update(func(tx *bolt.Tx) error {
		var err error
		if rec, err = getRecord(tx, runID); err != nil {
			return err
		}
		if change != nil {
			if err := change(&rec); err != nil {
				return err
			}
		}
		if err := putRecord(tx, rec); err != nil {
			return err
		}
		_, err = appendEvents(tx, runID, events)
		return err
	})
	return rec, err
}

// Append numbers and stores events for the run, returning the last sequence.
// Concurrent appends share transactions (bbolt's batching), which keeps a
// hundred chatty runs from queueing behind one fsync each.
func (l *Log) Append(runID string, events ...Entry) (int64, error) {
	if len(events) == 0 {
		return 0, nil
	}
	var last int64
	err := l.db.Batch(func(tx *bolt.Tx) error {
		var err error
		last, err = appendEvents(tx, runID, events)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("runlog: appending events: %w", err)
	}
	return last, nil
}

// Page returns up to limit events with sequence greater than after, in order.
// NextCursor is the last sequence returned (after itself when none was), and
// HasMore tells whether a further event exists now.
func (l *Log) Page(runID string, after int64, limit int) (Page, error) {
	page := Page{Events: []Event{}, NextCursor: after}
	if after < 0 {
		after = 0
	}
	err := l.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEvents).Bucket([]byte(runID))
		if b == nil {
			return ErrNotFound
		}
		c := b.Cursor()
		k, v := c.Seek(seqKey(after + 1))
		for ; k != nil && len(page.Events) < limit; k, v = c.Next() {
			var ev Event
			if err := json.Unmarshal(v, &ev); err != nil {
				return fmt.Errorf("event %d of run %s: %w", binary.BigEndian.Uint64(k), runID, err)
			}
			page.Events = append(page.Events, ev)
			page.NextCursor = ev.Sequence
		}
		page.HasMore = k != nil
		if len(page.Events) == 0 && after > 0 {
			last, _ := c.Last()
			page.PastEnd = last == nil || int64(binary.BigEndian.Uint64(last)) < after
		}
		return nil
	})
	if err != nil {
		return Page{}, err
	}
	return page, nil
}

// Records calls visit with every run's record, in no particular order, until
// it returns false.
func (l *Log) Records(visit func(Record) bool) error {
	err := l.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRuns).ForEach(func(_, v []byte) error {
			var rec Record
			if err := json.Unmarshal(v, &rec); err != nil {
				return err
			}
			if !visit(rec) {
				return errStop
			}
			return nil
		})
	})
	if err != nil && !errors.Is(err, errStop) {
		return fmt.Errorf("runlog: listing runs: %w", err)
	}
	return nil
}

var errStop = errors.New("stop")

// Delete removes the run, its token, its events and its egress ledger. A
// run that is not there is not an error.
func (l *Log) Delete(runID string) error {
	return l.db.Update(func(tx *bolt.Tx) error {
		rec, err := getRecord(tx, runID)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		tokens := tx.Bucket(bucketTokens)
		if string(tokens.Get([]byte(rec.ClientToken))) == runID {
			if err := tokens.Delete([]byte(rec.ClientToken)); err != nil {
				return err
			}
		}
		if tx.Bucket(bucketEvents).Bucket([]byte(runID)) != nil {
			if err := tx.Bucket(bucketEvents).DeleteBucket([]byte(runID)); err != nil {
				return err
			}
		}
		if err := deleteEgress(tx, runID); err != nil {
			return err
		}
		return tx.Bucket(bucketRuns).Delete([]byte(runID))
	})
}

func getRecord(tx *bolt.Tx, runID string) (Record, error) {
	v := tx.Bucket(bucketRuns).Get([]byte(runID))
	if v == nil {
		return Record{}, ErrNotFound
	}
	var rec Record
	if err := json.Unmarshal(v, &rec); err != nil {
		return Record{}, fmt.Errorf("record of run %s: %w", runID, err)
	}
	return rec, nil
}

func putRecord(tx *bolt.Tx, rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketRuns).Put([]byte(rec.RunID), b)
}

func appendEvents(tx *bolt.Tx, runID string, events []Entry) (int64, error) {
	if len(events) == 0 {
		return 0, nil
	}
	b := tx.Bucket(bucketEvents).Bucket([]byte(runID))
	if b == nil {
		return 0, ErrNotFound
	}
	var last int64
	for _, e := range events {
		seq, err := b.NextSequence()
		if err != nil {
			return 0, err
		}
		last = int64(seq)
		v, err := json.Marshal(Event{Sequence: last, Type: e.Type, Data: e.Data, TS: e.TS.UTC()})
		if err != nil {
			return 0, err
		}
		if err := b.Put(seqKey(last), v); err != nil {
			return 0, err
		}
	}
	return last, nil
}

func seqKey(seq int64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, uint64(seq))
	return k
}
