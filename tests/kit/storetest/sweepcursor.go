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

// sweepCursorContract is store.SweepCursorStore's contract.
var sweepCursorContract = []contractCase{
	roleCase("SweepCursor/FirstClaimStartsLapOne", testSweepCursorFirstClaim),
	roleCase("SweepCursor/LeaseExcludesOthersUntilReleasedOrLapsed", testSweepCursorLease),
	roleCase("SweepCursor/SaveIsConditionalOnVersion", testSweepCursorSave),
	roleCase("SweepCursor/ConcurrentClaimsOneWins", testSweepCursorConcurrentClaims),
}

func testSweepCursorFirstClaim(t *testing.T, s store.SweepCursorStore, clk *clock.Fake) {
	now := clk.Now()
	_, err := s.SaveSweepCursor(bg, store.SweepCursor{Lap: 1, Holder: "a"})
	wantErr(t, "SaveSweepCursor before any claim", err, store.ErrNotFound)
	c, err := s.ClaimSweepCursor(bg, "a", now.Add(time.Minute))
	noErr(t, "ClaimSweepCursor", err)
	sameJSON(t, "the first claim", c, store.SweepCursor{
		Lap: 1, LapStarted: now, Holder: "a", LeaseUntil: now.Add(time.Minute), Version: 1,
	})
	// The holder claims again (a retried invocation): still its lease, the
	// position kept.
	c.After = "r07"
	c, err = s.SaveSweepCursor(bg, c)
	noErr(t, "SaveSweepCursor", err)
	again, err := s.ClaimSweepCursor(bg, "a", now.Add(2*time.Minute))
	noErr(t, "ClaimSweepCursor by its holder", err)
	if again.After != "r07" || again.Lap != 1 || !again.LeaseUntil.Equal(now.Add(2*time.Minute)) || again.Version != c.Version+1 {
		t.Fatalf("claimed again: %+v after %+v", again, c)
	}
}

func testSweepCursorLease(t *testing.T, s store.SweepCursorStore, clk *clock.Fake) {
	now := clk.Now()
	a, err := s.ClaimSweepCursor(bg, "a", now.Add(time.Minute))
	noErr(t, "ClaimSweepCursor a", err)
	held, err := s.ClaimSweepCursor(bg, "b", now.Add(time.Minute))
	wantErr(t, "ClaimSweepCursor b while a holds it", err, store.ErrConflict)
	sameJSON(t, "the cursor a lost claim returns", held, a)

	// a releases at a position: b claims and continues from it.
	a.After, a.Holder, a.LeaseUntil = "r42", "", time.Time{}
	a, err = s.SaveSweepCursor(bg, a)
	noErr(t, "SaveSweepCursor releasing", err)
	if a.Holder != "" || !a.LeaseUntil.IsZero() {
		t.Fatalf("released: %+v", a)
	}
	b, err := s.ClaimSweepCursor(bg, "b", now.Add(time.Minute))
	noErr(t, "ClaimSweepCursor b after the release", err)
	if b.After != "r42" || b.Holder != "b" || b.Version != a.Version+1 {
		t.Fatalf("b's claim: %+v", b)
	}

	// b stalls; its lease lapses at LeaseUntil exactly, c takes over, and
	// b's next save fails rather than moving c's cursor.
	clk.Advance(time.Minute - time.Nanosecond)
	_, err = s.ClaimSweepCursor(bg, "c", clk.Now().Add(time.Minute))
	wantErr(t, "ClaimSweepCursor c a nanosecond before b's lease lapses", err, store.ErrConflict)
	clk.Advance(time.Nanosecond)
	c, err := s.ClaimSweepCursor(bg, "c", clk.Now().Add(time.Minute))
	noErr(t, "ClaimSweepCursor c once b's lease lapsed", err)
	if c.Holder != "c" || c.After != "r42" {
		t.Fatalf("c's claim: %+v", c)
	}
	b.After = "r99"
	_, err = s.SaveSweepCursor(bg, b)
	wantErr(t, "SaveSweepCursor by b after c took over", err, store.ErrConflict)
}

func testSweepCursorSave(t *testing.T, s store.SweepCursorStore, clk *clock.Fake) {
	now := clk.Now()
	c, err := s.ClaimSweepCursor(bg, "a", now.Add(time.Minute))
	noErr(t, "ClaimSweepCursor", err)
	// A lap ends: every field round-trips, times to the nanosecond.
	want := store.SweepCursor{
		Lap: 2, After: "", LapStarted: now.Add(3 * time.Second), PrevLapStarted: now,
		PrevLapEnded: now.Add(3 * time.Second), Holder: "a", LeaseUntil: now.Add(time.Minute), Version: c.Version,
	}
	got, err := s.SaveSweepCursor(bg, want)
	noErr(t, "SaveSweepCursor", err)
	want.Version++
	sameJSON(t, "SaveSweepCursor's answer", got, want)
	reclaimed, err := s.ClaimSweepCursor(bg, "a", now.Add(time.Minute))
	noErr(t, "ClaimSweepCursor after the save", err)
	want.Version++
	sameJSON(t, "the stored cursor", reclaimed, want)

	_, err = s.SaveSweepCursor(bg, got) // got's version is one behind now
	wantErr(t, "SaveSweepCursor at a stale version", err, store.ErrConflict)
}

func testSweepCursorConcurrentClaims(t *testing.T, s store.SweepCursorStore, clk *clock.Fake) {
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
			_, err := s.ClaimSweepCursor(bg, holder, clk.Now().Add(time.Minute))
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
	await.Group(t, "the concurrent ClaimSweepCursors", &wg)
	if len(errs) > 0 || len(won) != 1 {
		t.Fatalf("%d concurrent claims: won by %v, errors %v", n, won, errs)
	}
}
