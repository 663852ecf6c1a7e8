package storetest

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
)

// hostsContract is store.Hosts' contract.
var hostsContract = []contractCase{
	roleCase("Hosts/CreateGetList", testHostsCreateGetList),
	roleCase("Hosts/CreateExisting", testHostsCreateExisting),
	roleCase("Hosts/NotFound", testHostsNotFound),
	roleCase("Hosts/SetEnabledKeepsProbe", testHostsSetEnabled),
	roleCase("Hosts/RecordProbe", testHostsRecordProbe),
	roleCase("Hosts/RecordDrain", testHostsRecordDrain),
	roleCase("Hosts/ListPages", testHostsListPages),
}

func host(id string, at time.Time) store.Host {
	return store.Host{
		ID:            id,
		BaseURL:       "https://" + id + ".example.test:7070",
		CredentialRef: "cred-" + id,
		Labels:        map[string]string{"gpu": "a100", "zone": "eu"},
		LocalPaths:    []string{"/srv/work/" + id, "/srv/other"},
		CAPEM:         "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
		Enabled:       true,
		CreatedAt:     at,
	}
}

func probe(at time.Time, status string) store.Probe {
	succ := at.Add(90 * 24 * time.Hour)
	return store.Probe{
		Status:    status,
		At:        at,
		LatencyMs: 42,
		Version:   "1.2.3",
		Agents:    []string{"claude", "shell"},
		Features:  store.Features{SecretsProxy: true, ExecRequire: true},
		CA:        &store.CAInfo{NotAfter: at.Add(365 * 24 * time.Hour), SuccessorNotAfter: &succ},
		Draining:  true,
		Storage:   &store.Storage{FreeBytes: 3 << 30, MinFreeBytes: 1 << 30},
		Limits:    &store.Limits{Enforced: "cgroup1", MemoryBytes: 2 << 30, Pids: 512, CPU: 1.5},
		Load:      &store.Load{Active: 0, MaxConcurrent: 4},
		Detail:    "ok after 1 retry",
		LedgerKey: "ed25519:11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=",
	}
}

func testHostsCreateGetList(t *testing.T, s store.Hosts, clk *clock.Fake) {
	for _, id := range []string{"hb", "hc", "ha"} {
		noErr(t, "CreateHost", s.CreateHost(bg, host(id, clk.Now())))
	}
	got, err := s.GetHost(bg, "hb")
	noErr(t, "GetHost", err)
	sameJSON(t, "GetHost", got, host("hb", clk.Now()))

	bare := store.Host{ID: "hd", BaseURL: "http://127.0.0.1:7070", CredentialRef: "c", CreatedAt: clk.Now()}
	noErr(t, "CreateHost bare", s.CreateHost(bg, bare))
	got, err = s.GetHost(bg, "hd")
	noErr(t, "GetHost bare", err)
	sameJSON(t, "GetHost bare", got, bare)

	list, err := s.ListHosts(bg)
	noErr(t, "ListHosts", err)
	var names []string
	for _, h := range list {
		names = append(names, h.ID)
	}
	sameIDs(t, "ListHosts order", names, []string{"ha", "hb", "hc", "hd"})
	sameJSON(t, "ListHosts[0]", list[0], host("ha", clk.Now()))
}

func testHostsCreateExisting(t *testing.T, s store.Hosts, clk *clock.Fake) {
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", clk.Now())))
	other := host("h1", clk.Now().Add(time.Hour))
	other.BaseURL = "https://elsewhere.example.test"
	wantErr(t, "CreateHost again", s.CreateHost(bg, other), store.ErrExists)
	got, err := s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	sameJSON(t, "host after refused create", got, host("h1", clk.Now()))
}

func testHostsNotFound(t *testing.T, s store.Hosts, clk *clock.Fake) {
	_, err := s.GetHost(bg, "nope")
	wantErr(t, "GetHost", err, store.ErrNotFound)
	_, err = s.SetHostEnabled(bg, "nope", false)
	wantErr(t, "SetHostEnabled", err, store.ErrNotFound)
	wantErr(t, "RecordProbe", s.RecordProbe(bg, "nope", probe(clk.Now(), store.ProbeOK)), store.ErrNotFound)
	wantErr(t, "DeleteHost", deleteHost(s, "nope", false), store.ErrNotFound)
	wantErr(t, "DeleteHost force", deleteHost(s, "nope", true), store.ErrNotFound)
	// A write to a missing host must not create it.
	_, err = s.GetHost(bg, "nope")
	wantErr(t, "GetHost after writes", err, store.ErrNotFound)
	list, err := s.ListHosts(bg)
	noErr(t, "ListHosts", err)
	if len(list) != 0 {
		t.Fatalf("ListHosts of an empty store: %v", list)
	}
}

