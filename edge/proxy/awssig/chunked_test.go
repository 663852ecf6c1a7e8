package awssig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// The example of AWS's "Signature Calculations for the Authorization Header:
// Transferring Payload in Multiple Chunks (Chunked Upload)".
const (
	exID       = "AKIAIOSFODNN7EXAMPLE"
	exSecret   = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	exDate     = "20130524T000000Z"
	exSeed     = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
	exSigned   = "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class"
	exBodySize = 66824
)

var exChunkSigs = []string{
	"ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
	"0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
	"b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
}

// exBody is the example's body, with the documented signatures written in
// literally rather than computed.
func exBody() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "10000;chunk-signature=%s\r\n%s\r\n", exChunkSigs[0], bytes.Repeat([]byte{'a'}, 65536))
	fmt.Fprintf(&b, "400;chunk-signature=%s\r\n%s\r\n", exChunkSigs[1], bytes.Repeat([]byte{'a'}, 1024))
	fmt.Fprintf(&b, "0;chunk-signature=%s\r\n\r\n", exChunkSigs[2])
	return b.Bytes()
}

// exRequest is the example's request as the proxy receives it.
func exRequest(t testing.TB, body []byte) *http.Request {
	r, err := http.NewRequest(http.MethodPut, "https://s3.amazonaws.com/examplebucket/chunkObject.txt", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("X-Amz-Date", exDate)
	r.Header.Set("X-Amz-Storage-Class", "REDUCED_REDUNDANCY")
	r.Header.Set("X-Amz-Content-Sha256", streamingPayload)
	r.Header.Set("Content-Encoding", "aws-chunked")
	r.Header.Set("X-Amz-Decoded-Content-Length", "66560")
	r.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+exID+"/20130524/us-east-1/s3/aws4_request,SignedHeaders="+exSigned+",Signature="+exSeed)
	return onWire(t, r)
}

func TestAWSChunkedExample(t *testing.T) {
	body := exBody()
	if len(body) != exBodySize {
		t.Fatalf("example body is %d bytes, documented Content-Length %d", len(body), exBodySize)
	}
	// The test's own chain reproduces the documented chunk signatures.
	c := newTChain(exSecret, exDate, "us-east-1", "s3", exSeed)
	for i, n := range []int{65536, 1024, 0} {
		if got := c.chunk(bytes.Repeat([]byte{'a'}, n)); got != exChunkSigs[i] {
			t.Fatalf("test chain chunk %d: %s", i, got)
		}
	}

	r := exRequest(t, body)
	sig := mustParse(t, r)
	if sig.Payload != Streaming || sig.Signature != exSeed || strings.Join(sig.SignedHeaders, ";") != exSigned {
		t.Fatalf("parsed %+v", sig)
	}
	if err := Verify(r, sig, exSecret, ""); err != nil {
		t.Fatalf("documented seed signature does not verify: %v", err)
	}

	// Re-signed with the very same credentials, header and body come out
	// as they went in: the documented values, computed by the package.
	same := Credentials{AccessKeyID: exID, SecretAccessKey: exSecret}
	seed, err := Resign(r, sig, same, "")
	if err != nil || seed != exSeed {
		t.Fatalf("Resign with the example's credentials: %v, seed matches: %v", err, seed == exSeed)
	}
	cr, err := NewChunkResigner(iotest.OneByteReader(bytes.NewReader(body)), sig, exSecret, same, seed)
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(iotest.OneByteReader(cr))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, body) {
		t.Fatal("re-signing with the same credentials changed the body")
	}
}

func TestAWSChunkedExampleResigned(t *testing.T) {
	body := exBody()
	r := exRequest(t, body)
	sig := mustParse(t, r)
	if err := Verify(r, sig, exSecret, ""); err != nil {
		t.Fatal(err)
	}
	seed, err := Resign(r, sig, realCreds, "")
	if err != nil {
		t.Fatal(err)
	}
	// The re-signed header verifies with the real secret, with the token
	// now signed.
	sig2 := mustParse(t, r)
	if sig2.AccessKeyID != realCreds.AccessKeyID || sig2.Signature != seed || !contains(sig2.SignedHeaders, "x-amz-security-token") {
		t.Fatalf("re-signed header parsed as %+v", sig2)
	}
	if err := Verify(r, sig2, realCreds.SecretAccessKey, ""); err != nil {
		t.Fatalf("re-signed header: %v", err)
	}

	cr, err := NewChunkResigner(bytes.NewReader(body), sig, exSecret, realCreds, seed)
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(cr)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(body) {
		t.Fatalf("output %d bytes, input %d", len(out), len(body))
	}
	data, _ := decodeChunked(t, newTChain(realCreds.SecretAccessKey, exDate, "us-east-1", "s3", seed), out, false)
	if !bytes.Equal(data, bytes.Repeat([]byte{'a'}, 66560)) {
		t.Fatal("data changed")
	}
}

