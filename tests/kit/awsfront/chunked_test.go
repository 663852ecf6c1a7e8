package awsfront

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The example of the S3 API reference, "Signature Calculations for the
// Authorization Header: Transferring Payload in Multiple Chunks": 66560
// bytes of 'a' in chunks of 64 KiB and 1 KiB, with its documented seed and
// chunk signatures.
const (
	exSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	exSeed   = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
)

var exChunkSigs = []string{
	"ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
	"0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
	"b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
}

func exBody() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "10000;chunk-signature=%s\r\n%s\r\n", exChunkSigs[0], bytes.Repeat([]byte{'a'}, 65536))
	fmt.Fprintf(&b, "400;chunk-signature=%s\r\n%s\r\n", exChunkSigs[1], bytes.Repeat([]byte{'a'}, 1024))
	fmt.Fprintf(&b, "0;chunk-signature=%s\r\n\r\n", exChunkSigs[2])
	return b.Bytes()
}

func exRequest(t *testing.T, body []byte) *http.Request {
	r, err := http.NewRequest(http.MethodPut, "https://s3.amazonaws.com/examplebucket/chunkObject.txt", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("X-Amz-Date", "20130524T000000Z")
	r.Header.Set("X-Amz-Storage-Class", "REDUCED_REDUNDANCY")
	r.Header.Set("X-Amz-Content-Sha256", streamingSigned)
	r.Header.Set("Content-Encoding", "aws-chunked")
	r.Header.Set("X-Amz-Decoded-Content-Length", "66560")
	r.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"+
		"SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class,"+
		"Signature="+exSeed)
	return onWire(t, r)
}

// checkChunked runs r's body through the front's checks as the handler
// does, returning what passed and the error.
func checkChunked(t *testing.T, r *http.Request, secret string) ([]byte, error) {
	t.Helper()
	s, err := parseHeaderSignature(r)
	if err != nil {
		t.Fatal(err)
	}
	mode := r.Header.Get("X-Amz-Content-Sha256")
	if err := verify(r, s, secret, mode); err != nil {
		return nil, err
	}
	c, err := newChunkedBody(r.Body, mode, s, secret, r.Header.Get("X-Amz-Decoded-Content-Length"), r.Header.Get("X-Amz-Trailer"), defaultMaxChunk)
	if err != nil {
		return nil, err
	}
	out, err := io.ReadAll(c)
	if err != nil && !errors.Is(c.Err(), err) {
		t.Fatalf("Read's error %v is not Err's %v", err, c.Err())
	}
	return out, err
}

// TestChunkedAWSExample: the documented request verifies, header and chain,
// and passes byte for byte.
func TestChunkedAWSExample(t *testing.T) {
	body := exBody()
	out, err := checkChunked(t, exRequest(t, body), exSecret)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, body) {
		t.Fatal("the checked body is not the body sent")
	}
	// Each documented signature matters: spoil one, it is refused.
	for i, sig := range exChunkSigs {
		bad := bytes.Replace(body, []byte(sig), []byte(strings.Repeat("0", 64)), 1)
		if _, err := checkChunked(t, exRequest(t, bad), exSecret); !errors.Is(err, ErrSignature) {
			t.Errorf("chunk %d with a zero signature: %v", i, err)
		}
	}
}

// TestChunkedModesAgainstTheSDKChain: bodies whose chunk signatures come
// from aws-sdk-go-v2's stream signer pass in every mode; what is handed on
// stops before a failing chunk, and the whole body is never handed on when
// a check at its end fails.
func TestChunkedModesAgainstTheSDKChain(t *testing.T) {
	const size = 200<<10 + 17
	base := []chunked{
		{mode: streamingSigned},
		{mode: streamingSignedTrailer, checksum: true},
		{mode: streamingSignedTrailer},
		{mode: streamingUnsignedTrailer, checksum: true},
	}
	for _, b := range base {
		b.size, b.chunk, b.seed = size, 64<<10, 7
		cases := []struct {
			name string
			c    chunked
			want error
		}{
			{"good", b, nil},
			{"tampered chunk", with(b, func(c *chunked) { c.tamper = 2 }), ErrSignature},
			{"bad checksum", with(b, func(c *chunked) { c.badChecksum = true }), ErrBadDigest},
			{"bad trailer signature", with(b, func(c *chunked) { c.badTrailerSig = true }), ErrSignature},
		}
		for _, tc := range cases {
			switch {
			case tc.c.tamper != 0 && !tc.c.signed():
				tc.want = nil // nothing signs the data; only a checksum would catch it
				if tc.c.checksum {
					tc.want = ErrBadDigest
				}
			case tc.c.badChecksum && !tc.c.checksum, tc.c.badTrailerSig && !(tc.c.signed() && tc.c.trailer()):
				continue
			}
			name := b.mode
			if b.checksum {
				name += "+crc32"
			}
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				r := onWire(t, tc.c.request(t, "https://bucket.s3.us-east-1.amazonaws.com/k", testCreds, testTime))
				out, err := checkChunked(t, r, testCreds.SecretAccessKey)
				if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
					t.Fatalf("got %v, want %v", err, tc.want)
				}
				if tc.want != nil && int64(len(out)) >= tc.c.encodedLength() {
					t.Fatalf("a failing body was handed on whole (%d bytes)", len(out))
				}
				if tc.want == nil && int64(len(out)) != tc.c.encodedLength() {
					t.Fatalf("handed on %d bytes of %d", len(out), tc.c.encodedLength())
				}
			})
		}
	}
}

