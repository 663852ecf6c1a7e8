package broker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakeoauth"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// backend is one store holding broker states, as the Fleet processes of a
// test see it.
type backend struct {
	// handle returns another process's handle on the store: its own
	// client on the same tables (dynamostore), the same file's store
	// (boltstore, which one process opens).
	handle func() store.BrokerStates
	// raw is everything the store keeps, as stored, for the leak check.
	raw func() string
}

// newStates makes an empty backend reading the time from clk.
type newStates func(t *testing.T, clk *clock.Fake) backend

// brokerStores are the stores every oauth2 test runs on: both of Fleet's,
// and memStates, which keeps the contract the simplest way.
var brokerStores = map[string]newStates{
	"memory": func(t *testing.T, clk *clock.Fake) backend {
		m := newMemStates(clk)
		return backend{handle: func() store.BrokerStates { return m }, raw: func() string { return fmt.Sprintf("%#v", m.states) }}
	},
	"boltstore": func(t *testing.T, clk *clock.Fake) backend {
		path := filepath.Join(t.TempDir(), "fleet.db")
		s, err := boltstore.Open(path, boltstore.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return backend{handle: func() store.BrokerStates { return s }, raw: func() string {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Error(err)
			}
			return string(b)
		}}
	},
	"dynamostore": func(t *testing.T, clk *clock.Fake) backend {
		names := dynamostore.Prefixed(motoserver.Unique("broker") + "-")
		open := func() *dynamostore.Store {
			s, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: names, Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		if err := open().CreateTables(context.Background()); err != nil {
			t.Fatal(err)
		}
		return backend{handle: func() store.BrokerStates { return open() }, raw: func() string {
			out, err := moto.DynamoDB().Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(names.Idempotency)})
			if err != nil {
				t.Error(err)
				return ""
			}
			return fmt.Sprintf("%#v", out.Items)
		}}
	},
}

// forEachStore runs fn as a subtest per store.
func forEachStore(t *testing.T, fn func(t *testing.T, newStates newStates)) {
	for _, name := range slices.Sorted(maps.Keys(brokerStores)) {
		t.Run(name, func(t *testing.T) { fn(t, brokerStores[name]) })
	}
}

const (
	oauthKey     = "acme/DRIVE"
	clientID     = "runfleet-client"
	clientSecret = "cs_ClientSecretNeverLogged"
)

var start = time.Date(2026, 6, 1, 9, 0, 0, 0, time.UTC)

// fixture is a fake provider, a store and what Brokers over them share:
// every Broker made by broker() is another Fleet process.
type fixture struct {
	t     *testing.T
	clk   *clock.Fake
	fo    *fakeoauth.Server
	dir   string
	store backend
	inner store.BrokerStates // the test's own handle
	held  *heldLeases
	// wrap, when set, wraps each process's handle (a fault to inject).
	wrap   func(store.BrokerStates) store.BrokerStates
	sealer *countingSealer
	logs   *syncbuf.Buffer
	events *events
	errs   []error
	errMu  sync.Mutex
}