// TestAWSTrailerExampleChain: the chain of AWS's trailing-headers example
// ("Signature Calculations for the Authorization Header: Including Trailing
// Headers"), from its seed: chunk and trailer signatures as documented.
func TestAWSTrailerExampleChain(t *testing.T) {
	const seed = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e"
	sigs := []string{
		"b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
		"1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
		"2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
	}
	const trailer = "x-amz-checksum-crc32c:sOO8/Q=="
	const trailerSig = "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435"
	var b bytes.Buffer
	fmt.Fprintf(&b, "10000;chunk-signature=%s\r\n%s\r\n", sigs[0], bytes.Repeat([]byte{'a'}, 65536))
	fmt.Fprintf(&b, "400;chunk-signature=%s\r\n%s\r\n", sigs[1], bytes.Repeat([]byte{'a'}, 1024))
	fmt.Fprintf(&b, "0;chunk-signature=%s\r\n%s\r\nx-amz-trailer-signature:%s\r\n\r\n", sigs[2], trailer, trailerSig)
	body := b.Bytes()

	tm, _ := time.Parse(amzDateLayout, exDate)
	sig := &Signature{AccessKeyID: exID, Date: "20130524", Region: "us-east-1", Service: "s3",
		Signature: seed, Time: tm, Payload: StreamingTrailer,
		verified: true} // the example's header is not reproduced; its chain is
	same := Credentials{AccessKeyID: exID, SecretAccessKey: exSecret}
	cr, err := NewChunkResigner(bytes.NewReader(body), sig, exSecret, same, seed)
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(cr)
	if err != nil {
		t.Fatalf("documented trailer chain: %v", err)
	}
	if !bytes.Equal(out, body) {
		t.Fatal("re-signing with the same credentials changed the body")
	}
	// And the test's own chain agrees with the documented trailer signature.
	c := newTChain(exSecret, exDate, "us-east-1", "s3", sigs[2])
	if got := c.trailer([]string{trailer}); got != trailerSig {
		t.Fatalf("test chain trailer signature %s", got)
	}
}

