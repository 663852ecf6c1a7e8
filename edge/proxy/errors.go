package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/upstream"
)

// Refusals of a CONNECT, or of a request on an intercepted connection,
// before anything is decided about placeholders. Their reasons are static
// or built from parsed, redacted parts: never what a task sent as it is.
type (
	// credentialsError: no live attempt's credential (407, with
	// Proxy-Authenticate): missing, unknown, revoked, or the attempt ended.
	credentialsError struct{ reason string }
	// methodError: a method edge does not serve there (405, with Allow
	// when allow is set): anything but CONNECT at the proxy, CONNECT on an
	// intercepted connection.
	methodError struct{ reason, allow string }
	// badRequestError: a CONNECT target or a method that does not parse
	// (400).
	badRequestError struct{ reason string }
	// refusedTargetError: the CONNECT decision refused the target (403).
	refusedTargetError struct{ reason string }
	// misdirectedError: a request does not name the CONNECT's authority
	// (421).
	misdirectedError struct{ reason string }
)

func (e credentialsError) Error() string   { return e.reason }
func (e methodError) Error() string        { return e.reason }
func (e badRequestError) Error() string    { return e.reason }
func (e refusedTargetError) Error() string { return e.reason }
func (e misdirectedError) Error() string   { return e.reason }

// answerFields are the fields a refusal's answer must carry (RFC 9110
// 11.7.1, 15.5.6).
func answerFields(err error) http.Header {
	var cred credentialsError
	var method methodError
	switch {
	case errors.As(err, &cred):
		return http.Header{"Proxy-Authenticate": {`Basic realm="runfleet edge"`}}
	case errors.As(err, &method) && method.allow != "":
		return http.Header{"Allow": {method.allow}}
	}
	return nil
}

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

// limitError: a request past a bound on substitution (limits.go): 431
// when the head would grow past it, 413 when the body's substitutions do.
// Its reason names the bound, never a size the request reached.
type limitError struct {
	inBody bool
	reason string
}

func (e *limitError) Error() string { return e.reason }

// faultError: something of ours failed (the secrets source, a value that
// cannot be sent). Logged, never shown.
type faultError struct{ err error }

func (e *faultError) Error() string { return "proxy fault: " + e.err.Error() }
func (e *faultError) Unwrap() error { return e.err }

// classify maps every error a CONNECT, the pipeline or a tunnel meets to
// the status the task sees, the audit action and the reason shown. It is
// the one place error kinds become statuses.
func (p *Proxy) classify(err error) (status int, action audit.Action, reason string) {
	var blocked *blockedError
	var withheld *withheldError
	var fault *faultError
	var refused *upstream.RefusedError
	var unscannable unscannableError
	var limit *limitError
	var cred credentialsError
	var method methodError
	var badRequest badRequestError
	var refusedTarget refusedTargetError
	var misdirected misdirectedError
	switch {
	case errors.As(err, &cred):
		return http.StatusProxyAuthRequired, audit.Denied, cred.Error()
	case errors.As(err, &method):
		return http.StatusMethodNotAllowed, audit.Denied, method.Error()
	case errors.As(err, &badRequest):
		return http.StatusBadRequest, audit.Denied, badRequest.Error()
	case errors.As(err, &refusedTarget):
		return http.StatusForbidden, audit.Denied, refusedTarget.Error()
	case errors.As(err, &misdirected):
		return http.StatusMisdirectedRequest, audit.Denied, misdirected.Error()
	case errors.As(err, &blocked):
		return http.StatusForbidden, audit.Blocked, blocked.Error()
	case errors.As(err, &withheld):
		return http.StatusForbidden, audit.Withheld, withheld.Error()
	case errors.As(err, &limit) && limit.inBody:
		return http.StatusRequestEntityTooLarge, audit.Blocked, limit.Error()
	case errors.As(err, &limit):
		return http.StatusRequestHeaderFieldsTooLarge, audit.Blocked, limit.Error()
	case errors.As(err, &unscannable):
		return http.StatusBadGateway, audit.Blocked, unscannable.Error()
	case errors.As(err, new(upgradeRefusedError)):
		return http.StatusNotImplemented, audit.Blocked, upgradeRefusedError{}.Error()
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

// logFault logs a 5xx's cause. No error the proxy makes quotes a request's
// fields, URL or body once substituted (issue 12: an Upgrade refusal once
// did): its texts are static or name keys and hosts, and a real value is a
// secrets.Value, which prints as [redacted]. A *url.Error is unwrapped: its
// URL may hold a substituted value; any placeholder in the text is
// redacted. Edge's log writer redacts the values read besides
// (internal/redact).
//
// The lines are rate-limited per task, status and cause (the first, then
// a count a minute): the audit has every request, and a task sending
// request after request to an upstream that fails must not flood the log.
func (p *Proxy) logFault(status int, err error, task, host string) {
	if status < 500 {
		return
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	cause := redacted(p.reg.index.Load(), err.Error())
	p.faults.Error(fmt.Sprintf("%d %s %s %s", status, task, host, cause), "secrets proxy request failed",
		slog.String("task", task), slog.String("host", host), slog.Int("status", status), slog.String("error", cause))
}
