package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/runfleet/runfleet/edge/cgroups"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// The size of the pseudo-terminal every task gets.
const (
	terminalRows = 40
	terminalCols = 120
)

// inputWriteTimeout bounds a write to a task's terminal, so a task that does
// not read cannot hold an input request forever.
const inputWriteTimeout = 5 * time.Second

// task is one attempt of a run, from its reservation of a slot until it ends.
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

	// ctx ends when the attempt is canceled; it stops a clone in progress.
	ctx  context.Context
	stop context.CancelFunc

	mu        sync.Mutex
	canceled  bool
	endReason string // the first of canceled, host_shutdown, timed_out, output_limit
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

	// inputMu keeps an input's write and its event together, and the
	// terminal open meanwhile: supervise takes it to close the terminal,
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
		ctx: ctx, stop: stop, startDone: make(chan struct{}), done: make(chan struct{}), recorded: make(chan struct{}),
	}
}

// markRecorded closes t.recorded; ok: the run's record names t's attempt.
// Only the first call counts.
func (t *task) markRecorded(ok bool) {
	t.recordedOnce.Do(func() {
		t.recordedOK = ok
		close(t.recorded)
	})
}

func (t *task) resolveStart(err error) {
	t.startOnce.Do(func() {
		t.startErr = err
		close(t.startDone)
	})
}

func (t *task) addTimer(tm clock.Timer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished {
		tm.Stop()
		return
	}
	t.timers = append(t.timers, tm)
}

// outcome is how an attempt ended.
type outcome struct {
	status   string
	exitCode *int
	reason   string
	detail   string
}

func refusedOutcome(ref *Refusal) outcome {
	status := hostproto.StatusFailed
	if ref.Reason == hostproto.ReasonCanceled || ref.Reason == hostproto.ReasonHostShutdown {
		status = hostproto.StatusCanceled
	}
	return outcome{status: status, reason: ref.Reason, detail: ref.Detail}
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
	t.stop()
	close(t.done)
	r.wg.Done()
}

// pump turns the terminal's output into events until it ends, up to
// runner.maxOutputBytes; past it the task is killed (output_limit). Output
// that cannot be recorded is counted, and said so in an event at its end.
func (r *Runner) pump(t *task, ptmx *os.File) {
	buf := make([]byte, hostproto.MaxEventData)
	chunks := runlog.NewChunker(hostproto.MaxEventData)
	var total int64
	limited := false
	var out outputRecord
	for {
		n, err := ptmx.Read(buf)
		if n > 0 && !limited {
			data := buf[:n]
			if room := r.cfg.MaxOutputBytes - total; int64(n) > room {
				data, limited = data[:room], true
			}
			total += int64(len(data))
			r.appendOutput(t, &out, chunks.Write(data))
			if limited {
				r.terminate(t, hostproto.ReasonOutputLimit, fmt.Sprintf("the attempt wrote more than runner.maxOutputBytes (%d bytes)", r.cfg.MaxOutputBytes), true)
			}
		}
		if err != nil {
			break
		}
	}
	r.appendOutput(t, &out, chunks.Flush())
	r.recordUnrecorded(t, &out)
}

// outputRecord is how an attempt's output fared in the run log; it belongs
// to the attempt's pump.
type outputRecord struct {
	// stopped: the data dir has no room for more output (it would fall
	// under the space kept for ends, or a write was refused for want of
	// space), and no more of this attempt's output is recorded.
	stopped bool
	// unrecorded bytes of output, and why the first of them were not.
	unrecorded int64
	cause      string
}

