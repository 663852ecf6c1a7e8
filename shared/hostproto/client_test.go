package hostproto_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

func newClient(t *testing.T, cfg hostproto.ClientConfig) *hostproto.Client {
	t.Helper()
	c, err := hostproto.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientSpeaksTheProtocolOverTLSTrustingOnlyTheHostCA(t *testing.T) {
	host := fakehost.New(fakehost.Config{TLS: true, Agents: []string{"shell", "claude"},
		Features: hostproto.Features{SecretsProxy: true, ExecRequire: true}})
	defer host.Close()
	c := newClient(t, hostproto.ClientConfig{BaseURL: host.URL, Token: host.Token(), CAPEM: host.CAPEM()})
	ctx := context.Background()

	h, err := c.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !h.OK || len(h.Agents) != 2 || !h.Features.SecretsProxy || !h.Features.ExecRequire {
		t.Fatalf("health = %+v", h)
	}

	deadline := time.Now().Add(time.Minute)
	req := hostproto.StartRequest{ClientToken: "fr-1", Request: runspec.Request{Deadline: &deadline, Agent: "shell", Prompt: "echo hi"}}
	first, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.RunID == "" || first.Reused || first.Status != hostproto.StatusPending {
		t.Fatalf("first start = %+v", first)
	}
	again, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if again.RunID != first.RunID || !again.Reused {
		t.Fatalf("second start = %+v, want reused %s", again, first.RunID)
	}
	if host.Created() != 1 || host.StartCalls() != 2 {
		t.Fatalf("host created %d runs from %d calls, want 1 from 2", host.Created(), host.StartCalls())
	}

	found, ok, err := c.FindByClientToken(ctx, "fr-1")
	if err != nil || !ok || found.RunID != first.RunID {
		t.Fatalf("find = %+v %v %v", found, ok, err)
	}
	if _, ok, err := c.FindByClientToken(ctx, "fr-unknown"); err != nil || ok {
		t.Fatalf("find unknown = %v %v, want not found and no error", ok, err)
	}
	got, err := c.Get(ctx, first.RunID)
	if err != nil || got.ClientToken != "fr-1" {
		t.Fatalf("get = %+v %v", got, err)
	}
	_, err = c.Get(ctx, "run-404")
	if !errors.Is(err, hostproto.ErrRunNotFound) {
		t.Fatalf("get unknown = %v, want ErrRunNotFound", err)
	}
	if o := hostproto.OutcomeOf(err); o.Accepted != hostproto.Refused || o.HostStatus != 404 || o.Code != hostproto.CodeRunNotFound {
		t.Fatalf("outcome of 404 = %+v", o)
	}
}

func TestClientRefusesAHostWhoseCertificateIsNotFromItsCA(t *testing.T) {
	host := fakehost.New(fakehost.Config{TLS: true})
	defer host.Close()
	ctx := context.Background()

	// The system roots do not include httptest's certificate.
	_, err := newClient(t, hostproto.ClientConfig{BaseURL: host.URL, Token: host.Token()}).Health(ctx)
	if !errors.Is(err, hostproto.ErrUnreachable) {
		t.Fatalf("without caPem: %v, want ErrUnreachable (certificate not trusted)", err)
	}
	// Another CA, given as the host's caPem, replaces the system roots and does not vouch for it.
	_, err = newClient(t, hostproto.ClientConfig{BaseURL: host.URL, Token: host.Token(), CAPEM: otherCAPEM(t)}).Health(ctx)
	if !errors.Is(err, hostproto.ErrUnreachable) {
		t.Fatalf("with another CA: %v, want ErrUnreachable", err)
	}
}

func TestClientSendsTheCredentialOnEveryRoute(t *testing.T) {
	host := fakehost.New(fakehost.Config{})
	defer host.Close()
	wrong := newClient(t, hostproto.ClientConfig{BaseURL: host.URL, Token: "not-the-token"})
	ctx := context.Background()
	calls := map[string]func() error{
		"health": func() error { _, err := wrong.Health(ctx); return err },
		"start": func() error {
			_, err := wrong.Start(ctx, hostproto.StartRequest{ClientToken: "x", Request: runspec.Request{Agent: "shell"}})
			return err
		},
		"find": func() error { _, _, err := wrong.FindByClientToken(ctx, "x"); return err },
		"get":  func() error { _, err := wrong.Get(ctx, "run-1"); return err },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, hostproto.ErrUnauthorized) {
			t.Errorf("%s with a wrong credential: %v, want ErrUnauthorized", name, err)
		}
		if strings.Contains(err.Error(), "not-the-token") {
			t.Errorf("%s: the error shows the credential: %v", name, err)
		}
	}
	if host.StartCalls() != 0 {
		t.Fatalf("an unauthenticated start reached the start handler")
	}
}

