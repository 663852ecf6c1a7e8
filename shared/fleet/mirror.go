package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// The event mirror. A live run is brought up to date from its host by
// syncRun (the sweep for every live run, the stream for the one it serves):
// its state is read first, then its events after the run's EventCursor are
// copied with conditional puts (a re-run never duplicates or rewrites one),
// and only then is the cursor advanced, with a write conditional on the
// run's version. The cursor is therefore the mirror's horizon: every event
// up to it is stored, and readers (MirroredEvents) never look past it, so a
// reader never sees the gap a half-finished, concurrent put would leave.
//
// Event data is mirrored as DESIGN.md bounds it, at most
// hostproto.MaxEventData (32 KiB) per event: a host that sends more (edge
// splits its output, a misbehaving host may not) would otherwise wedge the
// run, an event over DynamoDB's 400 KB item limit failing every sweep. Such
// data is truncated, never split: the mirror's sequences are the host's,
// and only the host can split an event while keeping them contiguous. Text
// (a JSON string: output, input) keeps its head, cut on a UTF-8 boundary,
// and ends with a marker saying how much was cut; other data (an object)
// is replaced by a JSON string saying it was dropped (fitEvent). A page
// the host answers over Config.MaxEventPageBytes is asked again for fewer
// events, down to one; one event alone over the bound is mirrored as a
// marker in its place (unreadableEvent), so the run goes on.
//
// A run is drained, and leaves the live index, when the state read before
// the events was terminal and the events were then read to the end. That
// the final state event is among them rests on the host protocol: a host
// records the terminal status and its state event together (edge does, in
// one runlog update), so a terminal status is never visible before it.

// Event pages.
const (
	// hostEventPage is how many events one host call asks for (a host's
	// maximum page).
	hostEventPage = 1000
	// DefaultEventsLimit and MaxEventsLimit bound GET /fleet/runs/{id}/events.
	DefaultEventsLimit = 200
	MaxEventsLimit     = store.MaxLimit
)

// EventsPage is a page of a run's mirror: events after the asked cursor, in
// sequence order. NextCursor is the last one's sequence (the asked cursor
// when there is none); HasMore says more are mirrored beyond it now.
// PastEnd: the asked cursor is past the run's EventCursor, a place no
// reader was ever given (the cursor only grows, and is read strongly
// consistent), so the page is empty and NextCursor names no place to go on
// from; the API then answers no nextCursor (issue 30).
type EventsPage struct {
	Events     []hostproto.Event
	NextCursor int64
	HasMore    bool
	PastEnd    bool
}

// Events returns the page of run id's mirror that c asked for: after a
// sequence, at most limit events (0: DefaultEventsLimit; above
// MaxEventsLimit: clamped). Scope as RunFor.
func (f *Fleet) Events(ctx context.Context, c store.Caller, id string, after int64, limit int) (EventsPage, error) {
	run, err := f.RunFor(ctx, c, id)
	if err != nil {
		return EventsPage{}, err
	}
	return f.MirroredEvents(ctx, run, after, limit)
}

// MirroredEvents reads run's mirror after a sequence, never past its
// EventCursor (see the mirror's comment), at most limit events (0:
// DefaultEventsLimit, clamped at MaxEventsLimit). No access check: callers
// have done it (RunFor).
func (f *Fleet) MirroredEvents(ctx context.Context, run store.Run, after int64, limit int) (EventsPage, error) {
	if limit <= 0 {
		limit = DefaultEventsLimit
	}
	limit = min(limit, MaxEventsLimit)
	page := EventsPage{Events: []hostproto.Event{}, NextCursor: after}
	if after >= run.EventCursor {
		page.PastEnd = after > run.EventCursor
		return page, nil // nothing mirrored beyond it: no read
	}
	want := int(min(int64(limit), run.EventCursor-after))
	got, err := f.store.ListEvents(ctx, run.FleetRunID, after, want)
	if err != nil {
		return EventsPage{}, fmt.Errorf("fleet: reading the mirror of %s: %w", run.FleetRunID, err)
	}
	for _, e := range got.Events {
		if e.Sequence > run.EventCursor {
			break
		}
		page.Events = append(page.Events, eventToWire(e))
		page.NextCursor = e.Sequence
	}
	// A page that moved nowhere says there is no more: the events below
	// the run's cursor are gone (its host deleted with force under it), and
	// a pager asking again would get the same empty page forever.
	page.HasMore = page.NextCursor > after && page.NextCursor < run.EventCursor
	return page, nil
}

