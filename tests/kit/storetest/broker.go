package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// brokerStatesContract is store.BrokerStates' contract.
var brokerStatesContract = []contractCase{
	roleCase("BrokerStates/NotFoundBeforeAnything", testBrokerNotFound),
	roleCase("BrokerStates/FirstAcquireCreatesGenerationZero", testBrokerFirstAcquire),
	roleCase("BrokerStates/LeaseExcludesOthersUntilItLapses", testBrokerLeaseExcludes),
	roleCase("BrokerStates/CommitBumpsGenerationAndReleases", testBrokerCommit),
	roleCase("BrokerStates/StaleCommitChangesNothing", testBrokerStaleCommit),
	roleCase("BrokerStates/CommitKeepsAnotherHoldersLease", testBrokerCommitKeepsOthersLease),
	roleCase("BrokerStates/ReleaseOnlyByTheHolder", testBrokerRelease),
	roleCase("BrokerStates/ConcurrentAcquiresOneWins", testBrokerConcurrentAcquires),
}

// sealed stands for a token the broker sealed: arbitrary bytes, zeros and
// high bytes included, which a store must keep byte for byte.
func sealed(tag byte) []byte {
	b := make([]byte, 64)
	for i := range b {
		b[i] = byte(i*7) ^ tag
	}
	b[0], b[1], b[len(b)-1] = 0, 0xff, tag
	return b
}

func brokerState(t *testing.T, s store.BrokerStates, id string) store.BrokerState {
	t.Helper()
	st, err := s.GetBrokerState(bg, id)
	noErr(t, "GetBrokerState "+id, err)
	return st
}

func testBrokerNotFound(t *testing.T, s store.BrokerStates, clk *clock.Fake) {
	_, err := s.GetBrokerState(bg, "acme/GOOGLE")
	wantErr(t, "GetBrokerState before anything", err, store.ErrNotFound)
	_, err = s.CommitBrokerState(bg, store.BrokerState{ID: "acme/GOOGLE", SealedRefreshToken: sealed(1), LeaseHolder: "a"})
	wantErr(t, "CommitBrokerState before anything", err, store.ErrNotFound)
	noErr(t, "ReleaseBrokerLease before anything", s.ReleaseBrokerLease(bg, "acme/GOOGLE", "a"))
	_, err = s.GetBrokerState(bg, "acme/GOOGLE")
	wantErr(t, "GetBrokerState after a commit and a release of nothing", err, store.ErrNotFound)
}

func testBrokerFirstAcquire(t *testing.T, s store.BrokerStates, clk *clock.Fake) {
	now := clk.Now()
	got, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "a", now.Add(time.Minute))
	noErr(t, "AcquireBrokerLease", err)
	want := store.BrokerState{ID: "acme/GOOGLE", LeaseHolder: "a", LeaseExpiresAt: now.Add(time.Minute), UpdatedAt: now}
	sameJSON(t, "the first acquire", got, want)
	sameJSON(t, "the state after the first acquire", brokerState(t, s, "acme/GOOGLE"), want)
	_, err = s.GetBrokerState(bg, "acme/OTHER")
	wantErr(t, "GetBrokerState of another credential", err, store.ErrNotFound)

	// The holder acquires again (a retried invocation): its lease, longer.
	clk.Advance(time.Second)
	got, err = s.AcquireBrokerLease(bg, "acme/GOOGLE", "a", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease by its holder", err)
	want.LeaseExpiresAt, want.UpdatedAt = clk.Now().Add(time.Minute), clk.Now()
	sameJSON(t, "acquired again by its holder", got, want)
}

