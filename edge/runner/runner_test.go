package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// sharedDir is a temp dir outside /tmp and /var/tmp, which a sandboxed
// task has its own of, that nobody can enter and write: a task's marker
// written there is seen by the test.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := edgetest.HostDir(t)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

type harness struct {
	t      *testing.T
	r      *Runner
	log    *runlog.Log
	dbPath string
	cfg    Config
}

func newHarness(t *testing.T, change func(*Config)) *harness {
	t.Helper()
	edgetest.RequireRoot(t)
	cfg := Config{
		Agents: map[string]Agent{
			"shell": {Argv: []string{"sh", "-c", "{prompt}"}},
		},
		WorkDir: filepath.Join(edgetest.TraversableDir(t), "work"),
	}
	if change != nil {
		change(&cfg)
	}
	h := &harness{t: t, cfg: cfg, dbPath: filepath.Join(t.TempDir(), "runs.db")}
	h.open(nil, nil)
	return h
}

func (h *harness) open(b Broker, ts TrustSource) {
	h.t.Helper()
	l, err := runlog.Open(h.dbPath, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	r, err := New(h.cfg, l, b, ts)
	if err != nil {
		l.Close()
		h.t.Fatal(err)
	}
	h.r, h.log = r, l
	h.t.Cleanup(h.close)
}

func (h *harness) close() {
	if h.r == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.r.Shutdown(ctx, 0)
	h.log.Close()
	h.r = nil
}

var tokens atomic.Int64

func (h *harness) start(prompt string, change func(*Spec)) Run {
	h.t.Helper()
	req := Spec{ClientToken: fmt.Sprintf("tok-%d", tokens.Add(1)), Request: runspec.Request{Agent: "shell", Prompt: prompt}}
	if change != nil {
		change(&req)
	}
	run, err := h.r.Start(req)
	if err != nil {
		h.t.Fatalf("start: %v", err)
	}
	return run
}

// waitEnd polls (on real time: it waits for a real process) until the run's
// attempt has ended.
func (h *harness) waitEnd(runID string) Run {
	h.t.Helper()
	var run Run
	if !await.Within(20*time.Second, func() bool {
		var err error
		if run, err = h.r.Get(runID); err != nil {
			h.t.Fatal(err)
		}
		return hostproto.TerminalStatus(run.Status) && h.r.liveTask(runID) == nil
	}) {
		h.t.Fatalf("run %s still %s", runID, run.Status)
	}
	return run
}

// waitOutput polls until the run's output contains want.
func (h *harness) waitOutput(runID, want string) string {
	h.t.Helper()
	var out string
	if !await.Within(20*time.Second, func() bool { out = h.output(runID); return strings.Contains(out, want) }) {
		h.t.Fatalf("run %s output never contained %q; it is %q", runID, want, out)
	}
	return out
}

// events are the run's events as the host API serves them (the run log's
// stored events are the wire's, field for field), for edgetest's readers.
func (h *harness) events(runID string) []hostproto.Event {
	h.t.Helper()
	var all []hostproto.Event
	after := int64(0)
	for {
		page, err := h.r.Events(runID, after, MaxEventPage)
		if err != nil {
			h.t.Fatal(err)
		}
		for _, e := range page.Events {
			all = append(all, hostproto.Event(e))
		}
		after = page.NextCursor
		if !page.HasMore {
			return all
		}
	}
}

func (h *harness) output(runID string) string { return edgetest.Output(h.events(runID)) }

func (h *harness) states(runID string) []hostproto.StateChange {
	var out []hostproto.StateChange
	for _, e := range h.events(runID) {
		if e.Type == hostproto.EventState {
			var s hostproto.StateChange
			json.Unmarshal(e.Data, &s)
			out = append(out, s)
		}
	}
	return out
}

func (h *harness) processesStarted() float64 {
	return counterValue(h.t, h.r.metrics.started)
}

func TestRunSucceedsAsTheTaskUserWithItsOutputAsEvents(t *testing.T) {
	h := newHarness(t, nil)
	run := h.start(`echo "uid=$(id -u) gid=$(id -g) groups=$(id -G) pwd=$PWD"; printf 'é€𝄞 done\n'`, nil)
	if run.Status != hostproto.StatusAdmitted || run.Attempt != 1 || run.RunID == "" {
		t.Fatalf("start answered %+v", run)
	}
	if err := h.r.WaitForStart(context.Background(), run.RunID); err != nil {
		t.Fatalf("WaitForStart: %v", err)
	}
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusSucceeded || end.ExitCode == nil || *end.ExitCode != 0 {
		t.Fatalf("run ended %+v", end)
	}
	out := h.output(run.RunID)
	rec, _ := h.log.Get(run.RunID)
	gid := h.r.taskGroup(rec.Serial)
	if gid < DefaultTaskGroupFirst || gid >= DefaultTaskGroupFirst+DefaultTaskGroupCount {
		t.Fatalf("the run's group %d is outside the default range", gid)
	}
	want := fmt.Sprintf("uid=65534 gid=%d groups=%d pwd=%s", gid, gid, filepath.Join(h.cfg.WorkDir, run.RunID, "work"))
	if !strings.Contains(out, want) {
		t.Fatalf("output %q lacks %q", out, want)
	}
	if !strings.Contains(out, "é€𝄞 done") {
		t.Fatalf("output %q lost its UTF-8", out)
	}
	for _, d := range []string{"home", "work"} {
		fi, err := os.Stat(filepath.Join(h.cfg.WorkDir, run.RunID, d))
		if err != nil || fi.Mode()&os.ModeSetgid == 0 || fi.Mode().Perm() != 0o770 {
			t.Fatalf("the task's %s dir: %v %v, want setgid 2770", d, fi.Mode(), err)
		}
	}
	var statuses []string
	for _, s := range h.states(run.RunID) {
		statuses = append(statuses, s.Status)
	}
	if strings.Join(statuses, ",") != "admitted,running,succeeded" {
		t.Fatalf("state events %v", statuses)
	}
	for i, e := range h.events(run.RunID) {
		if e.Sequence != int64(i+1) {
			t.Fatalf("event %d has sequence %d", i, e.Sequence)
		}
	}
}

func TestExitCodeAndEnvFromScratch(t *testing.T) {
	t.Setenv("EDGE_ONLY", "x")
	h := newHarness(t, nil)
	run := h.start(`env; exit 3`, func(r *Spec) { r.Env = map[string]string{"GREETING": "hi there"} })
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusFailed || end.ExitCode == nil || *end.ExitCode != 3 || end.Reason != "" {
		t.Fatalf("run ended %+v", end)
	}
	out := h.output(run.RunID)
	if !strings.Contains(out, "GREETING=hi there") || !strings.Contains(out, "USER=nobody") {
		t.Fatalf("env lacks the run's variables: %q", out)
	}
	if strings.Contains(out, "EDGE_ONLY") || strings.Contains(out, "HTTPS_PROXY") {
		t.Fatalf("env carries what it should not: %q", out)
	}
}

func TestInputReachesTheTerminal(t *testing.T) {
	h := newHarness(t, nil)
	run := h.start(`read a; read b; echo "got:$a:$b"`, nil)
	if err := h.r.WaitForStart(context.Background(), run.RunID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Input(run.RunID, json.RawMessage(`"hello world"`)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Input(run.RunID, json.RawMessage(`{"k": [1, 2]}`)); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(run.RunID)
	if out := h.output(run.RunID); !strings.Contains(out, `got:hello world:{"k":[1,2]}`) {
		t.Fatalf("output %q", out)
	}
	var inputs []string
	for _, e := range h.events(run.RunID) {
		if e.Type == hostproto.EventInput {
			var s string
			json.Unmarshal(e.Data, &s)
			inputs = append(inputs, s)
		}
	}
	if len(inputs) != 2 || inputs[0] != "hello world" {
		t.Fatalf("input events %q", inputs)
	}
	if _, err := h.r.Input(run.RunID, json.RawMessage(`"late"`)); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("input to an ended run = %v, want ErrNotRunning", err)
	}
}

// A run whose end is recorded is over for every verb, even in the moment
// before its attempt leaves the live set: a cancel or input then is
// ErrNotRunning (never an accepted cancel of a run that already
// succeeded), and a retry starts the next attempt (never "not retryable"
// for a run its caller just saw end).
func TestVerbsRightAfterTheEndIsRecordedSeeItEnded(t *testing.T) {
	h := newHarness(t, nil)
	type answers struct {
		status        string
		cancel, input error
		retry         Run
		retryErr      error
	}
	got := make(chan answers, 1)
	var once sync.Once
	h.r.afterEndRecorded = func(id string) {
		once.Do(func() {
			var a answers
			rec, err := h.r.Get(id)
			if err != nil {
				t.Error(err)
			}
			a.status = rec.Status
			_, a.cancel = h.r.Cancel(id)
			_, a.input = h.r.Input(id, json.RawMessage(`"late"`))
			a.retry, a.retryErr = h.r.Retry(id)
			got <- a
		})
	}
	run := h.start(`echo attempt`, nil)
	a := await.Recv(t, "the hook's calls at the recorded end", got)
	if a.status != hostproto.StatusSucceeded || !errors.Is(a.cancel, ErrNotRunning) || !errors.Is(a.input, ErrNotRunning) {
		t.Fatalf("at the recorded end (status %s): cancel = %v, input = %v; want ErrNotRunning for both", a.status, a.cancel, a.input)
	}
	if a.retryErr != nil || a.retry.Attempt != 2 {
		t.Fatalf("a retry at the recorded end = %+v, %v; want attempt 2", a.retry, a.retryErr)
	}
	if end := h.waitEnd(run.RunID); end.Status != hostproto.StatusSucceeded || end.Attempt != 2 {
		t.Fatalf("the run ended %+v, want attempt 2 succeeded", end)
	}
	if out := h.output(run.RunID); strings.Count(out, "attempt") != 2 {
		t.Fatalf("output %q, want both attempts' lines", out)
	}
}

// A cancel ends every process of the task: the agent, what it started in
// the background, and its init, with the PID namespace they share.
func TestCancelEndsEveryProcessOfTheTask(t *testing.T) {
	h := newHarness(t, nil)
	run := h.start(`sleep 1000 & echo "ns=$(readlink /proc/$$/ns/pid)"; wait`, nil)
	out := h.waitOutput(run.RunID, "]")
	ns := strings.TrimSpace(out[strings.Index(out, "ns=")+3:])
	if members := namespaceMembers(t, ns); len(members) != 3 {
		t.Fatalf("the task's namespace %s holds %v, want its init, sh and sleep", ns, members)
	}
	if _, err := h.r.Cancel(run.RunID); err != nil {
		t.Fatal(err)
	}
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusCanceled || end.Reason != hostproto.ReasonCanceled {
		t.Fatalf("canceled run ended %+v", end)
	}
	waitNamespaceEmpty(t, ns)
	if _, err := h.r.Cancel(run.RunID); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("cancel of an ended run = %v, want ErrNotRunning", err)
	}
}

func TestCancelEscalatesToSIGKILLAfterTheGrace(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	h := newHarness(t, func(c *Config) { c.Clock = fake; c.CancelGrace = 10 * time.Second })
	run := h.start(`trap '' TERM; echo ready; while :; do sleep 1; done`, nil)
	h.waitOutput(run.RunID, "ready")
	timers := fake.Timers()
	if _, err := h.r.Cancel(run.RunID); err != nil {
		t.Fatal(err)
	}
	await.Recv(t, "the runner to arm one more timer", fake.WaitForTimers(timers+1))
	fake.Advance(10 * time.Second)
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusCanceled || end.ExitCode == nil || *end.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("run ended %+v, want canceled by SIGKILL", end)
	}
}