func newFixture(t *testing.T, newStates newStates, cfg fakeoauth.Config) *fixture {
	t.Helper()
	clk := clock.NewFake(start)
	cfg.ClientID, cfg.ClientSecret, cfg.Clock = clientID, clientSecret, clk
	f := &fixture{t: t, clk: clk, fo: fakeoauth.Start(t, cfg), dir: t.TempDir(), logs: &syncbuf.Buffer{}, events: &events{}}
	f.store = newStates(t, clk)
	f.inner = f.store.handle()
	f.held = &heldLeases{held: map[string]bool{}}
	sealer, err := broker.OpenSealer("file:"+keyFile(t), broker.SealerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.sealer = &countingSealer{Sealer: sealer, opens: map[string]int{}}
	f.write("client.secret", clientSecret)
	f.reseed()
	t.Cleanup(f.checkNoLeak)
	return f
}

func (f *fixture) write(name, value string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(value+"\n"), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// reseed stores a new family's first refresh token as refreshTokenSecret,
// as an operator would after a consent, and returns it.
func (f *fixture) reseed() string {
	rt := f.fo.Seed()
	f.write("refresh.token", rt)
	return rt
}

func (f *fixture) recipes() map[string]broker.Recipe {
	return map[string]broker.Recipe{oauthKey: {OAuth2: &broker.OAuth2{
		TokenURL: f.fo.URL, ClientID: clientID, ClientSecretSecret: "file:client.secret",
		RefreshTokenSecret: "file:refresh.token", Scopes: []string{"drive.readonly", "email"},
	}}}
}

// states is a Fleet process's handle on the store.
func (f *fixture) states() store.BrokerStates {
	h := f.store.handle()
	if f.wrap != nil {
		h = f.wrap(h)
	}
	return &observed{BrokerStates: h, held: f.held}
}

// broker is one Fleet process's Broker.
func (f *fixture) broker() *broker.Broker {
	f.t.Helper()
	b, err := broker.New(f.recipes(), broker.Deps{
		Secrets: broker.NewSecrets(broker.SecretsConfig{BaseDir: f.dir}),
		Sealer:  f.sealer, States: f.states(), Clock: f.clk, HTTPClient: f.fo.Client,
		Logger:  slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnEvent: f.events.add,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

var req = broker.MintRequest{FleetRunID: "r-1", ProjectID: "acme", Key: "DRIVE"}

// mintAll mints n times at once, spread over brokers, driving the fake
// clock for the waits on another process's refresh, and returns every
// value minted and every error.
func (f *fixture) mintAll(n int, brokers ...*broker.Broker) ([]broker.Minted, []error) {
	f.t.Helper()
	minted := make([]broker.Minted, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			minted[i], errs[i] = brokers[i%len(brokers)].Mint(context.Background(), req)
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	f.drive(done)
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	f.errMu.Lock()
	f.errs = append(f.errs, failed...)
	f.errMu.Unlock()
	return minted, failed
}

// drive moves the clock to each wait's end (a poll of the state) until
// done is closed, but never while a refresher holds a lease: the fake
// clock must not run past a live refresher's lease while it talks to the
// provider (in real time, a lease is a minute and a refresh a second).
func (f *fixture) drive(done <-chan struct{}) {
	f.t.Helper()
	await.Cond(f.t, await.Limit, "the mints to end", func() bool {
		select {
		case <-done:
			return true
		default:
		}
		if f.held.count() == 0 {
			if next, ok := f.clk.Next(); ok && next.Sub(f.clk.Now()) <= 2*time.Second {
				f.clk.Set(next)
			}
		}
		return false
	})
}

func (f *fixture) one(b *broker.Broker) (broker.Minted, error) {
	f.t.Helper()
	m, errs := f.mintAll(1, b)
	if len(errs) > 0 {
		return m[0], errs[0]
	}
	return m[0], nil
}

// checkNoLeak fails the test if a token or the client secret is in a log
// line, an error or the stored state in plain text.
func (f *fixture) checkNoLeak() {
	var texts []string
	texts = append(texts, f.logs.String())
	for _, err := range f.errs {
		texts = append(texts, err.Error(), fmt.Sprintf("%+v %#v", err, err))
	}
	if st, err := f.inner.GetBrokerState(context.Background(), oauthKey); err == nil {
		texts = append(texts, string(st.SealedAccessToken), string(st.SealedRefreshToken), st.Seed, fmt.Sprintf("%#v", st))
	}
	texts = append(texts, f.store.raw())
	for _, text := range texts {
		for _, secret := range []string{fakeoauth.RefreshPrefix, fakeoauth.AccessPrefix, "ClientSecretNeverLogged"} {
			if strings.Contains(text, secret) {
				f.t.Errorf("a value (%s...) in plain text in %q", secret, text)
			}
		}
	}
}

func TestOAuth2OneRefreshPerExpiryAcrossProcesses(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStates newStates) {
		f := newFixture(t, newStates, fakeoauth.Config{ExpiresIn: time.Hour, Scopes: []string{"drive.readonly", "email"}})
		a, b := f.broker(), f.broker()
		for round := 1; round <= 3; round++ {
			minted, errs := f.mintAll(50, a, b)
			if len(errs) > 0 {
				t.Fatalf("round %d: %d mints failed, the first: %v", round, len(errs), errs[0])
			}
			if got := f.fo.Refreshes(); got != round {
				t.Fatalf("round %d: the provider saw %d refreshes in all; want exactly one per expiry", round, got)
			}
			if got := f.fo.InvalidGrants(); got != 0 {
				t.Fatalf("round %d: the provider answered invalid_grant %d times", round, got)
			}
			for _, m := range minted {
				if m.Value != minted[0].Value || !f.fo.Honoured(string(m.Value)) {
					t.Fatalf("round %d: the mints handed out different or dead tokens", round)
				}
				if m.Kind != broker.KindOAuth2 || m.Sealed != nil || !m.ExpiresAt.Equal(minted[0].ExpiresAt) {
					t.Fatalf("round %d: minted %+v", round, m)
				}
			}
			if left := minted[0].ExpiresAt.Sub(f.clk.Now()); left <= 50*time.Minute {
				t.Fatalf("round %d: the token handed out has %s left", round, left)
			}
			// The token's expiry.
			f.clk.Set(minted[0].ExpiresAt)
		}
		if f.fo.LastScope() != "drive.readonly email" {
			t.Fatalf("scope asked: %q", f.fo.LastScope())
		}
		if got := f.events.count(broker.KindOAuth2, broker.EventRefresh); got != 3 {
			t.Fatalf("%d refresh events, want 3", got)
		}
		if got := f.events.count(broker.KindOAuth2, broker.EventMint); got != 150 {
			t.Fatalf("%d mint events, want 150", got)
		}
	})
}

// A refresher in another process is waited for, whatever its pace, and a
// refresher that died (its lease never released) is replaced once its
// lease has passed: never two refreshes at once.
func TestOAuth2WaitsForTheLeaseHolder(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStates newStates) {
		f := newFixture(t, newStates, fakeoauth.Config{})
		a, b := f.broker(), f.broker()

		release := f.fo.Hold()
		first := make(chan error, 1)
		var fromA broker.Minted
		go func() {
			var err error
			fromA, err = a.Mint(context.Background(), req)
			first <- err
		}()
		await.Recv(t, "a's refresh to reach the provider", f.fo.Arrived())
		// b finds the lease taken and waits, polling on the clock; the
		// provider is held, so however far the clock moves short of the
		// lease's end, b must not refresh.
		second := make(chan error, 1)
		var fromB broker.Minted
		go func() {
			var err error
			fromB, err = b.Mint(context.Background(), req)
			second <- err
		}()
		for range 20 {
			await.Recv(t, "b to wait on the clock", f.clk.WaitForTimers(3)) // a's and b's flight limits, b's poll
			if next, _ := f.clk.Next(); next.Sub(f.clk.Now()) <= 2*time.Second {
				f.clk.Set(next)
			}
		}
		release()
		if err := await.Recv(t, "a's mint", first); err != nil {
			t.Fatal(err)
		}
		f.drive(closedWhen(second, t))
		if fromA.Value == "" || fromA.Value != fromB.Value || f.fo.Refreshes() != 1 {
			t.Fatalf("a and b: same token %v, %d refreshes", fromA.Value == fromB.Value, f.fo.Refreshes())
		}

		// A refresher that died holding the lease.
		f.clk.Set(fromA.ExpiresAt)
		if _, err := f.inner.AcquireBrokerLease(context.Background(), oauthKey, "dead-invocation", f.clk.Now().Add(broker.LeaseDuration)); err != nil {
			t.Fatal(err)
		}
		died := f.clk.Now()
		m, err := f.one(b)
		if err != nil {
			t.Fatal(err)
		}
		if f.clk.Now().Before(died.Add(broker.LeaseDuration)) {
			t.Fatalf("b refreshed %s after the lease was taken, before it ended", f.clk.Now().Sub(died))
		}
		if f.fo.Refreshes() != 2 || f.fo.InvalidGrants() != 0 || !f.fo.Honoured(string(m.Value)) {
			t.Fatalf("after a dead refresher: %d refreshes, %d invalid_grant", f.fo.Refreshes(), f.fo.InvalidGrants())
		}
	})
}

// closedWhen returns a channel closed once ch delivers, failing the test if
// what it delivers is an error.
func closedWhen(ch <-chan error, t *testing.T) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		if err := <-ch; err != nil {
			t.Error(err)
		}
		close(done)
	}()
	return done
}

