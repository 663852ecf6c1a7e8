package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/kms"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/clock"
	fleetconfig "github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/fakegithub"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/fakeoauth"
)

// brokerBenchLive is how many live runs a sweep case holds: the sweep's
// own reads (the live index, its cursor) are spread over them alike in a
// case and its baseline.
const brokerBenchLive = 10

// bkPlainKey is a key whose value the host keeps: the baselines declare
// it, so a brokered case differs from its baseline by the brokering alone.
const bkPlainKey = "PLAIN"

// BenchmarkBrokeredDispatchCost reports what brokered keys cost Fleet, on
// DynamoDB (moto_server, dynamostore.Meter), in KMS requests (the sealer
// as deployed, RUNFLEET_BROKER_KEY=kms:, on moto's KMS) and in calls to
// the providers (the fake GitHub and the fake token endpoint count them),
// each case beside a baseline measured in the same run that declares a
// key the host keeps instead:
//
//   - dispatch/*: one dispatch (with an Idempotency-Key) of a run
//     declaring one key: baseline, githubApp (a token minted and sealed
//     for the run), oauth2-fresh (the fleet-wide access token, fresh: the
//     common case), oauth2-refreshing (the dispatch that finds it due and
//     refreshes it, once per token lifetime fleet-wide);
//   - sweep-refresh/*: a sweep of brokerBenchLive live runs each of whose
//     githubApp token is within broker.RefreshMargin of its expiry
//     (minted again, PUT to the host, the record updated, the old token
//     revoked), per refreshed run; baseline: the same sweep of runs
//     without a brokered key;
//   - sweep-end/*: the sweep that drains brokerBenchLive ended runs, with
//     the githubApp token's revocation, per ended run; baseline: without;
//   - vs-baseline/*: each case's units and dollars (DynamoDB and KMS)
//     over its baseline's, what the case adds per million, and for a
//     dispatch the api function's time waiting for the provider
//     (costHostLatency a call).
//
// The warm process is measured (the App's JWT and an opened access token
// kept in memory, as a warm Lambda keeps them); the first mint of a key's
// process is logged.
func BenchmarkBrokeredDispatchCost(b *testing.B) {
	costs := map[string]brokerCost{}
	k := newBrokerBench(b)
	for _, c := range []struct{ name, key string }{
		{"baseline", bkPlainKey}, {"githubApp", bkGitHubKey}, {"oauth2-fresh", bkOAuthKey}, {"oauth2-refreshing", bkOAuthKey},
	} {
		b.Run("dispatch/"+c.name, func(b *testing.B) {
			costs["dispatch/"+c.name] = k.benchDispatch(b, c.key, c.name == "oauth2-refreshing")
		})
	}
	for _, key := range []string{bkPlainKey, bkGitHubKey} {
		name := map[string]string{bkPlainKey: "baseline", bkGitHubKey: "githubApp"}[key]
		b.Run("sweep-refresh/"+name, func(b *testing.B) { costs["sweep-refresh/"+name] = benchSweepRefresh(b, key) })
		b.Run("sweep-end/"+name, func(b *testing.B) { costs["sweep-end/"+name] = benchSweepEnd(b, key) })
	}
	for _, c := range []struct{ name, base string }{
		{"dispatch/githubApp", "dispatch/baseline"}, {"dispatch/oauth2-fresh", "dispatch/baseline"},
		{"dispatch/oauth2-refreshing", "dispatch/baseline"},
		{"sweep-refresh/githubApp", "sweep-refresh/baseline"}, {"sweep-end/githubApp", "sweep-end/baseline"},
	} {
		got, base := costs[c.name], costs[c.base]
		if got.n == 0 || base.n == 0 {
			continue // a -bench filter left one out
		}
		b.Run("vs-baseline/"+strings.ReplaceAll(c.name, "/", "-"), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
			}
			b.ReportMetric(got.rcu/base.rcu, "xRCU")
			b.ReportMetric(got.wcu/base.wcu, "xWCU")
			b.ReportMetric(got.calls/base.calls, "xddbcalls")
			b.ReportMetric(got.dollars()/base.dollars(), "x$ddb+kms")
			b.ReportMetric((got.dollars()-base.dollars())*1e6, "$extra-ddb+kms/M")
			if strings.HasPrefix(c.name, "dispatch/") {
				// The api function waits for the provider within the
				// dispatch: billed costHostLatency a call (a provider on
				// loopback cannot measure it). The sweep function is
				// billed its whole Timeout whatever it does.
				wait := (got.provider - base.provider) * costHostLatency.Seconds()
				b.ReportMetric(wait*float64(functionInt(b, "ApiFunction", "MemorySize"))/1024*priceLambdaGBs*1e6, "$extra-lambda/M")
			}
		})
	}
}