// SyncRun brings one run up to date from its host (state and events, as
// the sweep does, and its egress ledger once it has ended: see the egress
// mirror) and returns it as stored after; a run that is no longer live is
// returned as stored, without asking the host. A host that cannot be
// asked leaves the run as it was (with the error). The stream calls it
// before each read of the mirror (pull-through).
func (f *Fleet) SyncRun(ctx context.Context, id string) (store.Run, error) {
	return f.syncByID(ctx, id, egressAtEnd)
}

// syncByID is SyncRun with the ledger treated as mode says.
func (f *Fleet) syncByID(ctx context.Context, id string, mode egressMode) (store.Run, error) {
	run, err := f.store.GetRun(store.EventualRead(ctx), id)
	if err == nil && !run.Live() {
		// Its end is what a stream would announce, and a stale read may
		// predate a retry that made the run live again: only a strong read
		// may say it is over. Paid once, at the end.
		run, err = f.store.GetRun(ctx, id)
	}
	if err != nil {
		return store.Run{}, fmt.Errorf("fleet: reading run %s: %w", id, err)
	}
	stored, res := f.syncRun(ctx, run, syncPass{hosts: newHostClients(f), egress: mode})
	stored, _ = f.revokeEnded(ctx, stored)
	return stored, res.err
}

// syncPass is what one pass (a sweep, a stream's poll) shares across the
// runs it syncs.
type syncPass struct {
	hosts *hostClients
	// until is the pass's budget (see syncRun); zero: none.
	until time.Time
	// extend lets the pass extend events' expiry (the sweep alone does: see
	// expiry.go); without it a run that needs that is left live for it.
	extend bool
	// egress is how the pass treats a live run's ledger (egress.go).
	egress egressMode
	// credentials lets the pass send live runs fresh brokered values
	// (brokered.go): the sweep alone does, so that one refresher at a
	// time acts for a run (the sweep's lease).
	credentials bool
}

// syncOutcome is what syncRun did with a run.
type syncOutcome int

const (
	syncCurrent     syncOutcome = iota // up to date (state and events), still live or not
	syncDrained                        // drained by this pass: it left the live index
	syncLost                           // its host denies it: lost
	syncInFlight                       // dispatching, before its deadline (or within the grace)
	syncUnreachable                    // its host did not answer: left live
	syncPartial                        // events left to mirror: the budget ran out first
	syncFailed                         // another error (logged): left as it was
	syncQueued                         // waiting in the queue index, within its timeout (timeOutQueue)
)

type syncResult struct {
	outcome   syncOutcome
	recovered bool // a dispatching run was resolved
	extended  bool // its events' expiry was extended
	events    int  // events mirrored
	egress    int  // ledger records mirrored
	// credentials counts what the pass did with brokered values.
	credentials credentialCounts
	err         error
}

// syncRun brings run up to date from its host. until, when not zero, is the
// pass's budget: no host call (a recovery, reading the credential, the
// state, a page of events) starts once the clock has reached it, and each
// host call is bounded by HostTimeout, so the run's host work is over by
// until + HostTimeout, on the injected clock (a deadline of the host calls'
// context too). Stopped short, it keeps its progress (the cursor is
// recorded per page) and reports syncPartial.
func (f *Fleet) syncRun(ctx context.Context, run store.Run, pass syncPass) (store.Run, syncResult) {
	hostCtx := ctx
	if !pass.until.IsZero() {
		var cancel context.CancelFunc
		hostCtx, cancel = clock.WithDeadline(ctx, f.clock, pass.until.Add(f.cfg.HostTimeout))
		defer cancel()
	}
	switch {
	case run.Status == store.StatusQueued:
		return f.syncQueued(ctx, run)
	case run.Status == store.StatusDispatching:
		return f.syncDispatching(ctx, hostCtx, run, pass)
	case !run.Live():
		return run, syncResult{outcome: syncCurrent}
	case run.Status == store.StatusLost:
		return f.syncLost(ctx, run, pass)
	}
	return f.syncLive(ctx, hostCtx, run, pass)
}

