package store

import (
	"testing"
	"time"
)

func TestPageLimit(t *testing.T) {
	for in, want := range map[int]int{-5: DefaultLimit, 0: DefaultLimit, 1: 1, 250: 250, 1000: 1000, 1001: 1000, 1 << 30: 1000} {
		if got := PageLimit(in); got != want {
			t.Errorf("PageLimit(%d) = %d, want %d", in, got, want)
		}
	}
}

func TestRoundExpiryAndExpired(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	for _, tc := range []struct {
		in, want time.Time
	}{
		{time.Time{}, time.Time{}},
		{at, at},
		{at.Add(time.Nanosecond), at.Add(time.Second)},
		{at.Add(999 * time.Millisecond), at.Add(time.Second)},
		{at.In(time.FixedZone("x", 3600)).Add(time.Millisecond), at.Add(time.Second)},
	} {
		if got := RoundExpiry(tc.in); !got.Equal(tc.want) || got.Location() != time.UTC {
			t.Errorf("RoundExpiry(%v) = %v, want %v UTC", tc.in, got, tc.want)
		}
	}
	if Expired(time.Time{}, at) {
		t.Error("a zero ExpiresAt expired")
	}
	if Expired(at, at.Add(-time.Nanosecond)) {
		t.Error("expired before its ExpiresAt")
	}
	if !Expired(at, at) || !Expired(at, at.Add(time.Hour)) {
		t.Error("not expired at or after its ExpiresAt")
	}
}