func testBrokerLeaseExcludes(t *testing.T, s store.BrokerStates, clk *clock.Fake) {
	until := clk.Now().Add(time.Minute)
	a, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "a", until)
	noErr(t, "AcquireBrokerLease a", err)
	held, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "b", clk.Now().Add(time.Minute))
	wantErr(t, "AcquireBrokerLease b while a holds it", err, store.ErrConflict)
	sameJSON(t, "the state a lost acquire returns", held, a)
	sameJSON(t, "the state after b's lost acquire", brokerState(t, s, "acme/GOOGLE"), a)

	// a stalls: its lease lapses at its expiry exactly, on the store's
	// clock, and b takes over.
	clk.Advance(time.Minute - time.Nanosecond)
	_, err = s.AcquireBrokerLease(bg, "acme/GOOGLE", "b", clk.Now().Add(time.Minute))
	wantErr(t, "AcquireBrokerLease b a nanosecond before a's lease lapses", err, store.ErrConflict)
	clk.Advance(time.Nanosecond)
	b, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "b", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease b once a's lease lapsed", err)
	if b.LeaseHolder != "b" || !b.LeaseExpiresAt.Equal(clk.Now().Add(time.Minute)) || b.Generation != 0 {
		t.Fatalf("b's acquire: %+v", b)
	}
	_, err = s.AcquireBrokerLease(bg, "acme/GOOGLE", "a", clk.Now().Add(time.Minute))
	wantErr(t, "AcquireBrokerLease by a, whose lease b took over", err, store.ErrConflict)
}

func testBrokerCommit(t *testing.T, s store.BrokerStates, clk *clock.Fake) {
	st, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "a", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease", err)
	clk.Advance(time.Second)
	// Every field round-trips, times to the nanosecond, tokens byte for byte.
	st.SealedRefreshToken, st.SealedAccessToken = sealed(1), sealed(2)
	st.AccessExpiresAt, st.Seed = clk.Now().Add(time.Hour+123*time.Nanosecond), "hmac-sha256:seed-1"
	got, err := s.CommitBrokerState(bg, st)
	noErr(t, "CommitBrokerState", err)
	want := st
	want.Generation, want.LeaseHolder, want.LeaseExpiresAt, want.UpdatedAt = 1, "", time.Time{}, clk.Now()
	sameJSON(t, "CommitBrokerState's answer", got, want)
	sameJSON(t, "the state after the commit", brokerState(t, s, "acme/GOOGLE"), want)

	// The lease is free at once: another holder refreshes next, from the
	// committed state.
	b, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "b", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease b after a's commit", err)
	if b.Generation != 1 || string(b.SealedRefreshToken) != string(sealed(1)) || b.Seed != want.Seed {
		t.Fatalf("b's acquire after the commit: %+v", b)
	}
	// A commit may clear a token (a family restarted from a new seed).
	b.SealedRefreshToken, b.SealedAccessToken, b.AccessExpiresAt, b.Seed = sealed(3), nil, time.Time{}, "hmac-sha256:seed-2"
	got, err = s.CommitBrokerState(bg, b)
	noErr(t, "CommitBrokerState b", err)
	want = store.BrokerState{ID: "acme/GOOGLE", Generation: 2, SealedRefreshToken: sealed(3), Seed: "hmac-sha256:seed-2", UpdatedAt: clk.Now()}
	sameJSON(t, "the commit that cleared the access token", got, want)
	sameJSON(t, "the state after it", brokerState(t, s, "acme/GOOGLE"), want)
}

func testBrokerStaleCommit(t *testing.T, s store.BrokerStates, clk *clock.Fake) {
	a, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "a", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease a", err)
	// a stalls past its lease; b takes over and commits generation 1.
	clk.Advance(2 * time.Minute)
	b, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "b", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease b", err)
	b.SealedRefreshToken, b.SealedAccessToken, b.AccessExpiresAt = sealed(1), sealed(2), clk.Now().Add(time.Hour)
	_, err = s.CommitBrokerState(bg, b)
	noErr(t, "CommitBrokerState b", err)
	// b holds the lease again when a wakes up.
	held, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "b", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease b again", err)

	// a commits what it refreshed from generation 0: refused, and neither
	// b's tokens nor b's lease move.
	stale := a
	stale.SealedRefreshToken, stale.SealedAccessToken, stale.AccessExpiresAt = sealed(8), sealed(9), clk.Now().Add(2*time.Hour)
	_, err = s.CommitBrokerState(bg, stale)
	wantErr(t, "CommitBrokerState at a stale generation", err, store.ErrConflict)
	sameJSON(t, "the state after the stale commit", brokerState(t, s, "acme/GOOGLE"), held)
	// Nor does a commit at a generation ahead of the stored one.
	ahead := held
	ahead.Generation = 5
	_, err = s.CommitBrokerState(bg, ahead)
	wantErr(t, "CommitBrokerState at a generation ahead", err, store.ErrConflict)
	sameJSON(t, "the state after the commit ahead", brokerState(t, s, "acme/GOOGLE"), held)
}

