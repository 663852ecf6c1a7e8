package sshfront

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/netname"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/gitsshd"
)

// The task's view in these tests: one ssh key, GIT_SSH of project acme,
// reaching git.example:22, which the front's Dialer maps to a gitsshd
// server on loopback.
const (
	project  = "acme"
	keyName  = "GIT_SSH"
	hostName = "git.example"
	taskID   = "run-1"
)

var keyRef = policy.KeyRef{Project: project, Key: keyName}

// aesSealer is a Sealer over AES-GCM with a key of its own: the nonce
// before the sealed bytes.
type aesSealer struct{ aead cipher.AEAD }

func newSealer(t testing.TB) *aesSealer {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return &aesSealer{aead}
}

func (s *aesSealer) Seal(_ context.Context, plaintext, aad []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, plaintext, aad), nil
}

func (s *aesSealer) Open(_ context.Context, sealed, aad []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("sealed bytes too short")
	}
	return s.aead.Open(nil, sealed[:n], sealed[n:], aad)
}

// memSecrets is a secrets.Source over a map, "project/KEY" to value.
type memSecrets struct {
	mu     sync.Mutex
	values map[string]string
	reads  atomic.Int64
}

func (m *memSecrets) Value(_ context.Context, project, key string) (secrets.Value, error) {
	m.reads.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.values[secrets.ID(project, key)]
	if !ok {
		return secrets.Value{}, fmt.Errorf("memory: %s: %w", secrets.ID(project, key), secrets.ErrNotFound)
	}
	return secrets.NewValue(v), nil
}

func (m *memSecrets) set(project, key, value string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.values[secrets.ID(project, key)] = value
}

// mapDialer dials the addresses it maps (the authority, "git.example:22")
// to where they really are; any other address is refused, as the guard
// refuses what it does not know.
type mapDialer struct {
	mu    sync.Mutex
	to    map[string]string
	dials atomic.Int64
	d     net.Dialer
}

func (m *mapDialer) set(address, target string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.to[address] = target
}

func (m *mapDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	m.mu.Lock()
	target, ok := m.to[address]
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("test dialer: %s is not mapped", address)
	}
	m.dials.Add(1)
	return m.d.DialContext(ctx, network, target)
}

// recorder collects audit lines.
type recorder struct {
	mu      sync.Mutex
	entries []audit.Entry
	// count is every line recorded; with discard set, lines are counted
	// and not kept (a benchmark's, whose memory is the front's alone).
	count   atomic.Int64
	discard atomic.Bool
}

func (r *recorder) Record(e audit.Entry) {
	r.count.Add(1)
	if r.discard.Load() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = append(r.entries, e)
}

func (r *recorder) all() []audit.Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.entries)
}

