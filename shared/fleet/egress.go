package fleet

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// The egress mirror (issue 31). A run's egress ledger is copied from its
// host into the store (the Egress role) by the same syncs that copy its
// events (mirror.go), after them: its records after the head's Cursor,
// page by page (PutEgress, to expire as events do), and only then the
// head (PutEgressHead: the cursor, the host's summary and seal, the alerts
// count), so the head's Cursor is the ledger mirror's horizon as the run's
// EventCursor is the events': readers never look past it.
//
// Writes are batched for cost (the issue bounds the mirror at 1 WCU per 10
// records, and a store packs records into items): while a run is live, the
// sweep copies its ledger only once Config.EgressBatch records are pending
// on the host (one host call a sweep tells how many), and at the run's end
// whatever is left. To tell, the sweep asks the host after the cursor it
// last knew for the run (ledgerCursors, kept by the process across sweeps)
// and reads the head only to write, so an unwatched live run costs no
// read of the store a sweep; a cursor it does not know (a cold start) is
// read from the head once. A stream asked for egress (SyncRunEgress) copies at
// every poll, however few: what watching a ledger live costs. Any other
// pull-through (a stream without egress, the events' long-poll) copies the
// ledger only once the run has ended, so that it may drain.
//
// A run is drained only once its ledger is mirrored to its sealed end (the
// state read before it terminal, the host's seal present and covering
// exactly the records mirrored), or once there is none to wait for: a
// host older than ledgers (404 on the route, not a run_not_found) has
// none, and a host that answers the route run_not_found holds an empty
// one. A host that has not sealed an ended run's ledger EgressSealGrace
// after Fleet recorded the end does not hold the run back longer: it is
// drained with the ledger as mirrored, logged at WARN, and verification
// then says the ledger is not sealed.

// Ledger pages and batching.
const (
	// hostEgressPage is how many records one host call asks for (a host's
	// maximum page).
	hostEgressPage = 1000
	// DefaultEgressBatch is Config.EgressBatch's default: a live run's
	// ledger is mirrored once this many records are pending. dynamostore
	// packs about fifty records into a 4 KB item (4 units), and the head
	// is one more unit a write: at fifty a batch the mirror measured 1.02
	// units per ten records, at a hundred under the bound of one
	// (BenchmarkEgressMirrorCost).
	DefaultEgressBatch = 100
	// EgressSealGrace is how long after its recorded end a run waits for
	// its host's seal before it is drained without one.
	EgressSealGrace = 10 * time.Minute
	// DefaultEgressLimit and MaxEgressLimit bound GET
	// /fleet/runs/{id}/egress.
	DefaultEgressLimit = 200
	MaxEgressLimit     = store.MaxLimit
	// maxEgressPageBytes bounds the records of one page of GET
	// /fleet/runs/{id}/egress, so an answer stays well inside Lambda's
	// 6 MB: a task chooses what fills a record (a path of 2 KiB, each byte
	// of which JSON may write as six), and a page stops short of the limit
	// asked (hasMore) rather than fail.
	maxEgressPageBytes = 4 << 20
)

// egressMode is how a sync treats a live run's ledger (see above).
type egressMode int

const (
	// egressAtEnd: copied only once the host's state is terminal.
	egressAtEnd egressMode = iota
	// egressBatched: also while live, once EgressBatch records are pending.
	egressBatched
	// egressEager: copied at every sync, however few records are pending.
	egressEager
)

// SyncRunEgress is SyncRun for a stream that carries the run's ledger:
// besides state and events, it copies every ledger record the host holds
// now, batch or not.
func (f *Fleet) SyncRunEgress(ctx context.Context, id string) (store.Run, error) {
	return f.syncByID(ctx, id, egressEager)
}

// egressPull is what pullEgress did.
type egressPull struct {
	// complete: nothing of the ledger is left to wait for (see the
	// egress mirror's comment); the run may drain.
	complete bool
	records  int
	// res is the failure or the partial outcome that stopped the pull;
	// zero when it ran its course.
	res syncResult
}

