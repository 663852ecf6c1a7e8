package runner

import (
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/creack/pty"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// An admitted attempt's launch, step by step up to its running process:
// its network and directories, its control group, its process (clone, argv,
// private tmp, sandbox), the ticket's last check with the exec, and the
// sandbox's report. A step that fails ends the attempt with a startFailure;
// once the process runs, supervise has it until it ends.

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
	t.mu.Lock()
	knownHosts := t.secrets.SSHKnownHosts
	t.mu.Unlock()
	if t.netFiles, err = networkFiles(t.dirs, knownHosts); err != nil {
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
		t.mu.Lock()
		env = append(env, gitCredentialEnv(u, t.declared, t.secrets.Placeholders, env)...)
		t.mu.Unlock()
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
