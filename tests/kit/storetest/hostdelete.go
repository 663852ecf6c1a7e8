package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// hostDeletionContract is store.Hosts' DeleteHost, which removes a host
// with its runs, their events and their ledger mirrors: its cases take the
// four roles.
var hostDeletionContract = []contractCase{
	roleCase("Hosts/DeleteInUseAndForce", testHostsDeleteInUse),
	roleCase("Hosts/DeleteIgnoresExpiredRuns", testHostsDeleteExpiredRuns),
	roleCase("Hosts/DeleteInBoundedSteps", testHostsDeleteInSteps),
}

// hostsRunsAndEvents is a host with its runs, their events and their
// ledger mirrors, which DeleteHost removes together.
type hostsRunsAndEvents interface {
	store.Hosts
	store.Runs
	store.Events
	store.Egress
}

// seedLedger gives a run a ledger mirror of n records and a head with an
// alert.
func seedLedger(t *testing.T, s store.Egress, runID string, n int, at time.Time) {
	t.Helper()
	noErr(t, "PutEgress "+runID, s.PutEgress(bg, runID, LedgerRecords(runID, 1, n, at), at.Add(time.Hour)))
	_, err := s.PutEgressHead(bg, store.EgressHead{FleetRunID: runID, Cursor: int64(n), Alerts: 1, FirstAlertAt: at, ExpiresAt: at.Add(time.Hour)})
	noErr(t, "PutEgressHead "+runID, err)
}

// ledgerGone fails unless the run has no ledger mirror left.
func ledgerGone(t *testing.T, s store.Egress, runID string) {
	t.Helper()
	p, err := s.ListEgress(bg, runID, 0, 10)
	noErr(t, "ListEgress", err)
	if len(p.Records) != 0 {
		t.Fatalf("the ledger of %s survives the deletion: %v", runID, egressSeqs(p.Records))
	}
	_, err = s.GetEgressHead(bg, runID)
	wantErr(t, "GetEgressHead of "+runID, err, store.ErrNotFound)
}

// deleteHost repeats DeleteHost until it is done or fails, checking that
// every step stays within its bound.
func deleteHost(s store.Hosts, id string, force bool) error {
	for steps := 0; steps < 1000; steps++ {
		res, err := s.DeleteHost(bg, id, force)
		if err != nil {
			return err
		}
		if res.RunsDeleted > store.DeleteHostRunsPerStep {
			return fmt.Errorf("a DeleteHost step deleted %d runs, more than its bound %d", res.RunsDeleted, store.DeleteHostRunsPerStep)
		}
		if res.Done {
			return nil
		}
	}
	return errors.New("DeleteHost never finished")
}

func testHostsDeleteInUse(t *testing.T, s hostsRunsAndEvents, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost h1", s.CreateHost(bg, host("h1", now)))
	noErr(t, "CreateHost h2", s.CreateHost(bg, host("h2", now)))
	r1 := createRun(t, s, run("r1", "alice", "h1", now))
	r2 := createRun(t, s, run("r2", "bob", "h1", now.Add(time.Second)))
	createRun(t, s, run("r3", "alice", "h2", now.Add(2*time.Second)))
	noErr(t, "PutEvents", s.PutEvents(bg, []store.Event{event("r1", 1, now, "a"), event("r2", 1, now, "b"), event("r3", 1, now, "c")}))
	seedLedger(t, s, "r1", 150, now)
	seedLedger(t, s, "r3", 3, now)
	// A terminal, drained run still references its host.
	_, err := s.UpdateRun(bg, ended(r2, store.StatusSucceeded, now, true, time.Hour))
	noErr(t, "UpdateRun r2", err)

	wantErr(t, "DeleteHost in use", deleteHost(s, "h1", false), store.ErrInUse)
	_, err = s.GetHost(bg, "h1")
	noErr(t, "host after refused delete", err)
	_, err = s.GetRun(bg, r1.FleetRunID)
	noErr(t, "run after refused delete", err)

	noErr(t, "DeleteHost force", deleteHost(s, "h1", true))
	_, err = s.GetHost(bg, "h1")
	wantErr(t, "GetHost after force delete", err, store.ErrNotFound)
	for _, id := range []string{"r1", "r2"} {
		_, err = s.GetRun(bg, id)
		wantErr(t, "GetRun "+id+" after force delete", err, store.ErrNotFound)
		page, err := s.ListEvents(bg, id, 0, 10)
		noErr(t, "ListEvents", err)
		if len(page.Events) != 0 {
			t.Fatalf("events of %s survive the force delete: %v", id, seqs(page.Events))
		}
		ledgerGone(t, s, id)
	}
	sameIDs(t, "alerted runs after force delete", alertedIDs(t, s, 10), []string{"r3"})
	if got := wholeLedger(t, s, "r3", 0, 10); len(got) != 3 {
		t.Fatalf("the ledger of another host's run: %v", egressSeqs(got))
	}
	sameIDs(t, "ListRuns all after force delete", allRuns(t, s, store.RunQuery{}, 10), []string{"r3"})
	sameIDs(t, "ListRuns host h1", allRuns(t, s, store.RunQuery{HostID: "h1"}, 10), nil)
	sameIDs(t, "ListRuns alice", allRuns(t, s, store.RunQuery{OwnerID: "alice"}, 10), []string{"r3"})
	sameIDs(t, "ListLive after force delete", allLive(t, s, 10), []string{"r3"})
	page, err := s.ListEvents(bg, "r3", 0, 10)
	noErr(t, "ListEvents r3", err)
	if len(page.Events) != 1 {
		t.Fatalf("events of another host's run: %v", seqs(page.Events))
	}

	noErr(t, "DeleteHost h2 force", deleteHost(s, "h2", true))
	wantErr(t, "DeleteHost twice", deleteHost(s, "h2", false), store.ErrNotFound)

	noErr(t, "CreateHost h3", s.CreateHost(bg, host("h3", now)))
	noErr(t, "DeleteHost unused", deleteHost(s, "h3", false))
}

