package http1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// FuzzHTTP1Response feeds arbitrary bytes to the response reader: the head
// reader, ParseResponse and ResponseBody, as the upstream side of the proxy
// reads an answer. Invariants: the head is the same whether it arrives
// whole or a few bytes at a time; an accepted head has a three-digit status,
// fields without a line break or control character, and one framing
// (chunked without a Content-Length, or a length, or the connection's
// close); and where net/http reads the same response too, it reads the same
// status, the same body and leaves the same bytes after it, so the proxy
// and a client agree on where an answer ends (a pooled connection's next
// answer starts there). Left out of that comparison: an HTTP/1.0 response
// naming a transfer coding, which net/http ignores there (golang/go#12785)
// and ParseResponse reads as chunked.
func FuzzHTTP1Response(f *testing.F) {
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\nnext",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\nuntil the close",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x00",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
		"\r\nHTTP/1.1 200 OK\nContent-Length: 1\n\nx",
	} {
		f.Add([]byte(seed), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		head, ok := readHeadBothWays(t, data, step)
		if !ok {
			return
		}
		res, err := ParseResponse(string(head), http.Header{})
		if err != nil {
			return
		}
		checkResponse(t, res)
		br, refBr := bufio.NewReader(bytes.NewReader(data)), bufio.NewReader(bytes.NewReader(data))
		ReadHead(br, nil, MaxHeadBytes) // as read above
		ref, err := http.ReadResponse(refBr, &http.Request{Method: http.MethodGet})
		if err != nil {
			return
		}
		if ref.StatusCode != res.Status {
			t.Fatalf("status %d, net/http read %d", res.Status, ref.StatusCode)
		}
		if res.Status < 200 || strings.HasPrefix(string(head), "HTTP/1.0") && len(res.Header["Transfer-Encoding"]) > 0 {
			return
		}
		var body ResponseBody
		body.Reset(br, &res, http.MethodGet)
		got, err := readAllBody(&body)
		want, refErr := io.ReadAll(ref.Body)
		if err != nil || refErr != nil {
			return
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("body %q, net/http read %q", got, want)
		}
		rest, _ := io.ReadAll(br)
		refRest, _ := io.ReadAll(refBr)
		if !bytes.Equal(rest, refRest) {
			t.Fatalf("%q left after the answer, net/http left %q", rest, refRest)
		}
	})
}

// checkResponse fails t unless res has a status of three digits, fields
// free of line breaks and control characters, and one framing.
func checkResponse(t *testing.T, res Response) {
	t.Helper()
	if res.Status < 100 || res.Status > 999 {
		t.Fatalf("status %d accepted", res.Status)
	}
	checkFields(t, res.Header)
	cl := res.Header["Content-Length"]
	switch {
	case res.Chunked && (len(cl) > 0 || res.Length != -1):
		t.Fatalf("chunked with a length: %v, %d", cl, res.Length)
	case !res.Chunked && res.Length >= 0 && len(cl) == 0:
		t.Fatalf("length %d without a Content-Length", res.Length)
	}
}

// readAllBody reads b to its end; an empty body reads as none.
func readAllBody(b *ResponseBody) ([]byte, error) {
	if b.Empty() {
		return nil, nil
	}
	return io.ReadAll(b)
}
