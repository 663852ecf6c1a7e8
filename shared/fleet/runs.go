package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
)

// RunState is a run as GET /fleet/runs/{id} reports it.
type RunState struct {
	Run store.Run
	// Refreshed: the state was just read from the host.
	Refreshed bool
	// Note says why it was not refreshed, when it could not be.
	Note string
	// Egress is its egress ledger's summary as last mirrored; nil while
	// none is.
	Egress *egress.Summary
	// Position is its place in its class's queue (1 is next) while it
	// waits (Run.Waiting); 0 otherwise.
	Position int
}

// Run returns the run c may see, refreshed from its host when it is live: a
// dispatching run past its deadline is recovered, a live one is read from
// the host (a host denying it makes it lost). A host that cannot be asked
// leaves the stored state, with a note. Another owner's run is 404, as an
// unknown one: its existence is not the caller's business. Its egress
// summary costs one more read (the ledger's head).
func (f *Fleet) Run(ctx context.Context, c store.Caller, id string) (RunState, error) {
	run, err := f.RunFor(ctx, c, id)
	if err != nil {
		return RunState{}, err
	}
	st := f.runState(ctx, run)
	st.Run, _ = f.revokeEnded(ctx, st.Run)
	if st.Run.Waiting() {
		st.Position = f.queuePosition(ctx, st.Run)
	}
	head, err := f.egressHead(ctx, run)
	if err != nil {
		return RunState{}, err
	}
	if st.Egress, _, err = headParts(head); err != nil {
		return RunState{}, err
	}
	return st, nil
}

// runState is run as Run reports it, refreshed from its host when live.
func (f *Fleet) runState(ctx context.Context, run store.Run) RunState {
	id := run.FleetRunID
	switch {
	case run.Status == store.StatusQueued:
		if run.Queue == nil || f.clock.Now().Before(run.Queue.Until) {
			return RunState{Run: run, Note: waitingNote(run)}
		}
		ended, err := f.expireQueued(ctx, run)
		if err != nil {
			f.log.Warn("run: ending a queued run past its timeout failed", logRun, id, logErr, err.Error())
			return RunState{Run: run, Note: waitingNote(run)}
		}
		return RunState{Run: ended, Refreshed: true}
	case run.Status == store.StatusDispatching:
		if f.clock.Now().Before(run.Deadline) {
			if run.Waiting() {
				return RunState{Run: run, Note: waitingNote(run)}
			}
			return RunState{Run: run, Note: "the dispatch is in flight"}
		}
		recovered, err := f.recover(ctx, run)
		if err != nil {
			f.log.Warn("run: recovery failed", logRun, id, logErr, err.Error())
			return RunState{Run: run, Note: "the host could not be asked about this dispatch"}
		}
		return RunState{Run: recovered, Refreshed: recovered.Status != store.StatusDispatching}
	case store.Terminal(run.Status) || run.ChildRunID == "":
		return RunState{Run: run}
	}
	refreshed, err := f.refresh(ctx, run)
	if err != nil {
		f.log.Warn("run: refresh failed", logRun, id, logHost, run.HostID, logErr, err.Error())
		return RunState{Run: run, Note: "the host could not be asked; this is the last known state"}
	}
	return RunState{Run: refreshed, Refreshed: true}
}

// refresh reads a live run's state from its host and records it; a host
// denying the run makes it lost.
func (f *Fleet) refresh(ctx context.Context, run store.Run) (store.Run, error) {
	client, err := f.clientFor(ctx, run.HostID)
	if err != nil {
		return run, err
	}
	return f.refreshWith(ctx, client, run)
}

// refreshWith is refresh through a client of the run's host. A run it
// finds lost leaves the live index here, where the sweep no longer sees
// it: its tokens are revoked here too (brokered.go).
func (f *Fleet) refreshWith(ctx context.Context, client *hostproto.Client, run store.Run) (store.Run, error) {
	hr, err := client.Get(ctx, run.ChildRunID)
	lost := errors.Is(err, hostproto.ErrRunNotFound)
	if err != nil && !lost {
		return run, err
	}
	if lost {
		stored, err := f.markLost(ctx, run)
		if err == nil {
			stored, _ = f.revokeEnded(ctx, stored)
		}
		return stored, err
	}
	return f.settle(ctx, run, func(cur *store.Run) bool {
		if !hostAnswerApplies(*cur, hr) {
			return false
		}
		f.applyHostRun(cur, hr, f.clock.Now().UTC())
		return true
	})
}

// markLost records that the run's host denies it (404 run_not_found): the
// run is lost, with nothing left to mirror. It is logged at error level:
// a binding Fleet holds that its host disowns is for an operator to look
// at (the host lost its state, or was replaced), never routine.
func (f *Fleet) markLost(ctx context.Context, run store.Run) (store.Run, error) {
	stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
		if cur.Status == store.StatusLost {
			return false
		}
		f.end(cur, store.StatusLost, hostproto.CodeRunNotFound,
			fmt.Sprintf("host %s no longer knows this run (its run %s): it lost its state or was replaced", cur.HostID, cur.ChildRunID),
			f.clock.Now().UTC())
		// Its mirrored events must outlive it: a run whose events need
		// extending first stays in the live index for the sweep (expiry.go).
		if f.drainEventsShort(*cur) {
			cur.Drained = false
		}
		return true
	})
	if err == nil && run.Status != store.StatusLost && stored.Status == store.StatusLost {
		f.log.Error("run lost: its host denies it", logRun, run.FleetRunID, logHost, run.HostID,
			logChildRun, run.ChildRunID, logOwner, run.OwnerID, "previousStatus", run.Status)
	}
	return stored, err
}

