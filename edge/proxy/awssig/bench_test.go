package awssig

import (
	"bytes"
	"context"
	"io"
	"testing"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// BenchmarkResignHeader: what the proxy does to a typical S3 GET before
// forwarding it: Parse, Verify with the placeholder secret, Resign.
func BenchmarkResignHeader(b *testing.B) {
	c := headerCases[0]
	r := c.build()
	r.Header.Set("User-Agent", "aws-sdk-go-v2/1.36.3 os/linux lang/go#1.26 md/GOOS#linux md/GOARCH#amd64 api/s3#1.79.2")
	r.Header.Set("Amz-Sdk-Invocation-Id", "0f6f2c1e-4b8e-4c1a-9f0e-6d7e3b2a1c0d")
	r.Header.Set("Amz-Sdk-Request", "attempt=1; max=3")
	if err := v4.NewSigner().SignHTTP(context.Background(), taskCreds, r, c.payloadHash, c.service, c.region, signTime, c.sdkOpts); err != nil {
		b.Fatal(err)
	}
	r = onWire(b, r)
	auth, token := r.Header["Authorization"], r.Header["X-Amz-Security-Token"]
	creds := toCreds(realTemp)
	b.ReportAllocs()
	for b.Loop() {
		r.Header["Authorization"], r.Header["X-Amz-Security-Token"] = auth, token
		sig, err := Parse(r)
		if err != nil {
			b.Fatal(err)
		}
		if err := Verify(r, sig, taskCreds.SecretAccessKey, ""); err != nil {
			b.Fatal(err)
		}
		if _, err := Resign(r, sig, creds, ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChunkResigner re-signs streams of 64 KiB chunks (the SDKs'
// size). allocs/op is the same at 1 MiB and at 64 MiB: a stream's memory is
// one chunk's buffer, however long it runs.
func BenchmarkChunkResigner(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"1MiB", 1 << 20}, {"64MiB", 64 << 20}} {
		b.Run(size.name, func(b *testing.B) {
			data := bytes.Repeat([]byte("0123456789abcdef"), size.n/16)
			r, body := chunkedRequest(b, data, []int{64 << 10}, nil)
			sig := mustParse(b, r)
			if err := Verify(r, sig, taskCreds.SecretAccessKey, ""); err != nil {
				b.Fatal(err)
			}
			seed, err := Resign(r, sig, realCreds, "")
			if err != nil {
				b.Fatal(err)
			}
			src := bytes.NewReader(body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				src.Reset(body)
				cr, err := NewChunkResigner(src, sig, taskCreds.SecretAccessKey, realCreds, seed)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, cr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
