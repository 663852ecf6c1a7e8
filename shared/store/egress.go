package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Egress is each run's mirror of its host's egress ledger: the records,
// numbered by Seq from 1 as the host numbered them, and one head per run
// saying how far the mirror has come, with the ledger's summary and seal.
// Records are written once and never rewritten, read in Seq order and
// strongly consistent, and expire on the ExpiresAt they were written with
// (the events' retention; ExtendEgressExpiry moves it as
// ExtendEventsExpiry does events'). A store may pack several records into
// one item (DynamoDB does, so a record costs a fraction of a write); that
// is invisible here.
type Egress interface {
	// PutEgress mirrors records of a run, which must have contiguous,
	// ascending Seqs from 1 or more, each Data a JSON value
	// (CheckEgressRecords; otherwise nothing is stored). A record whose
	// Seq is already stored is left as it is (a re-run never duplicates
	// or rewrites one, and a reader never sees a Seq twice); one whose
	// stored copy has expired is written afresh.
	PutEgress(ctx context.Context, fleetRunID string, records []EgressRecord, expiresAt time.Time) error
	// ListEgress returns the run's records with Seq > after, ascending, at
	// most limit (PageLimit).
	ListEgress(ctx context.Context, fleetRunID string, after int64, limit int) (EgressPage, error)
	// GetEgressHead reads the run's head; ErrNotFound when the mirror has
	// none yet.
	GetEgressHead(ctx context.Context, fleetRunID string) (EgressHead, error)
	// PutEgressHead writes h if the stored head's Version still equals
	// h.Version (0: no head is stored), storing Version+1 and returning
	// what it stored; ErrConflict otherwise. A head with Alerts above zero
	// is listed by ListAlertedRuns from then on, by FirstAlertAt, which
	// the store keeps once set (KeptFirstAlertAt).
	PutEgressHead(ctx context.Context, h EgressHead) (EgressHead, error)
	// ExtendEgressExpiry makes every unexpired record and the head of the
	// run whose ExpiresAt is before to (RoundExpiry(to)) expire at to; it
	// never shortens one.
	ExtendEgressExpiry(ctx context.Context, fleetRunID string, to time.Time) error
	// ListAlertedRuns pages the heads with alerts, newest FirstAlertAt
	// first; cursor is opaque ("" to start; ErrBadCursor).
	ListAlertedRuns(ctx context.Context, cursor string, limit int) (AlertedPage, error)
}

// EgressRecord is one mirrored ledger record: Data is its JSON as the host
// sent it (an egress.Record, its hash included), kept byte for byte.
type EgressRecord struct {
	Seq  int64
	Data json.RawMessage
}

// EgressPage is one page of a run's ledger mirror.
type EgressPage struct {
	Records []EgressRecord
	HasMore bool
}

// EgressHead is a run's ledger mirror as a whole.
type EgressHead struct {
	FleetRunID string
	Version    int64
	// Cursor is the Seq up to which every record is mirrored: readers
	// never look past it.
	Cursor int64
	// Summary is the host's egress.Summary of the whole ledger, as JSON.
	Summary json.RawMessage
	// Seal is the host's latest egress.Seal, as JSON; nil while the run has
	// not ended.
	Seal json.RawMessage
	// HostID is the host that wrote the ledger.
	HostID string
	// Alerts counts the ledger's alert records (the summary's); above zero
	// the run is listed by ListAlertedRuns.
	Alerts       int64
	FirstAlertAt time.Time
	UpdatedAt    time.Time
	ExpiresAt    time.Time
}

// AlertedPage is a page of ListAlertedRuns.
type AlertedPage struct {
	Heads      []EgressHead
	NextCursor string
}

// CheckEgressRecords is PutEgress's precondition, the same in every store:
// a run id, and records with contiguous, ascending Seqs from 1 or more,
// each a JSON value.
func CheckEgressRecords(fleetRunID string, records []EgressRecord) error {
	if fleetRunID == "" {
		return errors.New("egress records need a fleetRunId")
	}
	for i, r := range records {
		switch {
		case r.Seq < 1:
			return fmt.Errorf("egress record seq %d: seqs start at 1", r.Seq)
		case i > 0 && r.Seq != records[i-1].Seq+1:
			return fmt.Errorf("egress record seq %d follows %d: seqs must be contiguous", r.Seq, records[i-1].Seq)
		case !json.Valid(r.Data):
			return fmt.Errorf("egress record seq %d: data is not JSON", r.Seq)
		}
	}
	return nil
}

// KeptFirstAlertAt is the FirstAlertAt a store keeps when PutEgressHead
// writes h over a head whose FirstAlertAt was stored (zero: none, or no
// head): once set it never moves, so a run keeps its place in
// ListAlertedRuns; the first head with Alerts above zero sets it to
// h.FirstAlertAt, or to now when h leaves it zero.
func KeptFirstAlertAt(stored time.Time, h EgressHead, now time.Time) time.Time {
	switch {
	case !stored.IsZero():
		return stored.UTC()
	case h.Alerts <= 0:
		return time.Time{}
	case h.FirstAlertAt.IsZero():
		return now.UTC()
	}
	return h.FirstAlertAt.UTC()
}
