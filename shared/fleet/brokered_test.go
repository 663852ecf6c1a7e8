package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/emf"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// testBroker is a Broker in memory: each recipe mints a fresh value
// valid for an hour on the test's clock ("<kind>-value-<n>"), a GitHub
// token sealed bound to its run (as package broker seals it, so that a
// revocation under another run id fails), and it records every call.
type testBroker struct {
	clk   clock.Clock
	kinds map[string]string // "<project>/<KEY>" -> kind

	mu          sync.Mutex
	n           int
	fail        map[string]*broker.Error
	revokeFails bool
	mints       []broker.MintRequest
	revoked     []string // the values revoked
	// oauth2Until, when set, is the expiry of the one OAuth2 value the
	// broker hands out (it has not refreshed it).
	oauth2Until time.Time
}

const brokerTTL = time.Hour

func newTestBroker(clk clock.Clock) *testBroker {
	return &testBroker{clk: clk, fail: map[string]*broker.Error{},
		kinds: map[string]string{"acme/GITHUB_TOKEN": broker.KindGitHubApp, "acme/SAAS_TOKEN": broker.KindOAuth2}}
}

var _ Broker = (*testBroker)(nil)

func (b *testBroker) Kind(projectID, key string) (string, bool) {
	k, ok := b.kinds[projectID+"/"+key]
	return k, ok
}

func (b *testBroker) Mint(_ context.Context, req broker.MintRequest) (broker.Minted, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := req.ProjectID + "/" + req.Key
	if e := b.fail[id]; e != nil {
		return broker.Minted{}, e
	}
	b.mints = append(b.mints, req)
	b.n++
	kind := b.kinds[id]
	v := fmt.Sprintf("%s-value-%d", kind, b.n)
	m := broker.Minted{Kind: kind, Value: hostproto.SecretString(v), ExpiresAt: b.clk.Now().Add(brokerTTL)}
	if kind == broker.KindOAuth2 && !b.oauth2Until.IsZero() {
		m.Value, m.ExpiresAt = "oauth2-value-current", b.oauth2Until
	}
	if kind == broker.KindGitHubApp {
		m.Sealed = []byte("sealed:" + v + "#" + req.FleetRunID)
	}
	return m, nil
}

func (b *testBroker) Revoke(_ context.Context, req broker.MintRequest, sealed []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, run, ok := strings.Cut(strings.TrimPrefix(string(sealed), "sealed:"), "#")
	switch {
	case !ok || run != req.FleetRunID:
		return &broker.Error{ProjectID: req.ProjectID, Key: req.Key, Kind: broker.KindGitHubApp, Detail: "the sealed token is not this run's"}
	case b.revokeFails:
		return &broker.Error{ProjectID: req.ProjectID, Key: req.Key, Kind: broker.KindGitHubApp, ProviderStatus: 502, Detail: "revoking"}
	}
	b.revoked = append(b.revoked, v)
	return nil
}

func (b *testBroker) failWith(id string, e *broker.Error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail[id] = e
}

func (b *testBroker) setRevokeFails(fails bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.revokeFails = fails
}

func (b *testBroker) mintCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.mints)
}

func (b *testBroker) revokedValues() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.revoked...)
}

// withBroker rebuilds e's Fleet with b as its broker and Fleet's own
// metric lines on metrics.
func (e *testEnv) withBroker(t *testing.T, b Broker, metrics *syncbuf.Buffer) {
	t.Helper()
	cfg := e.f.cfg
	cfg.Broker, cfg.Metrics = b, emf.New(metrics)
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.f = f
}

// brokeredRun declares both brokered keys and one the host keeps.
var brokeredRun = DispatchRequest{Run: runspec.Request{Agent: "shell", Repository: "acme/web", Secrets: []runspec.Secret{
	{ProjectID: "acme", Key: "GITHUB_TOKEN", Domains: []string{"api.github.com"}},
	{ProjectID: "acme", Key: "PLAIN", Domains: []string{"api.example.com"}},
	{ProjectID: "acme", Key: "SAAS_TOKEN", Domains: []string{"api.saas.example"}},
}}}