// A cancel asks first and forces only after the grace: the task gets SIGTERM
// (its trap runs and it carries on), it is still running just before
// runner.cancelGrace has passed on the injected clock, and SIGKILL ends it
// once it has.
func TestCancelSendsSIGTERMAndWaitsTheGraceBeforeSIGKILL(t *testing.T) {
	const grace = 10 * time.Second
	fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	h := newHarness(t, func(c *Config) { c.Clock = fake; c.CancelGrace = grace })
	run := h.start(`trap 'echo got-term' TERM; echo ready; while :; do sleep 0.2; echo tick; done`, nil)
	h.waitOutput(run.RunID, "ready")
	timers := fake.Timers()
	if _, err := h.r.Cancel(run.RunID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fake.WaitForTimers(timers + 1):
	case <-time.After(20 * time.Second):
		t.Fatal("the cancel scheduled no escalation timer")
	}
	h.waitOutput(run.RunID, "got-term")

	fake.Advance(grace - time.Millisecond)
	seen := len(h.output(run.RunID))
	if !await.Within(20*time.Second, func() bool { return strings.Count(h.output(run.RunID)[seen:], "tick") >= 2 }) {
		t.Fatalf("the task stopped ticking before the grace passed; output %q", h.output(run.RunID))
	}
	if now, err := h.r.Get(run.RunID); err != nil || now.Status != hostproto.StatusRunning {
		t.Fatalf("a millisecond before the grace passed the run is %+v (%v), want still running", now, err)
	}

	fake.Advance(time.Millisecond)
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusCanceled || end.Reason != hostproto.ReasonCanceled || end.ExitCode == nil || *end.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("run ended %+v, want canceled by SIGKILL", end)
	}
}