// brokerBench is a Fleet on DynamoDB with a githubApp recipe for
// acme/GITHUB_TOKEN (a fake GitHub, one installation) and an oauth2
// recipe for acme/SAAS_TOKEN (a fake token endpoint), both over loopback
// TLS on the stack's fake clock, sealing with a KMS key on moto; a fake
// host registered and probed; a caller alice.
type brokerBench struct {
	s      *stack
	gh     *fakegithub.Server
	oauth  *fakeoauth.Server
	kms    *kmsCounter
	host   *fakehost.Host
	caller string
	n      int // numbers the dispatches' Idempotency-Keys
	// warmed are the keys the process has minted once.
	warmed map[string]bool
}

func newBrokerBench(b *testing.B) *brokerBench {
	b.Helper()
	clk := clock.NewFake(time.Now().UTC().Truncate(time.Second))
	key := fakegithub.NewAppKey(b)
	gh := fakegithub.New(b, fakegithub.Options{Clock: clk, Apps: []fakegithub.App{{
		ID: bkAppID, Key: &key.PublicKey, Permissions: bkPermissions,
		Installations: []fakegithub.Installation{{ID: bkInstallation, Repos: []string{bkRepo}}},
	}}})
	secret := "client-secret-bench"
	oauth := fakeoauth.Start(b, fakeoauth.Config{ClientID: "runfleet", ClientSecret: secret, ExpiresIn: time.Hour, Clock: clk})
	env := brokerEnv(b, map[string]any{
		bkProject + "/" + bkGitHubKey: map[string]any{"githubApp": map[string]any{
			"appId": bkAppID, "privateKeySecret": "file:app-key.pem", "installationId": bkInstallation,
			"permissions": bkPermissions, "apiUrl": gh.APIURL(),
		}},
		bkProject + "/" + bkOAuthKey: map[string]any{"oauth2": map[string]any{
			"tokenUrl": oauth.URL, "clientId": "runfleet", "clientSecretSecret": "file:client-secret",
			"refreshTokenSecret": "file:refresh-token",
		}},
	}, map[string][]byte{"app-key.pem": fakegithub.PKCS1PEM(key), "client-secret": []byte(secret), "refresh-token": []byte(oauth.Seed())})
	// The sealer as deployed: KMS (moto's), whose requests are billed.
	created, err := kms.NewFromConfig(moto.AWSConfig()).CreateKey(context.Background(), &kms.CreateKeyInput{Description: aws.String("broker bench")})
	must(b, err)
	env[fleetconfig.EnvBrokerKey] = "kms:" + aws.ToString(created.KeyMetadata.KeyId)
	counter := &kmsCounter{next: awshttp.NewBuildableClient()}

	// One client trusting both providers' CAs.
	roots := oauth.Client.Transport.(*http.Transport).TLSClientConfig.RootCAs.Clone()
	roots.AddCert(gh.CA.Cert)
	tr := oauth.Client.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.RootCAs = roots

	s := newStack(b, "dynamodb", stackOptions{clock: clk, meter: &dynamostore.Meter{}, env: env, brokerHTTP: &http.Client{Transport: tr},
		aws: func(c aws.Config) aws.Config { c.HTTPClient = counter; return c }})
	host := s.addHost(b, "h1", fakehost.Config{Features: fakeFeatures}, nil)
	s.probe(b, "h1")
	return &brokerBench{s: s, gh: gh, oauth: oauth, kms: counter, host: host, caller: s.mint(b, "alice", "*", []string{bkProject}),
		warmed: map[string]bool{}}
}

// kmsCounter is the AWS SDK's HTTP client counting the KMS requests
// (Encrypt, Decrypt: the sealer's) it sends.
type kmsCounter struct {
	next aws.HTTPClient
	n    atomic.Int64
}

func (c *kmsCounter) Do(req *http.Request) (*http.Response, error) {
	if strings.HasPrefix(req.Header.Get("X-Amz-Target"), "TrentService.") {
		c.n.Add(1)
	}
	return c.next.Do(req)
}

