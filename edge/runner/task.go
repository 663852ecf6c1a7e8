package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"

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

// The sizes of a sandboxed task's private /dev/shm and /run/lock (tmpfs,
// so memory). /run/lock holds lock and pid files.
const (
	shmBytes     = 64 << 20
	runLockBytes = 1 << 20
)

// hiddenDirs are where hosts keep their services' Unix sockets (the
// resolver's, which answers from the host's DNS and hosts file, the system
// bus, the journal's, a database's): a sandboxed task sees them empty, so
// that no such socket is a way around its network.
var hiddenDirs = []string{"/run", "/var/run"}

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

// launch runs an admitted attempt: work dir, the final check of its ticket,
// the exec, and the supervision of the process until it ends. Each step
// before the process runs may end the attempt with a startFailure.
func (r *Runner) launch(t *task, tk *ticket) {
	// The ticket goes back when the start ends, either way, before the end
	// is recorded (so whoever sees the run ended sees no ticket held).
	defer tk.release()
	end := func(f *startFailure) {
		tk.release()
		r.finish(t, f.outcome, f.extra...)
	}
	f := r.prepareNetwork(t)
	if t.net != nil {
		defer t.net.Close()
	}
	if f != nil {
		end(f)
		return
	}
	// Every process of the attempt from here on (its clone, its agent)
	// runs in the attempt's control group, which ends with it (finish).
	// One made after a cancel finished the attempt goes on the way out.
	defer r.closeGroup(t)
	cmd, box, f := r.prepareProcess(t)
	if box != nil {
		defer box.Close()
	}
	if f != nil {
		end(f)
		return
	}
	if hook := r.cfg.BeforeExec; hook != nil {
		hook(t.runID)
	}
	ptmx, f := r.execChecked(t, tk, cmd)
	if f != nil {
		end(f)
		return
	}
	tk.release()
	if box == nil {
		r.joinGroup(t, cmd.Process.Pid)
	}
	r.watchLimits(t)
	t.addTimer(r.clock.AfterFunc(r.cfg.MaxDuration, func() {
		r.terminate(t, hostproto.ReasonTimedOut, "the attempt ran longer than runner.maxDuration", false)
	}))
	if box != nil {
		if f := r.awaitSandbox(t, cmd, ptmx, box); f != nil {
			end(f)
			return
		}
	}
	r.markRunning(t, cmd.Process.Pid, box != nil)
	r.supervise(t, cmd, ptmx, box)
}

// startFailure ends an attempt before its process runs: the outcome, and
// the events recorded with it.
type startFailure struct {
	outcome outcome
	extra   []runlog.Entry
}

// hostFault is a start the host failed (host_unavailable); detail says
// what, for the caller, and never holds a path or a cause from the system.
func hostFault(detail string) *startFailure {
	return &startFailure{outcome: outcome{status: hostproto.StatusFailed, reason: hostproto.ReasonHostUnavailable, detail: detail}}
}

// refused is a start refused for ref's reason.
func refused(ref *Refusal, extra ...runlog.Entry) *startFailure {
	return &startFailure{outcome: refusedOutcome(ref), extra: extra}
}

// prepareNetwork makes the task's directories (unless admission already
// did, for a task with secrets) and, where its egress is confined, its
// network (t.net, which the caller closes, even on failure).
func (r *Runner) prepareNetwork(t *task) *startFailure {
	if !t.needsBroker {
		if err := prepareDirs(t.dirs, t.ident, t.spec.LocalPath == ""); err != nil {
			r.logger.Error("preparing a task's directories", fieldRun, t.runID, fieldError, err.Error())
			return hostFault("the host could not prepare the task's directories")
		}
	}
	if !r.egressConfined.Load() || !t.ident.Switch {
		return nil
	}
	n, err := r.openNetwork(t)
	if err != nil {
		if t.ctx.Err() != nil {
			return refused(r.cancelRefusal(t))
		}
		r.logger.Error("creating a task's network", fieldRun, t.runID, fieldError, err.Error())
		return hostFault("the host could not create the task's network")
	}
	t.net = n
	if t.netFiles, err = networkFiles(t.dirs); err != nil {
		r.logger.Error("writing a task's resolver files", fieldRun, t.runID, fieldError, err.Error())
		return hostFault("the host could not create the task's network")
	}
	return nil
}

