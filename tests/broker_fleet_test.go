package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// Fleet's side of the keys it mints (README, "Credentials Fleet mints"),
// through the API on both stores, with fake hosts and a broker in memory:
// the values reach the host in the start and again before they expire,
// the API shows their expiry and never a value, a key that cannot be
// minted refuses the dispatch leaving nothing, and an ended run's token is
// revoked. (The broker's own minting against fake providers, and a real
// edge, are tested with package broker and the e2e tests.)

// memBroker is a fleet.Broker in memory: acme/GITHUB_TOKEN mints a run's
// own token (sealed bound to the run, revoked at its end), acme/SAAS_TOKEN
// the fleet's OAuth2 token; each value is new ("<kind>-secret-<n>") and
// valid for an hour on the stack's clock.
type memBroker struct {
	clk clock.Clock

	mu      sync.Mutex
	n       int
	refuse  *broker.Error
	revoked []string
}

var _ fleet.Broker = (*memBroker)(nil)

const memTTL = time.Hour

var memKinds = map[string]string{"acme/GITHUB_TOKEN": broker.KindGitHubApp, "acme/SAAS_TOKEN": broker.KindOAuth2}

func (b *memBroker) Kind(projectID, key string) (string, bool) {
	k, ok := memKinds[projectID+"/"+key]
	return k, ok
}

func (b *memBroker) Mint(_ context.Context, req broker.MintRequest) (broker.Minted, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	kind := memKinds[req.ProjectID+"/"+req.Key]
	if b.refuse != nil && b.refuse.Key == req.Key {
		return broker.Minted{}, b.refuse
	}
	b.n++
	v := fmt.Sprintf("%s-secret-%d", kind, b.n)
	m := broker.Minted{Kind: kind, Value: hostproto.SecretString(v), ExpiresAt: b.clk.Now().Add(memTTL)}
	if kind == broker.KindGitHubApp {
		m.Sealed = []byte("sealed(" + v + ")" + req.FleetRunID)
	}
	return m, nil
}

func (b *memBroker) Revoke(_ context.Context, req broker.MintRequest, sealed []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := strings.CutSuffix(string(sealed), req.FleetRunID)
	if !ok {
		return &broker.Error{ProjectID: req.ProjectID, Key: req.Key, Kind: broker.KindGitHubApp, Detail: "sealed for another run"}
	}
	b.revoked = append(b.revoked, strings.TrimSuffix(strings.TrimPrefix(v, "sealed("), ")"))
	return nil
}

func (b *memBroker) refuseKey(e *broker.Error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refuse = e
}

func (b *memBroker) revokedValues() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.revoked...)
}

// brokerStack is a stack with a memBroker, Fleet's log and metrics kept,
// a fake host with the secrets proxy registered and probed, and a caller
// alice.
func brokerStack(t *testing.T, kind string) (*stack, *memBroker, *fakehost.Host, string, *syncbuf.Buffer) {
	t.Helper()
	var logs syncbuf.Buffer
	b := &memBroker{}
	s := newStack(t, kind, stackOptions{broker: b, log: &logs, metrics: &logs})
	b.clk = s.clk
	host := s.addHost(t, "h1", fakehost.Config{Features: fakeFeatures}, nil)
	s.probe(t, "h1")
	return s, b, host, s.mint(t, "alice", "*", "*"), &logs
}

// brokeredDispatch declares both brokered keys and one the host keeps.
const brokeredDispatch = `{"agent":"shell","repository":"acme/web","secrets":[` +
	`{"projectId":"acme","key":"GITHUB_TOKEN","domains":["api.github.com","github.com"]},` +
	`{"projectId":"acme","key":"PLAIN","domains":["api.example.com"]},` +
	`{"projectId":"acme","key":"SAAS_TOKEN","domains":["api.saas.example"]}]}`

// heldValues is what a host holds as "<key>=<value> until <expiry>".
func heldValues(vs []hostproto.BrokeredValue) []string {
	var out []string
	for _, v := range vs {
		out = append(out, fmt.Sprintf("%s=%s until %s", v.ID(), string(v.Value), v.ExpiresAt.UTC().Format(time.RFC3339)))
	}
	return out
}

// runCredentials is GET /fleet/runs/{id}'s credentials, and the raw answer.
func (s *stack) runCredentials(t *testing.T, token, id string) ([]map[string]any, string) {
	t.Helper()
	a := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+id, token, "")
	var out struct {
		Run struct {
			Credentials []map[string]any `json:"credentials"`
		} `json:"run"`
	}
	json.Unmarshal([]byte(a.raw), &out)
	return out.Run.Credentials, a.raw
}

