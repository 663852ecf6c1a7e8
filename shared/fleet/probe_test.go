package fleet

import (
	"context"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// TestProbeChangeIsWhatMatters: a probe is recorded when a host was
// never probed, when anything but its latency and time changed (storage
// past a tenth of what was free), or when the record is refresh old.
func TestProbeChangeIsWhatMatters(t *testing.T) {
	idle, busy := true, false
	notAfter := routeNow.Add(90 * 24 * time.Hour)
	was := store.Probe{
		Status: store.ProbeOK, At: routeNow, LatencyMs: 5, Version: "edge-9", Agents: []string{"claude", "shell"},
		Features: store.Features{SecretsProxy: true}, CA: &store.CAInfo{NotAfter: notAfter}, Idle: &idle,
		Storage: &store.Storage{FreeBytes: 100 << 30, MinFreeBytes: 1 << 30},
		Limits:  &store.Limits{Enforced: "cgroup2", Pids: 1024}, Load: &store.Load{Active: 0, MaxConcurrent: 4},
		LedgerKey: "ed25519:abc",
	}
	same := func(change func(p *store.Probe)) store.Probe {
		p := was
		p.At = routeNow.Add(time.Minute)
		p.LatencyMs = 900
		p.Agents = []string{"claude", "shell"}
		ca, st, lim, load := *was.CA, *was.Storage, *was.Limits, *was.Load
		p.CA, p.Storage, p.Limits, p.Load = &ca, &st, &lim, &load
		change(&p)
		return p
	}
	successor := notAfter.Add(time.Hour)
	cases := []struct {
		name string
		p    store.Probe
		want string
	}{
		{"latency and time", same(func(*store.Probe) {}), ""},
		{"free space within a tenth", same(func(p *store.Probe) { p.Storage.FreeBytes = 91 << 30 }), ""},
		{"free space past a tenth", same(func(p *store.Probe) { p.Storage.FreeBytes = 90 << 30 }), "storage"},
		{"low", same(func(p *store.Probe) { p.Storage.Low = true }), "storage"},
		{"reserve", same(func(p *store.Probe) { p.Storage.MinFreeBytes = 2 << 30 }), "storage"},
		{"storage gone", same(func(p *store.Probe) { p.Storage = nil }), "storage"},
		{"refresh due", same(func(p *store.Probe) { p.At = routeNow.Add(15 * time.Minute) }), "refresh"},
		{"status", same(func(p *store.Probe) { p.Status = store.ProbeUnreachable }), "status"},
		{"detail", same(func(p *store.Probe) { p.Detail = "the host did not answer" }), "detail"},
		{"version", same(func(p *store.Probe) { p.Version = "edge-10" }), "version"},
		{"agents", same(func(p *store.Probe) { p.Agents = []string{"shell"} }), "agents"},
		{"features", same(func(p *store.Probe) { p.Features.ExecRequire = true }), "features"},
		{"ca successor", same(func(p *store.Probe) { p.CA.SuccessorNotAfter = &successor }), "ca"},
		{"draining", same(func(p *store.Probe) { p.Draining = true }), "draining"},
		{"idle", same(func(p *store.Probe) { p.Idle = &busy }), "idle"},
		{"limits", same(func(p *store.Probe) { p.Limits.Pids = 2048 }), "limits"},
		{"load", same(func(p *store.Probe) { p.Load.Active = 1 }), "load"},
		{"ledger key", same(func(p *store.Probe) { p.LedgerKey = "ed25519:def" }), "ledgerKey"},
	}
	for _, c := range cases {
		if got := probeChange(&was, c.p, 15*time.Minute); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := probeChange(nil, was, 15*time.Minute); got != "never probed" {
		t.Errorf("never probed: %q", got)
	}
	// A host failing the same way, numbers aside, is not rewritten.
	a := store.Probe{Status: store.ProbeBadResponse, At: routeNow, Detail: "host answered 502 after 1003 ms"}
	b := a
	b.At, b.Detail = routeNow.Add(time.Minute), "host answered 503 after 12 ms"
	if got := probeChange(&a, b, 15*time.Minute); got != "" {
		t.Errorf("the same failure with other numbers: %q", got)
	}
}

// TestProbeWakesHostsWithRoomForWaitingClasses: a wake per host routable
// now with free slots for one of the classes, for all its free slots;
// none for a full, draining, stale or unlabelled host, nor for a class
// nobody waits in.
func TestProbeWakesHostsWithRoomForWaitingClasses(t *testing.T) {
	ci := map[string]string{"pool": "ci"}
	draining := loaded("d1", ci, 0, 2)
	draining.Probe.Draining = true
	stale := loaded("s1", ci, 0, 2)
	stale.Probe.At = routeNow.Add(-time.Hour)
	claude := loaded("c1", nil, 0, 3)
	claude.Probe.Agents = []string{"claude"}
	hosts := []store.Host{loaded("h2", ci, 1, 4), loaded("h1", ci, 2, 2), draining, stale, loaded("u1", nil, 0, 2), claude}
	got := ProbeWakes(hosts, []string{ClassOf("shell", ci), "codex"}, routeNow, 5*time.Minute)
	want := []Wake{{HostID: "h2", Slots: 3, Reason: WakeProbe}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("wakes %+v, want %+v", got, want)
	}
	got = ProbeWakes(hosts, []string{"claude", ClassOf("shell", ci)}, routeNow, 5*time.Minute)
	want = []Wake{{HostID: "c1", Slots: 3, Reason: WakeProbe}, {HostID: "h2", Slots: 3, Reason: WakeProbe}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("wakes %+v, want %+v", got, want)
	}
	if got := ProbeWakes(hosts, nil, routeNow, 5*time.Minute); len(got) != 0 {
		t.Fatalf("wakes with nothing waiting: %+v", got)
	}
}

// recordedAt is when the store's record of host id was probed.
func recordedAt(t *testing.T, e *testEnv, id string) time.Time {
	t.Helper()
	h, err := e.st.GetHost(context.Background(), id)
	if err != nil || h.Probe == nil {
		t.Fatalf("host %s: %+v, %v", id, h.Probe, err)
	}
	return h.Probe.At
}

// TestProbePassWritesOnlyWhatChanged: after the first probe, a pass
// records nothing for quiet hosts, yet the routing view it writes carries
// the probes it took; a host whose load changed is recorded at once; a
// quiet host's record is rewritten once it is ProbeRefresh old (default
// ProbeMaxAge/2) and never reaches ProbeMaxAge; the admin's probes record
// whatever changed.
func TestProbePassWritesOnlyWhatChanged(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	ctx := context.Background()
	e.f.cfg.ProbeMaxAge = 10 * time.Minute
	quiet := e.addHost(t, "quiet", fakehost.Config{})
	busy := e.addHost(t, "busy", fakehost.Config{})
	quiet.SetLoad(&hostproto.Load{Active: 0, MaxConcurrent: 2})
	busy.SetLoad(&hostproto.Load{Active: 0, MaxConcurrent: 2})
	rep, err := e.f.ProbeEnabled(ctx, time.Time{})
	if err != nil || len(rep.Probed) != 2 || rep.Written != 2 {
		t.Fatalf("the load is new to both records: %+v, %v", rep, err)
	}
	first := recordedAt(t, e, "quiet")

	e.clk.Advance(time.Minute)
	busy.SetLoad(&hostproto.Load{Active: 1, MaxConcurrent: 2})
	rep, err = e.f.ProbeEnabled(ctx, time.Time{})
	if err != nil || len(rep.Probed) != 2 || rep.Written != 1 {
		t.Fatalf("one host changed: %+v, %v", rep, err)
	}
	if got := recordedAt(t, e, "quiet"); !got.Equal(first) {
		t.Fatalf("the quiet host was rewritten: %v, want %v", got, first)
	}
	if got := recordedAt(t, e, "busy"); !got.Equal(e.clk.Now()) {
		t.Fatalf("the changed host's record is of %v, want now", got)
	}
	sh, err := e.st.RouteShard(ctx, RouteListAny, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range sh.Hosts {
		if h.Probe == nil || !h.Probe.At.Equal(e.clk.Now()) {
			t.Fatalf("the routing view's %s holds %+v, want the pass's probe", h.ID, h.Probe)
		}
	}

	// Passes every minute: each host is rewritten when its record is 5
	// minutes (ProbeMaxAge/2) old (quiet at 5 and 10, busy at 6); routing
	// never finds either stale.
	writes := 0
	for range 9 {
		e.clk.Advance(time.Minute)
		rep, err := e.f.ProbeEnabled(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		writes += rep.Written
		if age := e.clk.Now().Sub(recordedAt(t, e, "quiet")); age >= e.f.cfg.ProbeMaxAge/2+time.Minute {
			t.Fatalf("the quiet host's record is %v old", age)
		}
		d := Route(RouteInput{Hosts: mustHosts(t, e), Agent: "shell", Now: e.clk.Now(), MaxProbeAge: e.f.cfg.ProbeMaxAge})
		if len(d.Excluded) != 0 {
			t.Fatalf("routing excluded %+v", d.Excluded)
		}
	}
	if writes != 3 {
		t.Fatalf("%d writes in 9 quiet minutes of 2 hosts, want 3 (each host every 5 minutes)", writes)
	}

	// The admin's probes record every probe.
	e.clk.Advance(time.Minute)
	if _, err := e.f.ProbeAll(ctx, true); err != nil {
		t.Fatal(err)
	}
	if got := recordedAt(t, e, "quiet"); !got.Equal(e.clk.Now()) {
		t.Fatalf("probe-all left the record of %v", got)
	}
	e.clk.Advance(time.Minute)
	if _, err := e.f.ProbeHost(ctx, "quiet"); err != nil {
		t.Fatal(err)
	}
	if got := recordedAt(t, e, "quiet"); !got.Equal(e.clk.Now()) {
		t.Fatalf("probe-now left the record of %v", got)
	}
}

func mustHosts(t *testing.T, e *testEnv) []store.Host {
	t.Helper()
	hosts, err := e.st.ListHosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return hosts
}

// TestABudgetedPassTakesTheLeastRecentlyProbedFirst: a budget that
// reaches one host a pass probes each host in turn, though no pass
// rewrites a quiet host's record (which would otherwise keep putting the
// same host first).
func TestABudgetedPassTakesTheLeastRecentlyProbedFirst(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	ctx := context.Background()
	e.f.cfg.ProbeMaxAge = time.Hour
	e.f.cfg.ProbeConcurrency = 1
	for _, id := range []string{"a", "b", "c"} {
		e.addHost(t, id, fakehost.Config{OnRequest: func(*http.Request) { e.clk.Advance(time.Second) }})
	}
	var order []string
	for range 6 {
		e.clk.Advance(time.Minute)
		// Room for one probe: ProbeTimeout (5 s) from now, and less than
		// the second a probe takes here.
		rep, err := e.f.ProbeEnabled(ctx, e.clk.Now().Add(5500*time.Millisecond))
		if err != nil || len(rep.Probed) != 1 || rep.Written != 0 {
			t.Fatalf("pass: %+v, %v", rep, err)
		}
		order = append(order, rep.Probed[0].HostID)
	}
	if want := []string{"a", "b", "c", "a", "b", "c"}; !reflect.DeepEqual(order, want) {
		t.Fatalf("probed in turn %v, want %v", order, want)
	}
}

// wakeLog is a Waker that keeps what it was given, a call at a time.
type wakeLog struct {
	mu    sync.Mutex
	calls [][]Wake
}

func (w *wakeLog) Wake(_ context.Context, wakes []Wake) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, slices.Clone(wakes))
	return nil
}

func (w *wakeLog) taken() [][]Wake {
	w.mu.Lock()
	defer w.mu.Unlock()
	calls := w.calls
	w.calls = nil
	return calls
}

// queueRun records a run waiting in class since `since`, as a dispatch
// that found no host does.
func queueRun(t *testing.T, e *testEnv, id, class string, since time.Time) {
	t.Helper()
	agent, _, _ := ParseClass(class)
	r := store.Run{FleetRunID: id, OwnerID: "alice", Status: store.StatusQueued, Agent: agent, CreatedAt: since, UpdatedAt: since,
		Queue: &store.QueueInfo{Class: class, Since: since, Timeout: time.Hour, Until: since.Add(time.Hour), Request: []byte(`{}`)}}
	if err := e.st.CreateRun(context.Background(), r); err != nil {
		t.Fatal(err)
	}
}

// TestProbePassWakesHostsWithRoomAndReportsCapacity: with runs waiting in
// one class, a pass wakes, in one call, each host it found routable for
// that class with free slots, for all of them, and none other; its
// capacity figures are the class's; a host that joins is woken by its own
// probe; with nothing waiting, nothing is woken.
func TestProbePassWakesHostsWithRoomAndReportsCapacity(t *testing.T) {
	e := newTestEnv(t, 10*time.Second)
	ctx := context.Background()
	waker := &wakeLog{}
	e.f.cfg.Waker = waker
	e.f.cfg.CapacityClasses = []string{"claude"}
	ci := map[string]string{"pool": "ci"}
	hosts := map[string]*fakehost.Host{}
	for _, id := range []string{"free", "full", "draining", "other"} {
		h := fakehost.New(fakehost.Config{Clock: e.clk})
		t.Cleanup(h.Close)
		e.creds[id] = h.Token()
		e.writeCreds(t)
		labels := ci
		if id == "other" {
			labels = map[string]string{"pool": "gpu"}
		}
		if _, err := e.f.RegisterHost(ctx, HostSpec{ID: id, BaseURL: h.URL, CredentialRef: id, Labels: labels}); err != nil {
			t.Fatal(err)
		}
		h.SetLoad(&hostproto.Load{Active: 1, MaxConcurrent: 3})
		hosts[id] = h
	}
	hosts["full"].SetLoad(&hostproto.Load{Active: 2, MaxConcurrent: 2})
	hosts["draining"].SetDraining(true)
	class := ClassOf("shell", ci)
	queueRun(t, e, "fr-a", class, t0.Add(-90*time.Second))
	queueRun(t, e, "fr-b", class, t0.Add(-30*time.Second))

	rep, err := e.f.ProbeEnabled(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Wake{{HostID: "free", Slots: 2, Reason: WakeProbe}}
	if calls := waker.taken(); !reflect.DeepEqual(calls, [][]Wake{want}) || !reflect.DeepEqual(rep.Wakes, want) {
		t.Fatalf("wakes %+v (reported %+v), want one call of %+v", calls, rep.Wakes, want)
	}
	var got *ClassCapacity
	classes := []string{}
	for i, c := range rep.Capacity {
		classes = append(classes, c.Class)
		if c.Class == class {
			got = &rep.Capacity[i]
		}
	}
	if want := []string{"claude", "shell", class}; !reflect.DeepEqual(classes, want) {
		t.Fatalf("classes %v, want %v", classes, want)
	}
	wantCap := ClassCapacity{Class: class, Agent: "shell", Labels: ci, Queued: 2, OldestWait: 90 * time.Second,
		FreeSlots: 2, BusySlots: 3, Hosts: 2, DrainingHosts: 1}
	if !reflect.DeepEqual(*got, wantCap) {
		t.Fatalf("capacity of %s: %+v, want %+v", class, *got, wantCap)
	}
	api, err := e.f.FleetCapacity(ctx)
	if err != nil || !reflect.DeepEqual(api.Classes, rep.Capacity) || !api.At.Equal(t0) {
		t.Fatalf("FleetCapacity %+v, %v; want the pass's %+v", api, err, rep.Capacity)
	}

	// A host joins: its own probe wakes it.
	joined := fakehost.New(fakehost.Config{Clock: e.clk})
	t.Cleanup(joined.Close)
	joined.SetLoad(&hostproto.Load{Active: 0, MaxConcurrent: 4})
	e.creds["joined"] = joined.Token()
	e.writeCreds(t)
	if _, err := e.f.RegisterHost(ctx, HostSpec{ID: "joined", BaseURL: joined.URL, CredentialRef: "joined", Labels: ci}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.ProbeHost(ctx, "joined"); err != nil {
		t.Fatal(err)
	}
	if calls := waker.taken(); !reflect.DeepEqual(calls, [][]Wake{{{HostID: "joined", Slots: 4, Reason: WakeProbe}}}) {
		t.Fatalf("the joined host's wakes: %+v", calls)
	}

	// Nothing waits: no wake, though hosts have room.
	for _, id := range []string{"fr-a", "fr-b"} {
		r, err := e.st.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		r.Status, r.Reason = store.StatusCanceled, "canceled"
		if _, err := e.st.UpdateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	e.clk.Advance(time.Minute)
	if rep, err := e.f.ProbeEnabled(ctx, time.Time{}); err != nil || len(rep.Wakes) != 0 || len(waker.taken()) != 0 {
		t.Fatalf("a pass with nothing waiting: %+v, %v", rep.Wakes, err)
	}
}
