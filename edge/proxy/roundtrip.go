package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
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
	raw = newRawConn(raw)
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
	req     *http.Request
	host    string // the Host: the CONNECT's authority
	upgrade string // the protocol asked for, "" for none
	// length is the body's: > 0 exact, 0 none, -1 unknown (chunked).
	length int64
	// inline is a body in memory, sent with the head; stream one read and
	// sent on its own goroutine, so an upstream that answers before the
	// whole body is read at once.
	inline []byte
	stream io.Reader
	// identity asks for an uncoded answer (Accept-Encoding: identity), so
	// it can be scrubbed of the values the request carries.
	identity bool
}

// maxInline is the largest in-memory body sent with the head on the
// request's goroutine: it fits the socket's buffers even when the upstream
// does not read it, so the write cannot wait on the upstream.
const maxInline = 16 << 10

// roundTrip writes out on uc and reads the first response head (perhaps an
// interim 1xx). The request head and an inline body leave in one flush. On
// error the connection is closed; the caller retries or gives up.
func (uc *upConn) roundTrip(watch *cancelWatch, out *outbound) (upResponse, error) {
	uc.watch, uc.wrote = watch, nil
	if !watch.begin(uc) {
		uc.abandon()
		return upResponse{}, context.Canceled
	}
	writeRequestHead(uc.bw, out)
	uc.bw.Write(out.inline)
	if out.stream != nil {
		// The head goes now, whatever the body does; the body is written
		// to the connection itself (writeBody).
		if err := uc.bw.Flush(); err != nil {
			uc.abandon()
			return upResponse{}, err
		}
		uc.wrote = make(chan error, 1)
		go uc.writeBody(out.stream, out.length < 0)
	} else if err := uc.bw.Flush(); err != nil {
		uc.abandon()
		return upResponse{}, err
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
		return upResponse{}, err
	}
	return res, nil
}

// writeBody streams a body to the upstream, each read sent as it comes (an
// upload is not held back), chunked when its length is unknown: a chunk's
// size line, data and CRLF leave in one write that fills two TLS records,
// not a small record per piece. On failure the socket itself is closed,
// without a TLS close_notify, which an upstream could take for a clean end
// of a body cut short (a blocked placeholder) and answer; that also
// unblocks the response reader.
func (uc *upConn) writeBody(body io.Reader, chunked bool) {
	bufp := copyBufferPool.Get().(*[]byte)
	defer copyBufferPool.Put(bufp)
	buf := *bufp
	// Room for the size line before the data and the CRLF after it.
	const sizeRoom, crlf = 18, 2
	data := buf[sizeRoom : len(buf)-crlf]
	var err error
	for {
		n, rerr := body.Read(data)
		if n > 0 {
			out := data[:n]
			if chunked {
				size := strconv.AppendInt(buf[:0], int64(n), 16)
				start := sizeRoom - len(size) - crlf
				copy(buf[start:], size)
				copy(buf[sizeRoom-crlf:], "\r\n")
				out = append(buf[start:sizeRoom+n], "\r\n"...)
			}
			if _, err = uc.conn.Write(out); err != nil {
				break
			}
		}
		if rerr == io.EOF {
			if chunked {
				_, err = io.WriteString(uc.conn, "0\r\n\r\n")
			}
			break
		}
		if rerr != nil {
			err = rerr
			break
		}
	}
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

// writeRequestHead writes the request line and fields as the upstream gets
// them: the origin-form target, the CONNECT's authority as Host, the
// end-to-end fields (hop-by-hop ones dropped, and X-Forwarded-*/Forwarded,
// as httputil.ReverseProxy drops them) and the body's framing. Values are
// written as they are: the HTTP/1.1 reader and x/net/http2 refuse a line
// break in one, and a substituted value with one is refused.
func writeRequestHead(bw *bufio.Writer, out *outbound) {
	r := out.req
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	writeRequestTarget(bw, r.URL)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(out.host)
	bw.WriteString("\r\n")
	connection := r.Header["Connection"]
	for k, vs := range r.Header {
		if !endToEnd(k, connection) || k == "Host" || k == "Content-Length" ||
			k == "Forwarded" || k == "X-Forwarded-For" || k == "X-Forwarded-Host" || k == "X-Forwarded-Proto" ||
			out.identity && k == "Accept-Encoding" {
			continue
		}
		for _, v := range vs {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if out.identity {
		bw.WriteString("Accept-Encoding: identity\r\n")
	}
	if httpguts.HeaderValuesContainsToken(r.Header["Te"], "trailers") {
		bw.WriteString("Te: trailers\r\n")
	}
	if out.upgrade != "" {
		bw.WriteString("Connection: Upgrade\r\nUpgrade: ")
		bw.WriteString(out.upgrade)
		bw.WriteString("\r\n")
	}
	switch {
	case out.length > 0:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), out.length, 10))
		bw.WriteString("\r\n")
	case out.length < 0:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch:
		// What net/http sends for these methods without a body.
		bw.WriteString("Content-Length: 0\r\n")
	}
	bw.WriteString("\r\n")
}

