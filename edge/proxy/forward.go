package proxy

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runfleet/runfleet/edge/proxy/http1"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
)

// forward sends a decided request to the CONNECT's authority and passes the
// answer back. It does what httputil.ReverseProxy did here (hop-by-hop
// fields dropped both ways, upgrades relayed, interim responses passed on,
// streamed answers flushed as they come, trailers kept) without its copy of
// the request and its hand-offs: the request head is written from r itself
// and the answer copied on this goroutine (profiles in issue 4: the copy and
// net/http's parsing were most of the proxy's time per request).
func (p *Proxy) forward(r *http.Request, st *requestState) {
	scrubs := st.scrubsAnswer()
	out, refused := outboundFor(r, st, scrubs)
	if refused != nil {
		p.failForwarded(st, refused)
		return
	}
	uc, res, err := p.exchange(st, &out)
	if err != nil {
		p.upstreamError(st, err)
		return
	}
	// The answer is scrubbed of every value the run knows.
	var scrub *placeholder.Scrubber
	if scrubs {
		scrub = &st.scrub
		scrub.Reset(st)
	}
	if res, err = st.passInterim(scrub, uc, res); err != nil {
		uc.abandon()
		p.upstreamError(st, err)
		return
	}
	if refused := st.answered(res.Status); refused != nil {
		uc.abandon()
		p.failForwarded(st, refused)
		return
	}
	if res.Status == http.StatusSwitchingProtocols {
		st.scrubHeader(scrub, res.Header)
		p.switchProtocols(st, out.Upgrade, res, uc)
		return
	}
	body := uc.openBody(res, r.Method, &st.upBody)
	defer body.Close()
	p.passAnswer(st, scrub, res, body)
}

// outboundFor decides how r goes upstream: its Host, the upgrade it asks
// for (refused unless a WebSocket's), and whether its body goes with the
// head (read whole and small), streams, or is none. scrubs asks for an
// uncoded answer, so it can be scrubbed.
func outboundFor(r *http.Request, st *requestState, scrubs bool) (outbound, *refusal) {
	out := outbound{RequestHead: http1.RequestHead{Req: r, Host: st.ci.hostHeader, Upgrade: http1.UpgradeType(r.Header),
		Length: r.ContentLength, Identity: scrubs}}
	if out.Host == "" {
		out.Host = st.ci.target.HostHeader()
	}
	if out.Upgrade != "" && !printableASCII(out.Upgrade) {
		// Never quoted: the field has been substituted.
		return out, refuseBadRequest("the Upgrade field names an invalid protocol")
	}
	if out.Upgrade != "" {
		if refused := prepareUpgrade(r, out.Upgrade); refused != nil {
			return out, refused
		}
	}
	switch {
	case r.Body == nil || r.Body == http.NoBody || out.Length == 0:
		out.Length = 0
	case st.body != nil && len(st.body) <= maxInline:
		out.inline = st.body
	default:
		out.stream = r.Body
	}
	return out, nil
}

// exchange sends out on a pooled or new connection and reads the first
// response head. A request without a body that failed on a reused
// connection (which the upstream may have closed meanwhile) is tried once
// more on a new one; a body may have been read, so a request with one is
// not.
func (p *Proxy) exchange(st *requestState, out *outbound) (*upConn, http1.Response, error) {
	hasBody := out.Length != 0
	for try := 0; ; try++ {
		uc, reused, err := p.transport.get(st.ctx, st.ci.address(), st.ci.target.Host(), hasBody)
		if err != nil {
			return nil, http1.Response{}, err
		}
		res, err := uc.roundTrip(st.watch, out)
		if err == nil {
			return uc, res, nil
		}
		if !retryOnNewConn(reused, hasBody, try, st.ctx.Err()) {
			return nil, http1.Response{}, err
		}
	}
}

// retryOnNewConn decides whether a failed exchange is tried again: only
// the first try of a request without a body on a reused connection, and
// never a cancelled one.
func retryOnNewConn(reused, hasBody bool, try int, cancelled error) bool {
	return reused && !hasBody && try == 0 && cancelled == nil
}

