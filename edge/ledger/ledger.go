// Package ledger owns each run's egress ledger on edge (issue 31): one
// record per decision the run's traffic caused (each intercepted request,
// tunnel and refused connection, each SSH request: the proxy's audit
// entries of the run; each name its DNS refused), numbered from 1 across
// the run's attempts, chained (egress.Next over egress.Canonical, so a
// record altered, removed or moved fails egress.Verify naming it), counted
// (egress.Tally), bounded per run, kept in the run log beside the run's
// events and purged with it, and sealed with the host's ledger key
// (Ed25519, LoadKey) when an attempt ends.
//
// The proxy pays nothing for it on a request's goroutine: the audit's
// flush hands each batch to Record (audit.Config.Ledger), which queues it;
// one writer goroutine converts, redacts, chains and counts the records
// and stores every run a pass touched in one run log transaction.
//
// Past Config.MaxRecords records a run's further records are not kept but
// counted, all they say included (Tally.AddDropped); when the run is
// sealed, one egress.Dropped record carrying how many were dropped since
// the previous one is appended first, so the Dropped records of a ledger
// add up to exactly the records it did not keep.
package ledger

import (
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/egress"
)

// DefaultMaxRecords is Config.MaxRecords's default (edge.json's
// proxy.ledger.maxRecords): a run's records beyond it are counted, not
// kept. At a few hundred bytes a record, a run's ledger stays within a
// few MiB of the run log.
const DefaultMaxRecords = 10000

// Page sizes (Page's limit): the event pages'.
const (
	DefaultPage = 100
	MaxPage     = 1000
)

// retryEvery is how soon a pass whose write failed is tried again.
const retryEvery = time.Second

// chunkRecords bounds the records stored under one key of the run log
// (runlog.EgressChunk): a put per chunk, not per record, and a page reads
// at most a chunk more than it serves.
const chunkRecords = 256

// Errors.
var (
	// ErrNotFound: the host holds no such run.
	ErrNotFound = errors.New("ledger: run not found")
	// ErrClosed: the ledger was closed.
	ErrClosed = errors.New("ledger: closed")
)

// Store keeps ledgers; *runlog.Log is it. WriteEgress stores many runs in
// one transaction and skips (returning them in gone) runs it does not
// hold; EgressPage returns runlog.ErrNotFound for those. Safe for
// concurrent use.
type Store interface {
	EgressHead(runID string) (runlog.EgressHead, bool, error)
	WriteEgress(writes []runlog.EgressWrite) (gone []string, err error)
	EgressPage(runID string, after int64, limit int) (runlog.EgressPage, error)
}

var _ Store = (*runlog.Log)(nil)

// Config configures a Ledger.
type Config struct {
	// Store keeps the ledgers: the run log. Required.
	Store Store
	// Key seals ledgers (LoadKey). Required.
	Key ed25519.PrivateKey
	// MaxRecords bounds the records kept per run (Dropped records aside);
	// zero means DefaultMaxRecords.
	MaxRecords int
	// Redact, when set, is run over each record's canonical form before it
	// is hashed (redact.Set.Redact): a real value found is taken out of the
	// field it is in. Called on the writer's goroutine.
	Redact func([]byte) []byte
	// Flush, when set, hands every decision recorded so far to Record
	// (audit.Log.Flush); Seal calls it first, so a seal covers every
	// decision made before it.
	Flush func()
	// Clock stamps Dropped records and seals; nil means the real clock.
	Clock clock.Clock
	// Logger reports faults (a write that failed); nil discards.
	Logger *slog.Logger
}

// Validate checks a Config, naming the field at fault.
func (c Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("ledger: Store is required"))
	}
	if len(c.Key) != ed25519.PrivateKeySize {
		errs = append(errs, errors.New("ledger: Key is required (an Ed25519 private key)"))
	}
	if c.MaxRecords < 0 {
		errs = append(errs, fmt.Errorf("ledger: MaxRecords must not be negative, not %d", c.MaxRecords))
	}
	return errors.Join(errs...)
}

