package clock

import (
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/await"
)

func TestFakeFiresTimersInDeadlineOrder(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := NewFake(start)
	late := f.NewTimer(2 * time.Hour)
	early := f.NewTimer(time.Hour)
	fired := make(chan time.Time, 1)
	f.AfterFunc(90*time.Minute, func() { fired <- f.Now() })

	f.Advance(time.Hour)
	select {
	case at := <-early.C():
		if !at.Equal(start.Add(time.Hour)) {
			t.Fatalf("early fired at %v", at)
		}
	default:
		t.Fatal("early timer did not fire at its deadline")
	}
	select {
	case <-late.C():
		t.Fatal("late timer fired early")
	default:
	}

	f.Advance(time.Hour)
	if got := await.Recv(t, "the AfterFunc due at 90 minutes to run", fired); got.Before(start.Add(90 * time.Minute)) {
		t.Fatalf("AfterFunc ran at %v, before its deadline", got)
	}
	if at := await.Recv(t, "the timer due at two hours to fire", late.C()); !at.Equal(start.Add(2 * time.Hour)) {
		t.Fatalf("late fired at %v", at)
	}
	if f.Timers() != 0 {
		t.Fatalf("%d timers still pending", f.Timers())
	}
}

func TestFakeStopAndReset(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	tm := f.NewTimer(time.Minute)
	if !tm.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	f.Advance(time.Hour)
	select {
	case <-tm.C():
		t.Fatal("stopped timer fired")
	default:
	}
	if tm.Reset(time.Minute) {
		t.Fatal("Reset of a stopped timer reported it pending")
	}
	f.Advance(time.Minute)
	await.Recv(t, "the reset timer to fire", tm.C())
}

func TestWaitForTimersAndSleep(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	done := make(chan bool)
	go func() { done <- Sleep(f, time.Second, nil) }()
	await.Recv(t, "Sleep to arm its timer", f.WaitForTimers(1))
	f.Advance(time.Second)
	if !<-done {
		t.Fatal("Sleep reported it was interrupted")
	}

	stop := make(chan struct{})
	go func() { done <- Sleep(f, time.Second, stop) }()
	await.Recv(t, "Sleep to arm its timer", f.WaitForTimers(1))
	close(stop)
	if await.Recv(t, "Sleep to return once done closed", done) {
		t.Fatal("Sleep ignored done")
	}
}
