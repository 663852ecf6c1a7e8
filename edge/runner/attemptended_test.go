package runner

import (
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// endings records AttemptEnded's calls with the run's status as the run
// log held it then.
type endings struct {
	mu  sync.Mutex
	log *runlog.Log // the run log the runner writes
	got []string    // "runID status"
}

func (e *endings) setLog(l *runlog.Log) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = l
}

func (e *endings) hook() func(string) {
	return func(runID string) {
		e.mu.Lock()
		l := e.log
		e.mu.Unlock()
		rec, err := l.Get(runID)
		status := rec.Status
		if err != nil {
			status = err.Error()
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		e.got = append(e.got, runID+" "+status)
	}
}

func (e *endings) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

// AttemptEnded runs once for each attempt's end, a retry's too, and
// before the end is recorded, so a reader who sees the run ended sees what
// it did (the run's egress ledger sealed). An attempt a crash left live is
// ended through it too, as the restarted runner marks it host_restarted.
func TestAttemptEndedRunsOnceBeforeEachEndIsRecorded(t *testing.T) {
	var e endings
	h := newHarness(t, func(c *Config) { c.AttemptEnded = e.hook() })
	e.setLog(h.log)
	run := h.start(`exit 1`, nil)
	h.waitEnd(run.RunID)
	if _, err := h.r.Retry(run.RunID); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(run.RunID)
	want := []string{run.RunID + " " + hostproto.StatusRunning, run.RunID + " " + hostproto.StatusRunning}
	if got := e.list(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("AttemptEnded calls %q, want %q", got, want)
	}

	now := time.Now()
	h.log.Create(runlog.Record{RunID: "run-crashed", ClientToken: "crashed", Status: hostproto.StatusRunning, Attempt: 1, CreatedAt: now})
	h.close()
	l, err := runlog.Open(h.dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.setLog(l)
	if h.r, err = New(h.cfg, l, nil, nil); err != nil {
		l.Close()
		t.Fatal(err)
	}
	h.log = l
	if got := e.list(); len(got) != 3 || got[2] != "run-crashed "+hostproto.StatusRunning {
		t.Fatalf("after a restart, AttemptEnded calls %q, want the crashed run's end before it was recorded", got)
	}
	if r, _ := h.r.Get("run-crashed"); r.Status != hostproto.StatusFailed {
		t.Fatalf("the crashed run is %+v", r)
	}
}