func TestRetryIsANewAttemptOnTheSameSequence(t *testing.T) {
	h := newHarness(t, nil)
	run := h.start(`echo attempt; exit 1`, nil)
	h.waitEnd(run.RunID)
	again, err := h.r.Retry(run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if again.Attempt != 2 || again.RunID != run.RunID {
		t.Fatalf("retry answered %+v", again)
	}
	end := h.waitEnd(run.RunID)
	if end.Attempt != 2 || end.Status != hostproto.StatusFailed {
		t.Fatalf("retried run ended %+v", end)
	}
	events := h.events(run.RunID)
	for i, e := range events {
		if e.Sequence != int64(i+1) {
			t.Fatalf("event %d has sequence %d: the sequence is not contiguous across attempts", i, e.Sequence)
		}
	}
	var attempts []int
	for _, s := range h.states(run.RunID) {
		if s.Status == hostproto.StatusRunning {
			attempts = append(attempts, s.Attempt)
		}
	}
	if fmt.Sprint(attempts) != "[1 2]" {
		t.Fatalf("running states by attempt %v", attempts)
	}
	if strings.Count(h.output(run.RunID), "attempt") != 2 {
		t.Fatalf("output %q", h.output(run.RunID))
	}
}

func TestRetryOfALiveRunIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	run := h.start(`echo up; sleep 1000`, nil)
	h.waitOutput(run.RunID, "up")
	if _, err := h.r.Retry(run.RunID); !errors.Is(err, ErrNotRetryable) {
		t.Fatalf("retry of a running run = %v, want ErrNotRetryable", err)
	}
	if _, err := h.r.Retry("run-unknown"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("retry of an unknown run = %v", err)
	}
}

