package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
)

// Runs that wait for capacity (DESIGN.md, "Runs that wait").
//
// A dispatch that asks to wait (DispatchRequest.Queue, or Config.QueueDefault
// for one that does not say) and finds no eligible host that takes it now
// (routing found none, or every host it tried refused with a transient
// reason) is recorded queued, with the request it will be started with,
// and answered 202. Wakes (Wake) say that a host may have room: a run on
// it ended (Fleet sends one whenever it records a run's end), it became
// routable or showed free slots in a probe pass, or it was resumed or
// enabled. They travel through a Waker (SQS in AWS, an in-process queue in
// the local stack) to FillHosts, which offers each host with room the
// waiting runs it can take, in queue order, and offers each run to hosts
// in routing's order (the dispatch fallback's). A run is offered under a
// versioned update (queued -> dispatching on the host, still in the queue
// index), then started with its ClientToken; a dispatcher that dies in
// between leaves it dispatching in the index, and the next delivery for
// that host after the offer's deadline resumes the same start (same
// token, so the host starts it at most once; before the deadline the
// dispatcher that made the offer may still move it on). The sweep ends a run whose Until passed (queue_timeout) and
// takes back, to its place, a run whose offer was never delivered.

// QueueRequest is a dispatch's ask to wait: how long at most, and its
// priority in its class (higher first; store.QueuePriorityMin..Max).
type QueueRequest struct {
	Timeout  time.Duration
	Priority int
}

// DefaultQueueMaxTimeout bounds a wait when Config.QueueMaxTimeout is zero.
const DefaultQueueMaxTimeout = 24 * time.Hour

// Wake says that a host may have room for waiting runs.
type Wake struct {
	// HostID is the host.
	HostID string `json:"hostId"`
	// Slots is how many runs it may take: 1 for a run that ended, the
	// probe's free slots otherwise. FillHosts starts at most this many.
	Slots int `json:"slots"`
	// Reason says why, for logs and metrics: one of the Wake* reasons.
	Reason string `json:"reason"`
}

// Wake reasons.
const (
	WakeRunEnded = "run_ended"
	WakeProbe    = "probe"
	WakeResumed  = "resumed"
	WakeEnabled  = "enabled"
)

// Waker delivers wakes to FillHosts, at least once: SQS in AWS (the
// dispatcher function on its event source mapping), an in-process queue in
// the local stack. Wake may be called from any Fleet function; an error
// is logged by the caller, never fatal to what it was doing (the next
// probe pass finds a host with room that a lost wake did not announce).
type Waker interface {
	Wake(ctx context.Context, wakes []Wake) error
}

// FillReport is what one FillHosts did.
type FillReport struct {
	// Started are the runs a host took, in the order started.
	Started []string `json:"started,omitempty"`
	// Offered counts host start calls made (Started plus refusals).
	Offered int `json:"offered"`
	// Resumed counts offers a dead dispatcher had left unfinished.
	Resumed int `json:"resumed,omitempty"`
}

// ClassOf is a run's routing class: its agent and the labels it asks for,
// as one string that names the class in the queue, the capacity figures
// and the metrics' RoutingClass dimension: the agent, then "?" and the
// labels as a sorted, escaped query ("claude?gpu=a100&pool=build"); the
// agent alone without labels. It never holds "#" (the store's separator).
func ClassOf(agent string, labels map[string]string) string {
	if len(labels) == 0 {
		return url.PathEscape(agent)
	}
	v := url.Values{}
	for k, val := range labels {
		v.Set(k, val)
	}
	return url.PathEscape(agent) + "?" + v.Encode()
}

// ParseClass is ClassOf's inverse.
func ParseClass(class string) (agent string, labels map[string]string, err error) {
	a, q, _ := cutQuery(class)
	if agent, err = url.PathUnescape(a); err != nil {
		return "", nil, err
	}
	if q == "" {
		return agent, nil, nil
	}
	v, err := url.ParseQuery(q)
	if err != nil {
		return "", nil, err
	}
	labels = make(map[string]string, len(v))
	for k, vals := range v {
		labels[k] = vals[0]
	}
	return agent, labels, nil
}

