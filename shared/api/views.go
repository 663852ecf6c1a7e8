package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
)

// The one place Fleet's records and results become the API's shapes
// (package fleetapi) and its request bodies become Fleet's inputs. Each
// conversion is explicit, field by field, so a stored or host-protocol
// field never leaks into an answer by accident, and a field of an answer
// is never something Fleet did not mean to show.

// toHostView shows admins how the host is reached (credentialRef, caPem);
// other callers see what routing uses.
func toHostView(h store.Host, admin bool) fleetapi.Host {
	v := fleetapi.Host{
		ID: h.ID, BaseURL: h.BaseURL, Labels: h.Labels, LocalPaths: h.LocalPaths,
		Enabled: h.Enabled, CreatedAt: h.CreatedAt,
	}
	if v.Labels == nil {
		v.Labels = map[string]string{}
	}
	if v.LocalPaths == nil {
		v.LocalPaths = []string{}
	}
	if admin {
		v.CredentialRef, v.CAPEM = h.CredentialRef, h.CAPEM
	}
	if h.Probe != nil {
		p := toProbeView(*h.Probe)
		v.Probe = &p
	}
	return v
}

func toHostViews(hosts []store.Host, admin bool) []fleetapi.Host {
	views := make([]fleetapi.Host, len(hosts))
	for i, x := range hosts {
		views[i] = toHostView(x, admin)
	}
	return views
}

// toProbeView is a probe as recorded: what the host reported of its
// features, CA, storage and limits.
func toProbeView(p store.Probe) fleetapi.Probe {
	v := fleetapi.Probe{
		Status: p.Status, At: p.At, LatencyMs: p.LatencyMs, Version: p.Version, Agents: p.Agents,
		Features: fleetapi.Features{SecretsProxy: p.Features.SecretsProxy, ExecRequire: p.Features.ExecRequire},
		Draining: p.Draining, Idle: p.Idle, Detail: p.Detail, LedgerKey: p.LedgerKey,
	}
	if v.Agents == nil {
		v.Agents = []string{}
	}
	if ca := p.CA; ca != nil {
		v.CA = &fleetapi.CAInfo{NotAfter: ca.NotAfter, SuccessorNotAfter: ca.SuccessorNotAfter}
	}
	if st := p.Storage; st != nil {
		v.Storage = &fleetapi.Storage{FreeBytes: st.FreeBytes, MinFreeBytes: st.MinFreeBytes, Low: st.Low}
	}
	if l := p.Limits; l != nil {
		v.Limits = &fleetapi.Limits{Enforced: l.Enforced, MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPU: l.CPU, Detail: l.Detail}
	}
	if l := p.Load; l != nil {
		v.Load = &fleetapi.Load{Active: l.Active, MaxConcurrent: l.MaxConcurrent}
	}
	return v
}

// toHostDrain is a drain or resume (verb), with its status
// (outcomeStatus): the host's state as it answered when it took the verb,
// else as last recorded. A refusal is also an error saying what Fleet
// recorded all the same: a drain, whatever the host said (an operator
// draining a host means Fleet to stop sending it work either way), and
// nothing for a resume.
func toHostDrain(verb string, d fleet.HostDrain) (int, any) {
	a := fleetapi.HostDrain{HostID: d.Host.ID, Outcome: toOutcome(d.Outcome), Host: toHostView(d.Host, true)}
	if p := d.Host.Probe; p != nil {
		a.Draining, a.Idle = p.Draining, p.Idle
	}
	if d.Outcome.Accepted == hostproto.Accepted {
		a.Draining, a.Idle = d.State.Draining, d.State.Idle
	}
	status := outcomeStatus(a.Accepted)
	if a.Accepted != fleetapi.Refused {
		return status, a
	}
	msg := refusalMessage(d.Host.ID, "the "+verb, a.Outcome)
	if a.Draining {
		msg += "; Fleet has recorded the host draining all the same: routing sends it nothing new"
	}
	return status, fleetapi.HostDrainRefused{Error: msg, HostDrain: a}
}

