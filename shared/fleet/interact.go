package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
)

// CodeNotOnHost: a verb on a run that has no run on its host to forward
// to (still dispatching, or ended before the host took it).
const CodeNotOnHost = "run_not_on_host"

// Interaction is a verb forwarded to a run's host: the outcome as DESIGN.md
// maps it (2xx accepted, 4xx refused, no answer or 5xx "unknown" with the
// detail: never a success the host did not confirm), and the run as stored
// after (changed only by an answer that moved its state: a cancel, a retry).
type Interaction struct {
	Outcome hostproto.Outcome
	Run     store.Run
}

// Input forwards input (any JSON value; nil is null) to run id's host as
// {"input": value}. Scope as RunFor.
func (f *Fleet) Input(ctx context.Context, c store.Caller, id string, input json.RawMessage) (Interaction, error) {
	return f.interact(ctx, c, id, "input", func(ctx context.Context, client *hostproto.Client, child string) (*hostproto.Run, error) {
		raw, err := client.Input(ctx, child, input)
		if err != nil {
			return nil, err
		}
		// The protocol leaves input's answer open; edge answers the run,
		// which then costs no further call to show its state.
		var r hostproto.Run
		if json.Unmarshal(raw, &r) != nil || r.RunID != child || r.Status == "" {
			return nil, nil
		}
		return &r, nil
	})
}

// Cancel forwards a cancel to run id's host. A run that waits for
// capacity is canceled by Fleet itself (cancelWaiting): at once while
// queued, never started. Scope as RunFor.
func (f *Fleet) Cancel(ctx context.Context, c store.Caller, id string) (Interaction, error) {
	run, err := f.RunFor(ctx, c, id)
	if err != nil {
		return Interaction{}, err
	}
	if run.Waiting() {
		return f.cancelWaiting(ctx, run)
	}
	return f.interactWith(ctx, run, "cancel", cancelCall)
}

// cancelCall is the cancel verb's host call.
func cancelCall(ctx context.Context, client *hostproto.Client, child string) (*hostproto.Run, error) {
	r, err := client.Cancel(ctx, child)
	return &r, err
}

// Retry forwards a retry to run id's host. An accepted retry makes the run
// live again (a new attempt on the same event sequence). The run is back in
// the live index before the host is called, so whatever the outcome (an
// unknown one, or an accepted one Fleet failed to record) the next sweep
// learns from the host whether the attempt began. An accepted retry's new
// attempt gets fresh values of the run's brokered keys that its host
// lacks, that Fleet revoked at the run's end, or that are expiring
// (refreshCredentials), at once rather than at the next sweep. Scope as
// RunFor.
func (f *Fleet) Retry(ctx context.Context, c store.Caller, id string) (Interaction, error) {
	return f.interact(ctx, c, id, "retry", func(ctx context.Context, client *hostproto.Client, child string) (*hostproto.Run, error) {
		r, err := client.Retry(ctx, child)
		return &r, err
	})
}

// interact checks scope, forwards one verb and records what the answer
// says about the run.
func (f *Fleet) interact(ctx context.Context, c store.Caller, id, verb string,
	call func(ctx context.Context, client *hostproto.Client, childRunID string) (*hostproto.Run, error)) (Interaction, error) {
	run, err := f.RunFor(ctx, c, id)
	if err != nil {
		return Interaction{}, err
	}
	return f.interactWith(ctx, run, verb, call)
}

