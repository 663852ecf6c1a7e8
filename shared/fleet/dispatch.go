package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
)

// DispatchRequest is a run to route and start: POST /fleet/runs without the
// idempotency key. Empty fields are absent.
type DispatchRequest struct {
	// Host names the host; empty lets routing choose.
	Host string
	// Labels must all be present, with equal values, on the host.
	Labels map[string]string
	// Run is what the run asks, as every side checks it (runspec); Fleet
	// sets its Deadline and CloneURL, and a caller's are refused.
	Run runspec.Request
	// Queue asks the run to wait for capacity rather than be refused
	// (queue.go); nil: Config.QueueDefault applies.
	Queue *QueueRequest
}

// canonicalRequest is the hashed form of a DispatchRequest. Its field set,
// names and order are a contract with stored idempotency items: changing
// them makes a retried request look like another payload (409) for up to
// 24 h. It is mapped from the request here and nowhere else, so a change to
// the run request is never a change of the hash.
type canonicalRequest struct {
	Host       string            `json:"host,omitempty"`
	Agent      string            `json:"agent"`
	Prompt     string            `json:"prompt,omitempty"`
	Argv       []string          `json:"argv,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Repository string            `json:"repository,omitempty"`
	LocalPath  string            `json:"localPath,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Secrets    []canonicalSecret `json:"secrets,omitempty"`
	// Queue is last and absent unless the request asks to wait, so a
	// request that does not hashes as it did before runs could wait.
	Queue *canonicalQueue `json:"queue,omitempty"`
}

// canonicalQueue is a dispatch's ask to wait in the hashed form: the
// timeout as time.Duration prints it ("30m" and "1800s" are one request).
type canonicalQueue struct {
	Timeout  string `json:"timeout"`
	Priority int    `json:"priority,omitempty"`
}

// canonicalSecret is a declared secret in the hashed form.
type canonicalSecret struct {
	ProjectID string   `json:"projectId"`
	Key       string   `json:"key"`
	Domains   []string `json:"domains"`
}

// Hash is the request's identity for idempotency: "v1:" and the hex SHA-256
// of its canonical JSON (fields in a fixed order, map keys sorted, absent and
// empty alike). It is taken before routing, so the same request hashes the
// same whichever host it lands on.
func (r DispatchRequest) Hash() string {
	sum := sha256.Sum256(r.canonicalJSON())
	return "v1:" + hex.EncodeToString(sum[:])
}

func (r DispatchRequest) canonicalJSON() []byte {
	run := r.Run
	c := canonicalRequest{
		Host: r.Host, Agent: run.Agent, Prompt: run.Prompt, Argv: run.Argv, Labels: r.Labels,
		Repository: run.Repository, LocalPath: run.LocalPath, Env: run.Env,
	}
	for _, s := range run.Secrets {
		c.Secrets = append(c.Secrets, canonicalSecret{ProjectID: s.ProjectID, Key: s.Key, Domains: s.Domains})
	}
	if q := r.Queue; q != nil {
		c.Queue = &canonicalQueue{Timeout: q.Timeout.String(), Priority: q.Priority}
	}
	b, err := json.Marshal(c)
	if err != nil {
		// Strings, slices and maps of strings always marshal.
		panic(fmt.Sprintf("fleet: marshaling a canonical request: %v", err))
	}
	return b
}

// CheckDispatch validates r for caller c: 400 (*Error KindInvalid) for a
// malformed field, the run request's by its own rules (runspec, the same
// that every host applies), 403 (KindForbidden) for a project outside c's
// allowedProjects.
func CheckDispatch(c store.Caller, r DispatchRequest) error {
	if r.Host != "" {
		if err := checkID("host", r.Host); err != nil {
			return err
		}
	}
	switch {
	case r.Run.Deadline != nil:
		return invalid("deadline is Fleet's to set: the end of its call to the host")
	case r.Run.CloneURL != "":
		return invalid("cloneUrl is Fleet's to set, from its repository map")
	}
	if err := r.Run.Validate(); err != nil {
		var fe *runspec.FieldError
		if errors.As(err, &fe) {
			return invalid("%s", fe.Error())
		}
		return err
	}
	if err := checkLabels(r.Labels); err != nil {
		return err
	}
	for i, s := range r.Run.Secrets {
		if !auth.CanUseProject(c, s.ProjectID) {
			return forbidden("secrets[%d]: project %q is not in this caller's allowedProjects", i, s.ProjectID)
		}
	}
	return nil
}

// shownRepository is a run request's repository as the run records it, to
// show in listings: as given, except that a URL's credentials are replaced
// with "xxxxx" (a password, or an http(s) user alone, which is how a token
// rides in a clone URL), so a token a caller put in a repository URL is
// never stored with the run nor shown to an admin. The host gets the
// request's repository unchanged.
func shownRepository(repo string) string {
	u, err := url.Parse(repo)
	if err != nil || u.User == nil {
		return repo
	}
	if _, set := u.User.Password(); set {
		return u.Redacted()
	}
	if u.Scheme == "http" || u.Scheme == "https" {
		u.User = url.User("xxxxx")
		return u.String()
	}
	return repo
}