func cutQuery(s string) (before, after string, found bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '?' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// maxQueuedRequestBytes bounds what a waiting run keeps of its request
// (QueueInfo.Request, its JSON): the run is one DynamoDB item, at most
// 400 KB with everything else it holds (dynamostore deflates it, which
// never makes it larger than this by more than a few bytes).
const maxQueuedRequestBytes = 300 << 10

// queueWait decides whether dispatch r of caller c waits when no host can
// take it now, and how: nil when it does not (no queue asked for and no
// Config.QueueDefault, or "0s"); else the run's QueueInfo without its
// times, the request it keeps encoded. A queue that cannot be honoured is
// a 400 naming the field. Fleet's default never makes a run wait that
// could not (one naming its host, whose repository URL carries
// credentials, or whose class is too long to index): such a dispatch
// answers as it always did.
func (f *Fleet) queueWait(c store.Caller, r DispatchRequest) (*store.QueueInfo, error) {
	q := r.Queue
	class := ClassOf(r.Run.Agent, r.Labels)
	if q == nil {
		if f.cfg.QueueDefault <= 0 || r.Host != "" || shownRepository(r.Run.Repository) != r.Run.Repository ||
			len(class) > store.QueueClassMaxBytes {
			return nil, nil
		}
		q = &QueueRequest{Timeout: f.cfg.QueueDefault}
	}
	maxWait := f.cfg.QueueMaxTimeout
	switch {
	case q.Timeout < 0:
		return nil, invalid(`queue.timeout: %s is negative: want a duration such as "30m", or "0s" not to wait`, q.Timeout)
	case q.Timeout > maxWait:
		return nil, invalid("queue.timeout: %s is over Fleet's longest wait, %s (RUNFLEET_QUEUE_MAX_TIMEOUT)", q.Timeout, maxWait)
	case q.Priority < store.QueuePriorityMin || q.Priority > store.QueuePriorityMax:
		return nil, invalid("queue.priority: %d is out of range: want %d to %d (higher starts first)", q.Priority, store.QueuePriorityMin, store.QueuePriorityMax)
	case q.Timeout == 0:
		return nil, nil
	case r.Host != "":
		return nil, invalid("queue: a run that names its host does not wait: leave out host to let routing choose, or leave out queue")
	case shownRepository(r.Run.Repository) != r.Run.Repository:
		return nil, invalid("queue: repository is a URL with credentials, which Fleet never stores, and a run that waits is kept " +
			"in Fleet's store until it starts: name a repository the repository map (RUNFLEET_REPO_URLS) clones, or leave out queue")
	case len(class) > store.QueueClassMaxBytes:
		return nil, invalid("queue: the agent and labels name the run's routing class, %d bytes escaped, and a run that waits is "+
			"indexed by it, at most %d: shorten the labels' values, or leave out queue", len(class), store.QueueClassMaxBytes)
	}
	req := encodeQueued(c, r)
	if len(req) > maxQueuedRequestBytes {
		return nil, invalid("queue: the run request is %d bytes as JSON, and a run that waits keeps it in Fleet's store, at most %d: "+
			"shorten its prompt, argv or env, or leave out queue", len(req), maxQueuedRequestBytes)
	}
	return &store.QueueInfo{Class: class, Priority: q.Priority, Timeout: q.Timeout, Request: req, Hosts: queueHosts(c)}, nil
}

// queueHosts is QueueInfo.Hosts for a run c dispatches: c's host scope,
// sorted, when it is not every host and the index can hold it; nil
// otherwise (the dispatcher reads the run to learn it may not take it:
// the scope kept with the request is what it honours either way).
func queueHosts(c store.Caller) []string {
	ids := c.AllowedHosts.IDs
	if c.Admin || c.AllowedHosts.All || len(ids) == 0 || len(ids) > store.QueueHostsMax {
		return nil
	}
	for _, id := range ids {
		if id == "" || strings.Contains(id, ",") {
			return nil
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(ids)))
}

// queuedRequestVersion is the version of queuedRequest's stored form.
const queuedRequestVersion = 1

// queuedRequest is the stored form of a waiting run's dispatch
// (QueueInfo.Request, its JSON): the request it is started with, and the host scope of the caller that dispatched it, which the
// dispatcher, acting for no caller, honours when it offers the run (a
// caller re-minted with a smaller scope meanwhile does not narrow it).
type queuedRequest struct {
	V        int               `json:"v"`
	Labels   map[string]string `json:"labels,omitempty"`
	Run      runspec.Request   `json:"run"`
	Admin    bool              `json:"admin,omitempty"`
	AllHosts bool              `json:"allHosts,omitempty"`
	Hosts    []string          `json:"hosts,omitempty"`
}

// waitingRequest is a waiting run's dispatch as the dispatcher offers it.
type waitingRequest struct {
	req   DispatchRequest
	admin bool
	hosts store.Scope
}

// allows reports whether the run's caller may use the host.
func (w waitingRequest) allows(hostID string) bool { return w.admin || w.hosts.Allows(hostID) }

func encodeQueued(c store.Caller, r DispatchRequest) []byte {
	raw, err := json.Marshal(queuedRequest{V: queuedRequestVersion, Labels: r.Labels, Run: r.Run,
		Admin: c.Admin, AllHosts: c.AllowedHosts.All, Hosts: c.AllowedHosts.IDs})
	if err != nil {
		// Strings, slices and maps of strings always marshal.
		panic(fmt.Sprintf("fleet: marshaling a queued request: %v", err))
	}
	return raw
}

func decodeQueued(b []byte) (waitingRequest, error) {
	var q queuedRequest
	if err := json.Unmarshal(b, &q); err != nil {
		return waitingRequest{}, fmt.Errorf("fleet: reading a queued request: %w", err)
	}
	if q.V != queuedRequestVersion {
		return waitingRequest{}, fmt.Errorf("fleet: a queued request of version %d; this Fleet reads %d", q.V, queuedRequestVersion)
	}
	return waitingRequest{req: DispatchRequest{Labels: q.Labels, Run: q.Run}, admin: q.Admin,
		hosts: store.Scope{All: q.AllHosts, IDs: q.Hosts}}, nil
}

// enqueue records dispatch r, which no host can take now (why: routing's
// refusal), as a run that waits: the idempotency item first, as for any
// run, then the run, queued, with q (queueWait's) counted from now.
func (f *Fleet) enqueue(ctx context.Context, c store.Caller, r DispatchRequest, key string, k *dispatchKey, q store.QueueInfo, why string) (DispatchResult, error) {
	if k.fleetRunID == "" {
		id, err := newRunID(f.cfg.Random)
		if err != nil {
			return DispatchResult{}, err
		}
		k.fleetRunID = id
	}
	now := f.clock.Now().UTC()
	if res, done, err := f.claimKey(ctx, k, now); done {
		return res, err
	}
	q.Since, q.Until = now, now.Add(q.Timeout)
	run := store.Run{
		FleetRunID:     k.fleetRunID,
		OwnerID:        c.OwnerID,
		Status:         store.StatusQueued,
		Agent:          r.Run.Agent,
		Repository:     shownRepository(r.Run.Repository),
		IdempotencyKey: key,
		CreatedAt:      now,
		UpdatedAt:      now,
		Queue:          &q,
	}
	if res, done, err := f.createDispatched(ctx, run, *k); done {
		return res, err
	}
	run.Version = 1
	f.rememberQueue(true) // the ends this instance records wake the run's hosts
	f.log.Info("dispatch: no eligible host can take the run now; it waits", logRun, run.FleetRunID, logOwner, c.OwnerID,
		logClass, q.Class, "priority", q.Priority, "until", q.Until, logReason, why)
	return DispatchResult{Run: run, Note: waitingNote(run)}, nil
}

// requeueDispatch puts a dispatch's run, stored dispatching on the last
// host it tried, back to queued because every host tried refused it with
// a transient reason: its wait (q, queueWait's) counts from its creation,
// and its next offer takes a fresh clientToken (the hosts keep their
// refusals under this one). The tokens minted for it are revoked. A run no
// longer dispatching there (recovery settled it) is answered as it is.
func (f *Fleet) requeueDispatch(ctx context.Context, run store.Run, q store.QueueInfo, repository string) (DispatchResult, error) {
	q.Since, q.Until = run.CreatedAt, run.CreatedAt.Add(q.Timeout)
	stored, queued, err := f.requeue(ctx, run, &q, repository)
	if err != nil {
		return DispatchResult{}, fmt.Errorf("fleet: putting %s in the queue: %w", run.FleetRunID, err)
	}
	if !queued {
		return DispatchResult{Run: stored}, nil
	}
	return DispatchResult{Run: stored, Note: waitingNote(stored)}, nil
}

// requeue puts run, stored dispatching on its host, which refused it with
// a transient reason, back to queued (backToQueue, a fresh token), with q
// as its wait when it had none (a dispatch's first attempt), and revokes
// the tokens it recorded (minted for that host, which did not take them;
// repository is the one they were minted for). The update is conditional
// on run's version, as moveTo's: queued is false when the run was written
// since (another dispatcher resumed the offer, recovery, a cancel).
func (f *Fleet) requeue(ctx context.Context, run store.Run, q *store.QueueInfo, repository string) (store.Run, bool, error) {
	ctx = context.WithoutCancel(ctx)
	queued := false
	var dropped []store.BrokeredKey
	stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
		queued = cur.Version == run.Version && cur.Status == store.StatusDispatching && cur.HostID == run.HostID &&
			(cur.Queue == nil || cur.Waiting())
		if !queued {
			return false
		}
		if cur.Queue == nil {
			cur.Queue = q
		}
		dropped = cur.Brokered
		f.backToQueue(cur, f.clock.Now().UTC(), true)
		return true
	})
	if err != nil || !queued {
		return stored, false, err
	}
	run.Repository = repository
	f.revokeKeys(ctx, run, dropped, "the run went back to the queue")
	f.log.Info("queue: every host offered the run refused it for now; back to the queue", logRun, run.FleetRunID,
		logHost, run.HostID, logClass, stored.Queue.Class, "offers", stored.Queue.Offers, logStatus, stored.Status)
	return stored, true, nil
}

