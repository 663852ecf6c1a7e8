package proxy

import (
	"crypto/subtle"
	"io"
	"net/http"
	"slices"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/egress"
)

// The tripwire (issue 31, item 5): a decision that shows a key escaping
// its bounds raises an alert (audit.Entry.Alert, egress's alert kinds),
// and a real value the proxy holds, sent by a task itself, blocks the
// request. A task has only placeholders; one that sends a real value found
// it somewhere (a file, a log, another run's output) and must not use it.
//
//   - foreign_placeholder: another run's placeholder, anywhere in a
//     request (blocked as ever).
//   - ungranted_domain: a placeholder of this run's, of a key granted to
//     it, toward a domain the key does not reach (blocked as ever): one
//     of its keys' domains on the wrong request, or a name no key reaches
//     that open egress intercepts to scrub.
//   - real_value_from_task: a value of FindMinLen bytes or more that edge's
//     redactor holds (every value the proxy read since edge started: each
//     request reads the values of its run's keys first), in any form it
//     knows (redact.Set: as is, lower-cased, JSON-escaped, Go-quoted,
//     percent-encoded, inside base64), in the method, the request target
//     (raw and percent-decoded), a field name (lower-cased) or value, the
//     body or a WebSocket message of a request to an intercepted
//     authority, or in a connection's target (a CONNECT's, or the name a
//     redirected connection's pin stands for). The request is refused 403
//     (blocked, reason real_value_from_task) before anything of it is
//     sent, save a streamed body: its head and the bytes before the value
//     have gone, so the upstream gets a body cut short with its
//     connection, and never a byte of the value (tripReader). The key is
//     named in the audit when a registered run knows the value; the task
//     is told nothing of which.
//
// What is not scanned: a tunnel (egress open, a run holding no key an
// upstream may store), whose bytes the proxy does not read; a value cut
// in pieces, or encoded otherwise (upper-cased, hex, compressed, split
// across two fields or two aws-chunked chunks); a value the proxy has not
// read since edge started.

// RealValues finds the real values edge holds in what a task sends.
// *redact.Set, edge's log redactor, satisfies it. Its methods are safe for
// concurrent use and called on a request's goroutines (its head's, its
// streamed body's, a WebSocket's relay).
type RealValues interface {
	// Find reports a value b holds, in a form a request may carry it.
	Find(b []byte) (secrets.Value, bool)
	// Pending is how many of b's last bytes may begin such a form: a
	// stream holds them back until more bytes come.
	Pending(b []byte) int
	// Redact returns b with every value, in every form, replaced: what
	// the audit entry of a refused request keeps of its target.
	Redact(b []byte) []byte
}

var _ RealValues = (*redact.Set)(nil)

// refuseRealValue: a real value sent by the task (403, blocked, alerted),
// key the one whose value it is when known. The reason names nothing.
func refuseRealValue(key policy.KeyRef) *refusal {
	return &refusal{status: http.StatusForbidden, action: audit.Blocked, reason: egress.AlertRealValue,
		key: key, alert: egress.AlertRealValue}
}

// placeholderAlert is the alert a refused placeholder raises: whose it is
// (owner, a run id) and its key, toward target, for task with granted.
// Another run's: foreign_placeholder; this run's, of a key granted to it
// that does not reach target: ungranted_domain; "" for any other refusal
// (a key no longer granted: a policy change, not an escape; a location its
// key does not allow, toward a domain it reaches).
func placeholderAlert(task, owner string, ref policy.KeyRef, granted []policy.Granted, target policy.Authority) string {
	if owner != task {
		return egress.AlertForeignPlaceholder
	}
	i := slices.IndexFunc(granted, func(g policy.Granted) bool { return g.Ref == ref })
	if i < 0 {
		return ""
	}
	if d, ok := target.Domain(); !ok || !granted[i].Reaches(d) {
		return egress.AlertUngrantedDomain
	}
	return ""
}

// blocked refuses a placeholder where policy forbids it (refuseBlocked),
// with the alert it raises.
func (st *requestState) blocked(reason, owner string, ref policy.KeyRef) *refusal {
	r := refuseBlocked(reason, ref)
	r.alert = placeholderAlert(st.runID(), owner, ref, st.grants.granted, st.ci.target)
	return r
}

// tripHead looks for a real value in what the task sent of a request's
// head: its method, Host, target as sent and percent-decoded, and every
// field, its name lower-cased (names arrive canonicalised, and the Set
// knows a value lower-cased). The parts are joined by line breaks, which
// no field and no parsed target holds, into scratch the request keeps.
func (st *requestState) tripHead(r *http.Request) *refusal {
	values := st.p.cfg.RealValues
	if values == nil {
		return nil
	}
	// One allocation for a common head where the request's state is new
	// (HTTP/2's); an HTTP/1.1 connection's requests reuse it.
	b := append(slices.Grow(st.tripBuf[:0], 1024), r.Method...)
	b = append(append(b, '\n'), r.Host...)
	b = append(append(b, '\n'), r.RequestURI...)
	b = append(append(b, '\n'), r.URL.Path...)
	if q := unescapeLenient(r.URL.RawQuery); q != r.URL.RawQuery {
		b = append(append(b, '\n'), q...)
	}
	for name, vs := range r.Header {
		b = append(append(b, '\n'), name...)
		lowerASCII(b[len(b)-len(name):])
		for _, v := range vs {
			b = append(append(b, '\n'), v...)
		}
	}
	st.tripBuf = b
	if v, ok := values.Find(b); ok {
		return st.awsShaped(refuseRealValue(st.p.keyOf(v)), r)
	}
	return nil
}

