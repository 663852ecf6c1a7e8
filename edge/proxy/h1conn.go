package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/runfleet/runfleet/edge/proxy/http1"
)

// maxHeadBytes bounds an intercepted request's head (431 past it), and
// what edge reads of a head before any decision (a CONNECT, a plain HTTP
// request it refuses): a head read whole would otherwise grow with
// whatever a client sends until the handshake timeout.
const maxHeadBytes = http1.MaxHeadBytes

// maxDrain is how much of an unread request body is skipped to keep a
// connection alive; past it the connection is closed.
const maxDrain = 256 << 10

// maxLinger and lingerTimeout bound what is read of a body after an answer
// that closes the connection (a refusal), so the client reads the answer
// rather than a reset: a bulk upload's worth, for a few seconds at most.
const (
	maxLinger     = 64 << 20
	lingerTimeout = 5 * time.Second
)

// h1Conn is one intercepted HTTP/1.1 connection, served by its own loop
// over package http1's framing rather than net/http's server (http1's doc
// says why): the head is read into one string, its fields into a header map
// and value slices that an h1Exchange lends with the request, the response
// writer and the request body for as long as the request is served.
type h1Conn struct {
	p    *Proxy
	ci   *connInfo
	conn net.Conn
	br   *bufio.Reader
	// base carries the connection's context; each request is a copy.
	base *http.Request
	// watch follows the connection's context (its attempt's) for every
	// request on it.
	watch *cancelWatch

	// idleSince is when the read deadline was last set to close the
	// connection after IdleTimeout; zero when no deadline is set.
	idleSince time.Time

	head []byte // the head being read
}

// h1ValueSlots is how many field values a request has room for in a
// lent slab; more spill into their own slices.
const h1ValueSlots = 24

// h1Exchange is what serving one request takes beyond its head: lent for
// as long as the request is served, then to the next request of any
// connection. An idle connection holds none
// (BenchmarkIdleInterceptedConnMemory), and the request finds it warm in
// the processor's cache from the last request served there, where the
// connection's own copy had gone cold among 64 connections' (issue 27).
type h1Exchange struct {
	header http.Header // the request's fields
	req    http.Request
	url    url.URL // req.URL for a plain origin-form target
	state  requestState
	w      http1.Writer
	body   http1.Body
	bw     *bufio.Writer
	slab   [h1ValueSlots]string // the fields' values
}

var exchanges = sync.Pool{New: func() any {
	return &h1Exchange{header: http.Header{}, bw: bufio.NewWriterSize(nil, 4096)}
}}

// release returns x to the pool holding nothing of its request.
func (x *h1Exchange) release() {
	clear(x.header)
	clear(x.slab[:])
	x.req, x.url = http.Request{}, url.URL{}
	x.state.reset(nil, nil, nil, nil)
	x.w.Reset(nil, nil, nil, nil)
	x.body = http1.Body{}
	x.bw.Reset(nil)
	exchanges.Put(x)
}

// serveHTTP1 serves HTTP/1.1 requests on an intercepted connection.
func (p *Proxy) serveHTTP1(ctx context.Context, ci *connInfo, c net.Conn) {
	hc := &h1Conn{p: p, ci: ci, conn: c, br: bufio.NewReaderSize(c, 4096),
		base: (&http.Request{RemoteAddr: c.RemoteAddr().String()}).WithContext(ctx)}
	hc.watch = newCancelWatch(ctx)
	defer hc.watch.release()
	for hc.serveOne(ctx) {
	}
}

// serveOne serves the next request; false when the connection is done.
func (hc *h1Conn) serveOne(ctx context.Context) bool {
	c := hc.conn
	// The idle deadline is moved on at most once a second, not set and
	// cleared around every request: the timer updates were a measurable
	// part of a kept-alive request's cost. A request without a body does
	// not read the connection again, so the deadline may stay.
	if now := time.Now(); now.Sub(hc.idleSince) >= time.Second {
		_ = c.SetReadDeadline(now.Add(hc.p.cfg.IdleTimeout))
		hc.idleSince = now
	}
	head, refused, err := http1.ReadHead(hc.br, hc.head[:0], maxHeadBytes)
	hc.head = head
	if refused.Refused() {
		writeStatus(c, refused.Status, refused.Reason, nil)
		if refused.Status == http.StatusRequestHeaderFieldsTooLarge {
			hc.p.auditHeadOverBound(hc.ci)
		}
	}
	if refused.Refused() || err != nil {
		return false
	}
	x := exchanges.Get().(*h1Exchange)
	defer x.release()
	req := &x.req
	*req = *hc.base
	if refused := http1.ParseRequest(string(head), req, &x.url, x.header, x.slab[:]); refused.Refused() {
		writeStatus(c, refused.Status, refused.Reason, nil)
		return false
	}
	bw := x.bw
	bw.Reset(c)
	w, body := &x.w, &x.body
	hasBody := body.Reset(hc.br, req.ContentLength, w)
	if hasBody {
		// A body is read at the client's pace, however long it takes.
		_ = c.SetReadDeadline(time.Time{})
		hc.idleSince = time.Time{}
		if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
			body.ExpectContinue(bw)
		}
		req.Body = body
	} else {
		req.Body = http.NoBody
	}
	delete(req.Header, "Expect")
	w.Reset(c, hc.br, bw, req)
	x.state.reset(hc.p, hc.ci, hc.watch, ctx)
	hc.p.serve(&x.state, w, req)
	if w.Hijacked() {
		return false
	}
	w.Finish()
	if w.CloseAfter() || req.Close || ctx.Err() != nil {
		if hasBody && ctx.Err() == nil && !body.EOF() && !body.AwaitingContinue() {
			// The answer is out (a refusal, with its reason) while the
			// client may still be sending its body: closing now would
			// reset the connection, and the client would lose the answer
			// with the rest. Read on, bounded in bytes and time, first.
			_ = c.SetReadDeadline(time.Now().Add(lingerTimeout))
			_, _ = io.CopyN(io.Discard, body, maxLinger)
		}
		return false
	}
	if hasBody && !body.EOF() {
		// A client that asked for 100 Continue and never got it may or may
		// not send its body (RFC 9110 10.1.1): which bytes come next is
		// unknown, so the connection closes rather than wait for a body
		// that may never come (or read the next request as one). Any other
		// unread body is skipped, up to maxDrain, within the idle timeout.
		if body.AwaitingContinue() {
			return false
		}
		_ = c.SetReadDeadline(time.Now().Add(hc.p.cfg.IdleTimeout))
		hc.idleSince = time.Time{}
		if n, _ := io.CopyN(io.Discard, body, maxDrain+1); n > maxDrain || !body.EOF() {
			return false
		}
	}
	if cap(hc.head) > 4096 {
		hc.head = nil // a large head's buffer is not kept while idle
	}
	return true
}
