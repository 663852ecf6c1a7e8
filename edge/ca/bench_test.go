package ca_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/shared/clock"
)

func benchAuthority(b *testing.B) *ca.Authority {
	cfg := testConfig(b, b.TempDir(), clock.NewFake(epoch))
	cfg.Logger = nil
	return mustOpen(b, cfg)
}

// BenchmarkLeafMintOnCacheMiss is a handshake for a name with no leaf yet:
// key, CSR, signature, memory storage, cache. Target <= 1 ms.
func BenchmarkLeafMintOnCacheMiss(b *testing.B) {
	a := benchAuthority(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := leafFor(a, fmt.Sprintf("n%d.proxied.test", i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGetCertificateHit is a handshake for a name whose leaf is cached:
// the review check, the name decision and the clock check. Target <= 10 µs.
func BenchmarkGetCertificateHit(b *testing.B) {
	a := benchAuthority(b)
	hello := &tls.ClientHelloInfo{ServerName: proxiedName}
	if _, err := a.GetCertificate(hello); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.GetCertificate(hello); err != nil {
			b.Fatal(err)
		}
	}
}

// handshakeOnce runs one full TLS handshake (no resumption) over an
// in-memory pipe, returning how long the client waited.
func handshakeOnce(b *testing.B, server, client *tls.Config) time.Duration {
	sc, cc := net.Pipe()
	defer sc.Close()
	defer cc.Close()
	done := make(chan error, 1)
	go func() { done <- tls.Server(sc, server).HandshakeContext(context.Background()) }()
	start := time.Now()
	if err := tls.Client(cc, client).HandshakeContext(context.Background()); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return elapsed
}

// BenchmarkTLSHandshakeCachedLeafVsStatic compares a full handshake served
// by the CA's GetCertificate (leaf cached) with one served by the same
// leaf as a static certificate, interleaved in one run so both see the same
// machine. Reported: the median of each and their ratio (target <= 1.2);
// medians, because on a shared machine one descheduled handshake would
// otherwise decide a mean.
func BenchmarkTLSHandshakeCachedLeafVsStatic(b *testing.B) {
	a := benchAuthority(b)
	leaf, err := leafFor(a, proxiedName)
	if err != nil {
		b.Fatal(err)
	}
	dynamic := a.ServerTLSConfig()
	static := &tls.Config{Certificates: []tls.Certificate{*leaf}, MinVersion: tls.VersionTLS12}
	client := &tls.Config{ServerName: proxiedName, RootCAs: certPool(b, a.Bundle()), Time: func() time.Time { return epoch }}
	var cached, fixed []time.Duration
	for b.Loop() {
		cached = append(cached, handshakeOnce(b, dynamic, client))
		fixed = append(fixed, handshakeOnce(b, static, client))
	}
	c, f := median(cached), median(fixed)
	b.ReportMetric(float64(c.Nanoseconds()), "cached-ns/handshake")
	b.ReportMetric(float64(f.Nanoseconds()), "static-ns/handshake")
	b.ReportMetric(float64(c)/float64(f), "ratio")
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}
