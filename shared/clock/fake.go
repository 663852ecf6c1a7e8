package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a Clock that moves only when told to. Timers fire, in deadline
// order, from within Advance or Set; AfterFunc callbacks run on their own
// goroutines, as with the real clock. The zero value is not usable: use NewFake.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	seq     uint64
	waiters []fakeWaiter
}

type fakeWaiter struct {
	n  int
	ch chan struct{}
}

var _ Clock = (*Fake)(nil)

// NewFake returns a Fake reading t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{clock: f, ch: make(chan time.Time, 1)}
	f.schedule(t, d)
	return t
}

// AfterFunc calls fn on a new goroutine when the fake time reaches now+d.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	t := &fakeTimer{clock: f, fn: fn}
	f.schedule(t, d)
	return t
}

// Advance moves the clock forward by d, firing every timer that falls due,
// each at its own deadline, in order.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	target := f.now.Add(d)
	f.mu.Unlock()
	f.Set(target)
}

// Set moves the clock to t (never backwards), firing every timer due by then.
func (f *Fake) Set(t time.Time) {
	for {
		f.mu.Lock()
		if len(f.timers) == 0 || f.timers[0].at.After(t) {
			if t.After(f.now) {
				f.now = t
			}
			f.mu.Unlock()
			return
		}
		next := f.timers[0]
		f.timers = f.timers[1:]
		next.pending = false
		if next.at.After(f.now) {
			f.now = next.at
		}
		now := f.now
		f.mu.Unlock()
		next.fire(now)
	}
}

// Timers reports how many timers are pending.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Next reports when the earliest pending timer falls due, and whether one is
// pending, so a test can tell which of several waits the code under test is in.
func (f *Fake) Next() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timers) == 0 {
		return time.Time{}, false
	}
	return f.timers[0].at, true
}

// WaitForTimers returns a channel closed once at least n timers are pending,
// so a test can advance the clock only after the code under test is waiting.
func (f *Fake) WaitForTimers(n int) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	if len(f.timers) >= n {
		close(ch)
		return ch
	}
	f.waiters = append(f.waiters, fakeWaiter{n: n, ch: ch})
	return ch
}

func (f *Fake) schedule(t *fakeTimer, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removeLocked(t)
	f.seq++
	t.at = f.now.Add(d)
	t.seq = f.seq
	t.pending = true
	f.timers = append(f.timers, t)
	sort.SliceStable(f.timers, func(i, j int) bool {
		if f.timers[i].at.Equal(f.timers[j].at) {
			return f.timers[i].seq < f.timers[j].seq
		}
		return f.timers[i].at.Before(f.timers[j].at)
	})
	kept := f.waiters[:0]
	for _, w := range f.waiters {
		if len(f.timers) >= w.n {
			close(w.ch)
			continue
		}
		kept = append(kept, w)
	}
	f.waiters = kept
}

func (f *Fake) removeLocked(t *fakeTimer) bool {
	for i, x := range f.timers {
		if x == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			t.pending = false
			return true
		}
	}
	return false
}

type fakeTimer struct {
	clock   *Fake
	ch      chan time.Time
	fn      func()
	at      time.Time
	seq     uint64
	pending bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	return t.clock.removeLocked(t)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.clock.mu.Lock()
	was := t.pending
	t.clock.mu.Unlock()
	t.clock.schedule(t, d)
	return was
}

func (t *fakeTimer) fire(now time.Time) {
	if t.fn != nil {
		go t.fn()
		return
	}
	select {
	case t.ch <- now:
	default:
	}
}