// spent reports whether the pass's budget is spent: no host call starts.
func (f *Fleet) spent(pass syncPass) bool {
	return !pass.until.IsZero() && !f.clock.Now().Before(pass.until)
}

// dispatchWait decides whether a sync leaves a dispatching run as it is
// for now rather than recover it (ask its host by clientToken), and with
// which outcome: in flight before its deadline, its host down in this
// pass, or the pass's budget spent.
func dispatchWait(run store.Run, now time.Time, hostDown, spent bool) (syncOutcome, bool) {
	switch {
	case now.Before(run.Deadline):
		return syncInFlight, true
	case hostDown:
		return syncUnreachable, true
	case spent:
		return syncPartial, true
	}
	return syncCurrent, false
}

// syncDispatching recovers a dispatching run past its deadline and, when
// that leaves it live, syncs it as any live run.
func (f *Fleet) syncDispatching(ctx, hostCtx context.Context, run store.Run, pass syncPass) (store.Run, syncResult) {
	if outcome, wait := dispatchWait(run, f.clock.Now(), pass.hosts.isDown(run.HostID), f.spent(pass)); wait {
		return run, syncResult{outcome: outcome}
	}
	recovered, err := f.recover(hostCtx, run)
	if err != nil {
		return run, f.hostTrouble(run, pass.hosts, "recovering a dispatch", err)
	}
	if recovered.Status == store.StatusDispatching {
		return recovered, syncResult{outcome: syncInFlight}
	}
	f.log.Info("dispatch recovered", logRun, run.FleetRunID, logHost, run.HostID, logStatus, recovered.Status, logReason, recovered.Reason)
	if recovered.Status == store.StatusQueued {
		// Back in the queue: not live, and counted with the queue (Queued).
		return recovered, syncResult{outcome: syncCurrent, recovered: true}
	}
	if !recovered.Live() {
		return recovered, syncResult{outcome: syncDrained, recovered: true}
	}
	stored, res := f.syncRun(ctx, recovered, pass)
	res.recovered = true
	return stored, res
}

// syncLive reads a live run's state from its host, then its events, then
// its egress ledger (egress.go), and records them (recordSync). The state
// comes first: a terminal state read here means its state event is on the
// host already (see the mirror's comment), and its ledger sealed or soon
// to be.
func (f *Fleet) syncLive(ctx, hostCtx context.Context, run store.Run, pass syncPass) (store.Run, syncResult) {
	res := syncResult{}
	if pass.extend && !store.Terminal(run.Status) && f.liveEventsShort(run, f.clock.Now()) && !f.spent(pass) {
		extended, err := f.extendEvents(ctx, run, f.eventExpiry(f.clock.Now()))
		if err != nil {
			f.log.Warn("sync failed", logRun, run.FleetRunID, logDoing, "extending the events' expiry", logErr, err.Error())
			return run, syncResult{outcome: syncFailed, err: err}
		}
		run, res.extended = extended, true
	}
	if run.ChildRunID == "" {
		// Every path that ends a dispatch without a host run drains it
		// (Fleet.end); a live one without is a bug, not a host's fault.
		f.log.Error("sync: a live run has no host run id", logRun, run.FleetRunID, logStatus, run.Status)
		return run, syncResult{outcome: syncFailed, err: fmt.Errorf("fleet: run %s is live without a host run", run.FleetRunID)}
	}
	client, stop, ok := f.syncClient(hostCtx, run, pass)
	if !ok {
		return run, stop
	}
	hr, err := client.Get(hostCtx, run.ChildRunID)
	if errors.Is(err, hostproto.ErrRunNotFound) {
		return f.syncDenied(ctx, run, pass)
	}
	if err != nil {
		return run, f.hostTrouble(run, pass.hosts, "reading the run's state", err)
	}
	var cc credentialCounts
	if pass.credentials && !f.spent(pass) {
		// Before the events: a task whose value is expiring, or that its
		// host lost, is failing its calls now.
		run, cc = f.refreshCredentials(hostCtx, client, run, hr)
	}
	p := f.pullEvents(ctx, hostCtx, client, run, pass, res)
	if p.res.outcome == syncCurrent && p.res.err == nil {
		eg := f.pullEgress(ctx, hostCtx, client, p.run, hr, pass)
		p.ledgerDone, p.res.egress = eg.complete, eg.records
		if eg.res.outcome != syncCurrent || eg.res.err != nil {
			p.res.outcome, p.res.err = eg.res.outcome, eg.res.err
		}
	}
	stored, res := f.recordSync(ctx, hr, p, pass)
	res.credentials.add(cc)
	return stored, res
}

