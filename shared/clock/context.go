package clock

import (
	"context"
	"errors"
	"time"
)

// WithDeadline returns a copy of parent that is done once c reaches d (or
// when parent is, or cancel is called): a deadline on an injected clock, so
// a Fake drives it. On Real it is context.WithDeadline. On another clock
// the returned context's Err is context.DeadlineExceeded once d passed, but
// its Deadline is parent's: d is a time on c, not on the wall clock that
// net/http and net.Dialer compare a Deadline with.
func WithDeadline(parent context.Context, c Clock, d time.Time) (context.Context, context.CancelFunc) {
	if _, ok := c.(Real); ok {
		return context.WithDeadline(parent, d)
	}
	ctx, cancel := context.WithCancelCause(parent)
	t := c.AfterFunc(d.Sub(c.Now()), func() { cancel(context.DeadlineExceeded) })
	return deadlineCtx{ctx}, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// WithTimeout is WithDeadline at d from c's now.
func WithTimeout(parent context.Context, c Clock, d time.Duration) (context.Context, context.CancelFunc) {
	return WithDeadline(parent, c, c.Now().Add(d))
}

// deadlineCtx reports a deadline reached on its clock as
// context.DeadlineExceeded, as a context.WithDeadline would.
type deadlineCtx struct{ context.Context }

func (c deadlineCtx) Err() error {
	err := c.Context.Err()
	if err != nil && errors.Is(context.Cause(c.Context), context.DeadlineExceeded) {
		return context.DeadlineExceeded
	}
	return err
}