// backToQueue puts r (dispatching, waiting) back to queued at its place
// (its Since and priority unchanged), on no host, its tokens dropped (the
// caller revokes them); refused: a host refused it under its clientToken
// and keeps that refusal, so the next offer takes a fresh one (Offers+1).
// A run whose wait is over ends queue_timeout instead.
func (f *Fleet) backToQueue(r *store.Run, now time.Time, refused bool) {
	q := *r.Queue
	if refused {
		q.Offers++
	}
	r.Queue = &q
	r.Brokered = nil
	if !now.Before(q.Until) {
		r.HostID = ""
		f.endQueueTimeout(r, now)
		return
	}
	r.Status = store.StatusQueued
	r.HostID = ""
	r.Deadline = time.Time{}
	r.RewroteLocalPath = false
	r.UpdatedAt = now
}

// endQueueTimeout ends r, which waited its whole timeout, failed with
// queue_timeout; it never started.
func (f *Fleet) endQueueTimeout(r *store.Run, now time.Time) {
	q := r.Queue
	f.end(r, store.StatusFailed, store.ReasonQueueTimeout,
		fmt.Sprintf("no eligible host had room within the run's queue timeout of %s (it waited from %s); nothing was started",
			q.Timeout, q.Since.UTC().Format(time.RFC3339)), now)
}