// syncClient returns the client of run's host, or (ok false) the result a
// sync stops with: the pass's budget spent, the client unavailable, or the
// host down in this pass.
func (f *Fleet) syncClient(hostCtx context.Context, run store.Run, pass syncPass) (*hostproto.Client, syncResult, bool) {
	if f.spent(pass) {
		return nil, syncResult{outcome: syncPartial}, false
	}
	client, err := pass.hosts.client(hostCtx, run.HostID)
	if err != nil {
		return nil, f.hostTrouble(run, pass.hosts, "preparing the host client", err), false
	}
	if pass.hosts.isDown(run.HostID) {
		return nil, syncResult{outcome: syncUnreachable}, false
	}
	if f.spent(pass) {
		return nil, syncResult{outcome: syncPartial}, false
	}
	return client, syncResult{}, true
}

// syncDenied marks lost a run its host denies, and drains it at once when
// the pass may extend its events' expiry (markLost leaves it live when
// they must outlive it first).
func (f *Fleet) syncDenied(ctx context.Context, run store.Run, pass syncPass) (store.Run, syncResult) {
	stored, err := f.markLost(ctx, run)
	if err != nil {
		return run, syncResult{outcome: syncFailed, err: err}
	}
	if stored.Live() && pass.extend {
		stored, err = f.drainLost(ctx, stored)
		if err != nil {
			return stored, syncResult{outcome: syncFailed, err: err}
		}
	}
	return stored, syncResult{outcome: syncLost}
}

// eventPull is what pullEvents did.
type eventPull struct {
	// run is as last stored (the cursor is recorded per page).
	run store.Run
	// cursor is the sequence of the last event mirrored.
	cursor int64
	// reachedEnd: the host's events were read to their end.
	reachedEnd bool
	// firstFloor is the events' expiry bound to note when these are the
	// run's first events (expiry.go); zero: it had some already.
	firstFloor time.Time
	// ledgerDone: the egress ledger has nothing left to wait for
	// (pullEgress's complete).
	ledgerDone bool
	res        syncResult
}

// pullEvents mirrors run's events after its cursor, page by page, while
// the pass's budget lasts, recording the cursor after each page that has
// more after it. res is the sync's result so far.
func (f *Fleet) pullEvents(ctx, hostCtx context.Context, client *hostproto.Client, run store.Run, pass syncPass, res syncResult) eventPull {
	p := eventPull{run: run, cursor: run.EventCursor, res: res}
	if run.EventCursor == 0 {
		// The expiry of an event mirrored now, before any is.
		p.firstFloor = f.eventExpiry(f.clock.Now())
	}
	for limit := hostEventPage; ; {
		if f.spent(pass) || ctx.Err() != nil {
			p.res.outcome = syncPartial
			return p
		}
		page, err := client.Events(hostCtx, run.ChildRunID, p.cursor, limit)
		if errors.Is(err, hostproto.ErrTooLarge) {
			f.log.Warn("sync: the host's events page is over the bound; asking for fewer", logRun, run.FleetRunID,
				logHost, run.HostID, "after", p.cursor, "limit", limit)
			next, marker := shrinkPage(limit)
			if !marker {
				limit = next
				continue
			}
			page, err = hostproto.EventPage{Events: []hostproto.Event{f.unreadableEvent(p.cursor + 1)}, HasMore: true}, nil
		}
		if err != nil {
			p.res = f.hostTrouble(run, pass.hosts, "reading events", err)
			return p
		}
		fresh := newAfter(page.Events, func(e hostproto.Event) int64 { return e.Sequence }, p.cursor)
		if len(fresh) > 0 && fresh[0].Sequence != p.cursor+1 {
			f.log.Warn("sync: the host's events skip sequences", logRun, run.FleetRunID, logHost, run.HostID,
				"after", p.cursor, "first", fresh[0].Sequence)
		}
		if err := f.putEvents(ctx, run.FleetRunID, fresh); err != nil {
			p.res = syncResult{outcome: syncFailed, err: err}
			return p
		}
		if len(fresh) > 0 {
			p.cursor = fresh[len(fresh)-1].Sequence
			p.res.events += len(fresh)
		}
		if !page.HasMore || len(fresh) == 0 {
			p.reachedEnd = !page.HasMore
			return p
		}
		// More pages: record the progress, so a pass cut short here (by
		// the budget, a timeout, a crash) resumes after these events.
		if p.run, err = f.advanceCursor(ctx, p.run, p.cursor, p.firstFloor); err != nil {
			p.res = syncResult{outcome: syncFailed, err: err}
			return p
		}
	}
}

