package awsfront

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

var (
	testCreds = aws.Credentials{AccessKeyID: "AKIAFRONTTEST0000001", SecretAccessKey: "front/test+secret/0123456789abcdefghijKLMN"}
	testTime  = time.Date(2026, 12, 4, 10, 11, 12, 0, time.UTC)
)

// onWire is r as a server receives it: written out, read back.
func onWire(t *testing.T, r *http.Request) *http.Request {
	t.Helper()
	var b bytes.Buffer
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	got, err := http.ReadRequest(bufio.NewReader(&b))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// sigv4Cases are requests whose canonical forms differ in the ways SigV4
// cares about: paths with characters to escape, queries with repeated,
// empty and escaped parameters, headers with runs of spaces and several
// values, and services that escape the path once (S3) or twice.
var sigv4Cases = []struct {
	name, method, url, service string
	headers                    map[string][]string
	body                       string
}{
	{"s3 get", "GET", "https://bucket.s3.us-east-1.amazonaws.com/photos/a%20b%2Bc~d.jpg", "s3", nil, ""},
	{"s3 path style", "GET", "https://s3.us-east-1.amazonaws.com/bucket/k%C3%A9y/%21%28x%29", "s3", nil, ""},
	{"s3 list", "GET", "https://bucket.s3.amazonaws.com/?list-type=2&prefix=a%20b%2F&delimiter=%2F&max-keys=5", "s3", nil, ""},
	{"s3 subresource", "POST", "https://bucket.s3.amazonaws.com/big?uploads", "s3", nil, ""},
	{"s3 repeated", "GET", "https://s3.amazonaws.com/b/k?b=2&a=1&b=1", "s3", nil, ""},
	{"headers", "PUT", "https://bucket.s3.us-east-1.amazonaws.com/k", "s3", map[string][]string{
		"X-Amz-Meta-Note": {"  two   spaces  "}, "X-Amz-Meta-Multi": {"a", "b"}, "Content-Type": {"text/plain"},
	}, "hello"},
	{"sts", "POST", "https://sts.us-east-1.amazonaws.com/", "sts", map[string][]string{
		"Content-Type": {"application/x-www-form-urlencoded; charset=utf-8"},
	}, "Action=GetCallerIdentity&Version=2011-06-15"},
	{"double-escaped path", "GET", "https://execute-api.us-east-1.amazonaws.com/stage/a%20b/c", "execute-api", nil, ""},
}

func sign(t *testing.T, method, url, service string, headers map[string][]string, body string, presign bool) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range headers {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	payload := sha256Hex([]byte(body))
	if service == "s3" && !presign {
		r.Header.Set("X-Amz-Content-Sha256", payload)
	}
	signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = service == "s3" })
	if presign {
		// The SDK hoists X-Amz-* headers into the query, as its S3
		// presigner does with the expiry.
		r.Header.Set("X-Amz-Expires", "900")
		signed, _, err := signer.PresignHTTP(context.Background(), testCreds, r, unsignedPayload, service, Region, testTime)
		if err != nil {
			t.Fatal(err)
		}
		r, err = http.NewRequest(method, signed, nil)
		if err != nil {
			t.Fatal(err)
		}
		return onWire(t, r)
	}
	if err := signer.SignHTTP(context.Background(), testCreds, r, payload, service, Region, testTime); err != nil {
		t.Fatal(err)
	}
	return onWire(t, r)
}

// TestVerifierAgreesWithTheSDK: what aws-sdk-go-v2's signer signs, the
// front's verifier accepts, header and presigned, and a change to any
// signed part (or the secret) is refused.
func TestVerifierAgreesWithTheSDK(t *testing.T) {
	for _, c := range sigv4Cases {
		t.Run(c.name, func(t *testing.T) {
			r := sign(t, c.method, c.url, c.service, c.headers, c.body, false)
			s, err := parseHeaderSignature(r)
			if err != nil {
				t.Fatal(err)
			}
			payload := sha256Hex([]byte(c.body))
			if err := verify(r, s, testCreds.SecretAccessKey, payload); err != nil {
				t.Fatalf("header signature refused: %v\ncanonical:\n%s", err, canonicalRequest(r, s, clientView(r.URL.EscapedPath(), r.URL.RawQuery, s.service, false), payload))
			}
			if err := verify(r, s, testCreds.SecretAccessKey+"x", payload); !errors.Is(err, ErrSignature) {
				t.Fatalf("wrong secret: %v", err)
			}
			r.Host = "other.amazonaws.com"
			if err := verify(r, s, testCreds.SecretAccessKey, payload); !errors.Is(err, ErrSignature) {
				t.Fatalf("other host: %v", err)
			}

			if c.body != "" {
				return // a presigned URL carries no body signature
			}
			p := sign(t, c.method, c.url, c.service, nil, "", true)
			ps, err := parsePresigned(p.URL.Query())
			if err != nil {
				t.Fatal(err)
			}
			if err := verify(p, ps, testCreds.SecretAccessKey, unsignedPayload); err != nil {
				t.Fatalf("presigned signature refused: %v\ncanonical:\n%s", err, canonicalRequest(p, ps, clientView(p.URL.EscapedPath(), p.URL.RawQuery, ps.service, true), unsignedPayload))
			}
			p.URL.RawQuery = strings.Replace(p.URL.RawQuery, "X-Amz-Expires=900", "X-Amz-Expires=901", 1)
			if err := verify(p, ps, testCreds.SecretAccessKey, unsignedPayload); !errors.Is(err, ErrSignature) {
				t.Fatalf("changed expiry: %v", err)
			}
		})
	}
}

func TestParseRefusesMalformedSignatures(t *testing.T) {
	good := "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261204/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=" + strings.Repeat("a", 64)
	for name, auth := range map[string]string{
		"short scope":      strings.Replace(good, "/s3/aws4_request", "/aws4_request", 1),
		"unsorted headers": strings.Replace(good, "host;x-amz-date", "x-amz-date;host", 1),
		"host unsigned":    strings.Replace(good, "host;x-amz-date", "x-amz-date", 1),
		"short signature":  strings.Replace(good, strings.Repeat("a", 64), "abc", 1),
		"other day":        strings.Replace(good, "20261204", "20261203", 1),
	} {
		r, _ := http.NewRequest("GET", "https://s3.amazonaws.com/", nil)
		r.Header.Set("Authorization", auth)
		r.Header.Set("X-Amz-Date", "20261204T101112Z")
		if _, err := parseHeaderSignature(r); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