func sameExit(a, b *int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// RecoverDispatching resolves a run left dispatching (Fleet crashed, or the
// host did not answer, between the host call and its record): the host is
// asked by clientToken (Run.ClientToken); a run it knows is recorded as the
// host reports it; one it does not know is failed with reason dispatch_lost
// once its deadline passed more than LostGrace ago (the host refuses a start
// after the deadline, so it can no longer arrive). A run that waits
// (Run.Waiting: a dispatcher offered it to the host) is never lost: it goes
// back to queued at its place, with the same token (no host has it), or
// ends queue_timeout when its wait is over; one its host refused with a
// transient reason goes back to queued under a fresh token. It returns the
// run as stored after; a run no longer dispatching is returned as is. The
// scheduled sweep calls it for dispatching runs in the live index.
func (f *Fleet) RecoverDispatching(ctx context.Context, fleetRunID string) (store.Run, error) {
	run, err := f.store.GetRun(ctx, fleetRunID)
	if err != nil {
		return store.Run{}, fmt.Errorf("fleet: reading run %s: %w", fleetRunID, err)
	}
	return f.recover(ctx, run)
}

func (f *Fleet) recover(ctx context.Context, run store.Run) (store.Run, error) {
	if run.Status != store.StatusDispatching {
		return run, nil
	}
	client, err := f.clientFor(ctx, run.HostID)
	if err != nil {
		return run, err
	}
	hr, known, err := client.FindByClientToken(ctx, run.ClientToken())
	if err != nil {
		return run, err
	}
	var dropped []store.BrokeredKey
	stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
		dropped = nil
		if cur.Status != store.StatusDispatching || cur.HostID != run.HostID {
			return false // settled, or moved on to a host not asked
		}
		now := f.clock.Now().UTC()
		if known {
			if _, transient := transientRefusal(cur.HostID, hr, nil); transient && cur.Waiting() {
				dropped = cur.Brokered
				f.backToQueue(cur, now, true)
				return true
			}
			f.applyHostRun(cur, hr, now)
			return true
		}
		if !now.After(cur.Deadline.Add(LostGrace)) {
			return false // not yet more than LostGrace past the deadline
		}
		if cur.Waiting() {
			// No host has it, and its host refuses the start now: its
			// place and token are kept.
			dropped = cur.Brokered
			f.backToQueue(cur, now, false)
			return true
		}
		f.end(cur, store.StatusFailed, store.ReasonDispatchLost,
			fmt.Sprintf("host %s never received the start, and its deadline passed more than %s ago; nothing was started", cur.HostID, LostGrace), now)
		return true
	})
	if err == nil && len(dropped) > 0 {
		f.revokeKeys(ctx, run, dropped, "the run went back to the queue")
	}
	if err == nil && stored.Status == store.StatusQueued {
		f.log.Info("dispatch: the offer of a waiting run was not taken; back to the queue", logRun, run.FleetRunID,
			logHost, run.HostID, logClass, stored.Queue.Class)
	}
	return stored, err
}

// maxListReads bounds the store pages one listing reads to fill its page
// when runs are filtered out (see Runs).
const maxListReads = 10

// RunsQuery is a listing of runs (GET /fleet/runs): a page and its filters.
// A filter left empty keeps every run; set, it keeps the runs whose field
// equals it exactly.
type RunsQuery struct {
	// Cursor continues the listing with the same filters; empty starts at
	// the newest run.
	Cursor string
	// Limit follows store.PageLimit.
	Limit int
	// Status is one of the run statuses (store.Status*).
	Status string
	Agent  string
	HostID string
}

// runStatuses are the statuses a run can have, in the order a run passes
// through them: what a status filter may name.
var runStatuses = []string{
	store.StatusQueued, store.StatusDispatching, store.StatusPending, store.StatusAdmitted, store.StatusRunning,
	store.StatusSucceeded, store.StatusFailed, store.StatusCanceled, store.StatusLost,
}

// check validates the filters: 400 for a status that is not a run's or an
// agent or host that is not an id, 403 for a host outside c's
// allowedHosts (as the metrics rollup answers it: a filter naming a host c
// may not see is refused, not answered with a silently empty listing).
func (q RunsQuery) check(c store.Caller) error {
	if q.Status != "" && !slices.Contains(runStatuses, q.Status) {
		return invalid("status %s is not a run status: want one of %s", runspec.Quoted(q.Status), strings.Join(runStatuses, ", "))
	}
	for _, p := range []struct{ name, id string }{{"agent", q.Agent}, {"host", q.HostID}} {
		if p.id != "" {
			if err := checkID(p.name, p.id); err != nil {
				return err
			}
		}
	}
	if q.HostID != "" && !auth.CanUseHost(c, q.HostID) {
		return forbidden("host %q is not in this caller's allowedHosts", q.HostID)
	}
	return nil
}

