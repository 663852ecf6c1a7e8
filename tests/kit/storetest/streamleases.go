package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// streamLeasesContract is store.StreamLeases' contract.
var streamLeasesContract = []contractCase{
	roleCase("StreamLeases/CapAndRelease", testLeasesCapAndRelease),
	roleCase("StreamLeases/Expiry", testLeasesExpiry),
	roleCase("StreamLeases/RenewOnlyMine", testLeasesRenew),
	roleCase("StreamLeases/Concurrent", testLeasesConcurrent),
	roleCase("StreamLeases/ApartFromIdempotency", testLeasesApart),
}

// leasesAndIdempotency: stream leases share the idempotency items'
// keyspace.
type leasesAndIdempotency interface {
	store.StreamLeases
	store.IdempotencyKeys
}

func lease(owner, holder string, exp time.Time) store.StreamLease {
	return store.StreamLease{OwnerID: owner, Holder: holder, ExpiresAt: exp}
}

func testLeasesCapAndRelease(t *testing.T, s store.StreamLeases, clk *clock.Fake) {
	now := clk.Now()
	var held []store.StreamLease
	for i := 0; i < 3; i++ {
		l, err := s.AcquireStreamLease(bg, lease("alice", fmt.Sprint("h", i), now.Add(time.Duration(i+1)*time.Minute)), 3)
		noErr(t, "acquire", err)
		if l.Slot != i || l.Holder != fmt.Sprint("h", i) || !l.ExpiresAt.Equal(store.RoundExpiry(now.Add(time.Duration(i+1)*time.Minute))) {
			t.Fatalf("lease %d: %+v", i, l)
		}
		held = append(held, l)
	}
	// Full: ErrExists, with the earliest holder's expiry.
	got, err := s.AcquireStreamLease(bg, lease("alice", "h3", now.Add(time.Minute)), 3)
	wantErr(t, "acquire beyond the cap", err, store.ErrExists)
	if !got.ExpiresAt.Equal(held[0].ExpiresAt) {
		t.Fatalf("refusal's expiry %v, want the earliest holder's %v", got.ExpiresAt, held[0].ExpiresAt)
	}
	// Another owner's slots are its own.
	if _, err := s.AcquireStreamLease(bg, lease("bob", "b0", now.Add(time.Minute)), 1); err != nil {
		t.Fatalf("bob: %v", err)
	}
	// Releasing someone else's lease frees nothing; the holder's does.
	noErr(t, "release by another", s.ReleaseStreamLease(bg, store.StreamLease{OwnerID: "alice", Slot: 1, Holder: "h9"}))
	_, err = s.AcquireStreamLease(bg, lease("alice", "h3", now.Add(time.Minute)), 3)
	wantErr(t, "acquire after a stranger's release", err, store.ErrExists)
	noErr(t, "release", s.ReleaseStreamLease(bg, held[1]))
	noErr(t, "release twice", s.ReleaseStreamLease(bg, held[1]))
	l, err := s.AcquireStreamLease(bg, lease("alice", "h3", now.Add(time.Minute)), 3)
	noErr(t, "acquire the freed slot", err)
	if l.Slot != 1 {
		t.Fatalf("took slot %d, want the freed 1", l.Slot)
	}
}

func testLeasesExpiry(t *testing.T, s store.StreamLeases, clk *clock.Fake) {
	now := clk.Now()
	_, err := s.AcquireStreamLease(bg, lease("alice", "crashed", now.Add(time.Minute)), 1)
	noErr(t, "acquire", err)
	_, err = s.AcquireStreamLease(bg, lease("alice", "next", now.Add(2*time.Minute)), 1)
	wantErr(t, "acquire while held", err, store.ErrExists)
	// From its (rounded) expiry on, the slot is free.
	clk.Set(store.RoundExpiry(now.Add(time.Minute)))
	l, err := s.AcquireStreamLease(bg, lease("alice", "next", now.Add(2*time.Minute)), 1)
	noErr(t, "acquire an expired slot", err)
	if l.Slot != 0 || l.Holder != "next" {
		t.Fatalf("lease %+v", l)
	}
	// The crashed holder cannot renew it back.
	err = s.RenewStreamLease(bg, store.StreamLease{OwnerID: "alice", Slot: 0, Holder: "crashed", ExpiresAt: now.Add(3 * time.Minute)})
	wantErr(t, "renewal by the former holder", err, store.ErrExists)
}

func testLeasesRenew(t *testing.T, s store.StreamLeases, clk *clock.Fake) {
	now := clk.Now()
	l, err := s.AcquireStreamLease(bg, lease("alice", "me", now.Add(time.Minute)), 1)
	noErr(t, "acquire", err)
	l.ExpiresAt = now.Add(5 * time.Minute)
	noErr(t, "renew", s.RenewStreamLease(bg, l))
	// Renewed: still held after the first expiry.
	clk.Advance(2 * time.Minute)
	_, err = s.AcquireStreamLease(bg, lease("alice", "other", clk.Now().Add(time.Minute)), 1)
	wantErr(t, "acquire a renewed slot", err, store.ErrExists)
	// A lapsed lease nobody took is renewed (taken) again.
	clk.Advance(4 * time.Minute)
	l.ExpiresAt = clk.Now().Add(time.Minute)
	noErr(t, "renew a lapsed, untaken lease", s.RenewStreamLease(bg, l))
	_, err = s.AcquireStreamLease(bg, lease("alice", "other", clk.Now().Add(time.Minute)), 1)
	wantErr(t, "acquire after the renewal", err, store.ErrExists)
}

func testLeasesConcurrent(t *testing.T, s store.StreamLeases, clk *clock.Fake) {
	const slots, tries = 3, 12
	var mu sync.Mutex
	won := map[int]string{}
	var wg sync.WaitGroup
	for i := 0; i < tries; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := s.AcquireStreamLease(context.Background(), lease("alice", fmt.Sprint("h", i), clk.Now().Add(time.Minute)), slots)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if prev, dup := won[l.Slot]; dup {
				t.Errorf("slot %d won by %s and %s", l.Slot, prev, l.Holder)
			}
			won[l.Slot] = l.Holder
		}()
	}
	await.Group(t, "the concurrent AcquireStreamLeases", &wg)
	if len(won) != slots {
		t.Fatalf("%d slots taken by %d concurrent tries, want all %d: %v", len(won), tries, slots, won)
	}
}

// testLeasesApart: lease items share the idempotency keyspace but never
// read as, or collide with, an idempotency item.
func testLeasesApart(t *testing.T, s leasesAndIdempotency, clk *clock.Fake) {
	now := clk.Now()
	_, err := s.PutIdempotency(bg, idem("alice#k", "run-1", now))
	noErr(t, "put idempotency", err)
	l, err := s.AcquireStreamLease(bg, lease("alice", "h", now.Add(time.Minute)), 1)
	noErr(t, "acquire", err)
	if _, err := s.GetIdempotency(bg, "alice#k"); err != nil {
		t.Fatalf("the idempotency item after a lease: %v", err)
	}
	noErr(t, "release", s.ReleaseStreamLease(bg, l))
	if _, err := s.GetIdempotency(bg, "alice#k"); err != nil {
		t.Fatalf("the idempotency item after a release: %v", err)
	}
}