// pullEgress mirrors run's ledger from its host as pass's mode says, given
// hr, the host's state of the run read before its events.
func (f *Fleet) pullEgress(ctx, hostCtx context.Context, client *hostproto.Client, run store.Run, hr hostproto.Run, pass syncPass) egressPull {
	ended := store.Terminal(hr.Status)
	if pass.egress == egressAtEnd && !ended {
		return egressPull{}
	}
	var out egressPull
	var head store.EgressHead
	cursor, _ := f.ledgers.get(run.FleetRunID)
	headRead := false
	readHead := func() bool {
		var err error
		if head, err = f.egressHead(ctx, run); err != nil {
			f.log.Warn("sync failed", logRun, run.FleetRunID, logDoing, "reading the egress head", logErr, err.Error())
			out.res = syncResult{outcome: syncFailed, err: err}
			return false
		}
		headRead = true
		f.ledgers.set(run.FleetRunID, head.Cursor)
		return true
	}
	// A batched sync that does not know the cursor (a cold start) asks
	// the host from the start rather than read the head: most live runs
	// have fewer than a batch of records, and then nothing is written, so
	// nothing needs the head; one with a batch reads it before writing,
	// below. A sweep's cold start so costs its live runs no head read.
	if ended || pass.egress != egressBatched {
		if !readHead() {
			return out
		}
		cursor = head.Cursor
	}
	for limit := hostEgressPage; ; {
		if f.spent(pass) || ctx.Err() != nil {
			out.res = syncResult{outcome: syncPartial}
			return out
		}
		page, err := client.Egress(hostCtx, run.ChildRunID, cursor, limit)
		switch {
		case errors.Is(err, hostproto.ErrRunNotFound):
			// Its state was read a moment ago: the host holds no ledger
			// for it, an empty one (a lost run is the state read's to find).
			out.complete = true
			return out
		case noLedgerRoute(err):
			out.complete = true
			return out
		case errors.Is(err, hostproto.ErrTooLarge) && limit > 1:
			limit = max(1, limit/10)
			continue
		case err != nil:
			out.res = f.hostTrouble(run, pass.hosts, "reading the egress ledger", err)
			return out
		}
		fresh := newAfter(page.Records, func(r egress.Record) int64 { return r.Seq }, cursor)
		if out.records == 0 && !ended && pass.egress == egressBatched && !page.HasMore && len(fresh) < f.cfg.EgressBatch {
			return out // not a batch yet: left on the host for a later sweep
		}
		if !headRead {
			if !readHead() {
				return out
			}
			if head.Cursor != cursor {
				cursor = head.Cursor // another mirror moved it: ask again from there
				continue
			}
		}
		if head, err = f.mirrorEgress(ctx, run, head, fresh, page); err != nil {
			f.log.Warn("sync failed", logRun, run.FleetRunID, logDoing, "mirroring the egress ledger", logErr, err.Error())
			out.res = syncResult{outcome: syncFailed, err: err}
			return out
		}
		out.records += len(fresh)
		cursor = head.Cursor
		f.ledgers.set(run.FleetRunID, cursor)
		if page.HasMore && len(fresh) > 0 {
			continue
		}
		out.complete = ended && !page.HasMore && page.Seal != nil && page.Seal.Count == head.Cursor
		if ended && !out.complete && f.sealOverdue(run) {
			f.log.Warn("sync: the host has not sealed an ended run's egress ledger; draining it as mirrored",
				logRun, run.FleetRunID, logHost, run.HostID, logCursor, head.Cursor, "sealed", page.Seal != nil)
			out.complete = true
		}
		return out
	}
}

// ledgerCursors remembers, in the process, the ledger cursor of the live
// runs it mirrored or read last: a hint of where the head stands (never
// ahead of it: set from a head read or written), which spares the sweep a
// read of each live run's head (a run it does not know starts at 0). A
// hint behind the head costs a host page asked again; the head is read
// before any write. Bounded: past
// maxLedgerCursors runs it starts over. Safe for concurrent use.
type ledgerCursors struct {
	mu      sync.Mutex
	cursors map[string]int64
}

// maxLedgerCursors bounds ledgerCursors (a few MB).
const maxLedgerCursors = 100_000

func (l *ledgerCursors) get(fleetRunID string) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.cursors[fleetRunID]
	return c, ok
}

func (l *ledgerCursors) set(fleetRunID string, cursor int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cursors == nil || len(l.cursors) >= maxLedgerCursors {
		l.cursors = map[string]int64{}
	}
	l.cursors[fleetRunID] = cursor
}