// dispatch is alice's dispatch of a shell run of bkRepo declaring
// acme/<key>, answered 201; it returns the host's run id.
func (k *brokerBench) dispatch(b *testing.B, key string) string {
	b.Helper()
	k.n++
	body := jsonBody(map[string]any{"agent": "shell", "repository": bkRepo,
		"secrets": []map[string]any{{"projectId": bkProject, "key": key, "domains": []string{"api.example.com"}}}})
	a := k.s.must(b, http.StatusCreated, "POST", "/fleet/runs", k.caller, body, "Idempotency-Key", fmt.Sprintf("bench-%d", k.n))
	return a.str("childRunId")
}

// brokerMark is where the counters stood when a measure began.
type brokerMark struct {
	kms       int64
	gh, oauth int
}

// mark starts a measure: the meter and the host's counts from zero.
func (k *brokerBench) mark() brokerMark {
	k.s.meter.Reset()
	k.host.ResetRequests()
	return brokerMark{kms: k.kms.n.Load(), gh: len(k.gh.APIRequests()), oauth: k.oauthCalls()}
}

// oauthCalls are the token endpoint's requests answered.
func (k *brokerBench) oauthCalls() int {
	return k.oauth.Refreshes() + k.oauth.InvalidGrants() + k.oauth.BadClients()
}

// brokerUse is what a measure counted.
type brokerUse struct {
	ddb                 dynamostore.Usage
	kms, provider, host int
}

func (k *brokerBench) since(m brokerMark) brokerUse {
	u := brokerUse{ddb: k.s.meter.Snapshot(), kms: int(k.kms.n.Load() - m.kms),
		provider: len(k.gh.APIRequests()) - m.gh + k.oauthCalls() - m.oauth}
	for _, n := range k.host.Requests() {
		u.host += n
	}
	return u
}

func (u *brokerUse) add(o brokerUse) {
	u.ddb.Calls, u.ddb.RCU, u.ddb.WCU = addCounts(u.ddb.Calls, o.ddb.Calls), addUnits(u.ddb.RCU, o.ddb.RCU), addUnits(u.ddb.WCU, o.ddb.WCU)
	u.kms += o.kms
	u.provider += o.provider
	u.host += o.host
}

// brokerCost is a measure per unit (a dispatch, a run swept) over n units.
type brokerCost struct {
	n                                    float64
	rcu, wcu, calls, kms, provider, host float64
}

func (u brokerUse) per(n int) brokerCost {
	f := float64(n)
	return brokerCost{n: f, rcu: u.ddb.TotalRCU() / f, wcu: u.ddb.TotalWCU() / f, calls: float64(u.ddb.TotalCalls()) / f,
		kms: float64(u.kms) / f, provider: float64(u.provider) / f, host: float64(u.host) / f}
}

// dollars is the unit's DynamoDB units and KMS requests, priced.
func (c brokerCost) dollars() float64 {
	p := dynamostore.OnDemandUSEast1
	return (c.rcu*p.ReadPerMillion+c.wcu*p.WritePerMillion)/1e6 + c.kms*priceKMSRequest
}

func (c brokerCost) report(b *testing.B, unit string) {
	b.ReportMetric(c.rcu, "RCU/"+unit)
	b.ReportMetric(c.wcu, "WCU/"+unit)
	b.ReportMetric(c.calls, "ddbcalls/"+unit)
	b.ReportMetric(c.kms, "kmsreqs/"+unit)
	b.ReportMetric(c.provider, "providercalls/"+unit)
	b.ReportMetric(c.host, "hostcalls/"+unit)
	b.ReportMetric(c.dollars()*1e6, "$ddb+kms/M")
}