// keeps reports whether r passes the query's filters.
func (q RunsQuery) keeps(r store.Run) bool {
	return (q.Status == "" || r.Status == q.Status) && (q.Agent == "" || r.Agent == q.Agent) &&
		(q.HostID == "" || r.HostID == q.HostID)
}

// Runs pages the runs c may see, newest first: its own, or every run for an
// admin, narrowed by q's filters. A non-admin's listing leaves out its runs
// on hosts outside its allowedHosts (a caller re-minted with a smaller
// scope still owns them), as reading one is 403: the listing and the reads
// agree. Runs left out (by that scope or a filter) are skipped by reading
// on, up to maxListReads store pages; a page can then be short, or empty,
// with more to come (NextCursor set). An admin's host filter reads the
// host's own index instead, so it skips nothing (its cursor is then bound
// to that host). The page's live runs are refreshed from their hosts first
// (refreshPage), so a run that ended shows ended without waiting for the
// sweep; a status filter is applied again after, so the page never shows a
// run in another status than the one asked for.
func (f *Fleet) Runs(ctx context.Context, c store.Caller, q RunsQuery) (store.RunPage, error) {
	if err := q.check(c); err != nil {
		return store.RunPage{}, err
	}
	want := store.PageLimit(q.Limit)
	sq := store.RunQuery{Cursor: q.Cursor, Limit: want}
	switch {
	case !c.Admin:
		sq.OwnerID = c.OwnerID
	case q.HostID != "":
		sq.HostID = q.HostID
	}
	out := store.RunPage{Runs: []store.Run{}}
	for reads := 1; ; reads++ {
		page, err := f.store.ListRuns(ctx, sq)
		if errors.Is(err, store.ErrBadCursor) {
			return store.RunPage{}, invalid("cursor is not a cursor from this listing")
		}
		if err != nil {
			return store.RunPage{}, fmt.Errorf("fleet: listing runs: %w", err)
		}
		for _, r := range page.Runs {
			// A queued run is on no host yet: the caller's own.
			if (r.HostID == "" || auth.CanUseHost(c, r.HostID)) && q.keeps(r) {
				out.Runs = append(out.Runs, r)
			}
		}
		out.NextCursor = page.NextCursor
		if page.NextCursor == "" || len(out.Runs) >= want || reads == maxListReads {
			break
		}
		sq.Cursor, sq.Limit = page.NextCursor, want-len(out.Runs)
	}
	f.refreshPage(ctx, out.Runs)
	if q.Status != "" {
		out.Runs = slices.DeleteFunc(out.Runs, func(r store.Run) bool { return r.Status != q.Status })
	}
	return out, nil
}

// A refresh that rides on another request (a listing, a verb's answer) is
// bounded so that it adds at most ridingRefreshBudget and a known number of
// calls, whatever the fleet's size: a listing refreshes at most
// maxListRefreshes live runs (the newest), listRefreshConcurrency host calls
// at once. Past it a run keeps its stored state, which the sweep keeps at
// most a minute old.
const (
	maxListRefreshes       = 50
	listRefreshConcurrency = 8
	ridingRefreshBudget    = 3 * time.Second
)

// refreshPage replaces each live run of a listing with its state as its
// host reports it now (recording it, as Run does). A run whose host does not
// answer in the budget is left as stored. Cost per page: one host read per
// distinct host of a live run, one host GET per live run (at most
// maxListRefreshes), and one conditional write per run whose state changed.
func (f *Fleet) refreshPage(ctx context.Context, runs []store.Run) {
	var live []int
	for i, r := range runs {
		if !store.Terminal(r.Status) && r.ChildRunID != "" && len(live) < maxListRefreshes {
			live = append(live, i)
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, ridingRefreshBudget)
	defer cancel()
	clients := map[string]*hostproto.Client{}
	for _, i := range live {
		id := runs[i].HostID
		if _, seen := clients[id]; seen {
			continue
		}
		clients[id] = nil
		h, err := f.store.GetHost(store.EventualRead(ctx), id)
		if err == nil {
			clients[id], err = f.HostClient(ctx, h, ridingRefreshBudget)
		}
		if err != nil {
			f.log.Warn("list: a host of live runs cannot be asked", logHost, id, logErr, err.Error())
		}
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	sem := make(chan struct{}, listRefreshConcurrency)
	for _, i := range live {
		client := clients[runs[i].HostID]
		if client == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				failed.Add(1)
				return
			}
			fresh, err := f.refreshWith(ctx, client, runs[i])
			if err != nil {
				failed.Add(1)
				return
			}
			runs[i] = fresh // each goroutine owns its index
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		f.log.Warn("list: live runs not refreshed from their hosts; shown as last recorded", "runs", n)
	}
}
