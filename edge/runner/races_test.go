package runner

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// Races between verbs, the end of an attempt, the purge and shutdown, each
// interleaving held open deterministically (a gate on the clock, a hook,
// a goroutine seen blocked where it waits).

// gateClock is a clock whose next Now, once armed, waits for release: it
// holds the caller at the one point where the runner reads the time.
type gateClock struct {
	clock.Clock
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newGateClock(c clock.Clock) *gateClock {
	return &gateClock{Clock: c, entered: make(chan struct{}), release: make(chan struct{})}
}

func (c *gateClock) Now() time.Time {
	if c.armed.CompareAndSwap(true, false) {
		close(c.entered)
		<-c.release
	}
	return c.Clock.Now()
}

// An input racing the attempt's end is either written and recorded before
// the end, or refused and not recorded: the terminal stays open while an
// input is being written. Input is held after its write (at its clock
// read) while a cancel ends the process; the end waits for it.
func TestAnInputRacingTheEndIsRecordedBeforeItOrNotAtAll(t *testing.T) {
	gate := newGateClock(clock.Real{})
	h := newHarness(t, func(c *Config) { c.Clock = gate })
	// No echo: the terminal's echo of the input would be output, whose
	// event reads the clock, and the gate must hold Input alone.
	run := h.start(`stty -echo; echo up; sleep 1000`, nil)
	h.waitOutput(run.RunID, "up")

	gate.armed.Store(true)
	answered := make(chan error, 1)
	go func() {
		_, err := h.r.Input(run.RunID, json.RawMessage(`"late"`))
		answered <- err
	}()
	await.Recv(t, "Input to write to the terminal", gate.entered)
	if _, err := h.r.Cancel(run.RunID); err != nil {
		t.Fatal(err)
	}
	waitBlockedIn(t, "the ending attempt to wait for the input before closing its terminal", "(*task).closeTerminal")
	close(gate.release)
	inputErr := await.Recv(t, "Input to answer", answered)
	end := h.waitEnd(run.RunID)

	terminalAt, inputAt := -1, -1
	for i, e := range h.events(run.RunID) {
		switch e.Type {
		case hostproto.EventState:
			var s hostproto.StateChange
			json.Unmarshal(e.Data, &s)
			if hostproto.TerminalStatus(s.Status) {
				terminalAt = i
			}
		case hostproto.EventInput:
			inputAt = i
		}
	}
	if inputErr != nil || inputAt < 0 || inputAt > terminalAt {
		t.Fatalf("Input answered %v; its event at #%d, the end (%s) at #%d: want it taken and recorded before the end", inputErr, inputAt, end.Status, terminalAt)
	}
}

// A resume (POST /host/resume) during Shutdown changes nothing: the host
// still says it is draining, as every start is refused, and an attempt
// admitted before the shutdown is refused at its ticket's check rather
// than start a process during it.
func TestResumeDuringShutdownKeepsTheHostDraining(t *testing.T) {
	type seen struct {
		draining bool
		startErr error
	}
	got := make(chan seen, 1)
	shutDown := make(chan error, 1)
	var h *harness
	h = newHarness(t, func(c *Config) {
		c.BeforeExec = func(string) {
			go func() { shutDown <- h.r.Shutdown(context.Background(), time.Minute) }()
			await.Cond(t, 10*time.Second, "the shutdown to close the runner", func() bool {
				h.r.mu.Lock()
				defer h.r.mu.Unlock()
				return h.r.closed
			})
			h.r.Resume() // POST /host/resume
			_, err := h.r.Start(Spec{ClientToken: "during-shutdown", Request: runspec.Request{Agent: "shell", Prompt: "true"}})
			got <- seen{draining: h.r.Draining(), startErr: err}
		}
	})
	run := h.start(`true`, nil)
	s := await.Recv(t, "the hook's view during the shutdown", got)
	if err := await.Recv(t, "Shutdown to return", shutDown); err != nil {
		t.Fatal(err)
	}
	end, err := h.r.Get(run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if !s.draining && errors.Is(s.startErr, ErrDraining) {
		t.Errorf("during shutdown, after a resume: Draining() = false (healthz draining:false) but a start = %v", s.startErr)
	}
	if h.processesStarted() != 0 {
		t.Errorf("an attempt admitted before the shutdown started its process during it (run ended %+v)", end)
	}
}

// A retry whose run is purged between its first read and its update is
// ErrNotFound (404 run_not_found, which Fleet acts on), not a fault. The
// retry is held between its read and its reservation (on Runner.mu, in
// Draining) while the run's record is removed as the purge removes it.
func TestRetryOfARunPurgedMeanwhileIsNotFound(t *testing.T) {
	h := newHarness(t, nil)
	run := h.start(`true`, nil)
	h.waitEnd(run.RunID)

	h.r.mu.Lock()
	answered := make(chan error, 1)
	go func() {
		_, err := h.r.Retry(run.RunID)
		answered <- err
	}()
	waitBlockedIn(t, "the retry to read the run and wait in Draining", "(*Runner).Draining", "(*Runner).Retry")
	if err := h.log.Delete(run.RunID); err != nil { // what purgeRun removes
		t.Fatal(err)
	}
	h.r.mu.Unlock()
	if err := await.Recv(t, "the retry to answer", answered); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a retry of a run purged meanwhile = %v, want ErrNotFound (404 run_not_found)", err)
	}
}

// Shutdown stops the purge's timer, but a pass already under way cannot
// be stopped: Shutdown waits for it, so nothing reads the run log once it
// returns (the host closes the log then). The pass is held at its first
// clock read until Shutdown is seen waiting.
func TestNoPurgePassOutlivesShutdown(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	gate := newGateClock(fake)
	logs := &syncbuf.Buffer{}
	h := newHarness(t, func(c *Config) {
		c.Clock = gate
		c.Retention = time.Hour
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	r := h.r
	await.Recv(t, "the purge to be armed", fake.WaitForTimers(1))
	gate.armed.Store(true)
	fake.Advance(time.Hour)
	await.Recv(t, "a purge pass to begin", gate.entered)
	shutDown := make(chan error, 1)
	go func() { shutDown <- r.Shutdown(context.Background(), 0) }()
	waitBlockedIn(t, "Shutdown to wait for the pass", "[select]:", "(*Runner).Shutdown(")
	select {
	case err := <-shutDown:
		t.Fatalf("Shutdown returned (%v) while a purge pass was under way", err)
	default:
	}
	close(gate.release)
	if err := await.Recv(t, "Shutdown to return after the pass", shutDown); err != nil {
		t.Fatal(err)
	}
	if n := counterValue(t, r.metrics.purgePasses); n != 1 {
		t.Fatalf("Shutdown returned with the purge pass under way (%v passes done)", n)
	}
	h.close()
	if strings.Contains(logs.String(), "purge") {
		t.Fatalf("the purge logged around the shutdown:\n%s", logs.String())
	}
}

// A cancel arriving while a retry's attempt is reserved but its record
// not yet written answers for that attempt (the record written first),
// never with the previous attempt's end. The gate holds Retry at its
// clock read, between the two.
func TestACancelDuringARetrysReservationAnswersForTheNewAttempt(t *testing.T) {
	gate := newGateClock(clock.Real{})
	h := newHarness(t, func(c *Config) { c.Clock = gate })
	run := h.start(`true`, nil)
	h.waitEnd(run.RunID)

	gate.armed.Store(true)
	retried := make(chan error, 1)
	go func() {
		_, err := h.r.Retry(run.RunID)
		retried <- err
	}()
	await.Recv(t, "the retry to hold the run's live slot, its record not written", gate.entered)
	type answer struct {
		run Run
		err error
	}
	canceled := make(chan answer, 1)
	go func() {
		r, err := h.r.Cancel(run.RunID)
		canceled <- answer{r, err}
	}()
	waitBlockedIn(t, "the cancel to wait for the retry's record", "[chan receive]:", "(*Runner).Cancel(")
	close(gate.release)
	if err := await.Recv(t, "the retry to answer", retried); err != nil {
		t.Fatal(err)
	}
	a := await.Recv(t, "the cancel to answer", canceled)
	if a.err != nil || a.run.Attempt != 2 || hostproto.TerminalStatus(a.run.Status) {
		t.Fatalf("cancel answered %+v, %v; want attempt 2, not yet ended", a.run, a.err)
	}
	if end := h.waitEnd(run.RunID); end.Attempt != 2 || end.Status != hostproto.StatusCanceled {
		t.Fatalf("the retried run ended %+v, want attempt 2 canceled", end)
	}
}

// waitBlockedIn waits until some goroutine's stack holds every one of
// frames: the way a test knows a goroutine it cannot otherwise observe has
// reached the point it waits at.
func waitBlockedIn(t *testing.T, what string, frames ...string) {
	t.Helper()
	await.Cond(t, 10*time.Second, what, func() bool {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(stacks, "\n\n") {
			all := true
			for _, f := range frames {
				all = all && strings.Contains(g, f)
			}
			if all {
				return true
			}
		}
		return false
	})
}
