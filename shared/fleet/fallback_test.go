package fleet

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

var shellRun = DispatchRequest{Run: runspec.Request{Agent: "shell"}}

// excludedHosts is res.Excluded as host:reason pairs.
func excludedHosts(res DispatchResult) []string {
	var out []string
	for _, e := range res.Excluded {
		out = append(out, e.HostID+":"+e.Reasons[0])
	}
	return out
}

// TestDispatchGoesPastATransientRefusal: routing chose h1, which refuses
// busy; the dispatch starts the run on h2 under the same clientToken, says
// why in Excluded, and a retry with the same key answers that run without
// another start anywhere.
func TestDispatchGoesPastATransientRefusal(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	h1 := e.addHost(t, "h1", fakehost.Config{})
	h2 := e.addHost(t, "h2", fakehost.Config{})
	ctx := context.Background()
	h1.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)

	res, err := e.f.Dispatch(ctx, caller("alice"), shellRun, "k1")
	if err != nil || res.Refused || res.Run.HostID != "h2" || res.Run.Status == store.StatusDispatching {
		t.Fatalf("dispatch: %+v, %v", res, err)
	}
	if got := excludedHosts(res); !reflect.DeepEqual(got, []string{"h1:host_busy"}) {
		t.Errorf("excluded %v, want h1's refusal", got)
	}
	if h1.StartCalls() != 1 || h1.Created() != 0 || h2.Created() != 1 {
		t.Errorf("h1 called %d times and created %d runs, h2 created %d: want 1, 0, 1", h1.StartCalls(), h1.Created(), h2.Created())
	}
	starts := h2.Starts()
	if len(starts) != 1 || starts[0].ClientToken != res.Run.FleetRunID || starts[0].Deadline == nil {
		t.Fatalf("h2's start: %+v", starts)
	}
	stored, err := e.st.GetRun(ctx, res.Run.FleetRunID)
	if err != nil || stored.HostID != "h2" {
		t.Fatalf("stored: %+v, %v", stored, err)
	}

	again, err := e.f.Dispatch(ctx, caller("alice"), shellRun, "k1")
	if err != nil || !again.Reused || again.Run.FleetRunID != res.Run.FleetRunID || again.Run.HostID != "h2" {
		t.Fatalf("retried: %+v, %v", again, err)
	}
	if h1.StartCalls() != 1 || h2.StartCalls() != 1 {
		t.Errorf("the retry called a host: h1 %d, h2 %d starts", h1.StartCalls(), h2.StartCalls())
	}
}

// TestDispatchGoesPastAnUnreachableHost: a host probed ok that no longer
// answers cannot have started anything; the next host takes the run.
func TestDispatchGoesPastAnUnreachableHost(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	h1 := e.addHost(t, "h1", fakehost.Config{})
	h2 := e.addHost(t, "h2", fakehost.Config{})
	h1.Close()
	res, err := e.f.Dispatch(context.Background(), caller("alice"), shellRun, "")
	if err != nil || res.Refused || res.Run.HostID != "h2" || h2.Created() != 1 {
		t.Fatalf("dispatch: %+v, %v", res, err)
	}
	if got := excludedHosts(res); !reflect.DeepEqual(got, []string{"h1:" + hostproto.ReasonHostUnavailable}) {
		t.Errorf("excluded %v", got)
	}
}

