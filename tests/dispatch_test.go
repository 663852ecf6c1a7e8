package tests

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// TestConcurrentDispatchesWithOneKeyStartOneRun fires 50 identical
// dispatches with one Idempotency-Key at once: exactly one run reaches the
// host, exactly one answer is 201, and every answer names the same
// fleetRunId (200 reused, or 409 while the first is in flight).
func TestConcurrentDispatchesWithOneKeyStartOneRun(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host := s.addHost(t, "h1", fakehost.Config{}, nil)
			s.probe(t, "h1")
			token := s.mint(t, "alice", "*", "*")

			const n = 50
			answers := make([]answer, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range answers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					answers[i], errs[i] = s.send("POST", "/fleet/runs", token, `{"agent":"shell","prompt":"make test"}`,
						"Idempotency-Key", "deploy-42")
				}()
			}
			close(start)
			await.Group(t, "the concurrent dispatches", &wg)
			must(t, errors.Join(errs...))

			created, reused, inFlight := 0, 0, 0
			ids := map[string]int{}
			for _, a := range answers {
				switch a.status {
				case http.StatusCreated:
					created++
					ids[a.str("fleetRunId")]++
				case http.StatusOK:
					reused++
					if a.body["reused"] != true {
						t.Errorf("200 without reused: %s", a.raw)
					}
					ids[a.str("fleetRunId")]++
				case http.StatusConflict:
					inFlight++
					if a.body["code"] != "dispatch_in_flight" {
						t.Errorf("409 that is not in flight: %s", a.raw)
					}
					details, _ := a.body["details"].(map[string]any)
					id, _ := details["fleetRunId"].(string)
					ids[id]++
				default:
					t.Errorf("answer %d %s", a.status, a.raw)
				}
			}
			if created != 1 || len(ids) != 1 {
				t.Fatalf("created %d, reused %d, in flight %d, ids %v: want one 201 and one fleetRunId", created, reused, inFlight, ids)
			}
			if host.Created() != 1 || host.StartCalls() != 1 {
				t.Fatalf("the host created %d runs from %d start calls, want 1 from 1", host.Created(), host.StartCalls())
			}
			t.Logf("%s: 1 created, %d reused, %d in flight", kind, reused, inFlight)
		})
	}
}

// TestHostDyingAfterAcceptIsRecovered: the host records the run and dies
// before answering. Fleet leaves the run dispatching; recovery asks the host
// by clientToken and records the same child run; a retried request reuses
// it; the host never sees a second start.
func TestHostDyingAfterAcceptIsRecovered(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{hostTimeout: 5 * time.Second})
			host := s.addHost(t, "h1", fakehost.Config{}, nil)
			s.probe(t, "h1")
			token := s.mint(t, "alice", "*", "*")
			host.FaultStarts(fakehost.DieAfterAccept, 1)

			first := s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, `{"agent":"shell"}`, "Idempotency-Key", "k1")
			id := first.str("fleetRunId")
			if first.str("status") != "dispatching" || first.body["pending"] != true || first.str("note") == "" || first.body["childRunId"] != nil {
				t.Fatalf("first answer %s", first.raw)
			}
			if host.Created() != 1 {
				t.Fatalf("host created %d", host.Created())
			}
			// While the deadline has not passed, a retry is in flight.
			s.must(t, http.StatusConflict, "POST", "/fleet/runs", token, `{"agent":"shell"}`, "Idempotency-Key", "k1")

			// The sweep's recovery (scheduled by a later issue) finds the run by clientToken.
			rec, err := s.app.Fleet.RecoverDispatching(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != "pending" || rec.ChildRunID != "run-1" {
				t.Fatalf("recovered %+v", rec)
			}
			got := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id, token, "")
			run := got.body["run"].(map[string]any)
			if run["childRunId"] != "run-1" || run["status"] != "pending" {
				t.Fatalf("GET after recovery: %s", got.raw)
			}

			s.clk.Advance(6 * time.Second)
			again := s.must(t, http.StatusOK, "POST", "/fleet/runs", token, `{"agent":"shell"}`, "Idempotency-Key", "k1")
			if again.str("fleetRunId") != id || again.str("childRunId") != "run-1" || again.body["reused"] != true {
				t.Fatalf("retry answer %s", again.raw)
			}
			if host.Created() != 1 || host.StartCalls() != 1 {
				t.Fatalf("the host created %d runs from %d start calls, want 1 from 1", host.Created(), host.StartCalls())
			}
		})
	}
}

