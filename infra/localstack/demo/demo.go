// Package demo owns the local stack's demonstration of the secrets proxy:
// the demo upstream, an HTTPS API on loopback under a name of its own
// (api.demo.test) with a CA of its own, which answers whether the bearer
// credential it received is the demo secret's real value and never echoes
// it; and the edge host's configuration around it: the policy granting the
// demo key for that name only, the secrets file holding the real value, the
// upstream's CA trusted by the proxy (proxy.upstream.extraRootsFile), the
// name pinned to loopback, and the demo agent, which calls the upstream
// through the proxy with curl and its placeholder. The local stack (`make
// dev`) and the end-to-end tests build the same demo from here.
package demo

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
)

// The demo's names, which the printed commands and the tests rely on.
const (
	// Project and Key name the demo secret; the task's variable is Key.
	Project = "demo"
	Key     = "DEMO_API_KEY"
	// UpstreamName is the upstream's name: pinned to the upstream's IP in
	// the proxy, never looked up.
	UpstreamName = "api.demo.test"
	// UpstreamPath is what the demo agent calls.
	UpstreamPath = "/v1/whoami"
	// Agent runs the demo agent script; ShellAgent runs its prompt with sh -c.
	Agent      = "demo"
	ShellAgent = "shell"
	// PlaceholderPrefix starts the demo key's placeholders.
	PlaceholderPrefix = "demo-"
	// PlaceholderLength is a placeholder's whole length.
	PlaceholderLength = 40
)

// certLifetime bounds the upstream's CA and leaf: they are minted at each
// start, so a week outlasts any local session.
const certLifetime = 7 * 24 * time.Hour

// UpstreamConfig configures the demo upstream.
type UpstreamConfig struct {
	// Secret is the demo secret's real value: a request is authorized when
	// it bears "Authorization: Bearer <Secret>". Required.
	Secret string
	// Listen is the address, an IP (a loopback one, for the demo edge's
	// allowPrivate) and a port; empty is 127.0.0.1 on a free port.
	Listen string
	// Logger gets one line per request (never a credential); nil discards.
	Logger *slog.Logger
	// Clock dates the certificates; nil is the wall clock.
	Clock clock.Clock
	// Rand makes the keys; nil is crypto/rand.
	Rand io.Reader
}

// Upstream is the demo upstream, serving until Close.
type Upstream struct {
	ln    net.Listener
	srv   *http.Server
	caPEM []byte
	log   *slog.Logger
	// secret is compared in constant time and never logged or answered.
	secret []byte

	authorized atomic.Int64
	refused    atomic.Int64
}

