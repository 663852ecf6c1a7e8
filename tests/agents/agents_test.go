//go:build e2eagents

// Package agents runs the agents users run, Claude Code and OpenAI Codex as
// npm installs them, as edge tasks with infra/edge.example.json's agent
// entries and policy as written, through the secrets proxy, against fakes
// of their vendors' APIs on loopback. `make e2e-agents` installs the CLIs
// (E2E_AGENTS_PREFIX) and runs it; `make test` does not (it needs the npm
// registry).
package agents

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

const (
	hostToken = "e2e-agents-host-token-4b9e0c7d1a"
	// project is the example policy's project.
	project = "acme"
	// taskUID is nobody, the task user (runner.user) these tests run with.
	taskUID = 65534
	// runTimeout bounds one agent's run: a start of the CLI, a model call
	// or two on loopback.
	runTimeout = 3 * time.Minute
	// examplePrefix is where the example's agent entries expect the CLIs
	// (`npm install -g --prefix /usr/local`); the test puts
	// E2E_AGENTS_PREFIX in its place and nothing else of the entries.
	examplePrefix = "/usr/local/bin/"
	exampleConfig = "../../infra/edge.example.json"
)

// agentCase is one agent of the example config and the vendor API it calls.
type agentCase struct {
	agent string
	// key is the policy key the agent reads its API key from.
	key string
	// domain is the vendor API's name; answer is what its fake answers.
	domain, answer string
	// stateDir is what the CLI keeps under its HOME.
	stateDir string
	// credential and route make the vendor's fake.
	credential func(*http.Request) string
	route      func(string) func(http.ResponseWriter, *http.Request, []byte)
}

// TestRealAgentsThroughTheSecretsProxy: edge serve, built from this tree, on
// the example config (its agents and policy as written; proxy.egress strict,
// so a call to any domain the policy does not name is refused and audited),
// runs each agent with its key declared. Each run succeeds and prints the
// fake model's answer; the fake received the key's real value (the proxy
// substituted the placeholder) on every request that bore a key; the task's
// environment holds the placeholder, and neither it nor the run's output or
// files hold the real value; the audit log shows the agent called its
// vendor's API and nothing else. Each CLI's home is the run's own (edge sets
// HOME), where it keeps its state.
func TestRealAgentsThroughTheSecretsProxy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("edge runs tasks as nobody: this test must run as root")
	}
	prefix := os.Getenv("E2E_AGENTS_PREFIX")
	if prefix == "" {
		t.Fatal("E2E_AGENTS_PREFIX is not set: run `make e2e-agents`, which installs the agents' CLIs there")
	}
	cases := []agentCase{
		{agent: "claude", key: "ANTHROPIC_API_KEY", domain: "api.anthropic.com", answer: "fake-claude says: the answer is 42",
			stateDir: ".claude", credential: anthropicCredential, route: anthropicMessages},
		{agent: "codex", key: "CODEX_API_KEY", domain: "api.openai.com", answer: "fake-codex says: the answer is 42",
			stateDir: ".codex", credential: openAICredential, route: openAIResponses},
	}
	e := startEdge(t, prefix, cases)
	for _, c := range cases {
		t.Run(c.agent, func(t *testing.T) { e.runAgent(t, c) })
	}
}

// edge is `edge serve` as a process, with the fakes of the vendors' APIs.
type edge struct {
	workDir, auditPath string
	example            map[string]any
	secrets            map[string]string // key -> real value
	fakes              map[string]*fakeAPI
	client             *hostproto.Client
	logs               *syncbuf.Buffer
}

