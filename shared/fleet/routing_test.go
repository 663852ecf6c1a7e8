package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/store"
)

var routeNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// healthyHost is a host every plain request may use: enabled, freshly probed
// ok, offering "shell", with both secrets features.
func healthyHost(id string) store.Host {
	return store.Host{
		ID: id, Enabled: true,
		Labels:     map[string]string{"region": "eu"},
		LocalPaths: []string{"/srv/work"},
		Probe: &store.Probe{
			Status: store.ProbeOK, At: routeNow.Add(-time.Minute), LatencyMs: 5,
			Agents:   []string{"shell"},
			Features: store.Features{SecretsProxy: true, ExecRequire: true},
		},
	}
}

func TestRouteExcludesWithEveryReason(t *testing.T) {
	repos := map[string]string{"acme/web": "https://git.example/acme/web.git"}
	base := RouteInput{Agent: "shell", RepoURLs: repos, Now: routeNow, MaxProbeAge: 5 * time.Minute}
	for _, tc := range []struct {
		reason string
		host   func(h *store.Host)
		req    func(in *RouteInput)
	}{
		{ExcludedDisabled, func(h *store.Host) { h.Enabled = false }, nil},
		{ExcludedNeverProbed, func(h *store.Host) { h.Probe = nil }, nil},
		{ExcludedStaleProbe, func(h *store.Host) { h.Probe.At = routeNow.Add(-6 * time.Minute) }, nil},
		{ExcludedUnhealthy, func(h *store.Host) { h.Probe.Status = store.ProbeUnreachable }, nil},
		{ExcludedDraining, func(h *store.Host) { h.Probe.Draining = true }, nil},
		{ExcludedStorageLow, func(h *store.Host) {
			h.Probe.Storage = &store.Storage{FreeBytes: 1 << 20, MinFreeBytes: 64 << 20, Low: true}
		}, nil},
		{ExcludedAgentUnsupported, nil, func(in *RouteInput) { in.Agent = "claude" }},
		{ExcludedLabelMissing, nil, func(in *RouteInput) { in.Labels = map[string]string{"region": "us"} }},
		{ExcludedRepositoryUnavailable, nil, func(in *RouteInput) { in.LocalPath = "/elsewhere/repo" }},
		{ExcludedSecretsUnsupported, func(h *store.Host) { h.Probe.Features.ExecRequire = false }, func(in *RouteInput) { in.NeedsSecrets = true }},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			h := healthyHost("h1")
			if tc.host != nil {
				tc.host(&h)
			}
			in := base
			in.Hosts = []store.Host{h}
			if tc.req != nil {
				tc.req(&in)
			}
			d := Route(in)
			if d.Host != nil {
				t.Fatalf("routed to %s, want a refusal", d.Host.ID)
			}
			want := []Exclusion{{HostID: "h1", Reasons: []string{tc.reason}}}
			if tc.reason == ExcludedAgentUnsupported {
				want[0].Agents = []string{"shell"}
			}
			if !reflect.DeepEqual(d.Excluded, want) {
				t.Fatalf("excluded = %+v, want %+v", d.Excluded, want)
			}
			if !strings.Contains(d.Reason, "h1 ("+tc.reason+")") {
				t.Fatalf("reason %q does not name the host and reason", d.Reason)
			}
		})
	}
}

func TestRouteListsEveryReasonOfEveryHost(t *testing.T) {
	a := healthyHost("a")
	a.Enabled = false
	a.Probe.Draining = true
	a.Probe.Storage = &store.Storage{MinFreeBytes: 64 << 20, Low: true}
	a.Probe.Features.SecretsProxy = false
	b := healthyHost("b")
	b.Probe = nil
	d := Route(RouteInput{
		Hosts: []store.Host{b, a}, Agent: "shell", NeedsSecrets: true,
		Labels: map[string]string{"gpu": "yes"}, Now: routeNow, MaxProbeAge: time.Minute * 5,
	})
	want := []Exclusion{
		{HostID: "a", Reasons: []string{ExcludedDisabled, ExcludedDraining, ExcludedStorageLow, ExcludedLabelMissing, ExcludedSecretsUnsupported}},
		{HostID: "b", Reasons: []string{ExcludedNeverProbed, ExcludedLabelMissing}},
	}
	if d.Host != nil || !reflect.DeepEqual(d.Excluded, want) {
		t.Fatalf("decision = %+v, want refusal %+v", d, want)
	}
}

