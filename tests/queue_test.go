package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// Runs that wait for capacity, through the API of a whole stack on both
// stores, with fake hosts of one slot each (fakehost's MaxConcurrent). The
// wakes Fleet sends go to a Waker the test holds, which the test delivers
// to FillHosts as the dispatcher's queue would.

// heldWakes is a Waker whose wakes wait for the test to deliver them.
type heldWakes struct {
	mu    sync.Mutex
	wakes []fleet.Wake
}

func (w *heldWakes) Wake(_ context.Context, wakes []fleet.Wake) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wakes = append(w.wakes, wakes...)
	return nil
}

// deliver hands the wakes held to FillHosts, as the dispatcher would.
func (w *heldWakes) deliver(t *testing.T, s *stack) fleet.FillReport {
	t.Helper()
	w.mu.Lock()
	wakes := w.wakes
	w.wakes = nil
	w.mu.Unlock()
	rep, err := s.app.Fleet.FillHosts(context.Background(), wakes)
	if err != nil {
		t.Fatalf("FillHosts(%+v): %v", wakes, err)
	}
	return rep
}

// queueStack is a stack with two hosts of one slot each, probed, a caller
// alice, and the wakes held.
func queueStack(t *testing.T, kind string) (*stack, *heldWakes, map[string]*fakehost.Host, string) {
	w := &heldWakes{}
	s := newStack(t, kind, stackOptions{waker: w})
	hosts := map[string]*fakehost.Host{}
	for _, id := range []string{"h1", "h2"} {
		hosts[id] = s.addHost(t, id, fakehost.Config{MaxConcurrent: 1}, nil)
		s.probe(t, id)
	}
	return s, w, hosts, s.mint(t, "alice", "*", "*")
}

// queueInfo is an answer's queue object.
func queueInfo(t *testing.T, a answer) map[string]any {
	t.Helper()
	q, ok := a.body["queue"].(map[string]any)
	if !ok {
		t.Fatalf("no queue in %s", a.raw)
	}
	return q
}

// getRun is GET /fleet/runs/{id}'s run.
func getRun(t *testing.T, s *stack, token, id string) answer {
	t.Helper()
	a := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id, token, "")
	run, ok := a.body["run"].(map[string]any)
	if !ok {
		t.Fatalf("GET %s: %s", id, a.raw)
	}
	return answer{status: a.status, raw: a.raw, body: run}
}

// positionOf is the run's position as GET shows it (0: none).
func positionOf(t *testing.T, s *stack, token, id string) int {
	t.Helper()
	p, _ := queueInfo(t, getRun(t, s, token, id))["position"].(float64)
	return int(p)
}

// endRun ends a run on its host and lets Fleet notice it (the sweep).
func endRun(t *testing.T, s *stack, host *fakehost.Host, child string) {
	t.Helper()
	host.SetRun(child, hostproto.StatusSucceeded, new(int), "")
	if _, err := s.app.Fleet.Sweep(context.Background(), fleet.SweepOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startsByToken counts the starts that created a run on the hosts, by
// the Fleet run id their clientToken is for.
func startsByToken(hosts map[string]*fakehost.Host) map[string]int {
	out := map[string]int{}
	for _, h := range hosts {
		for _, st := range h.Starts() {
			id, _, _ := strings.Cut(st.ClientToken, ".q")
			out[id]++
		}
	}
	return out
}

// TestQueueStartsFiveRunsInOrderOnTwoHosts: both slots taken, five runs
// that ask to wait are answered 202 queued, in order, with their
// positions; a dispatch that does not ask is refused as before. As runs
// end on the hosts, each wake starts the next run, in order, once; the
// positions of those left move up; and each start told its host how long
// the run waited.
func TestQueueStartsFiveRunsInOrderOnTwoHosts(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, w, hosts, alice := queueStack(t, kind)
			children := map[string]string{} // host -> its live run
			for range 2 {
				a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
				children[a.str("hostId")] = a.str("childRunId")
			}
			if len(children) != 2 {
				t.Fatalf("the two first runs took %v", children)
			}
			a := s.must(t, http.StatusConflict, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			if a.str("code") != hostproto.ReasonHostBusy {
				t.Fatalf("a dispatch that does not wait: %s", a.raw)
			}
			a = s.must(t, http.StatusConflict, "POST", "/fleet/runs", alice, `{"agent":"claude"}`)
			if a.str("code") != fleet.CodeNoEligibleHost {
				t.Fatalf("a dispatch no host can take: %s", a.raw)
			}

			var ids []string
			for i := range 5 {
				s.clk.Advance(time.Second)
				a := s.must(t, http.StatusAccepted, "POST", "/fleet/runs", alice, `{"agent":"shell","queue":{"timeout":"1h"}}`,
					"Idempotency-Key", fmt.Sprintf("q-%d", i))
				q := queueInfo(t, a)
				if a.str("status") != "queued" || a.str("hostId") != "" || q["position"] != float64(i+1) || q["class"] != "shell" ||
					q["timeout"] != "1h0m0s" || a.str("childRunId") != "" {
					t.Fatalf("queued dispatch %d: %s", i, a.raw)
				}
				ids = append(ids, a.str("fleetRunId"))
			}
			again := s.must(t, http.StatusOK, "POST", "/fleet/runs", alice, `{"agent":"shell","queue":{"timeout":"60m"}}`,
				"Idempotency-Key", "q-2")
			if again.str("fleetRunId") != ids[2] || again.body["reused"] != true || again.str("status") != "queued" || queueInfo(t, again)["position"] != float64(3) {
				t.Fatalf("a retried queued dispatch: %s", again.raw)
			}
			if got := w.deliver(t, s); got.Offered != 0 {
				t.Fatalf("wakes before any slot freed started %+v", got)
			}

			for i, id := range ids {
				// Free the slot of the host whose run is oldest.
				hostID := []string{"h1", "h2"}[i%2]
				endRun(t, s, hosts[hostID], children[hostID])
				rep := w.deliver(t, s)
				if len(rep.Started) != 1 || rep.Started[0] != id || rep.Offered != 1 {
					t.Fatalf("slot %d freed on %s: started %+v, want %s", i, hostID, rep, id)
				}
				got := getRun(t, s, alice, id)
				q := queueInfo(t, got)
				if got.str("hostId") != hostID || got.str("status") != "pending" || q["startedOn"] != hostID || q["startedAt"] == nil ||
					q["position"] != nil || q["waitedSeconds"] != float64(4-i) {
					t.Fatalf("started run %d: %s", i, got.raw)
				}
				children[hostID] = got.str("childRunId")
				for j, rest := range ids[i+1:] {
					if p := positionOf(t, s, alice, rest); p != j+1 {
						t.Errorf("after %d started: %s at %d, want %d", i+1, rest, p, j+1)
					}
				}
				starts := hosts[hostID].Starts()
				st := starts[len(starts)-1]
				if st.Queued == nil || st.Queued.HostID != hostID || st.Queued.WaitedMs != int64(4-i)*1000 || !strings.HasPrefix(st.ClientToken, id) {
					t.Fatalf("the start of %s: token %s queued %+v", id, st.ClientToken, st.Queued)
				}
			}
			for id, n := range startsByToken(hosts) {
				if n != 1 {
					t.Errorf("run %s was started %d times", id, n)
				}
			}
			if n := hosts["h1"].Created() + hosts["h2"].Created(); n != 7 {
				t.Errorf("the hosts created %d runs, want 7", n)
			}
		})
	}
}

// TestQueueCancelTimeoutAndPriority: a canceled queued run ends at once
// and never starts; one whose timeout passes ends failed queue_timeout; a
// run of higher priority starts before those that waited longer.
func TestQueueCancelTimeoutAndPriority(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, w, hosts, alice := queueStack(t, kind)
			var child string
			for range 2 {
				a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
				if a.str("hostId") == "h1" {
					child = a.str("childRunId")
				}
			}
			dispatch := func(body string) string {
				s.clk.Advance(time.Second)
				return s.must(t, http.StatusAccepted, "POST", "/fleet/runs", alice, body).str("fleetRunId")
			}
			canceled := dispatch(`{"agent":"shell","queue":{"timeout":"1h"}}`)
			short := dispatch(`{"agent":"shell","queue":{"timeout":"2m"}}`)
			plain := dispatch(`{"agent":"shell","queue":{"timeout":"1h"}}`)
			urgent := dispatch(`{"agent":"shell","queue":{"timeout":"1h","priority":10}}`)
			if p := positionOf(t, s, alice, urgent); p != 1 {
				t.Fatalf("the priority run is at %d, want 1", p)
			}
			if p := positionOf(t, s, alice, plain); p != 4 {
				t.Fatalf("the plain run is at %d, want 4", p)
			}

			a := s.must(t, http.StatusOK, "POST", "/fleet/runs/"+canceled+"/cancel", alice, "")
			run, _ := a.body["run"].(map[string]any)
			if a.body["accepted"] != true || run["status"] != "canceled" || run["reason"] != "canceled" || !strings.Contains(fmt.Sprint(run["detail"]), "never started") {
				t.Fatalf("cancel of a queued run: %s", a.raw)
			}
			s.must(t, http.StatusConflict, "POST", "/fleet/runs/"+plain+"/input", alice, `{"input":"hi"}`)

			s.clk.Advance(2 * time.Minute)
			if _, err := s.app.Fleet.Sweep(context.Background(), fleet.SweepOptions{}); err != nil {
				t.Fatal(err)
			}
			got := getRun(t, s, alice, short)
			if got.str("status") != "failed" || got.str("reason") != fleetapi.ReasonQueueTimeout {
				t.Fatalf("past its timeout: %s", got.raw)
			}

			endRun(t, s, hosts["h1"], child)
			rep := w.deliver(t, s)
			if len(rep.Started) != 1 || rep.Started[0] != urgent {
				t.Fatalf("the first slot started %+v, want the priority run %s", rep, urgent)
			}
			if p := positionOf(t, s, alice, plain); p != 1 {
				t.Fatalf("the plain run is at %d, want 1", p)
			}
			for id := range startsByToken(hosts) {
				if id == canceled || id == short {
					t.Errorf("run %s started", id)
				}
			}
		})
	}
}
