// Package http1 owns HTTP/1.1 framing as the secrets proxy reads and writes
// it on both sides: a message head read off a connection and parsed into a
// request or a response (with the strict framing checks a proxy needs
// against request smuggling), bodies delimited by Content-Length, chunked
// coding or the connection's close, and a request head and a response
// written back out. It does no I/O of its own beyond the reader and writer
// it is handed, keeps no connection, and decides nothing about secrets:
// package proxy runs the connections, the pipeline and the pool.
//
// It exists instead of net/http's server and Transport for two reasons
// (issue 4): the framing must be checked on the raw head (net/http quietly
// drops a Content-Length beside a Transfer-Encoding and merges duplicate
// Content-Lengths, and a proxy must refuse both), and a kept-alive request
// should cost next to nothing: a head is read into one buffer, its fields
// into a header map and value slices the caller reuses.
package http1

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// MaxHeadBytes bounds a request head as read (431 past it) and a chunked
// body's trailer section.
const MaxHeadBytes = 64 << 10

// ReasonHeadOverBound is the reason a head over its bound is refused with.
var ReasonHeadOverBound = "request head over " + strconv.Itoa(MaxHeadBytes>>10) + " KiB"

// A Refusal is why a head is refused and the status that answers it. The
// zero Refusal refuses nothing.
type Refusal struct {
	Status int
	Reason string
}

// Refused reports whether r refuses the head.
func (r Refusal) Refused() bool { return r.Status != 0 }

