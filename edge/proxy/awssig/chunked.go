package awssig

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
)

// MaxChunk is the largest aws-chunked chunk a ChunkResigner takes. A
// chunk's new signature precedes its data, so the whole chunk is held
// before any of it goes on; this bounds that. SDKs write 64 KiB (Go, botocore)
// to 128 KiB (Java) chunks and S3 asks for at least 8 KiB; 8 MiB leaves
// every known writer 64 times the room and keeps a stream's memory at one
// such chunk, allocated only as large as the largest chunk seen.
const MaxChunk = 8 << 20

// maxTrailers bounds the trailer section (checksums are a line each).
const maxTrailers = 16 << 10

// maxHeader is the longest chunk header parseChunkHeader takes.
const maxHeader = 16 + len(chunkSigField) + 64 + 2

const chunkSigField = ";chunk-signature="
const trailerSigField = "x-amz-trailer-signature:"

// ChunkResigner is the body of a Streaming or StreamingTrailer request
// re-signed: it reads the task's aws-chunked body
//
//	<hex size>;chunk-signature=<64 hex>\r\n<data>\r\n ...
//	0;chunk-signature=<64 hex>\r\n
//	    then "\r\n" (Streaming), or
//	    name:value\r\n ... x-amz-trailer-signature:<64 hex>\r\n\r\n (StreamingTrailer)
//
// checks each signature in the task's chain (seeded by the task's header
// signature, keyed by the placeholder secret) and gives the same bytes with
// every signature replaced by the real chain's (seeded by Resign's result,
// keyed by the real secret). Signatures are fixed-width, so the output is
// exactly as long as the input: Content-Length and
// x-amz-decoded-content-length stay right.
//
// A frame goes on only once verified: a mismatch, a malformed or oversized
// frame, or a body that ends early is an error from Read before any byte of
// that frame, after which Read returns the same error. A caller forwarding
// the stream must then abort the upstream request (net/http's transport
// does so when a body with a Content-Length errors), so the service never
// gets a complete stream. The final frame goes on only once the body is
// known to end there. For one goroutine at a time.
type ChunkResigner struct {
	br       *bufio.Reader
	trailers bool
	// payloadPrefix, trailerPrefix: a string to sign's first three lines,
	// the same in both chains since the scope and X-Amz-Date are kept.
	payloadPrefix, trailerPrefix []byte
	task, real                   chain
	data                         hash.Hash
	digest                       [64]byte // hex SHA-256 of the chunk or the trailers
	sum                          [sha256.Size]byte
	buf                          []byte // the frame at hand, reused
	out                          []byte // what of buf is yet to be read
	frame                        int
	done                         bool
	err                          error
}

// chain is one of the two signature chains: its key and its last link.
// Its scratch lives here, not on the stack, so that a frame allocates
// nothing (what an interface method is given escapes).
type chain struct {
	mac  hash.Hash
	prev [64]byte
	next [64]byte
	sum  [sha256.Size]byte
}

// link computes into c.next the signature whose string to sign is prefix,
// the previous signature, mid, then digest; the chain advances only when
// the caller copies next to prev.
func (c *chain) link(prefix, mid, digest []byte) {
	c.mac.Reset()
	c.mac.Write(prefix)
	c.mac.Write(c.prev[:])
	c.mac.Write(mid)
	c.mac.Write(digest)
	hex.Encode(c.next[:], c.mac.Sum(c.sum[:0]))
}