// A warm process opens each generation once: no KMS call per dispatch.
func TestOAuth2OpensEachGenerationOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStates newStates) {
		f := newFixture(t, newStates, fakeoauth.Config{})
		a, b := f.broker(), f.broker()
		for range 10 {
			if _, err := f.one(a); err != nil {
				t.Fatal(err)
			}
			if _, err := f.one(b); err != nil {
				t.Fatal(err)
			}
		}
		// a refreshed (and keeps what it sealed); b opened it, and the
		// seed fingerprint's key, once.
		if got := f.sealer.opened("#access"); got != 1 {
			t.Fatalf("%d opens of the access token for 20 mints in two processes; want 1", got)
		}
		if got := f.sealer.opened("#seed"); got != 1 {
			t.Fatalf("%d opens of the seed fingerprint for 20 mints in two processes; want 1", got)
		}
	})
}

// The refresh token stored is the rotated one; an operator who stores a
// new seed restarts the family from it; a dead family is refused with the
// provider's status and a detail that says what to do, and is not asked
// again on every dispatch.
func TestOAuth2SeedsAndRefusals(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStates newStates) {
		f := newFixture(t, newStates, fakeoauth.Config{ExpiresIn: time.Hour})
		seed1, err := os.ReadFile(filepath.Join(f.dir, "refresh.token"))
		if err != nil {
			t.Fatal(err)
		}
		a := f.broker()
		m1, err := f.one(a)
		if err != nil {
			t.Fatal(err)
		}
		f.clk.Set(m1.ExpiresAt.Add(-broker.RefreshMargin - time.Second))
		if m, err := f.one(a); err != nil || m.Value != m1.Value {
			t.Fatalf("with more than the margin left: %v, same token %v", err, m.Value == m1.Value)
		}
		f.clk.Set(m1.ExpiresAt.Add(-broker.RefreshMargin))
		m2, err := f.one(a)
		if err != nil || m2.Value == m1.Value || f.fo.Refreshes() != 2 || f.fo.InvalidGrants() != 0 {
			t.Fatalf("at the margin: %v, new token %v, %d refreshes, %d invalid_grant", err, m2.Value != m1.Value, f.fo.Refreshes(), f.fo.InvalidGrants())
		}

		// A re-seeded secret restarts the family at once, though the
		// stored one still works and its access token is fresh.
		seed2 := f.reseed()
		m3, err := f.one(a)
		if err != nil || !f.fo.Retired(seed2) || m3.Value == m2.Value || f.fo.InvalidGrants() != 0 {
			t.Fatalf("after a re-seed: %v, seed used %v, new token %v, %d invalid_grant", err, f.fo.Retired(seed2), m3.Value != m2.Value, f.fo.InvalidGrants())
		}
		if m, err := f.one(f.broker()); err != nil || m.Value != m3.Value || f.fo.Refreshes() != 3 {
			t.Fatalf("another process after the restart: %v, same token %v, %d refreshes", err, m.Value == m3.Value, f.fo.Refreshes())
		}

		if !f.fo.Retired(strings.TrimSpace(string(seed1))) {
			t.Fatal("the first seed was never used")
		}

		// The second family ends when a copy of its seed is used again
		// by someone else: the provider revokes it, Fleet learns at its
		// next refresh.
		f.clk.Set(m3.ExpiresAt)
		killFamily(t, f, seed2)
		_, err = f.one(a)
		var e *broker.Error
		if !errors.As(err, &e) || e.ProviderStatus != 400 || e.Kind != broker.KindOAuth2 || e.ProjectID != "acme" || e.Key != "DRIVE" ||
			!strings.Contains(e.Detail, "invalid_grant") || !strings.Contains(e.Detail, "file:refresh.token") {
			t.Fatalf("a dead family: %#v", err)
		}
		asked := f.fo.InvalidGrants()
		if _, err := f.one(f.broker()); err == nil {
			t.Fatal("another process minted from a dead family")
		}
		for range 5 {
			if _, err := f.one(a); err == nil {
				t.Fatal("a dead family minted")
			}
		}
		if got := f.fo.InvalidGrants() - asked; got != 1 {
			t.Fatalf("the provider was asked %d more times for a dead family; want once by the other process only", got)
		}
		if f.events.count(broker.KindOAuth2, broker.EventFailure) != 7 {
			t.Fatalf("%d failure events, want 7", f.events.count(broker.KindOAuth2, broker.EventFailure))
		}

		// The operator seeds again: minting works again, at the latest
		// once the refusal kept in memory has passed.
		f.reseed()
		f.clk.Advance(time.Minute)
		if m, err := f.one(a); err != nil || !f.fo.Honoured(string(m.Value)) {
			t.Fatalf("after a new seed: %v", err)
		}
	})
}

