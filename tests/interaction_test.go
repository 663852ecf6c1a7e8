package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// TestInputReachesTheHostAsTheCallerMeantIt sends input in every shape a
// caller may: what the host receives is {"input": v} with v exactly the
// value meant, null included.
func TestInputReachesTheHostAsTheCallerMeantIt(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			host, alice, id, child := s.aliceRun(t)

			sends := []struct{ body, want string }{
				{`{"input": null}`, `null`},
				{`{"input":"ls -l\n"}`, `"ls -l\n"`},
				{`{"input":{"answer":42}}`, `{"answer":42}`},
				{`"yes"`, `"yes"`},
				{`null`, `null`},
				{`[1, 2]`, `[1, 2]`},
				{`7`, `7`},
				{`{"text":"no wrapper"}`, `{"text":"no wrapper"}`},
				{`{"input":{"input":1}}`, `{"input":1}`},
			}
			for _, c := range sends {
				r := s.must(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/input", alice, c.body)
				if r.body["accepted"] != true || r.str("fleetRunId") != id {
					t.Fatalf("input %s: %s", c.body, r.raw)
				}
			}
			got := host.Inputs(child)
			if len(got) != len(sends) {
				t.Fatalf("the host received %d inputs, want %d", len(got), len(sends))
			}
			for i, c := range sends {
				if !jsonEqual(got[i], c.want) {
					t.Errorf("sent %s: the host received %s, want %s", c.body, got[i], c.want)
				}
			}
			if string(got[0]) != "null" {
				t.Fatalf("{input: null} arrived as %q, want null", got[0])
			}
		})
	}
}

func jsonEqual(a json.RawMessage, b string) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal([]byte(b), &y) == nil && jsonString(x) == jsonString(y)
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestVerbsMapTheHostsAnswer: a 2xx is accepted, a 4xx refused with the
// host's code, no answer in time or a 5xx "unknown" with the detail, never
// a success the host did not confirm.
func TestVerbsMapTheHostsAnswer(t *testing.T) {
	s := newStack(t, "dynamodb", stackOptions{hostTimeout: 300 * time.Millisecond})
	host := s.addHost(t, "h1", fakehost.Config{}, nil)
	s.probe(t, "h1")
	alice := s.mint(t, "alice", "*", "*")
	id := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`).str("fleetRunId")

	host.FaultVerbs(fakehost.VerbsHang)
	r := s.must(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/input", alice, `{"input":"x"}`)
	if r.body["accepted"] != "unknown" || !strings.Contains(r.str("detail"), "did not answer in time") {
		t.Fatalf("a host that does not answer: %s", r.raw)
	}
	host.FaultVerbs(fakehost.VerbsFail)
	r = s.must(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/cancel", alice, "")
	if r.body["accepted"] != "unknown" || r.body["hostStatus"] != 500.0 {
		t.Fatalf("a host fault: %s", r.raw)
	}
	host.FaultVerbs(fakehost.VerbsNormal)
	r = s.must(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/retry", alice, `{}`)
	if r.body["accepted"] != false || r.body["hostStatus"] != 409.0 || r.str("code") != hostproto.CodeNotRetryable {
		t.Fatalf("a refused retry: %s", r.raw)
	}
	r = s.must(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/cancel", alice, "")
	run := r.body["run"].(map[string]any)
	if r.body["accepted"] != true || run["status"] != "canceled" || run["reason"] != "canceled" {
		t.Fatalf("an accepted cancel: %s", r.raw)
	}
	r = s.must(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/input", alice, `"late"`)
	if r.body["accepted"] != false || r.str("code") != hostproto.CodeNotRunning {
		t.Fatalf("input to an ended run: %s", r.raw)
	}
	if got := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id, alice, ""); got.body["run"].(map[string]any)["status"] != "canceled" {
		t.Fatalf("the recorded run after the cancel: %s", got.raw)
	}

	// A run that never reached its host has nothing to forward to.
	host.FaultStarts(fakehost.HangBeforeAccept, 1)
	pending := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`).str("fleetRunId")
	r = s.must(t, http.StatusConflict, "POST", "/fleet/runs/"+pending+"/cancel", alice, "")
	if r.str("code") != "run_not_on_host" || !strings.Contains(r.errorText(), "dispatching") {
		t.Fatalf("a verb on a dispatching run: %s", r.raw)
	}
}
