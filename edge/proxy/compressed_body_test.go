package proxy

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
)

// A content-coded request body reaches the upstream byte for byte, with its
// Content-Encoding: the proxy scans a body as the bytes it is and decodes
// none (proxy.go's doc), so a placeholder compressed inside it is neither
// substituted nor blocked: the upstream gets the placeholder, worthless,
// even where its key may go in a body (B toward other). Each coding is sent
// small with a length (read whole), large with a length (streamed past
// BodyBufferLimit) and without one (chunked on HTTP/1.1), over HTTP/1.1 and
// HTTP/2 from Go's client to the proxy. Brotli is not among them: neither
// Go's standard library nor the module's dependencies encode it.
func TestCompressedRequestBodyPassesThroughUntouched(t *testing.T) {
	f := newFixture(t, "open")
	codings := map[string]func(io.Writer) io.WriteCloser{
		"gzip":    func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) },
		"deflate": func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) }, // RFC 9110 8.4.1.2: zlib
	}
	// Random bytes do not compress: the large body stays past the limit.
	noise := make([]byte, 2*f.proxy.cfg.BodyBufferLimit)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	plains := map[string][]byte{
		"small": []byte(`{"token": "` + f.phB + `", "note": "` + strings.Repeat("compressible ", 50) + `"}`),
		"large": append(append([]byte(nil), noise...), f.phB...),
	}
	for coding, newWriter := range codings {
		for size, plain := range plains {
			var zb bytes.Buffer
			zw := newWriter(&zb)
			_, err := zw.Write(plain)
			must(t, err)
			must(t, zw.Close())
			coded := zb.Bytes()
			if bytes.Contains(coded, []byte(f.phB)) {
				t.Fatalf("%s %s: the placeholder is visible in the coded body; the case tests nothing", coding, size)
			}
			for _, h2 := range []bool{false, true} {
				for _, sized := range []bool{true, false} {
					path := fmt.Sprintf("/coded-%s-%s-h2=%v-sized=%v", coding, size, h2, sized)
					t.Run(path[1:], func(t *testing.T) {
						var body io.Reader = bytes.NewReader(coded)
						if !sized {
							body = io.MultiReader(body) // hides the length from the client
						}
						req, err := http.NewRequest(http.MethodPost, "https://"+f.other+path, body)
						must(t, err)
						req.Header.Set("Content-Encoding", coding)
						req.Header.Set("Content-Type", "application/json")
						res, err := f.goClient(f.proxyURL, h2).Do(req)
						must(t, err)
						io.Copy(io.Discard, res.Body)
						res.Body.Close()
						if res.StatusCode != http.StatusOK {
							t.Fatalf("status %d", res.StatusCode)
						}
						got := upstreamRequest(t, f.up, path)
						if got.Header.Get("Content-Encoding") != coding {
							t.Errorf("upstream Content-Encoding %q, want %q", got.Header.Get("Content-Encoding"), coding)
						}
						if !bytes.Equal(got.Body, coded) {
							t.Fatalf("the upstream got %d bytes, not the %d sent", len(got.Body), len(coded))
						}
						line := f.waitAudit(func(m map[string]any) bool { return m["path"] == path })
						if line["action"] != "forwarded" || line["keys"] != nil || line["bytesIn"] != float64(len(coded)) {
							t.Errorf("audit %v", line)
						}
					})
				}
			}
		}
	}
}

// upstreamRequest is the one request the upstream got for path.
func upstreamRequest(t *testing.T, up *testUpstream, path string) seen {
	t.Helper()
	var found []seen
	for _, r := range up.requests() {
		if r.Path == path {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("the upstream got %d requests for %s, want 1", len(found), path)
	}
	return found[0]
}
