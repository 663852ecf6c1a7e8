package runner

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// A task's terminal: its size, the input written to it, and its closing.
// inputMu orders an input against the close, so an input is either written
// and recorded before the attempt's end, or refused and not recorded.

// The size of the pseudo-terminal every task gets.
const (
	terminalRows = 40
	terminalCols = 120
)

// inputWriteTimeout bounds a write to a task's terminal, so a task that does
// not read cannot hold an input request forever.
const inputWriteTimeout = 5 * time.Second

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