// toHostDeleting is a host delete's bounded step, when runs of the host
// remain; runsDeleted counts this step only (counting what is left would
// read every remaining run's key).
func toHostDeleting(id string, force bool, res store.HostDeletion) fleetapi.HostDeleting {
	return fleetapi.HostDeleting{
		ID: id, Deleting: true, Forced: force, RunsDeleted: res.RunsDeleted,
		Note: "runs of this host remain: repeat this DELETE to continue",
	}
}

func toHostDeleted(id string, force bool, res store.HostDeletion) fleetapi.HostDeleted {
	return fleetapi.HostDeleted{Removed: id, Forced: force, RunsDeleted: res.RunsDeleted}
}

// toHostSpec is a register body as Fleet takes it (checked by the handler).
func toHostSpec(b fleetapi.RegisterHost) fleet.HostSpec {
	return fleet.HostSpec{
		ID: b.ID, BaseURL: b.BaseURL, CredentialRef: b.CredentialRef, Labels: b.Labels, LocalPaths: b.LocalPaths,
		CAPEM: b.CAPEM, Enabled: b.Enabled,
	}
}

// toRunView is a run as listings and answers show it: with its wait, on
// a run that waited (toRunQueue), without a position (what a listing
// knows; GET and the dispatch answer add it).
func toRunView(r store.Run, l linker) fleetapi.Run {
	v := fleetapi.Run{
		FleetRunID: r.FleetRunID, OwnerID: r.OwnerID, HostID: r.HostID, ChildRunID: r.ChildRunID,
		Status: r.Status, Pending: r.Status == store.StatusDispatching, Attempt: r.Attempt,
		ExitCode: r.ExitCode, Reason: r.Reason, Detail: r.Detail, Agent: r.Agent, Repository: r.Repository,
		IdempotencyKey: r.IdempotencyKey, RewroteLocalPath: r.RewroteLocalPath, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, EndedAt: r.EndedAt,
		Links: l.run(r.FleetRunID), Queue: toRunQueue(r, 0, l.now),
	}
	if r.Status == store.StatusDispatching {
		d := r.Deadline
		v.Deadline = &d
	}
	return v
}

// toRunQueue is a run's wait (nil on a run that never asked to wait): its
// class, priority, since, timeout (as time.Duration prints it) and until;
// position while it waits (1 is next; 0, absent, when not known); once a
// host took it, when and which; waitedSeconds until it started, or ended
// without starting, or until now while it waits.
func toRunQueue(r store.Run, position int, now time.Time) *fleetapi.RunQueue {
	q := r.Queue
	if q == nil {
		return nil
	}
	v := &fleetapi.RunQueue{Class: q.Class, Priority: q.Priority, Since: q.Since, Timeout: q.Timeout.String(), Until: q.Until,
		StartedAt: q.StartedAt, StartedOn: q.StartedOn}
	end := now
	switch {
	case q.StartedAt != nil:
		end = *q.StartedAt
	case r.EndedAt != nil:
		end = *r.EndedAt
	case r.Waiting():
		v.Position = position
	}
	v.WaitedSeconds = int64(max(end.Sub(q.Since), 0) / time.Second)
	return v
}

func toRunPage(page store.RunPage, l linker) fleetapi.RunPage {
	views := make([]fleetapi.Run, len(page.Runs))
	for i, r := range page.Runs {
		views[i] = toRunView(r, l)
	}
	return fleetapi.RunPage{Runs: views, NextCursor: page.NextCursor, HasMore: page.NextCursor != ""}
}