func TestMaxDurationTimesOut(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	h := newHarness(t, func(c *Config) { c.Clock = fake; c.MaxDuration = time.Minute })
	run := h.start(`echo started; sleep 1000`, nil)
	h.waitOutput(run.RunID, "started")
	fake.Advance(time.Minute)
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonTimedOut {
		t.Fatalf("run ended %+v, want failed timed_out", end)
	}
}

func TestMaxOutputBytesStopsTheTask(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxOutputBytes = 100 << 10 })
	run := h.start(`yes 0123456789`, nil)
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonOutputLimit {
		t.Fatalf("run ended %+v, want failed output_limit", end)
	}
	var total int
	for _, e := range h.events(run.RunID) {
		if e.Type == hostproto.EventOutput {
			var s string
			json.Unmarshal(e.Data, &s)
			if len(s) > hostproto.MaxEventData {
				t.Fatalf("an output event carries %d bytes", len(s))
			}
			total += len(s)
		}
	}
	if total != 100<<10 {
		t.Fatalf("recorded %d bytes of output, want exactly the limit %d", total, 100<<10)
	}
}

func TestMaxConcurrentRefusesHostBusyWithoutSpawning(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 1 })
	first := h.start(`echo up; sleep 1000`, nil)
	h.waitOutput(first.RunID, "up")
	marker := filepath.Join(sharedDir(t), "spawned")
	second := h.start(`touch `+marker, nil)
	if second.Status != hostproto.StatusFailed || second.Reason != hostproto.ReasonHostBusy {
		t.Fatalf("second start answered %+v, want failed host_busy", second)
	}
	if got := h.processesStarted(); got != 1 {
		t.Fatalf("%v processes started, want 1", got)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatal("the refused run's process ran")
	}
	defer func() {
		// The control: once there is room, the same command leaves its
		// marker, so its absence above means it did not run.
		h.r.Cancel(first.RunID)
		h.waitEnd(first.RunID)
		h.waitEnd(h.start(`touch `+marker, nil).RunID)
		if _, err := os.Stat(marker); err != nil {
			t.Fatalf("a run that had room left no marker: %v", err)
		}
	}()
	states := h.states(second.RunID)
	if len(states) != 1 || states[0].Reason != hostproto.ReasonHostBusy {
		t.Fatalf("the refusal did not land in the run's events: %+v", states)
	}
	if err := h.r.WaitForStart(context.Background(), second.RunID); !isRefusal(err, hostproto.ReasonHostBusy) {
		t.Fatalf("WaitForStart = %v, want the host_busy refusal", err)
	}
}

