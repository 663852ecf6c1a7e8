package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
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

// TestVerbsMapTheHostsAnswer: a 2xx is accepted (200); a 4xx refused,
// answered 409 with the host's code; no answer in time or a 5xx "unknown"
// with the detail, answered 202 (the host may or may not have acted: never
// a success the host did not confirm, nor an error a client would retry
// into acting twice).
func TestVerbsMapTheHostsAnswer(t *testing.T) {
	s := newStack(t, "dynamodb", stackOptions{hostTimeout: 300 * time.Millisecond})
	host := s.addHost(t, "h1", fakehost.Config{}, nil)
	s.probe(t, "h1")
	alice := s.mint(t, "alice", "*", "*")
	id := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`).str("fleetRunId")

	host.FaultVerbs(fakehost.VerbsHang)
	r := s.must(t, http.StatusAccepted, "POST", "/fleet/runs/"+id+"/input", alice, `{"input":"x"}`)
	if r.body["accepted"] != "unknown" || !strings.Contains(r.str("detail"), "did not answer in time") || r.body["error"] != nil {
		t.Fatalf("a host that does not answer: %s", r.raw)
	}
	host.FaultVerbs(fakehost.VerbsFail)
	r = s.must(t, http.StatusAccepted, "POST", "/fleet/runs/"+id+"/cancel", alice, "")
	if r.body["accepted"] != "unknown" || r.body["hostStatus"] != 500.0 {
		t.Fatalf("a host fault: %s", r.raw)
	}
	host.FaultVerbs(fakehost.VerbsNormal)
	r = s.must(t, http.StatusConflict, "POST", "/fleet/runs/"+id+"/retry", alice, `{}`)
	if r.body["accepted"] != false || r.body["hostStatus"] != 409.0 || r.str("code") != hostproto.CodeNotRetryable ||
		!strings.Contains(r.errorText(), "host h1 refused the retry of run "+id+" (not_retryable)") || r.str("fleetRunId") != id {
		t.Fatalf("a refused retry: %s", r.raw)
	}
	r = s.must(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/cancel", alice, "")
	run := r.body["run"].(map[string]any)
	if r.body["accepted"] != true || run["status"] != "canceled" || run["reason"] != "canceled" {
		t.Fatalf("an accepted cancel: %s", r.raw)
	}
	r = s.must(t, http.StatusConflict, "POST", "/fleet/runs/"+id+"/input", alice, `"late"`)
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
	if r.str("code") != "run_not_on_host" || !strings.Contains(r.errorText(), "dispatching") || r.body["accepted"] != nil {
		t.Fatalf("a verb on a dispatching run: %s", r.raw)
	}
}

// TestInteractionRefusalsAnswerTheirCode: each verb a host refuses, run verbs and
// host verbs alike, answers 409 with an error body whose code says why,
// keeping what the host said and the run (or host) as recorded; a verb that
// certainly never reached its host is 409 host_unavailable. No refusal is
// a 200 with accepted false.
func TestInteractionRefusalsAnswerTheirCode(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{})
	host, alice, id, child := s.aliceRun(t)
	zero := 0
	host.SetRun(child, hostproto.StatusSucceeded, &zero, "")
	s.addHost(t, "h2", fakehost.Config{}, nil)
	s.probe(t, "h2")
	live := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell","host":"h2"}`).str("fleetRunId")

	for _, c := range []struct {
		name, path, token, body string
		code, host              string
		hostStatus              float64
	}{
		{"input to an ended run", "/fleet/runs/" + id + "/input", alice, `"y"`, hostproto.CodeNotRunning, "h1", 409},
		{"cancel of an ended run", "/fleet/runs/" + id + "/cancel", alice, "", hostproto.CodeNotRunning, "h1", 409},
		{"retry of a live run", "/fleet/runs/" + live + "/retry", alice, "", hostproto.CodeNotRetryable, "h2", 409},
	} {
		a := s.do(t, "POST", c.path, c.token, c.body)
		run, _ := a.body["run"].(map[string]any)
		if a.status != http.StatusConflict || a.str("code") != c.code || a.body["accepted"] != false || a.body["hostStatus"] != c.hostStatus ||
			a.str("detail") == "" || !strings.Contains(a.errorText(), "host "+c.host+" refused") || !strings.Contains(a.errorText(), "("+c.code+")") ||
			run == nil || run["hostId"] != c.host {
			t.Errorf("%s: %d %s, want 409 %s with the host's detail and the run", c.name, a.status, a.raw, c.code)
		}
	}
	// The ended run was recorded ended by the refusal's refresh.
	if r := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id, alice, "").body["run"].(map[string]any); r["status"] != "succeeded" {
		t.Fatalf("the run after the refusals: %v", r)
	}

	// A host gone before Fleet ever reached it (so no kept-alive
	// connection can make a call's fate unknown): every verb, on its run
	// and on it, is refused as never delivered, since nothing can have
	// been done.
	gone := fakehost.New(fakehost.Config{Clock: s.clk})
	gone.Close()
	s.must(t, http.StatusCreated, "POST", "/fleet/hosts", adminToken,
		jsonBody(map[string]any{"id": "h3", "baseUrl": gone.URL, "credentialRef": hostCredRef}))
	now := s.clk.Now()
	const stranded = "fr-gonehostrunaaaaaaaaaaaaaaa"
	if err := s.app.Store.CreateRun(t.Context(), store.Run{FleetRunID: stranded, OwnerID: "alice", HostID: "h3", ChildRunID: "run-1",
		Status: hostproto.StatusRunning, Attempt: 1, Agent: "shell", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, path, token, body string }{
		{"input", "/fleet/runs/" + stranded + "/input", alice, `"y"`},
		{"cancel", "/fleet/runs/" + stranded + "/cancel", alice, ""},
		{"retry", "/fleet/runs/" + stranded + "/retry", alice, "{}"},
		{"drain", "/fleet/hosts/h3/drain", adminToken, ""},
		{"resume", "/fleet/hosts/h3/resume", adminToken, ""},
	} {
		a := s.do(t, "POST", c.path, c.token, c.body)
		if a.status != http.StatusConflict || a.str("code") != "host_unavailable" || a.body["accepted"] != false ||
			!strings.Contains(a.errorText(), "host h3 could not be reached for the "+c.name) || !strings.Contains(a.str("detail"), "not delivered") {
			t.Errorf("%s with its host gone: %d %s, want 409 host_unavailable", c.name, a.status, a.raw)
		}
	}
	// A drain is recorded on the host's last probe (TestDrainRefusals: all
	// the same when refused); h3 has none, routing excludes it as never
	// probed, and the refusal claims no recording.
	a := s.must(t, http.StatusConflict, "POST", "/fleet/hosts/h3/drain", adminToken, "")
	if a.body["draining"] != false || strings.Contains(a.errorText(), "recorded") || a.body["host"] == nil {
		t.Fatalf("a drain of a host never probed, never delivered: %s", a.raw)
	}
}
