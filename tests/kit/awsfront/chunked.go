package awsfront

// aws-chunked bodies, checked as they stream (S3 API reference,
// "Signature Calculations for the Authorization Header: Transferring
// Payload in Multiple Chunks" and "... Including Trailing Headers"):
//
//	<hex size>;chunk-signature=<sig>\r\n<data>\r\n   (every chunk, signed modes)
//	<hex size>\r\n<data>\r\n                         (STREAMING-UNSIGNED-PAYLOAD-TRAILER)
//	0...\r\n then trailers "name:value\r\n", in the signed trailer mode
//	x-amz-trailer-signature:<sig>\r\n last, then \r\n.
//
// moto 5.2.1 decodes these bodies itself (s3/responses.py
// _handle_v4_chunk_signatures, _handle_encoded_body) but checks neither a
// chunk signature, a trailer signature, a trailing checksum nor the
// decoded length; it drops the trailers. So the front checks all of that
// and forwards the body byte for byte as it came: moto keeps decoding it,
// and the headers moto checks the signature of stay untouched.

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"hash/crc64"
	"io"
	"slices"
	"strconv"
	"strings"
)

const (
	// maxChunkLine bounds a chunk's header line and a trailer line.
	maxChunkLine = 4 << 10
	// maxTrailerBytes bounds the whole trailer section.
	maxTrailerBytes = 16 << 10
	// emptySHA256 is the hex SHA-256 of nothing, a chunk string to sign's
	// fifth line (it stands for headers chunks do not have).
	emptySHA256         = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	trailerSignatureKey = "x-amz-trailer-signature"
)

// crc64NVME is CRC-64/NVME in hash/crc64's reversed form (reflected
// polynomial 0x9a6c9329ac4bc9b5); hash/crc64's initial and final
// inversions match its all-ones init and xorout.
var crc64NVME = crc64.MakeTable(0x9a6c9329ac4bc9b5)

// newChecksum returns the hash behind an x-amz-checksum-* trailer, nil
// for a name the front does not know (it is then passed unchecked).
func newChecksum(trailer string) hash.Hash {
	switch trailer {
	case "x-amz-checksum-crc32":
		return crc32.NewIEEE()
	case "x-amz-checksum-crc32c":
		return crc32.New(crc32.MakeTable(crc32.Castagnoli))
	case "x-amz-checksum-crc64nvme":
		return crc64.New(crc64NVME)
	case "x-amz-checksum-sha1":
		return sha1.New()
	case "x-amz-checksum-sha256":
		return sha256.New()
	}
	return nil
}

// chunkedBody checks an aws-chunked body while it passes through, and
// hands on each chunk only once it has passed: the chunk's signature, and
// for the final chunk with the trailers also the trailer signature, the
// trailing checksums and the decoded length. A failing chunk is never
// handed on, so moto can never receive a complete body that failed.
// Memory is one chunk (at most maxChunk) plus the reader's buffer.
type chunkedBody struct {
	br *bufio.Reader
	// signed: chunk signatures (and a trailer signature) are required.
	signed, trailer bool
	// key and stsMiddle (the timestamp and scope lines of a string to
	// sign, framed by newlines) and prev (the last signature, hex) form
	// the chain; nil key when unsigned.
	key       []byte
	stsMiddle string
	prev      string
	maxChunk  int
	// wantDecoded is x-amz-decoded-content-length, -1 when absent;
	// dataBytes counts the data read so far (progress counts what passed).
	wantDecoded, dataBytes int64
	// announced are x-amz-trailer's names; sums the checksums of those
	// the front knows.
	announced []string
	sums      map[string]hash.Hash

	out  []byte // checked bytes not yet read
	buf  []byte // the frame being read
	done bool
	progress
}

