package tests

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

var fakeFeatures = hostproto.Features{SecretsProxy: true, ExecRequire: true}

// TestRoutingRefusalNamesEveryExclusion registers one host per exclusion
// reason, each fit for the request but for that reason, and checks the 409
// lists every host with exactly its reason.
func TestRoutingRefusalNamesEveryExclusion(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			// Stale past 5 minutes, said here rather than left to the
			// default, which the probe's refresh interval follows.
			s := newStack(t, kind, stackOptions{repoURLs: map[string]string{"acme/web": "https://git.example/acme/web.git"},
				env: map[string]string{config.EnvProbeMaxAge: "5m"}})
			fit := func() map[string]any {
				return map[string]any{"labels": map[string]string{"pool": "gpu"}, "localPaths": []string{"/srv/work"}}
			}
			// Probed first, then left to go stale.
			s.addHost(t, "stale", fakehost.Config{Features: fakeFeatures}, fit())
			s.probe(t, "stale")
			s.clk.Advance(10 * time.Minute)

			disabled := fit()
			disabled["enabled"] = false
			s.addHost(t, "disabled", fakehost.Config{Features: fakeFeatures}, disabled)
			s.probe(t, "disabled")
			s.addHost(t, "never", fakehost.Config{Features: fakeFeatures}, fit())
			sick := s.addHost(t, "unhealthy", fakehost.Config{Features: fakeFeatures}, fit())
			sick.FailHealth(http.StatusServiceUnavailable)
			s.probe(t, "unhealthy")
			draining := s.addHost(t, "draining", fakehost.Config{Features: fakeFeatures}, fit())
			draining.SetDraining(true)
			s.probe(t, "draining")
			lowdisk := s.addHost(t, "lowdisk", fakehost.Config{Features: fakeFeatures}, fit())
			lowdisk.SetStorage(&hostproto.Storage{FreeBytes: 1 << 20, MinFreeBytes: 256 << 20, Low: true})
			s.probe(t, "lowdisk")
			s.addHost(t, "noagent", fakehost.Config{Features: fakeFeatures, Agents: []string{"claude"}}, fit())
			s.probe(t, "noagent")
			s.addHost(t, "nolabel", fakehost.Config{Features: fakeFeatures}, map[string]any{"localPaths": []string{"/srv/work"}})
			s.probe(t, "nolabel")
			s.addHost(t, "nopath", fakehost.Config{Features: fakeFeatures}, map[string]any{"labels": map[string]string{"pool": "gpu"}})
			s.probe(t, "nopath")
			s.addHost(t, "noproxy", fakehost.Config{Features: hostproto.Features{SecretsProxy: true}}, fit())
			s.probe(t, "noproxy")

			token := s.mint(t, "alice", "*", "*")
			body := `{"agent":"shell","labels":{"pool":"gpu"},"repository":"acme/unmapped","localPath":"/srv/work/app",` +
				`"secrets":[{"projectId":"acme","key":"API_KEY","domains":["api.example.com"]}]}`
			a := s.must(t, http.StatusConflict, "POST", "/fleet/runs", token, body)
			reasons := excludedReasons(t, a)
			want := map[string][]string{
				"disabled": {"disabled"}, "never": {"never_probed"}, "stale": {"stale_probe"},
				"unhealthy": {"unhealthy"}, "draining": {"draining"}, "lowdisk": {"storage_low"}, "noagent": {"agent_unsupported"},
				"nolabel": {"label_missing"}, "nopath": {"repository_unavailable"}, "noproxy": {"secrets_unsupported"},
			}
			if !reflect.DeepEqual(reasons, want) {
				t.Fatalf("excluded = %v\nwant       %v", reasons, want)
			}

			// The same request with a mapped repository is routed to the host
			// without the path, which clones instead: rewroteLocalPath.
			mapped := `{"agent":"shell","labels":{"pool":"gpu"},"repository":"acme/web","localPath":"/srv/work/app",` +
				`"secrets":[{"projectId":"acme","key":"API_KEY","domains":["api.example.com"]}]}`
			ok := s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, mapped)
			if ok.str("hostId") != "nopath" || ok.body["rewroteLocalPath"] != true {
				t.Fatalf("mapped repository: %s", ok.raw)
			}
		})
	}
}