// NewChunkResigner re-signs body, the aws-chunked body of the request sig
// was parsed from (Payload Streaming or StreamingTrailer, Verify passed).
// The task's chain is keyed by taskSecret, the placeholder secret sig was
// verified with; the real chain by creds' secret, seeded by seed, Resign's
// result. A StreamingUnsignedTrailer body carries no signatures and needs
// no resigner.
func NewChunkResigner(body io.Reader, sig *Signature, taskSecret string, creds Credentials, seed string) (*ChunkResigner, error) {
	if !sig.verified {
		return nil, ErrNotVerified
	}
	if sig.Payload != Streaming && sig.Payload != StreamingTrailer {
		return nil, fmt.Errorf("awssig: payload mode %v has no signed chunks", sig.Payload)
	}
	if taskSecret == "" || creds.SecretAccessKey == "" {
		return nil, malformed("credentials_malformed", "secret empty")
	}
	if !isHex64(seed) {
		return nil, malformed("signature_malformed", "seed signature malformed")
	}
	c := &ChunkResigner{
		br:       bufio.NewReaderSize(body, 4096),
		trailers: sig.Payload == StreamingTrailer,
		data:     sha256.New(),
	}
	mid := "\n" + sig.amzDate() + "\n" + sig.scope() + "\n"
	c.payloadPrefix = []byte("AWS4-HMAC-SHA256-PAYLOAD" + mid)
	c.trailerPrefix = []byte("AWS4-HMAC-SHA256-TRAILER" + mid)
	c.task.mac = hmac.New(sha256.New, signingKey(taskSecret, sig.Date, sig.Region, sig.Service))
	copy(c.task.prev[:], sig.Signature)
	c.real.mac = hmac.New(sha256.New, signingKey(creds.SecretAccessKey, sig.Date, sig.Region, sig.Service))
	copy(c.real.prev[:], seed)
	return c, nil
}

// Read gives the re-signed stream.
func (c *ChunkResigner) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if c.done {
			c.err = io.EOF
			continue
		}
		c.err = c.nextFrame()
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	return n, nil
}

var (
	emptyHashLine = []byte("\n" + emptyHash + "\n")
	newline       = []byte{'\n'}
)

// relink checks sent, the task's signature of the link whose digest is in
// c.digest, then overwrites it with the real chain's, advancing both.
func (c *ChunkResigner) relink(prefix, mid, sent []byte) error {
	c.task.link(prefix, mid, c.digest[:])
	if subtle.ConstantTimeCompare(c.task.next[:], sent) != 1 {
		return ErrMismatch
	}
	c.task.prev = c.task.next
	c.real.link(prefix, mid, c.digest[:])
	c.real.prev = c.real.next
	copy(sent, c.real.prev[:])
	return nil
}

// nextFrame reads, verifies and re-signs one chunk (with the trailers after
// the final one) into c.buf, and sets c.out to it.
func (c *ChunkResigner) nextFrame() error {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return c.readErr(err, "chunk header too long")
	}
	size, sigAt, ok := parseChunkHeader(line)
	if !ok {
		return malformed("chunk_malformed", "aws-chunked chunk header malformed")
	}
	if size > MaxChunk {
		return malformed("chunk_too_large", "aws-chunked chunk above MaxChunk")
	}
	h := len(line)
	n := h + int(size)
	final := size == 0
	if !final || !c.trailers {
		n += 2 // the data's CRLF; after a trailer stream's final chunk come the trailers
	}
	if cap(c.buf) < n {
		// Doubling, so that a stream of growing chunks reallocates only
		// O(log MaxChunk) times; never beyond one largest frame.
		c.buf = make([]byte, n, max(n, min(2*cap(c.buf), MaxChunk+maxHeader)))
	}
	buf := c.buf[:n]
	copy(buf, line)
	if _, err := io.ReadFull(c.br, buf[h:]); err != nil {
		return c.readErr(err, "")
	}
	if !final || !c.trailers {
		if buf[n-2] != '\r' || buf[n-1] != '\n' {
			return malformed("chunk_malformed", "aws-chunked chunk data not followed by CRLF")
		}
	}
	c.data.Reset()
	c.data.Write(buf[h : h+int(size)])
	hex.Encode(c.digest[:], c.data.Sum(c.sum[:0]))
	sent := buf[sigAt : sigAt+64]
	if err := c.relink(c.payloadPrefix, emptyHashLine, sent); err != nil {
		return fmt.Errorf("awssig: aws-chunked chunk %d: %w", c.frame, err)
	}
	c.frame++

	if final {
		if c.trailers {
			if buf, err = c.readTrailers(buf); err != nil {
				return err
			}
			c.buf = buf
		}
		// The final frame goes on only if nothing follows it: bytes after
		// it would reach the service outside every signature.
		if _, err := c.br.ReadByte(); err != io.EOF {
			if err == nil {
				return malformed("chunk_malformed", "aws-chunked body continues after its final chunk")
			}
			return err
		}
		c.done = true
	}
	c.out = buf
	return nil
}