// valuesOf is brokered values as "<key>=<value>@<expiry>".
func valuesOf(vs []hostproto.BrokeredValue) []string {
	var out []string
	for _, v := range vs {
		out = append(out, fmt.Sprintf("%s=%s@%s", v.ID(), string(v.Value), v.ExpiresAt.Format(time.TimeOnly)))
	}
	return out
}

func brokerEnv(t *testing.T) (*testEnv, *testBroker, *fakehost.Host, *syncbuf.Buffer) {
	t.Helper()
	e := newTestEnv(t, 10*time.Second)
	b := newTestBroker(e.clk)
	var metrics syncbuf.Buffer
	e.withBroker(t, b, &metrics)
	return e, b, e.addHost(t, "h1", proxyHost), &metrics
}

// proxyHost is a host with the secrets proxy, which routing requires of a
// run that declares secrets.
var proxyHost = fakehost.Config{Features: hostproto.Features{SecretsProxy: true, ExecRequire: true}}

// TestDispatchSendsBrokeredValuesAndRecordsNone: a dispatch mints each
// declared key the broker has a recipe for (under the run's id, for its
// repository), sends the values in the start and nothing for a key the
// host keeps; the run records each key's kind and expiry, the GitHub
// token only sealed, and no value anywhere.
func TestDispatchSendsBrokeredValuesAndRecordsNone(t *testing.T) {
	e, b, host, _ := brokerEnv(t)
	res, err := e.f.Dispatch(context.Background(), caller("alice"), brokeredRun, "k1")
	if err != nil || res.Refused {
		t.Fatalf("dispatch: %+v, %v", res, err)
	}
	exp := t0.Add(brokerTTL).Format(time.TimeOnly)
	starts := host.Starts()
	want := []string{"acme/GITHUB_TOKEN=githubApp-value-1@" + exp, "acme/SAAS_TOKEN=oauth2-value-2@" + exp}
	if len(starts) != 1 || !reflect.DeepEqual(valuesOf(starts[0].Credentials), want) {
		t.Fatalf("the start carried %v, want %v", valuesOf(starts[0].Credentials), want)
	}
	for _, m := range b.mints {
		if m.FleetRunID != res.Run.FleetRunID || m.Repository != "acme/web" {
			t.Errorf("minted %+v, want run %s's, for acme/web", m, res.Run.FleetRunID)
		}
	}
	stored, err := e.st.GetRun(context.Background(), res.Run.FleetRunID)
	if err != nil || len(stored.Brokered) != 2 {
		t.Fatalf("stored: %+v, %v", stored, err)
	}
	gh, oa := stored.Brokered[0], stored.Brokered[1]
	if gh.Kind != broker.KindGitHubApp || !gh.ExpiresAt.Equal(t0.Add(brokerTTL)) || string(gh.Sealed) != "sealed:githubApp-value-1#"+res.Run.FleetRunID ||
		oa.Kind != broker.KindOAuth2 || oa.Sealed != nil || gh.RevokedAt != nil {
		t.Fatalf("brokered keys recorded: %+v", stored.Brokered)
	}
	if raw, _ := json.Marshal(stored); strings.Contains(strings.ReplaceAll(string(raw), "sealed:githubApp-value-1", ""), "-value-") {
		t.Fatalf("the run record holds a value: %s", raw)
	}
}

