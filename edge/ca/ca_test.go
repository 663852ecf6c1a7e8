package ca_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/shared/clock"
)

func TestFirstStartServesLeavesTheBundleVerifies(t *testing.T) {
	clk := clock.NewFake(epoch)
	a := mustOpen(t, testConfig(t, t.TempDir(), clk))

	bundle := a.Bundle()
	if n := bytes.Count(bundle, []byte("BEGIN CERTIFICATE")); n != 1 {
		t.Fatalf("a new CA's bundle holds %d certificates, want the signer alone", n)
	}
	block, _ := pem.Decode(bundle)
	signer, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, ok := signer.PublicKey.(*ecdsa.PublicKey)
	if !ok || key.Curve != elliptic.P256() {
		t.Fatalf("CA key is %T, want ECDSA P-256", signer.PublicKey)
	}
	if !signer.IsCA || !signer.NotAfter.Equal(epoch.Add(ca.DefaultLifetime)) {
		t.Fatalf("CA: IsCA=%v NotAfter=%v, want a CA ending %v", signer.IsCA, signer.NotAfter, epoch.Add(ca.DefaultLifetime))
	}

	cert, err := leafFor(a, "API.Example.Test.")
	if err != nil {
		t.Fatalf("GetCertificate: %v", err)
	}
	if err := verifyLeaf(t, cert, bundle, proxiedName, clk.Now()); err != nil {
		t.Fatalf("the leaf does not verify against the bundle: %v", err)
	}
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	if want := clk.Now().Add(ca.DefaultLeafLifetime); !leaf.NotAfter.Equal(want) {
		t.Errorf("leaf NotAfter %v, want %v (LeafLifetime)", leaf.NotAfter, want)
	}
	if !leaf.NotBefore.Before(clk.Now()) {
		t.Errorf("leaf NotBefore %v is not in the past of %v", leaf.NotBefore, clk.Now())
	}
	if err := handshake(t, a, proxiedName, bundle, clk.Now()); err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}

	again, err := leafFor(a, proxiedName)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Certificate[0], cert.Certificate[0]) {
		t.Error("a second handshake got a new leaf instead of the cached one")
	}
}

func TestNameNotAllowedGetsNoLeaf(t *testing.T) {
	clk := clock.NewFake(epoch)
	a := mustOpen(t, testConfig(t, t.TempDir(), clk))
	for _, name := range []string{"evil.example.com", ""} {
		if cert, err := leafFor(a, name); err == nil {
			t.Errorf("GetCertificate(%q) issued %v; want a refusal", name, cert.Leaf)
		}
	}
	if err := handshake(t, a, "evil.example.com", a.Bundle(), clk.Now()); err == nil {
		t.Error("a handshake for a name the proxy does not intercept succeeded")
	}
}

// A name the policy does not list gets a leaf only while AdmitName holds
// it (the proxy's hold around one handshake it decided to intercept to
// scrub): before, and after the last hold is released, none, not even
// the one cached meanwhile. Issue 27 item 4.
func TestAdmitNameIsTheOnlyWayToALeafForAnUnlistedName(t *testing.T) {
	clk := clock.NewFake(epoch)
	a := mustOpen(t, testConfig(t, t.TempDir(), clk))
	const name = "elsewhere.example.com"
	if _, err := leafFor(a, name); err == nil {
		t.Fatal("an unlisted name got a leaf without a hold")
	}
	first := a.AdmitName("Elsewhere.Example.com.") // held as leaves are keyed
	second := a.AdmitName(name)
	if err := handshake(t, a, name, a.Bundle(), clk.Now()); err != nil {
		t.Fatalf("a handshake for an admitted name: %v", err)
	}
	if _, err := leafFor(a, "other.example.com"); err == nil {
		t.Error("a hold on one name let another get a leaf")
	}
	first()
	first() // a second release changes nothing: the other hold stands
	if _, err := leafFor(a, name); err != nil {
		t.Fatalf("the name lost its leaf while a hold remained: %v", err)
	}
	second()
	if _, err := leafFor(a, name); err == nil {
		t.Fatal("the cached leaf was served after the last hold was released")
	}
	if _, err := leafFor(a, proxiedName); err != nil {
		t.Fatalf("the policy's name: %v", err)
	}
}

