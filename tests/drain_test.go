package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// drainAnswer is POST /fleet/hosts/{id}/drain's and /resume's answer.
type drainAnswer struct {
	HostID   string `json:"hostId"`
	Accepted any    `json:"accepted"`
	Draining bool   `json:"draining"`
	Idle     *bool  `json:"idle"`
	Host     struct {
		Probe struct {
			Draining bool  `json:"draining"`
			Idle     *bool `json:"idle"`
		} `json:"probe"`
	} `json:"host"`
}

func decodeDrain(t *testing.T, a answer) drainAnswer {
	t.Helper()
	var d drainAnswer
	if err := json.Unmarshal([]byte(a.raw), &d); err != nil {
		t.Fatalf("drain answer %s: %v", a.raw, err)
	}
	return d
}

// TestDrainFromFleet: an admin drains a host through Fleet; the host stops
// admitting, says whether it still runs tasks, and the very next dispatch
// goes elsewhere (routing excludes it as draining) without waiting for a
// probe; once the run ends, a drain says idle; resume routes to it again.
func TestDrainFromFleet(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			a := s.addHost(t, "a", fakehost.Config{}, nil)
			s.addHost(t, "b", fakehost.Config{}, nil)
			s.probe(t, "a")
			s.probe(t, "b")
			alice := s.mint(t, "alice", "*", "*")
			// Same latency on loopback, so "a" wins on its id.
			first := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			if first.str("hostId") != "a" {
				t.Fatalf("before the drain: routed to %s, want a", first.str("hostId"))
			}

			d := decodeDrain(t, s.must(t, http.StatusOK, "POST", "/fleet/hosts/a/drain", adminToken, ""))
			if d.HostID != "a" || d.Accepted != true || !d.Draining || d.Idle == nil || *d.Idle || !d.Host.Probe.Draining {
				t.Fatalf("drain of a host running a task: %+v, want accepted, draining, not idle, recorded", d)
			}
			var health struct {
				Draining bool `json:"draining"`
			}
			hostGet(t, a, "/healthz", &health)
			if !health.Draining {
				t.Fatal("the host itself was not drained")
			}
			next := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			if next.str("hostId") != "b" {
				t.Fatalf("after the drain: routed to %s, want b", next.str("hostId"))
			}
			// Alone, it is refused with its reason.
			s.must(t, http.StatusOK, "POST", "/fleet/hosts/b/enable", adminToken, `{"enabled":false}`)
			refused := s.must(t, http.StatusConflict, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			if got := excludedReasons(t, refused); !reflect.DeepEqual(got, map[string][]string{"a": {"draining"}, "b": {"disabled"}}) {
				t.Fatalf("refusal while a drains and b is disabled: %v", got)
			}

			// The run ends: a drain (again) and a probe both say idle.
			zero := 0
			a.SetRun(first.str("childRunId"), "succeeded", &zero, "")
			d = decodeDrain(t, s.must(t, http.StatusOK, "POST", "/fleet/hosts/a/drain", adminToken, "{}"))
			if !d.Draining || d.Idle == nil || !*d.Idle {
				t.Fatalf("drain of a host whose run ended: %+v, want draining and idle", d)
			}
			p := s.probe(t, "a")
			if probe, _ := p.body["probe"].(map[string]any); probe["draining"] != true || probe["idle"] != true {
				t.Fatalf("probe of a drained, idle host: %s", p.raw)
			}

			d = decodeDrain(t, s.must(t, http.StatusOK, "POST", "/fleet/hosts/a/resume", adminToken, ""))
			if d.Accepted != true || d.Draining || d.Host.Probe.Draining {
				t.Fatalf("resume: %+v, want accepted and not draining", d)
			}
			hostGet(t, a, "/healthz", &health)
			if health.Draining {
				t.Fatal("the host itself was not resumed")
			}
			again := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			if again.str("hostId") != "a" {
				t.Fatalf("after the resume: routed to %s, want a", again.str("hostId"))
			}
		})
	}
}

