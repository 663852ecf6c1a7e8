package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// The dispatcher's half of runs that wait (queue.go): FillHosts takes a
// batch of wakes and offers the waiting runs to the hosts they name.
//
// The queue's classes are read first (nothing waits: nothing more is read).
// The woken hosts are read eventually consistent (a host that changed a
// moment ago is caught by the host itself, which refuses a start it cannot
// take, and by the versioned offer) and kept only when routable
// now (no exclusion of routing's that is about the host: disabled, never
// probed, stale, unhealthy, draining, storage low), each with the room its
// wakes give (their slots, at most its maxConcurrent). The classes some
// such host serves (its agents and labels) are merged by their heads in
// the queue index, so runs are taken globally best first (priority, then
// since), each read and checked: a run being offered elsewhere is
// skipped; one left dispatching on a woken host by a dispatcher that died
// is resumed (resume); a queued one is offered to the woken hosts with
// room in routing's order (Route over them, as the dispatch fallback
// orders hosts: a run routing says none of them can take, for its local
// path, secrets or the caller's scope, is left for other hosts). An offer
// is a versioned write (queued -> dispatching on the host, still in the
// index), then one host start under the run's clientToken and the offer's
// deadline, then the record of the answer (recordStartAnswer, as a
// dispatch records it): started, the run leaves the index; a transient
// refusal moves it to the next host with room (moveTo), and the last one
// puts it back in the queue at its place with a fresh token (requeue),
// and that host is filled no further; any other refusal ends it as a
// dispatch would. No run is offered to two hosts at once, and each start
// is one host call: a run is started at most once (the host's clientToken
// makes a repeated start of one offer a no-op).

// fillScanPerSlot and fillScanBase bound the runs one FillHosts passes
// over (fillScanPerSlot per slot of room, plus fillScanBase): runs the
// woken hosts cannot take are skipped by reading on, up to that bound; the
// rest wait for another wake. A run another dispatcher took meanwhile is
// not passed over: fills of hosts that share a class run at once (a
// batch's hosts, concurrent batches) and walk the same head, and a fill
// that counted the runs the others were offering would stop with room
// left while runs wait (BenchmarkQueueBurstDrain).
const (
	fillScanPerSlot = 4
	fillScanBase    = 8
)

// fillHost is a woken host and the room it has left in this FillHosts.
type fillHost struct {
	host   store.Host
	room   int
	client *hostproto.Client
}

// filler is one FillHosts.
type filler struct {
	f     *Fleet
	hosts []*fillHost // in the order woken
	byID  map[string]*fillHost
	rep   FillReport
	seen  map[string]bool
}

// FillHosts offers waiting runs to the hosts wakes name, at most Slots
// each (the wakes of one host add up). An error means a delivery should
// come again (the dispatcher reports the batch item failed): offers
// already made are kept.
func (f *Fleet) FillHosts(ctx context.Context, wakes []Wake) (FillReport, error) {
	if !slices.ContainsFunc(wakes, func(w Wake) bool { return w.HostID != "" && w.Slots > 0 }) {
		return FillReport{}, nil
	}
	// The queue before the hosts: a wake may come with nothing waiting
	// (another instance's end, a probe's, a run started meanwhile), and
	// this one read (0.5 RCU) then spares the hosts' reads.
	classes, err := f.queueHeads(ctx)
	if err != nil {
		return FillReport{}, fmt.Errorf("fleet: fill: reading the queue's classes: %w", err)
	}
	if len(classes) == 0 {
		f.log.Debug("fill: nothing waits", "wakes", len(wakes))
		return FillReport{}, nil
	}
	fl, err := f.openFill(ctx, wakes)
	if err != nil {
		return FillReport{}, err
	}
	err = fl.fill(ctx, classes)
	rep := fl.rep
	level := slog.LevelDebug
	if rep.Offered > 0 || rep.Resumed > 0 || err != nil {
		level = slog.LevelInfo
	}
	hosts := make([]string, len(fl.hosts))
	for i, h := range fl.hosts {
		hosts[i] = h.host.ID
	}
	f.log.Log(ctx, level, "fill", "wakes", len(wakes), logHosts, hosts, "started", len(rep.Started), "offered", rep.Offered,
		"resumed", rep.Resumed)
	return rep, err
}