// TestDispatchFlow walks the documented answers: 201 new, 200 reused, 409
// for the key with another payload, the list and the run refreshed from the
// host.
func TestDispatchFlow(t *testing.T) {
	s := newStack(t, "dynamodb", stackOptions{repoURLs: map[string]string{"acme/web": "https://git.example/acme/web.git"}})
	host := s.addHost(t, "h1", fakehost.Config{}, map[string]any{"labels": map[string]string{"pool": "ci"}})
	s.probe(t, "h1")
	token := s.mint(t, "alice", "*", "*")

	body := `{"agent":"shell","prompt":"make","labels":{"pool":"ci"},"repository":"acme/web","localPath":"/srv/acme/web","idempotency":"b-1"}`
	a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, body)
	if a.str("hostId") != "h1" || a.str("status") != "pending" || a.body["pending"] != false || a.body["reused"] != false ||
		a.body["rewroteLocalPath"] != true || a.str("childRunId") != "run-1" {
		t.Fatalf("dispatch answer %s", a.raw)
	}
	start := host.Starts()[0]
	if start.CloneURL != "https://git.example/acme/web.git" || start.LocalPath != "" || start.ClientToken != a.str("fleetRunId") {
		t.Fatalf("host got %+v", start)
	}
	// The same key in the header and the body agree: reused.
	b := s.must(t, http.StatusOK, "POST", "/fleet/runs", token, body, "Idempotency-Key", "b-1")
	if b.str("fleetRunId") != a.str("fleetRunId") || b.body["rewroteLocalPath"] != true {
		t.Fatalf("reuse answer %s", b.raw)
	}
	c := s.must(t, http.StatusConflict, "POST", "/fleet/runs", token, `{"agent":"shell","idempotency":"b-1"}`)
	if c.body["code"] != "idempotency_key_reused" {
		t.Fatalf("other payload: %s", c.raw)
	}

	host.SetRun("run-1", "running", nil, "")
	g := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+a.str("fleetRunId"), token, "")
	if g.body["refreshed"] != true || g.body["run"].(map[string]any)["status"] != "running" {
		t.Fatalf("GET %s", g.raw)
	}
	l := s.must(t, http.StatusOK, "GET", "/fleet/runs?limit=5", token, "")
	if runs := l.body["runs"].([]any); len(runs) != 1 || runs[0].(map[string]any)["status"] != "running" {
		t.Fatalf("list %s", l.raw)
	}
}

// losingTheAnswer is the stack's store in a Fleet that dies between the
// host's answer and its record: the update recording the answer fails.
type losingTheAnswer struct {
	store.Store
	lost atomic.Bool
}

func (s *losingTheAnswer) UpdateRun(ctx context.Context, r store.Run) (store.Run, error) {
	if s.lost.CompareAndSwap(false, true) {
		return store.Run{}, errors.New("the process died before recording the host's answer")
	}
	return s.Store.UpdateRun(ctx, r)
}

// TestAnAnswerFleetLostIsRecovered: the host accepts the run and answers,
// and Fleet loses the answer (it dies before recording it). The run stays
// dispatching; the sweep's recovery asks the host by clientToken and
// records the same child run; the caller's retry reuses it; the host saw
// one start.
func TestAnAnswerFleetLostIsRecovered(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{hostTimeout: 5 * time.Second})
			host := s.addHost(t, "h1", fakehost.Config{}, nil)
			s.probe(t, "h1")
			token := s.mint(t, "alice", "*", "*")

			dying := s.fleetOn(t, &losingTheAnswer{Store: s.app.Store})
			alice := store.Caller{OwnerID: "alice", AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{All: true}}
			if _, err := dying.Dispatch(context.Background(), alice, fleet.DispatchRequest{Run: runspec.Request{Agent: "shell"}}, "k1"); err == nil {
				t.Fatal("the dispatch whose record failed reported success")
			}
			if host.Created() != 1 || host.StartCalls() != 1 || host.Starts()[0].ClientToken == "" {
				t.Fatalf("the host created %d runs from %d start calls", host.Created(), host.StartCalls())
			}
			id := host.Starts()[0].ClientToken
			if r, err := s.app.Store.GetRun(context.Background(), id); err != nil || r.Status != store.StatusDispatching || r.ChildRunID != "" {
				t.Fatalf("the run Fleet holds: %+v, %v; want it dispatching, the answer lost", r, err)
			}
			// Before the deadline, the caller's retry is in flight.
			s.must(t, http.StatusConflict, "POST", "/fleet/runs", token, `{"agent":"shell"}`, "Idempotency-Key", "k1")

			s.clk.Advance(11 * time.Second) // past the deadline (the dying Fleet's host timeout: 10 s)
			if rep := s.sweep(t); rep.Recovered != 1 {
				t.Fatalf("sweep = %+v", rep)
			}
			again := s.must(t, http.StatusOK, "POST", "/fleet/runs", token, `{"agent":"shell"}`, "Idempotency-Key", "k1")
			if again.str("fleetRunId") != id || again.str("childRunId") != "run-1" || again.body["reused"] != true || again.str("status") != "pending" {
				t.Fatalf("the retry after recovery: %s", again.raw)
			}
			if host.Created() != 1 || host.StartCalls() != 1 {
				t.Fatalf("the host created %d runs from %d start calls, want 1 from 1", host.Created(), host.StartCalls())
			}
		})
	}
}