// await waits for an audit line that match accepts and returns it. Lines
// are recorded once a command has ended on edge's side, which may be a
// moment after the client saw it end.
func (r *recorder) await(t testing.TB, what string, match func(audit.Entry) bool) audit.Entry {
	t.Helper()
	var found audit.Entry
	ok := await.Within(20*time.Second, func() bool {
		for _, e := range r.all() {
			if match(e) {
				found = e
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no audit line %s; the lines:\n%s", what, r.dump())
	}
	return found
}

func (r *recorder) dump() string {
	var b strings.Builder
	for _, e := range r.all() {
		j, _ := json.Marshal(e)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
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

// options shape an env.
type options struct {
	// allow is the key's ssh.allow; nil means upload-pack and receive-pack.
	allow []string
	// repositories is the key's ssh.repositories.
	repositories []string
	// knownHosts is the key's ssh.knownHosts; nil means the upstream's
	// own key under git.example.
	knownHosts []string
	// config changes the front's Config before New.
	config func(*Config)
	// secret is the key's value; nil means the client key's PEM.
	secret func(pem []byte) string
}

// env is one test's world: a real sshd upstream, the front serving a
// loopback listener as the proxy hands it connections, and what the front
// records.
type env struct {
	t         testing.TB
	up        *gitsshd.Server
	front     *Front
	ln        net.Listener
	audit     *recorder
	logs      *syncBuffer
	secrets   *memSecrets
	dialer    *mapDialer
	clientPEM []byte // the real key: in the secrets source only

	// granted is the task's keys under the policy in force.
	grantedMu sync.Mutex
	granted   []policy.Granted

	knownHostsFile string // the task's known_hosts: the front's key as git.example

	connsMu sync.Mutex
	conns   map[net.Conn]struct{}
	serving sync.WaitGroup
	served  atomic.Int64 // Serve calls that returned
}

func newEnv(t testing.TB, o options) *env {
	t.Helper()
	signer, pemBytes := gitsshd.NewClientKey(t)
	up := gitsshd.Start(t, gitsshd.Options{AuthorizedKeys: []ssh.PublicKey{signer.PublicKey()}})
	e := &env{
		t:         t,
		up:        up,
		audit:     &recorder{},
		logs:      &syncBuffer{},
		secrets:   &memSecrets{values: map[string]string{}},
		dialer:    &mapDialer{to: map[string]string{hostName + ":22": up.Addr().String()}},
		clientPEM: pemBytes,
		conns:     map[net.Conn]struct{}{},
	}
	secret := string(pemBytes)
	if o.secret != nil {
		secret = o.secret(pemBytes)
	}
	e.secrets.set(project, keyName, secret)
	e.setPolicy(o)

	hostKey, err := LoadHostKey(context.Background(), t.TempDir(), newSealer(t), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		HostKey:  hostKey,
		Secrets:  e.secrets,
		Upstream: e.dialer,
		Audit:    e.audit,
		Logger:   slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if o.config != nil {
		o.config(&cfg)
	}
	if e.front, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	e.knownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
	kh := KnownHosts(e.front.HostKey(), []policy.Domain{{Name: hostName, Port: 22}})
	if err := os.WriteFile(e.knownHostsFile, kh, 0o644); err != nil {
		t.Fatal(err)
	}

	if e.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := e.ln.Accept()
			if err != nil {
				return
			}
			e.connsMu.Lock()
			e.conns[c] = struct{}{}
			e.serving.Add(1)
			e.connsMu.Unlock()
			go func() {
				defer e.serving.Done()
				e.front.Serve(c, e.session())
				e.served.Add(1)
				e.connsMu.Lock()
				delete(e.conns, c)
				e.connsMu.Unlock()
			}()
		}
	}()
	// Registered after gitsshd.Start's, so it runs before the server
	// closes: every Serve must return once its connection is closed, and
	// every upstream connection must end with the task's.
	t.Cleanup(func() {
		e.ln.Close()
		<-accepting
		e.connsMu.Lock()
		for c := range e.conns {
			c.Close()
		}
		e.connsMu.Unlock()
		await.Group(t, "every Serve to return once its connection is closed", &e.serving)
		// Every upstream connection ends with the task's.
		up.WaitIdle(t)
		if t.Failed() {
			t.Logf("the front's log:\n%s\naudit:\n%s", e.logs.String(), e.audit.dump())
		}
	})
	return e
}

// setPolicy compiles a policy of the one ssh key as o shapes it and
// grants it to the task, as a reload would.
func (e *env) setPolicy(o options) {
	e.t.Helper()
	allow := o.allow
	if allow == nil {
		allow = []string{policy.GitUploadPack, policy.GitReceivePack}
	}
	kh := o.knownHosts
	if kh == nil {
		kh = []string{e.up.KnownHostsLine(hostName, 22)}
	}
	pol, err := policy.Compile(config.Policy{Projects: map[string]config.ProjectPolicy{
		project: {Keys: map[string]config.KeyPolicy{
			keyName: {
				Kind:    policy.KindSSH,
				Domains: []string{hostName + ":22"},
				SSH:     &config.SSHKey{KnownHosts: kh, Allow: allow, Repositories: o.repositories},
			},
		}},
	}})
	if err != nil {
		e.t.Fatal(err)
	}
	granted, refused := pol.Grant([]runspec.Declared{{ProjectID: project, Key: keyName, Domains: []netname.Domain{{Name: hostName, Port: 22}}}})
	if len(refused) > 0 || len(granted) != 1 {
		e.t.Fatalf("grant: %v, refused %v", granted, refused)
	}
	e.setGranted(granted)
}

func (e *env) setGranted(g []policy.Granted) {
	e.grantedMu.Lock()
	defer e.grantedMu.Unlock()
	e.granted = g
}

func (e *env) session() Session {
	return Session{
		Task:      taskID,
		Authority: policy.Authority{Name: hostName, Port: 22},
		Granted: func() []policy.Granted {
			e.grantedMu.Lock()
			defer e.grantedMu.Unlock()
			return slices.Clone(e.granted)
		},
		Redact: func(s string) string { return s },
	}
}

func (e *env) port() string { return strconv.Itoa(e.ln.Addr().(*net.TCPAddr).Port) }

// sshArgs is an OpenSSH client as the task's: it reaches the front, trusts
// exactly the front's key as git.example (the known_hosts edge gives the
// task), and has no key, agent or configuration of its own. The
// destination and command are the caller's to append.
func (e *env) sshArgs() []string {
	return []string{
		"ssh", "-F", "/dev/null",
		"-p", e.port(),
		"-o", "Hostname=127.0.0.1",
		"-o", "HostKeyAlias=" + hostName,
		"-o", "UserKnownHostsFile=" + e.knownHostsFile,
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "UpdateHostKeys=no",
		"-o", "IdentitiesOnly=yes",
		"-o", "IdentityFile=/dev/null",
		"-o", "IdentityAgent=none",
		"-o", "BatchMode=yes",
	}
}

// gitSSHEnv is GIT_SSH_COMMAND for git to reach the front as git.example.
func (e *env) gitSSHEnv() string {
	args := e.sshArgs()
	for i, a := range args {
		args[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return "GIT_SSH_COMMAND=" + strings.Join(args, " ")
}

// gitEnv is a git client's environment with nothing of the host's
// configuration, reaching git.example through the front.
func (e *env) gitEnv() []string { return gitsshd.GitEnv(e.t, e.gitSSHEnv()) }

// url is the repository's URL as the task's git names it.
func url(repo string) string { return "git@" + hostName + ":" + repo }

// result is a finished command.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
}

// run runs argv to its end.
func run(t testing.TB, dir string, env []string, argv ...string) result {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	var o, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &errb
	err := cmd.Run()
	r := result{stdout: o.String(), stderr: errb.String()}
	if err != nil {
		exit, ok := errors.AsType[*exec.ExitError](err)
		if !ok {
			t.Fatalf("%s: %v", strings.Join(argv, " "), err)
		}
		r.code = exit.ExitCode()
	}
	return r
}

// mustRun runs argv, which must succeed, returning its stdout.
func mustRun(t testing.TB, dir string, env []string, argv ...string) string {
	t.Helper()
	r := run(t, dir, env, argv...)
	if r.code != 0 {
		t.Fatalf("%s: %s", strings.Join(argv, " "), r)
	}
	return r.stdout
}

// dial is a task's client speaking SSH itself (x/crypto), trusting the
// front's key, authenticating with none.
func (e *env) dial() *ssh.Client {
	e.t.Helper()
	c, err := e.dialE()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

func (e *env) dialE() (*ssh.Client, error) {
	raw, err := net.Dial("tcp", e.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	sc, chans, reqs, err := ssh.NewClientConn(raw, hostName+":22", &ssh.ClientConfig{
		User:            "git",
		HostKeyCallback: ssh.FixedHostKey(e.front.HostKey()),
		Timeout:         30 * time.Second,
	})
	if err != nil {
		raw.Close()
		return nil, err
	}
	return ssh.NewClient(sc, chans, reqs), nil
}

// exec runs line on a new session of c, with stdin, and returns what came
// back: the exit status is -1 when none came.
func execOn(t testing.TB, c *ssh.Client, line string, stdin string) result {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatalf("a session for %q: %v", line, err)
	}
	defer s.Close()
	var o, errb bytes.Buffer
	s.Stdout, s.Stderr = &o, &errb
	s.Stdin = strings.NewReader(stdin)
	err = s.Run(line)
	r := result{stdout: o.String(), stderr: errb.String()}
	if err != nil {
		var exit *ssh.ExitError
		var missing *ssh.ExitMissingError
		switch {
		case errors.As(err, &exit):
			r.code = exit.ExitStatus()
		case errors.As(err, &missing):
			r.code = -1
		default:
			t.Fatalf("running %q: %v", line, err)
		}
	}
	return r
}

// flush is git's pkt-line flush: to git-upload-pack, "I want nothing",
// after which it exits 0.
const flush = "0000"

// entryFor matches an audit line of the command on the repository.
func entryFor(action audit.Action, command, repository string) func(audit.Entry) bool {
	return func(e audit.Entry) bool {
		return e.Action == action && e.SSH != nil && e.SSH.Command == command && e.SSH.Repository == repository
	}
}

// entryRequest matches a refusal of a request that is not a command.
func entryRequest(request string) func(audit.Entry) bool {
	return func(e audit.Entry) bool {
		return e.Action == audit.Blocked && e.SSH != nil && e.SSH.Request == request
	}
}

func secretsValue(s string) secrets.Value { return secrets.NewValue(s) }
