package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestRoutingRefusalPastTheView: in a fleet larger than the routing view
// keeps, a request no host considered can take reads the list's shards,
// at most three, never a host, and the 409 says how many hosts it
// considered of how many, with every one of them in details.excluded.
func TestRoutingRefusalPastTheView(t *testing.T) {
	const hosts = 2000
	s, token, _ := routedStack(t, hosts)
	s.meter.Reset()
	a := s.must(t, http.StatusConflict, "POST", "/fleet/runs", token, `{"agent":"shell","labels":{"pool":"gpu"}}`)
	u := s.meter.Snapshot()
	var body struct {
		Error   string `json:"error"`
		Details struct {
			Considered int `json:"considered"`
			Hosts      int `json:"hosts"`
			Excluded   []struct {
				HostID  string   `json:"hostId"`
				Reasons []string `json:"reasons"`
			} `json:"excluded"`
		} `json:"details"`
	}
	if err := json.Unmarshal([]byte(a.raw), &body); err != nil {
		t.Fatal(err)
	}
	d := body.Details
	t.Logf("refusal over %d hosts: %d considered; %s", hosts, d.Considered, u)
	if d.Hosts != hosts || d.Considered <= 0 || d.Considered >= hosts || len(d.Excluded) != d.Considered {
		t.Fatalf("details: %d considered of %d, %d excluded; want every considered host excluded, fewer than %d", d.Considered, d.Hosts, len(d.Excluded), hosts)
	}
	for _, e := range d.Excluded {
		if strings.Join(e.Reasons, ",") != "label_missing" {
			t.Fatalf("%s excluded for %v, want label_missing", e.HostID, e.Reasons)
		}
	}
	if !strings.Contains(body.Error, "hosts considered") {
		t.Errorf("the message does not say how many hosts were considered: %q", body.Error)
	}
	// Three shards, eventually consistent, under 4 KB each: 1.5 units.
	if u.Calls["Scan"] != 0 || u.RCU["hosts"] != 1.5 {
		t.Errorf("hosts table reads: %g RCU, calls %v; want 1.5 (three shards) and no Scan", u.RCU["hosts"], u.Calls)
	}

	// A caller limited to two hosts learns how many of its own were
	// considered, nothing of the fleet's size.
	bob := s.mint(t, "bob", []string{"h00", "s00001"}, "*")
	b := s.must(t, http.StatusConflict, "POST", "/fleet/runs", bob, `{"agent":"shell","labels":{"pool":"gpu"}}`)
	var scoped map[string]any
	json.Unmarshal([]byte(b.raw), &scoped)
	details, _ := scoped["details"].(map[string]any)
	if details["considered"] != float64(2) || details["hosts"] != nil || strings.Contains(b.raw, "2000") {
		t.Errorf("a scoped caller's refusal: %s; want 2 of its hosts considered and no fleet size", b.raw)
	}
}