func testHostsSetEnabled(t *testing.T, s store.Hosts, clk *clock.Fake) {
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", clk.Now())))
	p := probe(clk.Now(), store.ProbeOK)
	noErr(t, "RecordProbe", s.RecordProbe(bg, "h1", p))

	got, err := s.SetHostEnabled(bg, "h1", false)
	noErr(t, "SetHostEnabled", err)
	want := host("h1", clk.Now())
	want.Enabled = false
	want.Probe = &p
	sameJSON(t, "SetHostEnabled result", got, want)
	read, err := s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	sameJSON(t, "GetHost after disable", read, want)

	got, err = s.SetHostEnabled(bg, "h1", true)
	noErr(t, "SetHostEnabled true", err)
	if !got.Enabled || got.Probe == nil {
		t.Fatalf("re-enabled host: %+v", got)
	}
}

func testHostsRecordProbe(t *testing.T, s store.Hosts, clk *clock.Fake) {
	h := host("h1", clk.Now())
	h.Enabled = false
	noErr(t, "CreateHost", s.CreateHost(bg, h))
	first := probe(clk.Now(), store.ProbeOK)
	noErr(t, "RecordProbe", s.RecordProbe(bg, "h1", first))
	got, err := s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	want := h
	want.Probe = &first
	sameJSON(t, "host with probe", got, want)

	clk.Advance(time.Minute)
	second := store.Probe{Status: store.ProbeUnreachable, At: clk.Now(), LatencyMs: 5000, Detail: "dial tcp: connection refused"}
	noErr(t, "RecordProbe again", s.RecordProbe(bg, "h1", second))
	got, err = s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	want.Probe = &second
	sameJSON(t, "host with replaced probe", got, want)

	// A full disk is zero free bytes, kept as such (not as an absent
	// field); limits a host cannot enforce keep their detail.
	clk.Advance(time.Minute)
	third := probe(clk.Now(), store.ProbeBadResponse)
	third.Storage = &store.Storage{FreeBytes: 0, MinFreeBytes: 64 << 20, Low: true}
	third.Limits = &store.Limits{Enforced: "unavailable", Detail: "no cgroup v2 or v1 controllers are mounted"}
	noErr(t, "RecordProbe a third time", s.RecordProbe(bg, "h1", third))
	got, err = s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	want.Probe = &third
	sameJSON(t, "host with low storage", got, want)
}

// testHostsRecordDrain: a drain is recorded on the probe at once and a
// resume clears it; a host never probed gets no probe; a gone host is
// ErrNotFound.
func testHostsRecordDrain(t *testing.T, s store.Hosts, clk *clock.Fake) {
	now := clk.Now()
	noErr(t, "CreateHost", s.CreateHost(bg, host("h1", now)))
	p := probe(now, store.ProbeOK)
	p.Draining = false
	noErr(t, "RecordProbe", s.RecordProbe(bg, "h1", p))
	busy := false
	h, err := s.RecordDrain(bg, "h1", true, &busy)
	noErr(t, "RecordDrain", err)
	want := p
	want.Draining, want.Idle = true, &busy
	sameJSON(t, "probe after the drain", h.Probe, want)
	got, err := s.GetHost(bg, "h1")
	noErr(t, "GetHost", err)
	sameJSON(t, "stored probe after the drain", got.Probe, want)

	h, err = s.RecordDrain(bg, "h1", false, nil)
	noErr(t, "RecordDrain resume", err)
	want.Draining, want.Idle = false, nil
	sameJSON(t, "probe after the resume", h.Probe, want)

	noErr(t, "CreateHost h2", s.CreateHost(bg, host("h2", now)))
	h, err = s.RecordDrain(bg, "h2", true, nil)
	noErr(t, "RecordDrain of a host never probed", err)
	if h.Probe != nil || h.ID != "h2" {
		t.Fatalf("a host never probed: %+v, want it as it was, without a probe", h)
	}
	_, err = s.RecordDrain(bg, "gone", true, nil)
	wantErr(t, "RecordDrain of an unknown host", err, store.ErrNotFound)
}

// testHostsListPages: paging the registry a few hosts at a time gives
// every host once, whole, in pages no larger than asked, and ends.
func testHostsListPages(t *testing.T, s store.Hosts, clk *clock.Fake) {
	var want []string
	for i := range 7 {
		id := fmt.Sprintf("h%d", i)
		noErr(t, "CreateHost", s.CreateHost(bg, host(id, clk.Now())))
		want = append(want, id)
	}
	all, err := s.ListHosts(bg)
	noErr(t, "ListHosts", err)
	byID := map[string]store.Host{}
	for _, h := range all {
		byID[h.ID] = h
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatal("ListHostsPage never ended")
		}
		p, err := s.ListHostsPage(bg, after, 3)
		noErr(t, "ListHostsPage", err)
		if len(p.Hosts) > 3 {
			t.Fatalf("a page of %d hosts, limit 3", len(p.Hosts))
		}
		for _, h := range p.Hosts {
			sameJSON(t, "a paged host is the whole host", h, byID[h.ID])
			got = append(got, h.ID)
		}
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	sort.Strings(got)
	sameIDs(t, "every host paged once", got, want)
}