// CheckIdempotencyKey validates a caller's key: 1-255 printable ASCII
// characters without spaces.
func CheckIdempotencyKey(key string) error {
	if key == "" || len(key) > 255 {
		return invalid("idempotency key: want 1-255 characters")
	}
	for _, r := range key {
		if r < 0x21 || r > 0x7e {
			return invalid("idempotency key: want printable ASCII without spaces")
		}
	}
	return nil
}

// DispatchResult is a dispatch's outcome.
type DispatchResult struct {
	// Run is the run as stored after the dispatch (or the first one, reused).
	Run store.Run
	// Reused: the idempotency key had already created Run.
	Reused bool
	// Note explains a run that is not plainly started (still dispatching,
	// refused by the host).
	Note string
	// Refused: this dispatch's host call ended the run without starting
	// it (the host refused it, or could not be reached); Run's Reason and
	// Detail say why. Never set on a reused answer, which shows the run as
	// it stands.
	Refused bool
	// Excluded are the hosts this dispatch tried that refused it with a
	// transient reason, in the order tried, each with its reason and what
	// it said: the dispatch went on to the next host, or, when the last of
	// them refused, the run ended with that refusal. Empty otherwise.
	Excluded []Exclusion
	// Position is the run's place in its class's queue (1 is next) while
	// it waits (Run.Waiting); 0 otherwise.
	Position int
}

// MaxDispatchHosts bounds the hosts one dispatch tries: each try is a host
// call of up to HostTimeout, and the whole dispatch answers within one API
// request. Hosts whose probe showed them full come last (preferLoad), so
// the bound is reached only when most of the fleet is busy.
const MaxDispatchHosts = 4

// fallbackMargin is the time a dispatch keeps beyond one host call before
// it tries another host: the writes that record the answer, and the
// answer itself, inside the caller's deadline.
const fallbackMargin = 2 * time.Second

// transientReasons are the refusals that say a host cannot take a run now,
// not that the run is wrong: routing goes on to the next candidate.
var transientReasons = []string{hostproto.ReasonHostBusy, hostproto.ReasonHostStorageLow, hostproto.ReasonHostUnavailable, hostproto.CodeDraining}

// Dispatch routes r and starts it on the chosen host, idempotently per
// (caller, key) when key is not empty. In order, with no transaction: the
// request hash; the idempotency item if the key has one (same hash: the
// first run, reused; another hash: 409); routing; a value for each
// brokered key (brokered.go: one that cannot be minted refuses the
// dispatch, 409 credential_unavailable, before anything is written); a
// conditional put of the idempotency item; a conditional put of the run in dispatching with its
// deadline; the host call with the run id as clientToken and the deadline;
// one update recording the answer. Of concurrent duplicates exactly one
// passes the conditional puts and calls the host; the others answer the
// first run, or 409 while it is dispatching before its deadline, and
// revoke the tokens they minted, as a dispatch the host refused does.
//
// When routing chose the host (r.Host empty) and it refuses with a
// transient reason (busy, storage low, unavailable or draining, or it
// could not be reached, so nothing started there), the run, still
// dispatching, is moved to the next host routing gives without the ones
// that refused, with a fresh deadline, by a versioned update, and started
// there under the same clientToken: at most MaxDispatchHosts hosts, while
// the caller's deadline leaves room for another call. The run is on one
// host at a time in the store, so recovery and a retried request always
// ask the host that may have it; an answer whose outcome is unknown (a
// timeout) is never moved past.
//
// A dispatch that asks to wait (r.Queue, else Config.QueueDefault; see
// queue.go) and finds no host that takes it now, because routing found
// none or every host tried refused with a transient reason, is recorded
// queued instead of refused: created so, or (when hosts refused it) put
// back to queued from dispatching, its tokens revoked. A dispatch that
// does not ask to wait answers as above.
func (f *Fleet) Dispatch(ctx context.Context, c store.Caller, r DispatchRequest, key string) (DispatchResult, error) {
	res, err := f.dispatch(ctx, c, r, key)
	if err == nil && res.Run.Waiting() {
		res.Position = f.queuePosition(ctx, res.Run)
	}
	return res, err
}

