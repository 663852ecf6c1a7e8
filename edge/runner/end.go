package runner

import (
	"fmt"
	"syscall"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// How an attempt ends: terminate and cancel end it for a reason, the first
// of which wins; finish, which runs once wherever the attempt ended, gives
// back what it held and only then records its outcome, so whoever sees the
// end may retry at once.

// outcome is how an attempt ended.
type outcome struct {
	status   string
	exitCode *int
	reason   string
	detail   string
}

// refusedOutcome is the end of an attempt refused before its process ran:
// canceled for a cancel or a shutdown, else failed.
func refusedOutcome(ref *Refusal) outcome {
	status := hostproto.StatusFailed
	if ref.Reason == hostproto.ReasonCanceled || ref.Reason == hostproto.ReasonHostShutdown {
		status = hostproto.StatusCanceled
	}
	return outcome{status: status, reason: ref.Reason, detail: ref.Detail}
}

// terminate ends a running attempt for reason: SIGKILL to its group at once
// when hard, else SIGTERM and SIGKILL after the grace. The first reason wins.
// An attempt whose process has not started has its ctx ended instead.
func (r *Runner) terminate(t *task, reason, detail string, hard bool) {
	t.mu.Lock()
	if t.endReason == "" {
		t.endReason, t.endDetail = reason, detail
	}
	proc := t.proc
	t.mu.Unlock()
	if proc == nil {
		t.stop()
		return
	}
	if hard {
		syscall.Kill(-proc.Pid, syscall.SIGKILL)
		return
	}
	syscall.Kill(-proc.Pid, syscall.SIGTERM)
	t.addTimer(r.clock.AfterFunc(r.cfg.CancelGrace, func() { syscall.Kill(-proc.Pid, syscall.SIGKILL) }))
}

// cancel cancels the attempt for reason (canceled or host_shutdown): its
// proxy access is revoked at once, and its process, if it has one, is
// terminated; an attempt not started yet is refused at its ticket's check.
//
// It reports whether the attempt had already ended: a task stays in the
// live set for a moment after its end is recorded, and a cancel arriving
// then must not be taken as accepted. A second cancel of an attempt still
// ending from the first is not ended.
func (r *Runner) cancel(t *task, reason string) (ended bool) {
	if t.purging {
		return true
	}
	t.mu.Lock()
	if t.finished {
		t.mu.Unlock()
		return true
	}
	if t.canceled {
		t.mu.Unlock()
		return false
	}
	t.canceled = true
	// The reason is set with the flag, so an admission check in between
	// refuses with it (host_shutdown, not canceled).
	if t.endReason == "" {
		t.endReason = reason
	}
	// Revoked under t.mu, so never after finish: the run's next attempt
	// (minted only once this one has finished) cannot lose its credential
	// to a cancel of this one that ran late.
	if t.brokerOn {
		r.broker.EndAttempt(t.runID)
	}
	t.mu.Unlock()
	r.terminate(t, reason, "", false)
	t.stop()
	return false
}

// finish ends the attempt: it gives back the proxy credential, the trust
// subscription and the slot, calls Config.AttemptEnded, and records the
// outcome with its state event (after any extra events). It runs once;
// later calls do nothing.
func (r *Runner) finish(t *task, o outcome, extra ...runlog.Entry) {
	t.mu.Lock()
	if t.finished {
		t.mu.Unlock()
		return
	}
	t.finished = true
	timers, unwatch, brokerOn, started := t.timers, t.unwatch, t.brokerOn, t.started
	t.timers, t.unwatch = nil, nil
	t.mu.Unlock()
	// Nothing of the attempt outlives its end, wherever it ended.
	r.closeGroup(t)
	for _, tm := range timers {
		tm.Stop()
	}
	if unwatch != nil {
		if err := unwatch(); err != nil {
			r.logger.Error("ending a task's trust subscription", fieldRun, t.runID, fieldError, err.Error())
		}
	}
	if brokerOn {
		r.broker.EndAttempt(t.runID)
	}
	t.stop()
	r.reclaimDirs(t)
	// The slot goes back before the end is recorded, so whoever sees the
	// run ended sees its slot free.
	r.mu.Lock()
	if t.holdsSlot {
		r.slots--
		t.holdsSlot = false
	}
	r.mu.Unlock()
	if hook := r.cfg.AttemptEnded; hook != nil {
		hook(t.runID)
	}

	now := r.clock.Now()
	state := hostproto.StateChange{Status: o.status, Attempt: t.attempt, ExitCode: o.exitCode, Reason: o.reason, Detail: o.detail}
	events := append(extra, stateEntry(now, state))
	// Set before the end is visible to any reader, since one who sees it
	// may retry at once: the retry then takes this task's place in the
	// live set, and its own write to the run log, coming after this one,
	// finds the run ended.
	t.ended.Store(true)
	if err := r.record(t.runID, func() error {
		_, err := r.log.Update(t.runID, func(rec *runlog.Record) error {
			rec.Status, rec.ExitCode, rec.Reason, rec.Detail = o.status, o.exitCode, o.reason, o.detail
			rec.UpdatedAt, rec.EndedAt = now, &now
			return nil
		}, events...)
		return err
	}); err != nil {
		r.logs.Error(condRecordEnd, "recording the end of an attempt", fieldRun, t.runID, fieldError, err.Error())
	}
	if !started {
		if o.reason != "" {
			t.resolveStart(&Refusal{Reason: o.reason, Detail: o.detail})
		} else {
			t.resolveStart(fmt.Errorf("runner: run %s ended before its process started", t.runID))
		}
	}
	r.logger.Info("run ended", fieldRun, t.runID, fieldAttempt, t.attempt, fieldStatus, o.status, fieldReason, o.reason)
	if hook := r.afterEndRecorded; hook != nil {
		hook(t.runID)
	}

	r.mu.Lock()
	if r.live[t.runID] == t {
		delete(r.live, t.runID)
	}
	r.mu.Unlock()
	close(t.done)
	r.wg.Done()
}