// TestAMintFailureRefusesTheDispatchLeavingNothing: a key the provider
// refuses is 409 credential_unavailable naming it, its kind and the
// provider's status; no run, no idempotency item, no start, and the token
// minted for the key before it is revoked. The same request, once the
// provider answers, dispatches.
func TestAMintFailureRefusesTheDispatchLeavingNothing(t *testing.T) {
	e, b, host, _ := brokerEnv(t)
	ctx := context.Background()
	b.failWith("acme/SAAS_TOKEN", &broker.Error{ProjectID: "acme", Key: "SAAS_TOKEN", Kind: broker.KindOAuth2, ProviderStatus: 400, Detail: "the token endpoint refused the refresh token"})

	_, err := e.f.Dispatch(ctx, caller("alice"), brokeredRun, "k1")
	var fe *Error
	if !errors.As(err, &fe) || fe.Kind != KindConflict || fe.Code != CodeCredentialUnavailable {
		t.Fatalf("dispatch: %v, want 409 %s", err, CodeCredentialUnavailable)
	}
	if d, ok := fe.Details.(CredentialRefusal); !ok || d != (CredentialRefusal{ProjectID: "acme", Key: "SAAS_TOKEN", Kind: broker.KindOAuth2, ProviderStatus: 400}) {
		t.Fatalf("details %#v", fe.Details)
	}
	if want := "secrets[2]: Fleet could not mint acme/SAAS_TOKEN (oauth2): the token endpoint refused the refresh token (the provider answered 400); no run was started"; fe.Message != want {
		t.Fatalf("message %q\nwant    %q", fe.Message, want)
	}
	if host.StartCalls() != 0 {
		t.Fatalf("the host was called %d times", host.StartCalls())
	}
	if _, err := e.st.GetIdempotency(ctx, "alice#k1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("idempotency item: %v, want none", err)
	}
	if page, err := e.st.ListRuns(ctx, store.RunQuery{OwnerID: "alice"}); err != nil || len(page.Runs) != 0 {
		t.Fatalf("runs: %+v, %v", page, err)
	}
	if got := b.revokedValues(); !reflect.DeepEqual(got, []string{"githubApp-value-1"}) {
		t.Fatalf("revoked %v, want the GitHub token minted before the refusal", got)
	}

	b.failWith("acme/SAAS_TOKEN", nil)
	res, err := e.f.Dispatch(ctx, caller("alice"), brokeredRun, "k1")
	if err != nil || res.Reused || res.Refused || host.Created() != 1 {
		t.Fatalf("the dispatch once the provider answers: %+v, %v", res, err)
	}
}

// TestATokenOfADispatchThatStartedNothingIsRevoked: the host refusing the
// run (its policy does not take the key from Fleet) ends the run; its
// GitHub token is revoked at once and the record says when.
func TestATokenOfADispatchThatStartedNothingIsRevoked(t *testing.T) {
	e, b, host, _ := brokerEnv(t)
	host.RefuseStarts(http.StatusForbidden, "key_not_granted")
	res, err := e.f.Dispatch(context.Background(), caller("alice"), brokeredRun, "")
	if err != nil || !res.Refused || res.Run.Reason != "key_not_granted" {
		t.Fatalf("dispatch: %+v, %v", res, err)
	}
	if got := b.revokedValues(); !reflect.DeepEqual(got, []string{"githubApp-value-1"}) {
		t.Fatalf("revoked %v", got)
	}
	stored, _ := e.st.GetRun(context.Background(), res.Run.FleetRunID)
	if gh := stored.Brokered[0]; gh.RevokedAt == nil || !gh.RevokedAt.Equal(t0) || stored.Brokered[1].RevokedAt != nil {
		t.Fatalf("recorded %+v", stored.Brokered)
	}
}

// TestTheNextHostGetsTheSameValues: the host routing chose busy, the run
// moves to the next with the values minted once, and none is revoked.
func TestTheNextHostGetsTheSameValues(t *testing.T) {
	e, b, h1, _ := brokerEnv(t)
	h2 := e.addHost(t, "h2", proxyHost)
	h1.RefuseStarts(http.StatusConflict, hostproto.ReasonHostBusy)
	res, err := e.f.Dispatch(context.Background(), caller("alice"), brokeredRun, "")
	if err != nil || res.Refused || res.Run.HostID != "h2" || !reflect.DeepEqual(excludedHosts(res), []string{"h1:host_busy"}) {
		t.Fatalf("dispatch: %+v, %v", res, err)
	}
	if b.mintCount() != 2 || len(b.revokedValues()) != 0 {
		t.Fatalf("%d mints and %v revoked for one dispatch, want 2 and none", b.mintCount(), b.revokedValues())
	}
	exp := t0.Add(brokerTTL).Format(time.TimeOnly)
	want := []string{"acme/GITHUB_TOKEN=githubApp-value-1@" + exp, "acme/SAAS_TOKEN=oauth2-value-2@" + exp}
	if starts := h2.Starts(); len(starts) != 1 || !reflect.DeepEqual(valuesOf(starts[0].Credentials), want) {
		t.Fatalf("h2's start: %+v", starts)
	}
}

