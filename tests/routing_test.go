package tests

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fakehost"
	"github.com/runfleet/runfleet/shared/hostproto"
)

var fakeFeatures = hostproto.Features{SecretsProxy: true, ExecRequire: true}

// TestRoutingRefusalNamesEveryExclusion registers one host per exclusion
// reason, each fit for the request but for that reason, and checks the 409
// lists every host with exactly its reason.
func TestRoutingRefusalNamesEveryExclusion(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStack(t, kind, stackOptions{repoURLs: map[string]string{"acme/web": "https://git.example/acme/web.git"}})
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
			if a.body["code"] != "no_eligible_host" {
				t.Fatalf("refusal %s", a.raw)
			}
			var got struct {
				Details struct {
					Excluded []struct {
						HostID  string   `json:"hostId"`
						Reasons []string `json:"reasons"`
					} `json:"excluded"`
				} `json:"details"`
			}
			json.Unmarshal([]byte(a.raw), &got)
			reasons := map[string][]string{}
			for _, e := range got.Details.Excluded {
				reasons[e.HostID] = e.Reasons
			}
			want := map[string][]string{
				"disabled": {"disabled"}, "never": {"never_probed"}, "stale": {"stale_probe"},
				"unhealthy": {"unhealthy"}, "draining": {"draining"}, "noagent": {"agent_unsupported"},
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