// toRunAnswer is GET /fleet/runs/{id}: the run with its egress summary and
// its brokered keys.
func toRunAnswer(st fleet.RunState, l linker) fleetapi.RunAnswer {
	v := toRunView(st.Run, l)
	v.Queue = toRunQueue(st.Run, st.Position, l.now)
	v.Egress = toEgressSummary(st.Egress)
	v.Credentials = toBrokeredCredentials(st.Run.Brokered)
	return fleetapi.RunAnswer{Run: v, Refreshed: st.Refreshed, Note: st.Note}
}

// toBrokeredCredentials are a run's brokered keys with their expiry and
// revocation: never a value, nor the sealed token; nil when none.
func toBrokeredCredentials(keys []store.BrokeredKey) []fleetapi.BrokeredCredential {
	if len(keys) == 0 {
		return nil
	}
	out := make([]fleetapi.BrokeredCredential, len(keys))
	for i, k := range keys {
		out[i] = fleetapi.BrokeredCredential{ProjectID: k.ProjectID, Key: k.Key, Kind: k.Kind, ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt}
	}
	return out
}

// toAlertedPage is GET /fleet/runs?alerts=true: the runs with egress
// alerts, each with its egress summary.
func toAlertedPage(page fleet.AlertedPage, l linker) fleetapi.RunPage {
	views := make([]fleetapi.Run, len(page.Runs))
	for i, r := range page.Runs {
		views[i] = toRunView(r.Run, l)
		views[i].Egress = toEgressSummary(r.Egress)
	}
	return fleetapi.RunPage{Runs: views, NextCursor: page.NextCursor, HasMore: page.NextCursor != ""}
}

// EgressRecordOf is a mirrored ledger record as the API shows it, on the
// egress route and the stream alike: the host's record, hash included,
// field for field.
func EgressRecordOf(r egress.Record) fleetapi.EgressRecord {
	return fleetapi.EgressRecord{
		Seq: r.Seq, TS: r.TS, Via: r.Via, Authority: r.Authority, Method: r.Method, Path: r.Path, Command: r.Command,
		Status: r.Status, BytesUp: r.BytesUp, BytesDown: r.BytesDown, DurationUs: r.DurationUs, Keys: r.Keys,
		Action: r.Action, Reason: r.Reason, Rule: r.Rule, Alert: r.Alert, Dropped: r.Dropped, Hash: r.Hash,
	}
}

// toEgressSummary is a ledger's summary; nil stays nil (no ledger).
func toEgressSummary(s *egress.Summary) *fleetapi.EgressSummary {
	if s == nil {
		return nil
	}
	v := &fleetapi.EgressSummary{
		Requests: s.Requests, Blocked: s.Blocked, Warned: s.Warned, BytesUp: s.BytesUp, BytesDown: s.BytesDown,
		Alerts: s.Alerts, Dropped: s.Dropped, Authorities: make([]fleetapi.EgressAuthority, len(s.Authorities)),
		OtherAuthorities: s.OtherAuthorities,
	}
	for i, a := range s.Authorities {
		keys := a.Keys
		if keys == nil {
			keys = []string{}
		}
		v.Authorities[i] = fleetapi.EgressAuthority{Authority: a.Authority, Requests: a.Requests, Blocked: a.Blocked, Keys: keys}
	}
	return v
}

// toEgressSeal is a ledger's seal; nil stays nil (not sealed).
func toEgressSeal(s *egress.Seal) *fleetapi.EgressSeal {
	if s == nil {
		return nil
	}
	return &fleetapi.EgressSeal{Count: s.Count, LastHash: s.LastHash, Signature: s.Signature, PublicKey: s.PublicKey, SealedAt: s.SealedAt}
}

