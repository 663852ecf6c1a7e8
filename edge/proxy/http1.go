package proxy

import (
	"bufio"
	"bytes"
	"context"
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

// maxHeadBytes bounds an intercepted request's head (431 past it), and
// what edge reads of a head before any decision (a CONNECT, a plain HTTP
// request it refuses): a head read whole would otherwise grow with
// whatever a client sends until the handshake timeout.
const maxHeadBytes = 64 << 10

// maxDrain is how much of an unread request body is skipped to keep a
// connection alive; past it the connection is closed.
const maxDrain = 256 << 10

// h1Conn is one intercepted HTTP/1.1 connection. Its own loop, not
// net/http's server, for two reasons: the framing must be checked on the raw
// head (net/http quietly drops a Content-Length beside a Transfer-Encoding
// and merges duplicate Content-Lengths, and a proxy must refuse both:
// request smuggling), and a kept-alive request should cost next to nothing
// (issue 4's benchmark): the head is read into one string, its fields into a
// header map and value slices the connection reuses, and the response writer
// is the connection's too.
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

	head   []byte      // the head being read
	header http.Header // the request's fields, cleared per request
	// Reused request after request: nothing holds them once served.
	req   http.Request
	state requestState
	w     h1Writer
	body  h1Body
}

// h1ValueSlots is how many field values a request has room for in a
// lent slab; more spill into their own slices.
const h1ValueSlots = 24

// valueSlabs lends requests the backing of their field values for as
// long as they are served: an idle connection holds none
// (BenchmarkIdleInterceptedConnMemory).
var valueSlabs = sync.Pool{New: func() any { s := make([]string, h1ValueSlots); return &s }}

// serveHTTP1 serves HTTP/1.1 requests on an intercepted connection.
func (p *Proxy) serveHTTP1(ctx context.Context, ci *connInfo, c net.Conn) {
	hc := &h1Conn{p: p, ci: ci, conn: c, br: bufio.NewReaderSize(c, 4096),
		base:   (&http.Request{RemoteAddr: c.RemoteAddr().String()}).WithContext(ctx),
		header: http.Header{}}
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
	head, err := hc.readHead()
	if err != nil {
		var he headError
		if errors.As(err, &he) {
			writeStatus(c, he.status, he.reason, nil)
			if he.status == http.StatusRequestHeaderFieldsTooLarge {
				hc.p.auditHeadOverBound(hc.ci)
			}
		}
		return false
	}
	clear(hc.header)
	slab := valueSlabs.Get().(*[]string)
	defer func() {
		clear(hc.header) // nothing idle points into the slab
		clear(*slab)
		valueSlabs.Put(slab)
	}()
	req := &hc.req
	*req = *hc.base
	if err := parseRequest(head, req, hc.header, *slab); err != nil {
		var he headError
		if !errors.As(err, &he) {
			he = headError{http.StatusBadRequest, "malformed request"}
		}
		writeStatus(c, he.status, he.reason, nil)
		return false
	}
	bw := getWriter(c)
	defer putWriter(bw)
	body := &hc.body
	*body = h1Body{}
	switch {
	case req.ContentLength < 0:
		body.r = httputil.NewChunkedReader(hc.br)
		body.trailers = hc.br
	case req.ContentLength > 0:
		body.limited = io.LimitedReader{R: hc.br, N: req.ContentLength}
		body.r = &body.limited
	}
	if body.r != nil {
		// A body is read at the client's pace, however long it takes.
		_ = c.SetReadDeadline(time.Time{})
		hc.idleSince = time.Time{}
		if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
			body.continueW, body.expectContinue = bw, true
		}
		req.Body = body
	} else {
		req.Body = http.NoBody
	}
	delete(req.Header, "Expect")
	w := &hc.w
	clear(w.header)
	*w = h1Writer{conn: c, br: hc.br, bw: bw, req: req, header: w.header}
	if w.header == nil {
		w.header = http.Header{}
	}
	body.w = w
	hc.state.reset(hc.p, hc.ci, hc.watch, ctx)
	hc.p.serve(&hc.state, w, req)
	if w.hijacked {
		return false
	}
	w.finish()
	if w.closeAfter || req.Close || ctx.Err() != nil {
		return false
	}
	if body.r != nil && !body.eof {
		// A client that asked for 100 Continue and never got it may or may
		// not send its body (RFC 9110 10.1.1): which bytes come next is
		// unknown, so the connection closes rather than wait for a body
		// that may never come (or read the next request as one). Any other
		// unread body is skipped, up to maxDrain, within the idle timeout.
		if body.expectContinue && !body.continued {
			return false
		}
		_ = c.SetReadDeadline(time.Now().Add(hc.p.cfg.IdleTimeout))
		hc.idleSince = time.Time{}
		if n, _ := io.CopyN(io.Discard, body, maxDrain+1); n > maxDrain || !body.eof {
			return false
		}
	}
	if cap(hc.head) > 4096 {
		hc.head = nil // a large head's buffer is not kept while idle
	}
	return true
}