// forget drops a drained run's cursor.
func (l *ledgerCursors) forget(fleetRunID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.cursors, fleetRunID)
}

// noLedgerRoute reports whether err is a host's 404 for the ledger's route
// itself (a host older than ledgers), not for the run (run_not_found).
func noLedgerRoute(err error) bool {
	var he *hostproto.Error
	return errors.As(err, &he) && !he.BadResponse && he.Status == http.StatusNotFound && he.Code == ""
}

// sealOverdue reports whether run ended, as Fleet recorded it, at least
// EgressSealGrace ago.
func (f *Fleet) sealOverdue(run store.Run) bool {
	return run.EndedAt != nil && f.clock.Now().Sub(*run.EndedAt) >= EgressSealGrace
}

// egressHead reads run's ledger head; a run without one gets an empty head
// (Version 0: PutEgressHead creates it).
func (f *Fleet) egressHead(ctx context.Context, run store.Run) (store.EgressHead, error) {
	head, err := f.store.GetEgressHead(ctx, run.FleetRunID)
	if errors.Is(err, store.ErrNotFound) {
		return store.EgressHead{FleetRunID: run.FleetRunID, HostID: run.HostID}, nil
	}
	if err != nil {
		return store.EgressHead{}, fmt.Errorf("fleet: reading the egress head of %s: %w", run.FleetRunID, err)
	}
	return head, nil
}

// mirrorEgress stores fresh (a host's page's records after head's Cursor,
// ascending) and then the head that covers them, with the page's summary
// and seal; it returns the head as stored. A head that would say nothing
// new is not written.
func (f *Fleet) mirrorEgress(ctx context.Context, run store.Run, head store.EgressHead, fresh []egress.Record, page hostproto.EgressPage) (store.EgressHead, error) {
	now := f.clock.Now().UTC()
	expires := f.eventExpiry(now)
	if len(fresh) > 0 && fresh[0].Seq != head.Cursor+1 {
		f.log.Warn("sync: the host's egress ledger skips records", logRun, run.FleetRunID, logHost, run.HostID,
			"after", head.Cursor, "first", fresh[0].Seq)
	}
	for _, part := range contiguous(fresh) {
		recs := make([]store.EgressRecord, len(part))
		for i, r := range part {
			rec, err := egressRecordFromWire(r)
			if err != nil {
				return head, fmt.Errorf("fleet: encoding egress record %d of %s: %w", r.Seq, run.FleetRunID, err)
			}
			recs[i] = rec
		}
		if err := f.store.PutEgress(ctx, run.FleetRunID, recs, expires); err != nil {
			return head, fmt.Errorf("fleet: mirroring %d egress records of %s: %w", len(recs), run.FleetRunID, err)
		}
	}
	next := head
	if len(fresh) > 0 {
		next.Cursor = fresh[len(fresh)-1].Seq
	}
	summary, err := json.Marshal(page.Summary)
	if err != nil {
		return head, fmt.Errorf("fleet: encoding the egress summary of %s: %w", run.FleetRunID, err)
	}
	var seal json.RawMessage
	if page.Seal != nil {
		if seal, err = json.Marshal(page.Seal); err != nil {
			return head, fmt.Errorf("fleet: encoding the egress seal of %s: %w", run.FleetRunID, err)
		}
	}
	switch {
	case head.Version == 0 && len(fresh) == 0 && seal == nil:
		return head, nil // a live run with no record yet: nothing to say
	case head.Version > 0 && next.Cursor == head.Cursor && bytes.Equal(summary, head.Summary) && bytes.Equal(seal, head.Seal):
		return head, nil
	}
	next.Summary, next.Seal, next.HostID, next.UpdatedAt = summary, seal, run.HostID, now
	next.Alerts = page.Summary.Alerts
	if next.Alerts > 0 && next.FirstAlertAt.IsZero() {
		next.FirstAlertAt = now // kept from then on (store.KeptFirstAlertAt)
	}
	if next.ExpiresAt.Before(expires) {
		next.ExpiresAt = expires
	}
	return f.putEgressHead(ctx, next)
}

