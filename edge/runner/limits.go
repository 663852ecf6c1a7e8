package runner

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/runfleet/runfleet/edge/cgroups"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// limitsPoll is how often a running attempt's control group is read for
// what the kernel did to it: an OOM kill ends the attempt within it, and a
// refused fork is said in its events within it.
const limitsPoll = time.Second

// openLimits finds where this host lets edge bound its tasks (package
// cgroups). An error makes the runner refuse every run, since tasks would
// otherwise run unbounded on a host configured to bound them.
func (r *Runner) openLimits() {
	if r.cfg.Limits.None {
		return
	}
	h, err := cgroups.Open(cgroups.Options{Name: "runfleet-edge-" + edgeID(r.cfg.WorkDir)})
	if err != nil {
		r.limitsErr = fmt.Errorf("the host cannot enforce runner.limits (%v): give edge a writable cgroup v2 with the memory, pids and cpu controllers delegated, or the v1 ones, or set runner.limits to %q to run tasks bounded only by the host", err, LimitsNone)
		r.logger.Warn("runner refuses every run", fieldError, r.limitsErr.Error())
		return
	}
	r.cgroups = h
}

// LimitsReport says how each task's resources are bounded.
type LimitsReport struct {
	// Enforced is one of hostproto's Limits* values: cgroup2, cgroup1,
	// none (runner.limits is "none") or unavailable (the runner refuses
	// every run, Detail says why).
	Enforced string
	// MemoryBytes, Pids and CPU (cores) are each task's limits; zero where
	// that limit is not set.
	MemoryBytes int64
	Pids        int64
	CPU         float64
	Detail      string
}

// Limits reports how tasks' resources are bounded, for /healthz.
func (r *Runner) Limits() LimitsReport {
	l := r.cfg.Limits
	switch {
	case l.None:
		return LimitsReport{Enforced: hostproto.LimitsNone}
	case r.cgroups == nil:
		return LimitsReport{Enforced: hostproto.LimitsUnavailable, Detail: r.limitsErr.Error()}
	}
	enforced := hostproto.LimitsCgroup2
	if r.cgroups.Version() == cgroups.V1 {
		enforced = hostproto.LimitsCgroup1
	}
	return LimitsReport{Enforced: enforced, MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPU: l.CPU}
}

// openGroup makes the attempt's control group, where limits are enforced;
// every process of the attempt (its clone, its agent and all they start)
// runs in it, and it ends with the attempt (closeGroup).
func (r *Runner) openGroup(t *task) error {
	if r.cgroups == nil {
		return nil
	}
	l := r.cfg.Limits
	g, err := r.cgroups.New(fmt.Sprintf("%s-%d", t.runID, t.attempt), cgroups.Limits{MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPU: l.CPU})
	if err != nil {
		return err
	}
	t.group = g
	return nil
}

// groupFiles are the files a task's init writes itself into, to join the
// attempt's control group before it starts anything.
func (t *task) groupFiles() []string {
	if t.group == nil {
		return nil
	}
	return t.group.ProcsFiles()
}

// joinGroup moves a process the runner started without a sandbox (whose
// init would have joined by itself) into the attempt's control group. What
// it forked before the move stays out: a sandbox's init joins before it
// starts anything, and runs as edge itself (runner.insecureSameUser) are
// bounded as far as this allows.
func (r *Runner) joinGroup(t *task, pid int) {
	if t.group == nil {
		return
	}
	if err := t.group.Join(pid); err != nil {
		r.logs.Error(condLimitsRead, "moving a task into its control group", fieldRun, t.runID, fieldError, err.Error())
	}
}

// watchLimits reads the attempt's control group every limitsPoll until the
// attempt ends.
func (r *Runner) watchLimits(t *task) {
	if t.group == nil {
		return
	}
	var poll func()
	poll = func() {
		t.mu.Lock()
		finished := t.finished
		t.mu.Unlock()
		if !finished && r.checkLimits(t, true) {
			t.addTimer(r.clock.AfterFunc(limitsPoll, poll))
		}
	}
	t.addTimer(r.clock.AfterFunc(limitsPoll, poll))
}

