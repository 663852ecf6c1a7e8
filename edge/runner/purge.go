package runner

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// purgeEvery bounds how long a run outlives its retention.
const purgeEvery = time.Hour

// recover marks the attempts a crash left live as failed (host_restarted),
// each ended through Config.AttemptEnded first: their processes died with
// edge (their leader has PDEATHSIG), and their events, placeholders and
// the CA stay.
func (r *Runner) recover() error {
	var stale []runlog.Record
	if err := r.log.Records(func(rec runlog.Record) bool {
		if !hostproto.TerminalStatus(rec.Status) {
			stale = append(stale, rec)
		}
		return true
	}); err != nil {
		return err
	}
	now := r.clock.Now()
	const detail = "edge restarted while the attempt was live"
	for _, old := range stale {
		if hook := r.cfg.AttemptEnded; hook != nil {
			hook(old.RunID)
		}
		state := hostproto.StateChange{Status: hostproto.StatusFailed, Attempt: old.Attempt, Reason: hostproto.ReasonHostRestarted, Detail: detail}
		if err := r.record(old.RunID, func() error {
			_, err := r.log.Update(old.RunID, func(rec *runlog.Record) error {
				rec.Status, rec.ExitCode, rec.Reason, rec.Detail = hostproto.StatusFailed, nil, hostproto.ReasonHostRestarted, detail
				rec.UpdatedAt, rec.EndedAt = now, &now
				return nil
			}, stateEntry(now, state))
			return err
		}); err != nil {
			return fmt.Errorf("runner: marking run %s host_restarted: %w", old.RunID, err)
		}
		r.logger.Warn("run failed by a restart", fieldRun, old.RunID, fieldAttempt, old.Attempt)
	}
	return nil
}

// purge removes runs that ended more than runner.retention ago: their
// events and record, their placeholders (the broker's Drop) and their
// directories (a localPath is the operator's and stays). It reports
// whether it could list the runs (a run it could not remove is logged and
// tried again at the next pass).
func (r *Runner) purge() bool {
	cutoff := r.clock.Now().Add(-r.cfg.Retention)
	var old []runlog.Record
	if err := r.log.Records(func(rec runlog.Record) bool {
		if expired(rec, cutoff) {
			old = append(old, rec)
		}
		return true
	}); err != nil {
		r.logger.Error("listing runs to purge", fieldError, err.Error())
		return false
	}
	for _, rec := range old {
		r.purgeRun(rec, cutoff)
	}
	return true
}

func expired(rec runlog.Record, cutoff time.Time) bool {
	return rec.EndedAt != nil && rec.EndedAt.Before(cutoff) && hostproto.TerminalStatus(rec.Status)
}

// purgeRun removes one run while holding it, as an attempt would: no retry
// begins meanwhile (it is refused as live), and a cancel or input finds no
// process. A run with a live attempt is skipped, and so is one that a retry
// made current again since it was listed.
func (r *Runner) purgeRun(rec runlog.Record, cutoff time.Time) {
	t := newTask(rec)
	t.purging = true
	if err := r.publish(t); err != nil {
		return // live, or the runner is shutting down
	}
	defer r.unreserve(t)
	id := rec.RunID
	if rec, err := r.log.Get(id); err != nil || !expired(rec, cutoff) {
		return
	}
	if hook := r.beforePurgeRemoves; hook != nil {
		hook(id)
	}
	if r.broker != nil {
		if err := r.broker.Drop(id); err != nil {
			r.logger.Error("dropping a purged run's placeholders", fieldRun, id, fieldError, err.Error())
			return
		}
	}
	if err := os.RemoveAll(filepath.Join(r.cfg.WorkDir, id)); err != nil {
		r.logger.Error("removing a purged run's directories", fieldRun, id, fieldError, err.Error())
		return
	}
	if err := r.log.Delete(id); err != nil {
		r.logger.Error("purging a run", fieldRun, id, fieldError, err.Error())
		return
	}
	r.metrics.purged.Inc()
	r.logger.Info("run purged", fieldRun, id)
}

func (r *Runner) schedulePurge() {
	every := min(purgeEvery, r.cfg.Retention)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.purgeTimer = r.clock.AfterFunc(every, func() {
		// A pass counts in r.wg like an attempt, so Shutdown, which stops
		// the timer but cannot stop a pass under way, waits for it to end
		// before the run log closes.
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		r.wg.Add(1)
		r.mu.Unlock()
		defer r.wg.Done()
		ok := r.purge()
		r.schedulePurge()
		if ok {
			r.metrics.purgePasses.Inc()
		}
	})
}