func (f *Fleet) dispatch(ctx context.Context, c store.Caller, r DispatchRequest, key string) (DispatchResult, error) {
	if err := CheckDispatch(c, r); err != nil {
		return DispatchResult{}, err
	}
	wait, err := f.queueWait(c, r)
	if err != nil {
		return DispatchResult{}, err
	}
	k := dispatchKey{hash: r.Hash()}
	if key != "" {
		if err := CheckIdempotencyKey(key); err != nil {
			return DispatchResult{}, err
		}
		k.item = c.OwnerID + "#" + key
		if res, done, err := f.lookUpKey(ctx, &k); done {
			return res, err
		}
	}

	decision, err := f.routeExcept(ctx, c, r, nil, wait != nil)
	if err != nil {
		var fe *Error
		if wait != nil && errors.As(err, &fe) && fe.Code == CodeNoEligibleHost {
			return f.enqueue(ctx, c, r, key, &k, *wait, fe.Message)
		}
		return DispatchResult{}, err
	}
	host := *decision.Host
	client, err := f.HostClient(ctx, host, 0)
	if err != nil {
		return DispatchResult{}, err
	}

	if k.fleetRunID == "" {
		if k.fleetRunID, err = newRunID(f.cfg.Random); err != nil {
			return DispatchResult{}, err
		}
	}
	// Minted before anything is written: a refusal leaves no run and no
	// idempotency item, and a retried request mints again.
	minted, err := f.mintForDispatch(ctx, k.fleetRunID, r)
	if err != nil {
		return DispatchResult{}, err
	}
	now := f.clock.Now().UTC()
	mintedFor := k.fleetRunID
	if res, done, err := f.claimKey(ctx, &k, now); done {
		f.revokeMinted(ctx, mintedFor, r.Run.Repository, minted, "an earlier dispatch with this idempotency key answered")
		return res, err
	}
	if k.fleetRunID != mintedFor && len(minted) > 0 {
		// The key's item names a run never written, which this dispatch
		// takes over: a run's tokens are sealed bound to its id.
		f.revokeMinted(ctx, mintedFor, r.Run.Repository, minted, "the dispatch took over another run id")
		if minted, err = f.mintForDispatch(ctx, k.fleetRunID, r); err != nil {
			return DispatchResult{}, err
		}
		now = f.clock.Now().UTC()
	}
	run := store.Run{
		FleetRunID:       k.fleetRunID,
		OwnerID:          c.OwnerID,
		HostID:           host.ID,
		Status:           store.StatusDispatching,
		Agent:            r.Run.Agent,
		Repository:       shownRepository(r.Run.Repository),
		IdempotencyKey:   key,
		RewroteLocalPath: decision.RewroteLocalPath,
		CreatedAt:        now,
		UpdatedAt:        now,
		Deadline:         now.Add(f.cfg.HostTimeout),
		Brokered:         brokeredKeysOf(minted),
	}
	if res, done, err := f.createDispatched(ctx, run, k); done {
		f.revokeMinted(ctx, k.fleetRunID, r.Run.Repository, minted, "an earlier dispatch with this idempotency key answered")
		return res, err
	}
	run.Version = 1
	credentials := brokeredValues(minted)
	var refusals []Exclusion
	for {
		answer, callErr := f.callStart(ctx, client, startRequest(run, r, decision, credentials))
		refusal, transient := transientRefusal(run.HostID, answer, callErr)
		if transient && r.Host == "" && len(refusals)+1 < MaxDispatchHosts && roomForAnotherHost(ctx, f.cfg.HostTimeout) {
			next, nextClient, moved, ok := f.moveToNextHost(ctx, c, r, run, append(refusals, refusal), wait != nil)
			if ok {
				refusals = append(refusals, refusal)
				run, decision, client = moved, next, nextClient
				continue
			}
		}
		if transient {
			refusals = append(refusals, refusal)
		}
		var res DispatchResult
		if transient && wait != nil {
			res, err = f.requeueDispatch(ctx, run, *wait, r.Run.Repository)
		} else {
			res, err = f.recordStartAnswer(ctx, client, run, answer, callErr)
		}
		if err == nil && res.Refused {
			// Nothing started: the run's tokens have no use.
			res.Run, _ = f.revokeEnded(ctx, res.Run)
		}
		res.Excluded = refusals
		return res, err
	}
}

// transientRefusal reports whether a start's answer is a transient
// refusal by host, with the exclusion that records it: the host's refusal
// (at its door, or admission's terminal answer) with a reason in
// transientReasons, or the host could not be reached (never delivered).
func transientRefusal(host string, answer hostproto.Run, err error) (Exclusion, bool) {
	var he *hostproto.Error
	switch {
	case err == nil && hostproto.TerminalStatus(answer.Status) && answer.ExitCode == nil && slices.Contains(transientReasons, answer.Reason):
		return Exclusion{HostID: host, Reasons: []string{answer.Reason}, Detail: boundDetail(answer.Detail)}, true
	case errors.As(err, &he) && he.Refused() && slices.Contains(transientReasons, he.Code):
		return Exclusion{HostID: host, Reasons: []string{he.Code}, Detail: boundDetail(he.Message)}, true
	case errors.Is(err, hostproto.ErrUnreachable):
		return Exclusion{HostID: host, Reasons: []string{hostproto.ReasonHostUnavailable},
			Detail: "the host could not be reached; nothing was started there"}, true
	}
	return Exclusion{}, false
}

// roomForAnotherHost: the caller's deadline, if any, leaves time for one
// more host call and the writes around it.
func roomForAnotherHost(ctx context.Context, hostTimeout time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return !ok || time.Until(deadline) > hostTimeout+fallbackMargin
}