func with(c chunked, f func(*chunked)) chunked {
	f(&c)
	return c
}

func TestChunkedFraming(t *testing.T) {
	unsigned := func(body string, decoded, trailer string) error {
		c, err := newChunkedBody(strings.NewReader(body), streamingUnsignedTrailer, signature{}, "", decoded, trailer, 1024)
		if err != nil {
			return err
		}
		_, err = io.ReadAll(c)
		return err
	}
	for _, tc := range []struct {
		name, body, decoded, trailer string
		want                         error
	}{
		{"good", "3\r\nabc\r\n0\r\n\r\n", "3", "", nil},
		{"length differs", "3\r\nabc\r\n0\r\n\r\n", "4", "", ErrIncompleteBody},
		{"cut in data", "3\r\nab", "3", "", ErrIncompleteBody},
		{"cut before the end", "3\r\nabc\r\n0\r\n", "3", "", ErrIncompleteBody},
		{"no CRLF after data", "3\r\nabcX\n0\r\n\r\n", "3", "", ErrMalformed},
		{"bad size", "x\r\nabc\r\n0\r\n\r\n", "3", "", ErrMalformed},
		{"over the chunk limit", "401\r\n", "", "", ErrMalformed},
		{"signature in unsigned", "3;chunk-signature=" + strings.Repeat("a", 64) + "\r\nabc\r\n0\r\n\r\n", "3", "", ErrMalformed},
		{"after the end", "3\r\nabc\r\n0\r\n\r\nmore", "3", "", ErrMalformed},
		{"unannounced trailer", "3\r\nabc\r\n0\r\nx-amz-checksum-crc32:NSRBwg==\r\n\r\n", "3", "", ErrMalformed},
		{"announced trailer missing", "3\r\nabc\r\n0\r\n\r\n", "3", "x-amz-checksum-crc32", ErrIncompleteBody},
		{"crc32 of abc", "3\r\nabc\r\n0\r\nx-amz-checksum-crc32:NSRBwg==\r\n\r\n", "3", "x-amz-checksum-crc32", nil},
		{"crc32 wrong", "3\r\nabc\r\n0\r\nx-amz-checksum-crc32:NSRBwh==\r\n\r\n", "3", "x-amz-checksum-crc32", ErrBadDigest},
		{"crc32c of abc", "3\r\nabc\r\n0\r\nx-amz-checksum-crc32c:Nks/tw==\r\n\r\n", "3", "x-amz-checksum-crc32c", nil},
		{"sha256 of abc", "3\r\nabc\r\n0\r\nx-amz-checksum-sha256:ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=\r\n\r\n", "3", "x-amz-checksum-sha256", nil},
	} {
		if err := unsigned(tc.body, tc.decoded, tc.trailer); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestCRC64NVME: the check value of CRC-64/NVME (the CRC catalogue's, for
// "123456789"), so the table's polynomial form is right.
func TestCRC64NVME(t *testing.T) {
	if got := crc64.Checksum([]byte("123456789"), crc64NVME); got != 0xae8b14860a799888 {
		t.Fatalf("CRC-64/NVME check value %#x", got)
	}
}

func TestDigestBodyHoldsBackTheEnd(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 20000)
	good := newDigestBody(bytes.NewReader(body), sha256Hex(body))
	if out, err := io.ReadAll(good); err != nil || !bytes.Equal(out, body) {
		t.Fatalf("good body: %d bytes, %v", len(out), err)
	}
	bad := newDigestBody(bytes.NewReader(body), sha256Hex(body[1:]))
	out, err := io.ReadAll(bad)
	if !errors.Is(err, ErrContentSHA256) || !errors.Is(bad.Err(), ErrContentSHA256) {
		t.Fatalf("bad body: %v", err)
	}
	if len(out) >= len(body) {
		t.Fatal("a body that failed its digest was handed on whole")
	}
}