// ReadHead appends a head (start line to the empty line) to buf. Empty
// lines before it are skipped (RFC 9112 2.2). A head cut short or over
// limit bytes is refused; err is the reader's, when it ends before a head
// begins.
func ReadHead(br *bufio.Reader, buf []byte, limit int) ([]byte, Refusal, error) {
	if len(buf) == 0 {
		// The common case, a whole head already read: found in one pass
		// over the buffer instead of a ReadSlice per line.
		if _, err := br.Peek(1); err == nil {
			if n := headEnd(peekBuffered(br)); n > 0 && n <= limit {
				head, _ := br.Peek(n)
				buf = append(buf, head...)
				br.Discard(n)
				return buf, Refusal{}, nil
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
				return buf, Refusal{http.StatusBadRequest, "truncated request head"}, nil
			}
			return buf, Refusal{}, err
		}
		if len(buf)+len(line) > limit {
			return buf, Refusal{http.StatusRequestHeaderFieldsTooLarge, ReasonHeadOverBound}, nil
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
			return buf, Refusal{}, nil
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

// ParseRequest reads a request head into req (whose context is already
// set) with h as its Header, strs lending its field values their slices
// (ParseFields) and u, when not nil, its URL when the target is a plain
// origin-form one (parseOriginForm); any other target's URL is
// url.ParseRequestURI's. It refuses, with the status to answer, a malformed
// request line or field (see ParseFields) and ambiguous body framing: both
// Transfer-Encoding and Content-Length, more than one of either, a transfer
// coding other than chunked, or one on HTTP/1.0.
func ParseRequest(head string, req *http.Request, u *url.URL, h http.Header, strs []string) Refusal {
	line, fieldLines, _ := strings.Cut(head, "\n")
	line = strings.TrimSuffix(line, "\r")
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || method == "" || target == "" || !IsToken(method) {
		return Refusal{http.StatusBadRequest, "malformed request line"}
	}
	switch proto {
	case "HTTP/1.1":
		req.ProtoMinor = 1
	case "HTTP/1.0":
		req.ProtoMinor = 0
	default:
		return Refusal{http.StatusBadRequest, "malformed HTTP version"}
	}
	req.Method, req.RequestURI, req.Proto, req.ProtoMajor = method, target, proto, 1
	f, refused := ParseFields(fieldLines, h, strs)
	if refused.Refused() {
		return refused
	}
	if refused := requestFraming(f, req.ProtoMinor, len(h["Host"])); refused.Refused() {
		return refused
	}
	// A CONNECT names an authority, not a path (net/http's reading of it);
	// the pipeline refuses it.
	var err error
	if method == http.MethodConnect && !strings.HasPrefix(target, "/") {
		u, err := url.ParseRequestURI("http://" + target)
		if err != nil {
			return Refusal{http.StatusBadRequest, "malformed request target"}
		}
		u.Scheme = ""
		req.URL = u
	} else if u != nil && parseOriginForm(target, u) {
		req.URL = u
	} else if req.URL, err = url.ParseRequestURI(target); err != nil {
		return Refusal{http.StatusBadRequest, "malformed request target"}
	}
	req.Header = h
	req.Host = req.URL.Host
	if req.Host == "" && len(h["Host"]) > 0 {
		req.Host = h["Host"][0]
	}
	switch {
	case f.Codings == 1:
		req.ContentLength, req.TransferEncoding = -1, chunkedCoding
	case f.Lengths == 1:
		req.ContentLength = f.ContentLength
	}
	conn := h["Connection"]
	req.Close = httpguts.HeaderValuesContainsToken(conn, "close") ||
		(req.ProtoMinor == 0 && !httpguts.HeaderValuesContainsToken(conn, "keep-alive"))
	return Refusal{}
}

// parseOriginForm parses target into u as url.ParseRequestURI does, without
// allocating a URL, when it is an origin-form target ("/path" and perhaps
// "?query") whose path neither unescaping nor escaping changes: Path is
// then the target's path itself and RawPath empty. It reports false, u
// untouched, for any other target (a "%" or any byte a path escapes, an
// absolute form, "*"), which url.ParseRequestURI parses. A request's URL
// was one allocation of every kept-alive request (issue 27's profile).
func parseOriginForm(target string, u *url.URL) bool {
	if target == "" || target[0] != '/' {
		return false
	}
	path, query, hasQuery := strings.Cut(target, "?")
	for i := 0; i < len(path); i++ {
		if !plainPathByte[path[i]] {
			return false
		}
	}
	for i := 0; i < len(query); i++ {
		if c := query[i]; c < ' ' || c == 0x7f {
			return false // url.ParseRequestURI refuses a control byte
		}
	}
	// A lone "?" at the end is ForceQuery; any other "?" starts the query.
	*u = url.URL{Path: path, RawQuery: query, ForceQuery: hasQuery && query == ""}
	return true
}

// plainPathByte: the bytes url.URL keeps as they are in a path, unescaped
// and unescaping to themselves (RFC 3986's unreserved characters and the
// sub-delimiters, ':', '@' and '/' that Go does not escape in a path).
var plainPathByte = func() (t [256]bool) {
	for _, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~$&+,/:;=@") {
		t[c] = true
	}
	return t
}()

// requestFraming refuses a request whose body framing is ambiguous
// (request smuggling) or that names more than one Host.
func requestFraming(f Fields, protoMinor, hosts int) Refusal {
	switch {
	case f.Lengths > 0 && f.Codings > 0:
		return Refusal{http.StatusBadRequest, "both Transfer-Encoding and Content-Length (request smuggling)"}
	case f.Lengths > 1:
		return Refusal{http.StatusBadRequest, "more than one Content-Length (request smuggling)"}
	case f.Codings > 1:
		return Refusal{http.StatusBadRequest, "more than one Transfer-Encoding"}
	case f.Codings == 1 && !f.Chunked:
		return Refusal{http.StatusNotImplemented, "only the chunked transfer coding is accepted"}
	case f.Codings == 1 && protoMinor == 0:
		return Refusal{http.StatusBadRequest, "Transfer-Encoding on HTTP/1.0"}
	case hosts > 1:
		return Refusal{http.StatusBadRequest, "more than one Host"}
	}
	return Refusal{}
}

// Fields is what ParseFields found about a message's framing.
type Fields struct {
	Lengths       int   // Content-Length fields
	ContentLength int64 // the last one's value
	LengthsDiffer bool  // two Content-Lengths with different values
	Codings       int   // Transfer-Encoding fields
	Chunked       bool  // every one of them is exactly "chunked"
}

// ParseFields reads a head's field lines (after its start line) into h,
// names canonical and values trimmed of surrounding whitespace, the values
// substrings of lines: strs lends them slices, so a head of common fields
// allocates nothing here. It refuses a folded line, a name that is not a
// token (so no whitespace before the colon), a value with a control
// character other than tab (so no bare CR: no response splitting either
// way), and a Content-Length that is not a decimal number.
func ParseFields(lines string, h http.Header, strs []string) (Fields, Refusal) {
	f := Fields{Chunked: true}
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
			return f, Refusal{http.StatusBadRequest, "folded header line"}
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" || !IsToken(name) {
			return f, Refusal{http.StatusBadRequest, "malformed header line"}
		}
		value = trimOWS(value)
		for i := 0; i < len(value); i++ {
			if c := value[i]; c < ' ' && c != '\t' || c == 0x7f {
				return f, Refusal{http.StatusBadRequest, "malformed header line"}
			}
		}
		key := canonicalKey(name)
		switch key {
		case "Content-Length":
			n, err := strconv.ParseUint(value, 10, 63)
			if err != nil {
				return f, Refusal{http.StatusBadRequest, "malformed Content-Length"}
			}
			if f.Lengths > 0 && int64(n) != f.ContentLength {
				f.LengthsDiffer = true
			}
			f.Lengths++
			f.ContentLength = int64(n)
		case "Transfer-Encoding":
			f.Codings++
			f.Chunked = f.Chunked && strings.EqualFold(value, "chunked")
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
	if f.Codings == 0 {
		f.Chunked = false
	}
	return f, Refusal{}
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

// IsToken reports whether s is an RFC 9110 token (a method, a field name).
func IsToken(s string) bool {
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

// EndToEnd reports whether a field goes on to the next hop: not one of the
// hop-by-hop fields (RFC 9110 7.6.1), nor one the message's Connection
// field names.
func EndToEnd(name string, connection []string) bool {
	switch name {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return false
	}
	return len(connection) == 0 || !httpguts.HeaderValuesContainsToken(connection, name)
}

// UpgradeType is the protocol a message asks to switch to (Connection:
// upgrade), "" if none.
func UpgradeType(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	if vs := h["Upgrade"]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// readTrailerLines reads the lines after a chunked body's last chunk up to
// the empty line that ends it, at most MaxHeadBytes of them.
func readTrailerLines(br *bufio.Reader) ([]byte, error) {
	var lines []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil || len(lines)+len(line) > MaxHeadBytes {
			return nil, errors.New("malformed chunked trailer")
		}
		if string(line) == "\r\n" || string(line) == "\n" {
			return lines, nil
		}
		lines = append(lines, line...)
	}
}