// awsShaped has refused answered as r's AWS service answers errors when r
// may be SigV4-signed (respondAWS), so the task's AWS tool shows why.
func (st *requestState) awsShaped(refused *refusal, r *http.Request) *refusal {
	if mayBeAWSSigned(r) {
		refused.awsShape = awsErrorShapeOf(r, st.ci.target.Name)
	}
	return refused
}

func lowerASCII(b []byte) {
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
}

// tripWhole looks for a real value in a body or message read whole; nil
// when it holds none.
func (st *requestState) tripWhole(b []byte) *refusal {
	if values := st.p.cfg.RealValues; values != nil {
		if v, ok := values.Find(b); ok {
			return refuseRealValue(st.p.keyOf(v))
		}
	}
	return nil
}

// tripStream is body with the tripwire on it, for a body that streams: a
// value found is the request's refusal, kept as a substitution's is, and
// answered in shape.
func (st *requestState) tripStream(body io.Reader, shape awsErrorShape) io.Reader {
	if st.p.cfg.RealValues == nil {
		return body
	}
	return &tripReader{src: body, values: st.p.cfg.RealValues, found: func(v secrets.Value) error {
		refused := refuseRealValue(st.p.keyOf(v))
		refused.awsShape = shape
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.refuseLocked(refused)
	}}
}

// tripAWSBody has the tripwire look at the body of a request the proxy
// re-signs (resignAWS): at once when it was read whole to check its hash,
// as it streams otherwise (spooled, unsigned, aws-chunked: each chunk's
// data as the task framed it, re-signed).
func (st *requestState) tripAWSBody(r *http.Request) *refusal {
	if st.body != nil {
		if refused := st.tripWhole(st.body); refused != nil {
			return st.awsShaped(refused, r)
		}
		return nil
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = struct {
			io.Reader
			io.Closer
		}{st.tripStream(r.Body, awsErrorShapeOf(r, st.ci.target.Name)), r.Body}
	}
	return nil
}

// tripReader passes a streamed request body on only once the tripwire has
// looked at it: each read is scanned with the bytes held back from the
// last, and the bytes that may begin a value (RealValues.Pending) are held
// back again, so a value split across reads is found whole before any of
// it goes on. A value found stops the stream: every Read returns what
// found returned for it (the request keeps the refusal, and errRefused
// cuts the upstream's connection: writeBody), and nothing read with it
// goes on. What it holds back it passes on at the stream's end. A
// tripReader is read by one goroutine (the upstream body writer's).
type tripReader struct {
	src    io.Reader
	values RealValues
	found  func(secrets.Value) error
	// buf[off:] is read and not passed on yet: its first ready bytes are
	// scanned and may go, the rest is held back.
	buf        []byte
	off, ready int
	err        error
}

func (t *tripReader) Read(p []byte) (int, error) {
	for t.ready == 0 {
		if t.err != nil {
			return 0, t.err
		}
		t.fill()
	}
	n := copy(p, t.buf[t.off:t.off+t.ready])
	t.off += n
	t.ready -= n
	return n, nil
}

// fill reads more behind what is held back and decides it all.
func (t *tripReader) fill() {
	t.buf = t.buf[:copy(t.buf, t.buf[t.off:])]
	t.off = 0
	if cap(t.buf)-len(t.buf) < bodyChunk/2 {
		grown := make([]byte, len(t.buf), len(t.buf)+bodyChunk)
		copy(grown, t.buf)
		t.buf = grown
	}
	n, err := t.src.Read(t.buf[len(t.buf):cap(t.buf)])
	t.buf = t.buf[:len(t.buf)+n]
	if v, ok := t.values.Find(t.buf); ok {
		t.err, t.buf, t.ready = t.found(v), nil, 0
		return
	}
	if err != nil {
		t.err, t.ready = err, len(t.buf)
		return
	}
	t.ready = len(t.buf) - t.values.Pending(t.buf)
}

// tripTarget looks for a real value in a connection's target (a
// CONNECT's, a redirected connection's), which the tunnel or the
// interception that follows would send on (a name to resolve, a TLS
// server name).
func (p *Proxy) tripTarget(target string) *refusal {
	if p.cfg.RealValues == nil {
		return nil
	}
	if v, ok := p.cfg.RealValues.Find([]byte(target)); ok {
		return refuseRealValue(p.keyOf(v))
	}
	return nil
}

// keyOf is the key whose value v is, when a registered run knows it (every
// request learns its run's granted values before the tripwire looks: see
// learnGranted); zero otherwise (a value of a run since dropped).
func (p *Proxy) keyOf(v secrets.Value) policy.KeyRef {
	raw := []byte(v.Reveal())
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	for _, t := range p.reg.tasks {
		st := t.values.state.Load()
		if st == nil {
			continue
		}
		for _, k := range st.known {
			if subtle.ConstantTimeCompare(raw, []byte(k.secret.Value.Reveal())) == 1 {
				return k.ref
			}
		}
	}
	return policy.KeyRef{}
}

// alerted completes the audit entry of a refusal with its alert; a real
// value's refusal also has its host, method, path and query redacted of
// every value in every form here, where the value is known to be: the
// run's ledger is written from the entry, not through edge's log writer.
func (p *Proxy) alerted(e *audit.Entry, r *refusal) {
	e.Alert = r.alert
	if r.alert != egress.AlertRealValue || p.cfg.RealValues == nil {
		return
	}
	for _, s := range []*string{&e.Host, &e.Method, &e.Path, &e.Query} {
		if *s != "" {
			*s = string(p.cfg.RealValues.Redact([]byte(*s)))
		}
	}
}