// shrinkPage decides what to ask for after the host answered a page of
// limit events over the bound: a tenth as many, down to one; past one
// (marker), nothing: that event is mirrored as a marker in its place.
func shrinkPage(limit int) (next int, marker bool) {
	if limit > 1 {
		return max(1, limit/10), false
	}
	return limit, true
}

// recordSync records on the run what a sync read: the cursor its events
// reached, hr (the host's state, read before them) when it applies, and
// the drain when drainable; its events' expiry is extended first when they
// would not outlive it (expiry.go).
func (f *Fleet) recordSync(ctx context.Context, hr hostproto.Run, p eventPull, pass syncPass) (store.Run, syncResult) {
	run, res := p.run, p.res
	now := f.clock.Now().UTC()
	extendFirst := false
	stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
		changed := noteFloorAfter(cur, p.cursor, p.firstFloor)
		if cur.Status == store.StatusLost || cur.Status == store.StatusDispatching {
			return changed
		}
		if hostAnswerApplies(*cur, hr) {
			f.applyHostRun(cur, hr, now)
			changed = true
		}
		extendFirst = false
		if drainable(*cur, hr, p) {
			if f.drainEventsShort(*cur) {
				extendFirst = true
			} else {
				cur.Drained, changed = true, true
			}
		}
		return changed
	})
	if err == nil && extendFirst && pass.extend {
		if stored, err = f.extendEvents(ctx, stored, stored.ExpiresAt.Add(eventsLag)); err == nil {
			res.extended = true
			stored, err = f.settle(ctx, stored, func(cur *store.Run) bool {
				if !drainable(*cur, hr, p) || f.drainEventsShort(*cur) {
					return false
				}
				cur.Drained = true
				return true
			})
		}
	}
	if err != nil {
		if res.err == nil {
			res = syncResult{outcome: syncFailed, events: res.events, extended: res.extended,
				err: fmt.Errorf("fleet: recording the sync of %s: %w", run.FleetRunID, err)}
		}
		return run, res
	}
	if res.err == nil && res.outcome == syncCurrent && !stored.Live() {
		res.outcome = syncDrained
		f.ledgers.forget(stored.FleetRunID)
	}
	return stored, res
}

// drainable decides whether cur may be drained: the state read before the
// events (hr) was terminal, of cur's attempt, the events were read to
// their end, all of them mirrored, and the egress ledger has nothing left
// to wait for (egress.go).
func drainable(cur store.Run, hr hostproto.Run, p eventPull) bool {
	return p.reachedEnd && p.ledgerDone && !cur.Drained && store.Terminal(cur.Status) && store.Terminal(hr.Status) &&
		cur.Attempt == hr.Attempt && cur.EventCursor >= p.cursor
}

// noteFloorAfter moves cur's cursor up to cursor and, when cur has events
// and no expiry bound yet, notes firstFloor (unless zero) as that bound; it
// reports a change.
func noteFloorAfter(cur *store.Run, cursor int64, firstFloor time.Time) bool {
	changed := false
	if cursor > cur.EventCursor {
		cur.EventCursor, changed = cursor, true
	}
	if firstFloor.IsZero() || cur.EventCursor == 0 || !cur.EventsExpireAfter.IsZero() {
		return changed
	}
	cur.EventsExpireAfter = firstFloor
	return true
}

