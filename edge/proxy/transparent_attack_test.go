package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// dialTLS opens a TLS connection of the task to dst for sni, trusting the
// proxy's CA; unlike taskNet.tlsDial it returns a failed handshake.
func (tn *taskNet) dialTLS(e *env, dst netip.AddrPort, sni string) (*tls.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := tn.dial(ctx, dst)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.authority.Bundle())
	tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: sni})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// A task holds at most MaxTaskConns of edge's connections at once: each
// costs edge a descriptor and a goroutine (and an intercepted or tunnelled
// one an upstream connection too), and one task opening thousands would
// otherwise take the descriptors edge serves every other task and its host
// API with. A connection past the bound is closed at once, unserved; one
// freed lets the next through; edge logs the first refusal of the attempt,
// once.
func TestTransparentConnectionsOfATaskAreBounded(t *testing.T) {
	const bound = 4
	f := newFixtureWith(t, envOptions{egress: policy.EgressOpen, maxTaskConns: bound})
	n := f.network("run-a")
	dst := authorityOf(n.pin("api.example.test"), f.up.port)

	var held []*tls.Conn
	for range bound {
		c, err := n.dialTLS(f.env, dst, "api.example.test")
		if err != nil {
			t.Fatalf("connection %d of %d: %v", len(held)+1, bound, err)
		}
		held = append(held, c)
	}
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for range 3 {
		c, err := net.Dial("tcp", n.transparent.Addr().String())
		must(t, err)
		must(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if !errors.Is(err, io.EOF) {
			t.Fatalf("a connection past the bound of %d: read %v, want it closed at once (EOF)", bound, err)
		}
	}
	held[0].Close()
	var next *tls.Conn
	if !await.Within(5*time.Second, func() bool {
		c, err := n.dialTLS(f.env, dst, "api.example.test")
		next = c
		return err == nil
	}) {
		t.Fatal("a connection freed under the bound does not let the next one through")
	}
	held[0] = next
	if got := strings.Count(f.logs.String(), "the task's connections reached their bound"); got != 1 {
		t.Errorf("edge logged the bound %d times, want once:\n%s", got, f.logs.String())
	}
}

// sendHuge writes a request head that never ends (64 MiB without a line
// end) to c and reports whether edge took it all: edge must stop reading
// well before, closing the connection, so that the write fails.
func sendHuge(t *testing.T, c net.Conn, start string) (tookItAll bool) {
	t.Helper()
	defer c.Close()
	must(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	head := append([]byte(start), bytes.Repeat([]byte("a"), 64<<20)...)
	_, err := c.Write(head)
	return err == nil
}

// A request head is bounded wherever edge reads one before any
// credential or decision: the transparent front's plain HTTP, which it
// reads to refuse, and the explicit front's CONNECT. Unbounded, a task
// (any local user, on the explicit front) sending a line that never ends
// grows edge's memory for as long as the handshake timeout lets it: gigabytes
// at loopback speed, on each of its connections.
func TestRequestHeadsBeforeADecisionAreBounded(t *testing.T) {
	f := newFixtureWith(t, envOptions{egress: policy.EgressOpen})
	n := f.network("run-a")
	dst := authorityOf(n.pin("api.example.test"), f.up.port)

	if sendHuge(t, n.mustDial(dst), "GET /") {
		t.Error("the transparent front read a 64 MiB request line to a granted name")
	}
	c, err := net.Dial("tcp", f.listener.Addr().String())
	must(t, err)
	if sendHuge(t, c, "CONNECT ") {
		t.Error("the explicit front read a 64 MiB CONNECT line")
	}
	if len(f.up.requests()) != 0 {
		t.Errorf("the upstream received %d requests", len(f.up.requests()))
	}
}

// A refusal's reason names the target, which a task chooses: a CONNECT to
// a name made of its placeholder (lower-cased, as a DNS name is) is
// refused under strict egress with the placeholder redacted from the
// audit's reason as from its host.
func TestARefusedTargetsReasonIsRedacted(t *testing.T) {
	f := newFixture(t, policy.EgressStrict)
	c, _, status := f.connect(f.proxyURL, strings.ToLower(f.phA)+".example.com:443")
	c.Close()
	if status != http.StatusForbidden {
		t.Fatalf("CONNECT to a name made of the placeholder: %d, want 403", status)
	}
	l := f.waitAudit(func(l map[string]any) bool { return l["status"] == float64(http.StatusForbidden) })
	// Not printed when it differs: it may hold the placeholder.
	if want := "no key of this task reaches [placeholder].example.com:443; egress is strict"; l["reason"] != want {
		t.Errorf("the audit's reason is not %q", want)
	}
}

// The explicit proxy in a task's network serves that task alone: another
// task's credential (leaked to it, say through a repository both clone)
// is refused there as an unknown one would be, so a credential is of use
// only inside its own task's network.
func TestATaskNetworksExplicitProxyServesThatTaskAlone(t *testing.T) {
	f := newFixture(t, policy.EgressOpen)
	other, _ := f.task("run-b", runspec.Secret{ProjectID: "acme", Key: "A"})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	must(t, f.proxy.ServeNetwork("run-a", TaskNetwork{Explicit: l}))
	inNetwork := func(u *url.URL) *url.URL {
		v := *u
		v.Host = l.Addr().String()
		return &v
	}
	c, _, status := f.connect(inNetwork(f.proxyURL), f.api)
	c.Close()
	if status != http.StatusOK {
		t.Fatalf("the task's own credential in its network: %d, want 200", status)
	}
	c, _, status = f.connect(inNetwork(other), f.api)
	c.Close()
	if status != http.StatusProxyAuthRequired {
		t.Errorf("another task's credential in the task's network: %d, want 407", status)
	}
	c, _, status = f.connect(other, f.api)
	c.Close()
	if status != http.StatusOK {
		t.Errorf("the other task's credential on the host's listener: %d, want 200", status)
	}
}
