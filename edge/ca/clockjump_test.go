package ca_test

import (
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
)

// A clock that jumps two years ahead makes the CA mint a signer dated then
// (every stored CA is past its switch point). Once the clock is put back,
// that CA is not valid yet, so it must not sign: the CA the edge had signs
// again, from the store (its sealed key kept, not deleted), leaves verify,
// and a restart at the corrected time finds the same.
func TestAClockThatRanAheadAndCameBackSignsWithTheCAItHad(t *testing.T) {
	dir := t.TempDir()
	clk := &wallClock{Fake: clock.NewFake(epoch)}
	cfg := testConfig(t, dir, clk)
	a := mustOpen(t, cfg)
	had := a.Status().Signer

	clk.jump(2 * 365 * 24 * time.Hour)
	ahead := a.Status().Signer
	if ahead == had || !a.Status().Valid(clk.Now()) {
		t.Fatalf("two years ahead: signer %+v, want a new one valid then", ahead)
	}

	clk.jump(0) // put right
	clk.Advance(time.Hour)
	now := clk.Now()
	st := a.Status()
	if st.Signer != had {
		t.Fatalf("the clock put back: signer %s (from %s), want the CA the edge had (%s)", st.Signer.Fingerprint, st.Signer.NotBefore, had.Fingerprint)
	}
	if !st.Valid(now) {
		t.Fatalf("the clock put back: the signer is not valid at %s: %+v", now, st.Signer)
	}
	if err := handshake(t, a, proxiedName, a.Bundle(), now); err != nil {
		t.Fatalf("a handshake after the clock came back: %v", err)
	}
	if n := storedCAs(t, cfg.Dir); n != 2 {
		t.Fatalf("the store holds %d CAs, want 2 (the one the edge had, and the one minted ahead)", n)
	}

	a.Close()
	again := mustOpen(t, testConfig(t, dir, clk))
	if got := again.Status().Signer; got != had {
		t.Fatalf("a restart at the corrected time: signer %s, want %s", got.Fingerprint, had.Fingerprint)
	}
	if err := handshake(t, again, proxiedName, again.Bundle(), now); err != nil {
		t.Fatalf("a handshake after the restart: %v", err)
	}
}

// wallClock is a fake clock whose reading can jump, ahead or back, as a wall
// clock set wrong and put right does (clock.Fake only moves forward): Now is
// the fake's time plus the jump; timers run on the fake's time.
type wallClock struct {
	*clock.Fake
	mu     sync.Mutex
	offset time.Duration
}

func (c *wallClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Fake.Now().Add(c.offset)
}

// jump sets the reading to the fake's time plus d.
func (c *wallClock) jump(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset = d
}
