package proxy

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
)

// pipeline is the one request handler of intercepted connections, HTTP/1.1
// and HTTP/2 alike: authority check, scan and decide, substitute, forward.
type pipeline struct{ p *Proxy }

type stateKey struct{}

// requestState is one request's decisions. The body scanner may run on the
// transport's goroutine, hence the mutex.
type requestState struct {
	p       *Proxy
	ci      *connInfo
	ctx     context.Context
	granted []policy.Granted

	mu       sync.Mutex
	values   map[policy.KeyRef]string
	used     map[policy.KeyRef]bool
	fail     error
	failKey  policy.KeyRef
	status   int
	upStart  time.Time
	upstream time.Duration
}

func (st *requestState) runID() string { return st.ci.attempt.task.runID }

// substitute decides one occurrence (policy.DecideSubstitution) and returns
// the real value, read once per request from the secrets source.
func (st *requestState) substitute(o owner, loc policy.Location) (string, error) {
	d := policy.DecideSubstitution(policy.SubstituteInput{
		Task: st.runID(), Authority: st.ci.target, Granted: st.granted,
		Occurrence: policy.Occurrence{Owner: o.task, Ref: o.ref, Location: loc},
	})
	st.mu.Lock()
	defer st.mu.Unlock()
	if !d.Allow {
		err := &blockedError{reason: d.Reason, ref: o.ref}
		st.failLocked(err, o.ref)
		return "", err
	}
	v, ok := st.values[o.ref]
	if !ok {
		var err error
		v, err = st.p.cfg.Secrets.Value(st.ctx, o.ref.Project, o.ref.Key)
		switch {
		case errors.Is(err, secrets.ErrNotFound):
			werr := &withheldError{ref: o.ref}
			st.failLocked(werr, o.ref)
			return "", werr
		case err != nil:
			ferr := &faultError{fmt.Errorf("reading %s: %w", o.ref, err)}
			st.failLocked(ferr, o.ref)
			return "", ferr
		}
		st.values[o.ref] = v
	}
	if loc == policy.InHeader && strings.ContainsAny(v, "\r\n\x00") {
		ferr := &faultError{fmt.Errorf("the value of %s cannot be sent in a header", o.ref)}
		st.failLocked(ferr, o.ref)
		return "", ferr
	}
	st.used[o.ref] = true
	return v, nil
}

func (st *requestState) failLocked(err error, ref policy.KeyRef) {
	if st.fail == nil {
		st.fail, st.failKey = err, ref
	}
}

func (h pipeline) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := h.p
	start := p.cfg.Clock.Now()
	ci := connInfoFrom(r.Context())
	ix := p.reg.index.Load()
	st := &requestState{p: p, ci: ci, ctx: r.Context(), values: map[policy.KeyRef]string{}, used: map[policy.KeyRef]bool{}}
	entry := audit.Entry{TS: start, Task: st.runID(), Host: ci.target.String(), Method: r.Method, Path: redact(ix, r.URL.Path)}
	cw := &countingWriter{ResponseWriter: w}
	var bodyIn *countingReader
	defer func() {
		if bodyIn != nil {
			entry.BytesIn = bodyIn.n.Load()
		}
		entry.BytesOut = cw.n
		entry.Duration = p.cfg.Clock.Now().Sub(start)
		p.cfg.Audit.Record(entry)
	}()
	refuse := func(status int, action audit.Action, reason string) {
		entry.Action, entry.Status, entry.Reason = action, status, reason
		cw.Header().Set("Connection", "close")
		respond(cw, status, reason)
	}
	if !ci.attempt.live() {
		refuse(http.StatusProxyAuthRequired, audit.Denied, "the attempt ended")
		return
	}
	if reason := misdirected(ci, r); reason != "" {
		refuse(http.StatusMisdirectedRequest, audit.Denied, reason)
		return
	}
	if r.Method == http.MethodConnect {
		refuse(http.StatusMethodNotAllowed, audit.Denied, "CONNECT inside an intercepted connection")
		return
	}
	st.granted, _ = p.cfg.Policy.Current().Grant(ci.attempt.task.declared)

	fail := func(err error) {
		status, action, reason := p.classify(err)
		st.mu.Lock()
		if st.failKey != (policy.KeyRef{}) {
			entry.Keys = []string{st.failKey.String()}
		}
		st.mu.Unlock()
		p.logFault(status, err, slog.String("task", entry.Task), slog.String("host", entry.Host))
		refuse(status, action, reason)
	}
	if err := st.rewriteHeaders(ix, r.Header); err != nil {
		fail(err)
		return
	}
	if err := st.rewriteURL(ix, r.URL); err != nil {
		fail(err)
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		bodyIn = &countingReader{r: r.Body}
		r.Body = bodyIn
		if err := st.prepareBody(ix, r, p.cfg.BodyBufferLimit); err != nil {
			fail(err)
			return
		}
	}
	st.upStart = p.cfg.Clock.Now()
	p.reverse.ServeHTTP(cw, r.WithContext(context.WithValue(r.Context(), stateKey{}, st)))

	st.mu.Lock()
	defer st.mu.Unlock()
	entry.Status = st.status
	entry.Upstream = st.upstream
	entry.Keys = sortedKeys(st.used)
	switch {
	case st.fail != nil:
		_, entry.Action, entry.Reason = p.classify(st.fail)
		entry.Keys = []string{st.failKey.String()}
	case entry.Action != "":
	case len(st.used) > 0:
		entry.Action = audit.Substituted
	default:
		entry.Action = audit.Forwarded
	}
	if st.status == 0 {
		entry.Status = cw.status
	}
}