// killFamily presents the family's retired seed again, as a second holder
// of a copy would: the provider revokes the family.
func killFamily(t *testing.T, f *fixture, seed string) {
	t.Helper()
	if !f.fo.Retired(seed) {
		t.Fatal("the seed was not used yet")
	}
	before := f.fo.InvalidGrants()
	b, err := broker.New(map[string]broker.Recipe{"other/THIEF": {OAuth2: &broker.OAuth2{
		TokenURL: f.fo.URL, ClientID: clientID, ClientSecretSecret: "file:client.secret", RefreshTokenSecret: "file:thief.token",
	}}}, broker.Deps{
		Secrets: broker.NewSecrets(broker.SecretsConfig{BaseDir: f.dir}), Sealer: f.sealer,
		States: newMemStates(f.clk), Clock: f.clk, HTTPClient: f.fo.Client,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.write("thief.token", seed)
	if _, err := b.Mint(context.Background(), broker.MintRequest{ProjectID: "other", Key: "THIEF"}); err == nil || f.fo.InvalidGrants() != before+1 {
		t.Fatalf("presenting a retired seed: %v", err)
	}
}

func TestOAuth2ProviderRefusals(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStates newStates) {
		f := newFixture(t, newStates, fakeoauth.Config{NoRotation: true, ExpiresIn: 12 * time.Minute})
		a := f.broker()
		f.write("client.secret", "not-the-secret")
		_, err := f.one(a)
		var e *broker.Error
		if !errors.As(err, &e) || e.ProviderStatus != 401 || !strings.Contains(e.Detail, "invalid_client") {
			t.Fatalf("a wrong client secret: %#v", err)
		}
		if f.fo.BadClients() != 1 {
			t.Fatalf("%d bad client calls", f.fo.BadClients())
		}
		f.write("client.secret", clientSecret)
		f.clk.Advance(time.Minute)

		// A provider that does not rotate: its refresh token is kept.
		m1, err := f.one(a)
		if err != nil {
			t.Fatal(err)
		}
		// A 12-minute token is refreshed at half its life, not at
		// RefreshMargin (which would refresh it on every dispatch).
		f.clk.Set(m1.ExpiresAt.Add(-6*time.Minute - time.Second))
		if m, _ := f.one(a); m.Value != m1.Value {
			t.Fatal("a token with more than half its life left was refreshed")
		}
		f.clk.Set(m1.ExpiresAt.Add(-6 * time.Minute))
		m2, err := f.one(a)
		if err != nil || m2.Value == m1.Value || f.fo.Refreshes() != 2 {
			t.Fatalf("refreshing with a kept refresh token: %v, %d refreshes", err, f.fo.Refreshes())
		}
	})
}

