package store

import (
	"errors"
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

func TestParseQueueOrder(t *testing.T) {
	since := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)
	for _, prio := range []int{QueuePriorityMin, -1, 0, 7, QueuePriorityMax} {
		order := QueueOrder(QueueInfo{Priority: prio, Since: since}, "fr-1")
		got, id, err := ParseQueueOrder(order)
		if err != nil || !got.Equal(since) || got.Location() != time.UTC || id != "fr-1" {
			t.Errorf("ParseQueueOrder(%q) = %v %q %v", order, got, id, err)
		}
	}
	for _, bad := range []string{"", "100|", "100|00000000000000000001|", "100-00000000000000000001|x", "100|0000000000000000000x|x"} {
		if _, _, err := ParseQueueOrder(bad); err == nil {
			t.Errorf("ParseQueueOrder(%q) took it", bad)
		}
	}
	// Byte order is queue order: priority first, then Since, then id.
	a := QueueOrder(QueueInfo{Priority: 1, Since: since.Add(time.Hour)}, "z")
	b := QueueOrder(QueueInfo{Priority: 0, Since: since}, "a")
	c := QueueOrder(QueueInfo{Priority: 0, Since: since}, "b")
	d := QueueOrder(QueueInfo{Priority: -1, Since: since.Add(-time.Hour)}, "a")
	if !(a < b && b < c && c < d) {
		t.Errorf("orders out of queue order: %q %q %q %q", a, b, c, d)
	}
}

func TestUpdatedHost(t *testing.T) {
	run := func(status, host string) Run { return Run{FleetRunID: "r", Status: status, HostID: host} }
	for _, tc := range []struct {
		name         string
		stored, next Run
		want         string
		conflict     bool
	}{
		{"offered", run(StatusQueued, ""), run(StatusDispatching, "h1"), "h1", false},
		{"taken back", run(StatusDispatching, "h1"), run(StatusQueued, ""), "", false},
		{"moved while dispatching", run(StatusDispatching, "h1"), run(StatusDispatching, "h2"), "h2", false},
		{"empty keeps the host", run(StatusRunning, "h1"), run(StatusSucceeded, ""), "h1", false},
		{"canceled while queued", run(StatusQueued, ""), run(StatusCanceled, ""), "", false},
		{"running without a host", run(StatusQueued, ""), run(StatusRunning, ""), "", true},
		{"dispatching without a host", run(StatusQueued, ""), run(StatusDispatching, ""), "", true},
		{"a running run moved", run(StatusRunning, "h1"), run(StatusRunning, "h2"), "", true},
		{"a running run back to the queue", run(StatusRunning, "h1"), run(StatusQueued, ""), "", true},
	} {
		got, err := UpdatedHost(tc.stored, tc.next)
		if tc.conflict != errors.Is(err, ErrConflict) || (err == nil && got != tc.want) {
			t.Errorf("%s: %q %v, want %q conflict=%v", tc.name, got, err, tc.want, tc.conflict)
		}
	}
}
