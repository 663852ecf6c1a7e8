package awsfront

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// testClock is the shared front's clock: wall time plus an offset a test
// moves to cross an expiry without sleeping.
type testClock struct{ offset atomic.Int64 }

func (c *testClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// advance moves the clock by d until the test ends.
func (c *testClock) advance(t *testing.T, d time.Duration) {
	c.offset.Add(int64(d))
	t.Cleanup(func() { c.offset.Add(-int64(d)) })
}

// patternReader yields n deterministic pseudo-random bytes without holding
// them, so a test can send 64 MiB (or a GiB) and check what arrives.
type patternReader struct {
	rng  *rand.ChaCha8
	left int64
}

func newPattern(seed byte, n int64) *patternReader {
	var s [32]byte
	s[0] = seed
	return &patternReader{rng: rand.NewChaCha8(s), left: n}
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	n, _ := p.rng.Read(b)
	p.left -= int64(n)
	return n, nil
}

// patternSHA256 is the hex SHA-256 of newPattern(seed, n).
func patternSHA256(seed byte, n int64) string {
	h := sha256.New()
	_, _ = io.Copy(h, newPattern(seed, n))
	return hex.EncodeToString(h.Sum(nil))
}

// chunked describes an aws-chunked upload as a client would send it.
type chunked struct {
	mode  string // one of the three STREAMING values
	size  int64  // decoded length
	seed  byte   // of the pattern the data is
	chunk int    // data bytes per chunk
	// checksum adds an x-amz-checksum-crc32 trailer (trailer modes).
	checksum bool
	// tamper, when not 0, flips a data byte of the tamper-th chunk (from
	// 1) after signing it.
	tamper int
	// unknownLength sends the body with Transfer-Encoding: chunked and no
	// Content-Length, as botocore sends aws-chunked bodies.
	unknownLength bool
	// badChecksum sends a wrong CRC32 (signed correctly: only the value is
	// wrong); badTrailerSig spoils the trailer signature.
	badChecksum, badTrailerSig bool
}

func (c chunked) signed() bool  { return c.mode != streamingUnsignedTrailer }
func (c chunked) trailer() bool { return c.mode != streamingSigned }

// encodedLength is the Content-Length of the encoded body.
func (c chunked) encodedLength() int64 {
	sigExt := int64(0)
	if c.signed() {
		sigExt = int64(len(";chunk-signature=") + 64)
	}
	var n int64
	for left := c.size; left > 0; {
		k := min(left, int64(c.chunk))
		n += int64(len(strconv.FormatInt(k, 16))) + sigExt + 2 + k + 2
		left -= k
	}
	n += 1 + sigExt + 2 // the final chunk's line
	if !c.trailer() {
		return n + 2
	}
	if c.checksum {
		n += int64(len("x-amz-checksum-crc32:") + 8 + 2) // base64 of 4 bytes is 8
	}
	if c.signed() {
		n += int64(len(trailerSignatureKey+":") + 64 + 2)
	}
	return n + 2
}

// request builds the PUT for url, signs its header with the SDK's signer
// and streams the body from a goroutine, chunk signatures from the SDK's
// stream signer (the oracle for the chain).
func (c chunked) request(t *testing.T, url string, creds aws.Credentials, now time.Time) *http.Request {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPut, url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = c.encodedLength()
	if c.unknownLength {
		req.ContentLength = -1
	}
	req.Header.Set("Content-Encoding", "aws-chunked")
	req.Header.Set("X-Amz-Decoded-Content-Length", strconv.FormatInt(c.size, 10))
	req.Header.Set("X-Amz-Content-Sha256", c.mode)
	if c.checksum {
		req.Header.Set("X-Amz-Trailer", "x-amz-checksum-crc32")
	}
	if err := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true }).
		SignHTTP(context.Background(), creds, req, c.mode, "s3", Region, now); err != nil {
		t.Fatal(err)
	}
	seed, err := v4.GetSignedRequestSignature(req)
	if err != nil {
		t.Fatal(err)
	}
	go func() { pw.CloseWithError(c.write(pw, creds, seed, now)) }()
	return req
}

func (c chunked) write(w io.Writer, creds aws.Credentials, seed []byte, now time.Time) error {
	chain := v4.NewStreamSigner(creds, "s3", Region, seed)
	src := newPattern(c.seed, c.size)
	sum := crc32.NewIEEE()
	buf := make([]byte, c.chunk)
	prev := hex.EncodeToString(seed)
	frame := func(data []byte) (string, error) {
		if !c.signed() {
			return strconv.FormatInt(int64(len(data)), 16) + "\r\n", nil
		}
		sig, err := chain.GetSignature(context.Background(), nil, data, now)
		if err != nil {
			return "", err
		}
		prev = hex.EncodeToString(sig)
		return strconv.FormatInt(int64(len(data)), 16) + ";chunk-signature=" + prev + "\r\n", nil
	}
	for i := 1; ; i++ {
		n, err := io.ReadFull(src, buf)
		if n == 0 {
			break
		}
		if err != nil && err != io.ErrUnexpectedEOF {
			return err
		}
		data := buf[:n]
		sum.Write(data)
		line, err := frame(data)
		if err != nil {
			return err
		}
		if i == c.tamper {
			data[n/2] ^= 0x01
		}
		if _, err := io.WriteString(w, line); err != nil {
			return err
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
		if _, err := io.WriteString(w, "\r\n"); err != nil {
			return err
		}
	}
	last, err := frame(nil)
	if err != nil {
		return err
	}
	if !c.trailer() {
		_, err = io.WriteString(w, last+"\r\n")
		return err
	}
	var trailers string
	if c.checksum {
		crc := sum.Sum(nil)
		if c.badChecksum {
			crc[0] ^= 0xff
		}
		trailers = "x-amz-checksum-crc32:" + base64.StdEncoding.EncodeToString(crc) + "\r\n"
	}
	if c.signed() {
		sig := trailerSignature(creds.SecretAccessKey, now, prev, trailers)
		if c.badTrailerSig {
			sig = fmt.Sprintf("%064x", 0)
		}
		trailers += trailerSignatureKey + ":" + sig + "\r\n"
	}
	_, err = io.WriteString(w, last+trailers+"\r\n")
	return err
}

// trailerSignature signs trailers (CRLF-ended lines) as the S3 reference
// describes, written here apart from the front's code: the SDK has no
// trailer signer to serve as the oracle.
func trailerSignature(secret string, now time.Time, prev, trailers string) string {
	mac := func(key []byte, s string) []byte {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(s))
		return m.Sum(nil)
	}
	day := now.UTC().Format("20060102")
	key := mac(mac(mac(mac([]byte("AWS4"+secret), day), Region), "s3"), "aws4_request")
	canonical := sha256.Sum256([]byte(strings.ReplaceAll(trailers, "\r\n", "\n")))
	sts := "AWS4-HMAC-SHA256-TRAILER\n" + now.UTC().Format("20060102T150405Z") + "\n" +
		day + "/" + Region + "/s3/aws4_request\n" + prev + "\n" + hex.EncodeToString(canonical[:])
	return hex.EncodeToString(mac(key, sts))
}