// TestDrainRefusals: only an admin drains or resumes; an unknown host is
// 404; a host that does not answer is drained in Fleet all the same (the
// answer says the host did not confirm), and a resume it does not confirm
// leaves the drain in place.
func TestDrainRefusals(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{})
	h := s.addHost(t, "a", fakehost.Config{}, nil)
	s.probe(t, "a")
	alice := s.mint(t, "alice", "*", "*")
	for _, verb := range []string{"drain", "resume"} {
		if a := s.do(t, "POST", "/fleet/hosts/a/"+verb, alice, ""); a.status != http.StatusForbidden {
			t.Errorf("%s by a caller who is not an admin: %d %s, want 403", verb, a.status, a.raw)
		}
		if a := s.do(t, "POST", "/fleet/hosts/nope/"+verb, adminToken, ""); a.status != http.StatusNotFound {
			t.Errorf("%s of an unknown host: %d %s, want 404", verb, a.status, a.raw)
		}
	}
	if a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`); a.str("hostId") != "a" {
		t.Fatalf("the refused drains changed routing: %s", a.raw)
	}

	h.Close()
	// Refused (409) or, if the call went out on a connection kept alive
	// from before the close, unknown (202): never taken.
	d := decodeDrain(t, untaken(t, s.do(t, "POST", "/fleet/hosts/a/drain", adminToken, "")))
	if d.Accepted == true || !d.Draining {
		t.Fatalf("drain of a host that does not answer: %+v, want not accepted, drained in Fleet", d)
	}
	refused := s.must(t, http.StatusConflict, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
	if got := excludedReasons(t, refused); !reflect.DeepEqual(got, map[string][]string{"a": {"draining"}}) {
		t.Fatalf("refusal after the unconfirmed drain: %v", got)
	}
	d = decodeDrain(t, untaken(t, s.do(t, "POST", "/fleet/hosts/a/resume", adminToken, "")))
	if d.Accepted == true || !d.Draining {
		t.Fatalf("resume of a host that does not answer: %+v, want not accepted, still draining", d)
	}
}

// untaken fails the test unless a is a verb's answer the host did not
// confirm: 409 (refused, or never delivered) or 202 (outcome unknown).
func untaken(t *testing.T, a answer) answer {
	t.Helper()
	if a.status != http.StatusConflict && a.status != http.StatusAccepted {
		t.Fatalf("%d %s, want 409 or 202", a.status, a.raw)
	}
	return a
}

// TestRoutingRereadsTheChosenHost: the routing view is written by the
// probe; what changed on a host since (a drain recorded by another
// function, a deletion) is seen by the strong re-read of the host routing
// chose, which then chooses again.
func TestRoutingRereadsTheChosenHost(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			for _, id := range []string{"a", "b", "c"} {
				s.addHost(t, id, fakehost.Config{}, nil)
				s.probe(t, id)
			}
			alice := s.mint(t, "alice", "*", "*")
			ctx := context.Background()
			// Behind the view's back: a drained, b deleted.
			if _, err := s.app.Fleet.Store().RecordDrain(ctx, "a", true, nil); err != nil {
				t.Fatal(err)
			}
			if del, err := s.app.Fleet.Store().DeleteHost(ctx, "b", false); err != nil || !del.Done {
				t.Fatalf("deleting b: %+v, %v", del, err)
			}
			got := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			if got.str("hostId") != "c" {
				t.Fatalf("routed to %s, want c (a drains, b is gone)", got.str("hostId"))
			}
			s.must(t, http.StatusOK, "POST", "/fleet/hosts/c/enable", adminToken, `{"enabled":false}`)
			if _, err := s.app.Fleet.Store().RecordDrain(ctx, "a", true, nil); err != nil {
				t.Fatal(err)
			}
			refused := s.must(t, http.StatusConflict, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
			if got := excludedReasons(t, refused); !reflect.DeepEqual(got, map[string][]string{"a": {"draining"}, "c": {"disabled"}}) {
				t.Fatalf("refusal: %v, want a draining and c disabled, b not listed", got)
			}
		})
	}
}

// hostGet reads a fake host's API directly, with its token.
func hostGet(t *testing.T, h *fakehost.Host, path string, out any) {
	t.Helper()
	req, _ := http.NewRequest("GET", h.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+h.Token())
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}
