package tests

import (
	"net/http"
	"testing"

	"github.com/runfleet/runfleet/shared/hostproto"
)

// TestAnEndedRunReadsEndedEverywhere: a run that ends on its host reads
// ended at once, with no sweep in between, in GET /fleet/runs/{id}, in the
// list, and in the answers of the verbs (an input to it, a cancel of it),
// on both stores; and a listing asks the hosts about live runs only.
func TestAnEndedRunReadsEndedEverywhere(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { endedEverywhere(t, kind) })
	}
}

func endedEverywhere(t *testing.T, kind string) {
	s := newStack(t, kind, stackOptions{})
	host, alice, _, _ := s.aliceRun(t)
	dispatch := func() (id, child string) {
		a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
		return a.str("fleetRunId"), a.str("childRunId")
	}
	status := func(view map[string]any) string { s, _ := view["status"].(string); return s }
	listed := func() map[string]map[string]any {
		out := map[string]map[string]any{}
		for _, x := range s.must(t, http.StatusOK, "GET", "/fleet/runs", alice, "").body["runs"].([]any) {
			v := x.(map[string]any)
			out[v["fleetRunId"].(string)] = v
		}
		return out
	}

	// The list: each run that ended on the host reads ended, and only the
	// live ones cost a host call.
	listedID, listedChild := dispatch()
	doneID, doneChild := dispatch()
	zero := 0
	host.SetRun(doneChild, hostproto.StatusSucceeded, &zero, "")
	listed() // records doneID's end
	host.ResetRequests()
	one := 1
	host.SetRun(listedChild, hostproto.StatusFailed, &one, hostproto.ReasonTimedOut)
	runs := listed()
	if v := runs[listedID]; status(v) != "failed" || v["reason"] != hostproto.ReasonTimedOut || v["exitCode"] != float64(1) || v["endedAt"] == nil {
		t.Fatalf("the list shows the ended run as %v", v)
	}
	if status(runs[doneID]) != "succeeded" {
		t.Fatalf("the list shows the run that ended earlier as %v", runs[doneID])
	}
	// Three runs are listed; at the time of the listing, two were live in
	// Fleet's record (the first aliceRun and listedID): two host reads.
	if got := host.Requests()["GET /runs/{id}"]; got != 2 {
		t.Fatalf("the listing asked the host %d times, want 2 (its live runs): %v", got, host.Requests())
	}

	// GET.
	getID, getChild := dispatch()
	host.SetRun(getChild, hostproto.StatusSucceeded, &zero, "")
	if r := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+getID, alice, "").body["run"].(map[string]any); status(r) != "succeeded" {
		t.Fatalf("GET shows the ended run as %v", r)
	}

	// An input to a run that ended: the host refuses it, and the answer
	// shows the run ended.
	inputID, inputChild := dispatch()
	host.SetRun(inputChild, hostproto.StatusFailed, &one, "")
	a := s.must(t, http.StatusConflict, "POST", "/fleet/runs/"+inputID+"/input", alice, `{"input":"y\n"}`)
	if a.body["accepted"] != false || a.str("code") != hostproto.CodeNotRunning || status(a.body["run"].(map[string]any)) != "failed" {
		t.Fatalf("input to an ended run: %s", a.raw)
	}
	// An accepted input answers the run as its host has it.
	liveID, liveChild := dispatch()
	host.SetRun(liveChild, hostproto.StatusRunning, nil, "")
	a = s.must(t, http.StatusOK, "POST", "/fleet/runs/"+liveID+"/input", alice, `{"input":"y\n"}`)
	if a.body["accepted"] != true || status(a.body["run"].(map[string]any)) != "running" {
		t.Fatalf("input to a running run: %s", a.raw)
	}

	// A cancel of a run that ended.
	cancelID, cancelChild := dispatch()
	host.SetRun(cancelChild, hostproto.StatusSucceeded, &zero, "")
	a = s.must(t, http.StatusConflict, "POST", "/fleet/runs/"+cancelID+"/cancel", alice, "")
	if a.body["accepted"] != false || status(a.body["run"].(map[string]any)) != "succeeded" {
		t.Fatalf("cancel of an ended run: %s", a.raw)
	}

	// Each of them stays ended in the store: a GET with the host gone
	// reads what was recorded.
	host.Close()
	for _, id := range []string{listedID, doneID, getID, inputID, cancelID} {
		r := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id, alice, "").body["run"].(map[string]any)
		if st := status(r); st != "failed" && st != "succeeded" {
			t.Fatalf("run %s reads %s once its host is gone", id, st)
		}
	}
}