// chunkedRequest is a StreamingTrailer PUT (Streaming when trailers is nil)
// signed by aws-sdk-go-v2 with the task's credentials, its body written by
// the test's chain.
func chunkedRequest(t testing.TB, data []byte, sizes []int, trailers []string) (*http.Request, []byte) {
	const amzDate = "20250301T123456Z"
	tm, _ := time.Parse(amzDateLayout, amzDate)
	// The header signature is computed over the final Content-Length, which
	// depends only on sizes: build once with a dummy seed to learn it.
	size := len(encodeChunked(newTChain(taskCreds.SecretAccessKey, amzDate, "eu-west-1", "s3", strings.Repeat("0", 64)), data, sizes, trailers))
	r, err := http.NewRequest(http.MethodPut, "https://bucket.s3.eu-west-1.amazonaws.com/dir/object.bin", nil)
	if err != nil {
		t.Fatal(err)
	}
	r.ContentLength = int64(size)
	r.Header.Set("Content-Encoding", "aws-chunked")
	mode := streamingPayload
	if trailers != nil {
		mode = streamingTrailer
		r.Header.Set("X-Amz-Trailer", "x-amz-checksum-crc32")
	}
	r.Header.Set("X-Amz-Content-Sha256", mode)
	r.Header.Set("X-Amz-Decoded-Content-Length", fmt.Sprint(len(data)))
	err = v4.NewSigner().SignHTTP(context.Background(), taskCreds, r, mode, "s3", "eu-west-1", tm,
		func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	if err != nil {
		t.Fatal(err)
	}
	seed := mustParse(t, r).Signature
	body := encodeChunked(newTChain(taskCreds.SecretAccessKey, amzDate, "eu-west-1", "s3", seed), data, sizes, trailers)
	if len(body) != size {
		t.Fatalf("body %d bytes, Content-Length %d", len(body), size)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return onWire(t, r), body
}

// resignBody runs the whole proxy side on r: parse, verify, re-sign header
// and body with realCreds.
func resignBody(t testing.TB, r *http.Request, body io.Reader) (*ChunkResigner, string) {
	t.Helper()
	sig := mustParse(t, r)
	if err := Verify(r, sig, taskCreds.SecretAccessKey, ""); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	seed, err := Resign(r, sig, realCreds, "")
	if err != nil {
		t.Fatal(err)
	}
	cr, err := NewChunkResigner(body, sig, taskCreds.SecretAccessKey, realCreds, seed)
	if err != nil {
		t.Fatal(err)
	}
	return cr, seed
}

func TestChunkResignerTrailer(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 10000) // 160000 bytes
	trailers := []string{"x-amz-checksum-crc32:sOO8/Q=="}
	r, body := chunkedRequest(t, data, []int{64 << 10}, trailers)
	cr, seed := resignBody(t, r, r.Body)
	out, err := io.ReadAll(cr)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(body) {
		t.Fatalf("output %d bytes, input %d", len(out), len(body))
	}
	gotData, gotTrailers := decodeChunked(t, newTChain(realCreds.SecretAccessKey, "20250301T123456Z", "eu-west-1", "s3", seed), out, true)
	if !bytes.Equal(gotData, data) || strings.Join(gotTrailers, "|") != trailers[0] {
		t.Fatal("data or trailers changed")
	}
	// The header verifies with the real secret.
	sig := mustParse(t, r)
	if err := Verify(r, sig, realCreds.SecretAccessKey, ""); err != nil {
		t.Fatal(err)
	}
}

// TestChunkResignerReads: odd read sizes on either side give the same bytes.
func TestChunkResignerReads(t *testing.T) {
	data := bytes.Repeat([]byte("xyz"), 5000)
	_, body := chunkedRequest(t, data, []int{1000}, []string{"x-amz-checksum-crc32:AAAAAA==", "x-amz-meta-note:two  spaces"})
	var want []byte
	for i, wrap := range []func(io.Reader) io.Reader{
		func(r io.Reader) io.Reader { return r },
		iotest.OneByteReader,
		iotest.HalfReader,
		iotest.DataErrReader,
	} {
		r, _ := chunkedRequest(t, data, []int{1000}, []string{"x-amz-checksum-crc32:AAAAAA==", "x-amz-meta-note:two  spaces"})
		cr, _ := resignBody(t, r, wrap(bytes.NewReader(body)))
		if i == 0 {
			var err error
			if want, err = io.ReadAll(cr); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := iotest.TestReader(cr, want); err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
	}
}

// frameEnds gives the byte offsets at which each frame of an aws-chunked
// body ends (the final frame includes the trailers).
func frameEnds(body []byte) []int {
	var ends []int
	at := 0
	for {
		eol := bytes.IndexByte(body[at:], '\n')
		var n int
		fmt.Sscanf(string(body[at:at+eol]), "%x;", &n)
		at += eol + 1 + n
		if n == 0 {
			ends = append(ends, len(body))
			return ends
		}
		at += 2
		ends = append(ends, at)
	}
}

func TestChunkResignerTampered(t *testing.T) {
	data := bytes.Repeat([]byte("payload!"), 2000) // 16000 bytes: frames of 4096 x3, 3712, final
	trailers := []string{"x-amz-checksum-crc32:sOO8/Q=="}
	_, body := chunkedRequest(t, data, []int{4096}, trailers)
	ends := frameEnds(body)
	if len(ends) != 5 {
		t.Fatalf("%d frames", len(ends))
	}
	sigAt := func(frame int) int {
		start := 0
		if frame > 0 {
			start = ends[frame-1]
		}
		return start + bytes.Index(body[start:], []byte("chunk-signature=")) + len("chunk-signature=")
	}
	cases := []struct {
		name   string
		at     int // byte to flip
		passed int // bytes that must come out before the error
	}{
		{"first chunk signature", sigAt(0) + 10, 0},
		{"second chunk data", ends[0] + 200, ends[0]},
		{"third chunk signature", sigAt(2), ends[1]},
		{"final chunk signature", sigAt(4) + 63, ends[3]},
		{"trailer value", len(body) - 100, ends[3]},
		{"trailer signature", len(body) - 5, ends[3]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := bytes.Clone(body)
			if bad[tc.at] == 'a' {
				bad[tc.at] = 'b'
			} else {
				bad[tc.at] = 'a'
			}
			r, _ := chunkedRequest(t, data, []int{4096}, trailers)
			cr, _ := resignBody(t, r, bytes.NewReader(bad))
			out, err := io.ReadAll(iotest.OneByteReader(cr))
			if !errors.Is(err, ErrMismatch) {
				t.Fatalf("err %v", err)
			}
			if len(out) != tc.passed {
				t.Fatalf("%d bytes came out before the error, want %d", len(out), tc.passed)
			}
			if _, err2 := cr.Read(make([]byte, 10)); err2 != err {
				t.Fatalf("error not sticky: %v", err2)
			}
		})
	}
}

func TestChunkResignerMalformed(t *testing.T) {
	data := bytes.Repeat([]byte("z"), 3000)
	_, body := chunkedRequest(t, data, []int{1000}, []string{"x-amz-checksum-crc32:sOO8/Q=="})
	sig64 := strings.Repeat("a", 64)
	cases := []struct {
		name, reason string
		body         []byte
	}{
		{"above MaxChunk", "chunk_too_large", []byte(fmt.Sprintf("%x;chunk-signature=%s\r\n", MaxChunk+1, sig64))},
		{"no signature", "chunk_malformed", []byte("3e8\r\n")},
		{"short signature", "chunk_malformed", []byte("3e8;chunk-signature=abc\r\n")},
		{"bad size", "chunk_malformed", []byte("3g8;chunk-signature=" + sig64 + "\r\n")},
		{"header too long", "chunk_malformed", bytes.Repeat([]byte("1"), 5000)},
		{"truncated in data", "chunk_truncated", body[:500]},
		{"truncated before final", "chunk_truncated", body[:frameEnds(body)[2]]},
		{"truncated in trailers", "chunk_truncated", body[:len(body)-3]},
		{"data after final", "chunk_malformed", append(bytes.Clone(body), 'x')},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := chunkedRequest(t, data, []int{1000}, []string{"x-amz-checksum-crc32:sOO8/Q=="})
			cr, _ := resignBody(t, r, bytes.NewReader(tc.body))
			_, err := io.ReadAll(cr)
			var me *MalformedError
			if !errors.As(err, &me) || me.Reason != tc.reason {
				t.Fatalf("err %v, want reason %s", err, tc.reason)
			}
			if strings.Contains(err.Error(), sig64) {
				t.Fatal("error carries a signature")
			}
		})
	}
}