// duplicateKeyMissed hides idempotency items from eventually consistent
// reads, as a read racing a duplicate's write would: the dispatch learns
// of the first one only at its own conditional put.
type duplicateKeyMissed struct{ store.Store }

func (s duplicateKeyMissed) GetIdempotency(ctx context.Context, key string) (store.Idempotency, error) {
	if store.AllowsEventualRead(ctx) {
		return store.Idempotency{}, store.ErrNotFound
	}
	return s.Store.GetIdempotency(ctx, key)
}

// TestADuplicateThatLostTheRaceRevokesItsTokens: a duplicate dispatch
// that minted before it learnt of the first answers the first run and
// revokes what it minted; the first run's values stay.
func TestADuplicateThatLostTheRaceRevokesItsTokens(t *testing.T) {
	e, b, host, _ := brokerEnv(t)
	ctx := context.Background()
	first, err := e.f.Dispatch(ctx, caller("alice"), brokeredRun, "k1")
	if err != nil {
		t.Fatal(err)
	}
	f := e.fleetOver(t, duplicateKeyMissed{e.st})
	f.cfg.Broker = b
	dup, err := f.Dispatch(ctx, caller("alice"), brokeredRun, "k1")
	if err != nil || !dup.Reused || dup.Run.FleetRunID != first.Run.FleetRunID || host.StartCalls() != 1 {
		t.Fatalf("duplicate: %+v, %v", dup, err)
	}
	if got := b.revokedValues(); !reflect.DeepEqual(got, []string{"githubApp-value-3"}) {
		t.Fatalf("revoked %v, want only the duplicate's token", got)
	}
}

