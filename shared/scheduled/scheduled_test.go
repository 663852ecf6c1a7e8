package scheduled

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/emf"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

type env struct {
	f     *fleet.Fleet
	st    *boltstore.Store
	clk   *clock.Fake
	jobs  *Jobs
	hosts []*fakehost.Host
}

// newEnv is a Fleet on bbolt with the fake clock and n fake hosts (h0..),
// the last one disabled.
func newEnv(t *testing.T, n int) *env {
	t.Helper()
	dir := t.TempDir()
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	st, err := boltstore.Open(filepath.Join(dir, "fleet.db"), boltstore.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	creds := map[string]string{}
	var hosts []*fakehost.Host
	for i := 0; i < n; i++ {
		h := fakehost.New(fakehost.Config{Clock: clk})
		t.Cleanup(h.Close)
		hosts = append(hosts, h)
		creds["ref"] = h.Token()
	}
	b, _ := json.Marshal(creds)
	credsPath := filepath.Join(dir, "creds.json")
	os.WriteFile(credsPath, b, 0o600)
	src, err := credentials.NewFile(credsPath)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	f, err := fleet.New(fleet.Config{Store: st, Credentials: src, Logger: log, Clock: clk, HostTimeout: 10 * time.Second, ProbeTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hosts {
		enabled := i < n-1
		if _, err := f.RegisterHost(context.Background(), fleet.HostSpec{ID: "h" + string(rune('0'+i)), BaseURL: h.URL, CredentialRef: "ref", Enabled: &enabled}); err != nil {
			t.Fatal(err)
		}
	}
	jobs, err := New(Config{Fleet: f, Logger: log, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return &env{f: f, st: st, clk: clk, jobs: jobs, hosts: hosts}
}

func probed(t *testing.T, st store.Store) map[string]string {
	t.Helper()
	hosts, err := st.ListHosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, h := range hosts {
		if h.Probe != nil {
			out[h.ID] = h.Probe.Status
		}
	}
	return out
}

func TestProbeStartsNoProbeItCouldNotFinish(t *testing.T) {
	e := newEnv(t, 3)
	// 7 s to the deadline, 3 s kept back: 4 s of budget, under the 5 s a probe may take.
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Second)
	defer cancel()
	sum, err := e.jobs.Probe(ctx, events.EventBridgeEvent{})
	if err != nil || sum.Probed != 0 || len(sum.Skipped) != 2 || len(probed(t, e.st)) != 0 {
		t.Fatalf("short budget: %+v, %v, probes %v", sum, err, probed(t, e.st))
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err = e.jobs.Probe(ctx, events.EventBridgeEvent{})
	got := probed(t, e.st)
	if err != nil || sum.Probed != 2 || sum.Status["ok"] != 2 || len(sum.Skipped) != 0 || got["h0"] != "ok" || got["h1"] != "ok" || got["h2"] != "" {
		t.Fatalf("a minute: %+v, %v, probes %v (the disabled h2 must not be probed)", sum, err, got)
	}
}

func TestSweepKeepsRoomForAHostCallBeforeTheDeadline(t *testing.T) {
	e := newEnv(t, 2)
	c := store.Caller{OwnerID: "alice", AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{All: true}}
	if _, err := e.f.ProbeAll(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	res, err := e.f.Dispatch(context.Background(), c, fleet.DispatchRequest{Host: "h0", Run: runspec.Request{Agent: "shell"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	// 12 s to the deadline: less than the host timeout (10 s) and the margin (5 s).
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	rep, err := e.jobs.Sweep(ctx, events.EventBridgeEvent{})
	if err != nil || !rep.BudgetExhausted || rep.Events != 0 {
		t.Fatalf("no budget: %+v, %v", rep, err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err = e.jobs.Sweep(ctx, events.EventBridgeEvent{})
	if err != nil || rep.BudgetExhausted || rep.Live != 1 || rep.Events != 1 {
		t.Fatalf("a minute: %+v, %v", rep, err)
	}
	run, _ := e.st.GetRun(context.Background(), res.Run.FleetRunID)
	if run.EventCursor != 1 {
		t.Fatalf("run %+v", run)
	}
	// No deadline at all: DefaultBudget.
	if rep, err := e.jobs.Sweep(context.Background(), events.EventBridgeEvent{}); err != nil || rep.BudgetExhausted {
		t.Fatalf("no deadline: %+v, %v", rep, err)
	}
}

// TestSweepWritesItsLagAsOneEMFLine: each invocation writes one CloudWatch
// Embedded Metric Format line, Runfleet/SweepLagSeconds in seconds without
// dimensions, carrying the lag the report states; a sweep that finds the
// cursor held writes the holder's lag and does nothing else.
func TestSweepWritesItsLagAsOneEMFLine(t *testing.T) {
	e := newEnv(t, 2)
	c := store.Caller{OwnerID: "alice", AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{All: true}}
	if _, err := e.f.ProbeAll(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.Dispatch(context.Background(), c, fleet.DispatchRequest{Host: "h0", Run: runspec.Request{Agent: "shell"}}, ""); err != nil {
		t.Fatal(err)
	}
	var metrics syncbuf.Buffer
	jobs, err := New(Config{Fleet: e.f, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Clock: e.clk, Metrics: emf.New(&metrics)})
	if err != nil {
		t.Fatal(err)
	}
	sweep := func() fleet.SweepReport {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rep, err := jobs.Sweep(ctx, events.EventBridgeEvent{})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	first := sweep()
	if first.Lap != 2 || first.LapsEnded != 1 || first.Cursor != "" || first.Live != 1 || first.Busy {
		t.Fatalf("the first sweep: %+v", first)
	}
	line := lastEMF(t, &metrics, 1, e.clk.Now(), first.LagSeconds)
	if line != 0 {
		t.Fatalf("the first sweep's lag: %v s, want 0 (one lap, all of it now)", line)
	}

	// Another sweep holds the cursor: this one syncs nothing and reports
	// the time since the lap before the current one began.
	if _, err := e.st.ClaimSweepCursor(context.Background(), "another", e.clk.Now().Add(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(90 * time.Second)
	busy := sweep()
	if !busy.Busy || busy.Live != 0 || busy.Lap != 2 || busy.LagSeconds != 90 {
		t.Fatalf("the sweep finding the cursor held: %+v", busy)
	}
	if got := lastEMF(t, &metrics, 2, e.clk.Now(), busy.LagSeconds); got != 90 {
		t.Fatalf("lag metric %v s, want 90", got)
	}
}

// lastEMF checks that buf holds n lines, one per sweep so far, parses the
// last as an EMF document and returns its SweepLagSeconds value, after
// checking the document's shape, its timestamp (at) and that the value is
// the report's.
func lastEMF(t *testing.T, buf *syncbuf.Buffer, n int, at time.Time, reported float64) float64 {
	t.Helper()
	out := buf.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != n || !strings.HasSuffix(out, "\n") {
		t.Fatalf("metric lines: %q, want %d", out, n)
	}
	lines = lines[n-1:]
	var doc struct {
		AWS struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		} `json:"_aws"`
		Lag *float64 `json:"SweepLagSeconds"`
	}
	dec := json.NewDecoder(strings.NewReader(lines[0]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("the metric line %s is not the EMF document: %v", lines[0], err)
	}
	d := doc.AWS.CloudWatchMetrics
	if doc.AWS.Timestamp != at.UnixMilli() || len(d) != 1 || d[0].Namespace != "Runfleet" ||
		len(d[0].Dimensions) != 1 || len(d[0].Dimensions[0]) != 0 ||
		len(d[0].Metrics) != 1 || d[0].Metrics[0].Name != "SweepLagSeconds" || d[0].Metrics[0].Unit != "Seconds" || doc.Lag == nil {
		t.Fatalf("EMF document %s", lines[0])
	}
	if *doc.Lag != reported {
		t.Fatalf("the metric says %v s, the report %v s", *doc.Lag, reported)
	}
	return *doc.Lag
}

// TestSweepOfNothingLiveIsDebug: a sweep with no live run is routine
// (DEBUG); one that walked live runs says so at INFO.
func TestSweepOfNothingLiveIsDebug(t *testing.T) {
	e := newEnv(t, 2)
	var logs syncbuf.Buffer
	jobs, err := New(Config{Fleet: e.f, Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), Clock: e.clk})
	if err != nil {
		t.Fatal(err)
	}
	sweepLevel := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := jobs.Sweep(ctx, events.EventBridgeEvent{}); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		var l struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &l); err != nil || l.Msg != "scheduled sweep" {
			t.Fatalf("the sweep's last log line %q: %v", lines[len(lines)-1], err)
		}
		return l.Level
	}
	if level := sweepLevel(); level != "DEBUG" {
		t.Errorf("a sweep of nothing logs at %s, want DEBUG", level)
	}
	if _, err := e.f.ProbeAll(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	owner := store.Caller{OwnerID: "alice", AllowedHosts: store.Scope{All: true}, AllowedProjects: store.Scope{All: true}}
	if _, err := e.f.Dispatch(context.Background(), owner, fleet.DispatchRequest{Run: runspec.Request{Agent: "shell"}}, ""); err != nil {
		t.Fatal(err)
	}
	if level := sweepLevel(); level != "INFO" {
		t.Errorf("a sweep of a live run logs at %s, want INFO", level)
	}
}

// TestProbeWritesEachClassCapacityAsOneEMFLine: a probe invocation writes
// one EMF line per routing class, dimension RoutingClass, carrying the
// class's six figures as the pass computed them: a class whose runs wait
// with no host for them reports its queue and zeros; the class of the
// agent the hosts offer, its queue and the room on the enabled hosts.
func TestProbeWritesEachClassCapacityAsOneEMFLine(t *testing.T) {
	e := newEnv(t, 3)
	e.hosts[0].SetLoad(&hostproto.Load{Active: 1, MaxConcurrent: 3})
	e.hosts[1].SetLoad(&hostproto.Load{Active: 0, MaxConcurrent: 2})
	for _, q := range []struct {
		id, class string
		waited    time.Duration
	}{{"fr-1", "shell", 42 * time.Second}, {"fr-2", "shell?pool=ci", 10 * time.Second}, {"fr-3", "shell?pool=ci", 3 * time.Second}} {
		since := e.clk.Now().Add(-q.waited)
		r := store.Run{FleetRunID: q.id, OwnerID: "alice", Status: store.StatusQueued, Agent: "shell", CreatedAt: since, UpdatedAt: since,
			Queue: &store.QueueInfo{Class: q.class, Since: since, Timeout: time.Hour, Until: since.Add(time.Hour), Request: []byte(`{}`)}}
		if err := e.st.CreateRun(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	var metrics syncbuf.Buffer
	jobs, err := New(Config{Fleet: e.f, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Clock: e.clk, Metrics: emf.New(&metrics)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := jobs.Probe(ctx, events.EventBridgeEvent{})
	if err != nil || sum.Probed != 2 || sum.Classes != 2 {
		t.Fatalf("probe: %+v, %v", sum, err)
	}
	type figures struct {
		QueuedRuns, OldestQueuedWaitSeconds, FreeSlots, BusySlots, DrainingHosts, RoutableHosts float64
	}
	want := map[string]figures{
		"shell":         {QueuedRuns: 1, OldestQueuedWaitSeconds: 42, FreeSlots: 4, BusySlots: 1, RoutableHosts: 2},
		"shell?pool=ci": {QueuedRuns: 2, OldestQueuedWaitSeconds: 10},
	}
	lines := strings.Split(strings.TrimSuffix(metrics.String(), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("metric lines %q, want one per class", metrics.String())
	}
	units := map[string]string{"QueuedRuns": "Count", "OldestQueuedWaitSeconds": "Seconds", "FreeSlots": "Count",
		"BusySlots": "Count", "DrainingHosts": "Count", "RoutableHosts": "Count"}
	for _, l := range lines {
		var doc struct {
			figures
			RoutingClass string
			AWS          struct {
				Timestamp         int64
				CloudWatchMetrics []struct {
					Namespace  string
					Dimensions [][]string
					Metrics    []struct{ Name, Unit string }
				}
			} `json:"_aws"`
		}
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("line %s: %v", l, err)
		}
		d := doc.AWS.CloudWatchMetrics
		if doc.AWS.Timestamp != e.clk.Now().UnixMilli() || len(d) != 1 || d[0].Namespace != "Runfleet" ||
			len(d[0].Dimensions) != 1 || len(d[0].Dimensions[0]) != 1 || d[0].Dimensions[0][0] != "RoutingClass" || len(d[0].Metrics) != len(units) {
			t.Fatalf("EMF document %s", l)
		}
		for _, m := range d[0].Metrics {
			if units[m.Name] != m.Unit {
				t.Fatalf("metric %s in %s, want %s", m.Name, m.Unit, units[m.Name])
			}
		}
		if w, ok := want[doc.RoutingClass]; !ok || doc.figures != w {
			t.Fatalf("class %q: %+v, want %+v", doc.RoutingClass, doc.figures, w)
		}
		delete(want, doc.RoutingClass)
	}
}