// moveToNextHost routes r again without the hosts that refused it (and,
// when the run may wait, without those whose probe showed them full) and,
// if one is eligible, moves run (dispatching) to it (moveTo). ok is false
// when no host is left, the host cannot be called, or the run could not
// be moved: the caller then records the refusal it has.
func (f *Fleet) moveToNextHost(ctx context.Context, c store.Caller, r DispatchRequest, run store.Run, refusals []Exclusion, waits bool) (Decision, *hostproto.Client, store.Run, bool) {
	refused := make(map[string]string, len(refusals))
	for _, e := range refusals {
		refused[e.HostID] = e.Reasons[0]
	}
	next, err := f.routeExcept(ctx, c, r, refused, waits)
	if err != nil {
		var fe *Error
		if !errors.As(err, &fe) {
			f.log.Warn("dispatch: routing past a refusal failed", logRun, run.FleetRunID, logErr, err.Error())
		}
		return Decision{}, nil, store.Run{}, false
	}
	client, err := f.HostClient(ctx, *next.Host, 0)
	if err != nil {
		f.log.Warn("dispatch: no client for the next host", logRun, run.FleetRunID, logHost, next.Host.ID, logErr, err.Error())
		return Decision{}, nil, store.Run{}, false
	}
	moved, ok := f.moveTo(ctx, run, next)
	if !ok {
		return Decision{}, nil, store.Run{}, false
	}
	f.log.Info("dispatch: host refused, trying the next", logRun, run.FleetRunID, logHost, next.Host.ID,
		"refusedBy", refusals[len(refusals)-1].HostID, "reason", refusals[len(refusals)-1].Reasons[0])
	return next, client, moved, true
}

// moveTo moves run, stored dispatching on a host that refused it, to
// next's host: its host, local path choice and a fresh deadline, by a
// versioned update, its clientToken unchanged (the refusing host keeps its
// refusal under it, and no other host has seen it). The update is
// conditional on run's version, with no retry: a run written since (a
// dispatcher resuming the offer, which may have started it on the host
// that refused this caller; recovery; a cancel) is no longer this
// caller's to move, and ok is false, as it is when the write failed
// (logged).
func (f *Fleet) moveTo(ctx context.Context, run store.Run, next Decision) (store.Run, bool) {
	moved := false
	stored, err := f.settle(context.WithoutCancel(ctx), run, func(cur *store.Run) bool {
		moved = cur.Version == run.Version && cur.Status == store.StatusDispatching && cur.HostID == run.HostID
		if !moved {
			return false
		}
		now := f.clock.Now().UTC()
		cur.HostID = next.Host.ID
		cur.RewroteLocalPath = next.RewroteLocalPath
		cur.Deadline = now.Add(f.cfg.HostTimeout)
		cur.UpdatedAt = now
		return true
	})
	if err != nil {
		f.log.Warn("dispatch: moving the run to the next host failed", logRun, run.FleetRunID, logHost, next.Host.ID, logErr, err.Error())
		return store.Run{}, false
	}
	return stored, moved
}

// dispatchKey is a dispatch's idempotency, as far as it is known.
type dispatchKey struct {
	// hash is the request's (DispatchRequest.Hash).
	hash string
	// item is the idempotency item's key, "ownerId#key"; empty without a
	// key.
	item string
	// fleetRunID is the run the dispatch goes under, once known.
	fleetRunID string
	// takeover: the item exists and names a run that was never written,
	// whose creator is long gone (reuse): this dispatch writes that run.
	takeover bool
}

// lookUpKey reads k's idempotency item, eventually consistent: a miss is
// caught by claimKey's conditional put, and a reused dispatch then costs
// no write. done: the dispatch is answered (the first run, or a 409).
func (f *Fleet) lookUpKey(ctx context.Context, k *dispatchKey) (res DispatchResult, done bool, err error) {
	it, err := f.store.GetIdempotency(store.EventualRead(ctx), k.item)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return DispatchResult{}, false, nil
	case err != nil:
		return DispatchResult{}, true, fmt.Errorf("fleet: reading idempotency key: %w", err)
	}
	res, id, err := f.reuse(ctx, it, k.hash, true)
	if id == "" {
		return res, true, err
	}
	k.fleetRunID, k.takeover = id, true
	return DispatchResult{}, false, nil
}

// claimKey writes k's idempotency item for k.fleetRunID, when there is a
// key and no item to take over. An item a duplicate wrote first (between
// lookUpKey's read and this write, or missed by that read) is answered as
// reuse says. done: the dispatch is answered.
func (f *Fleet) claimKey(ctx context.Context, k *dispatchKey, now time.Time) (res DispatchResult, done bool, err error) {
	if k.item == "" || k.takeover {
		return DispatchResult{}, false, nil
	}
	it := store.Idempotency{Key: k.item, FleetRunID: k.fleetRunID, RequestHash: k.hash, CreatedAt: now, ExpiresAt: now.Add(IdempotencyTTL)}
	existing, err := f.store.PutIdempotency(ctx, it)
	switch {
	case errors.Is(err, store.ErrExists):
		res, id, err := f.reuse(ctx, existing, k.hash, false)
		if id == "" {
			return res, true, err
		}
		k.fleetRunID = id
	case err != nil:
		return DispatchResult{}, true, fmt.Errorf("fleet: writing idempotency key: %w", err)
	}
	return DispatchResult{}, false, nil
}