// interactWith is interact on run, read and scoped by the caller.
func (f *Fleet) interactWith(ctx context.Context, run store.Run, verb string,
	call func(ctx context.Context, client *hostproto.Client, childRunID string) (*hostproto.Run, error)) (Interaction, error) {
	id := run.FleetRunID
	if run.ChildRunID == "" {
		what := "has not reached its host yet"
		switch {
		case run.Waiting():
			what = "waits in the queue for an eligible host with room and has not started"
		case run.Status != store.StatusDispatching:
			what = "never reached its host"
		}
		return Interaction{}, conflict(CodeNotOnHost, map[string]string{"status": run.Status, "reason": run.Reason},
			"run %s %s (status %s); there is nothing to %s", id, what, run.Status, verb)
	}
	client, err := f.clientFor(ctx, run.HostID)
	if err != nil {
		return Interaction{}, fmt.Errorf("fleet: %s: %w", verb, err)
	}
	recordCtx := context.WithoutCancel(ctx)
	// undrained: this call put the run back in the live index (not a
	// concurrent retry, whose attempt may be running now).
	undrained := false
	if verb == "retry" && run.Drained {
		// A retry the host accepts starts an attempt whatever becomes of
		// this call (a store fault recording the answer, the function's
		// end): with the run back in the live index first, the sweep
		// learns of it in any case. A refusal that proves nothing began
		// drains it again below; failing that, the sweep does.
		run, err = f.settle(recordCtx, run, func(cur *store.Run) bool {
			undrained = cur.Drained
			cur.Drained = false
			return undrained
		})
		if err != nil {
			return Interaction{}, fmt.Errorf("fleet: retry: putting %s back in the live index: %w", id, err)
		}
	}
	// The call and the record of its answer outlive a caller that hangs
	// up: an accepted retry must make the run live whoever is listening.
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.HostTimeout)
	answer, callErr := call(callCtx, client, run.ChildRunID)
	cancel()
	out := Interaction{Outcome: hostproto.OutcomeOf(callErr), Run: run}
	if callErr != nil {
		f.log.Warn("verb not accepted", logVerb, verb, logRun, id, logHost, run.HostID, "accepted", outcomeWord(out.Outcome.Accepted),
			logErr, callErr.Error())
	}

	var he *hostproto.Error
	switch {
	case callErr == nil && answer != nil:
		hr := *answer
		stored, err := f.settle(recordCtx, run, func(cur *store.Run) bool {
			if !hostAnswerApplies(*cur, hr) {
				return false
			}
			f.applyHostRun(cur, hr, f.clock.Now().UTC())
			return true
		})
		if err != nil {
			return out, fmt.Errorf("fleet: %s: recording the host's answer for %s: %w", verb, id, err)
		}
		if verb == "retry" {
			stored, _ = f.refreshCredentials(recordCtx, client, stored, hr)
		}
		out.Run = stored
	case undrained && out.Outcome.Accepted == hostproto.Refused && out.Outcome.Code != hostproto.CodeNotRetryable:
		// The host began nothing (it refused, or never got the call): the
		// run is as this call found it, drained. Drained again here, a run
		// the host no longer knows is not then taken for lost. Not so after
		// not_retryable: the host has a live attempt (a concurrent retry's)
		// that the sweep must see.
		stored, err := f.settle(recordCtx, run, func(cur *store.Run) bool {
			if cur.Drained || cur.Attempt != run.Attempt || cur.EventCursor != run.EventCursor || !store.Terminal(cur.Status) {
				return false
			}
			cur.Drained = true
			return true
		})
		if err != nil {
			return out, fmt.Errorf("fleet: retry: draining %s again after the host refused: %w", id, err)
		}
		out.Run = stored
	case !store.Terminal(run.Status) && (callErr == nil || errors.As(callErr, &he) && he.Refused()):
		// The host answered without the run's state (an input answered
		// otherwise) or refused the verb (not_running: its attempt has
		// ended): one read records where the run is, so the answer never
		// shows a live run that ended. After no answer, the host is not
		// asked again (the verb already had its time).
		refreshCtx, cancel := context.WithTimeout(recordCtx, ridingRefreshBudget)
		if fresh, err := f.refreshWith(refreshCtx, client, run); err == nil {
			out.Run = fresh
		} else {
			f.log.Warn("verb: refreshing the run after the host's answer failed", logVerb, verb, logRun, id, logErr, err.Error())
		}
		cancel()
	}
	return out, nil
}

func outcomeWord(a hostproto.Acceptance) string {
	b, _ := a.MarshalJSON()
	return string(b)
}