// putEgressHead writes h over the head it was read as (h.Version). Lost
// to a concurrent sync (a stream's and the sweep's), it keeps the head
// that reaches further, or as far with a seal, and otherwise writes again
// over the one now stored: the head never goes back.
func (f *Fleet) putEgressHead(ctx context.Context, h store.EgressHead) (store.EgressHead, error) {
	const attempts = 5
	for i := 0; ; i++ {
		stored, err := f.store.PutEgressHead(ctx, h)
		if err == nil {
			return stored, nil
		}
		if !errors.Is(err, store.ErrConflict) || i == attempts-1 {
			return h, fmt.Errorf("fleet: writing the egress head of %s: %w", h.FleetRunID, err)
		}
		cur, err := f.store.GetEgressHead(ctx, h.FleetRunID)
		if err != nil {
			return h, fmt.Errorf("fleet: re-reading the egress head of %s: %w", h.FleetRunID, err)
		}
		if cur.Cursor > h.Cursor || (cur.Cursor == h.Cursor && (cur.Seal != nil || h.Seal == nil)) {
			return cur, nil
		}
		h.Version = cur.Version // FirstAlertAt: the store keeps the stored one
		if h.ExpiresAt.Before(cur.ExpiresAt) {
			h.ExpiresAt = cur.ExpiresAt
		}
	}
}

// contiguous splits records (ascending, no repeats) into runs of
// consecutive Seqs: PutEgress takes one run at a time.
func contiguous(records []egress.Record) [][]egress.Record {
	var out [][]egress.Record
	for i := 0; i < len(records); {
		j := i + 1
		for j < len(records) && records[j].Seq == records[j-1].Seq+1 {
			j++
		}
		out = append(out, records[i:j])
		i = j
	}
	return out
}

// EgressPage is a page of a run's ledger mirror: records after the asked
// cursor in ledger order, with the events pages' conventions (NextCursor,
// HasMore, PastEnd: see EventsPage; the horizon is the head's Cursor).
// Summary and Seal are the head's (nil without a head); Live: the ledger
// may still grow or be sealed (the run is not drained).
type EgressPage struct {
	Records    []egress.Record
	NextCursor int64
	HasMore    bool
	PastEnd    bool
	Live       bool
	Summary    *egress.Summary
	Seal       *egress.Seal
	// Verification is set when asked (Egress's verify).
	Verification *EgressVerification
}

// EgressVerification is egress.Verify's finding over a run's whole
// mirrored ledger, with the host whose key was used and that key
// (FormatPublicKey's form; empty when none is known).
type EgressVerification struct {
	egress.Verification
	HostID    string
	LedgerKey string
	// HostChecked: the host still holds the run and answered, and its own
	// current seal was compared with the mirror's (compareHostSeal).
	HostChecked bool
}

// Egress returns the page of run id's ledger mirror that c asked for
// (after a seq, at most limit records: 0 is DefaultEgressLimit, above
// MaxEgressLimit clamped), scoped as RunFor; verify adds the verification
// of the whole mirrored ledger (VerifyEgress).
func (f *Fleet) Egress(ctx context.Context, c store.Caller, id string, after int64, limit int, verify bool) (EgressPage, error) {
	run, err := f.RunFor(ctx, c, id)
	if err != nil {
		return EgressPage{}, err
	}
	head, err := f.egressHead(ctx, run)
	if err != nil {
		return EgressPage{}, err
	}
	page, err := f.MirroredEgress(ctx, run, head, after, limit)
	if err != nil {
		return EgressPage{}, err
	}
	if verify {
		v, err := f.verifyEgress(ctx, run, head)
		if err != nil {
			return EgressPage{}, err
		}
		page.Verification = &v
	}
	return page, nil
}

// EgressHead reads run's ledger head (an empty one, Version 0, when none
// is mirrored). No access check: callers have done it (RunFor).
func (f *Fleet) EgressHead(ctx context.Context, run store.Run) (store.EgressHead, error) {
	return f.egressHead(ctx, run)
}