// newChunkedBody checks body as sent with payload mode (one of the three
// STREAMING values), chained from seed when signed.
func newChunkedBody(body io.Reader, mode string, s signature, secret string, decodedLength, trailerHeader string, maxChunk int) (*chunkedBody, error) {
	c := &chunkedBody{
		br:          bufio.NewReaderSize(body, 64<<10),
		signed:      mode != streamingUnsignedTrailer,
		trailer:     mode != streamingSigned,
		maxChunk:    maxChunk,
		wantDecoded: -1,
		sums:        map[string]hash.Hash{},
	}
	if c.signed {
		c.key = signingKey(secret, s)
		c.stsMiddle = "\n" + s.amzDate + "\n" + s.scope() + "\n"
		c.prev = strings.ToLower(s.sig)
	}
	if decodedLength != "" {
		n, err := strconv.ParseInt(decodedLength, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("awsfront: x-amz-decoded-content-length %q: %w", decodedLength, ErrMalformed)
		}
		c.wantDecoded = n
	} else if c.signed {
		// S3 requires it with a signed chunked body; moto sizes its
		// decode buffer by it.
		return nil, fmt.Errorf("awsfront: %s without x-amz-decoded-content-length: %w", mode, ErrMalformed)
	}
	for _, name := range strings.Split(trailerHeader, ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		if !c.trailer {
			return nil, fmt.Errorf("awsfront: x-amz-trailer with %s, which has no trailers: %w", mode, ErrMalformed)
		}
		c.announced = append(c.announced, name)
		if h := newChecksum(name); h != nil {
			c.sums[name] = h
		}
	}
	return c, nil
}

func (c *chunkedBody) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if err := c.Err(); err != nil {
			return 0, err
		}
		if c.done {
			return 0, io.EOF
		}
		if err := c.nextFrame(); err != nil {
			return 0, c.fail(err)
		}
		c.progress.decoded.Store(c.dataBytes)
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	return n, nil
}

// nextFrame reads and checks one chunk (the final one with the trailers)
// into out.
func (c *chunkedBody) nextFrame() error {
	line, err := c.line()
	if err != nil {
		return err
	}
	sizeText, ext, _ := strings.Cut(strings.TrimSuffix(string(line), "\r\n"), ";")
	size, err := strconv.ParseUint(sizeText, 16, 31)
	if err != nil {
		return fmt.Errorf("awsfront: aws-chunked size %q: %w", sizeText, ErrMalformed)
	}
	if int(size) > c.maxChunk {
		return fmt.Errorf("awsfront: aws-chunked chunk of %d bytes, over the front's limit of %d: %w", size, c.maxChunk, ErrMalformed)
	}
	sig, err := c.chunkSignature(ext)
	if err != nil {
		return err
	}
	// One buffer for the frame, grown to the largest chunk seen.
	c.buf = append(slices.Grow(c.buf[:0], len(line)+int(size)+2), line...)
	start := len(c.buf)
	c.buf = c.buf[:start+int(size)]
	if _, err := io.ReadFull(c.br, c.buf[start:]); err != nil {
		return fmt.Errorf("awsfront: aws-chunked data cut short: %w", errors.Join(ErrIncompleteBody, err))
	}
	data := c.buf[start:]
	if c.signed {
		if err := c.link("AWS4-HMAC-SHA256-PAYLOAD", emptySHA256+"\n"+sha256Hex(data), sig); err != nil {
			return fmt.Errorf("awsfront: aws-chunked chunk after %d bytes: %w", c.dataBytes, err)
		}
	}
	c.dataBytes += int64(size)
	if c.wantDecoded >= 0 && c.dataBytes > c.wantDecoded {
		return fmt.Errorf("awsfront: aws-chunked data longer than x-amz-decoded-content-length %d: %w", c.wantDecoded, ErrIncompleteBody)
	}
	for _, h := range c.sums {
		h.Write(data)
	}
	if size > 0 {
		defer c.progress.decoded.Store(c.dataBytes)
		end := len(c.buf)
		c.buf = c.buf[:end+2]
		if _, err := io.ReadFull(c.br, c.buf[end:]); err != nil || string(c.buf[end:]) != "\r\n" {
			return fmt.Errorf("awsfront: aws-chunked chunk not ended by CRLF: %w", ErrMalformed)
		}
		c.out = c.buf
		return nil
	}
	if err := c.finish(); err != nil {
		return err
	}
	c.out = c.buf
	c.done = true
	return nil
}

// chunkSignature reads a chunk line's extension: the signature in the
// signed modes, nothing in the unsigned one.
func (c *chunkedBody) chunkSignature(ext string) (string, error) {
	if !c.signed {
		if ext != "" {
			return "", fmt.Errorf("awsfront: chunk extension %q in an unsigned aws-chunked body: %w", ext, ErrMalformed)
		}
		return "", nil
	}
	sig, ok := strings.CutPrefix(ext, "chunk-signature=")
	if !ok || len(sig) != 64 {
		return "", fmt.Errorf("awsfront: aws-chunked chunk without a chunk-signature: %w", ErrMalformed)
	}
	return strings.ToLower(sig), nil
}

