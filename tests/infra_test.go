package tests

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

const (
	edgeExample = "../infra/edge.example.json"
	edgeUnit    = "../infra/systemd/runfleet-edge.service"
	// edgeShutdownMargin is what `edge serve` allows its shutdown beyond
	// the drain and the cancel grace (shutdownMargin in edge/cmd_serve.go).
	edgeShutdownMargin = 30 * time.Second
)

// systemdUnit is a unit file's [Service] (and other) settings: each key
// with its values in order (a key may repeat).
type systemdUnit map[string][]string

func parseUnit(t *testing.T, path string) systemdUnit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := systemdUnit{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: not a setting: %q", path, line)
			}
			u[section+"."+k] = append(u[section+"."+k], v)
		}
	}
	return u
}

// one returns the single value of a [Service] key ("" when absent).
func (u systemdUnit) one(t *testing.T, key string) string {
	t.Helper()
	v := u["Service."+key]
	if len(v) > 1 {
		t.Fatalf("%s is set %d times", key, len(v))
	}
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// systemdTimespan parses a time span as systemd does.
func systemdTimespan(t *testing.T, span string) time.Duration {
	t.Helper()
	out, err := exec.Command("systemd-analyze", "timespan", span).Output()
	if err != nil {
		t.Fatalf("systemd-analyze timespan %q: %v", span, err)
	}
	m := regexp.MustCompile(`μs: (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze timespan %q: %s", span, out)
	}
	us, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return time.Duration(us) * time.Microsecond
}

// TestEdgeExampleConfigLoads: infra/edge.example.json is a complete edge
// config as edge serve reads it, and its policy compiles.
func TestEdgeExampleConfigLoads(t *testing.T) {
	cfg, err := config.Load(edgeExample)
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Compile(cfg.Policy)
	if err != nil {
		t.Fatalf("the example's policy: %v", err)
	}
	if len(p.Keys()) == 0 || len(cfg.Agents) == 0 || len(cfg.Runner.Roots) == 0 {
		t.Errorf("the example should show keys, agents and roots: %d keys, agents %v, roots %v", len(p.Keys()), cfg.Agents, cfg.Runner.Roots)
	}
	if !cfg.API.TLS.Enabled() {
		t.Error("the example's host API is not TLS: Fleet refuses a non-loopback http:// host")
	}
	if cfg.Runner.User == "nobody" || cfg.Runner.User == "root" || cfg.Runner.InsecureSameUser {
		t.Errorf("the example runs tasks as %q (insecureSameUser %v): want a dedicated user", cfg.Runner.User, cfg.Runner.InsecureSameUser)
	}
	// Every key of edge.json is written out, so an operator sees each
	// setting: the file decodes to the same config before defaults.
	raw, _ := os.ReadFile(edgeExample)
	var written map[string]any
	json.Unmarshal(raw, &written)
	for _, section := range []string{"dataDir", "api", "proxy", "ca", "policy", "secrets", "agents", "runner"} {
		if written[section] == nil {
			t.Errorf("the example lacks %s", section)
		}
	}
}

// TestEdgeExampleConfigServes runs edge serve on the example config, its
// paths moved into a temporary dir and its listeners onto free loopback
// ports, everything else as written: it starts, answers /healthz over TLS
// with the host token, and drains on SIGTERM.
func TestEdgeExampleConfigServes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("edge switches to runner.user: this test must run as root (as in CI)")
	}
	dir := t.TempDir()
	raw, err := os.ReadFile(edgeExample)
	must(t, err)
	var c map[string]any
	must(t, json.Unmarshal(raw, &c))
	certPEM, keyPEM := selfSignedLoopbackCert(t)
	must(t, os.WriteFile(filepath.Join(dir, "host.crt"), certPEM, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "host.key"), keyPEM, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "host-token"), []byte(hostToken), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "secrets.json"), []byte(`{"acme/OPENAI_API_KEY": "real-value"}`), 0o600))
	must(t, os.Mkdir(filepath.Join(dir, "work"), 0o755))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	apiAddr := l.Addr().String()
	l.Close()
	c["dataDir"] = filepath.Join(dir, "data")
	api := jsonObj(c, "api")
	api["listen"], api["tokenFile"] = apiAddr, filepath.Join(dir, "host-token")
	api["tls"] = map[string]any{"certFile": filepath.Join(dir, "host.crt"), "keyFile": filepath.Join(dir, "host.key")}
	jsonObj(c, "proxy")["listen"] = "127.0.0.1:0"
	jsonObj(c, "ca")["sealKeyFile"] = filepath.Join(dir, "data", "seal.key")
	jsonObj(c, "secrets")["file"] = filepath.Join(dir, "secrets.json")
	runner := jsonObj(c, "runner")
	runner["user"], runner["roots"] = "nobody", []string{filepath.Join(dir, "work")}
	adapted, _ := json.Marshal(c)
	cfgPath := filepath.Join(dir, "edge.json")
	must(t, os.WriteFile(cfgPath, adapted, 0o600))

	logs := &syncbuf.Buffer{}
	cmd := exec.Command(buildEdge(t, dir), "serve", "--config", cfgPath)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdout, cmd.Stderr = logs, logs
	must(t, cmd.Start())
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })

	client, err := hostproto.NewClient(hostproto.ClientConfig{BaseURL: "https://" + apiAddr, Token: hostToken, CAPEM: string(certPEM)})
	must(t, err)
	deadline := time.Now().Add(30 * time.Second)
	var health hostproto.Health
	for {
		if health, err = client.Health(context.Background()); err == nil {
			break
		}
		select {
		case <-done:
			t.Fatalf("edge exited at start on the example config:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("edge never answered: %v\n%s", err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !health.OK || !health.Features.SecretsProxy || !containsValue(health.Agents, "shell") || health.CA == nil {
		t.Errorf("healthz on the example config: %+v", health)
	}
	must(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("edge did not drain on SIGTERM:\n%s", logs.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("edge exited %d on SIGTERM:\n%s", code, logs.String())
	}
}

// selfSignedLoopbackCert makes a certificate for 127.0.0.1, as an operator
// would with openssl for a host without a public name.
func selfSignedLoopbackCert(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edge-1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	must(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// TestEdgeSystemdUnit checks infra/systemd/runfleet-edge.service against
// edge itself and the example config: the command line edge really takes,
// the directories the config names, a stop timeout above the drain, the
// hardening edge's runner can live with; and systemd-analyze verify finds
// nothing to say about it.
func TestEdgeSystemdUnit(t *testing.T) {
	u := parseUnit(t, edgeUnit)
	cfg, err := config.Load(edgeExample)
	if err != nil {
		t.Fatal(err)
	}

	exec0 := strings.Fields(u.one(t, "ExecStart"))
	if len(exec0) != 4 || exec0[0] != "/usr/local/bin/edge" || exec0[1] != "serve" || exec0[2] != "--config" || exec0[3] != "/etc/runfleet/edge.json" {
		t.Fatalf("ExecStart %v, want /usr/local/bin/edge serve --config /etc/runfleet/edge.json", exec0)
	}
	// edge takes exactly those arguments: with the config path elsewhere,
	// it gets as far as reading that file (exit 1 naming it), not a usage
	// error (exit 2).
	dir := t.TempDir()
	bin := buildEdge(t, dir)
	missing := filepath.Join(dir, "edge.json")
	out, err := exec.Command(bin, exec0[1], exec0[2], missing).CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), missing) {
		t.Errorf("edge %s %s <path>: exit %d, %s; want exit 1 naming the missing config", exec0[1], exec0[2], code, out)
	}
	if got := u.one(t, "ExecReload"); got != "/bin/kill -HUP $MAINPID" {
		t.Errorf("ExecReload %q: edge reloads its policy on SIGHUP", got)
	}
	if got := u.one(t, "KillMode"); got != "mixed" {
		t.Errorf("KillMode %q: SIGTERM must reach edge alone, so it drains its tasks", got)
	}

	// Directories: the data dir is the state directory, 0700; the config
	// files live in the configuration directory; every runner root is
	// writable.
	if got := "/var/lib/" + u.one(t, "StateDirectory"); got != cfg.DataDir || u.one(t, "StateDirectoryMode") != "0700" {
		t.Errorf("StateDirectory %s mode %s; the example's dataDir is %s (0700)", got, u.one(t, "StateDirectoryMode"), cfg.DataDir)
	}
	etc := "/etc/" + u.one(t, "ConfigurationDirectory") + "/"
	for _, p := range []string{exec0[3], cfg.API.TokenFile, cfg.Secrets.File, cfg.API.TLS.CertFile, cfg.API.TLS.KeyFile} {
		if !strings.HasPrefix(p, etc) {
			t.Errorf("%s is outside the configuration directory %s", p, etc)
		}
	}
	if !strings.HasPrefix(cfg.CA.SealKeyFile, cfg.DataDir+"/") || !strings.HasPrefix(cfg.Runner.WorkDir, cfg.DataDir+"/") {
		t.Errorf("seal key %s and work dir %s should live in the data dir", cfg.CA.SealKeyFile, cfg.Runner.WorkDir)
	}
	writable := strings.Fields(strings.Join(u["Service.ReadWritePaths"], " "))
	for _, root := range cfg.Runner.Roots {
		if !containsValue(writable, root) && !containsValue(writable, "-"+root) {
			t.Errorf("runner root %s is not in ReadWritePaths %v: ProtectSystem=strict leaves it read-only", root, writable)
		}
	}

	// The stop timeout outlasts the drain edge does on SIGTERM.
	stop := systemdTimespan(t, u.one(t, "TimeoutStopSec"))
	need := cfg.Runner.DrainTimeout.D() + cfg.Runner.CancelGrace.D() + edgeShutdownMargin
	if stop <= need {
		t.Errorf("TimeoutStopSec %v: edge may take %v (drainTimeout + cancelGrace + shutdown margin) before exiting", stop, need)
	}

	// Hardening: what edge's runner needs and nothing more.
	want := map[string]string{
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes",
		"Delegate": "memory pids cpu", "RestrictNamespaces": "pid mnt net ipc", "LockPersonality": "yes",
		"SystemCallArchitectures": "native", "UMask": "0077", "AmbientCapabilities": "",
		"CapabilityBoundingSet": "CAP_SETUID CAP_SETGID CAP_CHOWN CAP_FOWNER CAP_KILL CAP_DAC_OVERRIDE CAP_NET_ADMIN CAP_NET_BIND_SERVICE CAP_SYS_ADMIN",
	}
	for k, v := range want {
		if got, set := u["Service."+k]; !set || u.one(t, k) != v {
			t.Errorf("%s=%q, want %q", k, got, v)
		}
	}
	// Settings that would break edge: its setgid task dirs
	// (RestrictSUIDSGID), task runtimes that JIT (MemoryDenyWriteExecute),
	// seeing task processes to end them (ProtectProc), switching to a real
	// user (DynamicUser, PrivateUsers, User), making its tasks' control
	// groups (ProtectControlGroups).
	for _, k := range []string{"RestrictSUIDSGID", "MemoryDenyWriteExecute", "ProtectProc", "DynamicUser", "PrivateUsers", "User", "ProtectControlGroups"} {
		if v := u["Service."+k]; len(v) > 0 {
			t.Errorf("%s=%v is set: edge cannot work with it", k, v)
		}
	}

	// systemd's own reading: no unknown key, no bad value. ExecStart must
	// name an executable that exists, so the copy points at the one built.
	unit, err := os.ReadFile(edgeUnit)
	must(t, err)
	copyPath := filepath.Join(dir, "runfleet-edge.service")
	must(t, os.WriteFile(copyPath, []byte(strings.Replace(string(unit), "/usr/local/bin/edge", bin, 1)), 0o644))
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatal("systemd-analyze not found: install it with: apt-get install -y systemd")
	}
	if out, err := exec.Command("systemd-analyze", "verify", copyPath).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// TestEdgeRunsTasksWithTheUnitsCapabilitiesAlone: edge serve started as
// the unit starts it, with its capability bounding set and no new
// privileges, confines tasks' egress (CAP_NET_ADMIN) and runs a task in
// its sandbox (its init mounts with CAP_SYS_ADMIN, then drops to
// runner.user) that uses its private /tmp.
func TestEdgeRunsTasksWithTheUnitsCapabilitiesAlone(t *testing.T) {
	u := parseUnit(t, edgeUnit)
	var bounding []string
	for _, c := range strings.Fields(u.one(t, "CapabilityBoundingSet")) {
		bounding = append(bounding, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	if u.one(t, "NoNewPrivileges") != "yes" {
		t.Fatal("the unit does not set NoNewPrivileges")
	}
	e := newEdgeProc(t)
	e.wrap = []string{"/usr/bin/setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all," + strings.Join(bounding, ","), "--"}
	e.start()
	if h, err := e.client.Health(context.Background()); err != nil || !h.OK || !h.EgressConfined {
		t.Fatalf("health of edge with the unit's capabilities: %+v %v", h, err)
	}
	r := e.waitFor(e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo kept > /tmp/x && cat /tmp/x && grep CapBnd /proc/$$/status`}}).RunID, terminal)
	out, _ := e.output(r.RunID, 0)
	if r.Status != hostproto.StatusSucceeded || !strings.Contains(out, "kept") {
		t.Fatalf("a task under the unit's capabilities ended %+v: %q\n%s", r, out, e.logs.String())
	}
	if code := e.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("edge exited %d", code)
	}
}