func TestStartIsIdempotentOnClientToken(t *testing.T) {
	h := newHarness(t, nil)
	a := h.start(`echo once`, func(r *Spec) { r.ClientToken = "same" })
	b := h.start(`echo twice`, func(r *Spec) { r.ClientToken = "same" })
	if a.RunID != b.RunID || !b.Reused || a.Reused {
		t.Fatalf("starts answered %+v and %+v", a, b)
	}
	runs, _ := h.r.FindByClientToken("same")
	if len(runs) != 1 || runs[0].RunID != a.RunID {
		t.Fatalf("FindByClientToken = %+v", runs)
	}
	if runs, _ := h.r.FindByClientToken("nope"); len(runs) != 0 {
		t.Fatalf("unknown token found %+v", runs)
	}
}

// A run that waited in Fleet's queue says so in its first event, created
// with the run: event 1 is queued with the wait as Fleet sent it, then
// the attempt's events follow on the same contiguous sequence. A reused
// start adds nothing, and a start that did not wait has no such event.
func TestAQueuedStartsWaitIsItsFirstEvent(t *testing.T) {
	h := newHarness(t, nil)
	since := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	q := hostproto.Queued{Since: since, StartedAt: since.Add(90 * time.Second), WaitedMs: 90_000, HostID: "host-a", Offers: 2}
	run := h.start(`echo ran`, func(r *Spec) { r.ClientToken, r.Queued = "waited", &q })
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusSucceeded {
		t.Fatalf("the run ended %+v", end)
	}
	again := h.start(`echo again`, func(r *Spec) {
		r.ClientToken, r.Queued = "waited", &hostproto.Queued{Since: since, HostID: "host-b"}
	})
	if !again.Reused || again.RunID != run.RunID {
		t.Fatalf("the second start answered %+v, want the run reused", again)
	}
	events := h.events(run.RunID)
	var types []string
	for i, e := range events {
		if e.Sequence != int64(i+1) {
			t.Fatalf("event %d has sequence %d", i, e.Sequence)
		}
		types = append(types, e.Type)
	}
	if len(events) < 3 || events[0].Type != hostproto.EventQueued || events[1].Type != hostproto.EventAdmission || events[2].Type != hostproto.EventState {
		t.Fatalf("events %v, want queued, admission, state first", types)
	}
	if strings.Count(strings.Join(types, ","), hostproto.EventQueued) != 1 {
		t.Fatalf("events %v, want one queued event", types)
	}
	var got hostproto.Queued
	if err := json.Unmarshal(events[0].Data, &got); err != nil || got != q {
		t.Fatalf("the queued event's data is %s (%v), want %+v", events[0].Data, err, q)
	}
	if states := h.states(run.RunID); len(states) == 0 || states[0].Status != hostproto.StatusAdmitted {
		t.Fatalf("state events %+v, want admitted first", states)
	}

	plain := h.start(`true`, nil)
	h.waitEnd(plain.RunID)
	if first := h.events(plain.RunID)[0]; first.Sequence != 1 || first.Type != hostproto.EventAdmission {
		t.Fatalf("a start that did not wait begins with %+v, want the admission", first)
	}
}

func TestDeadlinePassedIsRefusedAndStoredNowhere(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	h := newHarness(t, func(c *Config) { c.Clock = fake })
	past := fake.Now().Add(-time.Second)
	_, err := h.r.Start(Spec{ClientToken: "late", Request: runspec.Request{Agent: "shell", Prompt: "true", Deadline: &past}})
	if !isRefusal(err, hostproto.ReasonDeadlinePassed) {
		t.Fatalf("late start = %v, want deadline_passed", err)
	}
	if runs, _ := h.r.FindByClientToken("late"); len(runs) != 0 {
		t.Fatalf("a refused late start was stored: %+v", runs)
	}
}

