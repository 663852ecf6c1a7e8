package ca_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// epoch starts every fake clock: the wall clock's present, so certmagic's
// own wall-clock reads agree with ours wherever they still happen.
var epoch = time.Now().UTC().Truncate(time.Hour).Add(time.Hour)

const proxiedName = "api.example.test"

// allowExample lets the names the tests intercept have leaves.
func allowExample(name string) bool {
	return name == proxiedName || strings.HasSuffix(name, ".proxied.test")
}

// testConfig is a CA under dir/ca sealed by dir/seal.key on clk.
func testConfig(t testing.TB, dir string, clk clock.Clock) ca.Config {
	t.Helper()
	sealer, err := ca.NewFileSealer(filepath.Join(dir, "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return ca.Config{
		Dir:       filepath.Join(dir, "ca"),
		Sealer:    sealer,
		Clock:     clk,
		Logger:    testLogger(t),
		AllowName: allowExample,
	}
}

// testLogger writes the CA's log lines to the test log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func mustOpen(t testing.TB, cfg ca.Config) *ca.Authority {
	t.Helper()
	a, err := ca.Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func certPool(t testing.TB, bundle []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(bundle) {
		t.Fatalf("bundle holds no certificate:\n%s", bundle)
	}
	return p
}

// leafFor asks the CA for name's leaf as a handshake would.
func leafFor(a *ca.Authority, name string) (*tls.Certificate, error) {
	return a.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
}

// verifyLeaf checks cert for name against bundle at now, as a task's TLS
// client would.
func verifyLeaf(t testing.TB, cert *tls.Certificate, bundle []byte, name string, now time.Time) error {
	t.Helper()
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return err
	}
	_, err = leaf.Verify(x509.VerifyOptions{
		Roots:       certPool(t, bundle),
		CurrentTime: now,
		DNSName:     name,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return err
}

// handshake runs a real TLS handshake between a tls.Server on the CA and a
// client that trusts bundle and reads the time from now; it returns the
// client's error, and the server's when the client has none.
func handshake(t testing.TB, a *ca.Authority, name string, bundle []byte, now time.Time) error {
	t.Helper()
	serverConn, clientConn := net.Pipe()
	defer serverConn.Close()
	defer clientConn.Close()
	server := tls.Server(serverConn, a.ServerTLSConfig("h2", "http/1.1"))
	client := tls.Client(clientConn, &tls.Config{
		ServerName: name,
		RootCAs:    certPool(t, bundle),
		Time:       func() time.Time { return now },
		NextProtos: []string{"h2"},
		// P-256 has assembly on every platform, so thousands of simulated
		// handshakes stay fast under -race.
		CurvePreferences: []tls.CurveID{tls.CurveP256},
	})
	var wg sync.WaitGroup
	var serverErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		serverErr = server.HandshakeContext(context.Background())
		if serverErr != nil {
			clientConn.Close()
		}
	}()
	clientErr := client.HandshakeContext(context.Background())
	if clientErr != nil {
		serverConn.Close()
	}
	await.Group(t, "the concurrent callers", &wg)
	if clientErr != nil {
		return clientErr
	}
	if serverErr != nil {
		return serverErr
	}
	if got := client.ConnectionState().NegotiatedProtocol; got != "h2" {
		return errors.New("ALPN negotiated " + got + ", want h2")
	}
	return nil
}

// dirFiles reads every regular file under dir.
func dirFiles(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		files[path] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