// readTrailers appends the trailers and their signature line to buf,
// verifying the signature and replacing it by the real chain's. The string
// to sign hashes each trailer line as sent, with "\n" for its CRLF.
func (c *ChunkResigner) readTrailers(buf []byte) ([]byte, error) {
	start := len(buf)
	c.data.Reset()
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return nil, c.readErr(err, "trailer line too long")
		}
		if len(buf)-start+len(line) > maxTrailers {
			return nil, malformed("trailer_malformed", "aws-chunked trailers too long")
		}
		if len(line) < 2 || line[len(line)-2] != '\r' {
			return nil, malformed("trailer_malformed", "aws-chunked trailer line not ended by CRLF")
		}
		body := line[:len(line)-2]
		if bytes.HasPrefix(body, []byte(trailerSigField)) {
			if !isHex64(body[len(trailerSigField):]) {
				return nil, malformed("trailer_malformed", "aws-chunked trailer signature malformed")
			}
			buf = append(buf, line...)
			break
		}
		if i := bytes.IndexByte(body, ':'); i <= 0 {
			return nil, malformed("trailer_malformed", "aws-chunked trailer line malformed")
		}
		c.data.Write(body)
		c.data.Write(newline)
		buf = append(buf, line...)
	}
	sigAt := len(buf) - 2 - 64
	hex.Encode(c.digest[:], c.data.Sum(c.sum[:0]))
	if err := c.relink(c.trailerPrefix, newline, buf[sigAt:sigAt+64]); err != nil {
		return nil, fmt.Errorf("awssig: aws-chunked trailer: %w", err)
	}
	var end [2]byte
	if _, err := io.ReadFull(c.br, end[:]); err != nil {
		return nil, c.readErr(err, "")
	}
	if end != [2]byte{'\r', '\n'} {
		return nil, malformed("trailer_malformed", "aws-chunked trailers not ended by an empty line")
	}
	return append(buf, end[:]...), nil
}

// readErr names a failed read: the body ending early is chunk_truncated, a
// line longer than the buffer is malformed, the body's own error passes.
func (c *ChunkResigner) readErr(err error, tooLong string) error {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return malformed("chunk_truncated", "aws-chunked body truncated")
	case errors.Is(err, bufio.ErrBufferFull):
		return malformed("chunk_malformed", "aws-chunked "+tooLong)
	}
	return err
}

// parseChunkHeader reads "<hex size>;chunk-signature=<64 hex>\r\n" and
// returns the size and where the signature starts.
func parseChunkHeader(line []byte) (size uint64, sigAt int, ok bool) {
	i := bytes.IndexByte(line, ';')
	if i <= 0 || i > 16 || len(line) != i+len(chunkSigField)+64+2 {
		return 0, 0, false
	}
	if string(line[i:i+len(chunkSigField)]) != chunkSigField || string(line[len(line)-2:]) != "\r\n" {
		return 0, 0, false
	}
	sigAt = i + len(chunkSigField)
	if !isHex64(line[sigAt : sigAt+64]) {
		return 0, 0, false
	}
	for _, d := range line[:i] {
		switch {
		case '0' <= d && d <= '9':
			d -= '0'
		case 'a' <= d && d <= 'f':
			d -= 'a' - 10
		case 'A' <= d && d <= 'F':
			d -= 'A' - 10
		default:
			return 0, 0, false
		}
		size = size<<4 | uint64(d)
	}
	return size, sigAt, true
}