// TestBrokeredKeysReachTheHostAndStayFresh: the start carries a value per
// brokered key, none for the key the host keeps; GET of the run lists the
// keys with their expiry and no value; once the clock has passed the
// expiry less ten minutes the sweep sends fresh values (PUT), GET shows
// the new expiry, and the GitHub token replaced is revoked; no value is in
// the run's record, its events or Fleet's log.
func TestBrokeredKeysReachTheHostAndStayFresh(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, b, host, alice, logs := brokerStack(t, kind)
			a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, brokeredDispatch)
			id, child := a.str("fleetRunId"), a.str("childRunId")
			exp := s.clk.Now().Add(memTTL).UTC().Format(time.RFC3339)
			want := []string{"acme/GITHUB_TOKEN=githubApp-secret-1 until " + exp, "acme/SAAS_TOKEN=oauth2-secret-2 until " + exp}
			if starts := host.Starts(); len(starts) != 1 || !reflect.DeepEqual(heldValues(starts[0].Credentials), want) {
				t.Fatalf("the start carried %v, want %v", heldValues(host.Starts()[0].Credentials), want)
			}

			creds, raw := s.runCredentials(t, alice, id)
			if len(creds) != 2 || creds[0]["key"] != "GITHUB_TOKEN" || creds[0]["kind"] != "githubApp" || creds[0]["expiresAt"] != exp ||
				creds[1]["key"] != "SAAS_TOKEN" || creds[1]["kind"] != "oauth2" || creds[1]["expiresAt"] != exp || creds[0]["revokedAt"] != nil {
				t.Fatalf("GET shows credentials %v", creds)
			}
			if strings.Contains(raw, "-secret-") || strings.Contains(raw, "sealed") {
				t.Fatalf("GET shows a value: %s", raw)
			}
			if list := s.must(t, http.StatusOK, "GET", "/fleet/runs", alice, ""); strings.Contains(list.raw, "credentials") {
				t.Fatalf("the listing shows credentials: %s", list.raw)
			}

			host.SetRun(child, hostproto.StatusRunning, nil, "")
			s.clk.Advance(memTTL - broker.RefreshMargin - time.Second)
			if rep := s.sweep(t); rep.Credentials != 0 || len(host.CredentialPuts(child)) != 0 {
				t.Fatalf("a sweep with more than ten minutes left sent values: %+v", rep)
			}
			s.clk.Advance(2 * time.Second) // past expiry less ten minutes
			if rep := s.sweep(t); rep.Credentials != 2 || rep.Revoked != 1 {
				t.Fatalf("the sweep at expiry less ten minutes: %+v", rep)
			}
			exp2 := s.clk.Now().Add(memTTL).UTC().Format(time.RFC3339)
			want = []string{"acme/GITHUB_TOKEN=githubApp-secret-3 until " + exp2, "acme/SAAS_TOKEN=oauth2-secret-4 until " + exp2}
			if puts := host.CredentialPuts(child); len(puts) != 1 || !reflect.DeepEqual(heldValues(puts[0].Credentials), want) {
				t.Fatalf("PUTs %+v, want one with %v", puts, want)
			}
			if creds, _ := s.runCredentials(t, alice, id); creds[0]["expiresAt"] != exp2 || creds[1]["expiresAt"] != exp2 {
				t.Fatalf("GET after the refresh: %v", creds)
			}
			if got := b.revokedValues(); !reflect.DeepEqual(got, []string{"githubApp-secret-1"}) {
				t.Fatalf("revoked %v, want the replaced token", got)
			}
			noValueStored(t, s, logs, id)
		})
	}
}

// noValueStored: no value the broker minted is in the run's item, its
// events or any log line.
func noValueStored(t *testing.T, s *stack, logs *syncbuf.Buffer, id string) {
	t.Helper()
	run, err := s.app.Store.GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	item, _ := json.Marshal(run)
	events, _ := s.app.Store.ListEvents(context.Background(), id, 0, 1000)
	ev, _ := json.Marshal(events)
	for where, text := range map[string]string{"the run record": string(item), "the events": string(ev), "Fleet's log": logs.String()} {
		// The record keeps the run's token sealed: this broker's sealing
		// is plain text in parentheses, which a real sealer's is not.
		if strings.Contains(strings.NewReplacer("sealed(githubApp", "").Replace(text), "-secret-") {
			t.Errorf("%s holds a value: %s", where, text)
		}
	}
}