func TestClientTellsNoAnswerFromUnreachableFromRefused(t *testing.T) {
	ctx := context.Background()

	t.Run("unreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, err = newClient(t, hostproto.ClientConfig{BaseURL: "http://" + addr, Token: "t"}).Health(ctx)
		if !errors.Is(err, hostproto.ErrUnreachable) || !errors.Is(err, hostproto.ErrNoAnswer) {
			t.Fatalf("closed port: %v, want ErrUnreachable", err)
		}
		if o := hostproto.OutcomeOf(err); o.Accepted != hostproto.Refused {
			t.Fatalf("outcome = %+v, want refused (never delivered)", o)
		}
	})

	t.Run("dies after accepting", func(t *testing.T) {
		host := fakehost.New(fakehost.Config{})
		defer host.Close()
		host.FaultStarts(fakehost.DieAfterAccept, 1)
		c := newClient(t, hostproto.ClientConfig{BaseURL: host.URL, Token: host.Token()})
		_, err := c.Start(ctx, hostproto.StartRequest{ClientToken: "fr-d", Request: runspec.Request{Agent: "shell"}})
		if !errors.Is(err, hostproto.ErrNoAnswer) || errors.Is(err, hostproto.ErrUnreachable) {
			t.Fatalf("died after accepting: %v, want ErrNoAnswer but not ErrUnreachable", err)
		}
		if o := hostproto.OutcomeOf(err); o.Accepted != hostproto.Unknown {
			t.Fatalf("outcome = %+v, want unknown", o)
		}
		if _, ok, _ := c.FindByClientToken(ctx, "fr-d"); !ok {
			t.Fatal("the host should know the run it accepted")
		}
	})

	t.Run("timeout", func(t *testing.T) {
		host := fakehost.New(fakehost.Config{})
		defer host.Close()
		host.FaultStarts(fakehost.HangBeforeAccept, 1)
		c := newClient(t, hostproto.ClientConfig{BaseURL: host.URL, Token: host.Token(), Timeout: 50 * time.Millisecond})
		_, err := c.Start(ctx, hostproto.StartRequest{ClientToken: "fr-t", Request: runspec.Request{Agent: "shell"}})
		if !errors.Is(err, hostproto.ErrTimeout) || errors.Is(err, hostproto.ErrUnreachable) {
			t.Fatalf("hung host: %v, want ErrTimeout", err)
		}
		if o := hostproto.OutcomeOf(err); o.Accepted != hostproto.Unknown || !strings.Contains(o.Detail, "in time") {
			t.Fatalf("outcome = %+v, want unknown with detail", o)
		}
	})

	t.Run("refusal and fault", func(t *testing.T) {
		host := fakehost.New(fakehost.Config{})
		defer host.Close()
		c := newClient(t, hostproto.ClientConfig{BaseURL: host.URL, Token: host.Token()})
		host.RefuseStarts(http.StatusConflict, hostproto.CodeDraining)
		_, err := c.Start(ctx, hostproto.StartRequest{ClientToken: "fr-r", Request: runspec.Request{Agent: "shell"}})
		var he *hostproto.Error
		if !errors.As(err, &he) || he.Status != 409 || he.Code != hostproto.CodeDraining {
			t.Fatalf("refused start: %v", err)
		}
		if o := hostproto.OutcomeOf(err); o.Accepted != hostproto.Refused || o.Code != hostproto.CodeDraining {
			t.Fatalf("outcome = %+v", o)
		}
		host.RefuseStarts(http.StatusServiceUnavailable, "overloaded")
		_, err = c.Start(ctx, hostproto.StartRequest{ClientToken: "fr-r", Request: runspec.Request{Agent: "shell"}})
		if o := hostproto.OutcomeOf(err); o.Accepted != hostproto.Unknown || o.HostStatus != 503 {
			t.Fatalf("503 outcome = %+v", o)
		}
		b, _ := json.Marshal([]hostproto.Outcome{hostproto.OutcomeOf(nil), {Accepted: hostproto.Refused}, {Accepted: hostproto.Unknown}})
		if string(b) != `[{"accepted":true},{"accepted":false},{"accepted":"unknown"}]` {
			t.Fatalf("outcomes marshal as %s", b)
		}
	})
}

func TestClientDialsThroughTheInjectedDialer(t *testing.T) {
	host := fakehost.New(fakehost.Config{TLS: true})
	defer host.Close()
	target := strings.TrimPrefix(host.URL, "https://")
	var dials atomic.Int32
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		if addr != "example.com:443" {
			t.Errorf("dialed %s, want example.com:443", addr)
		}
		return (&net.Dialer{}).DialContext(ctx, network, target)
	}
	// httptest's certificate names example.com, so the name verifies.
	c := newClient(t, hostproto.ClientConfig{BaseURL: "https://example.com", Token: host.Token(), CAPEM: host.CAPEM(), DialContext: dial})
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	if dials.Load() == 0 {
		t.Fatal("the injected dialer was not used")
	}
}

func TestNewClientRejectsBadConfig(t *testing.T) {
	for _, cfg := range []hostproto.ClientConfig{
		{BaseURL: "", Token: "t"},
		{BaseURL: "ftp://h", Token: "t"},
		{BaseURL: "https://h"},
		{BaseURL: "https://h", Token: "t", CAPEM: "not pem"},
	} {
		if _, err := hostproto.NewClient(cfg); err == nil {
			t.Errorf("NewClient(%+v) accepted", cfg)
		}
	}
}

func otherCAPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