// toEgressPage is a page of the ledger mirror, as toEventPage shapes a
// page of events: no nextCursor past the mirror's end.
func toEgressPage(page fleet.EgressPage) fleetapi.EgressPage {
	records := make([]fleetapi.EgressRecord, len(page.Records))
	for i, r := range page.Records {
		records[i] = EgressRecordOf(r)
	}
	v := fleetapi.EgressPage{Records: records, HasMore: page.HasMore, Live: page.Live,
		Summary: toEgressSummary(page.Summary), Seal: toEgressSeal(page.Seal)}
	if !page.PastEnd {
		next := page.NextCursor
		v.NextCursor = &next
	}
	if x := page.Verification; x != nil {
		v.Verification = &fleetapi.EgressVerification{OK: x.OK, Records: x.Records, Sealed: x.Sealed, FailedSeq: x.FailedSeq,
			Problem: x.Problem, HostID: x.HostID, LedgerKey: x.LedgerKey, HostChecked: x.HostChecked}
	}
	return v
}

// toDispatchRequest is a dispatch body as Fleet takes it: the run request,
// Fleet's routing fields and its ask to wait (the key is the handler's:
// header or body). queue.timeout must be a Go duration: a 400 names it.
func toDispatchRequest(b fleetapi.DispatchRequest) (fleet.DispatchRequest, error) {
	r := fleet.DispatchRequest{Host: b.Host, Labels: b.Labels, Run: b.RunRequest()}
	if q := b.Queue; q != nil {
		if q.Timeout == "" {
			return fleet.DispatchRequest{}, badRequest(`queue.timeout is required: a duration such as "30m" ("0s" does not wait)`)
		}
		d, err := time.ParseDuration(q.Timeout)
		if err != nil {
			return fleet.DispatchRequest{}, badRequest(`queue.timeout %s: want a duration such as "30m", "1h30m" or "90s"`, runspec.Quoted(q.Timeout))
		}
		r.Queue = &fleet.QueueRequest{Timeout: d, Priority: q.Priority}
	}
	return r, nil
}

// toDispatchAnswer is POST /fleet/runs' answer, with the run's end when it
// ended at once (reason, detail) and its links.
func toDispatchAnswer(res fleet.DispatchResult, l linker) fleetapi.DispatchAnswer {
	r := res.Run
	return fleetapi.DispatchAnswer{
		FleetRunID: r.FleetRunID, HostID: r.HostID, ChildRunID: r.ChildRunID, Status: r.Status,
		Pending: r.Status == store.StatusDispatching, Reused: res.Reused,
		RewroteLocalPath: r.RewroteLocalPath, Reason: r.Reason, Detail: r.Detail, Note: res.Note,
		Links: l.run(r.FleetRunID), Details: toDispatchDetails(res.Excluded), Queue: toRunQueue(r, res.Position, l.now),
	}
}

// toDispatchDetails is the hosts a dispatch went past; nil when none.
func toDispatchDetails(excluded []fleet.Exclusion) *fleetapi.DispatchDetails {
	if len(excluded) == 0 {
		return nil
	}
	return &fleetapi.DispatchDetails{Excluded: toExclusions(excluded)}
}

func toExclusions(excluded []fleet.Exclusion) []fleetapi.Exclusion {
	out := make([]fleetapi.Exclusion, len(excluded))
	for i, e := range excluded {
		out[i] = fleetapi.Exclusion{HostID: e.HostID, Reasons: e.Reasons, Agents: e.Agents, Detail: e.Detail}
	}
	return out
}

// toDispatchRefused is a dispatch the host refused: an error body (error,
// code) and the dispatch answer in one object, so a generic error handler
// and a client that follows the run both find what they read.
func toDispatchRefused(res fleet.DispatchResult, l linker) fleetapi.DispatchRefused {
	r := res.Run
	msg := "host " + r.HostID + " refused the run (" + r.Reason + ")"
	if n := len(res.Excluded); n > 1 {
		// Routing went past the others first: details.excluded has each.
		msg = fmt.Sprintf("all %d hosts tried refused the run; the last, %s, with %s", n, r.HostID, r.Reason)
	}
	if r.Detail != "" {
		msg += ": " + r.Detail
	}
	return fleetapi.DispatchRefused{Error: msg, Code: r.Reason, DispatchAnswer: toDispatchAnswer(res, l)}
}