func TestRouteJudgesOffersOnlyFromAnOkProbe(t *testing.T) {
	h := healthyHost("h1")
	h.Probe = &store.Probe{Status: store.ProbeUnreachable, At: routeNow, Storage: &store.Storage{Low: true}}
	d := Route(RouteInput{Hosts: []store.Host{h}, Agent: "shell", NeedsSecrets: true, Now: routeNow, MaxProbeAge: time.Minute})
	want := []Exclusion{{HostID: "h1", Reasons: []string{ExcludedUnhealthy}}}
	if d.Host != nil || !reflect.DeepEqual(d.Excluded, want) {
		t.Fatalf("decision = %+v, want only unhealthy", d)
	}
}

// Storage excludes a host only when its probe says low: a host older than
// the field (nil) and one with space to spare are both eligible.
func TestRouteExcludesOnlyStorageLow(t *testing.T) {
	old := healthyHost("a-old")
	spare := healthyHost("b-spare")
	spare.Probe.Storage = &store.Storage{FreeBytes: 10 << 30, MinFreeBytes: 64 << 20}
	low := healthyHost("c-low")
	low.Probe.Storage = &store.Storage{FreeBytes: 1 << 20, MinFreeBytes: 64 << 20, Low: true}
	// The low host is the fastest: only its storage keeps it out.
	low.Probe.LatencyMs = 1
	in := RouteInput{Hosts: []store.Host{low, spare, old}, Agent: "shell", Now: routeNow, MaxProbeAge: time.Minute * 5}
	d := Route(in)
	want := []Exclusion{{HostID: "c-low", Reasons: []string{ExcludedStorageLow}}}
	if d.Host == nil || d.Host.ID != "a-old" || !reflect.DeepEqual(d.Excluded, want) {
		t.Fatalf("decision = %+v, want a-old chosen and c-low excluded storage_low", d)
	}
	in.Hosts = []store.Host{low, spare}
	if d := Route(in); d.Host == nil || d.Host.ID != "b-spare" {
		t.Fatalf("decision = %+v, want b-spare", d)
	}
}

func TestRouteRefusesWithNoCandidates(t *testing.T) {
	d := Route(RouteInput{Agent: "shell", Now: routeNow, MaxProbeAge: time.Minute})
	if d.Host != nil || d.Excluded == nil || len(d.Excluded) != 0 || !strings.Contains(d.Reason, "no host") {
		t.Fatalf("decision = %+v", d)
	}
}

func TestRouteRewritesTheLocalPathToACloneURL(t *testing.T) {
	repos := map[string]string{"acme/web": "https://git.example/acme/web.git"}
	has := healthyHost("has-path")
	has.Probe.LatencyMs = 50
	lacks := healthyHost("lacks-path")
	lacks.LocalPaths = nil
	lacks.Probe.LatencyMs = 1
	in := RouteInput{Agent: "shell", Repository: "acme/web", LocalPath: "/srv/work/web", RepoURLs: repos, Now: routeNow, MaxProbeAge: 5 * time.Minute}

	// Both eligible: the host with the path wins despite its latency.
	in.Hosts = []store.Host{lacks, has}
	d := Route(in)
	if d.Host == nil || d.Host.ID != "has-path" || d.RewroteLocalPath || d.LocalPath != "/srv/work/web" {
		t.Fatalf("decision = %+v, want has-path without rewrite", d)
	}
	// Only the host without the path: eligible through the clone URL.
	in.Hosts = []store.Host{lacks}
	d = Route(in)
	if d.Host == nil || !d.RewroteLocalPath || d.LocalPath != "" || d.CloneURL != repos["acme/web"] {
		t.Fatalf("decision = %+v, want a rewrite to the clone URL", d)
	}
	// Without a mapping the path is unavailable.
	in.Repository = "acme/other"
	if d := Route(in); d.Host != nil || d.Excluded[0].Reasons[0] != ExcludedRepositoryUnavailable {
		t.Fatalf("decision = %+v, want repository_unavailable", d)
	}
	// A repository alone (no local path) is passed on, with its clone URL when mapped.
	in = RouteInput{Agent: "shell", Repository: "acme/web", RepoURLs: repos, Hosts: []store.Host{lacks}, Now: routeNow, MaxProbeAge: time.Minute}
	if d := Route(in); d.Host == nil || d.RewroteLocalPath || d.CloneURL != repos["acme/web"] {
		t.Fatalf("repository only: %+v", d)
	}
}

func TestRoutePrefersLowLatencyThenId(t *testing.T) {
	a, b, c := healthyHost("a"), healthyHost("b"), healthyHost("c")
	a.Probe.LatencyMs, b.Probe.LatencyMs, c.Probe.LatencyMs = 9, 3, 3
	d := Route(RouteInput{Hosts: []store.Host{a, c, b}, Agent: "shell", Now: routeNow, MaxProbeAge: 5 * time.Minute})
	if d.Host == nil || d.Host.ID != "b" || len(d.Excluded) != 0 {
		t.Fatalf("decision = %+v, want b", d)
	}
}