// StartUpstream mints the upstream's CA and its certificate for
// UpstreamName, and serves HTTPS on cfg.Listen.
func StartUpstream(cfg UpstreamConfig) (*Upstream, error) {
	if cfg.Secret == "" {
		return nil, errors.New("demo: UpstreamConfig.Secret is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	caPEM, cert, err := mintCerts(cfg.Rand, cfg.Clock.Now())
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("demo: upstream listen: %w", err)
	}
	u := &Upstream{ln: ln, caPEM: caPEM, log: cfg.Logger, secret: []byte("Bearer " + cfg.Secret)}
	u.srv = &http.Server{
		Handler:           http.HandlerFunc(u.serve),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	go u.srv.ServeTLS(ln, "", "")
	return u, nil
}

// serve answers {"authorized": true} (200) to a request bearing the real
// value and {"authorized": false} (401) to any other: whether the proxy
// substituted the placeholder, and nothing of what was sent.
func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	ok := subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), u.secret) == 1
	status := http.StatusOK
	if ok {
		u.authorized.Add(1)
	} else {
		u.refused.Add(1)
		status = http.StatusUnauthorized
	}
	u.log.Info("demo upstream", "method", r.Method, "path", r.URL.Path, "authorized", ok)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"authorized": %t}`+"\n", ok)
}

// Port is the upstream's port.
func (u *Upstream) Port() int { return u.ln.Addr().(*net.TCPAddr).Port }

// Addr is where the upstream listens (an IP and port).
func (u *Upstream) Addr() string { return u.ln.Addr().String() }

// IP is the upstream's IP, which the proxy pins UpstreamName to.
func (u *Upstream) IP() string { return u.ln.Addr().(*net.TCPAddr).IP.String() }

// Domain is the upstream as a policy domain and a CONNECT authority:
// UpstreamName with the port.
func (u *Upstream) Domain() string { return fmt.Sprintf("%s:%d", UpstreamName, u.Port()) }

// URL is what the demo agent calls.
func (u *Upstream) URL() string { return "https://" + u.Domain() + UpstreamPath }

// CAPEM is the upstream's CA certificate (for proxy.upstream.extraRootsFile).
func (u *Upstream) CAPEM() []byte { return bytes.Clone(u.caPEM) }

// Authorized counts requests that bore the real value; Refused the others.
func (u *Upstream) Authorized() int64 { return u.authorized.Load() }

// Refused counts requests that did not bear the real value.
func (u *Upstream) Refused() int64 { return u.refused.Load() }

// Close stops serving, within ctx.
func (u *Upstream) Close(ctx context.Context) error { return u.srv.Shutdown(ctx) }

// mintCerts makes a CA and a leaf for UpstreamName signed by it.
func mintCerts(random io.Reader, now time.Time) (caPEM []byte, leaf tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), random)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("demo: CA key: %w", err)
	}
	serial := func() (*big.Int, error) { return rand.Int(random, new(big.Int).Lsh(big.NewInt(1), 120)) }
	caSerial, err := serial()
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: caSerial, Subject: pkix.Name{CommonName: "runfleet demo upstream CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certLifetime),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(random, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("demo: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), random)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("demo: leaf key: %w", err)
	}
	leafSerial, err := serial()
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: leafSerial, Subject: pkix.Name{CommonName: UpstreamName}, DNSNames: []string{UpstreamName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certLifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(random, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("demo: leaf certificate: %w", err)
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// NewSecret mints a real value for the demo key.
func NewSecret(random io.Reader) (string, error) {
	if random == nil {
		random = rand.Reader
	}
	b := make([]byte, 24)
	if _, err := io.ReadFull(random, b); err != nil {
		return "", fmt.Errorf("demo: minting the secret: %w", err)
	}
	return fmt.Sprintf("demo-real-%x", b), nil
}

// SecretsRef is the demo key in edge's secrets file.
const SecretsRef = Project + "/" + Key

// WriteSecretsFile writes edge's secrets file (0600) holding the demo
// key's real value.
func WriteSecretsFile(path, value string) error {
	b, err := json.Marshal(map[string]string{SecretsRef: value})
	if err != nil {
		return err
	}
	return writePrivate(path, append(b, '\n'))
}

// ReadSecretsFile reads the demo key's real value back; os.ErrNotExist
// when the file is missing.
func ReadSecretsFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil || m[SecretsRef] == "" {
		return "", fmt.Errorf("demo: %s holds no %s (delete it to mint a new demo secret)", path, SecretsRef)
	}
	return m[SecretsRef], nil
}

// AgentScript is the demo agent: it says what it does, calls the upstream
// through the proxy with curl and its placeholder, and prints the answer;
// it fails unless the upstream says the credential was right. The prompt
// is its first argument.
func AgentScript(u *Upstream) string {
	return strings.Join([]string{
		`echo "demo agent: $1"`,
		`echo "calling ` + u.URL() + ` with ` + Key + ` (a placeholder of ${#` + Key + `} characters)"`,
		`answer=$(curl -sS --fail-with-body -H "Authorization: Bearer $` + Key + `" ` + u.URL() + `)`,
		`status=$?`,
		`echo "the upstream answered: $answer"`,
		`exit $status`,
	}, "\n")
}

// Secret is the dispatch's declaration of the demo secret for u.
type Secret struct {
	ProjectID string   `json:"projectId"`
	Key       string   `json:"key"`
	Domains   []string `json:"domains"`
}

// DispatchBody is a POST /fleet/runs body running agent with prompt and
// the demo secret declared for u.
func DispatchBody(u *Upstream, agent, prompt string) string {
	b, _ := json.Marshal(struct {
		Agent   string   `json:"agent"`
		Prompt  string   `json:"prompt"`
		Secrets []Secret `json:"secrets"`
	}{agent, prompt, []Secret{{Project, Key, []string{u.Domain()}}}})
	return string(b)
}

func writePrivate(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
