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

// A refusal is a decision not to serve a request, or to stop one: the
// status the task sees, the audit action, the reason shown, the fields its
// answer must carry and the key it concerns. Its reason is static or built
// from parsed, redacted parts: never what a task sent as it is. Decisions
// return one and their callers act on it as it is; a substitution refused
// inside a scan is kept in the request's state (requestState.refused) while
// the scan stops with errRefused.
type refusal struct {
	status int
	action audit.Action
	reason string
	// header holds the fields the answer must carry (RFC 9110 11.7.1,
	// 15.5.6); nil for none.
	header http.Header
	// key is the key the refusal concerns, zero for none.
	key policy.KeyRef
	// rule names the request rule that refused (policy.DecideRequest),
	// "" for none.
	rule string
	// alert is the egress alert kind the refusal raises (tripwire.go),
	// empty for none.
	alert string
	// cause is what failed, logged (logFault) and never shown: a fault of
	// ours or the upstream exchange's error; nil for a decision.
	cause error
	// cancelled: the request was cancelled, so nobody waits for an answer.
	cancelled bool
	// awsShape: the refusal of a SigV4 request, answered as its service
	// answers errors (respondAWS); awsErrNone otherwise.
	awsShape awsErrorShape
}

// errRefused stops a scan or a body stream whose substitution was refused;
// the refusal itself is the request's (requestState.refused).
var errRefused = errors.New("refused")

// Refusals of a CONNECT, or of a request on an intercepted connection,
// before anything is decided about placeholders.

// refuseCredentials: no live attempt's credential (407, with
// Proxy-Authenticate): missing, unknown, revoked, or the attempt ended.
func refuseCredentials(reason string) *refusal {
	return &refusal{status: http.StatusProxyAuthRequired, action: audit.Denied, reason: reason,
		header: http.Header{"Proxy-Authenticate": {`Basic realm="runfleet edge"`}}}
}

// refuseMethod: a method edge does not serve there (405, with Allow when
// allow is set): anything but CONNECT at the proxy, CONNECT on an
// intercepted connection.
func refuseMethod(reason, allow string) *refusal {
	r := &refusal{status: http.StatusMethodNotAllowed, action: audit.Denied, reason: reason}
	if allow != "" {
		r.header = http.Header{"Allow": {allow}}
	}
	return r
}

// refuseBadRequest: a CONNECT target, a method or an Upgrade that does not
// parse (400).
func refuseBadRequest(reason string) *refusal {
	return &refusal{status: http.StatusBadRequest, action: audit.Denied, reason: reason}
}

// refuseTarget: the CONNECT decision refused the target (403).
func refuseTarget(reason string) *refusal {
	return &refusal{status: http.StatusForbidden, action: audit.Denied, reason: reason}
}

// refuseMisdirected: a request does not name the CONNECT's authority (421).
func refuseMisdirected(reason string) *refusal {
	return &refusal{status: http.StatusMisdirectedRequest, action: audit.Denied, reason: reason}
}

// Refusals about placeholders and what may carry them.

// refuseBlocked: a placeholder where policy forbids it (403). The reason
// names keys and hosts, never a value or a placeholder.
func refuseBlocked(reason string, key policy.KeyRef) *refusal {
	return &refusal{status: http.StatusForbidden, action: audit.Blocked, reason: "blocked: " + reason, key: key}
}

// refuseWithheld: the source has no value for a key the request needs
// (403).
func refuseWithheld(key policy.KeyRef) *refusal {
	return &refusal{status: http.StatusForbidden, action: audit.Withheld, reason: "withheld: no value for " + key.String(), key: key}
}

// withheldRetryAfter is the Retry-After of a request waiting for a value
// from Fleet, in seconds: Fleet's sweep, which sends a run's missing
// values, passes every minute.
const withheldRetryAfter = "60"

// refuseAwaitingFleet: the run holds no value from Fleet it may use for a
// key the policy takes from Fleet (an edge restart lost it, or it expired;
// expired says which) (503, with Retry-After: Fleet's next pass sends it).
// The request is never sent with the placeholder in the value's place.
func refuseAwaitingFleet(key policy.KeyRef, expired bool) *refusal {
	reason := "withheld: this run holds no value of " + key.String() + " yet; Fleet sends it on its next pass"
	if expired {
		reason = "withheld: the value of " + key.String() + " this run holds has expired; Fleet sends a fresh one on its next pass"
	}
	return &refusal{status: http.StatusServiceUnavailable, action: audit.Withheld, reason: reason, key: key,
		header: http.Header{"Retry-After": {withheldRetryAfter}}}
}