// Ledger keeps the runs' ledgers. Safe for concurrent use.
type Ledger struct {
	cfg       Config
	publicKey string

	// mu guards the queue: what Record, Seal and Reopen handed over and the
	// writer has not taken yet, in the order they came.
	mu     sync.Mutex
	queue  []item
	closed bool
	wake   chan struct{} // one pending wake-up of the writer
	done   chan struct{} // closed when the writer has ended

	// runs is the writer's: the state of each run touched since it was
	// last stored with its attempt ended (live runs stay, ended ones are
	// read again from the store when a late record comes).
	runs map[string]*runState
	enc  *encoder // the writer's
}

type itemKind int

const (
	itemEntry  itemKind = iota // a decision
	itemSeal                   // an attempt ended: seal
	itemReopen                 // an attempt began: no seal stands while it lives
)

type item struct {
	kind  itemKind
	runID string
	entry audit.Entry
	done  chan error // itemSeal: the pass's outcome
}

// runState is where one run's chain stands, and what the next write
// stores of it.
type runState struct {
	id   string
	head runlog.EgressHead
	last [32]byte
	// pending are the records not stored yet, in chunks of at most
	// chunkRecords; inLast counts the last chunk's.
	pending []runlog.EgressChunk
	inLast  int
	// changed: the head moved since it was stored; resign: the chain must
	// be (re)sealed at the pass's end.
	changed, resign bool
}

// New starts a Ledger's writer; Close stops it.
func New(cfg Config) (*Ledger, error) {
	if cfg.MaxRecords == 0 {
		cfg.MaxRecords = DefaultMaxRecords
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Ledger{
		cfg:       cfg,
		publicKey: egress.FormatPublicKey(cfg.Key.Public().(ed25519.PublicKey)),
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		runs:      map[string]*runState{},
		enc:       newEncoder(),
	}
	go l.write()
	return l, nil
}

// PublicKey is the host's ledger key as /healthz reports it
// (egress.FormatPublicKey).
func (l *Ledger) PublicKey() string { return l.publicKey }

// Record takes the audit's flushed batch (audit.Config.Ledger): each entry
// of a run (Task set) becomes a record of that run's ledger, in order. It
// copies what it keeps and does not block.
func (l *Ledger) Record(batch []audit.Entry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	for i := range batch {
		if e := &batch[i]; e.Task != "" {
			l.queue = append(l.queue, item{kind: itemEntry, runID: e.Task, entry: *e})
		}
	}
	l.signal()
}

// Reopen tells the ledger that an attempt of runID began (a retry): the
// seal of its earlier attempt no longer stands for the ledger, which
// grows again on the same chain until Seal. It does not block.
func (l *Ledger) Reopen(runID string) { l.enqueue(item{kind: itemReopen, runID: runID}) }

// Seal seals runID's ledger as its attempt ends: every decision recorded
// before the call (Config.Flush) is kept or counted, a Dropped record is
// appended when records were dropped since the last one, and the chain is
// signed and stored. It returns once that is stored. A record arriving
// afterwards (a connection that closes late) is chained after the seal
// and the run sealed again then.
func (l *Ledger) Seal(runID string) error {
	if l.cfg.Flush != nil {
		l.cfg.Flush()
	}
	done := make(chan error, 1)
	if !l.enqueue(item{kind: itemSeal, runID: runID, done: done}) {
		return ErrClosed
	}
	return <-done
}

func (l *Ledger) enqueue(it item) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.queue = append(l.queue, it)
	l.signal()
	return true
}

// signal wakes the writer; the caller holds mu.
func (l *Ledger) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Close stores what was handed over and stops the writer; later Records
// are ignored and Seal returns ErrClosed.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		l.signal()
	}
	l.mu.Unlock()
	<-l.done
	return nil
}