// createDispatched writes run, dispatching (or queued: enqueue). When the run exists already,
// another dispatcher took over the same idempotency item first: the item
// is read again, strongly consistent now that the run exists, and
// answered as reuse says, or 409 in flight. done: the dispatch is
// answered.
func (f *Fleet) createDispatched(ctx context.Context, run store.Run, k dispatchKey) (res DispatchResult, done bool, err error) {
	err = f.store.CreateRun(ctx, run)
	switch {
	case err == nil:
		return DispatchResult{}, false, nil
	case !errors.Is(err, store.ErrExists) || k.item == "":
		return DispatchResult{}, true, fmt.Errorf("fleet: creating run: %w", err)
	}
	it, err := f.store.GetIdempotency(ctx, k.item)
	if err != nil {
		return DispatchResult{}, true, fmt.Errorf("fleet: re-reading idempotency key: %w", err)
	}
	res, id, err := f.reuse(ctx, it, k.hash, false)
	if id != "" {
		return DispatchResult{}, true, inFlight(id)
	}
	return res, true, err
}

// startRequest is the host's start of run: its clientToken (the run id,
// or a waiting run's token for this offer), its deadline, r as routing
// decided it (the local path when the host has it, else the clone URL the
// repository map gives), the values minted for its brokered keys and,
// for a run that waited, its wait (the host's first event of the run).
func startRequest(run store.Run, r DispatchRequest, d Decision, credentials []hostproto.BrokeredValue) hostproto.StartRequest {
	deadline := run.Deadline
	start := r.Run
	start.Deadline = &deadline
	start.LocalPath = d.LocalPath
	if d.LocalPath == "" {
		start.CloneURL = d.CloneURL
	}
	out := hostproto.StartRequest{ClientToken: run.ClientToken(), Credentials: credentials, Request: start}
	if q := run.Queue; run.Waiting() {
		// UpdatedAt is when the run was offered to this host (offer).
		out.Queued = &hostproto.Queued{Since: q.Since.UTC(), StartedAt: run.UpdatedAt.UTC(),
			WaitedMs: run.UpdatedAt.Sub(q.Since).Milliseconds(), HostID: run.HostID, Offers: q.Offers}
	}
	return out
}

// callStart calls a host with start. The host call outlives a caller that
// hangs up: abandoning it would only leave more for recovery. It is bounded
// by HostTimeout (the client's timeout too); the deadline the host checks
// is on the injected clock.
func (f *Fleet) callStart(ctx context.Context, client *hostproto.Client, start hostproto.StartRequest) (hostproto.Run, error) {
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.HostTimeout)
	defer cancel()
	return client.Start(callCtx, start)
}

// recordStartAnswer records a host's answer to a start (callStart's) on
// run, stored as dispatching; like the call, it outlives a caller that
// hangs up. A waiting run canceled while it was offered (cancelWaiting) is
// no longer dispatching: a run the host started for it (its answer, or,
// when the answer was lost, the run the host has under the clientToken)
// is canceled there through client, and recorded so that the sweep
// mirrors its events.
func (f *Fleet) recordStartAnswer(ctx context.Context, client *hostproto.Client, run store.Run, answer hostproto.Run, callErr error) (DispatchResult, error) {
	ctx = context.WithoutCancel(ctx)
	var outcome startAnswer
	canceled := false
	stored, err := f.settle(ctx, run, func(cur *store.Run) bool {
		canceled = false
		if cur.Status != store.StatusDispatching || cur.HostID != run.HostID {
			outcome = startAnswer{}
			// A run the host holds live (not refused) must not outlive the cancel.
			canceled = callErr == nil && answer.RunID != "" && !hostproto.TerminalStatus(answer.Status) && canceledWhileOffered(*cur, run.HostID)
			// Recovery recorded the host's answer first, a cancel ended the
			// run, or it moved on: a host's answer is recorded only on the
			// run offered to that host.
			return false
		}
		outcome = f.applyStartAnswer(cur, answer, callErr)
		return outcome.changed
	})
	if err != nil {
		return DispatchResult{}, fmt.Errorf("fleet: recording the host's answer for %s: %w", run.FleetRunID, err)
	}
	if callErr != nil {
		f.log.Warn("dispatch: host call failed", logRun, run.FleetRunID, logHost, run.HostID, logErr, callErr.Error())
	}
	if callErr != nil && startUnknown(callErr) && client != nil && run.Queue != nil {
		// Nothing was written: a cancel may have ended the run while it was
		// offered, and the host may hold a run for it all the same.
		if cur, err := f.store.GetRun(ctx, run.FleetRunID); err == nil && canceledWhileOffered(cur, run.HostID) {
			stored = cur
			hr, known, err := client.FindByClientToken(ctx, run.ClientToken())
			switch {
			case err != nil:
				f.log.Warn("queue: whether the host took the start of a run canceled while offered is unknown; it may run there to its end",
					logRun, run.FleetRunID, logHost, run.HostID, logErr, err.Error())
			case known && !hostproto.TerminalStatus(hr.Status):
				answer, canceled = hr, true
			}
		}
	}
	if canceled {
		stored = f.cancelStarted(ctx, client, stored, answer)
	}
	return DispatchResult{Run: stored, Note: outcome.note, Refused: outcome.refused}, nil
}

// startUnknown reports whether a start's call error leaves its outcome
// unknown: no answer, or a host fault, where the host may have taken it
// (applyStartAnswer's last case).
func startUnknown(err error) bool {
	var he *hostproto.Error
	return !(errors.As(err, &he) && he.Refused()) && !errors.Is(err, hostproto.ErrUnreachable)
}

