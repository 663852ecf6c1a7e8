package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/ca"
	logredact "github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/edge/upstream"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// seen is one request as an upstream received it.
type seen struct {
	Method, Host, Path, RawQuery string
	Header                       http.Header
	Body                         []byte
	Proto                        string
	TransferEncoding             []string
	ContentLength                int64
}

// testUpstream is a real HTTPS server on loopback that records what it got.
type testUpstream struct {
	srv     *httptest.Server
	port    int
	mu      sync.Mutex
	got     []seen
	handler http.HandlerFunc // optional override after recording
	// noRecord stops keeping requests (benchmarks send millions).
	noRecord bool
}

func startUpstream(t testing.TB, uca *edgetest.CA, h2 bool, names ...string) *testUpstream {
	t.Helper()
	u := &testUpstream{}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u.handler != nil && r.Header.Get("Upgrade") != "" {
			u.handler(w, r)
			return
		}
		if u.noRecord && u.handler != nil {
			u.handler(w, r)
			return
		}
		if u.noRecord {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok\n")
			return
		}
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.got = append(u.got, seen{r.Method, r.Host, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body, r.Proto, r.TransferEncoding, r.ContentLength})
		h := u.handler
		u.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "hello from upstream; got %d body bytes\n", len(body))
	}))
	u.srv.EnableHTTP2 = h2
	u.srv.TLS = &tls.Config{Certificates: []tls.Certificate{uca.Certificate(t, names...)}}
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	u.port = u.srv.Listener.Addr().(*net.TCPAddr).Port
	return u
}

func (u *testUpstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.got...)
}

// tb is the part of testing.TB the harness uses, so the benchmarks' child
// process (which has no *testing.T) can build an env too.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	TempDir() string
	Cleanup(func())
}

// env is one edge secrets proxy wired as edge serve wires it: a policy file
// watched, the real CA, the secrets file, the upstream guard with pins.
type env struct {
	t          tb
	dir        string
	configPath string
	watcher    *policy.Watcher
	authority  *ca.Authority
	proxy      *Proxy
	resolver   *countingResolver
	logs       *syncbuf.Buffer
	auditDir   string
	audit      *audit.Log
	bundlePath string
	secrets    map[string]string
	uca        *edgetest.CA
	listener   net.Listener
}

type envOptions struct {
	egress  string
	pins    map[string]string
	keys    string // the JSON of policy.projects
	secrets map[string]string
	table   map[string][]netip.Addr
	dataDir string // reuse (restart)
	uca     *edgetest.CA
	// noAllowPrivate leaves upstream.allowPrivate empty (default 127.0.0.0/8).
	noAllowPrivate bool
	// rand mints placeholders and passwords; nil means crypto/rand.
	rand io.Reader
	// quiet logs at Info (the fuzz target's thousands of requests).
	quiet bool
	// auditMaxBytes rotates the audit file past this size (0: the default).
	auditMaxBytes int64
	// maxTaskConns is Config.MaxTaskConns (0: the default).
	maxTaskConns int
	// handshakeTimeout is Config.HandshakeTimeout (0: the default).
	handshakeTimeout time.Duration
	// redactor, when set, is wired as edge serve wires it: it learns every
	// value read from the source, filters the log (e.logs) and the audit
	// lines, and is the tripwire's index; rawLogs and rawAudit then get the
	// lines before the filter.
	redactor          *logredact.Set
	rawLogs, rawAudit io.Writer
	// metrics, when set, receives the audit's metrics, as edge serve's
	// registry does.
	metrics prometheus.Registerer
}