// openFill reads the woken hosts and keeps those routable now, with their
// room. Eventually consistent (0.5 RCU a host, not 1): a start the host
// cannot take is refused by the host itself (host_busy, draining: the run
// goes on to the next host, or back to its place), and a host disabled a
// moment ago may take one more run, as a dispatch routed on the routing
// view may.
func (f *Fleet) openFill(ctx context.Context, wakes []Wake) (*filler, error) {
	fl := &filler{f: f, byID: map[string]*fillHost{}, seen: map[string]bool{}}
	room := map[string]int{}
	var order []string
	for _, w := range wakes {
		if w.HostID == "" || w.Slots <= 0 {
			continue
		}
		if _, ok := room[w.HostID]; !ok {
			order = append(order, w.HostID)
		}
		room[w.HostID] += w.Slots
	}
	in := RouteInput{Now: f.clock.Now(), MaxProbeAge: f.cfg.ProbeMaxAge}
	for _, id := range order {
		h, err := f.store.GetHost(store.EventualRead(ctx), id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("fleet: fill: reading host %q: %w", id, err)
		}
		if reasons, _ := exclusions(in, h, ""); len(reasons) > 0 {
			f.log.Debug("fill: a woken host is not routable now", logHost, id, "reasons", reasons)
			continue
		}
		n := room[id]
		if l := h.Probe.Load; l != nil && l.MaxConcurrent > 0 {
			n = min(n, l.MaxConcurrent)
		}
		fh := &fillHost{host: h, room: n}
		fl.hosts = append(fl.hosts, fh)
		fl.byID[id] = fh
	}
	return fl, nil
}

// room is the room left on every woken host.
func (fl *filler) room() int {
	n := 0
	for _, h := range fl.hosts {
		n += h.room
	}
	return n
}

// classHead is one class of the queue as the merge reads it.
type classHead struct {
	class  string
	agent  string
	labels map[string]string
	buf    []store.QueueEntry
	next   string
	done   bool
	limit  int // its next page's size
}

// fill merges the heads of classes (the queue's, as read, each with its
// first entry) that the woken hosts serve and takes their runs, best
// first, while there is room and the scan bound allows. A class's pages
// are read from past the head the classes came with: a fill that takes
// only the head (one slot, one class) reads no page.
func (fl *filler) fill(ctx context.Context, classes []store.QueueHead) error {
	slots := fl.room()
	if slots == 0 {
		return nil
	}
	var heads []*classHead
	for _, c := range classes {
		agent, labels, err := ParseClass(c.Class)
		if err != nil {
			fl.f.log.Warn("fill: a queue class does not parse", logClass, c.Class, logErr, err.Error())
			continue
		}
		heads = append(heads, &classHead{class: c.Class, agent: agent, labels: labels,
			buf: []store.QueueEntry{c.Head}, next: c.Head.Order})
	}
	limit := min(max(slots+2, 5), store.MaxLimit)
	for passed := 0; passed < fillScanPerSlot*slots+fillScanBase && fl.room() > 0; {
		e, ok, err := fl.pop(ctx, heads, limit)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		if !roomForAnotherHost(ctx, fl.f.cfg.HostTimeout) {
			fl.f.log.Warn("fill: out of time with room left; the next wake or probe pass fills it", "room", fl.room())
			return nil
		}
		if fl.take(ctx, e) {
			passed++
		}
	}
	return nil
}

