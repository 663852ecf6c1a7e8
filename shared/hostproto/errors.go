package hostproto

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
)

// Error kinds a caller tests with errors.Is.
var (
	// ErrRunNotFound: the host denies the run (404 with CodeRunNotFound).
	ErrRunNotFound = errors.New("hostproto: run not found")
	// ErrUnauthorized: the host refused the credential (401 or 403).
	ErrUnauthorized = errors.New("hostproto: credential refused")
	// ErrNoAnswer: no usable answer came; the host may or may not have acted.
	// Every TransportError is one.
	ErrNoAnswer = errors.New("hostproto: no answer from host")
	// ErrUnreachable: the request never reached the host (dialing or the TLS
	// handshake failed), so the host certainly did not act on it.
	ErrUnreachable = errors.New("hostproto: host unreachable")
	// ErrTimeout: the call ran out of time.
	ErrTimeout = errors.New("hostproto: timed out")
	// ErrTooLarge: the answer exceeded the client's bound for it.
	ErrTooLarge = errors.New("hostproto: answer too large")
)

// maxMessage caps how much of a host's error message is kept.
const maxMessage = 512

// Error is a host's answer outside 2xx, or a 2xx answer Fleet cannot use.
type Error struct {
	// Op names the call, e.g. "start run".
	Op string
	// Status is the HTTP status the host answered.
	Status int
	// Code is the host's machine code (ErrorBody.Code), if any.
	Code string
	// Message is the host's error message (truncated), or why the answer
	// could not be used.
	Message string
	// BadResponse: the answer was 2xx (or oversized) but not what the
	// protocol promises.
	BadResponse bool
	// TooLarge: the answer exceeded the client's bound (BadResponse too).
	TooLarge bool
}

func (e *Error) Error() string {
	if e.BadResponse {
		return fmt.Sprintf("hostproto: %s: bad answer (HTTP %d): %s", e.Op, e.Status, e.Message)
	}
	s := fmt.Sprintf("hostproto: %s: host answered %d", e.Op, e.Status)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Is matches ErrRunNotFound, ErrUnauthorized and ErrTooLarge.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrTooLarge:
		return e.TooLarge
	case ErrRunNotFound:
		return e.Status == http.StatusNotFound && e.Code == CodeRunNotFound
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden
	}
	return false
}

// Refused reports whether the host understood the call and said no (4xx).
func (e *Error) Refused() bool { return !e.BadResponse && e.Status >= 400 && e.Status < 500 }

func newStatusError(op string, status int, raw []byte) *Error {
	e := &Error{Op: op, Status: status}
	var body ErrorBody
	if json.Unmarshal(raw, &body) == nil {
		e.Code = body.Code
		e.Message = body.Error
	}
	if len(e.Message) > maxMessage {
		e.Message = e.Message[:maxMessage] + "..."
	}
	return e
}

// TransportError is a call that got no HTTP answer.
type TransportError struct {
	Op string
	// Delivered is false when the request certainly never reached the host.
	Delivered bool
	// Timeout: the call's time ran out.
	Timeout bool
	Err     error
}

func (e *TransportError) Error() string {
	what := "no answer"
	switch {
	case e.Timeout:
		what = "timed out"
	case !e.Delivered:
		what = "unreachable"
	}
	return fmt.Sprintf("hostproto: %s: %s: %v", e.Op, what, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// Is matches ErrNoAnswer always, ErrUnreachable when undelivered, ErrTimeout
// when the time ran out.
func (e *TransportError) Is(target error) bool {
	switch target {
	case ErrNoAnswer:
		return true
	case ErrUnreachable:
		return !e.Delivered
	case ErrTimeout:
		return e.Timeout
	}
	return false
}

// notDelivered marks a dial error: the request was never written.
type notDelivered struct{ err error }

func (n notDelivered) Error() string { return n.err.Error() }
func (n notDelivered) Unwrap() error { return n.err }

func newTransportError(op string, ctx context.Context, err error) *TransportError {
	te := &TransportError{Op: op, Delivered: true, Err: err}
	var nd notDelivered
	var verr *tls.CertificateVerificationError
	var rec tls.RecordHeaderError
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &nd) || errors.As(err, &verr) || errors.As(err, &rec) ||
		errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		te.Delivered = false
	}
	var ne net.Error
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		te.Timeout = true
	}
	return te
}

// Acceptance is how Fleet reports a verb it forwarded to a host: true (the
// host took it), false (the host refused it) or "unknown" (no answer, or a
// host fault: it may or may not have acted).
type Acceptance int8

const (
	Refused Acceptance = iota
	Accepted
	Unknown
)

// MarshalJSON writes true, false or "unknown".
func (a Acceptance) MarshalJSON() ([]byte, error) {
	switch a {
	case Accepted:
		return []byte("true"), nil
	case Refused:
		return []byte("false"), nil
	default:
		return []byte(`"unknown"`), nil
	}
}

// Outcome is the mapping of a forwarded verb's result: DESIGN.md's 2xx ->
// accepted true, 4xx -> false, timeout or 5xx -> "unknown" with the detail.
// A request that certainly never reached the host (dial or TLS failure) is
// false too: the host cannot have acted on it.
type Outcome struct {
	Accepted Acceptance `json:"accepted"`
	// HostStatus is the host's HTTP status when it answered outside 2xx.
	HostStatus int `json:"hostStatus,omitempty"`
	// Code is the host's machine code for a refusal.
	Code string `json:"code,omitempty"`
	// Detail says why, for a refusal or an unknown outcome.
	Detail string `json:"detail,omitempty"`
}

// OutcomeOf maps the error a Client verb returned (nil included).
func OutcomeOf(err error) Outcome {
	if err == nil {
		return Outcome{Accepted: Accepted}
	}
	var he *Error
	if errors.As(err, &he) {
		o := Outcome{HostStatus: he.Status, Code: he.Code, Detail: he.Message}
		if he.Refused() {
			o.Accepted = Refused
		} else {
			o.Accepted = Unknown
			if he.BadResponse {
				o.Detail = "bad answer from host: " + he.Message
			}
		}
		return o
	}
	var te *TransportError
	if errors.As(err, &te) {
		switch {
		case !te.Delivered:
			// Certain: the request never reached the host, so nothing happened.
			return Outcome{Accepted: Refused, Detail: "the host is unreachable; the request was not delivered"}
		case te.Timeout:
			return Outcome{Accepted: Unknown, Detail: "the host did not answer in time"}
		default:
			return Outcome{Accepted: Unknown, Detail: "the host did not answer"}
		}
	}
	return Outcome{Accepted: Unknown, Detail: "the call failed before reaching the host"}
}