func newEnv(t tb, o envOptions) *env {
	t.Helper()
	dir := o.dataDir
	if dir == "" {
		dir = t.TempDir()
	}
	e := &env{t: t, dir: dir, logs: &syncbuf.Buffer{}, secrets: o.secrets, uca: o.uca}
	if e.uca == nil {
		e.uca = edgetest.NewCA(t)
	}
	if o.egress == "" {
		o.egress = policy.EgressOpen
	}
	rootsPath := filepath.Join(dir, "upstream-ca.pem")
	must(t, os.WriteFile(rootsPath, e.uca.PEM, 0o600))
	e.writeSecrets()
	pins, _ := json.Marshal(o.pins)
	e.configPath = filepath.Join(dir, "edge.json")
	e.writePolicy(string(pins), o.keys)
	level := slog.LevelDebug
	if o.quiet {
		level = slog.LevelInfo
	}
	var logOut io.Writer = e.logs
	if o.redactor != nil {
		logOut = io.MultiWriter(o.rawLogs, o.redactor.Writer(e.logs))
	}
	logger := slog.New(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: level}))
	var err error
	e.watcher, err = policy.NewWatcher(policy.WatcherConfig{Path: e.configPath, Logger: logger})
	must(t, err)
	sealer, err := ca.NewFileSealer(filepath.Join(dir, "seal.key"), nil)
	must(t, err)
	e.authority, err = ca.Open(context.Background(), ca.Config{Dir: filepath.Join(dir, "ca"), Sealer: sealer, Logger: logger, AllowName: e.watcher.AllowName})
	must(t, err)
	e.bundlePath = filepath.Join(dir, "trust.pem")
	must(t, os.WriteFile(e.bundlePath, e.authority.Bundle(), 0o644))

	e.listener, err = net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	own := []netip.AddrPort{netip.MustParseAddrPort(e.listener.Addr().String())}
	pinned := map[string]netip.Addr{}
	for k, v := range o.pins {
		pinned[k] = netip.MustParseAddr(v)
	}
	e.resolver = &countingResolver{pins: pinned, table: o.table}
	allow := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	if o.noAllowPrivate {
		allow = nil
	}
	guard, err := upstream.NewGuard(upstream.GuardConfig{Resolver: e.resolver, AllowPrivate: allow, Own: own})
	must(t, err)
	tlsCfg, err := upstream.ClientTLSConfig(rootsPath)
	must(t, err)
	src, err := secrets.NewFileSource(filepath.Join(dir, "secrets.json"))
	must(t, err)
	e.auditDir = filepath.Join(dir, "logs")
	var filter func([]byte) []byte
	var source secrets.Source = src
	var realValues RealValues // nil: no tripwire, unless wired as edge serve does
	var observe func(secrets.Value)
	if o.redactor != nil {
		realValues, observe = o.redactor, o.redactor.Add
		source = secrets.Observed(src, o.redactor.Add)
		filter = func(line []byte) []byte {
			o.rawAudit.Write(line)
			return o.redactor.Redact(line)
		}
	}
	al, err := audit.Open(audit.Config{Dir: e.auditDir, MaxBytes: o.auditMaxBytes, Keep: 50, Logger: logger, Redact: filter, Registerer: o.metrics})
	must(t, err)
	e.audit = al
	e.proxy, err = New(Config{
		Listener: e.listener, Egress: o.egress, DataDir: dir, Policy: e.watcher, Leaves: e.authority,
		Secrets: source, Upstream: guard, UpstreamTLS: tlsCfg, Audit: al, Logger: logger, Rand: o.rand,
		MaxTaskConns: o.maxTaskConns, HandshakeTimeout: o.handshakeTimeout, RealValues: realValues, Observe: observe,
	})
	must(t, err)
	go e.proxy.Serve()
	await.Cond(t, 5*time.Second, "the proxy to serve", func() bool { return e.proxy.Ready() == nil })
	t.Cleanup(func() {
		e.proxy.Close()
		e.authority.Close()
		al.Close()
	})
	return e
}

// countingResolver answers pinned names, then its table, and records every
// name the proxy asked for, so a test sees each resolution attempt.
type countingResolver struct {
	pins  map[string]netip.Addr
	mu    sync.Mutex
	names []string
	table map[string][]netip.Addr
}

func (c *countingResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.names = append(c.names, host)
	if ip, ok := c.pins[host]; ok {
		return []netip.Addr{ip}, nil
	}
	if a, ok := c.table[host]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}

