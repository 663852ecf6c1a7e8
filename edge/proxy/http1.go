package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxHeadBytes bounds an intercepted request's head (431 past it).
const maxHeadBytes = 64 << 10

// maxDrain is how much of an unread request body is skipped to keep a
// connection alive; past it the connection is closed.
const maxDrain = 256 << 10

var headReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// serveHTTP1 serves HTTP/1.1 requests on an intercepted connection. Its own
// loop, not net/http's server, because the framing must be checked on the
// raw head: net/http quietly drops a Content-Length beside a
// Transfer-Encoding and merges duplicate Content-Lengths, and a proxy must
// refuse both (request smuggling).
func (p *Proxy) serveHTTP1(ctx context.Context, c net.Conn) {
	br := bufio.NewReaderSize(c, 4096)
	handler := pipeline{p}
	for {
		_ = c.SetReadDeadline(time.Now().Add(p.cfg.IdleTimeout))
		head, err := readHead(br)
		if err != nil {
			var he headError
			if errors.As(err, &he) {
				writeStatus(c, he.status, he.reason, nil)
			}
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		if status, reason := checkFraming(head); status != 0 {
			writeStatus(c, status, reason, nil)
			return
		}
		hr := headReaders.Get().(*bufio.Reader)
		hr.Reset(bytes.NewReader(head))
		req, err := http.ReadRequest(hr)
		headReaders.Put(hr)
		if err != nil {
			writeStatus(c, http.StatusBadRequest, "malformed request", nil)
			return
		}
		bw := getWriter(c)
		body := &h1Body{}
		switch {
		case len(req.TransferEncoding) > 0:
			body.r = httputil.NewChunkedReader(br)
			body.trailers = br
		case req.ContentLength > 0:
			body.r = io.LimitReader(br, req.ContentLength)
		}
		if body.r != nil {
			if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
				body.continueW = bw
			}
			req.Body = body
		} else {
			req.Body = http.NoBody
		}
		req.Header.Del("Expect")
		req.RemoteAddr = c.RemoteAddr().String()
		req = req.WithContext(ctx)
		w := &h1Writer{conn: c, br: br, bw: bw, req: req, header: http.Header{}}
		body.w = w
		handler.ServeHTTP(w, req)
		if w.hijacked {
			return
		}
		w.finish()
		putWriter(bw)
		if w.closeAfter || req.Close || ctx.Err() != nil {
			return
		}
		if body.r != nil && !body.eof {
			if n, _ := io.CopyN(io.Discard, body, maxDrain+1); n > maxDrain || !body.eof {
				return
			}
		}
	}
}

type headError struct {
	status int
	reason string
}

func (e headError) Error() string { return e.reason }

// readHead reads one request head, request line to the empty line, skipping
// empty lines before it (RFC 9112 2.2).
func readHead(br *bufio.Reader) ([]byte, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if len(head) > 0 || len(line) > 0 {
				return nil, headError{http.StatusBadRequest, "truncated request head"}
			}
			return nil, err
		}
		if len(head)+len(line) > maxHeadBytes {
			return nil, headError{http.StatusRequestHeaderFieldsTooLarge, "request head too large"}
		}
		if len(head) == 0 && (string(line) == "\r\n" || string(line) == "\n") {
			continue
		}
		head = append(head, line...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if string(line) == "\r\n" || string(line) == "\n" {
			return head, nil
		}
	}
}

