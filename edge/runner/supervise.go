package runner

import (
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// A running attempt's supervision, until its process ends: what it leaves
// behind is killed, its output drained, and the attempt finished with the
// outcome its exit status and the runner's reason for ending it make.

// supervise follows a started process until it and its output end, then
// finishes the attempt. box is its sandbox's init, nil for a task that runs
// without.
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