func startEdge(t *testing.T, prefix string, cases []agentCase) *edge {
	dir := t.TempDir()
	// The tasks' dirs are where a host keeps them, outside /tmp: Codex
	// declines to set up its helpers (apply_patch) under a temporary dir.
	workDir, err := os.MkdirTemp("/var/lib", "runfleet-e2e-agents-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(workDir) })
	must(t, os.Chmod(workDir, 0o755))
	e := &edge{workDir: workDir, secrets: map[string]string{}, fakes: map[string]*fakeAPI{},
		logs: &syncbuf.Buffer{}, auditPath: filepath.Join(dir, "data", "logs", "proxy-audit.jsonl")}
	raw, err := os.ReadFile(exampleConfig)
	must(t, err)
	must(t, json.Unmarshal(raw, &e.example))

	ca := newFakeCA(t)
	must(t, os.WriteFile(filepath.Join(dir, "vendor-ca.pem"), ca.pem, 0o644))
	pins := map[string]any{}
	secretsFile := map[string]string{}
	for _, c := range cases {
		e.secrets[c.key] = "real-" + strings.ToLower(c.key) + "-" + randomHex(t, 20)
		secretsFile[project+"/"+c.key] = e.secrets[c.key]
		ip := randomLoopback(t)
		e.fakes[c.agent] = startFakeAPI(t, ca, c.domain, ip, e.secrets[c.key], c.credential, c.route(c.answer))
		pins[c.domain] = ip
		checkReachable(t, prefix, e.agentArgv(t, c.agent, prefix)[0], workDir)
	}
	b, _ := json.Marshal(secretsFile)
	must(t, os.WriteFile(filepath.Join(dir, "secrets.json"), b, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "host-token"), []byte(hostToken), 0o600))

	// The example's host-specific settings move into dir (the host API
	// on loopback, plain HTTP: no Fleet calls it here); its agents, policy,
	// CA lifetimes and runner limits stay as written.
	var cfg map[string]any
	must(t, json.Unmarshal(raw, &cfg))
	apiAddr := freeAddr(t)
	cfg["dataDir"] = filepath.Join(dir, "data")
	cfg["api"] = map[string]any{"listen": apiAddr, "tokenFile": filepath.Join(dir, "host-token")}
	cfg["proxy"] = map[string]any{"listen": "127.0.0.1:0", "egress": "strict",
		"upstream": map[string]any{"resolver": "uplink", "resolve": pins, "allowPrivate": []string{"127.0.0.0/8"},
			"extraRootsFile": filepath.Join(dir, "vendor-ca.pem")}}
	obj(t, cfg, "ca")["sealKeyFile"] = filepath.Join(dir, "data", "seal.key")
	obj(t, cfg, "secrets")["file"] = filepath.Join(dir, "secrets.json")
	runner := obj(t, cfg, "runner")
	runner["user"], runner["roots"], runner["workDir"] = "nobody", []string{workDir}, workDir
	agents := obj(t, cfg, "agents")
	for _, c := range cases {
		obj(t, agents, c.agent)["argv"] = e.agentArgv(t, c.agent, prefix)
	}
	b, _ = json.MarshalIndent(cfg, "", "  ")
	cfgPath := filepath.Join(dir, "edge.json")
	must(t, os.WriteFile(cfgPath, b, 0o600))

	bin := filepath.Join(dir, "edge")
	build := exec.Command("go", "build", "-o", bin, "./edge")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building edge: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "serve", "--config", cfgPath)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdout, cmd.Stderr = e.logs, e.logs
	must(t, cmd.Start())
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		// SIGTERM: an edge that stops cleanly removes its egress confinement.
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-done
		}
	})
	e.client, err = hostproto.NewClient(hostproto.ClientConfig{BaseURL: "http://" + apiAddr, Token: hostToken})
	must(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		h, err := e.client.Health(context.Background())
		if err == nil && h.OK && h.Features.SecretsProxy && h.EgressConfined {
			break
		}
		select {
		case <-done:
			t.Fatalf("edge exited at start:\n%s", e.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("edge never answered healthy (%+v, %v):\n%s", h, err, e.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return e
}

// agentArgv is the example's argv for agent with the CLI under prefix
// rather than /usr/local.
func (e *edge) agentArgv(t *testing.T, agent, prefix string) []string {
	t.Helper()
	raw, _ := obj(t, obj(t, e.example, "agents"), agent)["argv"].([]any)
	var argv []string
	for _, a := range raw {
		s, _ := a.(string)
		argv = append(argv, s)
	}
	if len(argv) == 0 || !strings.HasPrefix(argv[0], examplePrefix) || !slices.Contains(argv, "{prompt}") {
		t.Fatalf("the example's %s agent is %q: want the CLI under %s and a {prompt} argument", agent, argv, examplePrefix)
	}
	argv[0] = filepath.Join(prefix, "bin", strings.TrimPrefix(argv[0], examplePrefix))
	return argv
}

func (e *edge) runAgent(t *testing.T, c agentCase) {
	fake := e.fakes[c.agent]
	keyPolicy := obj(t, obj(t, obj(t, obj(t, obj(t, e.example, "policy"), "projects"), project), "keys"), c.key)
	var domains []string
	for _, d := range keyPolicy["domains"].([]any) {
		domains = append(domains, d.(string))
	}
	if !slices.Contains(domains, c.domain) {
		t.Fatalf("the example's policy gives %s the domains %v, not %s", c.key, domains, c.domain)
	}
	tag := "e2e-" + randomHex(t, 8)
	auditFrom := len(e.auditLines(t))
	run, err := e.client.Start(context.Background(), hostproto.StartRequest{
		ClientToken: tag,
		Request: runspec.Request{
			Agent:   c.agent,
			Prompt:  "Answer with one short sentence. (" + tag + ")",
			Secrets: []runspec.Secret{{ProjectID: project, Key: c.key, Domains: domains}},
		},
	})
	must(t, err)
	if run.Status == hostproto.StatusFailed {
		t.Fatalf("the run was refused: %s", describe(run))
	}

	// The fake holds its first answer: meanwhile the agent's processes
	// are alive and their environment is read.
	deadline := time.Now().Add(runTimeout)
	for waiting := true; waiting; {
		select {
		case <-fake.First():
			waiting = false
		case <-time.After(50 * time.Millisecond):
			if r, err := e.client.Get(context.Background(), run.RunID); err == nil && hostproto.TerminalStatus(r.Status) {
				t.Fatalf("the run ended %s before calling %s; its output:\n%s\nthe audit log since it started:%s", describe(r), c.domain, e.output(t, run.RunID), auditText(e.auditLines(t)[auditFrom:]))
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s was never called; the run's output:\n%s", c.domain, e.output(t, run.RunID))
			}
		}
	}
	home := filepath.Join(e.workDir, run.RunID, "home")
	e.checkTaskEnv(t, c, tag, home)
	fake.Release()

	for {
		r, err := e.client.Get(context.Background(), run.RunID)
		must(t, err)
		if hostproto.TerminalStatus(r.Status) {
			run = r
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run did not end within %v: %s; its output:\n%s", runTimeout, describe(r), e.output(t, run.RunID))
		}
		time.Sleep(50 * time.Millisecond)
	}
	out := e.output(t, run.RunID)
	t.Logf("%s's output:\n%s", c.agent, out)
	if run.Status != hostproto.StatusSucceeded || !strings.Contains(out, c.answer) {
		t.Fatalf("the run ended %s; want succeeded with the fake model's answer %q in its output; the audit log since it started:%s",
			describe(run), c.answer, auditText(e.auditLines(t)[auditFrom:]))
	}

	// Every request the fake answered has its audit line, every audit line
	// of the run its request: an upgraded request's (a WebSocket's) line
	// is written once the connection closed, which may follow the run's end.
	reqs, lines := e.settle(t, fake, auditFrom)
	t.Logf("%s received: %v", c.domain, reqs)
	t.Logf("the audit lines of %s's run: %s", c.agent, auditText(lines))
	authorized, keyless := 0, 0
	for _, r := range reqs {
		switch {
		case r.Authorized:
			authorized++
		case r.Keyless:
			keyless++ // harmless: nothing to substitute, nothing to leak
		default:
			t.Errorf("%s received a request whose key is not the real value: %v", c.domain, r)
		}
	}
	// With egress strict, a call anywhere else would have been refused
	// (denied) and audited: every line since the run started is this
	// task's, names the vendor's API, and is a substitution (a request
	// with the key) or a forward (one without).
	substituted, forwarded := 0, 0
	for _, l := range lines {
		switch {
		case l.Task != run.RunID:
			t.Errorf("an audit line of another task (%q) during the run: %+v", l.Task, l)
		case strings.TrimSuffix(l.Host, ":443") != c.domain:
			t.Errorf("%s called %s (%s %s): only %s was expected", c.agent, l.Host, l.Action, l.Reason, c.domain)
		case l.Action == "substituted":
			substituted++
		case l.Action == "forwarded":
			forwarded++
		default:
			t.Errorf("the proxy %s a request of %s: %+v", l.Action, c.agent, l)
		}
	}
	if substituted != authorized || forwarded != keyless || authorized == 0 {
		t.Errorf("the audit log has %d substitutions and %d forwards; the fake got %d requests with the real value and %d without a key",
			substituted, forwarded, authorized, keyless)
	}

	// The task saw the placeholder alone: not in its output, nor in any
	// file it left (its home with the CLI's state, its work dir, its tmp).
	if strings.Contains(out, e.secrets[c.key]) {
		t.Error("the real value is in the run's output")
	}
	files := 0
	filepath.WalkDir(filepath.Join(e.workDir, run.RunID), func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		files++
		if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(e.secrets[c.key])) {
			t.Errorf("the real value is in the task's file %s", path)
		}
		return nil
	})
	if files == 0 {
		t.Errorf("the run's dir holds no file: the search for the real value saw nothing")
	}
	if _, err := os.Stat(filepath.Join(home, c.stateDir)); err != nil {
		t.Errorf("%s kept no state in the run's HOME (%s): %v", c.agent, home, err)
	}
}

// checkTaskEnv reads the environment of the agent's processes (those whose
// command line holds tag): the key's variable holds a placeholder of the
// example's shape, never the real value; HOME is the run's own home.
func (e *edge) checkTaskEnv(t *testing.T, c agentCase, tag, home string) {
	t.Helper()
	shape := obj(t, obj(t, obj(t, obj(t, obj(t, obj(t, e.example, "policy"), "projects"), project), "keys"), c.key), "placeholder")
	prefix, _ := shape["prefix"].(string)
	length, _ := shape["length"].(float64)
	var placeholder string
	procs := 0
	entries, err := os.ReadDir("/proc")
	must(t, err)
	for _, ent := range entries {
		if _, err := strconv.Atoi(ent.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(tag)) {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "environ"))
		if err != nil {
			continue // it exited meanwhile
		}
		procs++
		if bytes.Contains(environ, []byte(e.secrets[c.key])) {
			t.Errorf("the real value is in the environment of the task's process %s", ent.Name())
		}
		env := map[string]string{}
		for _, kv := range strings.Split(string(environ), "\x00") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
		if v := env[c.key]; v != "" {
			if !strings.HasPrefix(v, prefix) || len(v) != int(length) {
				t.Errorf("%s in the task's env is not a placeholder of the example's shape (prefix %q, length %d)", c.key, prefix, int(length))
			}
			placeholder = v
		}
		if env["HOME"] != home {
			t.Errorf("the task's HOME is %q, want the run's home %s", env["HOME"], home)
		}
	}
	if procs == 0 || placeholder == "" {
		t.Fatalf("found %d processes of the task with %s in their environment", procs, c.key)
	}
}