func testHostsDeleteExpiredRuns(t *testing.T, s hostsAndRuns, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", now)))
	r := createRun(t, s, run("r1", "alice", "h1", now))
	_, err := s.UpdateRun(bg, ended(r, store.StatusFailed, now, true, time.Hour))
	noErr(t, "UpdateRun", err)
	wantErr(t, "DeleteHost before expiry", deleteHost(s, "h1", false), store.ErrInUse)
	clk.Advance(2 * time.Hour)
	noErr(t, "DeleteHost after the run expired", deleteHost(s, "h1", false))
}

// testHostsDeleteInSteps: a host with more runs than one step takes is
// deleted over several calls; between them nothing is lost (every run is
// either still listed, whole with its events, or counted as deleted), the
// host stays registered, a delete without force is refused, and another
// host's run is untouched.
func testHostsDeleteInSteps(t *testing.T, s hostsRunsAndEvents, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost h1", s.CreateHost(bg, host("h1", now)))
	noErr(t, "CreateHost h2", s.CreateHost(bg, host("h2", now)))
	const n = 2*store.DeleteHostRunsPerStep + 17
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			id := fmt.Sprintf("r%03d", i)
			if err := s.CreateRun(bg, run(id, "alice", "h1", now.Add(time.Duration(i)*time.Millisecond))); err != nil {
				errs <- err
				return
			}
			if i%10 == 0 {
				errs <- s.PutEvents(bg, []store.Event{event(id, 1, now, "a"), event(id, 2, now, "b")})
				errs <- s.PutEgress(bg, id, LedgerRecords(id, 1, 60, now), now.Add(time.Hour))
			}
		}()
	}
	await.Group(t, "the seeding writers", &wg)
	close(errs)
	for err := range errs {
		noErr(t, "seeding", err)
	}
	createRun(t, s, run("other", "bob", "h2", now))
	noErr(t, "PutEvents other", s.PutEvents(bg, []store.Event{event("other", 1, now, "c")}))

	deleted, steps := 0, 0
	for {
		res, err := s.DeleteHost(bg, "h1", true)
		noErr(t, "DeleteHost step", err)
		steps++
		if res.RunsDeleted > store.DeleteHostRunsPerStep {
			t.Fatalf("step %d deleted %d runs; the bound is %d", steps, res.RunsDeleted, store.DeleteHostRunsPerStep)
		}
		deleted += res.RunsDeleted
		if res.Done {
			break
		}
		if steps > n {
			t.Fatal("DeleteHost never finished")
		}
		// Between steps: the host is still there, and every run of it is
		// either deleted (counted) or still whole.
		_, err = s.GetHost(bg, "h1")
		noErr(t, "GetHost between steps", err)
		left := allRuns(t, s, store.RunQuery{HostID: "h1"}, 1000)
		if len(left)+deleted != n {
			t.Fatalf("after step %d: %d runs left + %d deleted, want %d", steps, len(left), deleted, n)
		}
		for _, id := range left {
			if strings.HasSuffix(id, "0") { // seeded with two events
				page, err := s.ListEvents(bg, id, 0, 10)
				noErr(t, "ListEvents", err)
				if len(page.Events) != 2 {
					t.Fatalf("after step %d run %s, not deleted, has %d events, want 2", steps, id, len(page.Events))
				}
				sameRecords(t, fmt.Sprintf("after step %d the ledger of run %s, not deleted", steps, id),
					wholeLedger(t, s, id, 0, 100), LedgerRecords(id, 1, 60, now))
			}
		}
		wantErr(t, "DeleteHost without force between steps", deleteHost(s, "h1", false), store.ErrInUse)
	}
	if steps < 3 {
		t.Fatalf("%d runs went in %d steps; the bound of %d a step allows no fewer than 3", n, steps, store.DeleteHostRunsPerStep)
	}
	if deleted != n {
		t.Fatalf("the steps report %d runs deleted, want %d", deleted, n)
	}
	_, err := s.GetHost(bg, "h1")
	wantErr(t, "GetHost after the last step", err, store.ErrNotFound)
	sameIDs(t, "runs of h1 after the last step", allRuns(t, s, store.RunQuery{HostID: "h1"}, 1000), nil)
	sameIDs(t, "every run after the last step", allRuns(t, s, store.RunQuery{}, 1000), []string{"other"})
	page, err := s.ListEvents(bg, "r010", 0, 10)
	noErr(t, "ListEvents of a deleted run", err)
	if len(page.Events) != 0 {
		t.Fatalf("events of a deleted run survive: %v", seqs(page.Events))
	}
	ledgerGone(t, s, "r010")
	page, err = s.ListEvents(bg, "other", 0, 10)
	noErr(t, "ListEvents of another host's run", err)
	if len(page.Events) != 1 {
		t.Fatalf("events of another host's run: %v", seqs(page.Events))
	}
}
