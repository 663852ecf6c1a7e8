package awssig

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// The task's placeholder credentials and the real ones of most tests.
var taskCreds = aws.Credentials{
	AccessKeyID:     "ASIAPLACEHOLDER00001",
	SecretAccessKey: "pLaCeHoLdErSeCrEtpLaCeHoLdErSeCrEt012345",
	SessionToken:    "placeholder-session-token-0123456789",
}

var realCreds = Credentials{
	AccessKeyID:     "ASIAREALREALREAL0002",
	SecretAccessKey: "rEaLsEcReTrEaLsEcReTrEaLsEcReTrEaLsEcReT",
	SessionToken:    "IQoJb3JpZ2luX2VjEreal//token+with/odd=chars",
}

// This file also computes SigV4 chunk chains the plain way, by string
// concatenation, independently of the package's code, to build task bodies
// and to check what a ChunkResigner gives.

func tHMAC(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func tSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func tKey(secret, date, region, service string) []byte {
	return tHMAC(tHMAC(tHMAC(tHMAC([]byte("AWS4"+secret), date), region), service), "aws4_request")
}

// tChain is a chunk signature chain: key, X-Amz-Date, scope and last link.
type tChain struct {
	key            []byte
	amzDate, scope string
	prev           string
}

func newTChain(secret, amzDate, region, service, seed string) *tChain {
	date := amzDate[:8]
	return &tChain{
		key:     tKey(secret, date, region, service),
		amzDate: amzDate,
		scope:   date + "/" + region + "/" + service + "/aws4_request",
		prev:    seed,
	}
}

func (c *tChain) chunk(data []byte) string {
	sts := "AWS4-HMAC-SHA256-PAYLOAD\n" + c.amzDate + "\n" + c.scope + "\n" + c.prev + "\n" +
		tSHA(nil) + "\n" + tSHA(data)
	c.prev = hex.EncodeToString(tHMAC(c.key, sts))
	return c.prev
}

// trailer signs trailer lines given as "name:value".
func (c *tChain) trailer(lines []string) string {
	var canon strings.Builder
	for _, l := range lines {
		canon.WriteString(l + "\n")
	}
	sts := "AWS4-HMAC-SHA256-TRAILER\n" + c.amzDate + "\n" + c.scope + "\n" + c.prev + "\n" +
		tSHA([]byte(canon.String()))
	c.prev = hex.EncodeToString(tHMAC(c.key, sts))
	return c.prev
}

// encodeChunked writes data as aws-chunked in chunks of sizes (the last
// repeated as needed), signed in c; trailers (nil for Streaming) follow the
// final chunk.
func encodeChunked(c *tChain, data []byte, sizes []int, trailers []string) []byte {
	var b bytes.Buffer
	for i := 0; len(data) > 0; i++ {
		n := min(sizes[min(i, len(sizes)-1)], len(data))
		fmt.Fprintf(&b, "%x;chunk-signature=%s\r\n", n, c.chunk(data[:n]))
		b.Write(data[:n])
		b.WriteString("\r\n")
		data = data[n:]
	}
	fmt.Fprintf(&b, "0;chunk-signature=%s\r\n", c.chunk(nil))
	if trailers == nil {
		b.WriteString("\r\n")
		return b.Bytes()
	}
	for _, l := range trailers {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("x-amz-trailer-signature:" + c.trailer(trailers) + "\r\n\r\n")
	return b.Bytes()
}

// decodeChunked checks every signature of body in c and returns the data
// and the trailer lines.
func decodeChunked(t *testing.T, c *tChain, body []byte, withTrailers bool) ([]byte, []string) {
	t.Helper()
	br := bufio.NewReader(bytes.NewReader(body))
	var data []byte
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("chunk header: %v", err)
		}
		size, sig, ok := strings.Cut(strings.TrimSuffix(line, "\r\n"), ";chunk-signature=")
		n, err := strconv.ParseUint(size, 16, 32)
		if !ok || err != nil {
			t.Fatalf("chunk header %q", line)
		}
		chunk := make([]byte, n)
		if _, err := io.ReadFull(br, chunk); err != nil {
			t.Fatal(err)
		}
		if want := c.chunk(chunk); sig != want {
			t.Fatalf("chunk at data offset %d: signature %s, chain gives %s", len(data), sig, want)
		}
		data = append(data, chunk...)
		if n == 0 && withTrailers {
			break
		}
		crlf := make([]byte, 2)
		if _, err := io.ReadFull(br, crlf); err != nil || string(crlf) != "\r\n" {
			t.Fatalf("chunk not followed by CRLF")
		}
		if n == 0 {
			break
		}
	}
	var trailers []string
	if withTrailers {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("trailer: %v", err)
			}
			line = strings.TrimSuffix(line, "\r\n")
			if sig, ok := strings.CutPrefix(line, "x-amz-trailer-signature:"); ok {
				if want := c.trailer(trailers); sig != want {
					t.Fatalf("trailer signature %s, chain gives %s", sig, want)
				}
				break
			}
			trailers = append(trailers, line)
		}
		if end, _ := br.ReadString('\n'); end != "\r\n" {
			t.Fatalf("trailers end %q", end)
		}
	}
	if rest, _ := io.ReadAll(br); len(rest) > 0 {
		t.Fatalf("%d bytes after the final chunk", len(rest))
	}
	return data, trailers
}

// onWire sends r through net/http's writer and reader, as the proxy would
// receive it: Host out of the header map, Content-Length in it, the URL
// from the request line.
func onWire(t testing.TB, r *http.Request) *http.Request {
	t.Helper()
	var b bytes.Buffer
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	sr, err := http.ReadRequest(bufio.NewReader(&b))
	if err != nil {
		t.Fatal(err)
	}
	return sr
}

func mustParse(t testing.TB, r *http.Request) *Signature {
	t.Helper()
	sig, err := Parse(r)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return sig
}