// startAnswer is what a host's answer to a start made of the run.
type startAnswer struct {
	// note is for the caller; "" for a plain start.
	note string
	// changed: r was changed. An unknown outcome (no answer, a host fault)
	// leaves r dispatching for recovery to resolve by clientToken.
	changed bool
	// refused: the run ended without starting (the host refused it, at its
	// door or at admission, or could not be reached).
	refused bool
}

// applyStartAnswer records the host's answer to a start on r.
func (f *Fleet) applyStartAnswer(r *store.Run, answer hostproto.Run, err error) startAnswer {
	now := f.clock.Now().UTC()
	if err == nil {
		f.applyHostRun(r, answer, now)
		// A host answers a start once admission decided and starts the
		// process after: an answer that is already terminal, with no exit
		// code, is admission's refusal.
		return startAnswer{changed: true, refused: hostproto.TerminalStatus(answer.Status) && answer.ExitCode == nil}
	}
	var he *hostproto.Error
	switch {
	case errors.As(err, &he) && he.Refused():
		reason := he.Code
		if reason == "" {
			reason = "host_refused"
		}
		detail := he.Message
		if detail == "" {
			detail = fmt.Sprintf("the host answered HTTP %d", he.Status)
		}
		f.end(r, store.StatusFailed, reason, detail, now)
		return startAnswer{note: "the host refused the start", changed: true, refused: true}
	case errors.Is(err, hostproto.ErrUnreachable):
		// Never delivered: the host cannot have started it.
		f.end(r, store.StatusFailed, hostproto.ReasonHostUnavailable,
			fmt.Sprintf("host %s could not be reached; nothing was started: dispatch again, or to another host", r.HostID), now)
		return startAnswer{note: "the host was unreachable; nothing was started", changed: true, refused: true}
	}
	return startAnswer{note: "whether the host started the run is unknown (" + hostproto.OutcomeOf(err).Detail +
		"); the run stays dispatching until recovery asks the host by clientToken"}
}

// applyHostRun copies the host's view of a run onto r. A later attempt (a
// retry) starts over: no end, no expiry, its events still to mirror.
// A waiting run the host answers for has left the queue: it records when
// and where it started (QueueInfo.StartedAt, StartedOn) and drops the
// request it kept, unless the answer is admission's refusal (terminal
// without an exit code), which never started it.
func (f *Fleet) applyHostRun(r *store.Run, hr hostproto.Run, now time.Time) {
	if r.Waiting() && !(hostproto.TerminalStatus(hr.Status) && hr.ExitCode == nil) {
		q := *r.Queue
		started := now
		q.StartedAt, q.StartedOn, q.Request = &started, r.HostID, nil
		r.Queue = &q
	}
	if hr.Attempt > r.Attempt {
		r.EndedAt = nil
		r.ExpiresAt = time.Time{}
		r.Drained = false
	}
	r.ChildRunID = hr.RunID
	r.Status = hr.Status
	r.Attempt = hr.Attempt
	r.ExitCode = hr.ExitCode
	r.Reason = hr.Reason
	r.Detail = boundDetail(hr.Detail)
	r.UpdatedAt = now
	switch {
	case store.Terminal(r.Status) && r.EndedAt == nil:
		end := now
		r.EndedAt = &end
		r.ExpiresAt = now.Add(f.cfg.Retention)
	case !store.Terminal(r.Status):
		// Live again (a retry) or still live: no end, no expiry, events to mirror.
		r.EndedAt = nil
		r.ExpiresAt = time.Time{}
		r.Drained = false
	}
}

// end makes r terminal with no events left to mirror (the host never had it,
// or denies it), with its reason and the detail that explains it.
func (f *Fleet) end(r *store.Run, status, reason, detail string, now time.Time) {
	r.Status = status
	r.Reason = reason
	r.Detail = boundDetail(detail)
	r.UpdatedAt = now
	end := now
	r.EndedAt = &end
	r.ExpiresAt = now.Add(f.cfg.Retention)
	r.Drained = true
}

// reuse answers a request whose idempotency item exists. It returns the
// answer, or (when the item's run was never written and its creator is long
// gone) the item's run id for the caller to dispatch under. eventual allows
// an eventually consistent run read: a stale one is at worst a 409 "in
// flight" or the run's previous state.
func (f *Fleet) reuse(ctx context.Context, it store.Idempotency, hash string, eventual bool) (DispatchResult, string, error) {
	if it.RequestHash != hash {
		return DispatchResult{}, "", conflict(CodeIdempotencyMismatch, map[string]string{"fleetRunId": it.FleetRunID},
			"the idempotency key was already used with a different request (run %s)", it.FleetRunID)
	}
	readCtx := ctx
	if eventual {
		readCtx = store.EventualRead(ctx)
	}
	run, err := f.store.GetRun(readCtx, it.FleetRunID)
	if errors.Is(err, store.ErrNotFound) {
		// The first request wrote the key but not yet the run. After a host
		// timeout and the grace it has certainly died there: take over.
		if f.clock.Now().Before(it.CreatedAt.Add(f.cfg.HostTimeout + LostGrace)) {
			return DispatchResult{}, "", inFlight(it.FleetRunID)
		}
		return DispatchResult{}, it.FleetRunID, nil
	}
	if err != nil {
		return DispatchResult{}, "", fmt.Errorf("fleet: reading run %s: %w", it.FleetRunID, err)
	}
	// A run that waits is answered as it stands, whether queued or being
	// offered to a host: its dispatch is answered (202), and the
	// dispatcher, not this request, starts it.
	if run.Status == store.StatusDispatching && !run.Waiting() {
		if f.clock.Now().Before(run.Deadline) {
			return DispatchResult{}, "", inFlight(run.FleetRunID)
		}
		if recovered, rerr := f.recover(ctx, run); rerr == nil {
			run, _ = f.revokeEnded(ctx, recovered)
		} else {
			f.log.Warn("dispatch: recovery on reuse failed", logRun, run.FleetRunID, logErr, rerr.Error())
		}
	}
	res := DispatchResult{Run: run, Reused: true, Note: waitingNote(run)}
	if run.Status == store.StatusDispatching && !run.Waiting() {
		res.Note = "the host has not confirmed the start yet; recovery will ask it by clientToken"
	}
	return res, "", nil
}