// describe is a run's state as a person reads it.
func describe(r hostproto.Run) string {
	s := r.RunID + " " + r.Status
	if r.Reason != "" {
		s += " (" + r.Reason + ")"
	}
	if r.ExitCode != nil {
		s += fmt.Sprintf(", exit code %d", *r.ExitCode)
	}
	return s
}

type auditLine struct {
	Task, Action, Reason, Host, Method, Path string
	Status                                   int
}

// auditLines is the proxy's audit log, line by line.
func (e *edge) auditLines(t *testing.T) []auditLine {
	t.Helper()
	b, err := os.ReadFile(e.auditPath)
	if os.IsNotExist(err) {
		return nil
	}
	must(t, err)
	var lines []auditLine
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var a auditLine
		if len(l) > 0 {
			must(t, json.Unmarshal(l, &a))
			lines = append(lines, a)
		}
	}
	return lines
}

// settle waits until the fake has answered as many requests as the audit
// log has lines since from, at least one: both are written as a request
// ends, a WebSocket's once it closed.
func (e *edge) settle(t *testing.T, fake *fakeAPI, from int) ([]fakeRequest, []auditLine) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		reqs, lines := fake.Requests(), e.auditLines(t)[from:]
		if len(reqs) > 0 && len(reqs) == len(lines) {
			return reqs, lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s answered %d requests, the audit log has %d lines for the run: %v%s", fake.name, len(reqs), len(lines), reqs, auditText(lines))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func auditText(lines []auditLine) string {
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "\n  %s %s %s %s %d %s", l.Action, l.Host, l.Method, l.Path, l.Status, l.Reason)
	}
	return b.String()
}