// expireQueued ends run, queued, with queue_timeout once its Until passed
// (a versioned write; a run no longer queued is returned as stored). The
// sweep, a GET and the dispatcher call it; a run being offered to a host
// is never ended so: its offer resolves first (recover).
func (f *Fleet) expireQueued(ctx context.Context, run store.Run) (store.Run, error) {
	ended := false
	stored, err := f.settle(context.WithoutCancel(ctx), run, func(cur *store.Run) bool {
		now := f.clock.Now().UTC()
		ended = cur.Status == store.StatusQueued && cur.Queue != nil && !now.Before(cur.Queue.Until)
		if ended {
			f.endQueueTimeout(cur, now)
		}
		return ended
	})
	if err != nil {
		return run, fmt.Errorf("fleet: ending %s at its queue timeout: %w", run.FleetRunID, err)
	}
	if ended {
		f.log.Info("queue: a waiting run's timeout passed; it ended", logRun, run.FleetRunID, logClass, stored.Queue.Class,
			logReason, store.ReasonQueueTimeout)
	}
	return stored, nil
}

// syncQueued is the sweep's sync of a queued run: no host has it, so
// there is nothing to ask; one whose Until passed ends queue_timeout.
// One within its timeout is current: the sweep counts the waiting runs
// from the queue index (timeOutQueue), not from their reads.
func (f *Fleet) syncQueued(ctx context.Context, run store.Run) (store.Run, syncResult) {
	if run.Queue == nil || f.clock.Now().Before(run.Queue.Until) {
		return run, syncResult{outcome: syncCurrent}
	}
	stored, err := f.expireQueued(ctx, run)
	switch {
	case err != nil:
		f.log.Warn("sync failed", logRun, run.FleetRunID, logDoing, "ending a queued run at its timeout", logErr, err.Error())
		return run, syncResult{outcome: syncFailed, err: err}
	case !stored.Live():
		return stored, syncResult{outcome: syncDrained}
	}
	return stored, syncResult{outcome: syncCurrent}
}