// appendOutput records texts as output events. Output that would take the
// data dir under the part of the reserve kept for ends is not recorded:
// its attempt stops recording and is killed (storage_full), so that its
// end, and what others' ends need, can still be written.
func (r *Runner) appendOutput(t *task, out *outputRecord, texts []string) {
	if len(texts) == 0 {
		return
	}
	var size int64
	for _, s := range texts {
		size += int64(len(s))
	}
	if out.stopped {
		out.unrecorded += size
		return
	}
	// Twice the text: its JSON escaping and the run log's pages (bbolt
	// copies what it changes) take about as much again.
	if free, err := r.logDisk.FreeBytes(); err == nil && free-2*size < endReserveBytes(r.cfg.MinFreeBytes) {
		r.stopRecording(t, out, size, fmt.Sprintf("recording more output would take the host's data dir (%s free) under the %s its reserve (runner.minFreeBytes, %s) keeps for recording runs' ends",
			humanBytes(free), humanBytes(endReserveBytes(r.cfg.MinFreeBytes)), humanBytes(r.cfg.MinFreeBytes)))
		return
	}
	now := r.clock.Now()
	entries := make([]runlog.Entry, len(texts))
	for i, s := range texts {
		data, _ := json.Marshal(s)
		entries[i] = runlog.Entry{Type: hostproto.EventOutput, Data: data, TS: now}
	}
	_, err := r.log.Append(t.runID, entries...)
	if err == nil {
		return
	}
	if noSpace(err) {
		r.stopRecording(t, out, size, "the host's data dir is full")
		return
	}
	// Another failure may pass: the output goes on being tried, and what
	// is lost is counted.
	r.logs.Error(condRecordOutput, "recording output", fieldRun, t.runID, fieldError, err.Error())
	out.unrecorded += size
	if out.cause == "" {
		out.cause = "the host could not write its run log"
	}
}

// stopRecording ends the recording of the attempt's output, and the
// attempt with it: storage_full, its process group killed at once.
func (r *Runner) stopRecording(t *task, out *outputRecord, size int64, cause string) {
	out.stopped, out.cause = true, cause
	out.unrecorded += size
	r.logs.Warn(condOutputStopped, "a run's output can no longer be recorded: ending it storage_full", fieldRun, t.runID, fieldReason, cause)
	r.terminate(t, hostproto.ReasonStorageFull, cause+": the run's output could no longer be recorded", true)
}

// recordUnrecorded writes, once the attempt's output has ended, one event
// saying how much of it was not recorded and why, and puts the count in
// the end's detail of a run ended storage_full.
func (r *Runner) recordUnrecorded(t *task, out *outputRecord) {
	if out.unrecorded == 0 {
		return
	}
	t.mu.Lock()
	if t.endReason == hostproto.ReasonStorageFull {
		t.endDetail += fmt.Sprintf(" (%d bytes not recorded)", out.unrecorded)
	}
	t.mu.Unlock()
	entry := r.limitEntry(hostproto.LimitReached{Limit: hostproto.LimitStorage, UnrecordedBytes: out.unrecorded,
		Detail: fmt.Sprintf("%d bytes of output were not recorded: %s", out.unrecorded, out.cause)})
	if err := r.record(t.runID, func() error { _, err := r.log.Append(t.runID, entry); return err }); err != nil {
		r.logs.Error(condRecordOutput, "recording that output was not recorded", fieldRun, t.runID, fieldError, err.Error())
	}
}

// terminate ends a running attempt for reason: SIGKILL to its group at once
// when hard, else SIGTERM and SIGKILL after the grace. The first reason wins.
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
// subscription and the slot, and records the outcome with its state event
// (after any extra events). It runs once; later calls do nothing.
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

// writeInput writes the input, with a newline, to the task's terminal and
// then records it: an input event is one the task's terminal took.
func (t *task) writeInput(r *Runner, text string) error {
	t.inputMu.Lock()
	defer t.inputMu.Unlock()
	t.mu.Lock()
	ptmx, finished := t.pty, t.finished
	t.mu.Unlock()
	if ptmx == nil || finished {
		return ErrNotRunning
	}
	// The deadline is the OS's, on real time: it only bounds a stuck write.
	ptmx.SetWriteDeadline(time.Now().Add(inputWriteTimeout))
	if _, err := ptmx.Write([]byte(text + "\n")); err != nil {
		if errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EIO) {
			return ErrNotRunning
		}
		return fmt.Errorf("runner: writing input to run %s: %w", t.runID, err)
	}
	data, _ := json.Marshal(text)
	if _, err := r.log.Append(t.runID, runlog.Entry{Type: hostproto.EventInput, Data: data, TS: r.clock.Now()}); err != nil {
		return err
	}
	return nil
}

// closeTerminal closes the attempt's terminal once no input is being
// written to it (see inputMu).
func (t *task) closeTerminal(ptmx *os.File) {
	t.inputMu.Lock()
	defer t.inputMu.Unlock()
	ptmx.Close()
}

func stateEntry(ts time.Time, s hostproto.StateChange) runlog.Entry {
	data, _ := json.Marshal(s)
	return runlog.Entry{Type: hostproto.EventState, Data: data, TS: ts}
}
