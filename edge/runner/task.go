package runner

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/edge/cgroups"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// A task: one attempt of a run, its state, and its place in Runner.live,
// from its reservation (reserve) to its end (finish, end.go) or its giving
// up (unreserve). A run has at most one live attempt not yet ended
// (task.ended).

// task is one attempt of a run, from its reservation until it ends.
type task struct {
	// runID, attempt and needsBroker are fixed before the task is published
	// in Runner.live, so a cancel may read them at any time.
	runID       string
	attempt     int
	needsBroker bool
	// purging: this is no attempt but the purge holding the run while it
	// removes it (see purgeRun); verbs find no live attempt.
	purging bool
	// rec, spec (its start), ident and dirs belong to the goroutine
	// starting the attempt.
	rec   runlog.Record
	spec  Spec
	ident taskIdentity
	dirs  taskDirs
	// declared is spec's secrets as the broker grants from them, read once
	// per attempt (Start's validation, or a retry's read of the stored
	// request); declareErr is why a stored request could not be read so.
	declared   []runspec.Declared
	declareErr error
	// credentials are the values Fleet sent with the run's start, held
	// only until prepare hands them to the broker; credentialsComplete:
	// this attempt is the run's start, which carries a value for every key
	// the policy takes from Fleet (a retry's carries none: the broker holds
	// the run's values, or Fleet sends them again). Both belong to the
	// goroutine admitting the attempt.
	credentials         []Credential
	credentialsComplete bool

	// ctx ends once the attempt is canceled or ends; it stops a clone in
	// progress.
	ctx  context.Context
	stop context.CancelFunc

	mu        sync.Mutex
	canceled  bool
	endReason string // the first of canceled, host_shutdown, timed_out, output_limit, storage_full, oom_killed
	endDetail string
	proc      *os.Process
	pty       *os.File
	started   bool
	finished  bool
	brokerOn  bool // the broker minted this attempt's password
	holdsSlot bool // a concurrency slot, taken and given back under Runner.mu
	secrets   TaskSecrets
	proxyURL  string
	unwatch   func() error
	timers    []clock.Timer
	// net is the attempt's network (package sandbox), nil where tasks'
	// egress is not confined, and netFiles the resolver files its sandbox
	// mounts; they belong to the goroutine starting the attempt, which
	// closes net once the process has ended.
	net      *sandbox.Network
	netFiles []sandbox.Mount
	// group is the attempt's control group (package cgroups), nil where
	// limits are "none"; saidPids and saidMemory: the limit was said in
	// the attempt's events. Under mu once the process runs.
	group                *cgroups.Group
	saidPids, saidMemory bool

	startOnce sync.Once
	startDone chan struct{}
	startErr  error
	// recorded closes once the run's record names this attempt
	// (recordedOK), or once the attempt was given up before it did: a
	// verb answers for an attempt only then, since until its record is
	// written the run as stored is the previous attempt.
	recorded     chan struct{}
	recordedOK   bool
	recordedOnce sync.Once
	// decided closes once admission has decided the attempt (admittedOK:
	// admitted, and so registered with the broker when it needs it), or
	// once the attempt was given up before: values from Fleet for the run
	// (PutCredentials) wait for it, since the broker holds them only for a
	// registered run.
	decided     chan struct{}
	admittedOK  bool
	decidedOnce sync.Once

	// inputMu keeps an input's write and its event together, and the
	// terminal open meanwhile: closeTerminal takes it to close the terminal,
	// so an input is either written and recorded before the attempt's
	// end, or refused and not recorded.
	inputMu sync.Mutex

	// ended: finish is recording the attempt's end, or has. The task
	// holds nothing then but its last bookkeeping, so it yields its place
	// in Runner.live to the run's next attempt.
	ended atomic.Bool
	done  chan struct{}
}

// newTask is the attempt rec.Attempt of the run rec, not yet published.
func newTask(rec runlog.Record) *task {
	ctx, stop := context.WithCancel(context.Background())
	return &task{
		runID: rec.RunID, attempt: rec.Attempt, needsBroker: len(rec.Request.Secrets) > 0, rec: rec, spec: specOf(rec.Request),
		ctx: ctx, stop: stop, startDone: make(chan struct{}), done: make(chan struct{}), recorded: make(chan struct{}), decided: make(chan struct{}),
	}
}

// markDecided closes t.decided; ok: the attempt was admitted. Only the
// first call counts.
func (t *task) markDecided(ok bool) {
	t.decidedOnce.Do(func() {
		t.admittedOK = ok
		close(t.decided)
	})
}

// markRecorded closes t.recorded; ok: the run's record names t's attempt.
// Only the first call counts.
func (t *task) markRecorded(ok bool) {
	t.recordedOnce.Do(func() {
		t.recordedOK = ok
		close(t.recorded)
	})
}

// resolveStart answers WaitForStart with err, nil once the process runs.
// Only the first call counts.
func (t *task) resolveStart(err error) {
	t.startOnce.Do(func() {
		t.startErr = err
		close(t.startDone)
	})
}

// addTimer keeps tm for finish to stop; one added after finish is stopped
// at once.
func (t *task) addTimer(tm clock.Timer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished {
		tm.Stop()
		return
	}
	t.timers = append(t.timers, tm)
}

// reserve makes the attempt rec.Attempt of the run live: no other attempt
// of the run may begin, and a cancel finds it. It takes no concurrency
// slot: admission does, in begin, so starts that lose a clientToken race
// never count.
func (r *Runner) reserve(rec runlog.Record) (*task, error) {
	t := newTask(rec)
	return t, r.publish(t)
}

// publish makes t the run's live attempt, unless the run has one or the
// runner is shutting down. An attempt whose end is recorded is no longer
// the run's live one, though it is still leaving: whoever saw the end may
// retry at once.
func (r *Runner) publish(t *task) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrDraining
	}
	if old := r.live[t.runID]; old != nil && !old.ended.Load() {
		return ErrNotRetryable
	}
	r.live[t.runID] = t
	r.wg.Add(1)
	return nil
}

// unreserve ends an attempt that never began.
func (r *Runner) unreserve(t *task) {
	r.mu.Lock()
	if r.live[t.runID] == t {
		delete(r.live, t.runID)
	}
	r.mu.Unlock()
	t.markRecorded(false)
	t.markDecided(false)
	t.stop()
	close(t.done)
	r.wg.Done()
}

// stateEntry is a state event: the run's status as an attempt moves through
// admitted, running and its end.
func stateEntry(ts time.Time, s hostproto.StateChange) runlog.Entry {
	data, _ := json.Marshal(s)
	return runlog.Entry{Type: hostproto.EventState, Data: data, TS: ts}
}
