package ca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/await"
)

var t0 = time.Now().UTC().Truncate(time.Hour).Add(time.Hour)

func testSigner(t *testing.T, now time.Time, lifetime time.Duration) *authority {
	t.Helper()
	sealer, err := NewFileSealer(filepath.Join(t.TempDir(), "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := mintAuthority(context.Background(), now, lifetime, rand.Reader, sealer)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func csrFor(t *testing.T, names ...string) *x509.CertificateRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{}, DNSNames: names}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func issued(t *testing.T, ic *certmagic.IssuedCertificate) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(ic.Certificate)
	if block == nil {
		t.Fatal("the issued certificate is not PEM")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIssuerSignsWithItsSignerWithinItsLife(t *testing.T) {
	signer := testSigner(t, t0, 100*time.Hour)
	is := &signerIssuer{signer: signer, policy: leafPolicy{
		now: func() time.Time { return t0 }, random: rand.Reader, lifetime: 168 * time.Hour,
		allow: func(n string) bool { return n == "api.example.test" },
	}}
	if key := is.IssuerKey(); !strings.Contains(key, signer.fingerprintHex()) {
		t.Errorf("IssuerKey %q does not carry the signer's fingerprint %s", key, signer.fingerprintHex())
	}

	// Issued at t0+90h: a 168h leaf would outlive its signer by 158h.
	now := t0.Add(90 * time.Hour)
	ic, err := is.Issue(withIssueTime(context.Background(), now), csrFor(t, "api.example.test"))
	if err != nil {
		t.Fatal(err)
	}
	leaf := issued(t, ic)
	if !leaf.NotAfter.Equal(signer.cert.NotAfter) {
		t.Errorf("leaf NotAfter %v, want capped at the signer's %v", leaf.NotAfter, signer.cert.NotAfter)
	}
	if want := now.Add(-backdate); !leaf.NotBefore.Equal(want) {
		t.Errorf("leaf NotBefore %v, want %v", leaf.NotBefore, want)
	}
	if err := leaf.CheckSignatureFrom(signer.cert); err != nil {
		t.Errorf("leaf not signed by the signer: %v", err)
	}
	if leaf.IsCA || len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Errorf("leaf IsCA=%v ExtKeyUsage=%v, want a server leaf", leaf.IsCA, leaf.ExtKeyUsage)
	}

	// Just after the signer's start, NotBefore never precedes the signer's.
	ic, err = is.Issue(withIssueTime(context.Background(), t0), csrFor(t, "api.example.test"))
	if err != nil {
		t.Fatal(err)
	}
	if leaf := issued(t, ic); leaf.NotBefore.Before(signer.cert.NotBefore) {
		t.Errorf("leaf NotBefore %v precedes the signer's %v", leaf.NotBefore, signer.cert.NotBefore)
	}
}

func TestIssuerFailuresArePermanent(t *testing.T) {
	signer := testSigner(t, t0, 100*time.Hour)
	is := &signerIssuer{signer: signer, policy: leafPolicy{
		now: func() time.Time { return t0 }, random: rand.Reader, lifetime: time.Hour,
		allow: func(n string) bool { return n == "api.example.test" },
	}}
	tests := []struct {
		name string
		ctx  context.Context
		csr  *x509.CertificateRequest
		want string
	}{
		{"a name not allowed", context.Background(), csrFor(t, "evil.example.com"), "not a name the proxy intercepts"},
		{"two names", context.Background(), csrFor(t, "api.example.test", "other.example.test"), "exactly one host"},
		{"the signer ended", withIssueTime(context.Background(), t0.Add(100*time.Hour)), csrFor(t, "api.example.test"), "signer ended"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := is.Issue(tc.ctx, tc.csr)
			var noRetry certmagic.ErrNoRetry
			if !errors.As(err, &noRetry) {
				t.Fatalf("error %v is not certmagic.ErrNoRetry", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestCachedLeafIsCheckedAgainstTheInjectedClock(t *testing.T) {
	clk := clock.NewFake(t0)
	sealer, err := NewFileSealer(filepath.Join(t.TempDir(), "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Open(context.Background(), Config{
		Dir: filepath.Join(t.TempDir(), "ca"), Sealer: sealer, Clock: clk,
		LeafLifetime: 30 * time.Hour,
		AllowName:    func(n string) bool { return n == "api.example.test" },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	hello := &tls.ClientHelloInfo{ServerName: "api.example.test"}
	first, err := a.GetCertificate(hello)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(19 * time.Hour) // under two thirds of its 30h life: still served
	again, err := a.GetCertificate(hello)
	if err != nil {
		t.Fatal(err)
	}
	if again.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 {
		t.Fatal("a fresh cached leaf was replaced")
	}
	clk.Advance(2 * time.Hour) // in its last third (certmagic's wall clock would not know)
	renewed, err := a.GetCertificate(hello)
	if err != nil {
		t.Fatal(err)
	}
	if renewed.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
		t.Fatal("a leaf in its last third was served again")
	}
	cached := a.state.Load().leaves.cache.AllMatchingCertificates("api.example.test")
	if len(cached) != 1 || cached[0].Leaf.SerialNumber.Cmp(renewed.Leaf.SerialNumber) != 0 {
		t.Fatalf("the cache holds %d leaves for the name; want only the renewed one", len(cached))
	}
}

func TestSignerChangeSwapsTheLeafCache(t *testing.T) {
	clk := clock.NewFake(t0)
	sealer, err := NewFileSealer(filepath.Join(t.TempDir(), "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Open(context.Background(), Config{
		Dir: filepath.Join(t.TempDir(), "ca"), Sealer: sealer, Clock: clk,
		Lifetime: 10 * time.Hour, SuccessorWindow: 4 * time.Hour, SwitchBefore: time.Hour, LeafLifetime: 30 * time.Hour,
		AllowName: func(n string) bool { return n == "api.example.test" },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	hello := &tls.ClientHelloInfo{ServerName: "api.example.test"}
	before := a.state.Load()
	old, err := a.GetCertificate(hello)
	if err != nil {
		t.Fatal(err)
	}
	if !old.Leaf.NotAfter.Equal(before.signer.cert.NotAfter) {
		t.Fatalf("leaf NotAfter %v, want capped at its signer's end %v", old.Leaf.NotAfter, before.signer.cert.NotAfter)
	}
	clk.Advance(9 * time.Hour) // the switch
	leaf, err := a.GetCertificate(hello)
	if err != nil {
		t.Fatal(err)
	}
	after := a.state.Load()
	if after.signer == before.signer || after.leaves == before.leaves || after.leaves.cache == before.leaves.cache {
		t.Fatal("the signer changed but the leaf cache was not replaced")
	}
	if err := leaf.Leaf.CheckSignatureFrom(after.signer.cert); err != nil {
		t.Fatalf("after the switch the leaf is not from the new signer: %v", err)
	}
	if !strings.Contains(after.leaves.issuer.IssuerKey(), after.signer.fingerprintHex()) {
		t.Error("the new Issuer's key does not carry the new signer's fingerprint")
	}
}

func TestConcurrentHandshakesForANewNameShareOneIssuance(t *testing.T) {
	sealer, err := NewFileSealer(filepath.Join(t.TempDir(), "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Open(context.Background(), Config{
		Dir: filepath.Join(t.TempDir(), "ca"), Sealer: sealer, Clock: clock.NewFake(t0),
		AllowName: func(n string) bool { return n == "api.example.test" },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	serials := make(chan string, 16)
	for range cap(serials) {
		go func() {
			cert, err := a.GetCertificate(&tls.ClientHelloInfo{ServerName: "api.example.test"})
			if err != nil {
				t.Error(err)
				serials <- ""
				return
			}
			serials <- cert.Leaf.SerialNumber.String()
		}()
	}
	first := await.Recv(t, "a concurrent leaf's serial", serials)
	for range cap(serials) - 1 {
		if s := await.Recv(t, "a concurrent leaf's serial", serials); s != first {
			t.Fatalf("concurrent handshakes got different leaves (%s, %s)", first, s)
		}
	}
}

// Names intercepted only to scrub are any a task connects to, so the
// leaves are bounded: the cache keeps at most maxLeaves, and nothing stays
// in the storage once a leaf is cached (its copy there would outlive the
// cache's eviction). An evicted name is issued again at its next handshake.
func TestLeafCacheIsBounded(t *testing.T) {
	signer := testSigner(t, t0, 100*time.Hour)
	li := newLeafIssuer(signer, leafPolicy{
		now: func() time.Time { return t0 }, random: rand.Reader, lifetime: time.Hour,
		allow: func(string) bool { return true }, maxLeaves: 4,
	})
	defer li.stop()
	names := make([]string, 10)
	for i := range names {
		names[i] = fmt.Sprintf("n%d.example.test", i)
		if _, err := li.get(context.Background(), names[i], t0); err != nil {
			t.Fatal(err)
		}
	}
	cached := 0
	for _, n := range names {
		cached += len(li.cache.AllMatchingCertificates(n))
	}
	if cached > 4 {
		t.Errorf("the cache holds %d leaves, past its bound of 4", cached)
	}
	li.storage.mu.Lock()
	nodes := len(li.storage.nodes)
	li.storage.mu.Unlock()
	if nodes != 1 {
		t.Errorf("the storage holds %d nodes besides its root once the leaves are cached", nodes-1)
	}
	for _, n := range names {
		if cert, err := li.get(context.Background(), n, t0); err != nil || cert.Leaf.DNSNames[0] != n {
			t.Fatalf("%s after eviction: %v", n, err)
		}
	}
}
