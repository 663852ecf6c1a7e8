package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// TestOpenAPIDescribesBrokeredRuns: the answers that carry brokered keys
// (a run's credentials on GET, before and after its token's revocation)
// and the refusal of a key that cannot be minted are what
// infra/openapi.yaml and fleetapi's types say, the refusal's details a
// fleetapi.CredentialUnavailable to their very bytes.
func TestOpenAPIDescribesBrokeredRuns(t *testing.T) {
	b := &memBroker{}
	s := newStack(t, "bolt", stackOptions{broker: b})
	b.clk = s.clk
	host := s.addHost(t, "h1", fakehost.Config{Features: fakeFeatures}, nil)
	s.probe(t, "h1")
	tok := s.mint(t, "alice", "*", "*")
	sm := &sampler{t: t, base: s.srv.URL}

	run := sm.do("POST", "/fleet/runs", "/fleet/runs", tok, brokeredDispatch, 201)
	id := fmt.Sprint(run["fleetRunId"])
	sm.do("GET", "/fleet/runs/{id}", "/fleet/runs/"+id, tok, "", 200)
	host.SetRun(fmt.Sprint(run["childRunId"]), hostproto.StatusSucceeded, new(0), "")
	s.sweep(t)
	sm.do("GET", "/fleet/runs/{id}", "/fleet/runs/"+id, tok, "", 200)
	b.refuseKey(&broker.Error{ProjectID: "acme", Key: "SAAS_TOKEN", Kind: broker.KindOAuth2, ProviderStatus: 400, Detail: "invalid_grant"})
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, brokeredDispatch, 409)
	b.refuseKey(&broker.Error{ProjectID: "acme", Key: "GITHUB_TOKEN", Kind: broker.KindGitHubApp, Detail: "the App's private key could not be read"})
	sm.do("POST", "/fleet/runs", "/fleet/runs", tok, brokeredDispatch, 409)

	if !bytes.Contains(sm.samples[1].raw, []byte(`"credentials":[`)) || !bytes.Contains(sm.samples[2].raw, []byte(`"revokedAt"`)) {
		t.Fatalf("GET answers %s\n%s", sm.samples[1].raw, sm.samples[2].raw)
	}
	for _, x := range sm.samples {
		checkAPITypes(t, x)
	}
	for _, x := range sm.samples[3:] {
		var e fleetapi.Error
		var d fleetapi.CredentialUnavailable
		if err := json.Unmarshal(x.raw, &e); err != nil || e.Code != fleetapi.CodeCredentialUnavailable {
			t.Fatalf("refusal %s", x.raw)
		}
		if out, err := roundTrip(e.Details, &d, json.Marshal); err != nil || !bytes.Equal(out, e.Details) || d.Key == "" {
			t.Errorf("details: fleetapi.CredentialUnavailable re-encodes\n%s\nas\n%s (%v)", e.Details, out, err)
		}
	}
	path := filepath.Join(t.TempDir(), "samples.json")
	raw, _ := json.Marshal(sm.samples)
	must(t, os.WriteFile(path, raw, 0o600))
	if out, err := exec.Command(openAPIPython(t), "-c", validateScript, openAPIDoc, path).CombinedOutput(); err != nil {
		t.Fatalf("answers the document does not describe (%v):\n%s", err, out)
	}
}