// benchDispatch measures b.N dispatches declaring acme/<key>, after one
// that warms the process (a first mint: the App's JWT signed, the access
// token refreshed or opened; logged the first time). With refreshing, the
// clock first passes the fleet-wide access token's expiry less its
// margin, so each dispatch measured refreshes it.
func (k *brokerBench) benchDispatch(b *testing.B, key string, refreshing bool) brokerCost {
	m := k.mark()
	k.dispatch(b, key)
	if !k.warmed[key] {
		k.warmed[key] = true
		b.Logf("the process's first dispatch with acme/%s: %s", key, k.since(m).per(1))
	}
	var use brokerUse
	refreshes := k.oauth.Refreshes()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if refreshing {
			b.StopTimer()
			k.s.clk.Advance(time.Hour - broker.RefreshMargin + time.Second)
			k.s.probe(b, "h1") // routing wants a recent probe
			b.StartTimer()
		}
		m := k.mark()
		k.dispatch(b, key)
		use.add(k.since(m))
	}
	b.StopTimer()
	if start := k.host.Starts(); key != bkPlainKey && len(start[len(start)-1].Credentials) != 1 {
		b.Fatalf("the last start carried %d brokered values; want 1", len(start[len(start)-1].Credentials))
	}
	wantRefreshes := 0
	if refreshing {
		wantRefreshes = b.N
	}
	if key == bkOAuthKey && k.oauth.Refreshes()-refreshes != wantRefreshes {
		b.Fatalf("%d dispatches refreshed the access token %d times; want %d", b.N, k.oauth.Refreshes()-refreshes, wantRefreshes)
	}
	c := use.per(b.N)
	b.Logf("per dispatch with acme/%s: %s", key, perMinute(use.ddb, float64(b.N)))
	c.report(b, "dispatch")
	return c
}

// benchSweepRefresh measures sweeps of brokerBenchLive live runs declaring
// acme/<key>, each after the clock passed their tokens' expiry less the
// refresh margin, per run.
func benchSweepRefresh(b *testing.B, key string) brokerCost {
	k := newBrokerBench(b)
	var children []string
	for range brokerBenchLive {
		children = append(children, k.dispatch(b, key))
	}
	for _, c := range children {
		k.host.SetRun(c, hostproto.StatusRunning, nil, "")
	}
	k.sweep(b)
	revoked := 0
	if key == bkGitHubKey {
		revoked = brokerBenchLive
	}
	var use brokerUse
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		k.s.clk.Advance(fakegithub.TokenLifetime - broker.RefreshMargin + time.Second)
		m := k.mark()
		b.StartTimer()
		rep := k.sweep(b)
		b.StopTimer()
		use.add(k.since(m))
		if rep.Live != brokerBenchLive || rep.Credentials != revoked || rep.Revoked != revoked || rep.CredentialFailures != 0 {
			b.Fatalf("sweep %+v; want %d live, %d refreshed and revoked", rep, brokerBenchLive, revoked)
		}
		b.StartTimer()
	}
	b.StopTimer()
	c := use.per(b.N * brokerBenchLive)
	b.Logf("per live run swept with acme/%s due: %s", key, perMinute(use.ddb, c.n))
	c.report(b, "run")
	return c
}

// benchSweepEnd measures sweeps each draining brokerBenchLive runs
// declaring acme/<key> that ended on the host (synced once while they
// ran), per run.
func benchSweepEnd(b *testing.B, key string) brokerCost {
	k := newBrokerBench(b)
	revoked := 0
	if key == bkGitHubKey {
		revoked = brokerBenchLive
	}
	var use brokerUse
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		var children []string
		for range brokerBenchLive {
			children = append(children, k.dispatch(b, key))
		}
		for _, c := range children {
			k.host.SetRun(c, hostproto.StatusRunning, nil, "")
		}
		k.sweep(b)
		zero := 0
		for _, c := range children {
			k.host.SetRun(c, hostproto.StatusSucceeded, &zero, "")
		}
		m := k.mark()
		b.StartTimer()
		rep := k.sweep(b)
		b.StopTimer()
		use.add(k.since(m))
		if rep.Drained != brokerBenchLive || rep.Revoked != revoked || rep.CredentialFailures != 0 {
			b.Fatalf("sweep %+v; want %d drained, %d revoked", rep, brokerBenchLive, revoked)
		}
		b.StartTimer()
	}
	b.StopTimer()
	c := use.per(b.N * brokerBenchLive)
	b.Logf("per ended run drained with acme/%s: %s", key, perMinute(use.ddb, c.n))
	c.report(b, "run")
	return c
}

// sweep is one sweep without a budget, as benchSweep runs it.
func (k *brokerBench) sweep(b *testing.B) fleet.SweepReport {
	b.Helper()
	rep, err := k.s.app.Fleet.Sweep(context.Background(), fleet.SweepOptions{})
	if err != nil {
		b.Fatalf("sweep: %v", err)
	}
	return rep
}

func (c brokerCost) String() string {
	return fmt.Sprintf("%.2f RCU, %.2f WCU, %.1f DynamoDB calls, %.1f KMS requests, %.1f provider calls, %.1f host calls",
		c.rcu, c.wcu, c.calls, c.kms, c.provider, c.host)
}
