package http1

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// RequestHead is a request as the next hop gets it.
type RequestHead struct {
	Req     *http.Request // method, URL and fields
	Host    string        // the Host field
	Upgrade string        // the protocol asked for, "" for none
	// Length is the body's: > 0 exact, 0 none, -1 unknown (chunked).
	Length int64
	// Identity asks for an uncoded answer (Accept-Encoding: identity in
	// place of the request's own).
	Identity bool
}

// WriteRequestHead writes the request line and fields: the origin-form
// target, Host, the end-to-end fields (hop-by-hop ones dropped, and
// X-Forwarded-*/Forwarded, as httputil.ReverseProxy drops them) and the
// body's framing. Values are written as they are: ParseFields and
// x/net/http2 refuse a line break in one, and package proxy refuses a
// substituted value with one.
func WriteRequestHead(bw *bufio.Writer, out *RequestHead) {
	r := out.Req
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	WriteRequestTarget(bw, r.URL)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(out.Host)
	bw.WriteString("\r\n")
	connection := r.Header["Connection"]
	for k, vs := range r.Header {
		if !EndToEnd(k, connection) || k == "Host" || k == "Content-Length" ||
			k == "Forwarded" || k == "X-Forwarded-For" || k == "X-Forwarded-Host" || k == "X-Forwarded-Proto" ||
			out.Identity && k == "Accept-Encoding" {
			continue
		}
		for _, v := range vs {
			writeField(bw, k, v)
		}
	}
	if out.Identity {
		bw.WriteString("Accept-Encoding: identity\r\n")
	}
	if httpguts.HeaderValuesContainsToken(r.Header["Te"], "trailers") {
		bw.WriteString("Te: trailers\r\n")
	}
	if out.Upgrade != "" {
		bw.WriteString("Connection: Upgrade\r\nUpgrade: ")
		bw.WriteString(out.Upgrade)
		bw.WriteString("\r\n")
	}
	switch {
	case out.Length > 0:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), out.Length, 10))
		bw.WriteString("\r\n")
	case out.Length < 0:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch:
		// What net/http sends for these methods without a body.
		bw.WriteString("Content-Length: 0\r\n")
	}
	bw.WriteString("\r\n")
}

