package fleet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// retryingMeanwhile is a store on which a retry's record lands between a
// path's read of the host and its write: before the first UpdateRun it
// records attempt 2 live, as an accepted retry does, so the path's write
// conflicts and it re-reads a run one attempt ahead of its host answer.
type retryingMeanwhile struct {
	store.Store
	t    *testing.T
	once sync.Once
}

func (s *retryingMeanwhile) UpdateRun(ctx context.Context, r store.Run) (store.Run, error) {
	s.once.Do(func() {
		cur, err := s.Store.GetRun(ctx, r.FleetRunID)
		if err != nil {
			s.t.Error(err)
			return
		}
		cur.Attempt, cur.Status, cur.ExitCode, cur.Reason = 2, hostproto.StatusPending, nil, ""
		cur.EndedAt, cur.ExpiresAt, cur.Drained = nil, time.Time{}, false
		if _, err := s.Store.UpdateRun(ctx, cur); err != nil {
			s.t.Error(err)
		}
	})
	return s.Store.UpdateRun(ctx, r)
}

// TestAStaleAttemptsAnswerNeverRollsARetriedRunBack: on each path that
// records a host's answer (GET's refresh, the sync of the sweep and the
// stream, a verb's answer), an attempt-1 answer read before a retry made
// attempt 2 live, and written after it, leaves attempt 2 as it is.
func TestAStaleAttemptsAnswerNeverRollsARetriedRunBack(t *testing.T) {
	alice := caller("alice")
	for name, path := range map[string]func(f *Fleet, id string) error{
		"refresh": func(f *Fleet, id string) error { _, err := f.Run(context.Background(), alice, id); return err },
		"sync":    func(f *Fleet, id string) error { _, err := f.SyncRun(context.Background(), id); return err },
		"cancel":  func(f *Fleet, id string) error { _, err := f.Cancel(context.Background(), alice, id); return err },
	} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t, 10*time.Second)
			host := e.addHost(t, "h1", fakehost.Config{})
			run := dispatched(t, e, "alice")
			one := 1
			if name == "cancel" {
				host.SetRun(run.ChildRunID, hostproto.StatusRunning, nil, "")
			} else {
				host.SetRun(run.ChildRunID, hostproto.StatusFailed, &one, "")
			}
			f := e.fleetOver(t, &retryingMeanwhile{Store: e.st, t: t})
			if err := path(f, run.FleetRunID); err != nil {
				t.Fatal(err)
			}
			got, err := e.st.GetRun(context.Background(), run.FleetRunID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Attempt != 2 || got.Status != hostproto.StatusPending || got.EndedAt != nil || !got.ExpiresAt.IsZero() || !got.Live() {
				t.Fatalf("after a stale attempt-1 answer: %+v; want attempt 2 pending and live", got)
			}
		})
	}
}

func TestHostAnswerApplies(t *testing.T) {
	zero, one := 0, 1
	cur := store.Run{ChildRunID: "run-1", Status: hostproto.StatusRunning, Attempt: 2}
	for _, c := range []struct {
		name string
		cur  store.Run
		hr   hostproto.Run
		want bool
	}{
		{"the same state", cur, hostproto.Run{RunID: "run-1", Status: hostproto.StatusRunning, Attempt: 2}, false},
		{"this attempt ended", cur, hostproto.Run{RunID: "run-1", Status: hostproto.StatusSucceeded, Attempt: 2, ExitCode: &zero}, true},
		{"an earlier attempt's end", cur, hostproto.Run{RunID: "run-1", Status: hostproto.StatusFailed, Attempt: 1, ExitCode: &one}, false},
		{"a later attempt", cur, hostproto.Run{RunID: "run-1", Status: hostproto.StatusPending, Attempt: 3}, true},
		{"over lost", store.Run{Status: store.StatusLost, Attempt: 1}, hostproto.Run{Status: hostproto.StatusRunning, Attempt: 2}, false},
		{"over dispatching", store.Run{Status: store.StatusDispatching}, hostproto.Run{Status: hostproto.StatusPending, Attempt: 1}, false},
		{"a live state read before this attempt's recorded end", store.Run{ChildRunID: "run-1", Status: hostproto.StatusSucceeded, Attempt: 2, ExitCode: &zero},
			hostproto.Run{RunID: "run-1", Status: hostproto.StatusRunning, Attempt: 2}, false},
		{"the next attempt over an end", store.Run{ChildRunID: "run-1", Status: hostproto.StatusFailed, Attempt: 2, ExitCode: &one},
			hostproto.Run{RunID: "run-1", Status: hostproto.StatusRunning, Attempt: 3}, true},
	} {
		if got := hostAnswerApplies(c.cur, c.hr); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