// waitingNote says where a waiting run stands; "" for another run.
func waitingNote(run store.Run) string {
	switch {
	case !run.Waiting():
		return ""
	case run.Status == store.StatusQueued:
		return fmt.Sprintf("no eligible host has room now: the run waits in the queue until %s and starts, once, as soon as one has",
			run.Queue.Until.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("Fleet is offering the run to host %s", run.HostID)
}

// queuePosition is a waiting run's place in its class's queue: 1 is next.
// The index is read eventually consistent, so the figure may lag a write
// by a moment; 0 when it cannot be read (logged) or the run does not wait.
func (f *Fleet) queuePosition(ctx context.Context, run store.Run) int {
	if !run.Waiting() {
		return 0
	}
	ahead, err := f.store.QueueAhead(ctx, run.Queue.Class, store.QueueOrder(*run.Queue, run.FleetRunID))
	if err != nil {
		f.log.Warn("queue: reading a run's position failed", logRun, run.FleetRunID, logClass, run.Queue.Class, logErr, err.Error())
		return 0
	}
	return ahead + 1
}

// cancelWaiting cancels a run that waits. Queued, it ends canceled at
// once: no host has it. Being offered to a host (dispatching), the host is
// asked by clientToken (recover): a run it has is canceled there as any
// run; otherwise the run ends canceled here, its tokens revoked, and a
// start the host takes after all is canceled there by the dispatcher's
// record of it (recordStartAnswer). The call outlives a caller that hangs
// up.
func (f *Fleet) cancelWaiting(ctx context.Context, run store.Run) (Interaction, error) {
	ctx = context.WithoutCancel(ctx)
	accepted := hostproto.Outcome{Accepted: hostproto.Accepted}
	for range 3 {
		switch {
		case run.Status == store.StatusQueued:
			ended := false
			stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
				ended = cur.Status == store.StatusQueued
				if ended {
					now := f.clock.Now().UTC()
					f.end(cur, store.StatusCanceled, hostproto.ReasonCanceled,
						fmt.Sprintf("canceled while queued, after waiting %s; it never started", now.Sub(cur.Queue.Since).Round(time.Second)), now)
				}
				return ended
			})
			if err != nil {
				return Interaction{}, fmt.Errorf("fleet: cancel: ending queued run %s: %w", run.FleetRunID, err)
			}
			if ended {
				f.log.Info("queue: a waiting run was canceled", logRun, run.FleetRunID, logClass, stored.Queue.Class)
				return Interaction{Outcome: accepted, Run: stored}, nil
			}
			run = stored
		case run.Waiting():
			rec, err := f.recover(ctx, run)
			if err != nil {
				f.log.Warn("cancel: the host a waiting run is offered to could not be asked", logRun, run.FleetRunID, logHost, run.HostID, logErr, err.Error())
				rec = run
			}
			if rec.Status != store.StatusDispatching {
				run = rec // the host has it, or it went back to the queue
				continue
			}
			ended := false
			stored, err := f.settle(ctx, rec, func(cur *store.Run) bool {
				ended = cur.Status == store.StatusDispatching && cur.Waiting() && cur.HostID == rec.HostID
				if ended {
					f.end(cur, store.StatusCanceled, hostproto.ReasonCanceled,
						fmt.Sprintf("canceled while Fleet was offering it to host %s; it never started (a start the host takes after all is canceled there)", cur.HostID),
						f.clock.Now().UTC())
				}
				return ended
			})
			if err != nil {
				return Interaction{}, fmt.Errorf("fleet: cancel: ending waiting run %s: %w", run.FleetRunID, err)
			}
			if ended {
				f.log.Info("queue: a waiting run was canceled while offered", logRun, run.FleetRunID, logHost, rec.HostID)
				// The offer's tokens: a start the host takes after all is
				// canceled there.
				stored, _ = f.revokeEnded(ctx, stored)
				return Interaction{Outcome: accepted, Run: stored}, nil
			}
			run = stored
		default:
			return f.interactWith(ctx, run, "cancel", cancelCall)
		}
	}
	return Interaction{}, conflict(CodeInFlight, map[string]string{"fleetRunId": run.FleetRunID},
		"run %s changed state while it was being canceled; cancel it again", run.FleetRunID)
}