func inFlight(fleetRunID string) *Error {
	return conflict(CodeInFlight, map[string]string{"fleetRunId": fleetRunID},
		"a dispatch with this idempotency key is still in flight (run %s); retry shortly", fleetRunID)
}

// routeExcept gathers the candidates c may use and runs Route over them,
// the hosts in refused (host -> reason) excluded for the reason they gave,
// and, for a dispatch that waits when no host takes it now (waits), the
// hosts whose last probe showed them full (RouteInput.QueueWhenFull): a
// named host is 404 when unknown and 403 when out of c's scope; a refusal
// is 409 with every excluded host and its reasons. Without a named host
// the candidates come from the routing view (routeByView); only before the
// probe has written one does it fall back to a scan of every host.
func (f *Fleet) routeExcept(ctx context.Context, c store.Caller, r DispatchRequest, refused map[string]string, waits bool) (Decision, error) {
	in := RouteInput{
		Refused:       refused,
		QueueWhenFull: waits,
		Agent:         r.Run.Agent,
		Labels:        r.Labels,
		Repository:    r.Run.Repository,
		LocalPath:     r.Run.LocalPath,
		NeedsSecrets:  len(r.Run.Secrets) > 0,
		RepoURLs:      f.cfg.RepoURLs,
		Now:           f.clock.Now(),
		MaxProbeAge:   f.cfg.ProbeMaxAge,
	}
	if r.Host != "" {
		h, err := f.Host(ctx, r.Host)
		if err != nil {
			return Decision{}, err
		}
		if !auth.CanUseHost(c, h.ID) {
			return Decision{}, forbidden("host %q is not in this caller's allowedHosts", h.ID)
		}
		in.Hosts = []store.Host{h}
		return refuseUnrouted(Route(in), Unrouted{})
	}
	d, part, found, err := f.routeByView(ctx, c, in)
	switch {
	case err != nil:
		return Decision{}, err
	case found:
		return refuseUnrouted(d, part)
	}
	if in.Hosts, err = f.Hosts(ctx, c); err != nil {
		return Decision{}, err
	}
	return refuseUnrouted(Route(in), Unrouted{})
}

// refuseUnrouted turns a decision without a host into the 409, its details
// u with the decision's exclusions.
func refuseUnrouted(d Decision, u Unrouted) (Decision, error) {
	if d.Host != nil {
		return d, nil
	}
	u.Excluded = d.Excluded
	return Decision{}, conflict(CodeNoEligibleHost, u, "%s", d.Reason)
}

// maxRouteRechecks bounds the strong re-reads of chosen hosts per dispatch.
const maxRouteRechecks = 3