func TestHasLocalPath(t *testing.T) {
	roots := []string{"/srv/work", "/data/"}
	for p, want := range map[string]bool{
		"/srv/work": true, "/srv/work/x/y": true, "/srv/workshop": false, "/srv": false,
		"/data/x": true, "/srv/work/../etc": false,
	} {
		if got := hasLocalPath(roots, p); got != want {
			t.Errorf("hasLocalPath(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestLoadRepoURLs(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`{"acme/web": "https://git.example/acme/web.git"}`), 0o600)
	m, err := LoadRepoURLs(good)
	if err != nil || m["acme/web"] != "https://git.example/acme/web.git" {
		t.Fatalf("%v %v", m, err)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"acme/web": "https://user:hunter2@/x"}`), 0o600)
	if _, err := LoadRepoURLs(bad); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("bad map: %v", err)
	}
	if m, err := LoadRepoURLs(""); err != nil || len(m) != 0 {
		t.Fatalf("no map: %v %v", m, err)
	}
}

// TestBuildRouteViewOrdersEachList: each agent's list puts the hosts
// routable for it first, fastest first (ties by id), then every other host
// by id; "any" does the same without the agent; every host is in every
// list.
func TestBuildRouteViewOrdersEachList(t *testing.T) {
	with := func(id string, latency int64, edit func(h *store.Host)) store.Host {
		h := healthyHost(id)
		h.Probe.LatencyMs = latency
		if edit != nil {
			edit(&h)
		}
		return h
	}
	hosts := []store.Host{
		with("slow", 40, nil),
		with("fast", 2, nil),
		with("claude", 1, func(h *store.Host) { h.Probe.Agents = []string{"claude"} }),
		with("both", 2, func(h *store.Host) { h.Probe.Agents = []string{"shell", "claude"} }),
		with("draining", 0, func(h *store.Host) { h.Probe.Draining = true }),
		with("stale", 0, func(h *store.Host) { h.Probe.At = routeNow.Add(-time.Hour) }),
		with("low", 0, func(h *store.Host) { h.Probe.Storage = &store.Storage{Low: true} }),
		with("off", 0, func(h *store.Host) { h.Enabled = false }),
		with("never", 0, func(h *store.Host) { h.Probe = nil }),
		with("sick", 0, func(h *store.Host) { h.Probe.Status = store.ProbeUnreachable; h.Probe.Agents = nil }),
	}
	v := BuildRouteView(hosts, routeNow, 5*time.Minute)
	ids := func(list string) string {
		var out []string
		for _, h := range v.Lists[list] {
			out = append(out, h.ID)
		}
		return strings.Join(out, " ")
	}
	rest := "draining low never off sick stale"
	want := map[string]string{
		"any":      "claude both fast slow " + rest,
		"a:shell":  "both fast slow claude " + rest,
		"a:claude": "claude both draining fast low never off sick slow stale",
	}
	if len(v.Lists) != len(want) || v.Total != len(hosts) || !v.At.Equal(routeNow) {
		t.Fatalf("lists %d, total %d, at %v; want %d lists of %d hosts at %v", len(v.Lists), v.Total, v.At, len(want), len(hosts), routeNow)
	}
	for list, w := range want {
		if got := ids(list); got != w {
			t.Errorf("%s: %s\nwant %s", list, got, w)
		}
	}
}

// TestBuildRouteViewBoundsLists: past MaxRouteLists agents, the agents the
// most hosts offer keep a list; the others route over "any".
func TestBuildRouteViewBoundsLists(t *testing.T) {
	var hosts []store.Host
	for i := 0; i < MaxRouteLists+5; i++ {
		h := healthyHost(fmt.Sprintf("h%02d", i))
		h.Probe.Agents = []string{fmt.Sprintf("agent%02d", i), "common"}
		hosts = append(hosts, h)
	}
	v := BuildRouteView(hosts, routeNow, 5*time.Minute)
	if len(v.Lists) != MaxRouteLists+1 {
		t.Fatalf("%d lists, want %d agent lists and any", len(v.Lists), MaxRouteLists)
	}
	if _, ok := v.Lists[RouteList("common")]; !ok {
		t.Fatal("the agent every host offers has no list")
	}
	if _, ok := v.Lists[RouteList(fmt.Sprintf("agent%02d", MaxRouteLists+4))]; ok {
		t.Fatal("the last agent by name kept a list past the bound")
	}
}

// TestRoutePrefersFreeSlots: among eligible hosts, those whose probe showed
// a free slot come first (the lower share in use, then more free slots),
// then those that did not say, then full ones, which are still candidates
// (the probe is up to a minute old); latency and id only break ties. The
// routing view orders its lists the same way.
func TestRoutePrefersFreeSlots(t *testing.T) {
	withLoad := func(id string, latency int64, load *store.Load) store.Host {
		h := healthyHost(id)
		h.Probe.LatencyMs = latency
		h.Probe.Load = load
		return h
	}
	hosts := []store.Host{
		withLoad("a-full", 1, &store.Load{Active: 4, MaxConcurrent: 4}),
		withLoad("b-unknown", 1, nil),
		withLoad("c-half", 1, &store.Load{Active: 2, MaxConcurrent: 4}),
		withLoad("d-quarter-slow", 9, &store.Load{Active: 1, MaxConcurrent: 4}),
		withLoad("e-quarter-big", 9, &store.Load{Active: 2, MaxConcurrent: 8}),
		withLoad("f-idle", 20, &store.Load{Active: 0, MaxConcurrent: 1}),
		withLoad("g-none", 1, &store.Load{Active: 0, MaxConcurrent: 0}),
	}
	want := []string{"f-idle", "e-quarter-big", "d-quarter-slow", "c-half", "b-unknown", "a-full", "g-none"}
	in := RouteInput{Agent: "shell", Now: routeNow, MaxProbeAge: 5 * time.Minute}
	var got []string
	for left := hosts; len(left) > 0; {
		in.Hosts = left
		d := Route(in)
		if d.Host == nil {
			t.Fatalf("no host among %d", len(left))
		}
		got = append(got, d.Host.ID)
		next := []store.Host{}
		for _, h := range left {
			if h.ID != d.Host.ID {
				next = append(next, h)
			}
		}
		left = next
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Route's order %v\nwant          %v", got, want)
	}
	view := BuildRouteView(hosts, routeNow, 5*time.Minute)
	var listed []string
	for _, h := range view.Lists[RouteList("shell")] {
		listed = append(listed, h.ID)
	}
	if !reflect.DeepEqual(listed, want) {
		t.Errorf("the view's order %v\nwant            %v", listed, want)
	}
}

// TestRouteExcludesHostsThatRefusedTheDispatch: a host that refused this
// dispatch is excluded with the reason it gave, beside any other reason.
func TestRouteExcludesHostsThatRefusedTheDispatch(t *testing.T) {
	h1, h2 := healthyHost("h1"), healthyHost("h2")
	h2.Probe.Draining = true
	in := RouteInput{Hosts: []store.Host{h1, h2}, Agent: "shell", Now: routeNow, MaxProbeAge: 5 * time.Minute,
		Refused: map[string]string{"h1": "host_busy"}}
	d := Route(in)
	if d.Host != nil {
		t.Fatalf("routed to %s", d.Host.ID)
	}
	want := []Exclusion{{HostID: "h1", Reasons: []string{"host_busy"}}, {HostID: "h2", Reasons: []string{ExcludedDraining}}}
	if !reflect.DeepEqual(d.Excluded, want) {
		t.Errorf("excluded %+v\nwant     %+v", d.Excluded, want)
	}
}

// TestARunThatMayWaitIsNotOfferedToAFullHost: a dispatch that waits when
// no host takes it (QueueWhenFull) leaves out a host whose last probe
// showed it full, host_busy with what the probe showed, and takes a host
// with free or unknown load first as any dispatch; one that does not wait
// still tries the full host last.
func TestARunThatMayWaitIsNotOfferedToAFullHost(t *testing.T) {
	full, free, unknown := healthyHost("h1"), healthyHost("h2"), healthyHost("h3")
	full.Probe.Load = &store.Load{Active: 2, MaxConcurrent: 2}
	free.Probe.Load = &store.Load{Active: 1, MaxConcurrent: 2}
	in := RouteInput{Agent: "shell", Now: routeNow, MaxProbeAge: 5 * time.Minute, Hosts: []store.Host{full}}

	if d := Route(in); d.Host == nil || d.Host.ID != "h1" {
		t.Fatalf("a dispatch that does not wait: %+v, want the full host tried", d)
	}
	in.QueueWhenFull = true
	d := Route(in)
	want := []Exclusion{{HostID: "h1", Reasons: []string{ExcludedHostBusy},
		Detail: "its last probe (2026-03-01T11:59:00Z) showed it full: 2 of 2 slots in use; the run waits for one to free"}}
	if d.Host != nil || !reflect.DeepEqual(d.Excluded, want) {
		t.Fatalf("only a full host, the run may wait: %+v, want none and %+v", d, want)
	}
	for _, tc := range []struct {
		hosts []store.Host
		want  string
	}{{[]store.Host{full, free}, "h2"}, {[]store.Host{full, unknown}, "h3"}} {
		in.Hosts = tc.hosts
		if d := Route(in); d.Host == nil || d.Host.ID != tc.want {
			t.Errorf("hosts %s and %s, the run may wait: %+v, want %s", tc.hosts[0].ID, tc.hosts[1].ID, d, tc.want)
		}
	}
}