// pop takes the best entry at the head of the classes a woken host with
// room serves, reading a class's next page when its buffer is empty.
func (fl *filler) pop(ctx context.Context, heads []*classHead, limit int) (store.QueueEntry, bool, error) {
	var best *classHead
	for _, c := range heads {
		if !fl.serves(c) {
			continue
		}
		if c.limit == 0 {
			c.limit = limit
		}
		for len(c.buf) == 0 && !c.done {
			if err := ctx.Err(); err != nil {
				return store.QueueEntry{}, false, err
			}
			page, err := fl.f.store.ListQueue(ctx, c.class, c.next, c.limit)
			if err != nil {
				return store.QueueEntry{}, false, fmt.Errorf("fleet: fill: reading the queue of %s: %w", c.class, err)
			}
			// A run none of the woken hosts with room may take (its hosts,
			// as the index keeps them) is passed over unread and uncounted:
			// however many wait ahead, they never hide the runs behind them.
			c.buf = slices.DeleteFunc(page.Entries, func(e store.QueueEntry) bool { return fl.seen[e.FleetRunID] || !fl.mayTake(e) })
			c.next, c.done = page.Next, page.Next == ""
			if len(c.buf) == 0 {
				c.limit = min(2*c.limit, store.MaxLimit) // passing over a run of them: larger pages
			}
		}
		if len(c.buf) > 0 && (best == nil || c.buf[0].Order < best.buf[0].Order) {
			best = c
		}
	}
	if best == nil {
		return store.QueueEntry{}, false, nil
	}
	e := best.buf[0]
	best.buf = best.buf[1:]
	fl.seen[e.FleetRunID] = true
	return e, true, nil
}

// mayTake reports whether a woken host with room is among e's hosts (any
// is, for a run whose entry names none).
func (fl *filler) mayTake(e store.QueueEntry) bool {
	if e.Hosts == nil {
		return true
	}
	for _, h := range fl.hosts {
		if h.room > 0 && slices.Contains(e.Hosts, h.host.ID) {
			return true
		}
	}
	return false
}

