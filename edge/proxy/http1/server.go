package http1

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Body is a request body on a served connection; it sends "100 Continue"
// on its first read when the client asked for it. After a chunked body it
// consumes the trailer section, which is not passed on (request trailers
// are dropped), so the next request starts where it should. A connection
// reuses one Body for all its requests (Reset).
type Body struct {
	r         io.Reader
	limited   io.LimitedReader
	w         *Writer
	continueW *bufio.Writer
	trailers  *bufio.Reader
	eof       bool
	// expectContinue: the client asked for 100 Continue before sending
	// its body; continued: it was sent.
	expectContinue, continued bool
}

// Reset readies b for the body of a request of the given length (> 0
// exact, 0 none, -1 chunked) read from br, answered by w; false when the
// request has no body.
func (b *Body) Reset(br *bufio.Reader, length int64, w *Writer) bool {
	*b = Body{w: w}
	switch {
	case length < 0:
		b.r = httputil.NewChunkedReader(br)
		b.trailers = br
	case length > 0:
		b.limited = io.LimitedReader{R: br, N: length}
		b.r = &b.limited
	}
	return b.r != nil
}

// ExpectContinue has the first read send "100 Continue" on bw first,
// unless the response has begun by then.
func (b *Body) ExpectContinue(bw *bufio.Writer) {
	b.continueW, b.expectContinue = bw, true
}

// EOF reports whether the body was read to its end.
func (b *Body) EOF() bool { return b.eof }

// AwaitingContinue reports whether the client asked for 100 Continue and
// never got it: it may or may not send its body (RFC 9110 10.1.1).
func (b *Body) AwaitingContinue() bool { return b.expectContinue && !b.continued }

func (b *Body) Read(p []byte) (int, error) {
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
			if _, terr := readTrailerLines(b.trailers); terr != nil {
				b.w.closeAfter = true
				return n, terr
			}
		}
	}
	return n, err
}

func (b *Body) Close() error { return nil }

// Writer writes one HTTP/1.1 response: Content-Length when the handler
// set one, chunked otherwise, nothing for HEAD, 204 and 304. The head and a
// small body leave in one write, at Finish. A connection reuses one Writer
// for all its requests (Reset).
type Writer struct {
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
	_ http.ResponseWriter = (*Writer)(nil)
	_ http.Flusher        = (*Writer)(nil)
	_ http.Hijacker       = (*Writer)(nil)
)

// Reset readies w for the response to req on conn, written through bw;
// br is the connection's reader, handed over by Hijack. The header map is
// kept, cleared.
func (w *Writer) Reset(conn net.Conn, br *bufio.Reader, bw *bufio.Writer, req *http.Request) {
	h := w.header
	clear(h)
	if h == nil {
		h = http.Header{}
	}
	*w = Writer{conn: conn, br: br, bw: bw, req: req, header: h}
}

// Hijacked reports whether the handler took the connection over.
func (w *Writer) Hijacked() bool { return w.hijacked }

// CloseAfter reports whether the connection must close after this
// response: asked by either side, or its framing could not be kept.
func (w *Writer) CloseAfter() bool { return w.closeAfter }

func (w *Writer) Header() http.Header { return w.header }

// WriteHeader writes the status line and the fields. The framing fields
// (Content-Length, Transfer-Encoding, Connection) are the writer's: it
// writes them as the response is framed. Field names and values are written
// as they are: the handler's come from package proxy, and an upstream's
// were checked by ParseFields.
func (w *Writer) WriteHeader(code int) {
	if w.wroteHeader || w.hijacked {
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		WriteStatusLine(w.bw, code)
		WriteFields(w.bw, w.header, false)
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
	WriteStatusLine(w.bw, code)
	WriteFields(w.bw, h, true)
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

// WriteStatusLine writes an HTTP/1.1 status line with the code's text.
func WriteStatusLine(bw *bufio.Writer, code int) {
	bw.WriteString("HTTP/1.1 ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(code), 10))
	bw.WriteByte(' ')
	bw.WriteString(http.StatusText(code))
	bw.WriteString("\r\n")
}

// WriteFields writes h's fields, but never trailers (http.TrailerPrefix);
// framing leaves out the ones a Writer frames the response with.
func WriteFields(bw *bufio.Writer, h http.Header, framing bool) {
	for k, vs := range h {
		if framing && (k == "Content-Length" || k == "Transfer-Encoding" || k == "Connection") ||
			strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		for _, v := range vs {
			writeField(bw, k, v)
		}
	}
}

func (w *Writer) Write(b []byte) (int, error) {
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

func (w *Writer) Flush() { _ = w.FlushError() }

func (w *Writer) FlushError() error {
	if w.hijacked {
		return http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.bw.Flush()
}

func (w *Writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
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

// Abort ends a response whose body could not be passed on whole: what was
// written goes out, but never the end of a chunked body, and the connection
// closes, so the client cannot take a cut body for a complete one.
func (w *Writer) Abort() {
	w.aborted, w.closeAfter = true, true
}

// Finish ends the response: the last chunk with any trailers, then a
// flush.
func (w *Writer) Finish() {
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

// writeField writes one field line; the caller has decided the field goes.
func writeField(bw *bufio.Writer, name, value string) {
	bw.WriteString(name)
	bw.WriteString(": ")
	bw.WriteString(value)
	bw.WriteString("\r\n")
}
