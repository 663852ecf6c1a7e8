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

// deleteHost repeats DeleteHost until it is done or fails, checking that
// every step stays within its bound.
func deleteHost(s store.Store, id string, force bool) error {
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

// testHostsDeleteInSteps: a host with more runs than one step takes is
// deleted over several calls; between them nothing is lost (every run is
// either still listed, whole with its events, or counted as deleted), the
// host stays registered, a delete without force is refused, and another
// host's run is untouched.
func testHostsDeleteInSteps(t *testing.T, s store.Store, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost h1", s.CreateHost(bg, host("h1", now)))
	noErr(t, "CreateHost h2", s.CreateHost(bg, host("h2", now)))
	const n = 2*store.DeleteHostRunsPerStep + 17
	var wg sync.WaitGroup
	errs := make(chan error, n)
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
	page, err = s.ListEvents(bg, "other", 0, 10)
	noErr(t, "ListEvents of another host's run", err)
	if len(page.Events) != 1 {
		t.Fatalf("events of another host's run: %v", seqs(page.Events))
	}
}