// serves reports whether a woken host with room offers c's agent and has
// its labels.
func (fl *filler) serves(c *classHead) bool {
	for _, h := range fl.hosts {
		if h.room > 0 && slices.Contains(h.host.Probe.Agents, c.agent) && hasLabels(h.host.Labels, c.labels) {
			return true
		}
	}
	return false
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// take reads one waiting run of the index and offers or resumes it. It
// reports whether the run was passed over: it still waits, for hosts
// other than these (or a read or write failed); not when it started, was
// taken or ended elsewhere, or is gone.
func (fl *filler) take(ctx context.Context, e store.QueueEntry) bool {
	f := fl.f
	// Eventually consistent: the offer is a versioned write, so a stale
	// read costs a retry, never a second offer.
	run, err := f.store.GetRun(store.EventualRead(ctx), e.FleetRunID)
	if errors.Is(err, store.ErrNotFound) {
		return false
	}
	if err != nil {
		f.log.Warn("fill: reading a waiting run failed", logRun, e.FleetRunID, logErr, err.Error())
		return true
	}
	switch {
	case !run.Waiting():
		return false // it left the queue since the index was read
	case run.Status == store.StatusDispatching:
		if h := fl.byID[run.HostID]; h != nil && h.room > 0 {
			fl.resume(ctx, h, run)
		}
		return false // else offered to another host now
	case !f.clock.Now().Before(run.Queue.Until):
		if _, err := f.expireQueued(ctx, run); err != nil {
			f.log.Warn("fill: ending a run at its queue timeout failed", logRun, run.FleetRunID, logErr, err.Error())
		}
		return false
	}
	wr, err := decodeQueued(run.Queue.Request)
	if err != nil {
		f.log.Error("fill: a waiting run's request cannot be read; it waits until its timeout", logRun, run.FleetRunID, logErr, err.Error())
		return true
	}
	return fl.offer(ctx, run, wr)
}

// routeInput is routing's input for wr over the woken hosts with room
// that its caller may use (only: that host alone, when not nil).
func (fl *filler) routeInput(wr waitingRequest, only *fillHost) RouteInput {
	r := wr.req
	in := RouteInput{
		Agent: r.Run.Agent, Labels: r.Labels, Repository: r.Run.Repository, LocalPath: r.Run.LocalPath,
		NeedsSecrets: len(r.Run.Secrets) > 0, RepoURLs: fl.f.cfg.RepoURLs, Now: fl.f.clock.Now(), MaxProbeAge: fl.f.cfg.ProbeMaxAge,
		Refused: map[string]string{},
	}
	for _, h := range fl.hosts {
		if h.room > 0 && wr.allows(h.host.ID) && (only == nil || only == h) {
			in.Hosts = append(in.Hosts, h.host)
		}
	}
	return in
}

// offer offers run, queued, to the first woken host routing gives, and
// starts it (start); it reports whether the run was passed over (take).
func (fl *filler) offer(ctx context.Context, run store.Run, wr waitingRequest) bool {
	f := fl.f
	in := fl.routeInput(wr, nil)
	d := Route(in)
	if d.Host == nil {
		return true // none of the woken hosts can take it: left for others
	}
	// Minted before the offer is written, so that the offer records them
	// in the same write; an offer that loses its race revokes them.
	minted, err := f.mintForDispatch(ctx, run.FleetRunID, wr.req)
	if err != nil {
		var fe *Error
		if errors.As(err, &fe) {
			fl.endUnstarted(ctx, run, fe.Code, fe.Message)
			return false
		}
		f.log.Warn("fill: minting a waiting run's brokered keys failed; it stays queued", logRun, run.FleetRunID, logErr, err.Error())
		return true
	}
	offered := false
	stored, err := f.settle(context.WithoutCancel(ctx), run, func(cur *store.Run) bool {
		now := f.clock.Now().UTC()
		offered = cur.Status == store.StatusQueued && cur.Waiting() && now.Before(cur.Queue.Until)
		if !offered {
			return false
		}
		cur.Status = store.StatusDispatching
		cur.HostID = d.Host.ID
		cur.RewroteLocalPath = d.RewroteLocalPath
		cur.Deadline = now.Add(f.cfg.HostTimeout)
		cur.UpdatedAt = now
		cur.Brokered = brokeredKeysOf(minted)
		return true
	})
	if err != nil || !offered {
		if err != nil {
			f.log.Warn("fill: offering a waiting run failed", logRun, run.FleetRunID, logHost, d.Host.ID, logErr, err.Error())
		}
		f.revokeMinted(ctx, run.FleetRunID, wr.req.Run.Repository, minted, "another dispatcher took the run first")
		return err != nil
	}
	fl.start(ctx, stored, wr, d, in, minted, true)
	return false
}

// endUnstarted ends run, queued, with a refusal about the run itself (its
// brokered key could not be minted), as a dispatch would have refused it.
func (fl *filler) endUnstarted(ctx context.Context, run store.Run, reason, detail string) {
	f := fl.f
	_, err := f.settle(context.WithoutCancel(ctx), run, func(cur *store.Run) bool {
		if cur.Status != store.StatusQueued {
			return false
		}
		f.end(cur, store.StatusFailed, reason, detail, f.clock.Now().UTC())
		return true
	})
	if err != nil {
		f.log.Warn("fill: ending a waiting run that cannot start failed", logRun, run.FleetRunID, logReason, reason, logErr, err.Error())
		return
	}
	f.log.Info("fill: a waiting run cannot start; it ended", logRun, run.FleetRunID, logReason, reason)
}

// start calls the host of run (dispatching there, offered with minted's
// values) to start it as d decided and records the answer; on a transient
// refusal (or one of the host's clock: clockRefusal), when fallback allows, it moves the run to the next woken host
// with room in routing's order (in, without the hosts that refused), at
// most MaxDispatchHosts hosts, and after the last puts it back in the
// queue. A host that refused is filled no further, nor one whose answer
// is unknown.
func (fl *filler) start(ctx context.Context, run store.Run, wr waitingRequest, d Decision, in RouteInput, minted []mintedValue, fallback bool) {
	f := fl.f
	credentials := brokeredValues(minted)
	for {
		h := fl.byID[run.HostID]
		var answer hostproto.Run
		client, callErr := fl.client(ctx, h)
		if callErr == nil {
			answer, callErr = f.callStart(ctx, client, startRequest(run, wr.req, d, credentials))
			fl.rep.Offered++
		}
		refusal, transient := transientRefusal(run.HostID, answer, callErr)
		if !transient {
			refusal, transient = clockRefusal(run.HostID, callErr)
			if transient {
				f.log.Warn("fill: a host refused a start as past its deadline, which Fleet set a host timeout ahead: its clock runs ahead of Fleet's",
					logRun, run.FleetRunID, logHost, h.host.ID)
			}
		}
		if transient {
			h.room = 0
			in.Refused[h.host.ID] = refusal.Reasons[0]
			f.log.Info("fill: a host refused a waiting run", logRun, run.FleetRunID, logHost, h.host.ID, logReason, refusal.Reasons[0])
			if fallback && len(in.Refused) < MaxDispatchHosts && roomForAnotherHost(ctx, f.cfg.HostTimeout) {
				next := fl.routeInput(wr, nil)
				next.Refused = in.Refused
				if nd := Route(next); nd.Host != nil {
					if moved, ok := f.moveTo(ctx, run, nd); ok {
						run, d = moved, nd
						continue
					}
				}
			}
			if _, _, err := f.requeue(ctx, run, nil, wr.req.Run.Repository); err != nil {
				f.log.Warn("fill: putting a refused run back in the queue failed; the sweep does", logRun, run.FleetRunID, logErr, err.Error())
			}
			return
		}
		res, err := f.recordStartAnswer(ctx, client, run, answer, callErr)
		if err != nil {
			h.room = 0
			f.log.Error("fill: recording a start failed; recovery asks the host by clientToken", logRun, run.FleetRunID,
				logHost, h.host.ID, logErr, err.Error())
			return
		}
		fl.recorded(ctx, h, res)
		return
	}
}

// clockRefusal reports whether a start's error is the host's refusal of
// it as past its deadline, with the exclusion that records it. Fleet sets
// a start's deadline a host timeout after the offer, and the call ends by
// then: a host that refuses it so has a clock running ahead of Fleet's.
// For a waiting run that is about the host, as a busy host is: the run
// goes on to the next host, or back to its place, rather than failing for
// that host's clock (the host stores nothing of a start it refuses so).
func clockRefusal(host string, err error) (Exclusion, bool) {
	var he *hostproto.Error
	if errors.As(err, &he) && he.Refused() && he.Code == hostproto.CodeDeadlinePassed {
		return Exclusion{HostID: host, Reasons: []string{hostproto.ReasonDeadlinePassed}, Detail: boundDetail(he.Message)}, true
	}
	return Exclusion{}, false
}

// recorded accounts for a start's recorded answer on host h.
func (fl *filler) recorded(ctx context.Context, h *fillHost, res DispatchResult) {
	f := fl.f
	r := res.Run
	switch {
	case res.Refused:
		// About the run, not the host's room: the host may take another.
		f.revokeEnded(ctx, r)
		f.log.Info("fill: a host refused a waiting run; it ended", logRun, r.FleetRunID, logHost, h.host.ID, logReason, r.Reason)
	case r.Status == store.StatusDispatching:
		h.room = 0
		f.log.Warn("fill: whether the host started a waiting run is unknown; it stays offered there", logRun, r.FleetRunID,
			logHost, h.host.ID)
	default:
		h.room--
		if q := r.Queue; q != nil && q.StartedAt != nil {
			fl.rep.Started = append(fl.rep.Started, r.FleetRunID)
			f.log.Info("fill: a waiting run started", logRun, r.FleetRunID, logHost, h.host.ID, logClass, q.Class,
				"waitedMs", q.StartedAt.Sub(q.Since).Milliseconds(), "offers", q.Offers, logStatus, r.Status)
		}
	}
}

// resume finishes the offer of run, left dispatching on h (a woken host
// with room), once the offer's deadline passed. Before it, the dispatcher
// that made the offer may still be calling the host, and may yet move the
// run on past a refusal: a second start there could start the run on two
// hosts, so the offer is left to that dispatcher, and holds one of h's
// slots in this fill. After it, the host refuses that dispatcher's start
// if it arrives at all; the host is asked by clientToken. A run it has is
// recorded (a transient refusal of it puts the run back in the queue).
// One it does not have is claimed, by a write of a fresh deadline
// conditional on the run's version (a dispatcher that wrote the run since
// owns it), then started there alone with the same token. A run with
// brokered keys is left to the sweep, which puts it back in the queue once
// its deadline and LostGrace passed and revokes its tokens: the values
// sent with the first start are not kept anywhere.
func (fl *filler) resume(ctx context.Context, h *fillHost, run store.Run) {
	f := fl.f
	if f.clock.Now().Before(run.Deadline) {
		h.room--
		return
	}
	client, err := fl.client(ctx, h)
	var hr hostproto.Run
	known := false
	if err == nil {
		hr, known, err = client.FindByClientToken(ctx, run.ClientToken())
	}
	if err != nil {
		h.room = 0
		f.log.Warn("fill: the host of an unfinished offer could not be asked", logRun, run.FleetRunID, logHost, h.host.ID, logErr, err.Error())
		return
	}
	fl.rep.Resumed++
	if known {
		if _, transient := transientRefusal(h.host.ID, hr, nil); transient {
			h.room = 0
			if _, _, err := f.requeue(ctx, run, nil, run.Repository); err != nil {
				f.log.Warn("fill: putting a refused run back in the queue failed; the sweep does", logRun, run.FleetRunID, logErr, err.Error())
			}
			return
		}
		res, err := f.recordStartAnswer(ctx, client, run, hr, nil)
		if err != nil {
			f.log.Error("fill: recording a resumed start failed", logRun, run.FleetRunID, logHost, h.host.ID, logErr, err.Error())
			return
		}
		fl.recorded(ctx, h, res)
		return
	}
	if len(run.Brokered) > 0 {
		return
	}
	wr, err := decodeQueued(run.Queue.Request)
	if err != nil {
		f.log.Error("fill: a waiting run's request cannot be read", logRun, run.FleetRunID, logErr, err.Error())
		return
	}
	in := fl.routeInput(wr, h)
	d := Route(in)
	if d.Host == nil {
		return // the host can no longer take it: the sweep puts it back in the queue
	}
	now, version := f.clock.Now().UTC(), run.Version
	claimed := false
	run, err = f.settle(context.WithoutCancel(ctx), run, func(cur *store.Run) bool {
		claimed = cur.Version == version && cur.Status == store.StatusDispatching && cur.Waiting() && cur.HostID == h.host.ID
		if claimed {
			cur.Deadline, cur.UpdatedAt, cur.RewroteLocalPath = now.Add(f.cfg.HostTimeout), now, d.RewroteLocalPath
		}
		return claimed
	})
	if err != nil || !claimed {
		return
	}
	f.log.Info("fill: resuming the offer of a waiting run", logRun, run.FleetRunID, logHost, h.host.ID)
	fl.start(ctx, run, wr, d, in, nil, false)
}

// client is h's host client, made once per FillHosts.
func (fl *filler) client(ctx context.Context, h *fillHost) (*hostproto.Client, error) {
	if h.client != nil {
		return h.client, nil
	}
	c, err := fl.f.HostClient(ctx, h.host, 0)
	if err != nil {
		fl.f.log.Warn("fill: no client for a woken host", logHost, h.host.ID, logErr, err.Error())
		return nil, fmt.Errorf("%w: %v", hostproto.ErrUnreachable, err)
	}
	h.client = c
	return c, nil
}
