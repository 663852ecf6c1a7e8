package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// TestRunsStatusFilterShowsTheRefreshedStatus: a status filter is applied
// to the run as the page shows it, after its host was asked: a run
// recorded pending that its host reports ended is not listed as pending,
// and is listed as succeeded from then on.
func TestRunsStatusFilterShowsTheRefreshedStatus(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	host := e.addHost(t, "h1", fakehost.Config{})
	ctx := context.Background()
	alice := caller("alice")
	ended, err := e.f.Dispatch(ctx, alice, DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Second)
	live, err := e.f.Dispatch(ctx, alice, DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if ended.Run.Status != hostproto.StatusPending || live.Run.Status != hostproto.StatusPending {
		t.Fatalf("dispatched %s and %s, want both pending", ended.Run.Status, live.Run.Status)
	}
	zero := 0
	host.SetRun(ended.Run.ChildRunID, hostproto.StatusSucceeded, &zero, "")

	pending, err := e.f.Runs(ctx, alice, RunsQuery{Status: "pending"})
	if err != nil || len(pending.Runs) != 1 || pending.Runs[0].FleetRunID != live.Run.FleetRunID {
		t.Fatalf("status=pending: %+v %v; want only %s", pending.Runs, err, live.Run.FleetRunID)
	}
	done, err := e.f.Runs(ctx, alice, RunsQuery{Status: "succeeded"})
	if err != nil || len(done.Runs) != 1 || done.Runs[0].FleetRunID != ended.Run.FleetRunID {
		t.Fatalf("status=succeeded: %+v %v; want only %s", done.Runs, err, ended.Run.FleetRunID)
	}
}

// TestRunsFiltersAreChecked: a status that is not a run's, an agent or host
// that is not an id is 400; a host outside the caller's scope is 403.
func TestRunsFiltersAreChecked(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	ctx := context.Background()
	for _, tc := range []struct {
		q    RunsQuery
		kind Kind
	}{
		{RunsQuery{Status: "done"}, KindInvalid},
		{RunsQuery{Status: "Running"}, KindInvalid},
		{RunsQuery{Agent: "a b"}, KindInvalid},
		{RunsQuery{HostID: "../h1"}, KindInvalid},
		{RunsQuery{HostID: "h2"}, KindForbidden},
	} {
		if _, err := e.f.Runs(ctx, caller("alice", "h1"), tc.q); !isKind(err, tc.kind) {
			t.Errorf("%+v: %v, want kind %v", tc.q, err, tc.kind)
		}
	}
}

func TestShownRepositoryRedactsCredentials(t *testing.T) {
	for in, want := range map[string]string{
		"":                                  "",
		"acme/app":                          "acme/app",
		"git@github.com:acme/app.git":       "git@github.com:acme/app.git",
		"ssh://git@github.com/acme/app.git": "ssh://git@github.com/acme/app.git",
		"https://github.com/acme/app.git":   "https://github.com/acme/app.git",
		"https://x:ghp_secret@github.com/acme/app": "https://x:xxxxx@github.com/acme/app",
		"https://ghp_secret@github.com/acme/app":   "https://xxxxx@github.com/acme/app",
		"ssh://git:pw@git.example/acme/app":        "ssh://git:xxxxx@git.example/acme/app",
	} {
		if got := shownRepository(in); got != want {
			t.Errorf("shownRepository(%q) = %q, want %q", in, got, want)
		}
	}
}
