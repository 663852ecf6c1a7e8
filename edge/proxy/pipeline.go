package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/http1"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/runspec"
)

// pipeline is the one request handler of intercepted connections, HTTP/1.1
// and HTTP/2 alike: authority check, scan and decide, substitute, forward.
// HTTP/2 (x/net/http2) reaches it as an http.Handler; the HTTP/1.1 loop calls
// serve with the connection's connInfo in hand.
type pipeline struct{ p *Proxy }

func (h pipeline) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	watch := newCancelWatch(r.Context())
	defer watch.release()
	st := new(requestState)
	st.reset(h.p, connInfoFrom(r.Context()), watch, r.Context())
	h.p.serve(st, w, r)
}

// requestState is one request's decisions. The request's goroutine (serve,
// forward) owns it, with two exceptions, both under mu: the fields after mu
// are also written by substitute, which a streamed request body's scanner
// calls on the upstream body writer's goroutine (roundtrip.go writeBody),
// and a WebSocket's task-to-upstream relay goroutine (websocket.go); the
// audit entry's byte counts are added once both relay goroutines ended.
type requestState struct {
	p      *Proxy
	ci     *connInfo
	ctx    context.Context
	watch  *cancelWatch
	grants *grants
	// out is what the task is sent, counted.
	out countingWriter
	// body is the request body when it was read whole (and scanned): the
	// forwarder writes it with the head, on this goroutine.
	body []byte
	// ms is scratch for the scanner's matches; tripBuf for the head the
	// tripwire scans (tripHead).
	ms      []placeholder.Match
	tripBuf []byte
	// entry is the request's audit line, recorded by record; bodyIn counts
	// the request body read.
	entry  audit.Entry
	bodyIn *countingReader
	// streamSubs: the body streams through the scanner and a key may be
	// substituted in it, so values may still be put in while the answer
	// comes back.
	streamSubs bool
	// upBody is the upstream's answer body.
	upBody upBody
	// scrub takes the request's values out of the answer; scrubbed counts
	// the values it replaced.
	scrub    placeholder.Scrubber
	scrubbed int

	mu      sync.Mutex
	subs    []substitution // the request's keys, each value read once (learnGranted)
	subsBuf [4]substitution
	// aws is the real credentials of the task's aws keys, read once
	// (learnGranted).
	aws []awsRead
	// spool holds a SigV4 request's body read whole to check its hash
	// (hashAWSBody); closed when the request is done.
	spool *os.File
	// refused is the request's first refusal of a substitution, or of the
	// exchange once forwarded; nil while none.
	refused  *refusal
	status   int
	upStart  time.Time
	upstream time.Duration

	// substituted counts the occurrences substituted (limits.go); under mu.
	substituted int
	// rules are the request rules' decisions (rules.go); under mu.
	rules ruleState
}

// substitution is one key of a request (a granted one, or one it met): its
// real value, read from the secrets source once per request, the task's
// placeholder for it, and whether it was put in.
type substitution struct {
	ref         policy.KeyRef
	value       secrets.Value
	placeholder string
	used        bool
}

// reset readies st for a request, keeping its scratch space: an HTTP/1.1
// connection reuses one for all its requests.
func (st *requestState) reset(p *Proxy, ci *connInfo, watch *cancelWatch, ctx context.Context) {
	*st = requestState{p: p, ci: ci, ctx: ctx, watch: watch, ms: st.ms[:0], tripBuf: st.tripBuf[:0]}
	st.subs = st.subsBuf[:0]
}