// write is the writer's loop: each pass takes the queue whole and stores
// it in one transaction.
func (l *Ledger) write() {
	defer close(l.done)
	var items []item
	for range l.wake {
		l.mu.Lock()
		items, l.queue = l.queue, items[:0]
		closed := l.closed
		l.mu.Unlock()
		l.pass(items)
		clear(items) // no entry held until the next pass
		if closed {
			return
		}
	}
}

// pass applies items in order, then seals the runs whose attempt has ended
// and whose chain moved, and stores every run touched in one write.
func (l *Ledger) pass(items []item) {
	var touched []*runState
	seen := map[string]bool{}
	var waiting []item
	for i := range items {
		it := &items[i]
		st, err := l.state(it.runID)
		if err != nil {
			l.cfg.Logger.Error("ledger: reading a run's ledger", slog.String("run", it.runID), slog.String("error", err.Error()))
			if it.kind == itemSeal {
				it.done <- err
			}
			continue
		}
		if it.kind == itemSeal {
			waiting = append(waiting, *it)
		}
		if !seen[st.id] {
			seen[st.id] = true
			touched = append(touched, st)
		}
		switch it.kind {
		case itemEntry:
			l.add(st, &it.entry)
		case itemSeal:
			st.head.Ended, st.resign, st.changed = true, true, true
		case itemReopen:
			if st.head.Ended || st.head.Seal != nil {
				st.head.Ended, st.head.Seal, st.changed = false, nil, true
			}
		}
	}
	// What an earlier pass failed to store is stored now too.
	for id, st := range l.runs {
		if !seen[id] && (st.changed || len(st.pending) > 0) {
			touched = append(touched, st)
		}
	}
	var writes []runlog.EgressWrite
	for _, st := range touched {
		if st.head.Ended && (st.resign || len(st.pending) > 0) {
			l.seal(st)
		}
		if st.changed || len(st.pending) > 0 {
			if st.head.Count > 0 {
				st.head.LastHash = hex.EncodeToString(st.last[:])
			}
			writes = append(writes, runlog.EgressWrite{RunID: st.id, Chunks: st.pending, Head: st.head})
		}
	}
	gone, err := l.cfg.Store.WriteEgress(writes)
	if err != nil {
		l.cfg.Logger.Error("ledger: storing runs' records", slog.Int("runs", len(writes)), slog.String("error", err.Error()))
		l.cfg.Clock.AfterFunc(retryEvery, func() {
			l.mu.Lock()
			l.signal()
			l.mu.Unlock()
		})
	} else {
		for _, st := range touched {
			st.pending, st.inLast, st.changed, st.resign = nil, 0, false, false
			if st.head.Ended {
				delete(l.runs, st.id) // read again if a late record comes
			}
		}
		for _, id := range gone {
			delete(l.runs, id)
		}
	}
	for _, it := range waiting {
		it.done <- err
	}
}

// state is runID's chain state: cached, or read from the store (the chain
// continues where the last edge left it), or a new chain.
func (l *Ledger) state(runID string) (*runState, error) {
	if st := l.runs[runID]; st != nil {
		return st, nil
	}
	head, found, err := l.cfg.Store.EgressHead(runID)
	if err != nil {
		return nil, err
	}
	st := &runState{id: runID, head: head, last: egress.Genesis(runID)}
	if found && head.Count > 0 {
		b, err := hex.DecodeString(head.LastHash)
		if err != nil || len(b) != len(st.last) {
			return nil, fmt.Errorf("the stored last hash of run %s is not a SHA-256 in hex", runID)
		}
		copy(st.last[:], b)
	}
	l.runs[runID] = st
	return st, nil
}