func TestBrokerKindsAndRefusals(t *testing.T) {
	f := newFixture(t, brokerStores["memory"], fakeoauth.Config{})
	b := f.broker()
	if kind, ok := b.Kind("acme", "DRIVE"); !ok || kind != broker.KindOAuth2 {
		t.Fatalf("Kind = %q, %v", kind, ok)
	}
	if _, ok := b.Kind("acme", "OTHER"); ok {
		t.Fatal("Kind of a key without a recipe")
	}
	var e *broker.Error
	if _, err := b.Mint(context.Background(), broker.MintRequest{ProjectID: "acme", Key: "OTHER"}); !errors.As(err, &e) {
		t.Fatalf("minting a key without a recipe: %v", err)
	}
	if err := b.Revoke(context.Background(), req, []byte("x")); !errors.As(err, &e) || e.Kind != broker.KindOAuth2 {
		t.Fatalf("revoking an oauth2 value: %v", err)
	}
	for name, deps := range map[string]broker.Deps{
		"no sealer": {Secrets: broker.NewSecrets(broker.SecretsConfig{}), States: f.inner},
		"no store":  {Secrets: broker.NewSecrets(broker.SecretsConfig{}), Sealer: f.sealer},
		"no reader": {Sealer: f.sealer, States: f.inner},
	} {
		if _, err := broker.New(f.recipes(), deps); err == nil {
			t.Errorf("New with %s accepted an oauth2 recipe", name)
		}
	}
	if none, err := broker.New(nil, broker.Deps{}); err != nil {
		t.Fatalf("New with no recipe: %v", err)
	} else if _, ok := none.Kind("acme", "DRIVE"); ok {
		t.Fatal("a Broker without recipes knows a key")
	}
}

