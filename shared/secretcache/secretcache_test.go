package secretcache_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/secretcache"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

var moto *motoserver.Server

func TestMain(m *testing.M) {
	os.Exit(motoserver.Run(m, func(s *motoserver.Server) { moto = s }))
}

// counted is the real client, counting the calls that reach moto_server.
type counted struct {
	*secretsmanager.Client
	calls atomic.Int64
}

func (c *counted) GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, opts ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	c.calls.Add(1)
	return c.Client.GetSecretValue(ctx, in, opts...)
}

type fixture struct {
	t      *testing.T
	sm     *counted
	clk    *clock.Fake
	cache  *secretcache.Cache[string]
	prefix string
}

func newFixture(t *testing.T, ttl time.Duration) *fixture {
	sm := &counted{Client: secretsmanager.NewFromConfig(moto.AWSConfig())}
	clk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	cache := secretcache.New(secretcache.Config{Client: sm, TTL: ttl, Clock: clk}, func(s string) string { return s })
	return &fixture{t: t, sm: sm, clk: clk, cache: cache, prefix: motoserver.Unique("secretcache-") + "/"}
}

func (f *fixture) create(name, value string) {
	f.t.Helper()
	if _, err := f.sm.Client.CreateSecret(context.Background(), &secretsmanager.CreateSecretInput{
		Name: aws.String(f.prefix + name), SecretString: aws.String(value),
	}); err != nil {
		f.t.Fatal(err)
	}
}

// expect reads name and checks the answer and how many calls reached
// Secrets Manager so far.
func (f *fixture) expect(name, want string, wantErr error, wantCalls int64) {
	f.t.Helper()
	got, err := f.cache.Get(context.Background(), f.prefix+name)
	if got != want || !errors.Is(err, wantErr) || (err == nil) != (wantErr == nil) {
		f.t.Fatalf("Get(%s) = %q, %v; want %q, %v", name, got, err, want, wantErr)
	}
	if n := f.sm.calls.Load(); n != wantCalls {
		f.t.Fatalf("after Get(%s): %d calls to Secrets Manager, want %d", name, n, wantCalls)
	}
}

// A value is kept for the TTL: a rotation shows once the TTL has passed,
// not before, and a read within it costs no call.
func TestAValueIsKeptForTheTTL(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.create("k", "value-one")
	f.expect("k", "value-one", nil, 1)
	if _, err := f.sm.Client.PutSecretValue(context.Background(), &secretsmanager.PutSecretValueInput{
		SecretId: aws.String(f.prefix + "k"), SecretString: aws.String("value-two"),
	}); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(59 * time.Second)
	f.expect("k", "value-one", nil, 1)
	f.clk.Advance(time.Second)
	f.expect("k", "value-two", nil, 2)
}

// A miss is kept like a value: reads of an absent name within the TTL cost
// no call, and a secret created after the miss is found once the miss is
// TTL old, not later.
func TestAMissIsKeptForTheTTLAndASecretCreatedAfterItIsSeenThen(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.expect("late", "", secretcache.ErrNotFound, 1)
	for range 100 {
		f.expect("late", "", secretcache.ErrNotFound, 1)
	}
	f.create("late", "created-after-the-miss")
	f.clk.Advance(59 * time.Second)
	f.expect("late", "", secretcache.ErrNotFound, 1)
	f.clk.Advance(time.Second)
	f.expect("late", "created-after-the-miss", nil, 2)

	// A binary secret has no string: an answer too, kept as long.
	if _, err := f.sm.Client.CreateSecret(context.Background(), &secretsmanager.CreateSecretInput{
		Name: aws.String(f.prefix + "binary"), SecretBinary: []byte{1, 2, 3},
	}); err != nil {
		t.Fatal(err)
	}
	f.expect("binary", "", secretcache.ErrNoString, 3)
	f.expect("binary", "", secretcache.ErrNoString, 3)
}

// A flood of concurrent reads of one name, absent or present, costs one
// call: every reader waits for the one fetch under way.
func TestConcurrentReadsShareOneCall(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.create("k", "value")
	for i, name := range []string{"absent", "k"} {
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		for range 50 {
			wg.Go(func() {
				v, err := f.cache.Get(context.Background(), f.prefix+name)
				if name == "k" && (err != nil || v != "value") {
					errs <- err
				}
				if name == "absent" && !errors.Is(err, secretcache.ErrNotFound) {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("a concurrent read of %s: %v", name, err)
		}
		if n := f.sm.calls.Load(); n != int64(i+1) {
			t.Fatalf("50 concurrent reads of %s made %d calls in all, want %d", name, n, i+1)
		}
	}
}

// A failure that is not an answer is not kept: the next read asks again.
// No error names a value.
func TestAFailureIsNotKept(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.create("k", "value-never-in-an-error")
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.cache.Get(gone, f.prefix+"k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a read with a cancelled context: %v", err)
	}
	f.expect("k", "value-never-in-an-error", nil, f.sm.calls.Load()+1)

	if _, err := f.sm.Client.DeleteSecret(context.Background(), &secretsmanager.DeleteSecretInput{
		SecretId: aws.String(f.prefix + "k"), ForceDeleteWithoutRecovery: aws.Bool(true),
	}); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(time.Minute)
	_, err := f.cache.Get(context.Background(), f.prefix+"k")
	if !errors.Is(err, secretcache.ErrNotFound) || strings.Contains(err.Error(), "value-never") || !strings.Contains(err.Error(), f.prefix+"k") {
		t.Fatalf("after the deletion: %v; want ErrNotFound naming the id and no value", err)
	}

	none := secretcache.New(secretcache.Config{TTL: time.Minute}, func(s string) string { return s })
	if _, err := none.Get(context.Background(), "x"); err == nil || errors.Is(err, secretcache.ErrNotFound) {
		t.Fatalf("without a client: %v", err)
	}
}