// misdirected says why a request does not name the CONNECT's authority, or
// "" when it does: the TLS server name, an absolute-form URL and the Host
// (HTTP/2's :authority) must all name it.
func misdirected(ci *connInfo, r *http.Request) string {
	if !ci.sniOK {
		return "the TLS server name does not name the CONNECT's host"
	}
	if r.URL.Host != "" || r.URL.Scheme != "" {
		if r.URL.Scheme != "https" {
			return "an absolute URL must be https"
		}
		a, err := policy.ParseAuthority(r.URL.Host, false)
		if err != nil || !policy.SameAuthority(a, ci.target) {
			return "the request URL names another authority than the CONNECT"
		}
	}
	if r.Host == "" {
		return "no Host"
	}
	a, err := policy.ParseAuthority(r.Host, false)
	if err != nil || !policy.SameAuthority(a, ci.target) {
		return "the Host names another authority than the CONNECT"
	}
	return ""
}

// rewriteHeaders substitutes placeholders in header values (Basic
// credentials decoded and re-encoded); one in a header name blocks.
func (st *requestState) rewriteHeaders(ix *index, h http.Header) error {
	for name, values := range h {
		if ms := ix.find([]byte(name)); len(ms) > 0 {
			err := &blockedError{reason: "a placeholder in a header name", ref: ms[0].owner.ref}
			st.mu.Lock()
			st.failLocked(err, ms[0].owner.ref)
			st.mu.Unlock()
			return err
		}
		for i, v := range values {
			out, n, err := ix.rewrite([]byte(v), policy.InHeader, st.substitute)
			if err != nil {
				return err
			}
			if n > 0 {
				values[i] = string(out)
				v = values[i]
			}
			if name == "Authorization" || name == "Proxy-Authorization" {
				if nv, err := rewriteBasic(ix, v, st.substitute); err != nil {
					return err
				} else if nv != "" {
					values[i] = nv
				}
			}
		}
	}
	return nil
}

// rewriteBasic substitutes inside "Basic base64(user:password)"; "" when
// there was nothing to replace.
func rewriteBasic(ix *index, v string, sub substituter) (string, error) {
	scheme, b64, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return "", nil
	}
	out, n, err := ix.rewrite(raw, policy.InHeader, sub)
	if err != nil || n == 0 {
		return "", err
	}
	return scheme + " " + base64.StdEncoding.EncodeToString(out), nil
}