// canceledWhileOffered reports whether cur, stored, is a waiting run that
// cancelWaiting ended while it was offered to hostID: the host may yet
// take the start.
func canceledWhileOffered(cur store.Run, hostID string) bool {
	return cur.Status == store.StatusCanceled && cur.Reason == hostproto.ReasonCanceled && cur.ChildRunID == "" &&
		cur.HostID == hostID && cur.Queue != nil && cur.Queue.StartedAt == nil
}

// cancelStarted cancels on its host the run a start created (answer) for
// run, which was canceled while it was offered, and records the host's
// run on it, live again until its events are mirrored (the sweep drains
// it then), so its events say what happened there.
func (f *Fleet) cancelStarted(ctx context.Context, client *hostproto.Client, run store.Run, answer hostproto.Run) store.Run {
	callCtx, cancel := context.WithTimeout(ctx, f.cfg.HostTimeout)
	hr, err := client.Cancel(callCtx, answer.RunID)
	cancel()
	detail := fmt.Sprintf("canceled while Fleet was offering it to host %s, which took the start: Fleet canceled it there", run.HostID)
	if err != nil {
		hr = answer
		detail = fmt.Sprintf("canceled while Fleet was offering it to host %s, which took the start; canceling it there failed, so it may run there to its end", run.HostID)
		f.log.Warn("queue: canceling on its host a run canceled while offered failed", logRun, run.FleetRunID, logHost, run.HostID,
			logChildRun, answer.RunID, logErr, err.Error())
	}
	stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
		if !canceledWhileOffered(*cur, run.HostID) {
			return false
		}
		cur.ChildRunID, cur.Attempt = hr.RunID, hr.Attempt
		cur.Detail = boundDetail(detail)
		cur.Drained = false
		return true
	})
	if err != nil {
		f.log.Error("queue: recording the host's run of a canceled waiting run failed", logRun, run.FleetRunID, logHost, run.HostID,
			logChildRun, answer.RunID, logErr, err.Error())
		return run
	}
	return stored
}

// revokeKeys revokes the tokens among keys, recorded on run (before a
// write dropped them) for a start no host took; a failure is logged, and
// the token expires by itself.
func (f *Fleet) revokeKeys(ctx context.Context, run store.Run, keys []store.BrokeredKey, why string) {
	if f.cfg.Broker == nil {
		return
	}
	for _, i := range revocable(keys, f.clock.Now()) {
		k := keys[i]
		if err := f.revoke(ctx, runKeyRequest(run, k), k.Sealed); err != nil {
			f.log.Warn("credentials: revoking an unused token failed; it expires by itself", logRun, run.FleetRunID,
				logKey, k.ProjectID+"/"+k.Key, logKind, k.Kind, logReason, why, logErr, err.Error())
		}
	}
}