type headError struct {
	status int
	reason string
}

func (e headError) Error() string { return e.reason }

// readHead reads one request head, request line to the empty line, skipping
// empty lines before it (RFC 9112 2.2), into one string.
func (hc *h1Conn) readHead() (string, error) {
	head, err := readHeadInto(hc.br, hc.head[:0], maxHeadBytes)
	hc.head = head
	if err != nil {
		return "", err
	}
	return string(head), nil
}

// readHeadInto appends a head (start line to the empty line) to buf.
// Empty lines before it are skipped; more than limit bytes is an error.
func readHeadInto(br *bufio.Reader, buf []byte, limit int) ([]byte, error) {
	if len(buf) == 0 {
		// The common case, a whole head already read: found in one pass
		// over the buffer instead of a ReadSlice per line.
		if _, err := br.Peek(1); err == nil {
			if n := headEnd(peekBuffered(br)); n > 0 && n <= limit {
				head, _ := br.Peek(n)
				buf = append(buf, head...)
				br.Discard(n)
				return buf, nil
			}
		}
	}
	// A line longer than the buffer comes in pieces: only a piece that
	// starts a line can be the empty line (a line split between its CR and
	// LF is not followed by one).
	lineStart := true
	for {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if len(buf) > 0 || len(line) > 0 {
				return buf, headError{http.StatusBadRequest, "truncated request head"}
			}
			return buf, err
		}
		if len(buf)+len(line) > limit {
			return buf, headError{http.StatusRequestHeaderFieldsTooLarge, reasonHeadOverBound}
		}
		empty := lineStart && (string(line) == "\r\n" || string(line) == "\n")
		if len(buf) == 0 && empty {
			continue
		}
		buf = append(buf, line...)
		if errors.Is(err, bufio.ErrBufferFull) {
			lineStart = false
			continue
		}
		if empty {
			return buf, nil
		}
		lineStart = true
	}
}

func peekBuffered(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	return b
}

// headEnd is the length of the head at the start of b, through its empty
// line, or 0 when b does not hold a whole one or starts with an empty line
// (left to the line-by-line reader).
func headEnd(b []byte) int {
	if len(b) == 0 || b[0] == '\r' || b[0] == '\n' {
		return 0
	}
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0
		}
		i += j + 1
		switch {
		case i < len(b) && b[i] == '\n':
			return i + 1
		case i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n':
			return i + 2
		}
	}
}

// chunkedCoding is a request's TransferEncoding when its body is chunked;
// shared, never modified.
var chunkedCoding = []string{"chunked"}