// TestDispatchFallbackStops: no fallback for a named host, for a refusal
// about the run rather than the host, past MaxDispatchHosts, or when the
// caller's deadline leaves no room for another host call; when every host
// tried refuses, the run ends with the last refusal and Excluded lists
// them all.
func TestDispatchFallbackStops(t *testing.T) {
	ctx := context.Background()
	t.Run("named host", func(t *testing.T) {
		e := newTestEnv(t, 10*time.Second)
		h1 := e.addHost(t, "h1", fakehost.Config{})
		h2 := e.addHost(t, "h2", fakehost.Config{})
		h1.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
		res, err := e.f.Dispatch(ctx, caller("alice"), DispatchRequest{Host: "h1", Run: shellRun.Run}, "")
		if err != nil || !res.Refused || res.Run.HostID != "h1" || res.Run.Reason != hostproto.ReasonHostBusy || h2.StartCalls() != 0 {
			t.Fatalf("dispatch: %+v, %v; h2 called %d times", res, err, h2.StartCalls())
		}
	})
	t.Run("a refusal of the run", func(t *testing.T) {
		e := newTestEnv(t, 10*time.Second)
		h1 := e.addHost(t, "h1", fakehost.Config{})
		h2 := e.addHost(t, "h2", fakehost.Config{})
		h1.RefuseStarts(http.StatusConflict, hostproto.ReasonKeyNotGranted)
		res, err := e.f.Dispatch(ctx, caller("alice"), shellRun, "")
		if err != nil || !res.Refused || res.Run.Reason != hostproto.ReasonKeyNotGranted || h2.StartCalls() != 0 || len(res.Excluded) != 0 {
			t.Fatalf("dispatch: %+v, %v; h2 called %d times", res, err, h2.StartCalls())
		}
	})
	t.Run("every host refuses", func(t *testing.T) {
		e := newTestEnv(t, 10*time.Second)
		var hosts []*fakehost.Host
		for _, id := range []string{"h1", "h2", "h3", "h4", "h5"} {
			h := e.addHost(t, id, fakehost.Config{})
			h.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
			hosts = append(hosts, h)
		}
		hosts[2].RefuseStarts(http.StatusConflict, hostproto.CodeDraining)
		res, err := e.f.Dispatch(ctx, caller("alice"), shellRun, "")
		if err != nil || !res.Refused || res.Run.HostID != "h4" || res.Run.Reason != hostproto.ReasonHostBusy {
			t.Fatalf("dispatch: %+v, %v", res, err)
		}
		want := []string{"h1:host_busy", "h2:host_busy", "h3:draining", "h4:host_busy"}
		if got := excludedHosts(res); !reflect.DeepEqual(got, want) {
			t.Errorf("excluded %v, want %v", got, want)
		}
		if hosts[4].StartCalls() != 0 {
			t.Errorf("h5 was called past MaxDispatchHosts (%d)", MaxDispatchHosts)
		}
		stored, err := e.st.GetRun(ctx, res.Run.FleetRunID)
		if err != nil || stored.Status != store.StatusFailed || stored.HostID != "h4" {
			t.Fatalf("stored: %+v, %v", stored, err)
		}
	})
	t.Run("no time for another host", func(t *testing.T) {
		e := newTestEnv(t, 10*time.Second)
		h1 := e.addHost(t, "h1", fakehost.Config{})
		h2 := e.addHost(t, "h2", fakehost.Config{})
		h1.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
		short, cancel := context.WithTimeout(ctx, 10*time.Second+fallbackMargin-time.Millisecond)
		defer cancel()
		res, err := e.f.Dispatch(short, caller("alice"), shellRun, "")
		if err != nil || !res.Refused || res.Run.HostID != "h1" || h2.StartCalls() != 0 {
			t.Fatalf("dispatch: %+v, %v; h2 called %d times", res, err, h2.StartCalls())
		}
	})
}

// TestDispatchOrdersHostsByTheirProbedLoad: with both hosts able to take
// the run, the one whose probe showed a free slot is tried first, whatever
// the ids say.
func TestDispatchOrdersHostsByTheirProbedLoad(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	h1 := e.addHost(t, "h1", fakehost.Config{})
	e.addHost(t, "h2", fakehost.Config{})
	h1.SetLoad(&hostproto.Load{Active: 2, MaxConcurrent: 2})
	if _, err := e.f.ProbeAll(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	res, err := e.f.Dispatch(context.Background(), caller("alice"), shellRun, "")
	if err != nil || res.Run.HostID != "h2" || len(res.Excluded) != 0 || h1.StartCalls() != 0 {
		t.Fatalf("dispatch: %+v, %v; h1 called %d times", res, err, h1.StartCalls())
	}
}

// TestProbeLogsChangesNotRoutine: a healthy host's probes log at DEBUG
// only; a host that stops answering logs one WARN however many probes find
// it so, and one INFO when it answers again.
func TestProbeLogsChangesNotRoutine(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	h1 := e.addHost(t, "h1", fakehost.Config{})
	var logs syncbuf.Buffer
	f, err := New(Config{Store: e.st, Credentials: e.f.cfg.Credentials, Clock: e.clk,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	probeLines := func() map[string]int {
		counts := map[string]int{}
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var l struct{ Level, Msg, Host string }
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			if strings.HasPrefix(l.Msg, "probe") && l.Host == "h1" {
				counts[l.Level+" "+l.Msg]++
			}
		}
		return counts
	}
	for range 3 {
		if _, err := f.ProbeAll(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	h1.FailHealth(http.StatusServiceUnavailable)
	for range 3 {
		f.ProbeAll(ctx, true)
	}
	h1.FailHealth(0)
	f.ProbeAll(ctx, true)
	want := map[string]int{"DEBUG probe": 5, "WARN probe: host unhealthy": 1, "INFO probe: host healthy": 1}
	if got := probeLines(); !reflect.DeepEqual(got, want) {
		t.Errorf("probe log lines %v\nwant            %v", got, want)
	}
}