// TestBrokeredKeyThatCannotBeMintedRefusesTheDispatch: 409
// credential_unavailable with the key, its kind and the provider's
// status; no run, no idempotency item, no start; the same request with
// the same key dispatches once the provider answers.
func TestBrokeredKeyThatCannotBeMintedRefusesTheDispatch(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, b, host, alice, _ := brokerStack(t, kind)
			b.refuseKey(&broker.Error{ProjectID: "acme", Key: "GITHUB_TOKEN", Kind: broker.KindGitHubApp, ProviderStatus: 422,
				Detail: "GitHub refused a token for acme/web"})
			a := s.must(t, http.StatusConflict, "POST", "/fleet/runs", alice, brokeredDispatch, "Idempotency-Key", "once")
			if a.str("code") != "credential_unavailable" || !strings.Contains(a.errorText(), "acme/GITHUB_TOKEN") ||
				!strings.Contains(a.raw, `"details":{"projectId":"acme","key":"GITHUB_TOKEN","kind":"githubApp","providerStatus":422}`) {
				t.Fatalf("refusal %s", a.raw)
			}
			if host.StartCalls() != 0 {
				t.Fatalf("the host was called")
			}
			if list := s.must(t, http.StatusOK, "GET", "/fleet/runs", alice, ""); !strings.Contains(list.raw, `"runs":[]`) {
				t.Fatalf("runs after the refusal: %s", list.raw)
			}
			if _, err := s.app.Store.GetIdempotency(context.Background(), "alice#once"); err == nil {
				t.Fatal("the refused dispatch left its idempotency item")
			}
			b.refuseKey(nil)
			if a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, brokeredDispatch, "Idempotency-Key", "once"); a.body["reused"] == true {
				t.Fatalf("the dispatch once minting works: %s", a.raw)
			}
		})
	}
}

// TestBrokeredTokenIsRevokedWhenTheRunEnds: the sweep that drains a run
// revokes its GitHub token; GET shows when; the OAuth2 key, the fleet's,
// is not revoked.
func TestBrokeredTokenIsRevokedWhenTheRunEnds(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, b, host, alice, _ := brokerStack(t, kind)
			a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, brokeredDispatch)
			id, child := a.str("fleetRunId"), a.str("childRunId")
			s.clk.Advance(5 * time.Minute)
			host.SetRun(child, hostproto.StatusSucceeded, new(0), "")
			if rep := s.sweep(t); rep.Drained != 1 || rep.Revoked != 1 {
				t.Fatalf("sweep: %+v", rep)
			}
			if got := b.revokedValues(); !reflect.DeepEqual(got, []string{"githubApp-secret-1"}) {
				t.Fatalf("revoked %v", got)
			}
			creds, _ := s.runCredentials(t, alice, id)
			if creds[0]["revokedAt"] != s.clk.Now().UTC().Format(time.RFC3339) || creds[1]["revokedAt"] != nil {
				t.Fatalf("GET after the end: %v", creds)
			}
		})
	}
}

// TestBrokeredValuesLostByTheHostComeBack: a host that lost a live run's
// values (an edge restart) names them missing; the next sweep sends fresh
// ones and the host holds every value again.
func TestBrokeredValuesLostByTheHostComeBack(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, _, host, alice, _ := brokerStack(t, kind)
			a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, brokeredDispatch)
			child := a.str("childRunId")
			host.SetRun(child, hostproto.StatusRunning, nil, "")
			host.LoseCredentials(child)
			if rep := s.sweep(t); rep.Credentials != 2 {
				t.Fatalf("sweep: %+v", rep)
			}
			hr, _ := host.Run(child)
			if len(hr.MissingCredentials) != 0 || len(host.Credentials(child)) != 2 {
				t.Fatalf("the host after the sweep: missing %v, holding %v", hr.MissingCredentials, heldValues(host.Credentials(child)))
			}
		})
	}
}

// TestBrokeredDeliveryRefusedIsCounted: fresh values a host does not take
// are one BrokerFailures metric line each, dimension Kind.
func TestBrokeredDeliveryRefusedIsCounted(t *testing.T) {
	var metrics syncbuf.Buffer
	b := &memBroker{}
	s := newStack(t, "bolt", stackOptions{broker: b, metrics: &metrics})
	b.clk = s.clk
	host := s.addHost(t, "h1", fakehost.Config{Features: fakeFeatures}, nil)
	s.probe(t, "h1")
	alice := s.mint(t, "alice", "*", "*")
	child := s.must(t, http.StatusCreated, "POST", "/fleet/runs", alice, brokeredDispatch).str("childRunId")
	host.SetRun(child, hostproto.StatusRunning, nil, "")
	host.LoseCredentials(child)
	host.RefuseCredentials(http.StatusBadRequest, hostproto.CodeBadRequest)
	before := metrics.String()
	if rep := s.sweep(t); rep.CredentialFailures != 2 {
		t.Fatalf("sweep: %+v", rep)
	}
	var kinds []string
	for _, line := range strings.Split(strings.TrimSpace(strings.TrimPrefix(metrics.String(), before)), "\n") {
		var doc map[string]any
		if json.Unmarshal([]byte(line), &doc) == nil && doc["BrokerFailures"] == 1.0 {
			kinds = append(kinds, doc["Kind"].(string))
		}
	}
	if !reflect.DeepEqual(kinds, []string{"githubApp", "oauth2"}) {
		t.Fatalf("BrokerFailures lines for %v in %s", kinds, bytes.TrimSpace([]byte(metrics.String())))
	}
}
