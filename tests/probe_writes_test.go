package tests

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// probeMaxAge and probeRefresh are the probe's settings in these tests:
// the defaults (RUNFLEET_PROBE_MAX_AGE 30m, the refresh half of it),
// given explicitly so that the tests say what they measure.
const (
	probeMaxAge  = 30 * time.Minute
	probeRefresh = probeMaxAge / 2
)

// quietFleet is a DynamoDB stack, metered, of n hosts probed ok and
// recorded at the stack's time: h00, a fake host registered and probed
// through the API; n-2 copies of its record (seedHosts: other ids and
// labels, the same address), which that one fake host answers for; and
// "x", a fake host of its own, labelled pool=solo, whose answers a test
// changes alone.
func quietFleet(tb testing.TB, n int) (*stack, *fakehost.Host) {
	tb.Helper()
	s := newStack(tb, "dynamodb", stackOptions{meter: &dynamostore.Meter{},
		env: map[string]string{config.EnvProbeMaxAge: probeMaxAge.String()}})
	s.addHost(tb, "h00", fakehost.Config{}, map[string]any{"labels": map[string]string{"pool": "ci"}})
	s.probe(tb, "h00")
	x := s.addHost(tb, "x", fakehost.Config{}, map[string]any{"labels": map[string]string{"pool": "solo"}})
	s.probe(tb, "x")
	seedHosts(tb, s, "h00", n-2)
	return s, x
}

// probePass runs one scheduled probe pass (fleet.ProbeEnabled, as the
// probe function does, without its budget: the fake clock would not
// spend it) over s's n hosts, metered, and checks that every host was
// probed ok; it returns what the pass reported and the units it used.
func probePass(tb testing.TB, s *stack, f *fleet.Fleet, n int) (fleet.ProbeReport, dynamostore.Usage) {
	tb.Helper()
	s.meter.Reset()
	rep, err := f.ProbeEnabled(context.Background(), time.Time{})
	if err != nil || len(rep.Probed) != n {
		tb.Fatalf("probe pass over %d hosts: %d probed, %v", n, len(rep.Probed), err)
	}
	for _, p := range rep.Probed {
		if p.Probe.Status != store.ProbeOK {
			tb.Fatalf("probe of %s: %+v", p.HostID, p.Probe)
		}
	}
	u := s.meter.Snapshot()
	if u.Calls["UpdateItem"] != rep.Written {
		tb.Fatalf("the pass reports %d probes recorded; the store took %d UpdateItem calls", rep.Written, u.Calls["UpdateItem"])
	}
	return rep, u
}

// recorded are the hosts whose probe a pass wrote.
func recorded(rep fleet.ProbeReport) []string {
	var ids []string
	for _, p := range rep.Probed {
		if p.Recorded {
			ids = append(ids, p.HostID)
		}
	}
	return ids
}

// TestProbeWritesOnlyWhatChangedAt1000Hosts: the probe pass over 1,000
// hosts on moto, its writes counted by dynamostore's meter. A pass after
// the first writes no host's probe when nothing changed: its WCU are the
// routing view's alone; a host whose load changes is written at the next
// pass, that host alone; and over a refresh interval of passes (one a
// minute on the fake clock) each quiet host is written exactly once, when
// its record is ProbeRefresh old, and no host more often than it changed.
// Routing stays current meanwhile: a dispatch just before the refresh is
// routed (through the view and the chosen host's record, ~13 minutes
// old) to the only host that can take it.
func TestProbeWritesOnlyWhatChangedAt1000Hosts(t *testing.T) {
	const n = 1000
	s, x := quietFleet(t, n)
	f := s.app.Fleet

	// Every record is due: the pass writes them all.
	s.clk.Advance(probeRefresh)
	rep, all := probePass(t, s, f, n)
	if rep.Written != n {
		t.Fatalf("the first pass recorded %d probes, want %d", rep.Written, n)
	}

	// A minute on, nothing changed: no host is written; the pass's WCU are
	// the routing view's (BatchWriteItem on the hosts table).
	s.clk.Advance(time.Minute)
	rep, quiet := probePass(t, s, f, n)
	view := quiet.WCU["hosts"]
	if rep.Written != 0 || quiet.Calls["BatchWriteItem"] == 0 || view == 0 {
		t.Fatalf("a quiet pass: %d recorded, %s", rep.Written, quiet)
	}
	perHost := (all.WCU["hosts"] - view) / n
	t.Logf("a pass at %d hosts: writing every probe %.0f WCU; quiet %.0f WCU (the routing view); %.2f WCU a host's probe; %.1f RCU (the scan)",
		n, all.WCU["hosts"], view, perHost, quiet.RCU["hosts"])
	if perHost < 1 {
		t.Fatalf("a probe's write costs %.2f WCU: the first pass did not write every host", perHost)
	}
	sh, err := f.Store().RouteShard(context.Background(), fleet.RouteListAny, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range sh.Hosts {
		if h.Probe == nil || !h.Probe.At.Equal(s.clk.Now()) {
			t.Fatalf("the routing view holds %s with %+v, want the quiet pass's own probe", h.ID, h.Probe)
		}
	}

	// Over one refresh interval of passes, after the all-writing one.
	writes := map[string]int{}
	count := func(rep fleet.ProbeReport) {
		for _, id := range recorded(rep) {
			writes[id]++
		}
	}
	count(rep)
	x.SetLoad(&hostproto.Load{Active: 0, MaxConcurrent: 2})
	s.clk.Advance(time.Minute)
	rep, changed := probePass(t, s, f, n)
	if got := recorded(rep); len(got) != 1 || got[0] != "x" {
		t.Fatalf("the pass after x's load changed recorded %v, want x alone", got)
	}
	if w := changed.WCU["hosts"] - view; w < 1 || w > 2*perHost {
		t.Fatalf("x's write cost %.2f WCU over the view's", w)
	}
	count(rep)
	for range int(probeRefresh/time.Minute) - 3 {
		s.clk.Advance(time.Minute)
		rep, _ := probePass(t, s, f, n)
		count(rep)
	}
	// 13 minutes on, x's record is 12 minutes old; a dispatch only x can
	// take is routed to it.
	s.clk.Advance(59 * time.Second)
	alice := s.mint(t, "alice", "*", "*")
	if a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell","labels":{"pool":"solo"}}`); a.str("hostId") != "x" {
		t.Fatalf("dispatch answer %s", a.raw)
	}
	// The interval's last pass: every quiet record is ProbeRefresh old.
	s.clk.Advance(time.Second)
	rep, _ = probePass(t, s, f, n)
	count(rep)
	if len(writes) != n {
		t.Fatalf("%d of %d hosts were written over a refresh interval", len(writes), n)
	}
	for id, w := range writes {
		// x: its load, then its run (no longer idle).
		if want := map[bool]int{true: 2, false: 1}[id == "x"]; w != want {
			t.Errorf("host %s written %d times in a refresh interval, want %d", id, w, want)
		}
	}
	if last := recorded(rep); len(last) != n {
		t.Fatalf("the refresh pass recorded %d probes, want %d: %v", len(last), n, fmt.Sprint(last[:min(5, len(last))]))
	}
}