// routeByView routes over the routing view: shard 0 of the agent's list
// (the "any" list when the agent has none), Route over its entries, and
// the next shard only while no entry is eligible (at most
// store.RouteShardsMax reads), routing over every entry read so far. The
// host chosen is then read strongly consistent (dispatch needs its address
// and credential anyway) and routed again with what it is now: gone, it
// drops out; disabled or draining since the view was written, it is
// excluded with its reasons and the next host is chosen, at most
// maxRouteRechecks times. found is false when the view has no list at all
// (the probe has not written one yet). For a fleet whose list fits one
// shard the decision is Route's over every host, as a scan would give it;
// past that, the refusal says how many hosts were considered of how many.
func (f *Fleet) routeByView(ctx context.Context, c store.Caller, in RouteInput) (d Decision, part Unrouted, found bool, err error) {
	list := RouteList(in.Agent)
	sh, err := f.store.RouteShard(ctx, list, 0)
	// An agent list older than a probe's life was left by a pass that lost
	// a race to write the index (no pass writes it any more: no host
	// offers the agent now); "any" is current.
	if errors.Is(err, store.ErrNotFound) || err == nil && in.Now.Sub(sh.At) > in.MaxProbeAge {
		list = RouteListAny
		sh, err = f.store.RouteShard(ctx, list, 0)
	}
	if errors.Is(err, store.ErrNotFound) {
		return Decision{}, Unrouted{}, false, nil
	}
	if err != nil {
		return Decision{}, Unrouted{}, false, fmt.Errorf("fleet: reading the routing view: %w", err)
	}
	seen := map[string]bool{}
	var last store.Host // the last host of the last shard read
	add := func(hosts []store.Host) {
		if len(hosts) > 0 {
			last = hosts[len(hosts)-1]
		}
		for _, h := range hosts {
			if !seen[h.ID] && auth.CanUseHost(c, h.ID) {
				in.Hosts = append(in.Hosts, h)
			}
			seen[h.ID] = true
		}
	}
	add(sh.Hosts)
	read, shards, total := 1, sh.Shards, sh.Total
	rechecked := map[string]bool{}
	for {
		d = Route(in)
		if d.Host == nil {
			if read < shards && read < store.RouteShardsMax && !(in.QueueWhenFull && restFull(list, last, sh.At, in.MaxProbeAge)) {
				next, err := f.store.RouteShard(ctx, list, read)
				read++
				switch {
				case errors.Is(err, store.ErrNotFound):
					// The list shrank since shard 0 was read: nothing more.
					shards = read - 1
				case err != nil:
					return Decision{}, Unrouted{}, true, fmt.Errorf("fleet: reading the routing view: %w", err)
				default:
					add(next.Hosts)
				}
				continue
			}
			if len(seen) < total {
				// A caller limited to some hosts learns nothing of the
				// others, their number included.
				if c.Admin || c.AllowedHosts.All {
					d.Reason += fmt.Sprintf("; %d of %d hosts considered (the routing view keeps those most likely to take agent %q)", len(seen), total, in.Agent)
					part = Unrouted{Considered: new(len(seen)), Hosts: new(total)}
				} else {
					d.Reason += fmt.Sprintf("; %d of your hosts considered (the routing view keeps those most likely to take agent %q)", len(in.Hosts), in.Agent)
					part = Unrouted{Considered: new(len(in.Hosts))}
				}
			}
			return d, part, true, nil
		}
		if rechecked[d.Host.ID] {
			return d, Unrouted{}, true, nil
		}
		if len(rechecked) == maxRouteRechecks {
			d.Host = nil
			d.Reason = fmt.Sprintf("no eligible host: the %d hosts chosen in turn had changed since the routing view was written; retry", maxRouteRechecks)
			return d, Unrouted{}, true, nil
		}
		rechecked[d.Host.ID] = true
		i := slices.IndexFunc(in.Hosts, func(h store.Host) bool { return h.ID == d.Host.ID })
		h, err := f.store.GetHost(ctx, d.Host.ID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			in.Hosts = slices.Delete(in.Hosts, i, i+1)
		case err != nil:
			return Decision{}, Unrouted{}, true, fmt.Errorf("fleet: reading host %q: %w", d.Host.ID, err)
		default:
			in.Hosts[i] = h
		}
	}
}

// restFull reports whether the hosts of list after last (its last host
// read) are all full or not routable, as the view was built at: the view
// orders the hosts routable for its agent by preferLoad, full ones last,
// then the others, so after a routable full host there is no host a
// dispatch that waits (QueueWhenFull) would be offered, and reading on
// would cost a shard for nothing.
func restFull(list string, last store.Host, at time.Time, maxProbeAge time.Duration) bool {
	if last.Probe == nil || loadTier(last.Probe.Load) != 2 {
		return false
	}
	agent := strings.TrimPrefix(list, RouteList(""))
	if list == RouteListAny {
		agent = ""
	}
	reasons, _ := exclusions(RouteInput{Agent: agent, Now: at, MaxProbeAge: maxProbeAge}, last, "")
	return len(reasons) == 0
}

// settle writes a change to a run with the store's version check: apply
// edits a copy of the latest run and reports whether there is anything to
// write; on a lost race the run is re-read and apply runs again. Every
// write of a run passes here, so this is where a run's end on a host is
// seen (wakeOnEnd), and a run's return to the queue (queueMemory). apply
// must not modify what r's pointers share with the run it was given
// (Queue, Brokered): it replaces them.
func (f *Fleet) settle(ctx context.Context, run store.Run, apply func(*store.Run) bool) (store.Run, error) {
	const attempts = 5
	for i := 0; ; i++ {
		next := run
		if !apply(&next) {
			return run, nil
		}
		stored, err := f.store.UpdateRun(ctx, next)
		if err == nil {
			if stored.Status == store.StatusQueued {
				f.rememberQueue(true) // back in the queue: ends wake its hosts
			}
			f.wakeOnEnd(ctx, run, stored)
			return stored, nil
		}
		if !errors.Is(err, store.ErrConflict) || i == attempts-1 {
			return run, err
		}
		if run, err = f.store.GetRun(ctx, run.FleetRunID); err != nil {
			return run, err
		}
	}
}

var runIDEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newRunID makes a Fleet run id: "fr-" and 128 random bits.
func newRunID(random io.Reader) (string, error) {
	var b [16]byte
	if _, err := io.ReadFull(random, b[:]); err != nil {
		return "", fmt.Errorf("fleet: making a run id: %w", err)
	}
	return "fr-" + runIDEncoding.EncodeToString(b[:]), nil
}
