package fleet

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

// DefaultSweepConcurrency bounds the runs a sweep syncs at once. A sync is
// mostly waiting on two host calls (~0.1 s each in AWS), so the sweep's
// reach is about budget x concurrency / 0.2 s: at 8, ~1,300 runs in its
// 40 s, short of the ~7,000 live runs a million dispatches a day keep
// (runs living 10 minutes), which would put every run ~6 sweeps apart and
// the lag over its alarm; at 32, ~5,000, each run every 2 sweeps. (The
// egress ledger's page is a third call, on a host that has ledgers: ~3,300
// runs, each every 2 or 3 sweeps.)
const DefaultSweepConcurrency = 32

// DefaultSweepPageSize is the sweep's page of the live index: the largest,
// since a Query is priced by bytes, not calls, and every page costs a save
// of the cursor.
const DefaultSweepPageSize = store.MaxLimit

// Sweep lease: how long past its budget a sweep holds the cursor. Its host
// work ends by Until + HostTimeout (SweepOptions.Until); SweepLeaseMargin
// more covers its last writes. A sweep that dies keeps the others off the
// cursor until then, no longer. Without a budget the lease runs to ctx's
// deadline, or DefaultSweepLease without one.
const (
	SweepLeaseMargin  = 10 * time.Second
	DefaultSweepLease = 15 * time.Minute
)

// Log field names of the sweep's lines.
const (
	logLap        = "lap"
	logLeaseUntil = "leaseUntil"
)

// sweepSaveTimeout bounds the last save of the cursor, which runs even when
// ctx is done so that the progress made is not lost.
const sweepSaveTimeout = 5 * time.Second

// SweepOptions bound one sweep.
type SweepOptions struct {
	// Until is the budget: no run is started, and no host call (a
	// recovery, a credential read, a state, a page of events) is started,
	// once the clock reaches it; a run stopped short keeps its progress.
	// Each host call is bounded by HostTimeout, so the sweep's host work is
	// over by Until + HostTimeout (leave that, and a margin for the last
	// writes, before the invocation's deadline). Zero: no budget (ctx alone
	// bounds the sweep).
	Until time.Time
	// MaxRuns is a budget in runs: no run is started once this many were
	// started. Zero: none. (Tests and benchmarks use it for a budget that
	// does not depend on how fast the machine is.)
	MaxRuns int
	// PageSize is how many ids one read of the live index returns; zero is
	// DefaultSweepPageSize.
	PageSize int
	// Concurrency bounds the runs synced at once; zero is
	// DefaultSweepConcurrency.
	Concurrency int
}

