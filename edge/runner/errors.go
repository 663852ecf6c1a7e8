package runner

import (
	"errors"
	"fmt"

	"github.com/runfleet/runfleet/shared/hostproto"
)

// The kinds of error the runner returns. The host API maps each to a status
// in one place; anything else is a fault.
var (
	// ErrNotFound: no run has that id.
	ErrNotFound = errors.New("runner: run not found")
	// ErrNotRunning: the verb needs a live attempt (input, cancel) and the run has none.
	ErrNotRunning = errors.New("runner: the run has no live attempt")
	// ErrNotRetryable: a retry of a run whose attempt is still live.
	ErrNotRetryable = errors.New("runner: the run's attempt is still live")
	// ErrDraining: the host admits no new start or retry while it drains.
	ErrDraining = errors.New("runner: the host is draining")
	// ErrClosed: the runner has shut down.
	ErrClosed = errors.New("runner: shut down")
)

// Refusal is a typed refusal to start an attempt: Reason is one of
// hostproto's Reason* codes, Detail a human explanation that never holds a
// secret, a placeholder or a token.
type Refusal struct {
	Reason string
	Detail string
}

func (r *Refusal) Error() string {
	if r.Detail == "" {
		return "refused: " + r.Reason
	}
	return "refused: " + r.Reason + ": " + r.Detail
}

func refuse(reason, format string, args ...any) *Refusal {
	return &Refusal{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// RequestError is a start request that cannot be run as asked; Field names
// the part at fault.
type RequestError struct {
	Field   string
	Message string
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Message }

func badRequest(field, format string, args ...any) *RequestError {
	return &RequestError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// isRefusalReason reports whether reason is a refusal admission gives.
func isRefusalReason(reason string) bool {
	switch reason {
	case hostproto.ReasonBrokerNotReady, hostproto.ReasonKeyNotGranted, hostproto.ReasonHostUnavailable,
		hostproto.ReasonHostBusy, hostproto.ReasonCloneFailed, hostproto.ReasonDeadlinePassed, hostproto.ReasonCanceled,
		hostproto.ReasonHostStorageLow:
		return true
	}
	return false
}
