package http1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// FuzzHTTP1Head feeds arbitrary bytes to the HTTP/1.1 head reader and
// parser. Invariants: the head is the same whether it arrives whole or a
// few bytes at a time; an accepted head has unambiguous framing (never both
// Transfer-Encoding and Content-Length, at most one of each, only chunked)
// and fields without a line break or control character; and net/http reads
// the same request from it (method, target, Host, body length), so the
// proxy and any upstream agree on where the request ends.
func FuzzHTTP1Head(f *testing.F) {
	for _, seed := range []string{
		"GET /v1/x?q=1 HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Bearer x\r\n\r\n",
		"POST /a HTTP/1.1\r\nHost: a.test:8443\r\nContent-Length: 5\r\n\r\nhello",
		"POST /a HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
		"POST /a HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
		"\r\nGET / HTTP/1.0\nHost: a.test\nX: y\n\n",
		"GET https://a.test/p HTTP/1.1\r\nHost: b.test\r\nX:  folded\r\n continued\r\n\r\n",
		"PUT /x HTTP/1.1\r\nhost: a.test\r\ntransfer-encoding: Chunked\r\n\r\n0\r\n\r\n",
		"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n",
	} {
		f.Add([]byte(seed), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		whole, ok := readHeadBothWays(t, data, step)
		if !ok {
			return
		}
		h := http.Header{}
		req := new(http.Request)
		if ParseRequest(string(whole), req, new(url.URL), h, make([]string, 4)).Refused() {
			return
		}
		if len(h["Content-Length"]) > 1 || len(h["Transfer-Encoding"]) > 1 ||
			len(h["Content-Length"]) > 0 && len(h["Transfer-Encoding"]) > 0 {
			t.Fatalf("ambiguous framing accepted: %v", h)
		}
		if te := h["Transfer-Encoding"]; len(te) == 1 && (!strings.EqualFold(te[0], "chunked") || req.ContentLength != -1) {
			t.Fatalf("transfer coding %q accepted as length %d", te, req.ContentLength)
		}
		checkFields(t, h)
		ref, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(whole)))
		if err != nil {
			t.Fatalf("accepted a head net/http refuses (%v): %q", err, whole)
		}
		if ref.Method != req.Method || ref.RequestURI != req.RequestURI || ref.Host != req.Host ||
			ref.ContentLength != req.ContentLength || ref.Close != req.Close {
			t.Fatalf("read differently from net/http: method %q/%q target %q/%q host %q/%q length %d/%d close %v/%v",
				req.Method, ref.Method, req.RequestURI, ref.RequestURI, req.Host, ref.Host, req.ContentLength, ref.ContentLength, req.Close, ref.Close)
		}
		if !reflect.DeepEqual(req.URL, ref.URL) {
			t.Fatalf("URL %#v, net/http's %#v", req.URL, ref.URL)
		}
	})
}

// checkFields fails t unless every field name in h is a token and no value
// holds a line break or a NUL.
func checkFields(t *testing.T, h http.Header) {
	t.Helper()
	for k, vs := range h {
		if !IsToken(k) {
			t.Fatalf("field name %q accepted", k)
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n\x00") {
				t.Fatalf("field %s value %q accepted", k, v)
			}
		}
	}
}

// readHeadBothWays reads a head from data whole and a few bytes at a time,
// and fails the test unless both reads agree; ok when a head was read.
func readHeadBothWays(t *testing.T, data []byte, step uint8) (head []byte, ok bool) {
	t.Helper()
	whole, refWhole, errWhole := ReadHead(bufio.NewReaderSize(bytes.NewReader(data), 4096), nil, MaxHeadBytes)
	trickled, refTrickle, errTrickle := ReadHead(bufio.NewReaderSize(&trickle{data: data, step: int(step%7) + 1}, 16), nil, MaxHeadBytes)
	okWhole := errWhole == nil && !refWhole.Refused()
	okTrickle := errTrickle == nil && !refTrickle.Refused()
	if okWhole != okTrickle || refWhole != refTrickle || okWhole && !bytes.Equal(whole, trickled) {
		t.Fatalf("the head read whole (%q, %v, %v) differs from the head read in pieces (%q, %v, %v)",
			whole, refWhole, errWhole, trickled, refTrickle, errTrickle)
	}
	return whole, okWhole
}

// trickle returns its data a few bytes per read.
type trickle struct {
	data []byte
	step int
}

func (r *trickle) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := min(r.step, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}
