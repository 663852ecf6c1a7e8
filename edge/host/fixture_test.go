package host

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
)

const (
	realSecret = "real-secret-value-7f3a9c"
	hostToken  = "host-token-for-tests-5d1e"
)

// testCA signs the loopback upstreams' certificates and the host API's.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "runfleet test upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (c *testCA) leaf(t testing.TB, names ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func (c *testCA) tlsServer(t testing.TB, h http.Handler, names ...string) *httptest.Server {
	t.Helper()
	certPEM, keyPEM := c.leaf(t, names...)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// fixture is one edge host's surroundings: a data dir, the host token, the
// secrets file, a loopback HTTPS upstream the policy intercepts and one it
// does not, and the edge.json tying them together. Everything a task must
// reach lies in directories nobody can traverse; the files it must not
// read are 0600, as deployed.
type fixture struct {
	t           testing.TB
	dir         string
	dataDir     string
	cfgPath     string
	tokenPath   string
	secretsPath string
	systemRoots string
	ca          *testCA

	upstream     *httptest.Server
	upstreamHost string // api.example.test:port
	tunnelHost   string // tunnel.example.test:port

	mu   sync.Mutex
	seen []string // Authorization headers the upstream received

	runner map[string]any // overrides of the runner section
	caCfg  map[string]any
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests start tasks as nobody and must run as root (as in CI)")
	}
	f := &fixture{t: t, ca: newTestCA(t)}
	// Outside /tmp and /var/tmp, which a task has its own of: edge's files
	// lie where tasks see them, guarded by their modes alone, as deployed.
	dir, err := os.MkdirTemp("/var/lib", "runfleet-test-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o755))
	f.dir = dir
	f.dataDir = filepath.Join(f.dir, "data")
	etc := filepath.Join(f.dir, "etc")
	must(t, os.Mkdir(etc, 0o755))
	f.tokenPath = filepath.Join(etc, "host-token")
	must(t, os.WriteFile(f.tokenPath, []byte(hostToken+"\n"), 0o600))
	f.secretsPath = filepath.Join(etc, "secrets.json")
	must(t, os.WriteFile(f.secretsPath, []byte(`{"acme/API_TOKEN": "`+realSecret+`"}`), 0o600))
	upstreamRoots := filepath.Join(etc, "upstream-ca.pem")
	must(t, os.WriteFile(upstreamRoots, f.ca.pem, 0o644))
	// The system roots a task's trust file starts with: the machine's, plus
	// the test CA standing in for a public CA that signed the tunnelled site.
	sys, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	must(t, err)
	f.systemRoots = filepath.Join(etc, "system-roots.pem")
	must(t, os.WriteFile(f.systemRoots, append(append(sys, '\n'), f.ca.pem...), 0o644))

	f.upstream = f.ca.tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.seen = append(f.seen, r.Header.Get("Authorization"))
		f.mu.Unlock()
		io.WriteString(w, "upstream-ok")
	}), "api.example.test")
	f.upstreamHost = "api.example.test:" + port(f.upstream)
	tunnel := f.ca.tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "tunnel-ok")
	}), "tunnel.example.test")
	f.tunnelHost = "tunnel.example.test:" + port(tunnel)
	return f
}

func port(s *httptest.Server) string {
	_, p, _ := net.SplitHostPort(s.Listener.Addr().String())
	return p
}

func (f *fixture) upstreamSaw() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen...)
}