// parseRequest reads a request head into req (whose context is already set)
// with h as its Header. It refuses, with the status to answer, a malformed
// request line or field (see parseFields) and ambiguous body framing: both
// Transfer-Encoding and Content-Length, more than one of either, a transfer
// coding other than chunked, or one on HTTP/1.0.
func parseRequest(head string, req *http.Request, h http.Header, strs []string) error {
	line, fieldLines, _ := strings.Cut(head, "\n")
	line = strings.TrimSuffix(line, "\r")
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || method == "" || target == "" || !isToken(method) {
		return headError{http.StatusBadRequest, "malformed request line"}
	}
	switch proto {
	case "HTTP/1.1":
		req.ProtoMinor = 1
	case "HTTP/1.0":
		req.ProtoMinor = 0
	default:
		return headError{http.StatusBadRequest, "malformed HTTP version"}
	}
	req.Method, req.RequestURI, req.Proto, req.ProtoMajor = method, target, proto, 1
	f, err := parseFields(fieldLines, h, strs)
	if err != nil {
		return err
	}
	switch {
	case f.lengths > 0 && f.codings > 0:
		return headError{http.StatusBadRequest, "both Transfer-Encoding and Content-Length (request smuggling)"}
	case f.lengths > 1:
		return headError{http.StatusBadRequest, "more than one Content-Length (request smuggling)"}
	case f.codings > 1:
		return headError{http.StatusBadRequest, "more than one Transfer-Encoding"}
	case f.codings == 1 && !f.chunked:
		return headError{http.StatusNotImplemented, "only the chunked transfer coding is accepted"}
	case f.codings == 1 && req.ProtoMinor == 0:
		return headError{http.StatusBadRequest, "Transfer-Encoding on HTTP/1.0"}
	case len(h["Host"]) > 1:
		return headError{http.StatusBadRequest, "more than one Host"}
	}
	// A CONNECT names an authority, not a path (net/http's reading of it);
	// the pipeline refuses it.
	if method == http.MethodConnect && !strings.HasPrefix(target, "/") {
		u, err := url.ParseRequestURI("http://" + target)
		if err != nil {
			return headError{http.StatusBadRequest, "malformed request target"}
		}
		u.Scheme = ""
		req.URL = u
	} else if req.URL, err = url.ParseRequestURI(target); err != nil {
		return headError{http.StatusBadRequest, "malformed request target"}
	}
	req.Header = h
	req.Host = req.URL.Host
	if req.Host == "" && len(h["Host"]) > 0 {
		req.Host = h["Host"][0]
	}
	switch {
	case f.codings == 1:
		req.ContentLength, req.TransferEncoding = -1, chunkedCoding
	case f.lengths == 1:
		req.ContentLength = f.contentLength
	}
	conn := h["Connection"]
	req.Close = httpguts.HeaderValuesContainsToken(conn, "close") ||
		(req.ProtoMinor == 0 && !httpguts.HeaderValuesContainsToken(conn, "keep-alive"))
	return nil
}

// fieldsInfo is what parseFields found about a message's framing.
type fieldsInfo struct {
	lengths       int   // Content-Length fields
	contentLength int64 // the last one's value
	lengthsDiffer bool  // two Content-Lengths with different values
	codings       int   // Transfer-Encoding fields
	chunked       bool  // every one of them is exactly "chunked"
}

// parseFields reads a head's field lines (after its start line) into h,
// names canonical and values trimmed of surrounding whitespace, the values
// substrings of lines: strs lends them slices, so a head of common fields
// allocates nothing here. It refuses a folded line, a name that is not a
// token (so no whitespace before the colon), a value with a control
// character other than tab (so no bare CR: no response splitting either
// way), and a Content-Length that is not a decimal number.
func parseFields(lines string, h http.Header, strs []string) (fieldsInfo, error) {
	f := fieldsInfo{chunked: true}
	for len(lines) > 0 {
		line := lines
		if i := strings.IndexByte(lines, '\n'); i >= 0 {
			line, lines = lines[:i], lines[i+1:]
		} else {
			lines = ""
		}
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return f, headError{http.StatusBadRequest, "folded header line"}
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" || !isToken(name) {
			return f, headError{http.StatusBadRequest, "malformed header line"}
		}
		value = trimOWS(value)
		for i := 0; i < len(value); i++ {
			if c := value[i]; c < ' ' && c != '\t' || c == 0x7f {
				return f, headError{http.StatusBadRequest, "malformed header line"}
			}
		}
		key := canonicalKey(name)
		switch key {
		case "Content-Length":
			n, err := strconv.ParseUint(value, 10, 63)
			if err != nil {
				return f, headError{http.StatusBadRequest, "malformed Content-Length"}
			}
			if f.lengths > 0 && int64(n) != f.contentLength {
				f.lengthsDiffer = true
			}
			f.lengths++
			f.contentLength = int64(n)
		case "Transfer-Encoding":
			f.codings++
			f.chunked = f.chunked && strings.EqualFold(value, "chunked")
		}
		vv := h[key]
		if vv == nil && len(strs) > 0 {
			vv, strs = strs[:1:1], strs[1:]
			vv[0] = value
		} else {
			vv = append(vv, value)
		}
		h[key] = vv
	}
	if f.codings == 0 {
		f.chunked = false
	}
	return f, nil
}