// refuseLimit: a request past a bound on substitution (limits.go): 431
// when the head would grow past it, 413 when the body's substitutions do.
// The reason names the bound, never a size the request reached.
func refuseLimit(inBody bool, reason string, key policy.KeyRef) *refusal {
	status := http.StatusRequestHeaderFieldsTooLarge
	if inBody {
		status = http.StatusRequestEntityTooLarge
	}
	return &refusal{status: status, action: audit.Blocked, reason: reason, key: key}
}

// refuseUnscannable: an answer to a request that carried a real value
// comes content-coded (compressed) although the proxy asked for it
// uncoded, or a WebSocket with an extension, so it cannot be scrubbed of
// the value; the task does not get it (502).
func refuseUnscannable() *refusal {
	return &refusal{status: http.StatusBadGateway, action: audit.Blocked,
		reason: "the upstream's answer is content-coded (compressed) and cannot be scanned for the values put into the request"}
}

// refuseUpgrade: a request asks to switch to a protocol the proxy cannot
// parse on an intercepted connection (501, audited as blocked, as an
// answer that cannot be scanned is: its bytes may carry a value).
func refuseUpgrade() *refusal {
	return &refusal{status: http.StatusNotImplemented, action: audit.Blocked,
		reason: "only websocket may be upgraded to on an intercepted connection"}
}

// fault: something of ours failed (the secrets source, a value that cannot
// be sent) for key (zero for none). Logged, never shown (500).
func fault(err error, key policy.KeyRef) *refusal {
	return &refusal{status: http.StatusInternalServerError, action: audit.Denied, reason: "internal error",
		key: key, cause: fmt.Errorf("proxy fault: %w", err)}
}

// isFault reports whether r is a fault of ours rather than a decision.
func (r *refusal) isFault() bool { return r.status == http.StatusInternalServerError }

// exchangeFailed maps the error an upstream dial or exchange met to what
// the task sees: the guard's refusal of the address, no uplink to resolve
// the name, a cancelled request, or an unreachable upstream. It is the one
// place error kinds become statuses.
func exchangeFailed(err error) *refusal {
	r := &refusal{status: http.StatusBadGateway, action: audit.Denied, reason: "upstream unreachable", cause: err}
	var refused *upstream.RefusedError
	switch {
	case errors.As(err, &refused):
		r.status, r.reason = http.StatusForbidden, "upstream refused: "+refused.Verdict.Reason
	case errors.Is(err, upstream.ErrNoUplink):
		r.reason = "upstream name not resolvable: no uplink DNS server"
	case errors.Is(err, context.Canceled):
		r.reason = "request cancelled"
	}
	r.cancelled = r.status == http.StatusBadGateway && errors.Is(err, context.Canceled)
	return r
}

// logFault logs a 5xx's cause (its reason when it has none). No cause the
// proxy makes quotes a request's fields, URL or body once substituted
// (an Upgrade refusal once did): its texts are static or name
// keys and hosts, and a real value is a secrets.Value, which prints as
// [redacted]. A *url.Error is unwrapped: its URL may hold a substituted
// value; any placeholder in the text is redacted. Edge's log writer redacts
// the values read besides (internal/redact).
//
// The lines are rate-limited per task, status and cause (the first, then
// a count a minute): the audit has every request, and a task sending
// request after request to an upstream that fails must not flood the log.
func (p *Proxy) logFault(r *refusal, task, host string) {
	// A request waiting for a value from Fleet is no fault: its audit line
	// says so, and the run's missingCredentials names the key.
	if r.status < 500 || r.action == audit.Withheld {
		return
	}
	text := r.reason
	if err := r.cause; err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		text = err.Error()
	}
	cause := p.reg.index.Load().Redacted(text)
	p.faults.Error(fmt.Sprintf("%d %s %s %s", r.status, task, host, cause), "secrets proxy request failed",
		slog.String("task", task), slog.String("host", host), slog.Int("status", r.status), slog.String("error", cause))
}