// checkFraming refuses a head whose body framing is ambiguous: both
// Transfer-Encoding and Content-Length, more than one of either, a transfer
// coding other than chunked, whitespace before a colon, or a folded line.
func checkFraming(head []byte) (int, string) {
	var cl, te int
	rest := head
	if i := bytes.IndexByte(rest, '\n'); i >= 0 {
		rest = rest[i+1:] // past the request line
	}
	for len(rest) > 0 {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return http.StatusBadRequest, "folded header line"
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 || len(bytes.TrimRight(name, " \t")) != len(name) {
			return http.StatusBadRequest, "malformed header line"
		}
		switch {
		case asciiEqualFold(name, "Content-Length"):
			cl++
		case asciiEqualFold(name, "Transfer-Encoding"):
			te++
			if !asciiEqualFold(bytes.TrimSpace(value), "chunked") {
				return http.StatusNotImplemented, "only the chunked transfer coding is accepted"
			}
		}
	}
	switch {
	case cl > 0 && te > 0:
		return http.StatusBadRequest, "both Transfer-Encoding and Content-Length (request smuggling)"
	case cl > 1:
		return http.StatusBadRequest, "more than one Content-Length (request smuggling)"
	case te > 1:
		return http.StatusBadRequest, "more than one Transfer-Encoding"
	}
	return 0, ""
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
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
	w         *h1Writer
	continueW *bufio.Writer
	trailers  *bufio.Reader
	eof       bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.continueW != nil {
		if !b.w.wroteHeader {
			b.continueW.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			b.continueW.Flush()
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

// skipTrailers reads trailer lines up to the empty line that ends a chunked
// body, at most maxHeadBytes of them.
func skipTrailers(br *bufio.Reader) error {
	total := 0
	for {
		line, err := br.ReadSlice('\n')
		total += len(line)
		if err != nil || total > maxHeadBytes {
			return errors.New("malformed chunked trailer")
		}
		if string(line) == "\r\n" || string(line) == "\n" {
			return nil
		}
	}
}

func (b *h1Body) Close() error { return nil }

// h1Writer writes one HTTP/1.1 response: Content-Length when the handler
// set one, chunked otherwise, nothing for HEAD, 204 and 304.
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
}

var (
	_ http.ResponseWriter = (*h1Writer)(nil)
	_ http.Flusher        = (*h1Writer)(nil)
	_ http.Hijacker       = (*h1Writer)(nil)
)

func (w *h1Writer) Header() http.Header { return w.header }

func (w *h1Writer) WriteHeader(code int) {
	if w.wroteHeader || w.hijacked {
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		fmt.Fprintf(w.bw, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
		w.header.Write(w.bw)
		w.bw.WriteString("\r\n")
		w.bw.Flush()
		return
	}
	w.wroteHeader, w.status = true, code
	h := w.header
	w.length = -1
	w.noBody = w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified
	if cl := h.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			w.length = n
		} else {
			h.Del("Content-Length")
		}
	}
	h.Del("Transfer-Encoding")
	switch {
	case w.noBody || w.length >= 0:
	case w.req.ProtoAtLeast(1, 1):
		w.chunked = true
		h.Set("Transfer-Encoding", "chunked")
	default:
		w.closeAfter = true
	}
	if w.req.Close || !w.req.ProtoAtLeast(1, 1) {
		w.closeAfter = true
	}
	if w.closeAfter {
		h.Set("Connection", "close")
	}
	fmt.Fprintf(w.bw, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	h.Write(w.bw)
	w.bw.WriteString("\r\n")
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
		fmt.Fprintf(w.bw, "%x\r\n", len(b))
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

// finish ends the response: the last chunk with any trailers, then a flush.
func (w *h1Writer) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.chunked {
		w.bw.WriteString("0\r\n")
		trailers := http.Header{}
		for _, declared := range w.header.Values("Trailer") {
			for _, k := range strings.Split(declared, ",") {
				k = http.CanonicalHeaderKey(strings.TrimSpace(k))
				if vs := w.header[k]; len(vs) > 0 {
					trailers[k] = vs
				}
			}
		}
		for k, vs := range w.header {
			if strings.HasPrefix(k, http.TrailerPrefix) {
				trailers[strings.TrimPrefix(k, http.TrailerPrefix)] = vs
			}
		}
		trailers.Write(w.bw)
		w.bw.WriteString("\r\n")
	}
	if w.length >= 0 && w.written != w.length && !w.noBody {
		w.closeAfter = true
	}
	if err := w.bw.Flush(); err != nil {
		w.closeAfter = true
	}
}
