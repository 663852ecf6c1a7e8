package fleet

import (
	"context"
	"reflect"
	"testing"

	"github.com/runfleet/runfleet/shared/store"
)

// TestALostRunsTokenIsRevokedWhicheverPathFoundItLost: a run whose host
// denies it (run_not_found: the host lost its state, or was replaced)
// leaves the live index at once, so the sweep never visits it again; its
// GitHub token is revoked by the path that found it lost, a verb's or a
// listing's as well as a GET's.
func TestALostRunsTokenIsRevokedWhicheverPathFoundItLost(t *testing.T) {
	for name, find := range map[string]func(e *testEnv, run store.Run){
		"cancel": func(e *testEnv, run store.Run) {
			_, _ = e.f.Cancel(context.Background(), caller("alice"), run.FleetRunID)
		},
		"list": func(e *testEnv, run store.Run) { _, _ = e.f.Runs(context.Background(), caller("alice"), RunsQuery{}) },
	} {
		t.Run(name, func(t *testing.T) {
			e, b, host, _ := brokerEnv(t)
			ctx := context.Background()
			run := brokeredRunning(t, e, host)
			host.Forget(run.ChildRunID)
			find(e, run)
			stored, err := e.st.GetRun(ctx, run.FleetRunID)
			if err != nil || stored.Status != store.StatusLost || stored.Live() {
				t.Fatalf("after the %s: %+v, %v; want lost and drained", name, stored, err)
			}
			if stored.Brokered[0].RevokedAt == nil || !reflect.DeepEqual(b.revokedValues(), []string{"githubApp-value-1"}) {
				t.Fatalf("a lost run's token: recorded %+v, revoked %v", stored.Brokered, b.revokedValues())
			}
		})
	}
}
