package hostapi

import (
	"github.com/runfleet/runfleet/edge/ledger"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/runner"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// The one place the host protocol's wire types meet the runner's own: the
// runner and its run log never see a wire type, so a change on the wire is a
// change here, not a migration of what edge has stored.

// specOf is the start a POST /runs body asks for: the run request as it
// came, its token, the values Fleet sent with it and its wait in Fleet's
// queue (the data of the run's first event, in the protocol's shape).
func specOf(req hostproto.StartRequest) runner.Spec {
	return runner.Spec{ClientToken: req.ClientToken, Credentials: credentialsOf(req.Credentials), Queued: req.Queued, Request: req.Request}
}

// credentialsOf is the values Fleet sent, each leaving the wire's
// SecretString for the type that guards it on edge's side.
func credentialsOf(wire []hostproto.BrokeredValue) []runner.Credential {
	if len(wire) == 0 {
		return nil
	}
	out := make([]runner.Credential, len(wire))
	for i, b := range wire {
		out[i] = runner.Credential{ProjectID: b.ProjectID, Key: b.Key, Value: secrets.NewValue(string(b.Value)), ExpiresAt: b.ExpiresAt}
	}
	return out
}

// wireRun is a run as the protocol shows it.
func wireRun(run runner.Run) hostproto.Run {
	return hostproto.Run{
		RunID: run.RunID, ClientToken: run.ClientToken, Status: run.Status, Attempt: run.Attempt,
		ExitCode: run.ExitCode, Reason: run.Reason, Detail: run.Detail, Reused: run.Reused,
		MissingCredentials: run.MissingCredentials,
	}
}

// wireRuns is never nil: an unknown token answers an empty list.
func wireRuns(runs []runner.Run) []hostproto.Run {
	out := make([]hostproto.Run, 0, len(runs))
	for _, run := range runs {
		out = append(out, wireRun(run))
	}
	return out
}

// wirePage is a page of stored events as the protocol serves them. An
// event's data is served as it was stored: the runner writes it in the
// protocol's shapes (hostproto.StateChange, LimitReached). A page past the
// run's last event has no nextCursor: no page continues from there.
func wirePage(page runlog.Page) hostproto.EventPage {
	events := make([]hostproto.Event, 0, len(page.Events))
	for _, e := range page.Events {
		events = append(events, hostproto.Event{Sequence: e.Sequence, Type: e.Type, Data: e.Data, TS: e.TS})
	}
	p := hostproto.EventPage{Events: events, HasMore: page.HasMore}
	if !page.PastEnd {
		next := page.NextCursor
		p.NextCursor = &next
	}
	return p
}

// wireEgressPage is a page of a run's egress ledger as the protocol serves
// it, with the events' convention: a page past the ledger's end has no
// nextCursor.
func wireEgressPage(page ledger.Page) hostproto.EgressPage {
	p := hostproto.EgressPage{Records: page.Records, HasMore: page.HasMore, Summary: page.Summary, Seal: page.Seal}
	if p.Records == nil {
		p.Records = []egress.Record{}
	}
	if !page.PastEnd {
		next := page.NextCursor
		p.NextCursor = &next
	}
	return p
}

// wireLimits is how the host bounds each task, as /healthz reports it.
func wireLimits(l runner.LimitsReport) hostproto.Limits {
	return hostproto.Limits{Enforced: l.Enforced, MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPU: l.CPU, Detail: l.Detail}
}

// wireStorage is the data dir's free space, as /healthz reports it.
func wireStorage(s runner.StorageReport) *hostproto.Storage {
	return &hostproto.Storage{FreeBytes: s.FreeBytes, MinFreeBytes: s.MinFreeBytes, Low: s.Low}
}