func TestDrainRefusesNewStartsAndResumeAdmitsAgain(t *testing.T) {
	h := newHarness(t, nil)
	h.r.Drain()
	if _, err := h.r.Start(Spec{ClientToken: "d1", Request: runspec.Request{Agent: "shell", Prompt: "true"}}); !errors.Is(err, ErrDraining) {
		t.Fatalf("start while draining = %v", err)
	}
	h.r.Resume()
	run := h.start("true", nil)
	if end := h.waitEnd(run.RunID); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("run after resume ended %+v", end)
	}
}

func TestCancelOrDrainBetweenAdmissionAndExecStartsNothing(t *testing.T) {
	for _, race := range []string{"cancel", "drain"} {
		t.Run(race, func(t *testing.T) {
			var h *harness
			h = newHarness(t, func(c *Config) {
				c.BeforeExec = func(runID string) {
					if race == "cancel" {
						if _, err := h.r.Cancel(runID); err != nil {
							t.Errorf("cancel in the hook: %v", err)
						}
					} else {
						h.r.Drain()
					}
				}
			})
			marker := filepath.Join(sharedDir(t), "spawned")
			run := h.start(`touch `+marker, nil)
			err := h.r.WaitForStart(context.Background(), run.RunID)
			end := h.waitEnd(run.RunID)
			want := map[string]string{"cancel": hostproto.ReasonCanceled, "drain": hostproto.ReasonHostUnavailable}[race]
			if !isRefusal(err, want) || end.Reason != want {
				t.Fatalf("WaitForStart = %v, run ended %+v; want refusal %s", err, end, want)
			}
			if h.processesStarted() != 0 {
				t.Fatal("a process started")
			}
			if _, err := os.Stat(marker); !os.IsNotExist(err) {
				t.Fatal("the task's command ran")
			}
			if got := gaugeValue(t, h.r.metrics.tickets); got != 0 {
				t.Fatalf("%v tickets still held", got)
			}
		})
	}
}

func TestRestartFailsLiveRunsAndKeepsEvents(t *testing.T) {
	h := newHarness(t, nil)
	done := h.start(`echo finished`, nil)
	h.waitEnd(done.RunID)
	before := h.events(done.RunID)
	// A crash: the record says running, and nothing supervises it.
	now := time.Now()
	h.log.Create(runlog.Record{RunID: "run-crashed", ClientToken: "crashed", Status: hostproto.StatusRunning, Attempt: 1, CreatedAt: now},
		stateEntry(now, hostproto.StateChange{Status: hostproto.StatusRunning, Attempt: 1}))
	h.close()
	h.open(nil, nil)
	crashed, err := h.r.Get("run-crashed")
	if err != nil || crashed.Status != hostproto.StatusFailed || crashed.Reason != hostproto.ReasonHostRestarted {
		t.Fatalf("after restart the crashed run is %+v, %v", crashed, err)
	}
	states := h.states("run-crashed")
	if len(states) != 2 || states[1].Reason != hostproto.ReasonHostRestarted {
		t.Fatalf("states %+v", states)
	}
	if after := h.events(done.RunID); len(after) != len(before) {
		t.Fatalf("a finished run's events changed across the restart: %d -> %d", len(before), len(after))
	}
}