func (c *countingResolver) lookups() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.names...)
}

func (e *env) writeSecrets() {
	b, _ := json.Marshal(e.secrets)
	tmp := filepath.Join(e.dir, "secrets.json.tmp")
	must(e.t, os.WriteFile(tmp, b, 0o600))
	must(e.t, os.Rename(tmp, filepath.Join(e.dir, "secrets.json")))
}

func (e *env) writePolicy(pins, keys string) {
	cfg := fmt.Sprintf(`{"dataDir": %q, "api": {"tokenFile": %q},
	  "proxy": {"upstream": {"resolve": %s, "allowPrivate": ["127.0.0.0/8"]}},
	  "policy": {"projects": %s}}`, e.dir, filepath.Join(e.dir, "token"), pins, keys)
	must(e.t, os.WriteFile(e.configPath, []byte(cfg), 0o600))
}

// task registers a run with declared secrets and starts its attempt; it
// returns the proxy URL with credentials and the placeholders by key.
func (e *env) task(runID string, declared ...runspec.Secret) (*url.URL, map[string]string) {
	e.t.Helper()
	must(e.t, e.proxy.Register(runID, e.declare(declared...)))
	u, err := e.proxy.StartAttempt(runID)
	must(e.t, err)
	keys, err := e.proxy.TaskKeys(runID)
	must(e.t, err)
	phs := map[string]string{}
	for _, k := range keys {
		phs[k.Key] = k.Placeholder
	}
	return u, phs
}

// declare reads secrets as a host reads a run's (runspec), a secret that
// names no domain taken as declared for every domain the policy in force
// gives its key (most tests want a key wherever it may go; a key the policy
// lacks is declared for a domain of its own, and refused by name).
func (e *env) declare(secrets ...runspec.Secret) []runspec.Declared {
	e.t.Helper()
	secrets = slices.Clone(secrets)
	for i, s := range secrets {
		if len(s.Domains) > 0 {
			continue
		}
		k, ok := e.watcher.Current().Key(policy.KeyRef{Project: s.ProjectID, Key: s.Key})
		if !ok {
			secrets[i].Domains = []string{"not-in-the-policy.example"}
			continue
		}
		for _, d := range k.Domains {
			secrets[i].Domains = append(secrets[i].Domains, d.String())
		}
	}
	declared, err := runspec.Request{Agent: "test", Secrets: secrets}.Declare()
	must(e.t, err)
	return declared
}

// goClient is a net/http client configured the way a task's Go program is:
// the proxy URL and a trust pool of the CA bundle.
func (e *env) goClient(proxyURL *url.URL, h2 bool) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.authority.Bundle())
	return &http.Client{Transport: &http.Transport{
		Proxy:             http.ProxyURL(proxyURL),
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2: h2,
	}, Timeout: 20 * time.Second}
}

// auditLines reads every audit line written so far, oldest first: the
// rotated files (the highest number is the oldest), then the live one.
func (e *env) auditLines() []map[string]any {
	e.audit.Flush()
	var b []byte
	for i := 50; i >= 0; i-- {
		name := audit.FileName
		if i > 0 {
			name += "." + strconv.Itoa(i)
		}
		part, _ := os.ReadFile(filepath.Join(e.auditDir, name))
		b = append(b, part...)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		must(e.t, json.Unmarshal([]byte(line), &m))
		out = append(out, m)
	}
	return out
}

// lastAudit waits for an audit line matching pred (a line is written when
// a request or tunnel ends, which may be just after the client returns).
func (e *env) waitAudit(pred func(map[string]any) bool) map[string]any {
	e.t.Helper()
	var lines []map[string]any
	var found map[string]any
	if !await.Within(5*time.Second, func() bool {
		lines = e.auditLines()
		for i := len(lines) - 1; i >= 0 && found == nil; i-- {
			if pred(lines[i]) {
				found = lines[i]
			}
		}
		return found != nil
	}) {
		e.t.Fatalf("no matching audit line in %v", lines)
	}
	return found
}