// TestRoutingAroundLowStorage: a host whose probe reports its storage low
// gets no run while another can take it; alone, it is excluded with
// storage_low in the 409; once a probe finds its space back, it is routed
// to again. The low host would win otherwise (same latency, smaller id).
func TestRoutingAroundLowStorage(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{})
			low := s.addHost(t, "a-low", fakehost.Config{}, nil)
			low.SetStorage(&hostproto.Storage{FreeBytes: 12 << 20, MinFreeBytes: 256 << 20, Low: true})
			roomy := s.addHost(t, "b-roomy", fakehost.Config{}, nil)
			roomy.SetStorage(&hostproto.Storage{FreeBytes: 40 << 30, MinFreeBytes: 256 << 20})
			s.probe(t, "a-low")
			s.probe(t, "b-roomy")
			alice := s.mint(t, "alice", "*", "*")

			// The listing shows why: the probe's storage, as the host reported it.
			var listed struct {
				Hosts []struct {
					ID    string `json:"id"`
					Probe struct {
						Storage *hostproto.Storage `json:"storage"`
					} `json:"probe"`
				} `json:"hosts"`
			}
			must(t, json.Unmarshal([]byte(s.must(t, http.StatusOK, "GET", "/fleet/hosts", alice, "").raw), &listed))
			storage := map[string]hostproto.Storage{}
			for _, h := range listed.Hosts {
				if h.Probe.Storage != nil {
					storage[h.ID] = *h.Probe.Storage
				}
			}
			wantStorage := map[string]hostproto.Storage{
				"a-low":   {FreeBytes: 12 << 20, MinFreeBytes: 256 << 20, Low: true},
				"b-roomy": {FreeBytes: 40 << 30, MinFreeBytes: 256 << 20},
			}
			if !reflect.DeepEqual(storage, wantStorage) {
				t.Fatalf("listed storage = %+v, want %+v", storage, wantStorage)
			}

			for range 2 {
				a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`)
				if a.str("hostId") != "b-roomy" {
					t.Fatalf("dispatch went to %s, want b-roomy: %s", a.str("hostId"), a.raw)
				}
			}
			if n := low.StartCalls(); n != 0 {
				t.Fatalf("the low host was asked to start %d runs", n)
			}

			onlyLow := func() answer {
				return s.do(t, "POST", "/fleet/runs", alice, `{"host":"a-low","agent":"shell"}`)
			}
			refused := onlyLow()
			var got struct {
				Code    string `json:"code"`
				Details struct {
					Excluded []fleet.Exclusion `json:"excluded"`
				} `json:"details"`
			}
			must(t, json.Unmarshal([]byte(refused.raw), &got))
			want := []fleet.Exclusion{{HostID: "a-low", Reasons: []string{"storage_low"}}}
			if refused.status != http.StatusConflict || got.Code != "no_eligible_host" || !reflect.DeepEqual(got.Details.Excluded, want) ||
				!strings.Contains(refused.errorText(), "a-low (storage_low)") {
				t.Fatalf("dispatch to the low host alone: %d %s", refused.status, refused.raw)
			}

			// Space returns: routing follows the probe, not the host, so the
			// host stays excluded until it is probed again.
			low.SetStorage(&hostproto.Storage{FreeBytes: 30 << 30, MinFreeBytes: 256 << 20})
			if a := onlyLow(); a.status != http.StatusConflict {
				t.Fatalf("before a new probe: %d %s", a.status, a.raw)
			}
			s.probe(t, "a-low")
			if a := onlyLow(); a.status != http.StatusCreated || a.str("hostId") != "a-low" {
				t.Fatalf("after space returned and a probe: %d %s", a.status, a.raw)
			}
			if a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, `{"agent":"shell"}`); a.str("hostId") != "a-low" {
				t.Fatalf("unnamed dispatch after recovery went to %s, want a-low again", a.str("hostId"))
			}
			if n := low.StartCalls(); n != 2 {
				t.Fatalf("the recovered host was asked to start %d runs, want 2", n)
			}
		})
	}
}

// excludedReasons reads a routing refusal's details.excluded.
func excludedReasons(t *testing.T, a answer) map[string][]string {
	t.Helper()
	var body struct {
		Code    string `json:"code"`
		Details struct {
			Excluded []struct {
				HostID  string   `json:"hostId"`
				Reasons []string `json:"reasons"`
			} `json:"excluded"`
		} `json:"details"`
	}
	if err := json.Unmarshal([]byte(a.raw), &body); err != nil || body.Code != "no_eligible_host" {
		t.Fatalf("not a routing refusal: %s", a.raw)
	}
	out := map[string][]string{}
	for _, e := range body.Details.Excluded {
		out[e.HostID] = e.Reasons
	}
	return out
}