// prepareProcess readies the agent's process in the attempt's control
// group: its clone, its argv and env, its private tmp and, where edge can
// switch users, its sandbox (returned for the caller to close).
func (r *Runner) prepareProcess(t *task) (*exec.Cmd, *sandbox.Launch, *startFailure) {
	req := t.spec
	if err := r.openGroup(t); err != nil {
		r.logger.Error("creating a task's control group", fieldRun, t.runID, fieldError, err.Error())
		return nil, nil, hostFault("the host could not create the task's control group for runner.limits")
	}
	env := r.taskEnv(t)
	if u := cloneURL(req); u != "" {
		if err := r.clone(t.ctx, t, u, env); err != nil {
			if t.ctx.Err() != nil {
				return nil, nil, refused(r.cancelRefusal(t))
			}
			return nil, nil, refused(&Refusal{Reason: hostproto.ReasonCloneFailed, Detail: err.Error()})
		}
	}
	argv := buildArgv(r.cfg.Agents[req.Agent].Argv, req.Prompt, req.Argv)
	path, err := lookPath(argv[0], envValue(env, "PATH"))
	if err != nil {
		return nil, nil, hostFault("agent " + req.Agent + ": " + err.Error())
	}
	if err := resetPrivateTmp(t.dirs, t.ident); err != nil {
		r.logger.Error("preparing a task's private tmp", fieldRun, t.runID, fieldError, err.Error())
		return nil, nil, hostFault("the host could not prepare the task's directories")
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Dir: t.dirs.Work}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Pdeathsig: syscall.SIGKILL}
	// Where edge can switch users, the task runs in a sandbox of its own:
	// its init (this binary again) starts it in new PID and mount
	// namespaces and drops to the task's user there. As edge itself
	// (runner.insecureSameUser) there is nothing to drop, and the agent
	// starts directly.
	if !t.ident.Switch {
		return cmd, nil, nil
	}
	cmd.Dir = t.dirs.Run
	box, err := sandbox.Prepare(cmd, r.cfg.TaskInit, r.sandboxSpec(t, path, argv))
	if err != nil {
		r.logger.Error("preparing a task's sandbox", fieldRun, t.runID, fieldError, err.Error())
		return nil, nil, hostFault("the host could not start the agent's process")
	}
	return cmd, box, nil
}

// execChecked checks the attempt's ticket a last time and execs its
// process in a terminal. The check and the exec happen under the task's
// lock, which a cancel also takes: a cancel lands either before the check
// (nothing starts) or after the exec (the process is signalled).
func (r *Runner) execChecked(t *task, tk *ticket, cmd *exec.Cmd) (*os.File, *startFailure) {
	t.mu.Lock()
	if ref := tk.check(r, t); ref != nil {
		t.mu.Unlock()
		r.metrics.admission(Decision{Verdict: Refuse, Reason: ref.Reason})
		r.logger.Info("run refused at its ticket's check", fieldRun, t.runID, fieldReason, ref.Reason)
		return nil, refused(ref, admissionEntry(r.clock.Now(), t.attempt, Decision{Verdict: Refuse, Reason: ref.Reason, Detail: ref.Detail}, t.spec.Secrets))
	}
	var ptmx *os.File
	err := t.startIn(func() (err error) {
		ptmx, err = pty.StartWithAttrs(cmd, &pty.Winsize{Rows: terminalRows, Cols: terminalCols}, cmd.SysProcAttr)
		return err
	})
	if err != nil {
		t.mu.Unlock()
		r.logger.Error("starting a task", fieldRun, t.runID, fieldError, err.Error())
		return nil, hostFault("the host could not start the agent's process")
	}
	t.proc, t.pty = cmd.Process, ptmx
	t.mu.Unlock()
	return ptmx, nil
}