// SweepReport counts what a sweep did. Every run it read is counted once
// among Current, Drained, Lost, InFlight, Unreachable, Partial, Failed and
// Queued; Skipped counts the runs of the last page read that the budget
// left for the next sweep. A queued run is not in the live index: it is
// read only once the queue index shows its timeout passed (timeOutQueue).
type SweepReport struct {
	// Pages and Live count the reads of the live index and the ids they
	// returned.
	Pages int `json:"pages"`
	Live  int `json:"live"`
	// Current: up to date and still live (or already drained).
	Current int `json:"current"`
	// Drained: left the live index in this sweep (terminal, final event
	// and egress ledger mirrored), dispatch_lost runs included.
	Drained int `json:"drained"`
	// Lost: the host denies the run.
	Lost int `json:"lost"`
	// InFlight: dispatching, before its deadline or within the grace.
	InFlight int `json:"inFlight"`
	// Recovered: dispatching runs resolved from their host (also counted
	// by what they became).
	Recovered int `json:"recovered"`
	// Unreachable: the host did not answer; the run stays live.
	Unreachable int `json:"unreachable"`
	// Partial: events still to mirror when the budget ran out.
	Partial int `json:"partial"`
	// Failed: another error (logged); the run stays as it was.
	Failed int `json:"failed"`
	// Queued: the queue index's entries within their timeout, counted
	// from the index without reading the runs (a run being offered to a
	// host is among them, and counted again by what the live walk made
	// of it); a run whose timeout passed ends queue_timeout and counts as
	// Drained. QueuePages counts the reads of the queue index.
	Queued     int `json:"queued,omitempty"`
	QueuePages int `json:"queuePages,omitempty"`
	// Events counts the events mirrored.
	Events int `json:"events"`
	// Egress counts the egress ledger records mirrored.
	Egress int `json:"egress"`
	// Extended counts the runs whose events' expiry was extended (a run
	// live over a week, retried, or drained long after its first events).
	Extended int `json:"extended"`
	// Skipped counts runs left unread because the budget ran out.
	Skipped int `json:"skipped"`
	// Credentials counts the fresh brokered values live runs' hosts took
	// (brokered.go), Revoked the runs' tokens revoked, and
	// CredentialFailures the mints, deliveries and revocations that
	// failed (each logged).
	Credentials        int `json:"credentials,omitempty"`
	Revoked            int `json:"revoked,omitempty"`
	CredentialFailures int `json:"credentialFailures,omitempty"`
	// BudgetExhausted: the sweep stopped at its budget (Until or MaxRuns)
	// before it had been once round the live index.
	BudgetExhausted bool `json:"budgetExhausted"`

	// Lap is the cursor's lap when the sweep ended, and Cursor the last
	// run id that lap reached (empty: at the lap's start).
	Lap    int64  `json:"lap"`
	Cursor string `json:"cursor"`
	// LapsEnded counts the laps this sweep completed (reached the end of
	// the live index in).
	LapsEnded int `json:"lapsEnded"`
	// LagSeconds bounds the age of the oldest unvisited live run when the
	// sweep ended (SweepLag): the figure the SweepLagSeconds metric carries.
	LagSeconds float64 `json:"lagSeconds"`
	// Busy: another sweep held the cursor, so this one synced nothing
	// (Lap, Cursor and LagSeconds are that sweep's).
	Busy bool `json:"busy,omitempty"`
	// LeaseLost: the sweep overran its lease and another took the cursor
	// over; it stopped without moving the cursor further.
	LeaseLost bool `json:"leaseLost,omitempty"`
}

// SweepLag bounds how long ago the sweep last visited any live run, at now:
// the time since the previous lap began. A run the current lap has reached
// was visited in this lap. One it has not reached yet was visited by the
// previous lap (every lap visits every run in the live index in id order),
// or created after that lap had passed its id; either way at or after the
// previous lap's start. During the first lap there is no previous lap and
// the figure is the time since the first lap began, which understates the
// age of a run older than the cursor that the lap has not reached yet.
func SweepLag(c store.SweepCursor, now time.Time) time.Duration {
	from := c.PrevLapStarted
	if from.IsZero() {
		from = c.LapStarted
	}
	return max(now.Sub(from), 0)
}