func TestDueCredentials(t *testing.T) {
	now := t0
	revoked := now.Add(-time.Minute)
	keys := []store.BrokeredKey{
		{ProjectID: "acme", Key: "A", ExpiresAt: now.Add(time.Hour)},
		{ProjectID: "acme", Key: "B", ExpiresAt: now.Add(broker.RefreshMargin - time.Second)},
		{ProjectID: "acme", Key: "C", ExpiresAt: now.Add(broker.RefreshMargin)},
		{ProjectID: "acme", Key: "D", ExpiresAt: now.Add(time.Hour), RevokedAt: &revoked},
		{ProjectID: "acme", Key: "E"},
	}
	for _, c := range []struct {
		name    string
		missing []string
		status  string
		want    []dueCredential
	}{
		{"running", nil, hostproto.StatusRunning, []dueCredential{{1, dueExpiring}, {3, dueRevoked}, {4, dueExpiring}}},
		{"lost by a restart", []string{"acme/A", "acme/B", "other/A"}, hostproto.StatusPending,
			[]dueCredential{{0, dueMissing}, {1, dueMissing}, {3, dueRevoked}, {4, dueExpiring}}},
		{"ended on its host", []string{"acme/A"}, hostproto.StatusSucceeded, nil},
	} {
		got := dueCredentials(credentialsInput{Keys: keys, Missing: c.missing, HostStatus: c.status, Now: now})
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// brokeredRunning is a brokered run dispatched and running on host.
func brokeredRunning(t *testing.T, e *testEnv, host *fakehost.Host) store.Run {
	t.Helper()
	res, err := e.f.Dispatch(context.Background(), caller("alice"), brokeredRun, "")
	if err != nil || res.Refused {
		t.Fatalf("dispatch: %+v, %v", res, err)
	}
	host.SetRun(res.Run.ChildRunID, hostproto.StatusRunning, nil, "")
	return res.Run
}

// TestTheSweepSendsFreshValuesBeforeTheyExpire: with more than the
// refresh margin left the sweep sends nothing; within it, it mints each
// key again, the host takes them (PUT), the run records their expiry, and
// the GitHub token they replaced is revoked (the OAuth2 one is the
// fleet's, never revoked per run).
func TestTheSweepSendsFreshValuesBeforeTheyExpire(t *testing.T) {
	e, b, host, _ := brokerEnv(t)
	ctx := context.Background()
	run := brokeredRunning(t, e, host)

	e.clk.Advance(brokerTTL - broker.RefreshMargin - time.Second)
	if rep, err := e.f.Sweep(ctx, SweepOptions{}); err != nil || rep.Credentials != 0 || len(host.CredentialPuts(run.ChildRunID)) != 0 {
		t.Fatalf("a sweep with more than the margin left: %+v, %v, puts %v", rep, err, host.CredentialPuts(run.ChildRunID))
	}
	e.clk.Advance(2 * time.Second)
	rep, err := e.f.Sweep(ctx, SweepOptions{})
	if err != nil || rep.Credentials != 2 || rep.Revoked != 1 || rep.CredentialFailures != 0 {
		t.Fatalf("the sweep within the margin: %+v, %v", rep, err)
	}
	exp := e.clk.Now().Add(brokerTTL).Format(time.TimeOnly)
	want := []string{"acme/GITHUB_TOKEN=githubApp-value-3@" + exp, "acme/SAAS_TOKEN=oauth2-value-4@" + exp}
	if puts := host.CredentialPuts(run.ChildRunID); len(puts) != 1 || !reflect.DeepEqual(valuesOf(puts[0].Credentials), want) {
		t.Fatalf("PUTs %v, want one with %v", puts, want)
	}
	if got := valuesOf(host.Credentials(run.ChildRunID)); !reflect.DeepEqual(got, want) {
		t.Fatalf("the host holds %v", got)
	}
	if got := b.revokedValues(); !reflect.DeepEqual(got, []string{"githubApp-value-1"}) {
		t.Fatalf("revoked %v, want the replaced GitHub token", got)
	}
	stored, _ := e.st.GetRun(ctx, run.FleetRunID)
	if gh := stored.Brokered[0]; !gh.ExpiresAt.Equal(e.clk.Now().Add(brokerTTL)) || string(gh.Sealed) != "sealed:githubApp-value-3#"+run.FleetRunID ||
		!stored.Brokered[1].ExpiresAt.Equal(e.clk.Now().Add(brokerTTL)) {
		t.Fatalf("recorded %+v", stored.Brokered)
	}
	if rep, _ := e.f.Sweep(ctx, SweepOptions{}); rep.Credentials != 0 || b.mintCount() != 4 {
		t.Fatalf("a sweep right after minted again: %+v, %d mints", rep, b.mintCount())
	}
}

// TestTheSweepGivesBackValuesTheHostLost: a host that restarted names the
// keys it lost; the next sweep sends fresh ones, and the run is whole.
func TestTheSweepGivesBackValuesTheHostLost(t *testing.T) {
	e, _, host, _ := brokerEnv(t)
	run := brokeredRunning(t, e, host)
	host.LoseCredentials(run.ChildRunID)
	if hr, _ := host.Run(run.ChildRunID); len(hr.MissingCredentials) != 2 || len(host.Credentials(run.ChildRunID)) != 0 {
		t.Fatalf("the host after the loss: %+v", hr)
	}
	rep, err := e.f.Sweep(context.Background(), SweepOptions{})
	if err != nil || rep.Credentials != 2 {
		t.Fatalf("sweep: %+v, %v", rep, err)
	}
	if hr, _ := host.Run(run.ChildRunID); len(hr.MissingCredentials) != 0 || len(host.Credentials(run.ChildRunID)) != 2 {
		t.Fatalf("the host after the sweep: %+v, %v", hr, valuesOf(host.Credentials(run.ChildRunID)))
	}
}

// TestAHostThatDoesNotTakeFreshValuesKeepsTheRecord: a PUT the host
// refuses revokes the fresh token, records nothing, and counts one
// failure per key in the metrics; the next sweep tries again.
func TestAHostThatDoesNotTakeFreshValuesKeepsTheRecord(t *testing.T) {
	e, b, host, metrics := brokerEnv(t)
	ctx := context.Background()
	run := brokeredRunning(t, e, host)
	before, _ := e.st.GetRun(ctx, run.FleetRunID)
	host.LoseCredentials(run.ChildRunID)
	host.RefuseCredentials(http.StatusBadRequest, hostproto.CodeBadRequest)
	rep, err := e.f.Sweep(ctx, SweepOptions{})
	if err != nil || rep.Credentials != 0 || rep.CredentialFailures != 2 {
		t.Fatalf("sweep: %+v, %v", rep, err)
	}
	if got := b.revokedValues(); !reflect.DeepEqual(got, []string{"githubApp-value-3"}) {
		t.Fatalf("revoked %v, want the fresh token the host refused", got)
	}
	if after, _ := e.st.GetRun(ctx, run.FleetRunID); !reflect.DeepEqual(after.Brokered, before.Brokered) {
		t.Fatalf("recorded %+v, want %+v", after.Brokered, before.Brokered)
	}
	lines := strings.Split(strings.TrimSpace(metrics.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"BrokerFailures":1`) || !strings.Contains(lines[0], `"Kind":"githubApp"`) ||
		!strings.Contains(lines[1], `"Kind":"oauth2"`) {
		t.Fatalf("metric lines %q", lines)
	}
	host.RefuseCredentials(0, "")
	if rep, _ := e.f.Sweep(ctx, SweepOptions{}); rep.Credentials != 2 {
		t.Fatalf("the next sweep: %+v", rep)
	}
}

// TestAnEndedRunsTokenIsRevoked: once the sweep drains a run, its GitHub
// token is revoked and the record says when; a revocation that fails
// never holds the drain back, is counted, and leaves the record saying
// nothing was revoked, until a GET of the run tries again.
func TestAnEndedRunsTokenIsRevoked(t *testing.T) {
	for _, fails := range []bool{false, true} {
		t.Run(fmt.Sprintf("revoke fails %v", fails), func(t *testing.T) {
			e, b, host, _ := brokerEnv(t)
			ctx := context.Background()
			run := brokeredRunning(t, e, host)
			b.setRevokeFails(fails)
			zero := 0
			host.SetRun(run.ChildRunID, hostproto.StatusSucceeded, &zero, "")
			e.clk.Advance(time.Minute)
			rep, err := e.f.Sweep(ctx, SweepOptions{})
			if err != nil || rep.Drained != 1 || rep.Credentials != 0 {
				t.Fatalf("sweep: %+v, %v", rep, err)
			}
			stored, _ := e.st.GetRun(ctx, run.FleetRunID)
			gh := stored.Brokered[0]
			if !fails {
				if rep.Revoked != 1 || gh.RevokedAt == nil || !gh.RevokedAt.Equal(e.clk.Now()) || stored.Brokered[1].RevokedAt != nil ||
					!reflect.DeepEqual(b.revokedValues(), []string{"githubApp-value-1"}) {
					t.Fatalf("report %+v, recorded %+v, revoked %v", rep, stored.Brokered, b.revokedValues())
				}
				return
			}
			if rep.CredentialFailures != 1 || rep.Revoked != 0 || gh.RevokedAt != nil || !stored.Drained {
				t.Fatalf("report %+v, recorded %+v", rep, stored)
			}
			b.setRevokeFails(false)
			st, err := e.f.Run(ctx, caller("alice"), run.FleetRunID)
			if err != nil || st.Run.Brokered[0].RevokedAt == nil || !reflect.DeepEqual(b.revokedValues(), []string{"githubApp-value-1"}) {
				t.Fatalf("GET after: %+v, %v, revoked %v", st.Run.Brokered, err, b.revokedValues())
			}
		})
	}
}

// TestARetryGetsFreshValues: a run's token revoked at its end, a retry's
// attempt gets a fresh one from the retry itself (not the next sweep);
// the OAuth2 value it still holds is not sent again.
func TestARetryGetsFreshValues(t *testing.T) {
	e, b, host, _ := brokerEnv(t)
	ctx := context.Background()
	run := brokeredRunning(t, e, host)
	host.SetRun(run.ChildRunID, hostproto.StatusFailed, new(1), "")
	if rep, _ := e.f.Sweep(ctx, SweepOptions{}); rep.Drained != 1 || rep.Revoked != 1 {
		t.Fatalf("sweep: %+v", rep)
	}
	res, err := e.f.Retry(ctx, caller("alice"), run.FleetRunID)
	if err != nil || res.Outcome.Accepted != hostproto.Accepted {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	exp := t0.Add(brokerTTL).Format(time.TimeOnly)
	want := []string{"acme/GITHUB_TOKEN=githubApp-value-3@" + exp}
	if puts := host.CredentialPuts(run.ChildRunID); len(puts) != 1 || !reflect.DeepEqual(valuesOf(puts[0].Credentials), want) {
		t.Fatalf("PUTs %+v, want %v", puts, want)
	}
	if gh := res.Run.Brokered[0]; gh.RevokedAt != nil || string(gh.Sealed) != "sealed:githubApp-value-3#"+run.FleetRunID || b.mintCount() != 3 {
		t.Fatalf("recorded after the retry %+v", res.Run.Brokered)
	}
}

// TestBrokerMetricsWriteOneLinePerEvent: each event the broker reports is
// one EMF line of its metric, dimension Kind, value 1.
func TestBrokerMetricsWriteOneLinePerEvent(t *testing.T) {
	var buf syncbuf.Buffer
	clk := clock.NewFake(t0)
	hook := BrokerMetrics(emf.New(&buf), clk, slog.New(slog.DiscardHandler))
	hook(broker.KindGitHubApp, broker.EventMint)
	hook(broker.KindOAuth2, broker.EventRefresh)
	hook(broker.KindOAuth2, broker.EventFailure)
	hook(broker.KindGitHubApp, broker.EventRevocation)
	hook(broker.KindGitHubApp, "unknown")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []struct{ metric, kind string }{
		{MetricBrokerMints, "githubApp"}, {MetricBrokerRefreshes, "oauth2"}, {MetricBrokerFailures, "oauth2"}, {MetricBrokerRevocations, "githubApp"},
	}
	if len(lines) != len(want) {
		t.Fatalf("lines %q", lines)
	}
	for i, w := range want {
		var doc map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &doc); err != nil {
			t.Fatal(err)
		}
		aws := doc["_aws"].(map[string]any)
		d := aws["CloudWatchMetrics"].([]any)[0].(map[string]any)
		if doc[w.metric] != 1.0 || doc["Kind"] != w.kind || d["Namespace"] != "Runfleet" ||
			fmt.Sprint(d["Dimensions"]) != "[[Kind]]" || aws["Timestamp"] != float64(t0.UnixMilli()) {
			t.Errorf("line %d: %s, want %s of %s", i, lines[i], w.metric, w.kind)
		}
	}
}

// TestAnOAuth2ValueTheBrokerHasNotRefreshedIsNotSentAgain: the fleet-wide
// value due by Fleet's reckoning but not yet refreshed by the broker (the
// same expiry) is not sent to the host again; a GitHub token is.
func TestAnOAuth2ValueTheBrokerHasNotRefreshedIsNotSentAgain(t *testing.T) {
	e, b, host, _ := brokerEnv(t)
	b.oauth2Until = t0.Add(brokerTTL)
	run := brokeredRunning(t, e, host)
	e.clk.Advance(brokerTTL - broker.RefreshMargin + time.Second)
	if rep, err := e.f.Sweep(context.Background(), SweepOptions{}); err != nil || rep.Credentials != 1 {
		t.Fatalf("sweep: %+v, %v", rep, err)
	}
	puts := host.CredentialPuts(run.ChildRunID)
	if len(puts) != 1 || len(puts[0].Credentials) != 1 || puts[0].Credentials[0].Key != "GITHUB_TOKEN" {
		t.Fatalf("PUTs %+v, want the GitHub token alone", puts)
	}
}