// WriteRequestTarget writes u in origin form (url.URL.RequestURI, without
// its allocation).
func WriteRequestTarget(bw *bufio.Writer, u *url.URL) {
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

// TargetLen is the length of WriteRequestTarget's form of u.
func TargetLen(u *url.URL) int {
	if u.Opaque != "" {
		return len(u.RequestURI())
	}
	n := max(len(u.EscapedPath()), 1)
	if u.ForceQuery || u.RawQuery != "" {
		n += 1 + len(u.RawQuery)
	}
	return n
}

// WriteBody copies a body to w, each read written as it comes (an upload
// is not held back), chunked when its length is unknown: a chunk's size
// line, data and CRLF leave in one write (two TLS records' worth with a 32
// KiB buf), not a write per piece. buf is the caller's scratch space.
func WriteBody(w io.Writer, body io.Reader, chunked bool, buf []byte) error {
	// Room for the size line before the data and the CRLF after it.
	const sizeRoom, crlf = 18, 2
	data := buf[sizeRoom : len(buf)-crlf]
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
			if _, err := w.Write(out); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			if chunked {
				_, err := io.WriteString(w, "0\r\n\r\n")
				return err
			}
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// Response is a response head.
type Response struct {
	Status  int
	Header  http.Header
	Length  int64 // -1 when unknown
	Chunked bool
	// Close: the upstream closes the connection after this response.
	Close bool
}

// ErrMalformedResponse is a response head that does not parse or frames
// its body ambiguously.
var ErrMalformedResponse = errors.New("upstream: malformed response head")

// ParseResponse reads a response head into h (which the Response keeps).
// Its framing is checked as strictly as a request's (ParseFields), except
// that a Transfer-Encoding beside a Content-Length is read as chunked (RFC
// 9112 6.3), the length dropped and the connection not reused, and that
// equal Content-Lengths count as one.
func ParseResponse(head string, h http.Header) (Response, error) {
	line, fieldLines, _ := strings.Cut(head, "\n")
	line = strings.TrimSuffix(line, "\r")
	proto, rest, _ := strings.Cut(line, " ")
	code, _, _ := strings.Cut(rest, " ")
	if proto != "HTTP/1.1" && proto != "HTTP/1.0" || len(code) != 3 {
		return Response{}, ErrMalformedResponse
	}
	status, err := strconv.Atoi(code)
	if err != nil || status < 100 {
		return Response{}, ErrMalformedResponse
	}
	strs := make([]string, strings.Count(fieldLines, "\n"))
	f, refused := ParseFields(fieldLines, h, strs)
	if refused.Refused() || f.LengthsDiffer {
		return Response{}, ErrMalformedResponse
	}
	res := Response{Status: status, Header: h, Length: -1}
	switch {
	case f.Codings > 0:
		if !f.Chunked {
			return Response{}, errors.New("upstream: unsupported transfer coding") // the field may echo a value: not quoted
		}
		res.Chunked = true
		if f.Lengths > 0 {
			delete(h, "Content-Length")
			res.Close = true
		}
	case f.Lengths > 0:
		res.Length = f.ContentLength
	}
	conn := h["Connection"]
	res.Close = res.Close || httpguts.HeaderValuesContainsToken(conn, "close") ||
		(proto == "HTTP/1.0" && !httpguts.HeaderValuesContainsToken(conn, "keep-alive"))
	return res, nil
}

// ResponseBody reads one response body as its head frames it. It holds no
// connection: the caller learns from Ended that the framing's end was
// reached, and whether the connection may carry another exchange.
type ResponseBody struct {
	r       io.Reader // nil: no body
	limited io.LimitedReader
	br      *bufio.Reader // a chunked body's, for its trailer
	ended   bool
	// Trailer is a chunked body's trailer section, once read to its end.
	Trailer http.Header
}

// Reset readies b as the body of res, the final response to a request
// with the given method, read from br. It reports whether the body ends
// only with the connection (no length, not chunked).
func (b *ResponseBody) Reset(br *bufio.Reader, res *Response, method string) (toClose bool) {
	*b = ResponseBody{}
	switch {
	case method == http.MethodHead || res.Status == http.StatusNoContent || res.Status == http.StatusNotModified:
	case res.Chunked:
		b.r, b.br = httputil.NewChunkedReader(br), br
	case res.Length >= 0:
		b.limited = io.LimitedReader{R: br, N: res.Length}
		b.r = &b.limited
	default:
		b.r, toClose = br, true
	}
	return toClose
}

// Empty reports whether the response has no body at all.
func (b *ResponseBody) Empty() bool { return b.r == nil }

// Ended reports whether a read met the end of the body's framing: io.EOF
// when the body was whole, or the error that cut it short.
func (b *ResponseBody) Ended() bool { return b.ended }

// Read reads the body; a sized body that ends before its length is
// io.ErrUnexpectedEOF, and a chunked one reads its trailer at its end.
func (b *ResponseBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.ended = true
		switch {
		case b.r == &b.limited && b.limited.N > 0:
			err = io.ErrUnexpectedEOF
		case b.br != nil:
			if b.Trailer, err = readTrailer(b.br); err == nil {
				err = io.EOF
			}
		}
	}
	return n, err
}

// readTrailer reads the trailer section that ends a chunked body, up to its
// empty line; nil when there is none.
func readTrailer(br *bufio.Reader) (http.Header, error) {
	lines, err := readTrailerLines(br)
	if err != nil {
		return nil, ErrMalformedResponse
	}
	if len(lines) == 0 {
		return nil, nil
	}
	h := http.Header{}
	if _, refused := ParseFields(string(lines), h, nil); refused.Refused() {
		return nil, ErrMalformedResponse
	}
	return h, nil
}