// Sweep brings the live runs up to date from their hosts (syncRun: state,
// events by cursor, recovery of dispatches past their deadline, lost for a
// run its host denies, drained once terminal with its final event
// mirrored), walking the sparse live index in laps from a cursor kept
// between sweeps (store.SweepCursor), so that a fleet with more live runs
// than one budget reaches is still covered.
//
// The sweep takes the cursor's lease (another sweep holding it: Busy, and
// nothing done), continues from where the last sweep stopped, and saves
// the cursor after every page, past the runs it has synced: a run left by
// the budget is the next sweep's first. At the end of the live index the
// lap ends and the next begins at its start; a sweep goes round the index
// at most once (it stops where it began), so no run is synced twice in one
// sweep. With R runs per sweep (the budget) and L live runs, a lap takes
// ceil(L/R) sweeps and every run live throughout a lap is synced once in
// it: with L steady, each is synced every ceil(L/R) sweeps, and a run
// created behind the cursor waits for the next lap, at most ceil(L/R)+1
// sweeps. A run whose host does not answer stays live for the next lap.
//
// It returns an error only when the cursor or the live index cannot be
// read; per-run failures are logged and counted.
func (f *Fleet) Sweep(ctx context.Context, opts SweepOptions) (SweepReport, error) {
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultSweepConcurrency
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultSweepPageSize
	}
	var rep SweepReport
	holder, err := f.sweepHolder()
	if err != nil {
		return rep, err
	}
	cur, err := f.store.ClaimSweepCursor(ctx, holder, f.sweepLease(ctx, opts.Until))
	if errors.Is(err, store.ErrConflict) {
		rep.Busy = true
		rep.setCursor(cur, f.clock.Now())
		f.log.InfoContext(ctx, "sweep: another sweep holds the cursor", logLap, cur.Lap, logLeaseUntil, cur.LeaseUntil)
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("fleet: sweep: claiming the cursor: %w", err)
	}
	w := &sweepWalk{f: f, opts: opts, hosts: newHostClients(f), rep: &rep, cur: cur, start: cur.After}
	w.timeOutQueue(ctx)
	walkErr := w.walk(ctx)
	if !rep.LeaseLost {
		// Release the lease with the position reached; a sweep that could
		// not leaves it to lapse, and the next one redoes its last page.
		w.cur.Holder, w.cur.LeaseUntil = "", time.Time{}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sweepSaveTimeout)
		defer cancel()
		if err := w.save(sctx); err != nil {
			f.log.ErrorContext(ctx, "sweep: releasing the cursor", logErr, err.Error())
		}
	}
	rep.setCursor(w.cur, f.clock.Now())
	if rep.Skipped > 0 {
		rep.BudgetExhausted = true
	}
	return rep, walkErr
}

func (r *SweepReport) setCursor(c store.SweepCursor, now time.Time) {
	r.Lap, r.Cursor, r.LagSeconds = c.Lap, c.After, SweepLag(c, now).Seconds()
}

// sweepHolder names this sweep in the cursor's lease.
func (f *Fleet) sweepHolder() (string, error) {
	b := make([]byte, 8)
	if _, err := io.ReadFull(f.cfg.Random, b); err != nil {
		return "", fmt.Errorf("fleet: sweep: naming the lease holder: %w", err)
	}
	return "sweep-" + hex.EncodeToString(b), nil
}

// sweepLease is when the sweep's lease lapses (SweepLeaseMargin).
func (f *Fleet) sweepLease(ctx context.Context, until time.Time) time.Time {
	if !until.IsZero() {
		return until.Add(f.cfg.HostTimeout + SweepLeaseMargin)
	}
	if d, ok := ctx.Deadline(); ok {
		return f.clock.Now().Add(time.Until(d))
	}
	return f.clock.Now().Add(DefaultSweepLease)
}

// sweepWalk is one sweep's walk of the live index from the cursor.
type sweepWalk struct {
	f     *Fleet
	opts  SweepOptions
	hosts *hostClients
	rep   *SweepReport
	// cur is the cursor as last stored (Version included).
	cur store.SweepCursor
	// start is where the sweep began in its first lap; once it wrapped
	// into the next lap it stops there.
	start   string
	wrapped bool
	started int // runs started, against MaxRuns
}

// spent reports whether the time budget (or ctx) is over.
func (w *sweepWalk) spent(ctx context.Context) bool {
	return ctx.Err() != nil || (!w.opts.Until.IsZero() && !w.f.clock.Now().Before(w.opts.Until))
}