// checkLimits says once in the attempt's events each limit the task
// reached, and ends the attempt oom_killed at its first OOM kill: the
// whole task goes (kill, while its process runs), as cgroup v2's
// memory.oom.group has the kernel do. It reports whether the attempt is
// still to be watched.
func (r *Runner) checkLimits(t *task, kill bool) bool {
	t.mu.Lock()
	g := t.group
	t.mu.Unlock()
	if g == nil {
		return false
	}
	ev, err := g.Events()
	if err != nil {
		t.mu.Lock()
		closed := t.group == nil
		t.mu.Unlock()
		if closed {
			// closeGroup removed it meanwhile, having read it a last time.
			return false
		}
		r.logs.Error(condLimitsRead, "reading a task's control group", fieldRun, t.runID, fieldError, err.Error())
		return true
	}
	l := r.cfg.Limits
	var said []runlog.Entry
	t.mu.Lock()
	if ev.ForksRefused > 0 && !t.saidPids {
		t.saidPids = true
		said = append(said, r.limitEntry(hostproto.LimitReached{Limit: hostproto.LimitPids, Value: l.Pids,
			Detail: fmt.Sprintf("the task reached its limit of %d processes (runner.limits.pids): a fork or thread past it fails with EAGAIN", l.Pids)}))
	}
	oom := ev.OOMKills > 0 && !t.saidMemory
	detail := fmt.Sprintf("the task went past its memory limit of %s (runner.limits.memory) and the kernel killed its process", humanBytes(l.MemoryBytes))
	if oom {
		t.saidMemory = true
		said = append(said, r.limitEntry(hostproto.LimitReached{Limit: hostproto.LimitMemory, Value: l.MemoryBytes,
			Detail: fmt.Sprintf("the task went past its memory limit of %s (runner.limits.memory): the kernel killed a process of it, and the task ends", humanBytes(l.MemoryBytes))}))
		// The reason is set with the flag: a supervise whose own read
		// finds the flag set already (this poll is still recording the
		// event) must still end the attempt oom_killed.
		if t.endReason == "" {
			t.endReason, t.endDetail = hostproto.ReasonOOMKilled, detail
		}
	}
	t.mu.Unlock()
	if len(said) > 0 {
		if err := r.record(t.runID, func() error { _, err := r.log.Append(t.runID, said...); return err }); err != nil {
			r.logs.Error(condRecordOutput, "recording a limit reached", fieldRun, t.runID, fieldError, err.Error())
		}
	}
	if oom && kill {
		r.terminate(t, hostproto.ReasonOOMKilled, detail, true)
	}
	return true
}

// closeGroup reads the attempt's control group a last time (a limit
// reached just before the end is still said, an OOM kill still the
// reason), then ends every process left in it and removes it. It runs
// before the attempt's end is recorded, and again, doing nothing, on the
// way out of its start.
func (r *Runner) closeGroup(t *task) {
	r.checkLimits(t, false)
	t.mu.Lock()
	g := t.group
	t.group = nil
	t.mu.Unlock()
	if g == nil {
		return
	}
	if err := g.Close(); err != nil {
		r.logs.Error(condLimitsRemove, "removing a task's control group", fieldRun, t.runID, fieldError, err.Error())
	}
}

// limitEntry is the event saying a limit was reached, counted as it is
// made (each is said once per attempt).
func (r *Runner) limitEntry(l hostproto.LimitReached) runlog.Entry {
	r.metrics.limitsReached.WithLabelValues(l.Limit).Inc()
	data, _ := json.Marshal(l)
	return runlog.Entry{Type: hostproto.EventLimit, Data: data, TS: r.clock.Now()}
}
