package ca

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
)

// TrustListener installs bundle (PEM: the signer, then its successor if
// any) wherever running tasks read their trust, and returns nil once every
// one of them has it. It runs on a goroutine of its own, never inside a TLS
// handshake, one delivery at a time per listener. ctx is that delivery's
// own: it is cancelled if the listener is unsubscribed or the Authority
// closes while the delivery runs (the listener must then stop promptly),
// and never after the delivery has ended.
//
// A listener must not call its unsubscribe func or Close: both wait for the
// delivery under way, so from inside it they are refused with
// ErrInsideTrustListener. Go has no context inherited by goroutines, so a
// goroutine the listener starts and waits for is not recognised: it must
// not call them either.
type TrustListener func(ctx context.Context, bundle []byte) error

// ErrInsideTrustListener refuses an unsubscribe or Close made from inside a
// trust listener, where it would wait for its own delivery.
var ErrInsideTrustListener = errors.New("called from inside a trust listener, where it would wait for its own delivery")

// errUnsubscribed cancels the delivery under way of an unsubscribed listener.
var errUnsubscribed = errors.New("ca: trust listener unsubscribed")

// watcher is one subscribed listener; guarded by Authority.mu.
type watcher struct {
	listener TrustListener
	stopped  bool
	// delivered is the last bundle the listener acknowledged.
	delivered []byte
	// redeliver: RequestTrustDelivery asked for the bundle again, even if
	// acknowledged.
	redeliver bool
	// again: a delivery was asked for (a review, a changed bundle, a
	// request) while one was under way, which may already be past the task
	// that needs it; another follows when it ends, even if it failed.
	again bool
	// inFlight is closed when the delivery under way ends; nil when none.
	inFlight chan struct{}
	cancel   context.CancelCauseFunc
}

// WatchTrust subscribes l: it is given the current bundle now and every
// changed bundle after. A delivery that fails is logged and retried at the
// next review until one succeeds (or at once, if a review came while it
// was under way). The returned unsubscribe stops l, aborts
// its delivery under way and returns once that has ended; it may be called
// more than once. After Close, WatchTrust returns ErrClosed.
func (a *Authority) WatchTrust(l TrustListener) (unsubscribe func() error, err error) {
	if l == nil {
		return nil, errors.New("ca: WatchTrust: nil listener")
	}
	a.current() // reviewed first, so a change this makes is delivered once
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.trustClosed {
		return nil, ErrClosed
	}
	w := &watcher{listener: l}
	a.watchers[w] = struct{}{}
	a.deliverLocked(w)
	return func() error { return a.unsubscribe(w) }, nil
}

func (a *Authority) unsubscribe(w *watcher) error {
	if insideTrustListener() {
		return fmt.Errorf("ca: unsubscribe: %w", ErrInsideTrustListener)
	}
	a.mu.Lock()
	a.stopWatcherLocked(w, errUnsubscribed)
	done := w.inFlight
	a.mu.Unlock()
	if done != nil {
		<-done
	}
	return nil
}

func (a *Authority) stopWatcherLocked(w *watcher, cause error) {
	w.stopped = true
	delete(a.watchers, w)
	if w.cancel != nil {
		w.cancel(cause)
	}
}

// RequestTrustDelivery delivers the current bundle to every listener again,
// though they acknowledged it (a task's own install failed, or it was still
// starting). A listener busy with a delivery gets another right after.
func (a *Authority) RequestTrustDelivery() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.trustClosed {
		return
	}
	for w := range a.watchers {
		w.redeliver = true
		a.deliverLocked(w)
	}
}

func (a *Authority) deliverAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deliverAllLocked()
}

func (a *Authority) deliverAllLocked() {
	for w := range a.watchers {
		a.deliverLocked(w)
	}
}

// deliverLocked starts a delivery to w unless one is under way or w has
// the current bundle already (and no redelivery was asked for).
func (a *Authority) deliverLocked(w *watcher) {
	if a.trustClosed || w.stopped {
		return
	}
	if w.inFlight != nil {
		w.again = true
		return
	}
	w.again = false
	bundle := a.state.Load().bundle
	if bytes.Equal(w.delivered, bundle) && !w.redeliver {
		return
	}
	w.redeliver = false
	// The context is never cancelled once the delivery has ended: nothing of
	// it is left to stop, and a callback the listener left on it must not
	// fire later, outside the delivery. Its cancel is released unused.
	ctx, cancel := context.WithCancelCause(context.Background())
	w.inFlight, w.cancel = make(chan struct{}), cancel
	a.deliveries.Add(1)
	go a.runDelivery(ctx, w, bundle, w.inFlight)
}

func (a *Authority) runDelivery(ctx context.Context, w *watcher, bundle []byte, done chan struct{}) {
	defer a.deliveries.Done()
	err := callListener(ctx, w.listener, bytes.Clone(bundle))

	a.mu.Lock()
	defer a.mu.Unlock()
	w.inFlight, w.cancel = nil, nil
	close(done)
	if w.stopped || a.trustClosed {
		return
	}
	if err != nil {
		a.log.Warn("ca: the CA bundle did not reach every running task; retrying at the next review", logError, err.Error())
		// Nothing is known to be installed any more, so the next review
		// retries even a redelivery of a bundle acknowledged before.
		w.delivered = nil
		if w.again {
			a.deliverLocked(w)
		}
		return
	}
	w.delivered = bundle
	// A bundle that changed meanwhile, or a redelivery asked for, goes at once.
	a.deliverLocked(w)
}

// callListener is the one frame every listener call runs under: a
// goroutine with it on its stack is inside a delivery. A panicking listener
// counts as a failed delivery rather than bringing edge down.
//
//go:noinline
func callListener(ctx context.Context, l TrustListener, bundle []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("trust listener panicked: %v", r)
		}
	}()
	return l(ctx, bundle)
}

// insideTrustListener reports whether the calling goroutine is running a
// trust listener (of any Authority, so two whose listeners tear each other
// down cannot deadlock either): whether callListener is on its stack. Go
// offers no goroutine identity, but the stack of the calling goroutine is
// exactly the evidence needed, and it costs a stack walk only on the rare
// unsubscribe and Close.
func insideTrustListener() bool {
	entry := reflect.ValueOf(callListener).Pointer()
	pcs := make([]uintptr, 64)
	for {
		n := runtime.Callers(2, pcs)
		if n < len(pcs) {
			pcs = pcs[:n]
			break
		}
		pcs = make([]uintptr, 2*len(pcs))
	}
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if f.Entry == entry {
			return true
		}
		if !more {
			return false
		}
	}
}