func (w *sweepWalk) walk(ctx context.Context) error {
	for {
		remaining := store.PageLimit(w.opts.PageSize)
		if w.opts.MaxRuns > 0 {
			remaining = min(remaining, w.opts.MaxRuns-w.started)
		}
		if remaining <= 0 || w.spent(ctx) {
			w.rep.BudgetExhausted = true
			return nil
		}
		from := ""
		if w.cur.After != "" {
			from = w.f.store.LiveCursorAfter(w.cur.After)
		} else {
			// The lap starts moving now: every run it will visit is
			// visited after this, and a run created from now on behind
			// the cursor is younger than this (SweepLag).
			w.cur.LapStarted = w.f.clock.Now()
		}
		page, err := w.f.store.ListLive(ctx, from, remaining)
		if err != nil {
			return fmt.Errorf("fleet: sweep: reading the live index: %w", err)
		}
		w.rep.Pages++
		ids := page.FleetRunIDs
		if w.wrapped && w.start != "" {
			// Past where this sweep began: those runs were synced in the
			// lap it finished; they are the next sweep's.
			n := 0
			for n < len(ids) && ids[n] <= w.start {
				n++
			}
			if n < len(ids) {
				w.rep.Live += n
				w.syncPage(ctx, ids[:n])
				return nil
			}
		}
		w.rep.Live += len(ids)
		if reached := w.syncPage(ctx, ids); reached < len(ids) {
			return nil // the budget ran out within the page
		}
		if page.NextCursor != "" {
			if err := w.save(ctx); err != nil {
				return nil // lease lost (logged): stop
			}
			continue
		}
		// The end of the live index: the lap is over.
		now := w.f.clock.Now()
		w.cur.PrevLapStarted, w.cur.PrevLapEnded = w.cur.LapStarted, now
		w.cur.Lap++
		w.cur.LapStarted, w.cur.After = now, ""
		w.rep.LapsEnded++
		if w.start == "" || w.wrapped {
			return nil // once round the index
		}
		w.wrapped = true
		if err := w.save(ctx); err != nil {
			return nil
		}
	}
}

// syncPage syncs ids, at most opts.Concurrency at once, and moves the
// cursor past the longest prefix of ids it synced (the budget may leave
// some, and runs finish out of order); it returns that prefix's length.
func (w *sweepWalk) syncPage(ctx context.Context, ids []string) int {
	type job struct {
		i  int
		id string
	}
	var (
		mu   sync.Mutex
		done = make([]bool, len(ids))
		jobs = make(chan job)
		wg   sync.WaitGroup
	)
	for range min(w.opts.Concurrency, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if w.spent(ctx) {
					mu.Lock()
					w.rep.Skipped++
					mu.Unlock()
					continue
				}
				res := w.f.sweepOne(ctx, j.id, w.hosts, w.opts.Until)
				mu.Lock()
				w.rep.count(res)
				done[j.i] = true
				mu.Unlock()
			}
		}()
	}
	for i, id := range ids {
		jobs <- job{i, id}
	}
	close(jobs)
	wg.Wait()
	w.started += len(ids)
	reached := 0
	for reached < len(done) && done[reached] {
		reached++
	}
	if reached > 0 {
		w.cur.After = ids[reached-1]
	}
	return reached
}

// save stores the cursor, conditional on its version: a sweep whose lease
// another took over fails here (LeaseLost) and stops.
func (w *sweepWalk) save(ctx context.Context) error {
	saved, err := w.f.store.SaveSweepCursor(ctx, w.cur)
	if err != nil {
		if errors.Is(err, store.ErrConflict) {
			w.rep.LeaseLost = true
		}
		w.f.log.ErrorContext(ctx, "sweep: saving the cursor", logLap, w.cur.Lap, logErr, err.Error())
		return err
	}
	w.cur = saved
	return nil
}

// timeOutQueue ends, failed with queue_timeout, the queued runs whose
// timeout passed. A queued run is not in the live index (no host has it:
// nothing to sync), so each pass reads the queue index instead, its
// classes and their pages (an entry carries its run's Until; ~40 entries
// a read unit), and reads a run only when its Until passed: a run that
// waits costs a pass a share of those pages, not a read of its own. Run
// reads and their ends follow the sweep's budget (Until, MaxRuns) as the
// live walk's do; a run left by the budget is the next pass's. A run
// being offered to a host (dispatching) is live, and the walk recovers
// it: here it is left alone. An entry without Until (written before the
// index carried it) is read, as every waiting run was before. A failed
// read of the index is logged: the walk goes on, and the next pass
// reads it again.
func (w *sweepWalk) timeOutQueue(ctx context.Context) {
	f := w.f
	classes, err := f.queueClasses(ctx)
	w.rep.QueuePages++
	if err != nil {
		f.log.Error("sweep: reading the queue's classes", logErr, err.Error())
		return
	}
	for _, class := range classes {
		after := ""
		for {
			page, err := f.store.ListQueue(ctx, class, after, store.MaxLimit)
			w.rep.QueuePages++
			if err != nil {
				f.log.Error("sweep: reading the queue", logClass, class, logErr, err.Error())
				return
			}
			now := f.clock.Now()
			var due []string
			for _, e := range page.Entries {
				if !e.Until.IsZero() && now.Before(e.Until) {
					w.rep.Queued++
					continue
				}
				due = append(due, e.FleetRunID)
			}
			w.timeOut(ctx, due)
			if page.Next == "" {
				break
			}
			after = page.Next
		}
	}
}