// TestChunkResignerStreamingEnd: a Streaming (no trailer) body must end
// with the final chunk's CRLF, not trailers.
func TestChunkResignerStreamingEnd(t *testing.T) {
	body := exBody()
	bad := append(bytes.Clone(body[:len(body)-2]), "x-amz-checksum-crc32:AAAAAA==\r\n\r\n"...)
	r := exRequest(t, body)
	sig := mustParse(t, r)
	if err := Verify(r, sig, exSecret, ""); err != nil {
		t.Fatal(err)
	}
	cr, err := NewChunkResigner(bytes.NewReader(bad), sig, exSecret, realCreds, exSeed)
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(cr)
	var me *MalformedError
	if !errors.As(err, &me) || me.Reason != "chunk_malformed" || len(out) != len(body)-86 {
		t.Fatalf("err %v after %d bytes", err, len(out))
	}
}

func TestChunkResignerRefuses(t *testing.T) {
	r := exRequest(t, exBody())
	sig := mustParse(t, r)
	if _, err := NewChunkResigner(r.Body, sig, exSecret, realCreds, exSeed); !errors.Is(err, ErrNotVerified) {
		t.Fatalf("unverified: %v", err)
	}
	if err := Verify(r, sig, exSecret, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := NewChunkResigner(r.Body, sig, exSecret, realCreds, "short"); err == nil {
		t.Fatal("bad seed accepted")
	}
	sig.Payload = StreamingUnsignedTrailer
	if _, err := NewChunkResigner(r.Body, sig, exSecret, realCreds, exSeed); err == nil {
		t.Fatal("unsigned-trailer payload accepted")
	}
}

// TestChunkResignerVaryingChunks: chunks of any size up to MaxChunk, in any
// order, including exactly MaxChunk.
func TestChunkResignerVaryingChunks(t *testing.T) {
	sizes := []int{1, 100, 70000, MaxChunk, 5, 65536}
	total := 0
	for _, n := range sizes {
		total += n
	}
	data := bytes.Repeat([]byte("v"), total)
	r, body := chunkedRequest(t, data, sizes, nil)
	cr, seed := resignBody(t, r, r.Body)
	out, err := io.ReadAll(cr)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := decodeChunked(t, newTChain(realCreds.SecretAccessKey, "20250301T123456Z", "eu-west-1", "s3", seed), out, false)
	if !bytes.Equal(got, data) || len(out) != len(body) {
		t.Fatal("data or length changed")
	}
	if cap(cr.buf) > MaxChunk+maxHeader {
		t.Fatalf("buffer grew to %d", cap(cr.buf))
	}
}