// wakeOnEnd wakes the host of a run that prev -> cur ended there: its end
// frees a slot. Not for a run that never reached a host (no host run id),
// nor for a host that refused it for want of room (it has none to offer),
// nor when nothing waits (somethingWaits): most runs end with an empty
// queue, and a wake then costs an SQS message, a dispatcher invocation
// and its read of the queue for nothing.
func (f *Fleet) wakeOnEnd(ctx context.Context, prev, cur store.Run) {
	if f.cfg.Waker == nil || store.Terminal(prev.Status) || !store.Terminal(cur.Status) || cur.HostID == "" || cur.ChildRunID == "" {
		return
	}
	if cur.ExitCode == nil && slices.Contains(transientReasons, cur.Reason) {
		return
	}
	if !f.somethingWaits(ctx) {
		return
	}
	f.wake(ctx, Wake{HostID: cur.HostID, Slots: 1, Reason: WakeRunEnded})
}

// queueMemoryFor is how long a Fleet instance trusts what it last read of
// whether any run waits (queueMemory): a sweep pass, or a burst of GETs,
// that records many ends pays one read of the queue, not one per end.
const queueMemoryFor = 5 * time.Second

// queueMemory is whether any run waited when this Fleet instance last read
// the queue's classes (every read of them refreshes it: the sweep's, a
// fill's, a probe's), or queued a run itself, trusted until until on the
// injected clock. Remembered "nothing waits" may be wrong for a moment
// when another instance (the API's function, the sweep's) queued a run
// since: that run's host is then not woken by this end, and the next
// probe pass, within a minute, wakes every routable host with free slots
// that serves a class with waiting runs. This instance's own queuing
// forgets it at once. Remembered "something waits" costs at worst a wake
// that finds nothing to fill.
type queueMemory struct {
	mu    sync.Mutex
	until time.Time
	waits bool
}

// rememberQueue records whether any run waits, as just read or written.
func (f *Fleet) rememberQueue(waits bool) {
	f.queued.mu.Lock()
	defer f.queued.mu.Unlock()
	f.queued.until, f.queued.waits = f.clock.Now().Add(queueMemoryFor), waits
}

// queueClasses reads the classes with waiting runs (store.QueueClasses)
// and remembers whether there are any.
func (f *Fleet) queueClasses(ctx context.Context) ([]string, error) {
	classes, err := f.store.QueueClasses(ctx)
	if err == nil {
		f.rememberQueue(len(classes) > 0)
	}
	return classes, err
}

// queueHeads reads the classes with waiting runs and each one's head
// (store.QueueHeads) and remembers whether there are any.
func (f *Fleet) queueHeads(ctx context.Context) ([]store.QueueHead, error) {
	heads, err := f.store.QueueHeads(ctx)
	if err == nil {
		f.rememberQueue(len(heads) > 0)
	}
	return heads, err
}

// somethingWaits reports whether any run waits, as remembered (queueMemory)
// or else read: QueueClasses' first query answers it when nothing does
// (0.5 RCU), which is the case to make cheap. A failed read says yes: the
// wake is sent and the fill decides.
func (f *Fleet) somethingWaits(ctx context.Context) bool {
	f.queued.mu.Lock()
	known, waits := f.clock.Now().Before(f.queued.until), f.queued.waits
	f.queued.mu.Unlock()
	if known {
		return waits
	}
	classes, err := f.queueClasses(ctx)
	if err != nil {
		f.log.Warn("wake: reading whether any run waits failed; waking the host anyway", logErr, err.Error())
		return true
	}
	return len(classes) > 0
}

// wake sends wakes through Config.Waker (none when nil). A failure is
// logged, never returned: the next probe pass wakes a host with room that
// a lost wake did not announce.
func (f *Fleet) wake(ctx context.Context, wakes ...Wake) {
	if f.cfg.Waker == nil || len(wakes) == 0 {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.HostTimeout)
	defer cancel()
	if err := f.cfg.Waker.Wake(wctx, wakes); err != nil {
		for _, w := range wakes {
			f.log.Warn("wake: sending failed; the next probe pass finds the room", logHost, w.HostID, logReason, w.Reason, logErr, err.Error())
		}
	}
}

// freeSlots is how many runs h may take as its last probe saw it: at
// least 1 (a probe is up to a refresh old), 1 when it did not say.
func freeSlots(h store.Host) int {
	if p := h.Probe; p != nil && p.Load != nil && p.Load.MaxConcurrent > 0 {
		return max(p.Load.MaxConcurrent-p.Load.Active, 1)
	}
	return 1
}