// heldLeases knows whether a refresher holds a lease, across every
// process's handle: the test's clock waits for it.
type heldLeases struct {
	mu   sync.Mutex
	held map[string]bool
}

func (h *heldLeases) set(holder string, held bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if held {
		h.held[holder] = true
	} else {
		delete(h.held, holder)
	}
}

func (h *heldLeases) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

// observed is a process's store handle, recording its leases in held.
type observed struct {
	store.BrokerStates
	held *heldLeases
}

func (o *observed) AcquireBrokerLease(ctx context.Context, id, holder string, until time.Time) (store.BrokerState, error) {
	st, err := o.BrokerStates.AcquireBrokerLease(ctx, id, holder, until)
	if err == nil {
		o.held.set(holder, true)
	}
	return st, err
}

func (o *observed) CommitBrokerState(ctx context.Context, s store.BrokerState) (store.BrokerState, error) {
	st, err := o.BrokerStates.CommitBrokerState(ctx, s)
	if err == nil {
		o.held.set(s.LeaseHolder, false)
	}
	return st, err
}

func (o *observed) ReleaseBrokerLease(ctx context.Context, id, holder string) error {
	err := o.BrokerStates.ReleaseBrokerLease(ctx, id, holder)
	o.held.set(holder, false)
	return err
}

// countingSealer counts opens by binding suffix.
type countingSealer struct {
	broker.Sealer
	mu    sync.Mutex
	opens map[string]int
}

func (c *countingSealer) Open(ctx context.Context, sealed []byte, bindTo string) ([]byte, error) {
	c.mu.Lock()
	if i := strings.LastIndex(bindTo, "#"); i >= 0 {
		c.opens[bindTo[i:]]++
	}
	c.mu.Unlock()
	return c.Sealer.Open(ctx, sealed, bindTo)
}

func (c *countingSealer) opened(suffix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opens[suffix]
}

// events counts OnEvent's reports.
type events struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *events) add(kind, event string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[kind+" "+event]++
}

func (e *events) count(kind, event string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[kind+" "+event]
}

// memStates keeps store.BrokerStates's contract in memory, the simplest
// way: the refresher's behaviour on it is its own, not a store's.
type memStates struct {
	clk    clock.Clock
	mu     sync.Mutex
	states map[string]store.BrokerState
}

func newMemStates(clk clock.Clock) *memStates {
	return &memStates{clk: clk, states: map[string]store.BrokerState{}}
}

func (m *memStates) GetBrokerState(_ context.Context, id string) (store.BrokerState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, ok := m.states[id]
	if !ok {
		return store.BrokerState{}, fmt.Errorf("broker state %s: %w", id, store.ErrNotFound)
	}
	return clone(st), nil
}

func (m *memStates) AcquireBrokerLease(_ context.Context, id, holder string, until time.Time) (store.BrokerState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clk.Now()
	st, ok := m.states[id]
	if !ok {
		st = store.BrokerState{ID: id, UpdatedAt: now}
	}
	if st.LeaseHolder != "" && st.LeaseHolder != holder && now.Before(st.LeaseExpiresAt) {
		return clone(st), fmt.Errorf("broker lease %s: %w", id, store.ErrConflict)
	}
	st.LeaseHolder, st.LeaseExpiresAt = holder, until
	m.states[id] = st
	return clone(st), nil
}