// syncLost drains a lost run left live because its events' expiry had to
// be extended first (markLost), when the pass may extend it.
func (f *Fleet) syncLost(ctx context.Context, run store.Run, pass syncPass) (store.Run, syncResult) {
	if !pass.extend || f.spent(pass) {
		return run, syncResult{outcome: syncCurrent}
	}
	stored, err := f.drainLost(ctx, run)
	if err != nil {
		f.log.Warn("sync failed", logRun, run.FleetRunID, logDoing, "draining a lost run", logErr, err.Error())
		return run, syncResult{outcome: syncFailed, err: err}
	}
	return stored, syncResult{outcome: syncDrained, extended: true}
}

// hostTrouble classifies a failed host call of a sync: no answer marks the
// host down for the rest of the pass (its other runs wait for the next
// one) and leaves the run live; anything else is logged as a failure.
func (f *Fleet) hostTrouble(run store.Run, hosts *hostClients, doing string, err error) syncResult {
	if errors.Is(err, hostproto.ErrNoAnswer) {
		hosts.markDown(run.HostID)
		f.log.Warn("sync: the host did not answer; the run stays live", logRun, run.FleetRunID, logHost, run.HostID,
			logDoing, doing, logErr, err.Error())
		return syncResult{outcome: syncUnreachable, err: err}
	}
	f.log.Warn("sync failed", logRun, run.FleetRunID, logHost, run.HostID, logDoing, doing, logErr, err.Error())
	return syncResult{outcome: syncFailed, err: err}
}

// hostAnswerApplies reports whether hr, the host's view of a run read at
// some moment, may be recorded over cur, the run as stored now. It is the
// one rule of every path that records a host's answer (a read, a verb's
// answer, a sync): never over lost (the host denied the run) or
// dispatching (recovery resolves that), never an earlier attempt's state
// over a later one (an answer read before a retry made the next attempt
// live would roll the run back), never a live state over the same
// attempt's end (an answer read before the end, recorded after it by a
// slower path, would revive a drained run), and only when it says
// something new.
func hostAnswerApplies(cur store.Run, hr hostproto.Run) bool {
	switch {
	case cur.Status == store.StatusLost || cur.Status == store.StatusDispatching:
		return false
	case hr.Attempt != cur.Attempt:
		return hr.Attempt > cur.Attempt
	case store.Terminal(cur.Status) && !store.Terminal(hr.Status):
		return false
	}
	return cur.Status != hr.Status || cur.Reason != hr.Reason || !sameExit(cur.ExitCode, hr.ExitCode) || cur.ChildRunID != hr.RunID
}

// newAfter returns the items (events, ledger records) whose sequence is
// after cursor, in sequence order, without repeats (a host answers them
// so; a misbehaving one must not move a cursor backwards or store one
// twice).
func newAfter[T any](items []T, seq func(T) int64, cursor int64) []T {
	out := make([]T, 0, len(items))
	for _, x := range items {
		if seq(x) > cursor {
			out = append(out, x)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return seq(out[i]) < seq(out[j]) })
	dedup := out[:0]
	for i, x := range out {
		if i == 0 || seq(x) != seq(out[i-1]) {
			dedup = append(dedup, x)
		}
	}
	return dedup
}

// putEvents mirrors events of a run, each within MaxEventData (fitEvent),
// to expire as expiry.go says.
func (f *Fleet) putEvents(ctx context.Context, fleetRunID string, events []hostproto.Event) error {
	if len(events) == 0 {
		return nil
	}
	expires := f.eventExpiry(f.clock.Now().UTC())
	out := make([]store.Event, len(events))
	for i, e := range events {
		fitted, cut := fitEvent(e)
		if cut > 0 {
			f.log.Warn("sync: an event's data is over the limit; truncated", logRun, fleetRunID,
				logSequence, e.Sequence, "bytes", len(e.Data), "cut", cut)
		}
		out[i] = eventFromWire(fleetRunID, fitted, expires)
	}
	if err := f.store.PutEvents(ctx, out); err != nil {
		return fmt.Errorf("fleet: mirroring %d events of %s: %w", len(events), fleetRunID, err)
	}
	return nil
}