// output is the run's output so far.
func (e *edge) output(t *testing.T, runID string) string {
	t.Helper()
	var b strings.Builder
	after := int64(0)
	for {
		p, err := e.client.Events(context.Background(), runID, after, 1000)
		must(t, err)
		for _, ev := range p.Events {
			var s string
			if ev.Type == hostproto.EventOutput && json.Unmarshal(ev.Data, &s) == nil {
				b.WriteString(s)
			}
		}
		after = *p.NextCursor
		if !p.HasMore {
			return b.String()
		}
	}
}

// checkReachable runs the CLI as the task user, with the task's PATH:
// an install the task user cannot reach (under /root, say, or with a
// umask of 077) fails here, saying so, rather than as an obscure run
// failure. Tasks get private /tmp and /var/tmp, so an install there is not
// reachable either, whatever its modes.
func checkReachable(t *testing.T, prefix, bin, scratch string) {
	t.Helper()
	for _, private := range []string{"/tmp/", "/var/tmp/", "/dev/shm/"} {
		if strings.HasPrefix(filepath.Clean(prefix)+"/", private) {
			t.Fatalf("E2E_AGENTS_PREFIX %s is under %s: tasks get a private one and cannot see it", prefix, private)
		}
	}
	home, err := os.MkdirTemp(scratch, "home-")
	must(t, err)
	defer os.RemoveAll(home)
	must(t, os.Chown(home, taskUID, taskUID))
	cmd := exec.Command(bin, "--version")
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + home}
	cmd.Dir = home
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: taskUID, Gid: taskUID}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version as the task user (uid %d): %v\n%s\nThe install must be readable and executable by it: "+
			"every directory above E2E_AGENTS_PREFIX traversable (not under /root), files a+rX", bin, taskUID, err, out)
	}
	t.Logf("%s --version: %s", bin, strings.TrimSpace(string(out)))
}

func obj(t *testing.T, m map[string]any, key string) map[string]any {
	t.Helper()
	o, ok := m[key].(map[string]any)
	if !ok {
		t.Fatalf("the example config has no object %q", key)
	}
	return o
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	_, err := rand.Read(b)
	must(t, err)
	return hex.EncodeToString(b)
}

// randomLoopback is an address in 127.0.0.0/8 nothing else uses, so a fake
// can take port 443 on it.
func randomLoopback(t *testing.T) string {
	b := make([]byte, 3)
	_, err := rand.Read(b)
	must(t, err)
	return fmt.Sprintf("127.%d.%d.%d", 1+b[0]%250, b[1], 1+b[2]%250)
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().String()
}
