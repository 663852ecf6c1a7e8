package runner

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"unsafe"

	"github.com/runfleet/runfleet/shared/hostproto"
)

// onMessage is a log handler that calls hook, on the logging goroutine,
// with the run id of each record whose message is msg.
type onMessage struct {
	slog.Handler
	msg  string
	hook func(runID string)
}

func (h onMessage) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Message == h.msg {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == fieldRun {
				h.hook(a.Value.String())
			}
			return true
		})
	}
	return h.Handler.Handle(ctx, rec)
}

// unmodelledWait is a one-shot wake-up through a pipe with raw read and
// write syscalls, which the race detector does not see as synchronization:
// what happens before done and after wait stays unordered for it, so two
// accesses on either side are judged on their own, deterministically.
type unmodelledWait [2]int

func newUnmodelledWait(t *testing.T) *unmodelledWait {
	var w unmodelledWait
	if err := syscall.Pipe2(w[:], syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(w[0]); syscall.Close(w[1]) })
	return &w
}

func (w *unmodelledWait) done() {
	b := [1]byte{1}
	syscall.Syscall(syscall.SYS_WRITE, uintptr(w[1]), uintptr(unsafe.Pointer(&b[0])), 1)
}

func (w *unmodelledWait) wait() {
	var b [1]byte
	for {
		// The runtime's preemption signals interrupt the read.
		n, _, errno := syscall.Syscall(syscall.SYS_READ, uintptr(w[0]), uintptr(unsafe.Pointer(&b[0])), 1)
		if n == 1 || errno != syscall.EINTR {
			return
		}
	}
}

// A cancel can land while an attempt is being admitted: a second POST /runs
// with the run's clientToken, or the answer to a retry, hands out the run
// id as soon as the attempt is live, before admission has run. Here the
// cancel lands right after the attempt became live (the "run created" or
// "run retried" line), and admission goes on once it has returned: under
// -race this fails if admission writes anything the cancel reads, and the
// run must end canceled with no process started.
func TestCancelDuringAdmission(t *testing.T) {
	for _, tc := range []struct{ name, msg string }{{"start", "run created"}, {"retry", "run retried"}} {
		t.Run(tc.name, func(t *testing.T) {
			wake := newUnmodelledWait(t)
			var h *harness
			armed := false
			h = newHarness(t, func(c *Config) {
				c.Logger = slog.New(onMessage{Handler: slog.NewTextHandler(io.Discard, nil), msg: tc.msg, hook: func(runID string) {
					if !armed {
						return
					}
					go func() {
						if _, err := h.r.Cancel(runID); err != nil {
							t.Errorf("cancel during admission: %v", err)
						}
						wake.done()
					}()
					wake.wait()
				}})
			})
			var runID string
			if tc.name == "retry" {
				runID = h.start(`exit 1`, nil).RunID
				h.waitEnd(runID)
				armed = true
				if _, err := h.r.Retry(runID); err != nil {
					t.Fatal(err)
				}
			} else {
				armed = true
				runID = h.start(`exit 1`, nil).RunID
			}
			end := h.waitEnd(runID)
			if end.Status != hostproto.StatusCanceled || end.Reason != hostproto.ReasonCanceled {
				t.Fatalf("a run canceled during its admission ended %+v", end)
			}
			want := 0.0
			if tc.name == "retry" {
				want = 1 // the first attempt's
			}
			if got := h.processesStarted(); got != want {
				t.Fatalf("%v processes started, want %v", got, want)
			}
		})
	}
}