// passInterim passes each interim (1xx) answer on to the task as it is,
// scrubbed, and returns the final one (or a 101).
func (st *requestState) passInterim(scrub *placeholder.Scrubber, uc *upConn, res http1.Response) (http1.Response, error) {
	w := &st.out
	for res.Status < 200 && res.Status != http.StatusSwitchingProtocols {
		h := w.Header()
		for k, vs := range res.Header {
			h[k] = vs
		}
		st.scrubHeader(scrub, h)
		w.WriteHeader(res.Status)
		clear(h)
		var err error
		if res, err = uc.readResponse(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// passAnswer passes the final answer's head and body on to the task,
// scrubbed of the request's values when scrub is set, then its trailers.
func (p *Proxy) passAnswer(st *requestState, scrub *placeholder.Scrubber, res http1.Response, body *upBody) {
	w := &st.out
	if scrub != nil && body.hasBody() && contentCoded(res.Header) {
		// Asked for identity, the upstream still compressed it: what it
		// holds cannot be known, so the task does not get it.
		p.failForwarded(st, refuseUnscannable())
		return
	}
	h := w.Header()
	connection := res.Header["Connection"]
	for k, vs := range res.Header {
		if http1.EndToEnd(k, connection) {
			h[k] = vs
		}
	}
	st.scrubHeader(scrub, h)
	flush := res.Length < 0 || isEventStream(h["Content-Type"])
	var src io.Reader = body
	switch answerPassage(scrub != nil && body.hasBody(), flush, res.Length) {
	case scrubWhole:
		p.passScrubbedWhole(st, scrub, body, res)
		return
	case scrubStreamed:
		// Scrubbing may change the length: the answer goes without one
		// (chunked on HTTP/1.1).
		delete(h, "Content-Length")
		sc := scrub.Stream(body)
		defer func() {
			st.scrubbed += sc.Replaced()
			sc.Release()
		}()
		src = sc
	}
	w.WriteHeader(res.Status)
	if flush && src != io.Reader(body) {
		// The window may hold the first bytes back a while (an answer's
		// first tokens, short of a line): the head need not wait for them.
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
	}
	if err := copyBody(w, src, flush); err != nil {
		p.cfg.Logger.Warn("secrets proxy: passing on the upstream's answer", slog.String("task", st.runID()),
			slog.String("host", st.ci.logHost), slog.String("error", err.Error()))
		abort(w, st)
		return
	}
	st.scrubHeader(scrub, body.body.Trailer)
	for k, vs := range body.body.Trailer {
		h[http.TrailerPrefix+k] = vs
	}
}

// passage is how an answer's body reaches the task.
type passage int

const (
	passAsIs      passage = iota // copied as it comes
	scrubWhole                   // read whole, scrubbed, sent with its new length
	scrubStreamed                // through the scrubber's bounded window, without a length
)

// answerPassage decides how an answer's body is passed on: as it is when
// there is nothing to scrub; else read whole when it is sized and fits one
// copy buffer, and streamed through the window when it is not or is to be
// flushed as it comes (no length, or server-sent events), so it reaches
// the task as it comes and any other leaves in as few writes as fit.
func answerPassage(scrubbing, flush bool, length int64) passage {
	switch {
	case !scrubbing:
		return passAsIs
	case !flush && length <= bodyChunk:
		return scrubWhole
	}
	return scrubStreamed
}

// passScrubbedWhole passes on a sized answer that fits one copy buffer:
// read whole, scrubbed, and sent with its exact length.
func (p *Proxy) passScrubbedWhole(st *requestState, scrub *placeholder.Scrubber, body *upBody, res http1.Response) {
	w := &st.out
	bufp := copyBufferPool.Get().(*[]byte)
	defer copyBufferPool.Put(bufp)
	b := (*bufp)[:res.Length]
	_, err := io.ReadFull(body, b)
	if err == nil {
		// Past the length: the end, which returns the connection to the pool.
		if _, err = body.Read(b[len(b):]); err == io.EOF {
			err = nil
		}
	}
	if err != nil {
		clear(w.Header())
		p.upstreamError(st, err)
		return
	}
	out, n := scrub.Whole(b)
	if n > 0 {
		st.scrubbed += n
		w.Header()["Content-Length"] = []string{strconv.Itoa(len(out))}
	}
	w.WriteHeader(res.Status)
	w.Write(out)
}

// scrubHeader takes the request's values out of an answer's fields (no-op
// without a scrubber).
func (st *requestState) scrubHeader(scrub *placeholder.Scrubber, h http.Header) {
	if scrub != nil && len(h) > 0 {
		st.scrubbed += scrub.Header(h)
	}
}

// contentCoded reports whether an answer's body is content-coded with
// anything but identity (RFC 9110 8.4).
func contentCoded(h http.Header) bool {
	for _, v := range h["Content-Encoding"] {
		for _, c := range strings.Split(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return true
			}
		}
	}
	return false
}

// copyBody copies an answer's body to the task, flushing after every read
// when asked to.
func copyBody(w *countingWriter, body io.Reader, flush bool) error {
	flusher, _ := w.ResponseWriter.(http.Flusher)
	bufp := copyBufferPool.Get().(*[]byte)
	defer copyBufferPool.Put(bufp)
	buf := *bufp
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if flush && flusher != nil {
				flusher.Flush()
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// abort ends an answer that could not be passed on whole, so the task
// cannot take it for a complete one: the HTTP/1.1 writer closes the
// connection without ending the body; under net/http's or x/net/http2's
// server the handler aborts (the stream is reset), as ReverseProxy does.
func abort(w *countingWriter, st *requestState) {
	if a, ok := w.ResponseWriter.(interface{ Abort() }); ok {
		a.Abort()
		return
	}
	if st.ctx.Value(http.ServerContextKey) != nil {
		panic(http.ErrAbortHandler)
	}
}

// switchProtocols relays a WebSocket (the one upgrade prepareUpgrade lets
// through) frame by frame once the upstream agreed to it without an
// extension.
func (p *Proxy) switchProtocols(st *requestState, asked string, res http1.Response, uc *upConn) {
	fail := func(refused *refusal) {
		uc.abandon()
		p.failForwarded(st, refused)
	}
	got := http1.UpgradeType(res.Header)
	switch {
	// Neither protocol is quoted: the task's was substituted, and the
	// upstream's may echo it.
	case !printableASCII(got):
		fail(exchangeFailed(errors.New("the upstream switched to an invalid protocol")))
		return
	case !strings.EqualFold(asked, got):
		fail(exchangeFailed(errors.New("the upstream switched to another protocol than the one asked for")))
		return
	}
	if len(res.Header["Sec-Websocket-Extensions"]) > 0 {
		// An extension it was not offered (permessage-deflate): frames that
		// may be compressed cannot be scanned.
		fail(refuseUnscannable())
		return
	}
	hj, ok := st.out.ResponseWriter.(http.Hijacker)
	if !ok {
		fail(exchangeFailed(fmt.Errorf("can't switch protocols using non-Hijacker ResponseWriter type %T", st.out.ResponseWriter)))
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		fail(exchangeFailed(fmt.Errorf("hijack failed on protocol switch: %w", err)))
		return
	}
	uc.watch.end()
	_ = conn.SetDeadline(time.Time{})
	http1.WriteStatusLine(brw.Writer, res.Status)
	http1.WriteFields(brw.Writer, res.Header, false)
	brw.WriteString("\r\n")
	if err := brw.Flush(); err != nil {
		conn.Close()
		uc.conn.Close()
		return
	}
	p.relayWebSocket(st, conn, brw.Reader, uc)
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// isEventStream reports whether a Content-Type is text/event-stream, with
// or without parameters.
func isEventStream(contentType []string) bool {
	if len(contentType) == 0 {
		return false
	}
	mt, _, _ := strings.Cut(contentType[0], ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// bodyChunk is how much of a body a copy reads at a time, and the most an
// answer read whole may hold (answerPassage).
const bodyChunk = 32 << 10

// copyBufferPool lends the body copies their 32 KiB buffers.
var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, bodyChunk); return &b }}