func testBrokerCommitKeepsOthersLease(t *testing.T, s store.BrokerStates, clk *clock.Fake) {
	// a's lease lapsed and b holds it now, but a's commit is at the stored
	// generation (b has not committed): it is stored, and b keeps its
	// lease, so b's own commit, at the old generation, fails instead of
	// overwriting a's newer token.
	a, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "a", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease a", err)
	clk.Advance(2 * time.Minute)
	b, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "b", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease b", err)
	a.SealedRefreshToken, a.SealedAccessToken, a.AccessExpiresAt = sealed(1), sealed(2), clk.Now().Add(time.Hour)
	got, err := s.CommitBrokerState(bg, a)
	noErr(t, "CommitBrokerState a", err)
	if got.Generation != 1 || got.LeaseHolder != "b" || !got.LeaseExpiresAt.Equal(b.LeaseExpiresAt) {
		t.Fatalf("a's commit while b holds the lease: %+v", got)
	}
	sameJSON(t, "the state after a's commit", brokerState(t, s, "acme/GOOGLE"), got)
	b.SealedRefreshToken = sealed(5)
	_, err = s.CommitBrokerState(bg, b)
	wantErr(t, "CommitBrokerState b at the generation a moved on", err, store.ErrConflict)
	sameJSON(t, "the state after b's refused commit", brokerState(t, s, "acme/GOOGLE"), got)
}

func testBrokerRelease(t *testing.T, s store.BrokerStates, clk *clock.Fake) {
	a, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "a", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease a", err)
	clk.Advance(time.Second)
	noErr(t, "ReleaseBrokerLease by b, who does not hold it", s.ReleaseBrokerLease(bg, "acme/GOOGLE", "b"))
	sameJSON(t, "the state after b's release", brokerState(t, s, "acme/GOOGLE"), a)
	_, err = s.AcquireBrokerLease(bg, "acme/GOOGLE", "b", clk.Now().Add(time.Minute))
	wantErr(t, "AcquireBrokerLease b after its own release", err, store.ErrConflict)

	noErr(t, "ReleaseBrokerLease by a", s.ReleaseBrokerLease(bg, "acme/GOOGLE", "a"))
	released := brokerState(t, s, "acme/GOOGLE")
	want := a
	want.LeaseHolder, want.LeaseExpiresAt, want.UpdatedAt = "", time.Time{}, clk.Now()
	sameJSON(t, "the state after a's release", released, want)
	noErr(t, "ReleaseBrokerLease by a again", s.ReleaseBrokerLease(bg, "acme/GOOGLE", "a"))
	sameJSON(t, "the state after a's second release", brokerState(t, s, "acme/GOOGLE"), released)
	b, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", "b", clk.Now().Add(time.Minute))
	noErr(t, "AcquireBrokerLease b after a's release", err)
	if b.LeaseHolder != "b" {
		t.Fatalf("b's acquire: %+v", b)
	}
}

func testBrokerConcurrentAcquires(t *testing.T, s store.BrokerStates, clk *clock.Fake) {
	const n = 8
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  []string
		errs []error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("h%d", i)
			_, err := s.AcquireBrokerLease(bg, "acme/GOOGLE", holder, clk.Now().Add(time.Minute))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won = append(won, holder)
			case !errors.Is(err, store.ErrConflict):
				errs = append(errs, err)
			}
		}()
	}
	await.Group(t, "the concurrent AcquireBrokerLeases", &wg)
	if len(errs) > 0 || len(won) != 1 {
		t.Fatalf("%d concurrent acquires: won by %v, errors %v", n, won, errs)
	}
	if st := brokerState(t, s, "acme/GOOGLE"); st.LeaseHolder != won[0] || st.Generation != 0 {
		t.Fatalf("after the concurrent acquires: %+v, won by %s", st, won[0])
	}
}
