package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/runfleet/runfleet/edge/proxy/http1"
)

// roundTripper speaks HTTP/1.1 to upstreams over verified TLS, on the
// request's own goroutine: a request is written and its response read right
// there, with no hand-off to connection goroutines as in http.Transport,
// which is where a proxy's per-request latency goes. Connections are pooled
// per authority and checked for a close before reuse by a request that
// cannot be retried; forward retries a request without a body once on a new
// connection when a reused one fails.
type roundTripper struct {
	dial        func(ctx context.Context, network, address string) (net.Conn, error)
	tls         *tls.Config
	maxIdle     int
	idleTimeout time.Duration
	handshake   time.Duration
	// busy is the proxy's (rawConn); nil: raw system calls always.
	busy func() bool

	mu   sync.Mutex
	idle map[string][]*upConn
}

// upConn is one upstream connection. One exchange at a time uses it, from
// its request head to the end of its response.
type upConn struct {
	rt   *roundTripper
	key  string
	conn *tls.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time

	head   []byte      // the response head being read
	header http.Header // the response's fields, cleared per response

	// The exchange in progress.
	watch *cancelWatch // cuts it short if its request is cancelled
	wrote chan error   // the body writer's result; nil when none runs
}

// cancelWatch cuts short the upstream exchange of a cancelled request (its
// attempt revoked, its HTTP/2 stream reset): it gives the exchange's
// connection a past deadline, so whatever waits on it returns. An HTTP/1.1
// connection keeps one watch for all its requests, which share the
// attempt's context: registering with that context per exchange
// (context.AfterFunc) made every connection of the attempt contend for its
// lock on every request.
type cancelWatch struct {
	release func() bool // unregisters from the context

	mu        sync.Mutex
	uc        *upConn // the exchange in progress, nil between them
	cancelled bool
}

func newCancelWatch(ctx context.Context) *cancelWatch {
	w := &cancelWatch{}
	w.release = context.AfterFunc(ctx, w.cancel)
	return w
}

func (w *cancelWatch) cancel() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancelled = true
	if w.uc != nil {
		_ = w.uc.conn.NetConn().SetDeadline(time.Unix(1, 0))
	}
}

// begin watches uc's exchange; false if the request is already cancelled.
func (w *cancelWatch) begin(uc *upConn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.uc = uc
	return !w.cancelled
}

// end stops watching; false if the exchange was cut short, so its
// connection is not fit for reuse.
func (w *cancelWatch) end() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.uc = nil
	return !w.cancelled
}

func newRoundTripper(dial func(ctx context.Context, network, address string) (net.Conn, error), cfg *tls.Config, idleTimeout time.Duration) *roundTripper {
	c := cfg.Clone()
	c.NextProtos = []string{"http/1.1"}
	return &roundTripper{dial: dial, tls: c, maxIdle: 64, idleTimeout: idleTimeout, handshake: 10 * time.Second, idle: map[string][]*upConn{}}
}

// get takes a pooled connection to key (host:port), or dials a new one.
// check asks that a pooled one first be seen to be still open: a request
// that cannot be retried (one with a body) needs it; one without a body is
// retried instead, sparing the check.
func (rt *roundTripper) get(ctx context.Context, key, serverName string, check bool) (*upConn, bool, error) {
	for {
		rt.mu.Lock()
		list := rt.idle[key]
		var uc *upConn
		if n := len(list); n > 0 {
			uc = list[n-1]
			list[n-1] = nil
			rt.idle[key] = list[:n-1]
		}
		rt.mu.Unlock()
		if uc == nil {
			break
		}
		if time.Since(uc.used) < rt.idleTimeout && (!check || uc.stillOpen()) {
			return uc, true, nil
		}
		uc.conn.Close()
	}
	raw, err := rt.dial(ctx, "tcp", key)
	if err != nil {
		return nil, false, err
	}
	raw = newRawConn(raw, rt.busy)
	cfg := rt.tls.Clone()
	cfg.ServerName = serverName
	tc := tls.Client(raw, cfg)
	hctx, cancel := context.WithTimeout(ctx, rt.handshake)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, false, err
	}
	return &upConn{rt: rt, key: key, conn: tc, br: bufio.NewReaderSize(tc, 4096), bw: bufio.NewWriterSize(tc, 4096), header: http.Header{}}, false, nil
}

// stillOpen: a pooled connection the server closed (or wrote to unasked)
// is not reused. A zero-wait read tells without blocking.
func (uc *upConn) stillOpen() bool {
	if uc.br.Buffered() > 0 {
		return false
	}
	_ = uc.conn.NetConn().SetReadDeadline(time.Now())
	_, err := uc.br.Peek(1)
	_ = uc.conn.NetConn().SetReadDeadline(time.Time{})
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (rt *roundTripper) put(uc *upConn) {
	uc.used = time.Now()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.idle[uc.key]) >= rt.maxIdle {
		uc.conn.Close()
		return
	}
	rt.idle[uc.key] = append(rt.idle[uc.key], uc)
}