// MirroredEgress reads run's ledger mirror after a seq, never past head's
// Cursor, at most limit records (0: DefaultEgressLimit, clamped at
// MaxEgressLimit). No access check: callers have done it (RunFor).
func (f *Fleet) MirroredEgress(ctx context.Context, run store.Run, head store.EgressHead, after int64, limit int) (EgressPage, error) {
	if limit <= 0 {
		limit = DefaultEgressLimit
	}
	limit = min(limit, MaxEgressLimit)
	page := EgressPage{Records: []egress.Record{}, NextCursor: after, Live: run.Live()}
	var err error
	if page.Summary, page.Seal, err = headParts(head); err != nil {
		return EgressPage{}, err
	}
	if after >= head.Cursor {
		page.PastEnd = after > head.Cursor
		return page, nil // nothing mirrored beyond it: no read
	}
	want := int(min(int64(limit), head.Cursor-after))
	got, err := f.store.ListEgress(ctx, run.FleetRunID, after, want)
	if err != nil {
		return EgressPage{}, fmt.Errorf("fleet: reading the egress mirror of %s: %w", run.FleetRunID, err)
	}
	size := 0
	for _, r := range got.Records {
		if r.Seq > head.Cursor || (len(page.Records) > 0 && size+len(r.Data) > maxEgressPageBytes) {
			break
		}
		rec, err := egressRecordToWire(r)
		if err != nil {
			return EgressPage{}, fmt.Errorf("fleet: reading egress record %d of %s: %w", r.Seq, run.FleetRunID, err)
		}
		page.Records = append(page.Records, rec)
		page.NextCursor = r.Seq
		size += len(r.Data)
	}
	// As MirroredEvents: a page that moved nowhere has no more after it.
	page.HasMore = page.NextCursor > after && page.NextCursor < head.Cursor
	return page, nil
}

// headParts decodes a head's summary and seal (nil when it holds none).
func headParts(head store.EgressHead) (*egress.Summary, *egress.Seal, error) {
	var summary *egress.Summary
	if len(head.Summary) > 0 {
		summary = new(egress.Summary)
		if err := json.Unmarshal(head.Summary, summary); err != nil {
			return nil, nil, fmt.Errorf("fleet: reading the egress summary of %s: %w", head.FleetRunID, err)
		}
	}
	var seal *egress.Seal
	if len(head.Seal) > 0 {
		seal = new(egress.Seal)
		if err := json.Unmarshal(head.Seal, seal); err != nil {
			return nil, nil, fmt.Errorf("fleet: reading the egress seal of %s: %w", head.FleetRunID, err)
		}
	}
	return summary, seal, nil
}

// problemNoLedger is verification's problem for a run without a ledger
// mirror.
const problemNoLedger = "no egress ledger has been mirrored for this run (not started yet, or its host is older than ledgers)"

// verifyEgress reads run's whole ledger mirror (up to head's Cursor, page
// by page) and verifies it with the ledger key the probe recorded for the
// host that wrote it, never the key the seal names. The chain is the
// host's run's (ChildRunID): edge keys a ledger by its own run id.
func (f *Fleet) verifyEgress(ctx context.Context, run store.Run, head store.EgressHead) (EgressVerification, error) {
	hostID := head.HostID
	if hostID == "" {
		hostID = run.HostID
	}
	out := EgressVerification{HostID: hostID}
	if head.Version == 0 {
		out.Problem = problemNoLedger
		return out, nil
	}
	_, seal, err := headParts(head)
	if err != nil {
		return out, err
	}
	var records []egress.Record
	for after := int64(0); after < head.Cursor; {
		got, err := f.store.ListEgress(ctx, run.FleetRunID, after, int(min(int64(store.MaxLimit), head.Cursor-after)))
		if err != nil {
			return out, fmt.Errorf("fleet: reading the egress mirror of %s: %w", run.FleetRunID, err)
		}
		from := after
		for _, r := range got.Records {
			if r.Seq > head.Cursor {
				break
			}
			rec, err := egressRecordToWire(r)
			if err != nil {
				// No longer a record: altered in the store past reading.
				out.Records, out.FailedSeq = int64(len(records)+1), r.Seq
				out.Problem = fmt.Sprintf("record %d is not a ledger record: it was altered", r.Seq)
				return out, nil
			}
			records = append(records, rec)
			after = r.Seq
		}
		if after == from || !got.HasMore {
			break
		}
	}
	key, err := f.ledgerKey(ctx, hostID)
	if err != nil {
		return out, err
	}
	out.Verification = egress.Verify(run.ChildRunID, records, seal, key)
	if key != nil {
		out.LedgerKey = egress.FormatPublicKey(key)
	}
	if out.OK {
		f.compareHostSeal(ctx, run, hostID, seal, &out)
	}
	return out, nil
}