// advanceCursor records that the mirror holds every event up to cursor
// (and its events' expiry bound, noteFloorAfter).
func (f *Fleet) advanceCursor(ctx context.Context, run store.Run, cursor int64, firstFloor time.Time) (store.Run, error) {
	stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
		return noteFloorAfter(cur, cursor, firstFloor)
	})
	if err != nil {
		return run, fmt.Errorf("fleet: advancing the event cursor of %s: %w", run.FleetRunID, err)
	}
	return stored, nil
}

// hostClients memoises, for one pass (a sweep, a stream poll), each host's
// record and client, so runs on one host cost one host read, and
// remembers hosts that did not answer, so a dead host costs one timeout
// per pass rather than one per run. Safe for concurrent use.
type hostClients struct {
	f     *Fleet
	mu    sync.Mutex
	hosts map[string]*hostEntry
}

type hostEntry struct {
	once   sync.Once
	client *hostproto.Client
	err    error
	down   bool // guarded by hostClients.mu
}

func newHostClients(f *Fleet) *hostClients {
	return &hostClients{f: f, hosts: map[string]*hostEntry{}}
}

func (h *hostClients) entry(id string) *hostEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.hosts[id]
	if !ok {
		e = &hostEntry{}
		h.hosts[id] = e
	}
	return e
}

func (h *hostClients) client(ctx context.Context, id string) (*hostproto.Client, error) {
	e := h.entry(id)
	e.once.Do(func() { e.client, e.err = h.f.clientFor(ctx, id) })
	return e.client, e.err
}

func (h *hostClients) markDown(id string) {
	e := h.entry(id)
	h.mu.Lock()
	defer h.mu.Unlock()
	e.down = true
}

func (h *hostClients) isDown(id string) bool {
	e := h.entry(id)
	h.mu.Lock()
	defer h.mu.Unlock()
	return e.down
}

// truncatedMark ends text data cut to MaxEventData: %d is the bytes of text
// left out.
const truncatedMark = "\n[runfleet: %d bytes of this event were cut: event data is at most 32 KiB]"

// fitEvent returns e with its data within hostproto.MaxEventData (see the
// mirror's comment) and how many bytes of text or data were cut (0: e is
// returned as it came).
func fitEvent(e hostproto.Event) (hostproto.Event, int) {
	if len(e.Data) <= hostproto.MaxEventData {
		return e, 0
	}
	var text string
	if json.Unmarshal(e.Data, &text) != nil {
		n := len(e.Data)
		e.Data = jsonString(fmt.Sprintf("[runfleet: this event's data (%d bytes of JSON) was dropped: event data is at most 32 KiB]", n))
		return e, n
	}
	// Escaping makes the JSON longer than the text (a byte takes 1 to 6):
	// shorten until it fits, on a rune boundary.
	keep := min(len(text), hostproto.MaxEventData)
	for {
		for keep > 0 && keep < len(text) && !utf8.RuneStart(text[keep]) {
			keep--
		}
		data := jsonString(text[:keep] + fmt.Sprintf(truncatedMark, len(text)-keep))
		if len(data) <= hostproto.MaxEventData || keep == 0 {
			e.Data = data
			return e, len(text) - keep
		}
		keep = max(0, keep-max((len(data)-hostproto.MaxEventData)/6, 1))
	}
}

// unreadableEvent stands in the mirror for event seq when the host's answer
// for it alone is over the page bound: the run goes on, and a reader sees
// what happened in its place.
func (f *Fleet) unreadableEvent(seq int64) hostproto.Event {
	return hostproto.Event{
		Sequence: seq,
		Type:     hostproto.EventOutput,
		Data:     jsonString(fmt.Sprintf("[runfleet: event %d could not be mirrored: the host's answer for it alone is over the page bound]", seq)),
		TS:       f.clock.Now().UTC(),
	}
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s) // a string always marshals
	return b
}