func (m *memStates) CommitBrokerState(_ context.Context, s store.BrokerState) (store.BrokerState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, ok := m.states[s.ID]
	switch {
	case !ok:
		return store.BrokerState{}, fmt.Errorf("broker state %s: %w", s.ID, store.ErrNotFound)
	case st.Generation != s.Generation:
		return store.BrokerState{}, fmt.Errorf("broker state %s: %w", s.ID, store.ErrConflict)
	}
	st.Generation++
	st.SealedRefreshToken, st.SealedAccessToken = s.SealedRefreshToken, s.SealedAccessToken
	st.AccessExpiresAt, st.Seed, st.UpdatedAt = s.AccessExpiresAt, s.Seed, m.clk.Now()
	if s.LeaseHolder != "" && st.LeaseHolder == s.LeaseHolder {
		st.LeaseHolder, st.LeaseExpiresAt = "", time.Time{}
	}
	m.states[s.ID] = st
	return clone(st), nil
}

func (m *memStates) ReleaseBrokerLease(_ context.Context, id, holder string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st, ok := m.states[id]; ok && st.LeaseHolder == holder {
		st.LeaseHolder, st.LeaseExpiresAt = "", time.Time{}
		m.states[id] = st
	}
	return nil
}

func clone(st store.BrokerState) store.BrokerState {
	st.SealedAccessToken = slices.Clone(st.SealedAccessToken)
	st.SealedRefreshToken = slices.Clone(st.SealedRefreshToken)
	return st
}

// A caller that gives up while the token endpoint is answering still
// waits until the answer is stored: in Lambda a handler that returned
// freezes the refresh, and a rotated refresh token never stored ends the
// family. The next mint finds the refreshed token.
func TestOAuth2CallerWaitsOutTheExchange(t *testing.T) {
	f := newFixture(t, brokerStores["memory"], fakeoauth.Config{})
	a := f.broker()
	release := f.fo.Hold()
	ctx, cancel := context.WithCancel(context.Background())
	generation := make(chan int64, 1)
	go func() {
		_, err := a.Mint(ctx, req)
		if err == nil {
			t.Error("a cancelled mint succeeded")
		}
		st, _ := f.inner.GetBrokerState(context.Background(), oauthKey)
		generation <- st.Generation
	}()
	await.Recv(t, "the refresh to reach the provider", f.fo.Arrived())
	cancel()
	release()
	if g := await.Recv(t, "the cancelled mint to return", generation); g != 1 {
		t.Fatalf("the cancelled mint returned with generation %d stored; want the refresh stored first", g)
	}
	if _, err := f.one(a); err != nil || f.fo.Refreshes() != 1 {
		t.Fatalf("the next mint: %v, %d refreshes", err, f.fo.Refreshes())
	}
}

// A commit of the new tokens that fails without an answer is tried
// again: the rotated refresh token exists nowhere else.
func TestOAuth2RetriesACommitThatFailed(t *testing.T) {
	forEachStore(t, func(t *testing.T, newStates newStates) {
		f := newFixture(t, newStates, fakeoauth.Config{})
		var failures atomic.Int32
		failures.Store(2)
		f.wrap = func(s store.BrokerStates) store.BrokerStates {
			return &failingCommits{BrokerStates: s, left: &failures}
		}
		a := f.broker()
		m, err := f.one(a)
		if err != nil || !f.fo.Honoured(string(m.Value)) || failures.Load() != 0 {
			t.Fatalf("after two failed commits: %v, %d failures left", err, failures.Load())
		}
		f.clk.Set(m.ExpiresAt)
		if _, err := f.one(f.broker()); err != nil || f.fo.Refreshes() != 2 || f.fo.InvalidGrants() != 0 {
			t.Fatalf("the next refresh, from the stored token: %v, %d refreshes, %d invalid_grant", err, f.fo.Refreshes(), f.fo.InvalidGrants())
		}
	})
}

// failingCommits fails commits, without writing, while left is positive,
// as a throttled or unreachable store does.
type failingCommits struct {
	store.BrokerStates
	left *atomic.Int32
}

func (s *failingCommits) CommitBrokerState(ctx context.Context, st store.BrokerState) (store.BrokerState, error) {
	if s.left.Add(-1) >= 0 {
		return store.BrokerState{}, errors.New("ThrottlingException: rate exceeded")
	}
	s.left.Store(0)
	return s.BrokerStates.CommitBrokerState(ctx, st)
}