// trimOWS drops the optional whitespace around a field value (spaces and
// tabs; strings.Trim builds a set per call, visible in the profile).
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !httpguts.IsTokenRune(rune(s[i])) {
			return false
		}
	}
	return true
}

// canonicalKey is http.CanonicalHeaderKey without its allocation for a name
// already in canonical form, which is how clients spell them.
func canonicalKey(name string) string {
	upper := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return http.CanonicalHeaderKey(name)
		}
		upper = c == '-'
	}
	return name
}

var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}

func getWriter(c net.Conn) *bufio.Writer {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(c)
	return bw
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	writers.Put(bw)
}

// h1Body is a request body on the connection; it sends "100 Continue" on
// its first read when the client asked for it. After a chunked body it
// consumes the trailer section, which is not forwarded (request trailers
// are dropped), so the next request starts where it should.
type h1Body struct {
	r         io.Reader
	limited   io.LimitedReader
	w         *h1Writer
	continueW *bufio.Writer
	trailers  *bufio.Reader
	eof       bool
	// expectContinue: the client asked for 100 Continue before sending
	// its body; continued: it was sent.
	expectContinue, continued bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.continueW != nil {
		if !b.w.wroteHeader {
			b.continueW.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			b.continueW.Flush()
			b.continued = true
		}
		b.continueW = nil
	}

	n, err := b.r.Read(p)
	if err == io.EOF {
		b.eof = true
		if b.trailers != nil {
			if terr := skipTrailers(b.trailers); terr != nil {
				b.w.closeAfter = true
				return n, terr
			}
		}
	}
	return n, err
}

// skipTrailers reads the trailer section that ends a chunked body.
func skipTrailers(br *bufio.Reader) error {
	_, err := readTrailerLines(br)
	return err
}

// readTrailerLines reads the lines after a chunked body's last chunk up to
// the empty line that ends it, at most maxHeadBytes of them.
func readTrailerLines(br *bufio.Reader) ([]byte, error) {
	var lines []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil || len(lines)+len(line) > maxHeadBytes {
			return nil, errors.New("malformed chunked trailer")
		}
		if string(line) == "\r\n" || string(line) == "\n" {
			return lines, nil
		}
		lines = append(lines, line...)
	}
}

func (b *h1Body) Close() error { return nil }

// h1Writer writes one HTTP/1.1 response: Content-Length when the handler
// set one, chunked otherwise, nothing for HEAD, 204 and 304. The head and a
// small body leave in one write, at finish.
type h1Writer struct {
	conn   net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	req    *http.Request
	header http.Header

	wroteHeader bool
	status      int
	noBody      bool
	chunked     bool
	length      int64 // declared Content-Length, -1 when none
	written     int64
	closeAfter  bool
	hijacked    bool
	aborted     bool
}

var (
	_ http.ResponseWriter = (*h1Writer)(nil)
	_ http.Flusher        = (*h1Writer)(nil)
	_ http.Hijacker       = (*h1Writer)(nil)
)

func (w *h1Writer) Header() http.Header { return w.header }