func toCallerView(c store.Caller) fleetapi.Caller {
	return fleetapi.Caller{
		OwnerID: c.OwnerID, Admin: c.Admin, AllowedHosts: toScope(c.AllowedHosts),
		AllowedProjects: toScope(c.AllowedProjects), CreatedAt: c.CreatedAt,
	}
}

func toCallerViews(cs []store.Caller) []fleetapi.Caller {
	views := make([]fleetapi.Caller, len(cs))
	for i, c := range cs {
		views[i] = toCallerView(c)
	}
	return views
}

func toScope(s store.Scope) fleetapi.Scope { return fleetapi.Scope{All: s.All, IDs: s.IDs} }

// toStoreScope is a scope a request gave; nil when it gave none.
func toStoreScope(s *fleetapi.Scope) *store.Scope {
	if s == nil {
		return nil
	}
	return &store.Scope{All: s.All, IDs: s.IDs}
}

// toCallerSpec is a mint body as Fleet takes it (checked by the handler).
func toCallerSpec(b fleetapi.MintCaller) fleet.CallerSpec {
	return fleet.CallerSpec{
		OwnerID: b.OwnerID, AllowedHosts: toStoreScope(b.AllowedHosts), AllowedProjects: toStoreScope(b.AllowedProjects), Admin: b.Admin,
	}
}

// codeHostRefused is a refusal's code when the host gave none, as
// dispatch names such a refusal's reason.
const codeHostRefused = "host_refused"

// toOutcome is a forwarded verb's outcome (hostproto.OutcomeOf's mapping).
// A refusal always carries a code, since its answer is also an error: the
// host's, host_unavailable (as dispatch names it) for a request that
// certainly never reached the host, host_refused for a host that gave none.
func toOutcome(o hostproto.Outcome) fleetapi.Outcome {
	v := fleetapi.Outcome{HostStatus: o.HostStatus, Code: o.Code, Detail: o.Detail}
	switch o.Accepted {
	case hostproto.Accepted:
		v.Accepted = fleetapi.Accepted
	case hostproto.Refused:
		v.Accepted = fleetapi.Refused
		switch {
		case v.Code != "":
		case o.HostStatus == 0:
			v.Code = hostproto.ReasonHostUnavailable
		default:
			v.Code = codeHostRefused
		}
	default:
		v.Accepted = fleetapi.Unknown
	}
	return v
}

// refusalMessage is a refused verb's error: who refused what, the code, and
// what the host said (its detail, shown as the Outcome shows it).
func refusalMessage(hostID, what string, o fleetapi.Outcome) string {
	msg := "host " + hostID + " refused " + what + " (" + o.Code + ")"
	if o.Code == hostproto.ReasonHostUnavailable {
		msg = "host " + hostID + " could not be reached for " + what + " (" + o.Code + ")"
	}
	if o.Detail != "" {
		msg += ": " + o.Detail
	}
	return msg
}

// toInteraction is the answer of the verbs (input, cancel, retry), with
// its status (outcomeStatus): the outcome and the run as recorded after;
// a refusal is also an error naming the verb, the run and the host.
func toInteraction(verb string, i fleet.Interaction, l linker) (int, any) {
	v := fleetapi.Interaction{FleetRunID: i.Run.FleetRunID, Outcome: toOutcome(i.Outcome), Run: toRunView(i.Run, l)}
	status := outcomeStatus(v.Accepted)
	if v.Accepted == fleetapi.Refused {
		return status, fleetapi.InteractionRefused{Error: refusalMessage(i.Run.HostID, "the "+verb+" of run "+i.Run.FleetRunID, v.Outcome), Interaction: v}
	}
	return status, v
}

