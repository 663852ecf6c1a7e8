package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/upstream"
)

// blockedError: a placeholder where policy forbids it. Its reason names keys
// and hosts, never a value or a placeholder.
type blockedError struct {
	reason string
	ref    policy.KeyRef
}

func (e *blockedError) Error() string { return "blocked: " + e.reason }

// withheldError: the source has no value for a key the request needs.
type withheldError struct{ ref policy.KeyRef }

func (e *withheldError) Error() string { return "withheld: no value for " + e.ref.String() }

// unscannableError: an answer to a request that carried a real value comes
// content-coded (compressed) although the proxy asked for it uncoded, so it
// cannot be scrubbed of the value; the task does not get it.
type unscannableError struct{}

func (unscannableError) Error() string {
	return "the upstream's answer is content-coded (compressed) and cannot be scanned for the values put into the request"
}

// faultError: something of ours failed (the secrets source, a value that
// cannot be sent). Logged, never shown.
type faultError struct{ err error }

func (e *faultError) Error() string { return "proxy fault: " + e.err.Error() }
func (e *faultError) Unwrap() error { return e.err }

// classify maps every error the pipeline or a tunnel meets to the status the
// task sees, the audit action and the reason shown. It is the one place
// error kinds become statuses.
func (p *Proxy) classify(err error) (status int, action audit.Action, reason string) {
	var blocked *blockedError
	var withheld *withheldError
	var fault *faultError
	var refused *upstream.RefusedError
	var unscannable unscannableError
	switch {
	case errors.As(err, &blocked):
		return http.StatusForbidden, audit.Blocked, blocked.Error()
	case errors.As(err, &withheld):
		return http.StatusForbidden, audit.Withheld, withheld.Error()
	case errors.As(err, &unscannable):
		return http.StatusBadGateway, audit.Blocked, unscannable.Error()
	case errors.As(err, &refused):
		return http.StatusForbidden, audit.Denied, "upstream refused: " + refused.Verdict.Reason
	case errors.As(err, &fault):
		return http.StatusInternalServerError, audit.Denied, "internal error"
	case errors.Is(err, upstream.ErrNoUplink):
		return http.StatusBadGateway, audit.Denied, "upstream name not resolvable: no uplink DNS server"
	case errors.Is(err, context.Canceled):
		return http.StatusBadGateway, audit.Denied, "request cancelled"
	}
	return http.StatusBadGateway, audit.Denied, "upstream unreachable"
}

// logFault logs a 5xx's cause. A *url.Error is unwrapped: its URL may hold a
// substituted value; any placeholder in the text is redacted.
func (p *Proxy) logFault(status int, err error, attrs ...slog.Attr) {
	if status < 500 {
		return
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	attrs = append(attrs, slog.Int("status", status), slog.String("error", redacted(p.reg.index.Load(), err.Error())))
	p.cfg.Logger.LogAttrs(context.Background(), slog.LevelError, "secrets proxy request failed", attrs...)
}
