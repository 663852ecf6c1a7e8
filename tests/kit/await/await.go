// Package await bounds a test's waits on its other goroutines and
// processes (a channel, a WaitGroup, a condition polled on real time): a
// wait that does not end fails the test within its limit, naming what it
// waited for, instead of hanging until go test's -timeout kills
// the whole binary with a dump of every goroutine.
//
// Call its functions on the test's goroutine (they fail the test).
package await

import (
	"sync"
	"time"
)

// TB is the part of testing.TB a wait needs, so a process without a
// *testing.T (the proxy benchmarks' child) can wait too.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Limit is how long one wait may take. The waits in this module's tests
// are for work of milliseconds to seconds (a request, a process's exit, a
// goroutine reaching a gate) on a loaded 2-core machine under -race; one
// that takes minutes is a hang.
const Limit = 2 * time.Minute

// Recv returns what ch delivers (the zero value once ch is closed),
// failing the test if nothing comes within Limit.
func Recv[T any](t TB, what string, ch <-chan T) T {
	t.Helper()
	v, _ := RecvOK(t, what, ch)
	return v
}

// RecvOK is Recv that also reports, as a receive's ok does, whether ch
// delivered a value (false: it was closed).
func RecvOK[T any](t TB, what string, ch <-chan T) (T, bool) {
	t.Helper()
	return recvWithin(t, what, ch, Limit)
}

func recvWithin[T any](t TB, what string, ch <-chan T, limit time.Duration) (T, bool) {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case v, ok := <-ch:
		return v, ok
	case <-timer.C:
		t.Fatalf("waiting for %s: nothing in %s", what, limit)
		panic("unreachable") // Fatalf does not return
	}
}

// Group waits for wg, failing the test if it is not done within Limit.
func Group(t TB, what string, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	Recv(t, what, done)
}

// pollEvery is how often Within checks its condition.
const pollEvery = 2 * time.Millisecond

// Within checks cond until it holds (true) or timeout has passed (false),
// on real time: for waiting on another goroutine or process. Where the
// clock is a test's own, a fake clock's WaitForTimers is the way.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}

// Cond is Within that fails the test on timeout, naming what it waited
// for.
func Cond(t TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}
