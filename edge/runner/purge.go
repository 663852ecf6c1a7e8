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

// recover marks the attempts a crash left live as failed (host_restarted):
// their processes died with edge (their leader has PDEATHSIG), and their
// events, placeholders and the CA stay.
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
		state := hostproto.StateChange{Status: hostproto.StatusFailed, Attempt: old.Attempt, Reason: hostproto.ReasonHostRestarted, Detail: detail}
		if _, err := r.log.Update(old.RunID, func(rec *runlog.Record) error {
			rec.Status, rec.ExitCode, rec.Reason, rec.Detail = hostproto.StatusFailed, nil, hostproto.ReasonHostRestarted, detail
			rec.UpdatedAt, rec.EndedAt = now, &now
			return nil
		}, stateEntry(now, state)); err != nil {
			return fmt.Errorf("runner: marking run %s host_restarted: %w", old.RunID, err)
		}
		r.logger.Warn("run failed by a restart", fieldRun, old.RunID, fieldAttempt, old.Attempt)
	}
	return nil
}

// purge removes runs that ended more than runner.retention ago: their
// events and record, their placeholders (the broker's Drop) and their
// directories (a localPath is the operator's and stays).
func (r *Runner) purge() {
	cutoff := r.clock.Now().Add(-r.cfg.Retention)
	var old []string
	if err := r.log.Records(func(rec runlog.Record) bool {
		if rec.EndedAt != nil && rec.EndedAt.Before(cutoff) && hostproto.TerminalStatus(rec.Status) {
			old = append(old, rec.RunID)
		}
		return true
	}); err != nil {
		r.logger.Error("listing runs to purge", fieldError, err.Error())
		return
	}
	for _, id := range old {
		if r.liveTask(id) != nil {
			continue
		}
		if r.broker != nil {
			if err := r.broker.Drop(id); err != nil {
				r.logger.Error("dropping a purged run's placeholders", fieldRun, id, fieldError, err.Error())
				continue
			}
		}
		if err := os.RemoveAll(filepath.Join(r.cfg.WorkDir, id)); err != nil {
			r.logger.Error("removing a purged run's directories", fieldRun, id, fieldError, err.Error())
			continue
		}
		if err := r.log.Delete(id); err != nil {
			r.logger.Error("purging a run", fieldRun, id, fieldError, err.Error())
			continue
		}
		r.logger.Info("run purged", fieldRun, id)
	}
}

func (r *Runner) schedulePurge() {
	every := min(purgeEvery, r.cfg.Retention)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.purgeTimer = r.clock.AfterFunc(every, func() {
		r.purge()
		r.schedulePurge()
	})
}
