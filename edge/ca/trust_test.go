package ca_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// waitLimit bounds every wait for a delivery goroutine in real time; the
// tests never sleep, they wait on a channel with this as the deadline.
const waitLimit = 10 * time.Second

// delivery is one listener call as a test sees it.
type delivery struct {
	ctx    context.Context
	bundle []byte
}

// recv waits for the next value on ch.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// none checks that nothing arrives on ch once the CA has had every chance
// to deliver: after a Close (quiescent), or after fn's effects settled.
func none[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("unexpected %s: %v", what, v)
	default:
	}
}

// shortConfig rotates in hours: successor at 6h, switch at 9h of a 10h CA.
func shortConfig(t testing.TB, dir string, clk clock.Clock) ca.Config {
	cfg := testConfig(t, dir, clk)
	cfg.Lifetime, cfg.SuccessorWindow, cfg.SwitchBefore, cfg.LeafLifetime = 10*time.Hour, 4*time.Hour, time.Hour, 2*time.Hour
	cfg.ReviewInterval = 30 * time.Minute
	return cfg
}

func TestWatchTrustDeliversAtSubscriptionAndOnEveryChange(t *testing.T) {
	clk := clock.NewFake(epoch)
	a := mustOpen(t, shortConfig(t, t.TempDir(), clk))
	got := make(chan []byte, 10)
	unsubscribe, err := a.WatchTrust(func(_ context.Context, bundle []byte) error {
		got <- bundle
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unsubscribe()
	first := recv(t, got, "the delivery at subscription")
	if !bytes.Equal(first, a.Bundle()) {
		t.Fatal("the delivery at subscription is not the current bundle")
	}

	clk.Advance(6 * time.Hour) // the successor window opens
	a.Bundle()                 // a review when due, whether or not the timer's goroutine ran yet
	second := recv(t, got, "the bundle with the successor")
	if bytes.Count(second, []byte("BEGIN CERTIFICATE")) != 2 || !bytes.HasPrefix(second, first) {
		t.Fatalf("after the successor window opened the delivery is not signer+successor:\n%s", second)
	}
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	clk.Advance(3 * time.Hour) // the switch: the old signer leaves the bundle
	a.Bundle()
	third := recv(t, got, "the bundle after the switch")
	if !bytes.Equal(third, second[len(first):]) {
		t.Fatalf("after the switch the delivery is not the successor alone:\n%s", third)
	}
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	clk.Advance(30 * time.Minute) // a review with no change delivers nothing
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	a.Bundle()
	unsubscribe()
	none(t, got, "delivery of an unchanged bundle")
}

func TestRequestTrustDeliveryRedeliversAnAcknowledgedBundle(t *testing.T) {
	a := mustOpen(t, shortConfig(t, t.TempDir(), clock.NewFake(epoch)))
	got := make(chan []byte, 10)
	release := make(chan struct{})
	var calls atomic.Int32
	unsubscribe, err := a.WatchTrust(func(_ context.Context, bundle []byte) error {
		if calls.Add(1) == 1 {
			<-release // the first delivery is still under way when the request comes
		}
		got <- bundle
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unsubscribe()
	a.RequestTrustDelivery()
	close(release)
	recv(t, got, "the delivery at subscription")
	recv(t, got, "the redelivery requested while the first was under way")
	a.RequestTrustDelivery()
	if b := recv(t, got, "the redelivery of an acknowledged bundle"); !bytes.Equal(b, a.Bundle()) {
		t.Fatal("redelivered a bundle other than the current one")
	}
	if err := unsubscribe(); err != nil {
		t.Fatal(err)
	}
	none(t, got, "a delivery after unsubscribe")
}

func TestFailedDeliveryIsRetriedAtTheNextReview(t *testing.T) {
	clk := clock.NewFake(epoch)
	a := mustOpen(t, shortConfig(t, t.TempDir(), clk))
	errPanicked := errors.New("about to panic")
	attempts := make(chan error, 10)
	var calls atomic.Int32
	unsubscribe, err := a.WatchTrust(func(_ context.Context, bundle []byte) error {
		var err error
		switch calls.Add(1) {
		case 1:
			err = errors.New("a task's trust file could not be written")
		case 2:
			attempts <- errPanicked
			panic("listener bug")
		}
		attempts <- err
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unsubscribe()
	if err := recv(t, attempts, "the first attempt"); err == nil {
		t.Fatal("the first attempt did not fail as set up")
	}
	none(t, attempts, "a retry before the next review")
	// Each retry waits for a review; the test moves the clock to the next
	// one only once the retry has begun (deliveries are asynchronous).
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	clk.Advance(30 * time.Minute)
	if err := recv(t, attempts, "the retry at the first review"); err != errPanicked {
		t.Fatalf("the first retry: %v, want the panicking attempt", err)
	}
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	clk.Advance(30 * time.Minute)
	if err := recv(t, attempts, "the retry at the next review"); err != nil {
		t.Fatalf("retry after the panic: %v", err)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d listener calls, want 3 (fail, panic, success)", n)
	}
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	clk.Advance(30 * time.Minute) // acknowledged: nothing more
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	unsubscribe()
	none(t, attempts, "a delivery after success")
}

func TestUnsubscribeAbortsAndWaitsForTheDeliveryUnderWay(t *testing.T) {
	a := mustOpen(t, shortConfig(t, t.TempDir(), clock.NewFake(epoch)))
	started := make(chan context.Context, 1)
	var ended atomic.Bool
	unsubscribe, err := a.WatchTrust(func(ctx context.Context, _ []byte) error {
		started <- ctx
		<-ctx.Done()
		ended.Store(true)
		return ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, started, "the delivery")
	if err := unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if !ended.Load() {
		t.Fatal("unsubscribe returned before the delivery under way ended")
	}
	if err := unsubscribe(); err != nil {
		t.Fatalf("a second unsubscribe: %v", err)
	}
	a.RequestTrustDelivery()
	none(t, started, "a delivery after unsubscribe")
}

func TestCloseIsQuiescentAndDeliversNothingAfter(t *testing.T) {
	clk := clock.NewFake(epoch)
	dir := t.TempDir()
	a, err := ca.Open(context.Background(), shortConfig(t, dir, clk))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan context.Context, 10)
	var ended atomic.Bool
	if _, err := a.WatchTrust(func(ctx context.Context, _ []byte) error {
		started <- ctx
		<-ctx.Done()
		ended.Store(true)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx := recv(t, started, "the delivery")
	before := dirFiles(t, dir)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !ended.Load() {
		t.Fatal("Close returned before the delivery under way ended")
	}
	if !errors.Is(context.Cause(ctx), ca.ErrClosed) {
		t.Errorf("the delivery's cause is %v, want ErrClosed", context.Cause(ctx))
	}
	a.RequestTrustDelivery()
	clk.Advance(7 * time.Hour) // a successor would be due: nothing is minted
	a.Bundle()
	none(t, started, "a delivery after Close")
	after := dirFiles(t, dir)
	for path, b := range after {
		if !bytes.Equal(before[path], b) && path != dir+"/ca/lock" {
			t.Errorf("%s was written after Close", path)
		}
	}
}

func TestFinishedDeliveryContextIsNeverCancelled(t *testing.T) {
	a := mustOpen(t, shortConfig(t, t.TempDir(), clock.NewFake(epoch)))
	got := make(chan context.Context, 2)
	unsubscribe, err := a.WatchTrust(func(ctx context.Context, _ []byte) error {
		got <- ctx
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := recv(t, got, "the delivery")
	// Deliveries to one listener never overlap: once the next has begun,
	// the first has ended.
	a.RequestTrustDelivery()
	recv(t, got, "the redelivery")
	if err := unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatalf("a finished delivery's context was cancelled (%v)", context.Cause(ctx))
	}
}

func TestUnsubscribeAndCloseFromInsideAListenerAreRefused(t *testing.T) {
	a := mustOpen(t, shortConfig(t, t.TempDir(), clock.NewFake(epoch)))
	other := mustOpen(t, shortConfig(t, t.TempDir(), clock.NewFake(epoch)))
	type result struct{ unsubscribe, close, closeOther error }
	results := make(chan result, 10)
	var unsubscribe func() error
	var mu sync.Mutex
	var err error
	mu.Lock()
	unsubscribe, err = a.WatchTrust(func(context.Context, []byte) error {
		mu.Lock()
		defer mu.Unlock()
		results <- result{unsubscribe: unsubscribe(), close: a.Close(), closeOther: other.Close()}
		return nil
	})
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	r := recv(t, results, "the listener's calls")
	for name, err := range map[string]error{"unsubscribe": r.unsubscribe, "Close": r.close, "another CA's Close": r.closeOther} {
		if !errors.Is(err, ca.ErrInsideTrustListener) {
			t.Errorf("%s from inside a listener: %v, want ErrInsideTrustListener", name, err)
		}
	}
	// Refused calls change nothing: the subscription and both CAs still work.
	a.RequestTrustDelivery()
	recv(t, results, "a redelivery after the refused calls")
	if _, err := leafFor(other, proxiedName); err != nil {
		t.Errorf("the other CA was closed by the refused call: %v", err)
	}
	if err := unsubscribe(); err != nil {
		t.Errorf("unsubscribe from outside: %v", err)
	}
}

func TestDeliveriesUnderRace(t *testing.T) {
	clk := clock.NewFake(epoch)
	a := mustOpen(t, shortConfig(t, t.TempDir(), clk))
	var wg sync.WaitGroup
	var delivered atomic.Int64
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unsubscribe, err := a.WatchTrust(func(ctx context.Context, bundle []byte) error {
				delivered.Add(1)
				if i%3 == 0 {
					return errors.New("flaky")
				}
				return nil
			})
			if err != nil {
				t.Error(err)
				return
			}
			for range 20 {
				a.RequestTrustDelivery()
				if _, err := leafFor(a, proxiedName); err != nil {
					t.Error(err)
				}
			}
			if err := unsubscribe(); err != nil {
				t.Error(err)
			}
		}()
	}
	for range 20 {
		clk.Advance(30 * time.Minute)
	}
	await.Group(t, "the concurrent deliveries", &wg)
	if delivered.Load() < 8 {
		t.Fatalf("%d deliveries to 8 listeners", delivered.Load())
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFailedRedeliveryIsRetriedAtTheNextReview(t *testing.T) {
	clk := clock.NewFake(epoch)
	a := mustOpen(t, shortConfig(t, t.TempDir(), clk))
	attempts := make(chan error, 10)
	var calls atomic.Int32
	unsubscribe, err := a.WatchTrust(func(context.Context, []byte) error {
		var err error
		if calls.Add(1) == 2 {
			err = errors.New("a task was still starting")
		}
		attempts <- err
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unsubscribe()
	if err := recv(t, attempts, "the delivery at subscription"); err != nil {
		t.Fatal(err)
	}
	a.RequestTrustDelivery()
	if err := recv(t, attempts, "the requested redelivery"); err == nil {
		t.Fatal("the redelivery did not fail as set up")
	}
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	clk.Advance(30 * time.Minute)
	if err := recv(t, attempts, "the retry of the failed redelivery"); err != nil {
		t.Fatalf("retry: %v", err)
	}
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	clk.Advance(30 * time.Minute)
	await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
	if err := unsubscribe(); err != nil {
		t.Fatal(err)
	}
	none(t, attempts, "a delivery after the retry succeeded")
}

func TestIdleCAMintsAndDeliversItsSuccessorOnTheReviewTimer(t *testing.T) {
	clk := clock.NewFake(epoch)
	a := mustOpen(t, shortConfig(t, t.TempDir(), clk)) // successor at 6h, reviewed every 30m
	got := make(chan []byte, 10)
	unsubscribe, err := a.WatchTrust(func(_ context.Context, bundle []byte) error {
		got <- bundle
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unsubscribe()
	recv(t, got, "the delivery at subscription")
	// No handshake, no Bundle call: only the timer reviews. Each step waits
	// until the timer is armed again, so every review runs at its deadline.
	for clk.Now().Before(epoch.Add(6 * time.Hour)) {
		await.Recv(t, "the trust delivery to arm its timer", clk.WaitForTimers(1))
		clk.Advance(30 * time.Minute)
	}
	b := recv(t, got, "the successor, delivered by the review timer")
	if bytes.Count(b, []byte("BEGIN CERTIFICATE")) != 2 {
		t.Fatalf("the timer's delivery is not signer+successor:\n%s", b)
	}
	if st := a.Status(); st.Successor == nil || !st.Successor.NotBefore.Before(epoch.Add(6*time.Hour)) {
		t.Fatalf("the successor was not minted when the window opened: %+v", st.Successor)
	}
}