func TestPurgeAfterRetention(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	h := newHarness(t, func(c *Config) { c.Clock = fake; c.Retention = 2 * time.Hour })
	run := h.start(`echo x > file`, nil)
	h.waitEnd(run.RunID)
	dir := filepath.Join(h.cfg.WorkDir, run.RunID)
	if _, err := os.Stat(filepath.Join(dir, "work", "file")); err != nil {
		t.Fatalf("the task's file is missing: %v", err)
	}
	// The purge runs hourly; each step waits for it to re-arm.
	for step := 1; step <= 2; step++ {
		await.Recv(t, "the purge to be armed", fake.WaitForTimers(1))
		fake.Advance(time.Hour)
		await.Recv(t, "the purge to be armed", fake.WaitForTimers(1))
		if _, err := h.r.Get(run.RunID); err != nil {
			t.Fatalf("purged %dh after it ended, within its retention: %v", step, err)
		}
	}
	fake.Advance(time.Hour)
	await.Recv(t, "the purge to be armed", fake.WaitForTimers(1))
	if _, err := h.r.Get(run.RunID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("3h after it ended the run is still there: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the run's directories remain: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Roots = []string{edgetest.TraversableDir(t)} })
	outside := t.TempDir()
	tests := []struct {
		field string
		req   Spec
	}{
		{"clientToken", Spec{Request: runspec.Request{Agent: "shell"}}},
		{"agent", Spec{ClientToken: "a", Request: runspec.Request{Agent: "nope"}}},
		{"env", Spec{ClientToken: "a", Request: runspec.Request{Agent: "shell", Env: map[string]string{"HTTPS_PROXY": "x"}}}},
		{"env", Spec{ClientToken: "a", Request: runspec.Request{Agent: "shell", Env: map[string]string{"RUNFLEET_X": "x"}}}},
		{"env", Spec{ClientToken: "a", Request: runspec.Request{Agent: "shell", Env: map[string]string{"K": "v"}, Secrets: []runspec.Secret{{ProjectID: "p", Key: "K", Domains: []string{"api.example.com"}}}}}},
		{"secrets", Spec{ClientToken: "a", Request: runspec.Request{Agent: "shell", Secrets: []runspec.Secret{{Key: "K"}}}}},
		{"localPath", Spec{ClientToken: "a", Request: runspec.Request{Agent: "shell", LocalPath: outside}}},
		{"localPath", Spec{ClientToken: "a", Request: runspec.Request{Agent: "shell", LocalPath: "relative"}}},
	}
	for _, tt := range tests {
		_, err := h.r.Start(tt.req)
		// The host's own checks name a field (RequestError); the run
		// request's rules name the field's path (runspec.FieldError).
		field := ""
		var re *RequestError
		var fe *runspec.FieldError
		switch {
		case errors.As(err, &re):
			field = re.Field
		case errors.As(err, &fe):
			field = fe.Field
		}
		if field != tt.field && !strings.HasPrefix(field, tt.field+".") && !strings.HasPrefix(field, tt.field+"[") {
			t.Errorf("start %+v = %v (field %q), want a request error on %s", tt.req, err, field, tt.field)
		}
	}
}

func TestLocalPathUnderRootsIsTheWorkingDir(t *testing.T) {
	root := edgetest.TraversableDir(t)
	project := filepath.Join(root, "project")
	os.Mkdir(project, 0o777)
	os.Chmod(project, 0o777)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(project, link)
	h := newHarness(t, func(c *Config) { c.Roots = []string{root} })
	run := h.start(`pwd; touch made-here`, func(r *Spec) { r.LocalPath = link })
	if end := h.waitEnd(run.RunID); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("run ended %+v: %q", end, h.output(run.RunID))
	}
	if !strings.Contains(h.output(run.RunID), project) {
		t.Fatalf("pwd was %q, want %s", h.output(run.RunID), project)
	}
	if _, err := os.Stat(filepath.Join(project, "made-here")); err != nil {
		t.Fatal(err)
	}
}

func TestCloneMakesAShallowWorkingCopyOrFailsCloneFailed(t *testing.T) {
	// Where the task sees it: the clone runs in the task's sandbox, whose
	// /tmp is its own.
	src := filepath.Join(edgetest.HostDir(t), "src")
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := execCommand("git", append([]string{"-C", dir}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	os.MkdirAll(src, 0o755)
	git(src, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(src, "README"), []byte("first\n"), 0o644)
	git(src, "add", "README")
	git(src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
	os.WriteFile(filepath.Join(src, "README"), []byte("second\n"), 0o644)
	git(src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
	chmodTree(t, src)
	// git refuses a repository another user owns; the task clones as nobody.
	chownTree(t, src, 65534, 65534)

	h := newHarness(t, nil)
	run := h.start(`cat README; git rev-list --count HEAD; git status --short | wc -l`, func(r *Spec) { r.CloneURL = "file://" + src })
	end := h.waitEnd(run.RunID)
	out := h.output(run.RunID)
	if end.Status != hostproto.StatusSucceeded || !strings.Contains(out, "second") || !strings.Contains(out, "1\r\n0") {
		t.Fatalf("clone run ended %+v (%v) with output %q (want the README, 1 commit, a clean tree)", end, h.states(run.RunID), out)
	}

	bad := h.start(`true`, func(r *Spec) { r.CloneURL = "file:///nonexistent/repo" })
	end = h.waitEnd(bad.RunID)
	if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonCloneFailed {
		t.Fatalf("bad clone ended %+v", end)
	}
}

func isRefusal(err error, reason string) bool {
	var ref *Refusal
	return errors.As(err, &ref) && ref.Reason == reason
}

func TestConcurrentStartsOfOneTokenNeverCountAgainstTheLimit(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 1 })
	var wg sync.WaitGroup
	runs := make([]Run, 20)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i] = h.start(`echo once`, func(r *Spec) { r.ClientToken = "shared" })
		}()
	}
	await.Group(t, "the concurrent starts with one client token", &wg)
	fresh := 0
	for _, r := range runs {
		if !r.Reused {
			fresh++
			if r.Status == hostproto.StatusFailed {
				t.Fatalf("the one new run was refused: %+v", r)
			}
		}
	}
	if fresh != 1 {
		t.Fatalf("%d new runs for one client token", fresh)
	}
	if end := h.waitEnd(runs[0].RunID); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("run ended %+v", end)
	}
}

