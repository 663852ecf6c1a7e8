package awsfront

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/await"
)

// These tests put the front's handler before a fake upstream instead of
// moto, to watch what the upstream receives and when: whether bodies
// stream, and what a cut-off request looks like from the other side.

// upstreamSaw is what the fake upstream read of one request body.
type upstreamSaw struct {
	n      int64
	sha256 string
	err    error
}

// fakeFront serves the front's handler (plain HTTP: TLS is not what these
// tests are about) before upstream.
func fakeFront(t *testing.T, upstream http.Handler) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	f := &Front{cfg: Config{}.withDefaults(), names: defaultNames, motoURL: u, transport: &http.Transport{DisableCompression: true}}
	f.keys.add(testCreds)
	t.Cleanup(f.transport.CloseIdleConnections)
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}

// readingUpstream reads each body to its end (or error), reports it, and
// closes reached once it has read past mark bytes of one.
func readingUpstream(mark int64, reached chan<- struct{}, saw chan<- upstreamSaw) http.Handler {
	var once sync.Once
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		var n int64
		buf := make([]byte, 64<<10)
		var err error
		for {
			var k int
			k, err = r.Body.Read(buf)
			h.Write(buf[:k])
			n += int64(k)
			if n > mark {
				once.Do(func() { close(reached) })
			}
			if err != nil {
				break
			}
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		saw <- upstreamSaw{n: n, sha256: hex.EncodeToString(h.Sum(nil)), err: err}
	})
}

// gatedWriter passes writes until after bytes have gone through, then
// waits for gate (bounded by await.Limit) before the rest: a body that
// must be half received before its sender finishes.
type gatedWriter struct {
	w     io.Writer
	after int64
	gate  <-chan struct{}
	n     int64
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	if g.n >= g.after {
		select {
		case <-g.gate:
		case <-time.After(await.Limit):
			return 0, errors.New("the upstream never got the start of the body: the front held it back")
		}
	}
	n, err := g.w.Write(p)
	g.n += int64(n)
	return n, err
}

// TestUploadStreamsBeforeTheClientFinishes: the upstream has the first
// megabytes of a signed aws-chunked body while the client is still held
// from sending the rest, so the front forwards as it checks; then the
// whole body arrives byte for byte.
func TestUploadStreamsBeforeTheClientFinishes(t *testing.T) {
	reached := make(chan struct{})
	saw := make(chan upstreamSaw, 1)
	srv := fakeFront(t, readingUpstream(3<<20, reached, saw))
	c := chunked{mode: streamingSignedTrailer, checksum: true, size: 8 << 20, chunk: 256 << 10, seed: 1}
	req := c.request(t, "https://bucket.s3.us-east-1.amazonaws.com/k", testCreds, time.Now())
	body := req.Body
	pr, pw := io.Pipe()
	go func() {
		_, err := io.Copy(&gatedWriter{w: pw, after: 5 << 20, gate: reached}, body)
		pw.CloseWithError(err)
	}()
	resp := sendVia(t, srv, req, pr)
	resp.Body.Close()
	got := await.Recv(t, "the upstream's read of the body", saw)
	if resp.StatusCode != 200 || got.err != nil || got.n != c.encodedLength() {
		t.Fatalf("status %d; upstream read %d of %d bytes, %v", resp.StatusCode, got.n, c.encodedLength(), got.err)
	}
}

// TestCutOffLeavesTheUpstreamAnIncompleteBody: a chunk that fails past
// Precheck stops the body mid-way; the upstream's read of it fails.
func TestCutOffLeavesTheUpstreamAnIncompleteBody(t *testing.T) {
	saw := make(chan upstreamSaw, 1)
	srv := fakeFront(t, readingUpstream(0, make(chan struct{}), saw))
	c := chunked{mode: streamingSigned, size: 4 << 20, chunk: 512 << 10, seed: 2, tamper: 6}
	req := c.request(t, "https://bucket.s3.us-east-1.amazonaws.com/k", testCreds, time.Now())
	resp := sendVia(t, srv, req, req.Body)
	status, code := s3Answer(t, resp)
	if status != 403 || code != "SignatureDoesNotMatch" {
		t.Fatalf("got %d %s", status, code)
	}
	got := await.Recv(t, "the upstream's read of the body", saw)
	if got.err == nil || got.n >= c.encodedLength() {
		t.Fatalf("the upstream read %d of %d bytes without an error", got.n, c.encodedLength())
	}
}

// TestDownloadStreams: the client has the first megabytes of an answer
// while the upstream is held from writing the rest.
func TestDownloadStreams(t *testing.T) {
	const head, total = 2 << 20, 16 << 20
	clientHas := make(chan struct{})
	upstreamErr := make(chan error, 1)
	srv := fakeFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "16777216")
		_, _ = io.Copy(w, io.LimitReader(newPattern(5, total), head))
		http.NewResponseController(w).Flush()
		select {
		case <-clientHas:
		case <-time.After(await.Limit):
			upstreamErr <- errors.New("the client never got the start of the answer: the front held it back")
			return
		}
		src := newPattern(5, total)
		_, _ = io.CopyN(io.Discard, src, head)
		_, err := io.Copy(w, src)
		upstreamErr <- err
	}))
	resp, err := http.Get(srv.URL + "/bucket/big")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, resp.Body, head); err != nil {
		t.Fatal(err)
	}
	close(clientHas)
	if _, err := io.Copy(h, resp.Body); err != nil {
		t.Fatal(err)
	}
	if err := await.Recv(t, "the upstream's answer", upstreamErr); err != nil {
		t.Fatal(err)
	}
	if hex.EncodeToString(h.Sum(nil)) != patternSHA256(5, total) {
		t.Fatal("the download changed on its way")
	}
}

// TestGiBUploadIsNotBuffered: a 1 GiB signed aws-chunked upload passes
// with the process allocating a small fraction of it in all: the front
// holds one chunk at a time, never the body.
func TestGiBUploadIsNotBuffered(t *testing.T) {
	saw := make(chan upstreamSaw, 1)
	srv := fakeFront(t, readingUpstream(0, make(chan struct{}), saw))
	c := chunked{mode: streamingSigned, size: 1 << 30, chunk: 1 << 20, seed: 3}
	req := c.request(t, "https://bucket.s3.us-east-1.amazonaws.com/k", testCreds, time.Now())
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resp := sendVia(t, srv, req, req.Body)
	resp.Body.Close()
	got := await.Recv(t, "the upstream's read of the body", saw)
	runtime.ReadMemStats(&after)
	if resp.StatusCode != 200 || got.err != nil || got.n != c.encodedLength() {
		t.Fatalf("status %d; upstream read %d of %d bytes, %v", resp.StatusCode, got.n, c.encodedLength(), got.err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 128<<20 {
		t.Fatalf("a 1 GiB upload allocated %d MiB", alloc>>20)
	}
}

// sendVia sends req (signed for its AWS host) to the fake front with
// body, keeping the Host it was signed for.
func sendVia(t *testing.T, srv *httptest.Server, req *http.Request, body io.Reader) *http.Response {
	t.Helper()
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(body)
	out.Host = req.URL.Host
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	out.URL.Scheme, out.URL.Host = u.Scheme, u.Host
	out.RequestURI = ""
	resp, err := srv.Client().Do(out)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
