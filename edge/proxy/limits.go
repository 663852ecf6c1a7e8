package proxy

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/http1"
)

// The bounds on substitution, the same whatever protocol a request came in
// on (HTTP/1.1 or HTTP/2): what the upstream gets is always an HTTP/1.1
// request written by forward. Without them a task could have a value
// repeated as often as its head or body has room for a placeholder (a
// thousand times in one header was measured), which multiplies what the
// value does to what the upstream sees (its size against an upstream's
// limits gave the value's length exactly) and what edge spends on one
// request.
//
// No refusal here depends on a value: each is decided from what the task
// sent (its head's size, with the placeholders in it) and how many
// substitutions it asked for, both of which it knows. A bound checked on
// the substituted head would answer, with the task padding its head one
// byte at a time, how long a value is.
const (
	// maxSubstitutions bounds the substitutions in one request, all
	// locations together (fields, URL, body, a streamed body included),
	// and in one WebSocket message. A request to an API carries its key
	// once or twice (a header, perhaps the query); a body that lists
	// several credentials a few more. 32 is an order of magnitude above
	// that, and small enough that repeating a value cannot make much of
	// it: 32 copies of a value in a head already need its 64 KiB.
	maxSubstitutions = 32

	// headValueAllowance is what one substitution in the head may add to
	// it, over the placeholder it replaces: a long credential's room (a
	// JWT of a few KiB). A head is refused when its size as sent plus this
	// much per substitution in it exceeds maxHeadBytes, so the head
	// written upstream never does; a value longer than that is refused in
	// a head whatever the head's size.
	headValueAllowance = 4 << 10

	// headFraming covers the fields forward writes beyond the task's
	// (Accept-Encoding: identity, TE, Connection: Upgrade, Content-Length
	// or Transfer-Encoding), which headBytes does not count.
	headFraming = 128
)

// The reasons of the limits' refusals name the bound, never a size the
// request reached.
var (
	reasonTooManySubstitutions = "more than " + strconv.Itoa(maxSubstitutions) + " placeholders to substitute in one request"
	reasonHeadTooLarge         = fmt.Sprintf("request head too large: its size as sent, plus %d KiB for each placeholder substituted in it, is over %d KiB",
		headValueAllowance>>10, maxHeadBytes>>10)
	reasonHeadValueTooLong = fmt.Sprintf("a value substituted in the request head is longer than the %d KiB allowed for one", headValueAllowance>>10)
	// reasonHeadOverBound: a head as received over maxHeadBytes, refused by
	// the front (HTTP/1.1's reader, x/net/http2) before there is a request.
	reasonHeadOverBound = http1.ReasonHeadOverBound
)

// auditHeadOverBound records a head the front refused for its size (431)
// on an intercepted connection: nothing of the request is known, or
// recorded, but its connection's task and host.
func (p *Proxy) auditHeadOverBound(ci *connInfo) {
	p.cfg.Audit.Record(audit.Entry{TS: p.cfg.Clock.Now(), Task: ci.attempt.task.runID, Host: ci.logHost, Via: ci.via,
		Action: audit.Denied, Status: http.StatusRequestHeaderFieldsTooLarge, Reason: reasonHeadOverBound})
}

// countSubstitution counts one more substitution of key, or refuses it
// past maxSubstitutions (413 for one in the body, else 431). st.mu is held.
func (st *requestState) countSubstitution(loc policy.Location, key policy.KeyRef) *refusal {
	if st.substituted >= maxSubstitutions {
		return refuseLimit(loc == policy.InBody, reasonTooManySubstitutions, key)
	}
	st.substituted++
	return nil
}

// checkHead bounds the head forward will write, once the method, fields
// and URL are substituted: sent is headBytes of the head as the task sent
// it, n the substitutions made in it.
func (st *requestState) checkHead(r *http.Request, sent int) *refusal {
	st.mu.Lock()
	n := st.substituted
	st.mu.Unlock()
	bound := sent + n*headValueAllowance
	switch {
	case bound > maxHeadBytes:
		return refuseLimit(false, reasonHeadTooLarge, policy.KeyRef{})
	case n > 0 && headBytes(r, st.ci) > bound:
		return refuseLimit(false, reasonHeadValueTooLong, policy.KeyRef{})
	}
	return nil
}

// headBytes is the size of the head forward writes upstream for r (request
// line, Host, the fields that go on; an end-to-end field counted as sent),
// with headFraming for what forward adds (http1.WriteRequestHead). A field it drops anyway that is
// counted errs on the side of the bound.
func headBytes(r *http.Request, ci *connInfo) int {
	host := len(ci.hostHeader)
	if host == 0 {
		host = len(ci.target.HostHeader())
	}
	n := len(r.Method) + len(" ") + http1.TargetLen(r.URL) + len(" HTTP/1.1\r\nHost: ") + host + len("\r\n\r\n") + headFraming
	connection := r.Header["Connection"]
	for k, vs := range r.Header {
		if k == "Host" || !http1.EndToEnd(k, connection) {
			continue
		}
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}
