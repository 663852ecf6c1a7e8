package ca_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/shared/clock"
)

// installed is a bundle a task installed, and when.
type installed struct {
	at     time.Time
	bundle []byte
}

// task is a running task that receives every delivery: what it holds is
// the last bundle its listener was given.
type task struct {
	t      *testing.T
	got    chan []byte
	holds  []byte
	record []installed // every bundle it held, in order
}

func subscribeTask(t *testing.T, a *ca.Authority) *task {
	tk := &task{t: t, got: make(chan []byte, 64)}
	unsubscribe, err := a.WatchTrust(func(_ context.Context, bundle []byte) error {
		tk.got <- bundle
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unsubscribe() })
	return tk
}

// catchUp waits until the task holds want (deliveries are asynchronous) and
// records it as installed at now if it is new.
func (tk *task) catchUp(want []byte, now time.Time) {
	tk.t.Helper()
	for !bytes.Equal(tk.holds, want) {
		tk.holds = recv(tk.t, tk.got, "the delivery of the current bundle")
	}
	if n := len(tk.record); n == 0 || !bytes.Equal(tk.record[n-1].bundle, want) {
		tk.record = append(tk.record, installed{at: now, bundle: want})
	}
}

// since returns every bundle a task that installed one at or after from
// may hold: the one in effect at from, and every later one.
func (tk *task) since(from time.Time) []installed {
	i := len(tk.record) - 1
	for i > 0 && tk.record[i].at.After(from) {
		i--
	}
	return tk.record[i:]
}

func bundleFingerprints(t testing.TB, bundle []byte) []string {
	var out []string
	for rest := bundle; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			return out
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c.Subject.CommonName)
	}
}

// chainCheck verifies leaves against bundles as x509 does, remembering
// the chain it built for each (leaf, bundle) pair: over the simulated hours
// only the validity periods on that chain can change the answer, so later
// hours check those against the fake time instead of redoing every
// signature (which would take minutes under -race).
type chainCheck struct {
	t      testing.TB
	chains map[[2]string][]*x509.Certificate
}

func (c *chainCheck) verify(cert *tls.Certificate, bundle []byte, now time.Time) error {
	key := [2]string{string(cert.Certificate[0]), string(bundle)}
	if chain, ok := c.chains[key]; ok {
		for _, link := range chain {
			if now.Before(link.NotBefore) || now.After(link.NotAfter) {
				return fmt.Errorf("x509: certificate %q is not valid at %s (%s .. %s)",
					link.Subject.CommonName, now, link.NotBefore, link.NotAfter)
			}
		}
		return nil
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return err
	}
	chains, err := leaf.Verify(x509.VerifyOptions{
		Roots:       certPool(c.t, bundle),
		CurrentTime: now,
		DNSName:     proxiedName,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return err
	}
	if len(chains) != 1 {
		return fmt.Errorf("%d chains from one leaf to the bundle, want exactly one", len(chains))
	}
	c.chains[key] = chains[0]
	return nil
}

// simulateRotation runs a CA for span on a fake clock, one simulated hour
// at a time. Every hour the leaf served for a name must verify, at the fake
// time, against the bundle the task holds (it receives every delivery) and
// against every bundle installed within SuccessorWindow-SwitchBefore before;
// a real TLS handshake checks the same daily and at every successor and
// switch. It returns how many signers served.
func simulateRotation(t *testing.T, cfg ca.Config, clk *clock.Fake, span time.Duration) (signers int) {
	a := mustOpen(t, cfg)
	tk := subscribeTask(t, a)
	overlap := cfg.SuccessorWindow - cfg.SwitchBefore
	check := &chainCheck{t: t, chains: map[[2]string][]*x509.Certificate{}}
	var lastStatus ca.Status
	var failures int
	fail := func(format string, args ...any) {
		t.Helper()
		failures++
		if failures <= 10 {
			t.Errorf(format, args...)
		}
	}
	end := clk.Now().Add(span)
	for hour := 0; clk.Now().Before(end); hour++ {
		now := clk.Now()
		cert, err := leafFor(a, proxiedName)
		if err != nil {
			fail("%s: GetCertificate: %v", now, err)
			clk.Advance(time.Hour)
			continue
		}
		tk.catchUp(a.Bundle(), now)
		status := a.Status()
		if !status.Valid(now) {
			fail("%s: the signer is not valid (%v .. %v)", now, status.Signer.NotBefore, status.Signer.NotAfter)
		}
		if err := check.verify(cert, tk.holds, now); err != nil {
			fail("%s: the leaf does not verify against the bundle the task holds: %v", now, err)
		}
		held := tk.since(now.Add(-overlap))
		for _, in := range held {
			if err := check.verify(cert, in.bundle, now); err != nil {
				fail("%s: the leaf does not verify against the bundle installed at %s (%v): %v",
					now, in.at, bundleFingerprints(t, in.bundle), err)
			}
		}
		changed := status.Signer.Fingerprint != lastStatus.Signer.Fingerprint ||
			(status.Successor == nil) != (lastStatus.Successor == nil)
		if status.Signer.Fingerprint != lastStatus.Signer.Fingerprint {
			signers++
		}
		// Daily, a client holding the oldest bundle still in the window;
		// at a successor or a switch, the newest too.
		handshakes := []installed{held[0]}
		if changed {
			handshakes = append(handshakes, tk.record[len(tk.record)-1])
		}
		if changed || hour%24 == 0 {
			for _, in := range handshakes {
				if err := handshake(t, a, proxiedName, in.bundle, now); err != nil {
					fail("%s: TLS handshake with the bundle installed at %s: %v", now, in.at, err)
				}
			}
		}
		lastStatus = status
		clk.Advance(time.Hour)
	}
	if failures > 0 {
		t.Fatalf("%d failures", failures)
	}
	return signers
}

func TestRotationOverThreeYearsWithDesignDefaults(t *testing.T) {
	clk := clock.NewFake(epoch)
	cfg := testConfig(t, t.TempDir(), clk)
	signers := simulateRotation(t, cfg, clk, 3*365*24*time.Hour)
	if signers != 4 { // 8760h each, switching 24h early: the 4th takes over before 3 years end
		t.Fatalf("%d signers served over 3 years, want 4", signers)
	}
}

func TestRotationOverThreeYearsWithShortLifetimes(t *testing.T) {
	clk := clock.NewFake(epoch)
	cfg := testConfig(t, t.TempDir(), clk)
	// A CA lives 30 days, gets a successor at day 20 and hands over on day
	// 29; leaves live 5 days, so they are capped by their signer's end.
	cfg.Lifetime, cfg.SuccessorWindow, cfg.SwitchBefore, cfg.LeafLifetime = 30*24*time.Hour, 10*24*time.Hour, 24*time.Hour, 5*24*time.Hour
	signers := simulateRotation(t, cfg, clk, 3*365*24*time.Hour)
	if signers < 37 {
		t.Fatalf("%d signers served over 3 years of 29-day signers", signers)
	}
}