func TestMaxConcurrentUnderConcurrentStarts(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 2 })
	var wg sync.WaitGroup
	runs := make([]Run, 10)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i] = h.start(`sleep 1000`, nil)
		}()
	}
	await.Group(t, "the concurrent starts beyond the cap", &wg)
	admitted, busy := 0, 0
	for _, r := range runs {
		switch {
		case r.Status == hostproto.StatusFailed && r.Reason == hostproto.ReasonHostBusy:
			busy++
		case r.Status == hostproto.StatusAdmitted || r.Status == hostproto.StatusRunning:
			admitted++
			defer func(id string) { h.r.Cancel(id) }(r.RunID)
		}
	}
	if admitted != 2 || busy != 8 {
		t.Fatalf("%d admitted and %d refused host_busy, want 2 and 8", admitted, busy)
	}
}

func TestNothingOfATaskOutlivesIt(t *testing.T) {
	h := newHarness(t, nil)
	run := h.start(`echo "ns=$(readlink /proc/$$/ns/pid)"; setsid sh -c 'echo "escaped=$$"; exec sleep 1000' & sleep 0.2; echo leader-done`, nil)
	out := h.waitOutput(run.RunID, "leader-done")
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusSucceeded || !strings.Contains(out, "escaped=") {
		t.Fatalf("run ended %+v: %q", end, out)
	}
	ns := strings.Fields(out[strings.Index(out, "ns=")+3:])[0]
	waitNamespaceEmpty(t, ns)
}

// A retry racing the purge of its run must not start an attempt whose
// directories and record the purge then removes: once the purge has
// decided to remove the run it holds it, and the retry is refused.
func TestPurgeHoldsTheRunAgainstARetry(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	h := newHarness(t, func(c *Config) { c.Clock = fake; c.Retention = time.Hour })
	run := h.start(`echo x > file`, nil)
	h.waitEnd(run.RunID)
	retried := make(chan error, 1)
	h.r.beforePurgeRemoves = func(id string) {
		_, err := h.r.Retry(id)
		retried <- err
	}
	await.Recv(t, "the purge to be armed", fake.WaitForTimers(1))
	fake.Advance(time.Hour) // the run ended exactly a retention ago: kept
	await.Recv(t, "the purge to be armed", fake.WaitForTimers(1))
	fake.Advance(time.Hour)
	if err := await.Recv(t, "the retry to answer", retried); !errors.Is(err, ErrNotRetryable) {
		t.Fatalf("a retry while the purge removes the run = %v, want ErrNotRetryable", err)
	}
	await.Recv(t, "the purge to end and re-arm", fake.WaitForTimers(1))
	if _, err := h.r.Get(run.RunID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the run is still there after its purge: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.WorkDir, run.RunID)); !os.IsNotExist(err) {
		t.Fatalf("the run's directories remain: %v", err)
	}
	if got := h.processesStarted(); got != 1 || !h.r.Idle() {
		t.Fatalf("%v processes started (want the first attempt's alone), idle %v", got, h.r.Idle())
	}
}
