package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestWithDeadlineOnAFakeClock(t *testing.T) {
	f := NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx, cancel := WithTimeout(context.Background(), f, 5*time.Second)
	defer cancel()
	f.Advance(4 * time.Second)
	if ctx.Err() != nil {
		t.Fatalf("done before its deadline: %v", ctx.Err())
	}
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("a fake clock's deadline was reported as a wall-clock one")
	}
	f.Advance(time.Second)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not done at its deadline")
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", ctx.Err())
	}
	// A context derived from it sees the same.
	child, stop := context.WithCancel(ctx)
	defer stop()
	if !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Fatalf("child Err = %v", child.Err())
	}

	ctx2, cancel2 := WithTimeout(context.Background(), f, time.Minute)
	if f.Timers() != 1 {
		t.Fatalf("%d timers pending", f.Timers())
	}
	cancel2()
	if f.Timers() != 0 || !errors.Is(ctx2.Err(), context.Canceled) {
		t.Fatalf("after cancel: %d timers, Err %v", f.Timers(), ctx2.Err())
	}
}

func TestWithDeadlineOnTheRealClock(t *testing.T) {
	d := time.Now().Add(time.Hour)
	ctx, cancel := WithDeadline(context.Background(), Real{}, d)
	defer cancel()
	if got, ok := ctx.Deadline(); !ok || !got.Equal(d) {
		t.Fatalf("Deadline = %v %v", got, ok)
	}
}