// link checks one signature of the chain: algo's string to sign over the
// chain so far and last (the string's last lines).
func (c *chunkedBody) link(algo, last, sig string) error {
	sts := algo + c.stsMiddle + c.prev + "\n" + last
	want := hex.EncodeToString(hmacSHA256(c.key, sts))
	if !hmac.Equal([]byte(want), []byte(sig)) {
		return fmt.Errorf("%s signature: %w", algo, ErrSignature)
	}
	c.prev = sig
	return nil
}

// finish reads what follows the final chunk's line (the trailers, then an
// empty line), appending it to buf, and runs the checks that need the
// whole body. It returns only once the body has ended.
func (c *chunkedBody) finish() error {
	var canonical strings.Builder // the trailers as the trailer signature covers them
	var trailerSig string
	got := map[string]string{}
	for total := 0; ; {
		line, err := c.line()
		if err != nil {
			return err
		}
		c.buf = append(c.buf, line...)
		if total += len(line); total > maxTrailerBytes {
			return fmt.Errorf("awsfront: aws-chunked trailers over %d bytes: %w", maxTrailerBytes, ErrMalformed)
		}
		text := strings.TrimSuffix(string(line), "\r\n")
		if text == "" {
			break
		}
		if !c.trailer {
			return fmt.Errorf("awsfront: trailer after the final chunk of a body with none: %w", ErrMalformed)
		}
		if trailerSig != "" {
			return fmt.Errorf("awsfront: trailer after %s: %w", trailerSignatureKey, ErrMalformed)
		}
		name, value, ok := strings.Cut(text, ":")
		name, value = strings.ToLower(strings.TrimSpace(name)), strings.TrimSpace(value)
		if !ok || name == "" {
			return fmt.Errorf("awsfront: trailer line %q: %w", text, ErrMalformed)
		}
		if name == trailerSignatureKey {
			if !c.signed || len(value) != 64 {
				return fmt.Errorf("awsfront: %s in this body: %w", trailerSignatureKey, ErrMalformed)
			}
			trailerSig = strings.ToLower(value)
			continue
		}
		if !slices.Contains(c.announced, name) {
			return fmt.Errorf("awsfront: trailer %q not announced in x-amz-trailer: %w", name, ErrMalformed)
		}
		got[name] = value
		canonical.WriteString(name + ":" + value + "\n")
	}
	// The body must end here; anything after would reach moto unchecked.
	if _, err := c.br.Peek(1); err != io.EOF {
		return fmt.Errorf("awsfront: bytes after the aws-chunked body's end: %w", ErrMalformed)
	}
	if c.signed && c.trailer {
		if trailerSig == "" {
			return fmt.Errorf("awsfront: %s missing: %w", trailerSignatureKey, ErrSignature)
		}
		if err := c.link("AWS4-HMAC-SHA256-TRAILER", sha256Hex([]byte(canonical.String())), trailerSig); err != nil {
			return fmt.Errorf("awsfront: aws-chunked trailers: %w", err)
		}
	}
	if c.wantDecoded >= 0 && c.dataBytes != c.wantDecoded {
		return fmt.Errorf("awsfront: %d data bytes, x-amz-decoded-content-length says %d: %w", c.dataBytes, c.wantDecoded, ErrIncompleteBody)
	}
	for _, name := range c.announced {
		value, ok := got[name]
		if !ok {
			return fmt.Errorf("awsfront: announced trailer %q missing: %w", name, ErrIncompleteBody)
		}
		if h := c.sums[name]; h != nil && base64.StdEncoding.EncodeToString(h.Sum(nil)) != value {
			return fmt.Errorf("awsfront: %s: %w", name, ErrBadDigest)
		}
	}
	return nil
}

// line reads one CRLF-ended line, at most maxChunkLine long.
func (c *chunkedBody) line() ([]byte, error) {
	line, err := c.br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull) || len(line) > maxChunkLine:
		return nil, fmt.Errorf("awsfront: aws-chunked line over %d bytes: %w", maxChunkLine, ErrMalformed)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return nil, fmt.Errorf("awsfront: aws-chunked body ends inside its framing: %w", ErrIncompleteBody)
	case err != nil:
		return nil, fmt.Errorf("awsfront: reading the body: %w", err)
	case !bytes.HasSuffix(line, []byte("\r\n")):
		return nil, fmt.Errorf("awsfront: aws-chunked line not ended by CRLF: %w", ErrMalformed)
	}
	// ReadSlice's bytes are the reader's: the next read overwrites them.
	return append([]byte(nil), line...), nil
}