// awaitSandbox waits for the task's init to report the agent started. On
// failure whatever the init is doing goes, and nothing of the task started:
// the attempt ends for the reason it was ending for, or as the host's fault.
func (r *Runner) awaitSandbox(t *task, cmd *exec.Cmd, ptmx *os.File, box *sandbox.Launch) *startFailure {
	err := box.Started()
	if err == nil {
		return nil
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Wait()
	t.closeTerminal(ptmx)
	t.mu.Lock()
	endReason := t.endReason
	t.mu.Unlock()
	if endReason != "" {
		return refused(&Refusal{Reason: endReason, Detail: "the attempt ended before its process started"})
	}
	r.logger.Error("starting a task in its sandbox", fieldRun, t.runID, fieldError, err.Error())
	return hostFault("the host could not start the agent's process")
}

// markRunning records that the attempt's process runs, and resolves its
// start.
func (r *Runner) markRunning(t *task, pid int, sandboxed bool) {
	t.mu.Lock()
	t.started = true
	t.mu.Unlock()
	r.metrics.started.Inc()
	now := r.clock.Now()
	if _, err := r.log.Update(t.runID, func(rec *runlog.Record) error {
		rec.Status, rec.UpdatedAt = hostproto.StatusRunning, now
		return nil
	}, stateEntry(now, hostproto.StateChange{Status: hostproto.StatusRunning, Attempt: t.attempt})); err != nil {
		r.logger.Error("recording a start", fieldRun, t.runID, fieldError, err.Error())
	}
	r.logger.Info("run started", fieldRun, t.runID, fieldAttempt, t.attempt, "pid", pid, "sandboxed", sandboxed)
	t.resolveStart(nil)
}

// startIn runs start, which starts a process of the task, so that the
// process lives in the attempt's network where it has one.
func (t *task) startIn(start func() error) error {
	if t.net == nil {
		return start()
	}
	return t.net.Start(start)
}

// sandboxSpec is what the task's init needs: who the task is, its private
// directories (every world-writable directory a host shares: /tmp,
// /var/tmp, /dev/shm, /run/lock), the host's directories of sockets it
// sees empty (hiddenDirs), the directories it must still reach where they
// lie under one of those (its run dir, a localPath), where its
// trust file stands in for the system trust store (a task with secrets,
// whose connections the proxy intercepts), and the agent.
func (r *Runner) sandboxSpec(t *task, path string, argv []string) sandbox.Spec {
	keep := []string{t.dirs.Run}
	if !strings.HasPrefix(t.dirs.Work, t.dirs.Run+"/") {
		keep = append(keep, t.dirs.Work)
	}
	var trust *sandbox.Trust
	if t.needsBroker {
		trust = &sandbox.Trust{File: t.dirs.trustFile(), Replace: sandbox.TrustStoreFiles}
	}
	return sandbox.Spec{
		UID: t.ident.UID, GID: t.ident.GID,
		Private: []sandbox.Mount{{Target: "/tmp", Source: t.dirs.Tmp}, {Target: "/var/tmp", Source: t.dirs.VarTmp}},
		Hide:    hiddenDirs,
		Tmpfs:   []sandbox.Tmpfs{{Target: "/dev/shm", Bytes: shmBytes}, {Target: "/run/lock", Bytes: runLockBytes}},
		Keep:    keep,
		Trust:   trust,
		Files:   t.netFiles,
		Cgroups: t.groupFiles(),
		Dir:     t.dirs.Work,
		Path:    path,
		Argv:    argv,
	}
}

// cancelRefusal is the refusal of an attempt canceled before its process.
func (r *Runner) cancelRefusal(t *task) *Refusal {
	t.mu.Lock()
	defer t.mu.Unlock()
	reason := t.endReason
	if reason == "" {
		reason = hostproto.ReasonCanceled
	}
	return &Refusal{Reason: reason, Detail: "the run was canceled before its process started"}
}

// supervise follows a started process until it and its output end. box
// is its sandbox's init, nil for a task that runs without.
func (r *Runner) supervise(t *task, cmd *exec.Cmd, ptmx *os.File, box *sandbox.Launch) {
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		r.pump(t, ptmx)
	}()
	cmd.Wait()
	// An OOM kill just before the end is still the reason it ended.
	r.checkLimits(t, false)
	status := processExit(cmd.ProcessState)
	if box != nil && !cmd.ProcessState.Sys().(syscall.WaitStatus).Signaled() {
		// The init exited with the agent's status; its report says
		// whether a signal killed the agent.
		if end, ok := box.Ended(); ok {
			status = exitStatus{code: end.Code, signal: syscall.Signal(end.Signal)}
		}
	}
	// Nothing of the task outlives its leader: the rest of its group goes
	// too (a sandboxed task's whole PID namespace went with its init),
	// which also lets the terminal's output end.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if t.ident.Switch {
		// A process that left the group (setsid) still has the run's own
		// group id, which a task cannot shed: it goes too.
		if err := killGroupID(t.ident.GID); err != nil {
			r.logger.Error("ending the processes of a run's group id", fieldRun, t.runID, fieldError, err.Error())
		}
	}
	// And whatever is left in its control group.
	r.closeGroup(t)
	// Anything else holding the terminal open is cut off after the grace.
	cut := r.clock.AfterFunc(r.cfg.CancelGrace, func() { t.closeTerminal(ptmx) })
	<-pumped
	cut.Stop()
	t.closeTerminal(ptmx)
	t.mu.Lock()
	endReason, endDetail := t.endReason, t.endDetail
	t.mu.Unlock()
	r.finish(t, exitOutcome(status, endReason, endDetail))
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

// exitStatus is how a task's process ended: its exit code (128+signal
// when a signal killed it) and that signal, if one did.
type exitStatus struct {
	code   int
	signal syscall.Signal
}

func processExit(ps *os.ProcessState) exitStatus {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitStatus{code: 128 + int(ws.Signal()), signal: ws.Signal()}
	}
	return exitStatus{code: ps.ExitCode()}
}

// exitOutcome is how an attempt ended, from its process's status and the
// reason the runner ended it for, if it did.
func exitOutcome(st exitStatus, endReason, endDetail string) outcome {
	code := st.code
	detail := endDetail
	if st.signal != 0 && detail == "" {
		detail = "killed by " + strings.ToUpper(unixSignalName(st.signal))
	}
	o := outcome{exitCode: &code, detail: detail}
	switch endReason {
	case hostproto.ReasonCanceled, hostproto.ReasonHostShutdown:
		o.status, o.reason = hostproto.StatusCanceled, endReason
	case hostproto.ReasonTimedOut, hostproto.ReasonOutputLimit, hostproto.ReasonStorageFull, hostproto.ReasonOOMKilled:
		o.status, o.reason = hostproto.StatusFailed, endReason
	default:
		o.status = hostproto.StatusSucceeded
		if code != 0 {
			o.status = hostproto.StatusFailed
		}
	}
	return o
}

func unixSignalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "sigterm"
	case syscall.SIGKILL:
		return "sigkill"
	case syscall.SIGINT:
		return "sigint"
	case syscall.SIGHUP:
		return "sighup"
	}
	return s.String()
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