// WriteHeader writes the status line and the fields. The framing fields
// (Content-Length, Transfer-Encoding, Connection) are the writer's: it
// writes them as the response is framed. Field names and values are written
// as they are: the handler's come from this package, and an upstream's were
// checked by parseFields.
func (w *h1Writer) WriteHeader(code int) {
	if w.wroteHeader || w.hijacked {
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		writeStatusLine(w.bw, code)
		writeFields(w.bw, w.header, false)
		w.bw.WriteString("\r\n")
		w.bw.Flush()
		return
	}
	w.wroteHeader, w.status = true, code
	h := w.header
	w.length = -1
	w.noBody = w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified
	cl := h["Content-Length"]
	if len(cl) == 1 {
		if n, err := strconv.ParseInt(cl[0], 10, 64); err == nil && n >= 0 {
			w.length = n
		}
	}
	switch {
	case w.noBody || w.length >= 0:
	case w.req.ProtoAtLeast(1, 1):
		w.chunked = true
	default:
		w.closeAfter = true
	}
	if w.req.Close || !w.req.ProtoAtLeast(1, 1) || httpguts.HeaderValuesContainsToken(h["Connection"], "close") {
		w.closeAfter = true
	}
	writeStatusLine(w.bw, code)
	writeFields(w.bw, h, true)
	if w.length >= 0 {
		w.bw.WriteString("Content-Length: ")
		w.bw.Write(strconv.AppendInt(w.bw.AvailableBuffer(), w.length, 10))
		w.bw.WriteString("\r\n")
	}
	if w.chunked {
		w.bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if w.closeAfter {
		w.bw.WriteString("Connection: close\r\n")
	}
	w.bw.WriteString("\r\n")
}

func writeStatusLine(bw *bufio.Writer, code int) {
	bw.WriteString("HTTP/1.1 ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(code), 10))
	bw.WriteByte(' ')
	bw.WriteString(http.StatusText(code))
	bw.WriteString("\r\n")
}

// writeFields writes h's fields; framing leaves out the ones the writer
// frames the response with.
func writeFields(bw *bufio.Writer, h http.Header, framing bool) {
	for k, vs := range h {
		if framing && (k == "Content-Length" || k == "Transfer-Encoding" || k == "Connection") ||
			strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		for _, v := range vs {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
}

func (w *h1Writer) Write(b []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.noBody {
		return len(b), nil
	}
	if w.length >= 0 && w.written+int64(len(b)) > w.length {
		w.closeAfter = true
		return 0, http.ErrContentLength
	}
	w.written += int64(len(b))
	if w.chunked {
		if len(b) == 0 {
			return 0, nil
		}
		w.bw.Write(strconv.AppendInt(w.bw.AvailableBuffer(), int64(len(b)), 16))
		w.bw.WriteString("\r\n")
		w.bw.Write(b)
		_, err := w.bw.WriteString("\r\n")
		return len(b), err
	}
	return w.bw.Write(b)
}

func (w *h1Writer) Flush() { _ = w.FlushError() }

func (w *h1Writer) FlushError() error {
	if w.hijacked {
		return http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.bw.Flush()
}

func (w *h1Writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	w.hijacked = true
	if err := w.bw.Flush(); err != nil {
		return nil, nil, err
	}
	bw := bufio.NewWriter(w.conn)
	return w.conn, bufio.NewReadWriter(w.br, bw), nil
}

// abort ends a response whose body could not be passed on whole: what was
// written goes out, but never the end of a chunked body, and the connection
// closes, so the client cannot take a cut body for a complete one.
func (w *h1Writer) abort() {
	w.aborted, w.closeAfter = true, true
}

// finish ends the response: the last chunk with any trailers, then a flush.
func (w *h1Writer) finish() {
	if !w.wroteHeader {
		if w.aborted {
			return // no answer at all: the connection closes
		}
		w.WriteHeader(http.StatusOK)
	}
	if w.chunked && !w.aborted {
		w.bw.WriteString("0\r\n")
		for _, declared := range w.header["Trailer"] {
			for _, k := range strings.Split(declared, ",") {
				k = http.CanonicalHeaderKey(strings.TrimSpace(k))
				for _, v := range w.header[k] {
					w.bw.WriteString(k + ": " + v + "\r\n")
				}
			}
		}
		for k, vs := range w.header {
			if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
				for _, v := range vs {
					w.bw.WriteString(name + ": " + v + "\r\n")
				}
			}
		}
		w.bw.WriteString("\r\n")
	}
	if w.length >= 0 && w.written != w.length && !w.noBody {
		w.closeAfter = true
	}
	if err := w.bw.Flush(); err != nil {
		w.closeAfter = true
	}
}