// timeOut reads the queued runs ids and ends those whose timeout passed,
// at most opts.Concurrency at once, within the sweep's budget.
func (w *sweepWalk) timeOut(ctx context.Context, ids []string) {
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, w.opts.Concurrency)
	)
	for _, id := range ids {
		if w.spent(ctx) || (w.opts.MaxRuns > 0 && w.started >= w.opts.MaxRuns) {
			mu.Lock()
			w.rep.Skipped++
			mu.Unlock()
			continue
		}
		w.started++
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			res, counted := w.f.timeOutOne(ctx, id)
			if counted {
				mu.Lock()
				w.rep.count(res)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// timeOutOne reads run id, of the queue index, and ends it queue_timeout
// when it is queued and its Until passed (syncQueued). counted is false
// for a run the queue pass does not account for: gone, started, or
// dispatching past its Until (the live walk's: it is live).
func (f *Fleet) timeOutOne(ctx context.Context, id string) (res syncResult, counted bool) {
	// Eventually consistent: the end is a versioned write.
	run, err := f.store.GetRun(store.EventualRead(ctx), id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return syncResult{}, false
	case err != nil:
		f.log.Error("sweep: reading a queued run", logRun, id, logErr, err.Error())
		return syncResult{outcome: syncFailed, err: err}, true
	case !run.Waiting() || run.Queue.Until.IsZero():
		return syncResult{}, false
	case f.clock.Now().Before(run.Queue.Until):
		// Read for an entry without Until: counted as the index counts.
		return syncResult{outcome: syncQueued}, true
	case run.Status != store.StatusQueued:
		return syncResult{}, false // being offered: the live walk's
	}
	_, res = f.syncQueued(ctx, run)
	return res, true
}

// sweepOne syncs one run of the live index.
func (f *Fleet) sweepOne(ctx context.Context, id string, hosts *hostClients, until time.Time) syncResult {
	// Eventually consistent: every write the sync makes is conditional on
	// the version read, so a stale read costs a retry, never a lost update.
	run, err := f.store.GetRun(store.EventualRead(ctx), id)
	if errors.Is(err, store.ErrNotFound) {
		return syncResult{outcome: syncCurrent} // deleted since the index was read
	}
	if err != nil {
		f.log.Error("sweep: reading a run", logRun, id, logErr, err.Error())
		return syncResult{outcome: syncFailed, err: err}
	}
	stored, res := f.syncRun(ctx, run, syncPass{hosts: hosts, until: until, extend: true, egress: egressBatched, credentials: true})
	_, revoked := f.revokeEnded(ctx, stored)
	res.credentials.add(revoked)
	return res
}

func (r *SweepReport) count(res syncResult) {
	r.Events += res.events
	r.Egress += res.egress
	r.Credentials += res.credentials.refreshed
	r.Revoked += res.credentials.revoked
	r.CredentialFailures += res.credentials.failures
	if res.recovered {
		r.Recovered++
	}
	if res.extended {
		r.Extended++
	}
	switch res.outcome {
	case syncCurrent:
		r.Current++
	case syncDrained:
		r.Drained++
	case syncLost:
		r.Lost++
	case syncInFlight:
		r.InFlight++
	case syncUnreachable:
		r.Unreachable++
	case syncPartial:
		r.Partial++
	case syncFailed:
		r.Failed++
	case syncQueued:
		r.Queued++
	}
}