func TestNoNameAllowedWithoutAllowName(t *testing.T) {
	cfg := testConfig(t, t.TempDir(), clock.NewFake(epoch))
	cfg.AllowName = nil
	a := mustOpen(t, cfg)
	if _, err := leafFor(a, proxiedName); err == nil {
		t.Fatal("a CA without AllowName issued a leaf")
	}
}

func TestDataDirHoldsNoUnsealedPrivateKey(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(epoch)
	cfg := testConfig(t, dir, clk)
	cfg.Lifetime, cfg.SuccessorWindow, cfg.SwitchBefore, cfg.LeafLifetime = 10*time.Hour, 4*time.Hour, time.Hour, 2*time.Hour
	a := mustOpen(t, cfg)
	for range 8 { // through a successor and a switch
		if _, err := leafFor(a, proxiedName); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Hour)
	}
	if a.Status().Successor == nil {
		t.Fatal("no successor after 8h of a 10h CA with a 4h successor window")
	}
	files := dirFiles(t, dir)
	if len(files) < 2 {
		t.Fatalf("data dir holds %d files, want at least the store and the seal key", len(files))
	}
	for path, b := range files {
		if bytes.Contains(b, []byte("PRIVATE KEY")) {
			t.Errorf("%s holds a PRIVATE KEY block", path)
		}
		if path != cfg.Dir+"/authorities.json" {
			continue
		}
		for _, blk := range pemBlocks(b) {
			if blk.Type != "CERTIFICATE" {
				t.Errorf("the store holds a PEM %s block", blk.Type)
			}
		}
	}
}

// pemBlocks finds the PEM blocks in b, including inside JSON strings.
func pemBlocks(b []byte) []*pem.Block {
	b = bytes.ReplaceAll(b, []byte(`\n`), []byte("\n"))
	var blocks []*pem.Block
	for {
		i := bytes.Index(b, []byte("-----BEGIN"))
		if i < 0 {
			return blocks
		}
		blk, rest := pem.Decode(b[i:])
		if blk == nil {
			b = b[i+1:]
			continue
		}
		blocks = append(blocks, blk)
		b = rest
	}
}

func TestServerTLSConfigNeverOffersACMEALPN(t *testing.T) {
	a := mustOpen(t, testConfig(t, t.TempDir(), clock.NewFake(epoch)))
	c := a.ServerTLSConfig("h2", "acme-tls/1", "http/1.1")
	if strings.Join(c.NextProtos, ",") != "h2,http/1.1" {
		t.Errorf("NextProtos %q", c.NextProtos)
	}
	if c.MinVersion < 0x0303 || c.GetCertificate == nil {
		t.Errorf("MinVersion %#x, GetCertificate set %v", c.MinVersion, c.GetCertificate != nil)
	}
}

func TestClosedAuthorityServesNothing(t *testing.T) {
	a, err := ca.Open(context.Background(), testConfig(t, t.TempDir(), clock.NewFake(epoch)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := leafFor(a, proxiedName); !errors.Is(err, ca.ErrClosed) {
		t.Errorf("GetCertificate after Close: %v, want ErrClosed", err)
	}
	if _, err := a.WatchTrust(func(context.Context, []byte) error { return nil }); !errors.Is(err, ca.ErrClosed) {
		t.Errorf("WatchTrust after Close: %v, want ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestSecondAuthorityOnOneDirIsRefused(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, testConfig(t, dir, clock.NewFake(epoch)))
	if b, err := ca.Open(context.Background(), testConfig(t, dir, clock.NewFake(epoch))); err == nil {
		b.Close()
		t.Fatal("a second Authority opened the same dir")
	} else if !strings.Contains(err.Error(), "in use by another edge process") {
		t.Fatalf("error %q does not say the dir is in use", err)
	}
}