// writeConfig writes edge.json for the fixture.
func (f *fixture) writeConfig() {
	f.t.Helper()
	runner := map[string]any{"user": "nobody", "cancelGrace": "10s"}
	for k, v := range f.runner {
		runner[k] = v
	}
	caCfg := map[string]any{}
	for k, v := range f.caCfg {
		caCfg[k] = v
	}
	cfg := map[string]any{
		"dataDir": f.dataDir,
		"api":     map[string]any{"listen": "127.0.0.1:0", "tokenFile": f.tokenPath},
		"proxy": map[string]any{"listen": "127.0.0.1:0", "egress": "open", "upstream": map[string]any{
			"resolve":        map[string]string{"api.example.test": "127.0.0.1", "tunnel.example.test": "127.0.0.1"},
			"allowPrivate":   []string{"127.0.0.0/8"},
			"extraRootsFile": filepath.Join(f.dir, "etc", "upstream-ca.pem"),
		}},
		"ca": caCfg,
		"policy": map[string]any{"projects": map[string]any{"acme": map[string]any{"keys": map[string]any{
			"API_TOKEN": map[string]any{"domains": []string{f.upstreamHost}, "in": []string{"header"}, "placeholder": map[string]any{"prefix": "ph-", "length": 40}},
		}}}},
		"secrets": map[string]any{"file": f.secretsPath},
		"agents":  map[string]any{"shell": map[string]any{"argv": []string{"sh", "-c", "{prompt}"}}},
		"runner":  runner,
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	f.cfgPath = filepath.Join(f.dir, "edge.json")
	must(f.t, os.WriteFile(f.cfgPath, b, 0o600))
}

// edgeHost is a running in-process Host with a client of its API.
type edgeHost struct {
	*Host
	f      *fixture
	client *hostproto.Client
	logs   *syncBuffer
}

type hostOptions struct {
	killSwitch bool
	clock      clock.Clock
	beforeExec func(string)
}

func (f *fixture) open(o hostOptions) *edgeHost {
	f.t.Helper()
	f.writeConfig()
	return f.openWritten(o)
}

// openWritten opens a host on the edge.json already written.
func (f *fixture) openWritten(o hostOptions) *edgeHost {
	f.t.Helper()
	cfg, err := config.Load(f.cfgPath)
	must(f.t, err)
	logs := &syncBuffer{}
	h, err := Open(context.Background(), Options{
		Config: cfg, KillSwitch: o.killSwitch, Clock: o.clock, SystemRootsFile: f.systemRoots, BeforeExec: o.beforeExec,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	must(f.t, err)
	h.Start(nil)
	client, err := hostproto.NewClient(hostproto.ClientConfig{BaseURL: "http://" + h.APIAddr().String(), Token: hostToken})
	must(f.t, err)
	e := &edgeHost{Host: h, f: f, client: client, logs: logs}
	f.t.Cleanup(func() { e.shutdown() })
	return e
}

func (e *edgeHost) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Shutdown(ctx); err != nil {
		e.f.t.Errorf("shutdown: %v", err)
	}
	// No log line may hold the real value, a placeholder or the token.
	if strings.Contains(e.logs.String(), realSecret) || strings.Contains(e.logs.String(), hostToken) || strings.Contains(e.logs.String(), "ph-") {
		e.f.t.Errorf("edge's log holds a secret, a placeholder or the host token")
	}
}

var bg = context.Background()

func (e *edgeHost) start(req hostproto.StartRequest) hostproto.Run {
	e.f.t.Helper()
	if req.ClientToken == "" {
		req.ClientToken = fmt.Sprintf("ct-%d", time.Now().UnixNano())
	}
	if req.Agent == "" {
		req.Agent = "shell"
	}
	run, err := e.client.Start(bg, req)
	must(e.f.t, err)
	return run
}

func (e *edgeHost) waitEnd(runID string) hostproto.Run {
	return e.waitFor(runID, func(r hostproto.Run) bool { return hostproto.TerminalStatus(r.Status) })
}

// waitFor polls the API until the run satisfies done: it waits for a real
// process, so on real time, with a deadline.
func (e *edgeHost) waitFor(runID string, done func(hostproto.Run) bool) hostproto.Run {
	e.f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		run, err := e.client.Get(bg, runID)
		must(e.f.t, err)
		if done(run) {
			return run
		}
		if time.Now().After(deadline) {
			e.f.t.Fatalf("run %s stuck at %+v", runID, run)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *edgeHost) events(runID string) []hostproto.Event {
	e.f.t.Helper()
	var all []hostproto.Event
	after := int64(0)
	for {
		p, err := e.client.Events(bg, runID, after, 1000)
		must(e.f.t, err)
		all = append(all, p.Events...)
		after = p.NextCursor
		if !p.HasMore {
			return all
		}
	}
}

func (e *edgeHost) output(runID string) string {
	var b strings.Builder
	for _, ev := range e.events(runID) {
		if ev.Type == hostproto.EventOutput {
			var s string
			json.Unmarshal(ev.Data, &s)
			b.WriteString(s)
		}
	}
	return b.String()
}

// waitOutput polls until the run's output holds want.
func (e *edgeHost) waitOutput(runID, want string) string {
	e.f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := e.output(runID)
		if strings.Contains(out, want) {
			return out
		}
		if time.Now().After(deadline) {
			e.f.t.Fatalf("run %s never printed %q; output %q", runID, want, out)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *edgeHost) metric(name string) string {
	e.f.t.Helper()
	m, err := e.client.Metrics(bg)
	must(e.f.t, err)
	for _, line := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(line, name+" ") {
			return strings.TrimPrefix(line, name+" ")
		}
	}
	return ""
}

// envLine returns NAME's value from `env` output.
func envLine(out, name string) string {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), name+"="); ok {
			return v
		}
	}
	return ""
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