// scrubsAnswer reports whether the answer may hold a real value: the run
// knows one, or the streamed body may still put one in.
func (st *requestState) scrubsAnswer() bool {
	if st.Set().Len() > 0 {
		return true
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.streamSubs
}

// Set is the run's values, for the answer's scrubber: substitute learns
// each before it is spliced into what goes upstream, so the scrubber knows
// it before an upstream can echo it.
func (st *requestState) Set() *placeholder.Set { return st.ci.attempt.task.values.Set() }

var _ placeholder.Source = (*requestState)(nil)

func (st *requestState) runID() string { return st.ci.attempt.task.runID }

// substitute decides one occurrence (policy.DecideSubstitution) and returns
// the real value, read once per request from where the policy takes it
// (grantedValue).
func (st *requestState) substitute(o placeholder.Owner, loc policy.Location) (string, error) {
	d := policy.DecideSubstitution(policy.SubstituteInput{
		Task: st.runID(), Authority: st.ci.target, Granted: st.grants.granted,
		Occurrence: policy.Occurrence{Owner: o.Task, Ref: o.Ref, Location: loc},
	})
	st.mu.Lock()
	defer st.mu.Unlock()
	if !d.Allow {
		return "", st.refuseLocked(st.blocked(d.Reason, o.Task, o.Ref))
	}
	if r := st.ruleRefusalLocked(o.Ref); r != nil {
		return "", st.refuseLocked(r)
	}
	if r := st.countSubstitution(loc, o.Ref); r != nil {
		return "", st.refuseLocked(r)
	}
	i := 0
	for i < len(st.subs) && st.subs[i].ref != o.Ref {
		i++
	}
	if i == len(st.subs) {
		g := st.grants.index(o.Ref)
		if g < 0 {
			// DecideSubstitution allows only a granted key.
			return "", st.refuseLocked(fault(fmt.Errorf("%s allowed but not granted", o.Ref), o.Ref))
		}
		gr := &st.grants.granted[g]
		t := st.ci.attempt.task
		v, err := st.p.grantedValue(st.ctx, t, gr)
		switch {
		case errors.Is(err, errAwaitingFleet):
			return "", st.refuseLocked(refuseAwaitingFleet(o.Ref, errors.Is(err, errFleetValueExpired)))
		case errors.Is(err, secrets.ErrNotFound):
			return "", st.refuseLocked(refuseWithheld(o.Ref))
		case err != nil:
			return "", st.refuseLocked(fault(fmt.Errorf("reading %s: %w", o.Ref, err), o.Ref))
		}
		t.values.learn(learntGranted(gr, o.Placeholder, v))
		st.subs = append(st.subs, substitution{ref: o.Ref, value: v, placeholder: o.Placeholder})
	}
	// The value leaves its type here, to be spliced into what goes upstream.
	v := st.subs[i].value.Reveal()
	if loc == policy.InHeader && strings.ContainsAny(v, "\r\n\x00") {
		return "", st.refuseLocked(fault(fmt.Errorf("the value of %s cannot be sent in a header", o.Ref), o.Ref))
	}
	st.subs[i].used = true
	return v, nil
}

// refuseLocked keeps r as the request's refusal unless it has one already,
// and returns errRefused to stop the scan that met it. st.mu is held.
func (st *requestState) refuseLocked(r *refusal) error {
	if st.refused == nil {
		st.refused = r
	}
	return errRefused
}

// refusal is the refusal that stopped a scan with err: the one the
// request keeps (refuseLocked).
func (st *requestState) refusal(err error) *refusal {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.refused == nil {
		// Every Substituter error is a kept refusal; a fault otherwise.
		return fault(err, policy.KeyRef{})
	}
	return st.refused
}

// usedKeys names the keys put into the request, sorted, for the audit line.
// One key, the common case, is named by the grant's own slice.
func (st *requestState) usedKeys() []string {
	var out []string
	for _, s := range st.subs {
		if !s.used {
			continue
		}
		if len(out) == 0 {
			if i := st.grants.index(s.ref); i >= 0 {
				out = st.grants.names[i : i+1 : i+1]
				continue
			}
		}
		out = append(out, s.ref.String())
	}
	sort.Strings(out)
	return out
}

// grants is a task's grant under one policy. Grant is a pure function of the
// policy and the task's declaration, so its result holds while both are the
// ones in force: the policy is still looked up per request, and a reload
// applies to the next request.
type grants struct {
	policy   *policy.Policy
	declared []runspec.Declared
	granted  []policy.Granted
	names    []string // granted[i].Ref.String(), for audit lines
}

func (g *grants) index(ref policy.KeyRef) int {
	for i := range g.granted {
		if g.granted[i].Ref == ref {
			return i
		}
	}
	return -1
}

// grantsUnder returns the task's grant under pol, computed once per policy
// (and declaration) in force.
func (t *task) grantsUnder(pol *policy.Policy) *grants {
	declared := t.declared
	if g := t.grants.Load(); g != nil && g.policy == pol && sameSlice(g.declared, declared) {
		return g
	}
	granted, _ := pol.Grant(declared)
	g := &grants{policy: pol, declared: declared, granted: granted, names: make([]string, len(granted))}
	for i := range granted {
		g.names[i] = granted[i].Ref.String()
	}
	t.grants.Store(g)
	return g
}

// sameSlice: the very same declaration, not an equal one (Register replaces
// the slice; it never changes one in place).
func sameSlice(a, b []runspec.Declared) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// serve runs the pipeline for one request on an intercepted connection,
// with st freshly reset for it. The request's audit line is recorded before
// serve returns, so before the task has the whole answer: a decision is on
// record before its effect is seen.
func (p *Proxy) serve(st *requestState, w http.ResponseWriter, r *http.Request) {
	p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	ix := p.reg.index.Load()
	ci := st.ci
	st.out.ResponseWriter = w
	entry := &st.entry
	*entry = audit.Entry{TS: p.cfg.Clock.Now(), Task: st.runID(), Host: ci.logHost, Method: ix.Redacted(r.Method), Path: ix.RedactedExact(r.URL.Path, &st.ms), Query: maskedQuery(ix, r.URL.RawQuery), Via: ci.via}
	defer p.record(st) // also when the answer is aborted (a panic on HTTP/2)
	defer st.closeSpool()
	if refused := p.prepare(st, ix, r); refused != nil {
		p.refuse(st, refused)
		return
	}
	st.upStart = p.cfg.Clock.Now()
	defer st.settle() // also when the answer is aborted (a panic on HTTP/2)
	p.forward(r, st)
}

// prepare decides r and readies it for the upstream: the attempt still
// live, the authority the CONNECT's, the method one that may be sent, and
// the placeholders in its head, URL and body substituted as the policy
// allows, within the bounds of limits.go. nil when it may go.
func (p *Proxy) prepare(st *requestState, ix *placeholder.Index, r *http.Request) *refusal {
	ci := st.ci
	if !ci.attempt.live() {
		return refuseCredentials("the attempt ended")
	}
	if refused := misdirected(ci, r); refused != nil {
		return refused
	}
	if r.Method == http.MethodConnect {
		return refuseMethod("CONNECT inside an intercepted connection", "")
	}
	if !http1.IsToken(r.Method) {
		// The request line is written as the method reads.
		return refuseBadRequest("malformed method")
	}
	st.grants = ci.attempt.task.grantsUnder(p.cfg.Policy.Current())
	st.learnGranted()
	if refused := st.tripHead(r); refused != nil {
		return refused
	}
	st.noteRuleInput(r)
	if refused := st.checkMethod(ix, r.Method); refused != nil {
		return refused
	}
	sent := headBytes(r, ci)
	if handled, refused := st.resignAWS(r); handled || refused != nil {
		if refused != nil {
			return refused
		}
		if refused := st.tripAWSBody(r); refused != nil {
			return refused
		}
		return st.checkHead(r, sent)
	}
	if err := st.rewriteHeaders(ix, r.Header); err != nil {
		return st.refusal(err)
	}
	if refused := st.rewriteURL(ix, r.URL); refused != nil {
		return refused
	}
	if refused := st.checkHead(r, sent); refused != nil {
		return refused
	}
	if r.Body != nil && r.Body != http.NoBody {
		st.bodyIn = &countingReader{r: r.Body}
		r.Body = st.bodyIn
		return st.prepareBody(ix, r, p.cfg.BodyBufferLimit)
	}
	return nil
}

// refuse answers a request refused before anything reached the upstream,
// and ends the connection.
func (p *Proxy) refuse(st *requestState, refused *refusal) {
	entry := &st.entry
	if refused.key != (policy.KeyRef{}) {
		entry.Keys = []string{refused.key.String()}
	}
	p.logFault(refused, entry.Task, st.ci.logHost)
	entry.Action, entry.Status, entry.Reason, entry.Rule = refused.action, refused.status, refused.reason, refused.rule
	p.alerted(entry, refused)
	h := st.out.Header()
	for k, vs := range refused.header {
		h[k] = vs
	}
	h.Set("Connection", "close")
	respondRefusal(&st.out, refused)
}

// settle completes the audit entry of a request that was forwarded: the
// upstream's status and time, the keys put in, the action.
func (st *requestState) settle() {
	st.mu.Lock()
	defer st.mu.Unlock()
	entry := &st.entry
	entry.Status = st.status
	entry.Upstream = st.upstream
	entry.Keys = st.usedKeys()
	switch {
	case st.refused != nil:
		entry.Action, entry.Reason = st.refused.action, st.refused.reason
		st.p.alerted(entry, st.refused)
		if st.refused.key != (policy.KeyRef{}) {
			entry.Keys = []string{st.refused.key.String()}
		}
	case entry.Action != "":
	case len(entry.Keys) > 0:
		entry.Action = audit.Substituted
	default:
		entry.Action = audit.Forwarded
	}
	st.ruleOutcomeLocked(entry)
	if st.status == 0 {
		entry.Status = st.out.status
	}
}

// record writes the request's audit line with its byte counts and
// duration.
func (p *Proxy) record(st *requestState) {
	e := &st.entry
	if st.bodyIn != nil {
		e.BytesIn = st.bodyIn.n.Load()
	}
	e.BytesOut = st.out.n
	e.Scrubbed = st.scrubbed
	e.Duration = p.cfg.Clock.Now().Sub(e.TS)
	p.cfg.Audit.Record(*e)
}

// misdirected refuses a request that does not name the CONNECT's
// authority, saying why; nil when it does: the TLS server name, an
// absolute-form URL and the Host (HTTP/2's :authority) must all name it.
func misdirected(ci *connInfo, r *http.Request) *refusal {
	if !ci.sniOK {
		return refuseMisdirected("the TLS server name does not name the CONNECT's host")
	}
	if r.URL.Host != "" || r.URL.Scheme != "" {
		if r.URL.Scheme != "https" {
			return refuseMisdirected("an absolute URL must be https")
		}
		if !ci.names(r.URL.Host) {
			return refuseMisdirected("the request URL names another authority than the CONNECT")
		}
	}
	if r.Host == "" {
		return refuseMisdirected("no Host")
	}
	if !ci.names(r.Host) {
		return refuseMisdirected("the Host names another authority than the CONNECT")
	}
	return nil
}

// checkMethod blocks a placeholder sent as the method (in any case): no key
// is substituted there, and it would reach the upstream as it is.
func (st *requestState) checkMethod(ix *placeholder.Index, method string) *refusal {
	ms := ix.FindFolded(method, st.ms)
	st.ms = ms
	if len(ms) == 0 {
		return nil
	}
	return st.blocked("a placeholder in the method", ms[0].Owner.Task, ms[0].Owner.Ref)
}

// rewriteHeaders substitutes placeholders in header values (Basic
// credentials decoded and re-encoded); one in a header name blocks.
func (st *requestState) rewriteHeaders(ix *placeholder.Index, h http.Header) error {
	for name, values := range h {
		// Field names are case-insensitive (and canonicalised on the way
		// in): a placeholder in one is found in any case.
		if ms := ix.FindFolded(name, st.ms); len(ms) > 0 {
			st.ms = ms
			st.mu.Lock()
			defer st.mu.Unlock()
			return st.refuseLocked(st.blocked("a placeholder in a header name", ms[0].Owner.Task, ms[0].Owner.Ref))
		}
		for i, v := range values {
			out, n, err := ix.RewriteString(v, policy.InHeader, st.substitute, &st.ms)
			if err != nil {
				return err
			}
			if n > 0 {
				values[i] = out
				v = out
			}
			if name == "Authorization" || name == "Proxy-Authorization" {
				if nv, err := ix.RewriteBasic(v, st.substitute); err != nil {
					return err
				} else if nv != "" {
					values[i] = nv
				}
			}
		}
	}
	return nil
}

// rewriteURL substitutes in the path and the query, escaping the value for
// where it goes. A placeholder that appears only once percent-decoded is
// decided too, so an encoded one cannot slip past a block.
func (st *requestState) rewriteURL(ix *placeholder.Index, u *url.URL) *refusal {
	escaped := u.EscapedPath()
	path, n, err := ix.RewriteString(escaped, policy.InURL, func(o placeholder.Owner, loc policy.Location) (string, error) {
		v, err := st.substitute(o, loc)
		return url.PathEscape(v), err
	}, &st.ms)
	if err != nil {
		return st.refusal(err)
	}
	if n > 0 {
		unescaped, err := url.PathUnescape(path)
		if err != nil {
			return fault(errors.New("substituted path does not unescape"), policy.KeyRef{})
		}
		u.Path, u.RawPath = unescaped, path
	}
	query, n, err := ix.RewriteString(u.RawQuery, policy.InURL, func(o placeholder.Owner, loc policy.Location) (string, error) {
		v, err := st.substitute(o, loc)
		return url.QueryEscape(v), err
	}, &st.ms)
	if err != nil {
		return st.refusal(err)
	}
	if n > 0 {
		u.RawQuery = query
	}
	for _, encoded := range [2]string{escaped, u.RawQuery} {
		if decoded := unescapeLenient(encoded); decoded != encoded {
			st.ms = ix.FindString(decoded, st.ms)
			if len(st.ms) == 0 {
				continue
			}
			// Decided, not substituted: counted apart, from zero, so a
			// placeholder the raw form already had is not counted
			// twice, and the request's count is as it was after.
			st.mu.Lock()
			counted := st.substituted
			st.substituted = 0
			st.mu.Unlock()
			for _, m := range st.ms {
				if _, err = st.substitute(m.Owner, policy.InURL); err != nil {
					break
				}
			}
			st.mu.Lock()
			st.substituted = counted
			st.mu.Unlock()
			if err != nil {
				return st.refusal(err)
			}
		}
	}
	return nil
}

// prepareBody scans the body: read whole when small and sized (a block then
// sends nothing), streamed through the bounded scanner otherwise. When a key
// may be substituted in this body its length may change, so it is sent
// without a length (chunked on HTTP/1.1).
func (st *requestState) prepareBody(ix *placeholder.Index, r *http.Request, limit int64) *refusal {
	mayChange := false
	if d, ok := st.ci.target.Domain(); ok {
		for _, g := range st.grants.granted {
			mayChange = mayChange || (g.In&policy.InBody != 0 && g.Reaches(d))
		}
	}
	if r.ContentLength > 0 && r.ContentLength <= limit {
		buf := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			return fault(errors.New("request body shorter than its Content-Length"), policy.KeyRef{})
		}
		if refused := st.tripWhole(buf); refused != nil {
			return refused
		}
		out, _, err := ix.Rewrite(buf, policy.InBody, st.substitute)
		if err != nil {
			return st.refusal(err)
		}
		st.body = out
		r.Body = io.NopCloser(bytes.NewReader(out))
		r.ContentLength = int64(len(out))
		return nil
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{placeholder.NewScanner(st.tripStream(r.Body, awsErrNone), ix, st.substitute), r.Body}
	if mayChange {
		r.ContentLength = -1
		st.streamSubs = true
	}
	return nil
}

// answered records the upstream's answer, and refuses to pass on an answer
// to a request the body scanner stopped: whatever the upstream made of a
// body cut short is not the task's.
func (st *requestState) answered(status int) *refusal {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.status = status
	st.upstream = st.p.cfg.Clock.Now().Sub(st.upStart)
	return st.refused
}

// upstreamError answers a request whose exchange with the upstream failed
// with err (exchangeFailed).
func (p *Proxy) upstreamError(st *requestState, err error) {
	p.failForwarded(st, exchangeFailed(err))
}

// failForwarded answers a forwarded request that cannot be passed on: with
// the request's own refusal if it has one (a block found while the body
// streamed), else with refused.
func (p *Proxy) failForwarded(st *requestState, refused *refusal) {
	// A stopped task's request failed because of the stop, whatever the
	// upstream side saw (its connection dropped, a read cut short): it is
	// recorded as cancelled and its answer aborted, never sent.
	stopped := !st.ci.attempt.live()
	st.mu.Lock()
	if st.refused != nil {
		refused = st.refused
	} else if stopped {
		refused = exchangeFailed(context.Canceled)
	}
	st.status = refused.status
	if st.refused == nil && refused.action != audit.Denied {
		st.refused = refused
	}
	// The line keeps its action (a value that went upstream was
	// substituted, whatever became of the exchange) and says why it
	// failed.
	st.entry.Reason = refused.reason
	st.mu.Unlock()
	p.logFault(refused, st.runID(), st.ci.logHost)
	if stopped || refused.cancelled {
		// Nobody waits for an answer (the task stopped or went away); a
		// handler that wrote nothing would otherwise answer 200.
		abort(&st.out, st)
		return
	}
	respondRefusal(&st.out, refused)
}

// respondRefusal answers refused: as an AWS service answers an error when
// the refusal is of a SigV4 request (so the task's AWS tool shows its
// reason), in plain text otherwise.
func respondRefusal(w http.ResponseWriter, refused *refusal) {
	if refused.awsShape != awsErrNone {
		respondAWS(w, refused)
		return
	}
	respond(w, refused.status, refused.reason)
}

func respond(w http.ResponseWriter, status int, reason string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	io.WriteString(w, "runfleet edge: "+reason+"\n")
}

// countingWriter counts what the task is sent and the status it is given.
type countingWriter struct {
	http.ResponseWriter
	n      int64
	status int
}

func (c *countingWriter) WriteHeader(code int) {
	if c.status == 0 && code >= 200 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

// countingReader counts the request body read; the upstream body writer
// may read it on its own goroutine.
type countingReader struct {
	r io.ReadCloser
	n atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }
