package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/infra/localstack/demo"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// Routing past a busy host, with real edge hosts: each admits at most
// runner.maxConcurrent runs and refuses the next host_busy at admission.

// twoEdges opens two edge hosts of capacity slots each, registers them as
// edge-a and edge-b on one Fleet and probes both while idle. It returns
// the Fleet, the edges by host id, and a caller's token.
func twoEdges(t *testing.T, slots int) (*e2eFleet, map[string]*e2eEdge, string) {
	edges := map[string]*e2eEdge{}
	f := newE2EFleet(t)
	for _, id := range []string{"edge-a", "edge-b"} {
		e := newE2EEdge(t)
		e.openWith(false, func(c *config.Config) { c.Runner.MaxConcurrent = slots })
		edges[id] = e
		f.call(t, http.StatusCreated, "POST", "/fleet/hosts", adminToken,
			fmt.Sprintf(`{"id":%q,"baseUrl":%q,"credentialRef":%q}`, id, e.baseURL(), e2eHostRef))
		p := jsonObj(f.call(t, http.StatusOK, "POST", "/fleet/hosts/"+id+"/probe", adminToken, "").body, "probe")
		if p["status"] != "ok" || jsonObj(p, "load")["maxConcurrent"] != float64(slots) || jsonObj(p, "load")["active"] != float64(0) {
			t.Fatalf("probe of %s: %v", id, p)
		}
	}
	return f, edges, f.mint(t, "alice", "*", "*")
}

// holdSlot is a run that keeps its slot until it is canceled.
const holdSlot = `{"agent":%q,"prompt":"sleep 600"}`

func excludedOf(a answer) []any { return jsonList(jsonObj(a.body, "details")["excluded"]) }

// TestDispatchGoesToTheIdleHost: a run holds edge X's only slot; the
// routing view, probed before, still prefers X, which refuses the next
// dispatch host_busy at admission; the dispatch lands on the other host
// with X's refusal in details.excluded, and a retry with the same key
// answers that run without starting it anywhere again. Then X stops
// answering: the next dispatch lands on the other host the same way, with
// X unreachable.
func TestDispatchGoesToTheIdleHost(t *testing.T) {
	f, edges, alice := twoEdges(t, 1)
	body := fmt.Sprintf(holdSlot, demo.ShellAgent)
	first := f.call(t, http.StatusCreated, "POST", "/fleet/runs", alice, body)
	busyID := first.str("hostId")
	idleID := map[string]string{"edge-a": "edge-b", "edge-b": "edge-a"}[busyID]
	busy, idle := edges[busyID], edges[idleID]

	second := f.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, body, "Idempotency-Key", "fallback-1")
	if second.str("hostId") != idleID || second.str("status") == "failed" {
		t.Fatalf("the second run went to %s (%s): %s", second.str("hostId"), second.str("status"), second.raw)
	}
	ex := excludedOf(second)
	if len(ex) != 1 || jsonObj(ex[0])["hostId"] != busyID || fmt.Sprint(jsonObj(ex[0])["reasons"]) != "[host_busy]" ||
		!strings.Contains(fmt.Sprint(jsonObj(ex[0])["detail"]), "maxConcurrent") {
		t.Fatalf("details.excluded = %v, want %s's host_busy refusal", ex, busyID)
	}
	runID := second.str("fleetRunId")
	// The busy host recorded the start it refused, and never ran it.
	refused, found, err := busy.client.FindByClientToken(context.Background(), runID)
	if err != nil || !found || refused.Status != hostproto.StatusFailed || refused.Reason != hostproto.ReasonHostBusy || refused.ExitCode != nil {
		t.Fatalf("on the busy host: %+v found %v, %v", refused, found, err)
	}
	started, found, err := idle.client.FindByClientToken(context.Background(), runID)
	if err != nil || !found || hostproto.TerminalStatus(started.Status) {
		t.Fatalf("on the idle host: %+v found %v, %v", started, found, err)
	}
	startsBefore := busy.starts() + idle.starts()
	again := f.must(t, http.StatusOK, "POST", "/fleet/runs", alice, body, "Idempotency-Key", "fallback-1")
	if again.str("fleetRunId") != runID || again.str("hostId") != idleID || again.body["reused"] != true {
		t.Fatalf("the retried dispatch: %s", again.raw)
	}
	if n := busy.starts() + idle.starts(); n != startsBefore {
		t.Fatalf("the retried dispatch reached a host: %d starts, were %d", n, startsBefore)
	}
	if run := f.run(t, alice, runID); run["hostId"] != idleID {
		t.Fatalf("GET the run: %v", run)
	}

	// Free the idle host's slot, then take the busy host away.
	f.call(t, http.StatusOK, "POST", "/fleet/runs/"+runID+"/cancel", alice, "")
	await.Cond(t, time.Minute, "the idle host has a free slot again", func() bool {
		h, err := idle.client.Health(context.Background())
		return err == nil && h.Load != nil && h.Load.Active == 0
	})
	busy.shutdown()
	third := f.call(t, http.StatusCreated, "POST", "/fleet/runs", alice, body)
	ex = excludedOf(third)
	if third.str("hostId") != idleID || len(ex) != 1 || jsonObj(ex[0])["hostId"] != busyID ||
		fmt.Sprint(jsonObj(ex[0])["reasons"]) != "["+hostproto.ReasonHostUnavailable+"]" {
		t.Fatalf("with %s unreachable: %s", busyID, third.raw)
	}
}

// TestConcurrentDispatchesFillEveryHostExactlyOnce: 50 dispatches at once
// across two hosts of 2 slots each. Exactly 4 start (none is refused while
// a slot is free), each on exactly one host, 2 per host; the other 46 are
// refused host_busy naming both hosts, and no host runs a run Fleet
// recorded elsewhere.
func TestConcurrentDispatchesFillEveryHostExactlyOnce(t *testing.T) {
	const n = 50
	f, edges, alice := twoEdges(t, 2)
	body := fmt.Sprintf(holdSlot, demo.ShellAgent)
	answers := make([]answer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			answers[i], errs[i] = f.send("POST", "/fleet/runs", alice, body, "Idempotency-Key", fmt.Sprintf("many-%d", i))
		})
	}
	wg.Wait()
	perHost := map[string]int{}
	var started []answer
	for i, a := range answers {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		switch a.status {
		case http.StatusCreated:
			perHost[a.str("hostId")]++
			started = append(started, a)
		case http.StatusConflict:
			ex := excludedOf(a)
			if a.str("code") != hostproto.ReasonHostBusy || len(ex) != 2 || jsonObj(ex[0])["hostId"] == jsonObj(ex[1])["hostId"] {
				t.Errorf("a refused dispatch: %s", a.raw)
			}
		default:
			t.Errorf("dispatch %d: %d %s", i, a.status, a.raw)
		}
	}
	if len(started) != 4 || perHost["edge-a"] != 2 || perHost["edge-b"] != 2 {
		t.Fatalf("started %d runs, per host %v: want 2 on each", len(started), perHost)
	}
	for _, a := range started {
		id, on := a.str("fleetRunId"), a.str("hostId")
		for hostID, e := range edges {
			r, found, err := e.client.FindByClientToken(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			live := found && !hostproto.TerminalStatus(r.Status)
			if live != (hostID == on) {
				t.Errorf("run %s (Fleet: on %s) on %s: found %v, %+v", id, on, hostID, found, r)
			}
		}
	}
	for id, e := range edges {
		h, err := e.client.Health(context.Background())
		if err != nil || h.Load == nil || h.Load.Active != 2 {
			t.Errorf("%s's load: %+v, %v", id, h.Load, err)
		}
	}
}