// EventOf is a mirrored event as the API shows it, on the events route
// and the stream alike (DESIGN.md, section "The event shape": the host's
// event as it came).
func EventOf(e hostproto.Event) fleetapi.Event {
	return fleetapi.Event{Sequence: e.Sequence, Type: e.Type, Data: e.Data, TS: e.TS}
}

// toEventPage is a page of the mirror; live: the run may yet have events
// the mirror lacks. A page past the run's last event has no nextCursor:
// there is no place it continues from.
func toEventPage(page fleet.EventsPage, live bool) fleetapi.EventPage {
	var events []fleetapi.Event // null when the mirror's page is, as always
	if page.Events != nil {
		events = make([]fleetapi.Event, len(page.Events))
		for i, e := range page.Events {
			events[i] = EventOf(e)
		}
	}
	v := fleetapi.EventPage{Events: events, HasMore: page.HasMore, Live: live}
	if !page.PastEnd {
		next := page.NextCursor
		v.NextCursor = &next
	}
	return v
}

// StreamSnapshotOf is the stream's snapshot data: where the stream stands
// (cursor: the last event sent; egressCursor: the last ledger record sent,
// nil on a stream without egress) and whether more may come.
func StreamSnapshotOf(r store.Run, cursor int64, egressCursor *int64, live bool) fleetapi.StreamSnapshot {
	return fleetapi.StreamSnapshot{Cursor: cursor, Status: r.Status, Attempt: r.Attempt, Live: live, EgressCursor: egressCursor}
}

// StreamDoneOf is the stream's done data: the run's end.
func StreamDoneOf(r store.Run, cursor int64, egressCursor *int64) fleetapi.StreamDone {
	return fleetapi.StreamDone{Cursor: cursor, Status: r.Status, Attempt: r.Attempt, ExitCode: r.ExitCode, Reason: r.Reason, Detail: r.Detail,
		EgressCursor: egressCursor}
}

// StreamIdleOf is the stream's idle data: silent for idle, the stream
// ends; resume at cursor (and egressCursor, on a stream with egress)
// after retry.
func StreamIdleOf(r store.Run, cursor int64, egressCursor *int64, idle, retry time.Duration) fleetapi.StreamIdle {
	resume := "/fleet/runs/" + url.PathEscape(r.FleetRunID) + "/stream?after=" + strconv.FormatInt(cursor, 10)
	if egressCursor != nil {
		resume += "&egress=true&egressAfter=" + strconv.FormatInt(*egressCursor, 10)
	}
	return fleetapi.StreamIdle{
		Cursor: cursor, Status: r.Status, IdleSeconds: int64(idle.Seconds()), RetryMs: retry.Milliseconds(),
		Resume: resume, EgressCursor: egressCursor,
	}
}

// toErrorDetails is a fleet.Error's details as the API shows them. Fleet's
// kinds of details each have their shape here; one this function does not
// know is a fault (as an error kind ErrorStatus does not know is), never
// shown as it is.
func toErrorDetails(d any) (json.RawMessage, error) {
	var v any
	switch d := d.(type) {
	case nil:
		return nil, nil
	case fleet.Unrouted:
		v = toNoEligibleHost(d)
	case fleet.CredentialRefusal:
		v = fleetapi.CredentialUnavailable{ProjectID: d.ProjectID, Key: d.Key, Kind: d.Kind, ProviderStatus: d.ProviderStatus}
	case map[string]string:
		// The ids and statuses a conflict names ({fleetRunId}, {status,
		// reason}): strings, shown as they are.
		v = d
	default:
		return nil, fmt.Errorf("api: error details of type %T have no view", d)
	}
	b, err := EncodeJSON(v)
	if err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b, []byte("\n")), nil
}

func toNoEligibleHost(u fleet.Unrouted) fleetapi.NoEligibleHost {
	v := fleetapi.NoEligibleHost{Considered: u.Considered, Hosts: u.Hosts}
	if u.Excluded != nil {
		v.Excluded = toExclusions(u.Excluded)
	}
	return v
}