// assertNoLeak checks that neither the proxy's log nor its audit files (the
// live one and the rotated ones) hold any of the given values or
// placeholders, in any case.
func (e *env) assertNoLeak(secretsOrPlaceholders ...string) {
	e.t.Helper()
	e.audit.Flush()
	files, _ := filepath.Glob(filepath.Join(e.auditDir, audit.FileName+"*"))
	if len(files) == 0 {
		e.t.Errorf("no audit file in %s", e.auditDir)
	}
	var auditText []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		must(e.t, err)
		auditText = append(auditText, b...)
	}
	logText := strings.ToLower(e.logs.String())
	auditText = bytes.ToLower(auditText)
	for _, s := range secretsOrPlaceholders {
		if s == "" {
			continue
		}
		s = strings.ToLower(s)
		if strings.Contains(logText, s) {
			e.t.Errorf("the log holds a value or placeholder (%d chars)", len(s))
		}
		if bytes.Contains(auditText, []byte(s)) {
			e.t.Errorf("the audit log holds a value or placeholder (%d chars)", len(s))
		}
	}
}

func must(t tb, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// clientEnv is the whole environment a task's client runs with: only the
// standard proxy and trust variables.
func (e *env) clientEnv(proxyURL *url.URL, extra ...string) []string {
	return append([]string{
		"PATH=/usr/bin:/bin",
		"HOME=" + e.dir,
		"HTTPS_PROXY=" + proxyURL.String(),
		"https_proxy=" + proxyURL.String(),
		"SSL_CERT_FILE=" + e.bundlePath,
		"REQUESTS_CA_BUNDLE=" + e.bundlePath,
		"CURL_CA_BUNDLE=" + e.bundlePath,
	}, extra...)
}

func runClient(t testing.TB, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", name, err, out.String(), errOut.String())
	}
	return out.String() + errOut.String()
}

func itoa(i int) string { return strconv.Itoa(i) }

// dialIntercepted opens a CONNECT to target with the task's credential and
// completes TLS with the given SNI and ALPN, verifying the leaf against the
// CA bundle unless the SNI deliberately mismatches.
func (e *env) dialIntercepted(proxyURL *url.URL, target, sni string, alpn ...string) (*tls.Conn, *bufio.Reader) {
	e.t.Helper()
	c, br, status := e.connect(proxyURL, target)
	if status != http.StatusOK {
		c.Close()
		e.t.Fatalf("CONNECT %s: %d", target, status)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.authority.Bundle())
	host, _, _ := net.SplitHostPort(target)
	cfg := &tls.Config{RootCAs: pool, ServerName: sni, NextProtos: alpn}
	if sni != host {
		cfg.InsecureSkipVerify = true
	}
	tc := tls.Client(&replayConn{Conn: c, r: br}, cfg)
	must(e.t, tc.Handshake())
	return tc, bufio.NewReader(tc)
}

// connect sends a CONNECT and reads the proxy's answer.
func (e *env) connect(proxyURL *url.URL, target string) (net.Conn, *bufio.Reader, int) {
	e.t.Helper()
	c, err := net.Dial("tcp", proxyURL.Host)
	must(e.t, err)
	auth := ""
	if proxyURL.User != nil {
		pw, _ := proxyURL.User.Password()
		auth = "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(proxyURL.User.Username()+":"+pw)) + "\r\n"
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", target, target, auth)
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	must(e.t, err)
	if res.StatusCode != http.StatusOK {
		io.Copy(io.Discard, res.Body)
	}
	return c, br, res.StatusCode
}

// replayConn reads what a bufio.Reader already buffered first.
type replayConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// roundTrip writes a raw HTTP/1.1 request and reads the response.
func roundTrip(t testing.TB, w io.Writer, br *bufio.Reader, raw string) (*http.Response, string) {
	t.Helper()
	if _, err := io.WriteString(w, raw); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(body)
}