// rewriteURL substitutes in the path and the query, escaping the value for
// where it goes. A placeholder that appears only once percent-decoded is
// decided too, so an encoded one cannot slip past a block.
func (st *requestState) rewriteURL(ix *index, u *url.URL) error {
	escaped := u.EscapedPath()
	path, n, err := ix.rewrite([]byte(escaped), policy.InURL, func(o owner, loc policy.Location) (string, error) {
		v, err := st.substitute(o, loc)
		return url.PathEscape(v), err
	})
	if err != nil {
		return err
	}
	if n > 0 {
		unescaped, err := url.PathUnescape(string(path))
		if err != nil {
			return &faultError{errors.New("substituted path does not unescape")}
		}
		u.Path, u.RawPath = unescaped, string(path)
	}
	query, n, err := ix.rewrite([]byte(u.RawQuery), policy.InURL, func(o owner, loc policy.Location) (string, error) {
		v, err := st.substitute(o, loc)
		return url.QueryEscape(v), err
	})
	if err != nil {
		return err
	}
	if n > 0 {
		u.RawQuery = string(query)
	}
	for _, encoded := range []string{escaped, u.RawQuery} {
		if decoded, err := url.QueryUnescape(encoded); err == nil && decoded != encoded {
			for _, m := range ix.find([]byte(decoded)) {
				if _, err := st.substitute(m.owner, policy.InURL); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// prepareBody scans the body: read whole when small and sized (a block then
// sends nothing), streamed through the bounded scanner otherwise. When a key
// may be substituted in this body its length may change, so it is sent
// without a length (chunked on HTTP/1.1).
func (st *requestState) prepareBody(ix *index, r *http.Request, limit int64) error {
	mayChange := false
	if d, ok := st.ci.target.Domain(); ok {
		for _, g := range st.granted {
			mayChange = mayChange || (g.In&policy.InBody != 0 && g.Reaches(d))
		}
	}
	if r.ContentLength > 0 && r.ContentLength <= limit {
		buf := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			return &faultError{errors.New("request body shorter than its Content-Length")}
		}
		out, _, err := ix.rewrite(buf, policy.InBody, st.substitute)
		if err != nil {
			return err
		}
		r.Body = io.NopCloser(bytes.NewReader(out))
		r.ContentLength = int64(len(out))
		return nil
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{newBodyScanner(r.Body, ix, st.substitute), r.Body}
	if mayChange {
		r.ContentLength = -1
	}
	return nil
}

// rewrite is ReverseProxy's: the request goes to the CONNECT's authority
// over TLS, whatever the client wrote.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	ci := connInfoFrom(pr.In.Context())
	pr.Out.URL.Scheme = "https"
	pr.Out.URL.Host = ci.target.HostHeader()
	pr.Out.Host = ""
}

// modifyResponse records the upstream's answer, and refuses to pass on an
// answer to a request the body scanner stopped: whatever the upstream made
// of a body cut short is not the task's.
func (p *Proxy) modifyResponse(res *http.Response) error {
	if st, ok := res.Request.Context().Value(stateKey{}).(*requestState); ok {
		st.mu.Lock()
		defer st.mu.Unlock()
		st.status = res.StatusCode
		st.upstream = p.cfg.Clock.Now().Sub(st.upStart)
		if st.fail != nil {
			return st.fail
		}
	}
	return nil
}

func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	st, _ := r.Context().Value(stateKey{}).(*requestState)
	if st != nil {
		st.mu.Lock()
		if st.fail != nil {
			err = st.fail
		}
		st.mu.Unlock()
	}
	status, action, reason := p.classify(err)
	if st != nil {
		st.mu.Lock()
		st.status = status
		if st.fail == nil && action != audit.Denied {
			st.fail = err
		}
		st.mu.Unlock()
		p.logFault(status, err, slog.String("task", st.runID()), slog.String("host", st.ci.target.String()))
	}
	if status != http.StatusBadGateway || !errors.Is(err, context.Canceled) {
		respond(w, status, reason)
	}
}

func respond(w http.ResponseWriter, status int, reason string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	io.WriteString(w, "runfleet edge: "+reason+"\n")
}

// redact replaces every known placeholder in a path for the audit log.
func redact(ix *index, path string) string {
	ms := ix.find([]byte(path))
	if len(ms) == 0 {
		return path
	}
	var b strings.Builder
	pos := 0
	for _, m := range ms {
		if m.start < pos {
			continue
		}
		b.WriteString(path[pos:m.start])
		b.WriteString("[placeholder]")
		pos = m.end
	}
	b.WriteString(path[pos:])
	return b.String()
}

func sortedKeys(m map[policy.KeyRef]bool) []string {
	if len(m) == 0 {
		return nil
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k.String())
	}
	sort.Strings(out)
	return out
}

// countingWriter counts what the task is sent; Unwrap lets ReverseProxy
// reach the Flusher and Hijacker underneath.
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

func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// countingReader counts the request body read; the transport may read it
// on its own goroutine.
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
