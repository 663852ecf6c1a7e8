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

// idempotencyContract is store.IdempotencyKeys' contract.
var idempotencyContract = []contractCase{
	roleCase("Idempotency/PutGet", testIdempotencyPutGet),
	roleCase("Idempotency/ExistingReturned", testIdempotencyExisting),
	roleCase("Idempotency/Expiry", testIdempotencyExpiry),
	roleCase("Idempotency/Concurrent", testIdempotencyConcurrent),
}

func idem(key, runID string, now time.Time) store.Idempotency {
	return store.Idempotency{
		Key: key, FleetRunID: runID, RequestHash: "sha256:" + runID,
		CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour),
	}
}

// stored is what a store keeps of an idempotency item.
func stored(i store.Idempotency) store.Idempotency {
	i.ExpiresAt = store.RoundExpiry(i.ExpiresAt)
	return i
}

func testIdempotencyPutGet(t *testing.T, s store.IdempotencyKeys, clk *clock.Fake) {
	_, err := s.GetIdempotency(bg, "alice#k1")
	wantErr(t, "GetIdempotency absent", err, store.ErrNotFound)
	it := idem("alice#k1", "r1", clk.Now())
	got, err := s.PutIdempotency(bg, it)
	noErr(t, "PutIdempotency", err)
	sameJSON(t, "PutIdempotency result", got, stored(it))
	got, err = s.GetIdempotency(bg, "alice#k1")
	noErr(t, "GetIdempotency", err)
	sameJSON(t, "GetIdempotency", got, stored(it))
	_, err = s.GetIdempotency(bg, "bob#k1")
	wantErr(t, "another owner's key", err, store.ErrNotFound)
}

func testIdempotencyExisting(t *testing.T, s store.IdempotencyKeys, clk *clock.Fake) {
	first := idem("alice#k1", "r1", clk.Now())
	_, err := s.PutIdempotency(bg, first)
	noErr(t, "PutIdempotency", err)
	clk.Advance(time.Minute)
	got, err := s.PutIdempotency(bg, idem("alice#k1", "r2", clk.Now()))
	wantErr(t, "PutIdempotency again", err, store.ErrExists)
	sameJSON(t, "the existing item comes back", got, stored(first))
	read, err := s.GetIdempotency(bg, "alice#k1")
	noErr(t, "GetIdempotency", err)
	sameJSON(t, "item unchanged", read, stored(first))
}

func testIdempotencyExpiry(t *testing.T, s store.IdempotencyKeys, clk *clock.Fake) {
	first := idem("alice#k1", "r1", clk.Now())
	_, err := s.PutIdempotency(bg, first)
	noErr(t, "PutIdempotency", err)

	// Just before the expiry it still holds.
	clk.Set(stored(first).ExpiresAt.Add(-time.Nanosecond))
	_, err = s.GetIdempotency(bg, "alice#k1")
	noErr(t, "GetIdempotency just before expiry", err)
	_, err = s.PutIdempotency(bg, idem("alice#k1", "r0", clk.Now()))
	wantErr(t, "PutIdempotency just before expiry", err, store.ErrExists)

	clk.Set(stored(first).ExpiresAt)
	_, err = s.GetIdempotency(bg, "alice#k1")
	wantErr(t, "GetIdempotency at expiry", err, store.ErrNotFound)
	second := idem("alice#k1", "r2", clk.Now())
	got, err := s.PutIdempotency(bg, second)
	noErr(t, "PutIdempotency over an expired item", err)
	sameJSON(t, "replacement", got, stored(second))
	read, err := s.GetIdempotency(bg, "alice#k1")
	noErr(t, "GetIdempotency", err)
	sameJSON(t, "GetIdempotency after replace", read, stored(second))
}

func testIdempotencyConcurrent(t *testing.T, s store.IdempotencyKeys, clk *clock.Fake) {
	const n = 50
	type result struct {
		it  store.Idempotency
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			it, err := s.PutIdempotency(bg, idem("alice#same", fmt.Sprintf("run-%02d", i), clk.Now()))
			results[i] = result{it, err}
		}()
	}
	close(start)
	await.Group(t, "the concurrent PutIdempotencys", &wg)
	var winner string
	for _, r := range results {
		if r.err == nil {
			if winner != "" {
				t.Fatalf("two winners: %s and %s", winner, r.it.FleetRunID)
			}
			winner = r.it.FleetRunID
		} else if !errors.Is(r.err, store.ErrExists) {
			t.Fatalf("PutIdempotency: %v", r.err)
		}
	}
	if winner == "" {
		t.Fatal("no winner among 50 concurrent puts")
	}
	for _, r := range results {
		if r.it.FleetRunID != winner {
			t.Fatalf("a loser was told %q, the winner is %q", r.it.FleetRunID, winner)
		}
	}
	got, err := s.GetIdempotency(bg, "alice#same")
	noErr(t, "GetIdempotency", err)
	if got.FleetRunID != winner {
		t.Fatalf("stored %q, winner %q", got.FleetRunID, winner)
	}
}