// CloseIdleConnections closes every pooled connection.
func (rt *roundTripper) CloseIdleConnections() {
	rt.mu.Lock()
	idle := rt.idle
	rt.idle = map[string][]*upConn{}
	rt.mu.Unlock()
	for _, list := range idle {
		for _, uc := range list {
			uc.conn.Close()
		}
	}
}

// outbound is a decided request as the upstream gets it.
type outbound struct {
	http1.RequestHead
	// inline is a body in memory, sent with the head; stream one read and
	// sent on its own goroutine, so an upstream that answers before the
	// whole body is read at once.
	inline []byte
	stream io.Reader
}

// maxInline is the largest in-memory body sent with the head on the
// request's goroutine: it fits the socket's buffers even when the upstream
// does not read it, so the write cannot wait on the upstream.
const maxInline = 16 << 10

// roundTrip writes out on uc and reads the first response head (perhaps an
// interim 1xx). The request head and an inline body leave in one flush. On
// error the connection is closed; the caller retries or gives up.
func (uc *upConn) roundTrip(watch *cancelWatch, out *outbound) (http1.Response, error) {
	uc.watch, uc.wrote = watch, nil
	if !watch.begin(uc) {
		uc.abandon()
		return http1.Response{}, context.Canceled
	}
	http1.WriteRequestHead(uc.bw, &out.RequestHead)
	uc.bw.Write(out.inline)
	if out.stream != nil {
		// The head goes now, whatever the body does; the body is written
		// to the connection itself (writeBody).
		if err := uc.bw.Flush(); err != nil {
			uc.abandon()
			return http1.Response{}, err
		}
		uc.wrote = make(chan error, 1)
		go uc.writeBody(out.stream, out.Length < 0)
	} else if err := uc.bw.Flush(); err != nil {
		uc.abandon()
		return http1.Response{}, err
	}
	res, err := uc.readResponse()
	if err != nil {
		if uc.wrote != nil {
			if werr := <-uc.wrote; werr != nil {
				err = werr
			}
			uc.wrote = nil
		}
		uc.abandon()
		return http1.Response{}, err
	}
	return res, nil
}

// writeBody streams a body to the upstream (http1.WriteBody). On failure
// the socket itself is closed, without a TLS close_notify, which an
// upstream could take for a clean end of a body cut short (a blocked
// placeholder) and answer; that also unblocks the response reader.
func (uc *upConn) writeBody(body io.Reader, chunked bool) {
	bufp := copyBufferPool.Get().(*[]byte)
	defer copyBufferPool.Put(bufp)
	err := http1.WriteBody(uc.conn, body, chunked, *bufp)
	if err != nil {
		uc.conn.NetConn().Close()
	}
	uc.wrote <- err
}

// abandon ends the exchange and closes the connection.
func (uc *upConn) abandon() {
	uc.watch.end()
	uc.conn.Close()
	if uc.wrote != nil {
		<-uc.wrote
		uc.wrote = nil
	}
}

// readResponse reads the next response head (http1.ParseResponse) into
// the connection's header map: valid until its next response.
func (uc *upConn) readResponse() (http1.Response, error) {
	head, refused, err := http1.ReadHead(uc.br, uc.head[:0], maxHeadBytes)
	uc.head = head
	switch {
	case refused.Refused():
		return http1.Response{}, http1.ErrMalformedResponse
	case err != nil:
		return http1.Response{}, err
	}
	clear(uc.header)
	return http1.ParseResponse(string(head), uc.header)
}

// upBody reads one response body off the connection. Read to its end, the
// connection goes back to the pool (if the upstream keeps it and the
// request's body was written whole); closed early, the connection is
// closed. It is the request's own, not the connection's: once back in the
// pool the connection may carry another request's exchange before this
// one's owner calls Close, which must then find this body finished.
type upBody struct {
	uc       *upConn
	body     http1.ResponseBody
	reusable bool
	done     bool
}

// openBody readies b, the caller's, as the body of res, the final response
// to a request with the given method.
func (uc *upConn) openBody(res http1.Response, method string, b *upBody) *upBody {
	b.uc, b.done = uc, false
	b.reusable = !b.body.Reset(uc.br, &res, method) && !res.Close
	return b
}

// hasBody reports whether the response has a body at all.
func (b *upBody) hasBody() bool { return !b.body.Empty() }

func (b *upBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	if b.body.Empty() {
		b.finish(true)
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if b.body.Ended() {
		b.finish(err == io.EOF)
	}
	return n, err
}

// Close ends the body; unread, the connection cannot be reused.
func (b *upBody) Close() error {
	b.finish(false)
	return nil
}

func (b *upBody) finish(atEOF bool) {
	if b.done {
		return
	}
	b.done = true
	uc := b.uc
	intact := uc.watch.end()
	reuse := atEOF && b.reusable && intact
	if uc.wrote != nil {
		select {
		case err := <-uc.wrote:
			reuse = reuse && err == nil
		default:
			// Still writing a body the upstream no longer reads.
			reuse = false
			uc.conn.Close()
			<-uc.wrote
		}
		uc.wrote = nil
	}
	if reuse {
		uc.rt.put(uc)
		return
	}
	uc.conn.Close()
}