// add keeps e's record in st's chain, or, past the bound, counts it as
// dropped: with what the tally keeps of it alone (its authority redacted,
// as a kept record's is), since nothing else of it is kept.
func (l *Ledger) add(st *runState, e *audit.Entry) {
	if st.head.Count < int64(l.cfg.MaxRecords) {
		l.append(st, recordOf(e))
		return
	}
	r := tallied(e)
	if l.cfg.Redact != nil {
		if out := l.cfg.Redact([]byte(r.Authority)); string(out) != r.Authority {
			r.Authority = string(out)
		}
	}
	st.head.Tally.AddDropped(r)
	st.head.DroppedSinceLast++
	st.changed = true
}

// append chains r after st's last record and counts it.
func (l *Ledger) append(st *runState, r egress.Record) {
	r.Seq = st.head.Count + 1
	c, err := l.enc.canonical(&r, l.cfg.Redact)
	if err != nil {
		// Every field is a string, number or time: this cannot fail. A
		// record that did is counted as dropped, never lost from the count.
		l.cfg.Logger.Error("ledger: encoding a record", slog.String("run", st.id), slog.String("error", err.Error()))
		st.head.Tally.AddDropped(r)
		st.head.DroppedSinceLast++
		st.changed = true
		return
	}
	st.last = egress.Next(st.last, c)
	st.head.Count = r.Seq
	st.head.Tally.Add(r)
	if len(st.pending) == 0 || st.inLast == chunkRecords {
		st.pending = append(st.pending, runlog.EgressChunk{First: r.Seq, Data: make([]byte, 0, 4<<10)})
		st.inLast = 0
	}
	last := &st.pending[len(st.pending)-1]
	last.Data = appendStored(last.Data, c, st.last)
	st.inLast++
	st.changed = true
}

// seal appends the Dropped record the chain owes, if any, and signs it.
func (l *Ledger) seal(st *runState) {
	now := l.cfg.Clock.Now().UTC()
	if n := st.head.DroppedSinceLast; n > 0 {
		st.head.DroppedSinceLast = 0
		l.append(st, egress.Record{TS: now, Action: egress.Dropped, Dropped: n,
			Reason: fmt.Sprintf("%d records past the ledger's bound of %d were counted, not kept", n, l.cfg.MaxRecords)})
	}
	s := egress.Sign(l.cfg.Key, st.id, st.head.Count, st.last, now)
	st.head.Seal = &s
	st.changed = true
}

// Page is a stretch of a run's ledger as stored: records after a sequence,
// with the summary of the whole ledger and its seal of the same moment.
type Page struct {
	Records []egress.Record
	// NextCursor is the sequence of the last record returned (after, when
	// none was); HasMore tells whether a further record exists now;
	// PastEnd, that after is past the ledger's last record.
	NextCursor int64
	HasMore    bool
	PastEnd    bool
	// Summary counts every decision, those past the bound included.
	Summary egress.Summary
	// Seal is the latest seal, nil while an attempt of the run is live.
	Seal *egress.Seal
}

// Page returns up to limit records of runID's ledger after a sequence
// (limit 0: DefaultPage; above MaxPage: MaxPage). A record is there once
// the writer has stored it: within the audit's flush interval and a pass.
// ErrNotFound for a run the host does not hold.
func (l *Ledger) Page(runID string, after int64, limit int) (Page, error) {
	if limit <= 0 {
		limit = DefaultPage
	}
	limit = min(limit, MaxPage)
	p, err := l.cfg.Store.EgressPage(runID, after, limit)
	if errors.Is(err, runlog.ErrNotFound) {
		return Page{}, ErrNotFound
	}
	if err != nil {
		return Page{}, fmt.Errorf("ledger: reading run %s: %w", runID, err)
	}
	page := Page{Records: make([]egress.Record, 0, len(p.Records)), NextCursor: p.NextCursor, HasMore: p.HasMore,
		PastEnd: p.PastEnd, Summary: p.Head.Tally.Summary(), Seal: p.Head.Seal}
	for _, b := range p.Records {
		r, err := decode(b)
		if err != nil {
			return Page{}, fmt.Errorf("ledger: reading run %s: a stored record: %w", runID, err)
		}
		page.Records = append(page.Records, r)
	}
	return page, nil
}