// compareHostSeal asks the host, while it still holds the run, for its
// current seal and fails a verification the mirror alone passed when the
// two differ. Every seal the host made over a run's growing ledger (a
// retry, a record after the end) signs a prefix of the same chain, so a
// mirror cut back to an earlier seal verifies on its own: only the host,
// outside the store, can say it has sealed more since. A host that no
// longer holds the run (purged at its retention) or does not answer leaves
// the verification as the mirror gave it, with HostChecked false.
func (f *Fleet) compareHostSeal(ctx context.Context, run store.Run, hostID string, mirrored *egress.Seal, out *EgressVerification) {
	client, err := f.clientFor(ctx, hostID)
	if err != nil {
		return
	}
	hostCtx, cancel := clock.WithTimeout(ctx, f.clock, f.cfg.HostTimeout)
	defer cancel()
	page, err := client.Egress(hostCtx, run.ChildRunID, mirrored.Count, 1)
	if err != nil {
		if !errors.Is(err, hostproto.ErrRunNotFound) {
			f.log.Info("verify: the host's seal could not be read; verified against the mirror alone", logRun, run.FleetRunID,
				logHost, hostID, logErr, err.Error())
		}
		return
	}
	out.HostChecked = true
	if hs := page.Seal; hs == nil || hs.Count != mirrored.Count || hs.LastHash != mirrored.LastHash {
		count := int64(0)
		if hs != nil {
			count = hs.Count
		}
		out.OK = false
		out.Problem = fmt.Sprintf("the host's current seal covers %d records, the mirror's %d: the mirror is behind the host's ledger, or was cut back to an earlier seal", count, mirrored.Count)
	}
}

// ledgerKey is the ledger key Fleet's probe recorded for hostID; nil when
// none is known (the host is no longer registered, never reported one, or
// reported one that does not parse, which is logged).
func (f *Fleet) ledgerKey(ctx context.Context, hostID string) (ed25519.PublicKey, error) {
	h, err := f.store.GetHost(ctx, hostID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fleet: reading host %q for its ledger key: %w", hostID, err)
	}
	if h.Probe == nil || h.Probe.LedgerKey == "" {
		return nil, nil
	}
	key, err := egress.ParsePublicKey(h.Probe.LedgerKey)
	if err != nil {
		f.log.Warn("verify: the ledger key recorded for a host does not parse", logHost, hostID, logErr, err.Error())
		return nil, nil
	}
	return key, nil
}

// AlertedRun is a run whose egress ledger holds alerts, with the ledger's
// summary as last mirrored.
type AlertedRun struct {
	Run    store.Run
	Egress *egress.Summary
}

// AlertedPage is a page of AlertedRuns; NextCursor is empty on the last.
type AlertedPage struct {
	Runs       []AlertedRun
	NextCursor string
}

// AlertedRuns pages the runs whose egress ledgers hold alerts, the latest
// first alert first, each as recorded (not refreshed from its host) with
// its summary (admin use: no scope check). limit follows store.PageLimit;
// a run expired or deleted since its head was listed is left out, so a
// page may be short with NextCursor set. Cost: the heads' page, and one
// eventually consistent read per run.
func (f *Fleet) AlertedRuns(ctx context.Context, cursor string, limit int) (AlertedPage, error) {
	page, err := f.store.ListAlertedRuns(ctx, cursor, store.PageLimit(limit))
	if errors.Is(err, store.ErrBadCursor) {
		return AlertedPage{}, invalid("cursor is not a cursor from this listing")
	}
	if err != nil {
		return AlertedPage{}, fmt.Errorf("fleet: listing runs with egress alerts: %w", err)
	}
	out := AlertedPage{Runs: []AlertedRun{}, NextCursor: page.NextCursor}
	for _, head := range page.Heads {
		run, err := f.store.GetRun(store.EventualRead(ctx), head.FleetRunID)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return AlertedPage{}, fmt.Errorf("fleet: reading run %s: %w", head.FleetRunID, err)
		}
		summary, _, err := headParts(head)
		if err != nil {
			return AlertedPage{}, err
		}
		out.Runs = append(out.Runs, AlertedRun{Run: run, Egress: summary})
	}
	return out, nil
}
