package host

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

const (
	realSecret = "real-secret-value-7f3a9c"
	hostToken  = "host-token-for-tests-5d1e"
)

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
	ca          *edgetest.CA

	upstream     *httptest.Server
	upstreamHost string // api.example.test:port
	tunnelHost   string // tunnel.example.test:port

	mu   sync.Mutex
	seen []string // Authorization headers the upstream received

	runner map[string]any // overrides of the runner section
	// egress is proxy.egress; empty means open.
	egress string
	// keyIn is API_TOKEN's "in"; empty means header alone.
	keyIn []string
	// keys are acme's keys besides API_TOKEN, as edge.json writes them.
	keys map[string]any
	// pprof is proxy.pprof; empty means off.
	pprof string
	caCfg map[string]any
	// apiTLS is the host API's certificate and key files, when it serves
	// TLS (serveAPIOverTLS).
	apiTLS map[string]string
}

// serveAPIOverTLS has the host API serve TLS with a leaf of the test CA for
// 127.0.0.1, its files under etc/ (the key 0600); writeConfig sets
// api.tls. It returns the key file's path.
func (f *fixture) serveAPIOverTLS() (keyFile string) {
	f.t.Helper()
	certPEM, keyPEM := f.ca.Leaf(f.t, "127.0.0.1")
	certFile, keyFile := filepath.Join(f.dir, "etc", "api.pem"), filepath.Join(f.dir, "etc", "api-key.pem")
	must(f.t, os.WriteFile(certFile, certPEM, 0o644))
	must(f.t, os.WriteFile(keyFile, keyPEM, 0o600))
	f.apiTLS = map[string]string{"certFile": certFile, "keyFile": keyFile}
	return keyFile
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	edgetest.RequireRoot(t)
	f := &fixture{t: t, ca: edgetest.NewCA(t)}
	// Outside /tmp and /var/tmp, which a task has its own of: edge's files
	// lie where tasks see them, guarded by their modes alone, as deployed.
	f.dir = edgetest.HostDir(t)
	f.dataDir = filepath.Join(f.dir, "data")
	etc := filepath.Join(f.dir, "etc")
	must(t, os.Mkdir(etc, 0o755))
	f.tokenPath = filepath.Join(etc, "host-token")
	must(t, os.WriteFile(f.tokenPath, []byte(hostToken+"\n"), 0o600))
	f.secretsPath = filepath.Join(etc, "secrets.json")
	must(t, os.WriteFile(f.secretsPath, []byte(`{"acme/API_TOKEN": "`+realSecret+`"}`), 0o600))
	upstreamRoots := filepath.Join(etc, "upstream-ca.pem")
	must(t, os.WriteFile(upstreamRoots, f.ca.PEM, 0o644))
	// The system roots a task's trust file starts with: the machine's, plus
	// the test CA standing in for a public CA that signed the tunnelled site.
	sys, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	must(t, err)
	f.systemRoots = filepath.Join(etc, "system-roots.pem")
	must(t, os.WriteFile(f.systemRoots, append(append(sys, '\n'), f.ca.PEM...), 0o644))

	f.upstream = f.ca.TLSServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.seen = append(f.seen, r.Header.Get("Authorization"))
		f.mu.Unlock()
		if r.URL.Path == "/reflect" {
			// An upstream quoting the credential it got: the task must get
			// the answer scrubbed of it.
			io.WriteString(w, "reflected="+r.Header.Get("Authorization"))
			return
		}
		io.WriteString(w, "upstream-ok")
	}), "api.example.test")
	f.upstreamHost = "api.example.test:" + port(f.upstream)
	tunnel := f.ca.TLSServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	egress := f.egress
	if egress == "" {
		egress = "open"
	}
	keyIn := f.keyIn
	if len(keyIn) == 0 {
		keyIn = []string{"header"}
	}
	api := map[string]any{"listen": "127.0.0.1:0", "tokenFile": f.tokenPath}
	if f.apiTLS != nil {
		api["tls"] = f.apiTLS
	}
	proxy := map[string]any{"listen": "127.0.0.1:0", "egress": egress, "upstream": map[string]any{
		"resolve":        map[string]string{"api.example.test": "127.0.0.1", "tunnel.example.test": "127.0.0.1"},
		"allowPrivate":   []string{"127.0.0.0/8"},
		"extraRootsFile": filepath.Join(f.dir, "etc", "upstream-ca.pem"),
	}}
	if f.pprof != "" {
		proxy["pprof"] = f.pprof
	}
	keys := map[string]any{
		"API_TOKEN": map[string]any{"domains": []string{f.upstreamHost}, "in": keyIn, "placeholder": map[string]any{"prefix": "ph-", "length": 40}},
	}
	for k, v := range f.keys {
		keys[k] = v
	}
	cfg := map[string]any{
		"dataDir": f.dataDir,
		"api":     api,
		"proxy":   proxy,
		"ca":      caCfg,
		"policy":  map[string]any{"projects": map[string]any{"acme": map[string]any{"keys": keys}}},
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
	logs   *syncbuf.Buffer
}

type hostOptions struct {
	killSwitch bool
	clock      clock.Clock
	beforeExec func(string)
	// ledgerOff runs the host without egress ledgers (a benchmark's
	// baseline).
	ledgerOff bool
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
	logs := &syncbuf.Buffer{}
	h, err := Open(context.Background(), Options{
		Config: cfg, KillSwitch: o.killSwitch, Clock: o.clock, SystemRootsFile: f.systemRoots, BeforeExec: o.beforeExec, ledgerOff: o.ledgerOff,
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

func (e *edgeHost) start(req runspec.Request) hostproto.Run {
	e.f.t.Helper()
	if req.Agent == "" {
		req.Agent = "shell"
	}
	run, err := e.client.Start(bg, hostproto.StartRequest{ClientToken: fmt.Sprintf("ct-%d", time.Now().UnixNano()), Request: req})
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
	var run hostproto.Run
	if !await.Within(30*time.Second, func() bool {
		var err error
		run, err = e.client.Get(bg, runID)
		must(e.f.t, err)
		return done(run)
	}) {
		e.f.t.Fatalf("run %s stuck at %+v", runID, run)
	}
	return run
}

func (e *edgeHost) events(runID string) []hostproto.Event {
	e.f.t.Helper()
	var all []hostproto.Event
	after := int64(0)
	for {
		p, err := e.client.Events(bg, runID, after, 1000)
		must(e.f.t, err)
		all = append(all, p.Events...)
		after = *p.NextCursor
		if !p.HasMore {
			return all
		}
	}
}

func (e *edgeHost) output(runID string) string { return edgetest.Output(e.events(runID)) }

// waitOutput polls until the run's output holds want.
func (e *edgeHost) waitOutput(runID, want string) string {
	e.f.t.Helper()
	var out string
	if !await.Within(30*time.Second, func() bool { out = e.output(runID); return strings.Contains(out, want) }) {
		e.f.t.Fatalf("run %s never printed %q; output %q", runID, want, out)
	}
	return out
}

// wantOutput checks that the ended run's output (line ends as "\n") holds
// each of wants.
func (e *edgeHost) wantOutput(runID string, wants ...string) {
	e.f.t.Helper()
	out := strings.ReplaceAll(e.output(runID), "\r\n", "\n")
	for _, want := range wants {
		if !strings.Contains(out, want) {
			e.f.t.Errorf("the task's output lacks %q:\n%s", want, out)
		}
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