// writeRequestTarget writes u in origin form (url.URL.RequestURI, without
// its allocation).
func writeRequestTarget(bw *bufio.Writer, u *url.URL) {
	if u.Opaque != "" {
		bw.WriteString(u.RequestURI())
		return
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	bw.WriteString(path)
	if u.ForceQuery || u.RawQuery != "" {
		bw.WriteByte('?')
		bw.WriteString(u.RawQuery)
	}
}

// endToEnd reports whether a field goes on to the next hop: not one of the
// hop-by-hop fields (RFC 9110 7.6.1), nor one the message's Connection
// field names.
func endToEnd(name string, connection []string) bool {
	switch name {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return false
	}
	return len(connection) == 0 || !httpguts.HeaderValuesContainsToken(connection, name)
}

// upgradeType is the protocol a message asks to switch to (Connection:
// upgrade), "" if none.
func upgradeType(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	if vs := h["Upgrade"]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// upResponse is an upstream's response head. header is the connection's:
// valid until its next response; its value slices are this response's own.
type upResponse struct {
	status  int
	header  http.Header
	length  int64 // -1 when unknown
	chunked bool
	// close: the upstream closes the connection after this response.
	close bool
}

var errMalformedResponse = errors.New("upstream: malformed response head")

// readResponse reads the next response head. Its framing is checked as
// strictly as a request's (parseFields), except that a Transfer-Encoding
// beside a Content-Length is read as chunked (RFC 9112 6.3), the length
// dropped and the connection not reused, and that equal Content-Lengths
// count as one.
func (uc *upConn) readResponse() (upResponse, error) {
	head, err := readHeadInto(uc.br, uc.head[:0], maxHeadBytes)
	uc.head = head
	if err != nil {
		var he headError
		if errors.As(err, &he) {
			return upResponse{}, errMalformedResponse
		}
		return upResponse{}, err
	}
	s := string(head)
	line, fieldLines, _ := strings.Cut(s, "\n")
	line = strings.TrimSuffix(line, "\r")
	proto, rest, _ := strings.Cut(line, " ")
	code, _, _ := strings.Cut(rest, " ")
	if proto != "HTTP/1.1" && proto != "HTTP/1.0" || len(code) != 3 {
		return upResponse{}, errMalformedResponse
	}
	status, err := strconv.Atoi(code)
	if err != nil || status < 100 {
		return upResponse{}, errMalformedResponse
	}
	clear(uc.header)
	strs := make([]string, strings.Count(fieldLines, "\n"))
	f, err := parseFields(fieldLines, uc.header, strs)
	if err != nil || f.lengthsDiffer {
		return upResponse{}, errMalformedResponse
	}
	res := upResponse{status: status, header: uc.header, length: -1}
	switch {
	case f.codings > 0:
		if !f.chunked {
			return upResponse{}, errors.New("upstream: unsupported transfer coding") // the field may echo a value: not quoted
		}
		res.chunked = true
		if f.lengths > 0 {
			delete(uc.header, "Content-Length")
			res.close = true
		}
	case f.lengths > 0:
		res.length = f.contentLength
	}
	conn := uc.header["Connection"]
	res.close = res.close || httpguts.HeaderValuesContainsToken(conn, "close") ||
		(proto == "HTTP/1.0" && !httpguts.HeaderValuesContainsToken(conn, "keep-alive"))
	return res, nil
}

// upBody reads one response body off the connection. Read to its end, the
// connection goes back to the pool (if the upstream keeps it and the
// request's body was written whole); closed early, the connection is
// closed. It is the request's own, not the connection's: once back in the
// pool the connection may carry another request's exchange before this
// one's owner calls Close, which must then find this body finished.
type upBody struct {
	uc       *upConn
	r        io.Reader // nil: no body
	limited  io.LimitedReader
	chunked  bool
	trailer  http.Header
	reusable bool
	done     bool
}

// openBody readies b, the caller's, as the body of res, the final response
// to a request with the given method.
func (uc *upConn) openBody(res upResponse, method string, b *upBody) *upBody {
	*b = upBody{uc: uc, reusable: !res.close}
	switch {
	case method == http.MethodHead || res.status == http.StatusNoContent || res.status == http.StatusNotModified:
	case res.chunked:
		b.r, b.chunked = httputil.NewChunkedReader(uc.br), true
	case res.length >= 0:
		b.limited = io.LimitedReader{R: uc.br, N: res.length}
		b.r = &b.limited
	default:
		// Delimited by the connection's close.
		b.r, b.reusable = uc.br, false
	}
	return b
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	if b.r == nil {
		b.finish(true)
		return 0, io.EOF
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		switch {
		case b.r == &b.limited && b.limited.N > 0:
			err = io.ErrUnexpectedEOF
		case b.chunked:
			if b.trailer, err = readTrailer(b.uc.br); err == nil {
				err = io.EOF
			}
		}
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

// readTrailer reads the trailer section that ends a chunked body, up to its
// empty line; nil when there is none.
func readTrailer(br *bufio.Reader) (http.Header, error) {
	lines, err := readTrailerLines(br)
	if err != nil {
		return nil, errMalformedResponse
	}
	if len(lines) == 0 {
		return nil, nil
	}
	h := http.Header{}
	if _, err := parseFields(string(lines), h, nil); err != nil {
		return nil, errMalformedResponse
	}
	return h, nil
}
