package cli

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/aws/aws-lambda-go/events"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleetapp"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// The CLI's tests run it in-process (Main with buffers and an interrupt
// channel) against a real Fleet: fleetapp on bbolt behind its HTTP
// handler on a loopback server, as tests/stack_test.go's newStack builds
// it, on a fake clock shared with fake hosts (tests/kit/fakehost).

const (
	adminToken  = "admin-token-for-cli-tests-0123456789"
	hostCredRef = "fleet-hosts"
)

// fleet is one Fleet for a test, and every token it minted: no output of
// any CLI run of the test may hold one (checked at the end).
type fleet struct {
	t      *testing.T
	app    *fleetapp.App
	srv    *httptest.Server
	clk    *clock.Fake
	parked chan struct{}

	mu      sync.Mutex
	tokens  []string
	outputs []*result
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	return newFleetStreamingAs(t, "")
}

// newFleetStreamingAs is a Fleet whose runs' links.stream name it by
// streamHost (e.g. localhost for 127.0.0.1): the stream on an origin of
// its own, as the stream function's URL is in AWS. Empty: its address.
func newFleetStreamingAs(t *testing.T, streamHost string) *fleet {
	t.Helper()
	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials.json")
	b, _ := json.Marshal(map[string]string{hostCredRef: "host-token"})
	if err := os.WriteFile(creds, b, 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		config.EnvAdminToken:  adminToken,
		config.EnvCredentials: "file:" + creds,
		config.EnvStore:       "bolt:" + filepath.Join(dir, "fleet.db"),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if streamHost != "" {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		env[config.EnvStreamURL] = "http://" + net.JoinHostPort(streamHost, port)
	}
	cfg, err := config.FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, clk: clock.NewFake(time.Now().UTC().Truncate(time.Second)), parked: make(chan struct{})}
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	app, err := fleetapp.New(context.Background(), cfg, fleetapp.Deps{
		Logger: log, Clock: f.clk,
		OpenBolt: func(path string, clk clock.Clock) (fleetapp.StoreCloser, error) {
			return boltstore.Open(path, boltstore.WithClock(clk))
		},
		StreamParked: func(ctx context.Context) {
			select {
			case f.parked <- struct{}{}:
			case <-ctx.Done():
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Close() })
	handler, err := app.HTTPHandler(log, f.clk)
	if err != nil {
		t.Fatal(err)
	}
	f.app = app
	f.srv = httptest.NewUnstartedServer(handler)
	f.srv.Listener.Close()
	f.srv.Listener = ln
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	f.secret(adminToken)
	t.Cleanup(f.checkNoTokenPrinted)
	return f
}

// secret registers a value no CLI output may hold.
func (f *fleet) secret(v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens = append(f.tokens, v)
}

// checkNoTokenPrinted scans every stdout and stderr of the test's CLI
// runs for every token the test used.
func (f *fleet) checkNoTokenPrinted() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.outputs {
		for _, tok := range f.tokens {
			for name, text := range map[string]string{"stdout": r.stdout.String(), "stderr": r.stderr.String()} {
				if strings.Contains(text, tok) {
					f.t.Errorf("runfleet %s printed a token on %s:\n%s", strings.Join(r.args, " "), name, text)
				}
			}
		}
	}
}

// api sends a request to Fleet as token and decodes the answer.
func (f *fleet) api(method, path, token, body string, want int) map[string]any {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, f.srv.URL+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		f.t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, raw, want)
	}
	var m map[string]any
	json.Unmarshal(raw, &m)
	return m
}

// addHost starts a fake host on Fleet's clock, registers and probes it.
func (f *fleet) addHost(id string, cfg fakehost.Config) *fakehost.Host {
	f.t.Helper()
	cfg.Clock = f.clk
	h := fakehost.New(cfg)
	f.t.Cleanup(h.Close)
	b, _ := json.Marshal(map[string]any{"id": id, "baseUrl": h.URL, "credentialRef": hostCredRef})
	f.api("POST", "/fleet/hosts", adminToken, string(b), http.StatusCreated)
	f.api("POST", "/fleet/hosts/"+id+"/probe", adminToken, "", http.StatusOK)
	return h
}

// sweep runs the scheduled sweep once, as its Lambda would: it mirrors
// the runs' events and egress ledgers.
func (f *fleet) sweep() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := f.app.Jobs.Sweep(ctx, events.EventBridgeEvent{DetailType: "Scheduled Event", Source: "aws.scheduler"}); err != nil {
		f.t.Fatalf("sweep: %v", err)
	}
}

// mint creates a caller who may use every host and project.
func (f *fleet) mint(owner string) string {
	f.t.Helper()
	a := f.api("POST", "/fleet/callers", adminToken, `{"ownerId":"`+owner+`","allowedHosts":"*","allowedProjects":"*"}`, http.StatusCreated)
	tok, _ := a["token"].(string)
	f.secret(tok)
	return tok
}

// pump lets each parked stream session poll again (one fake second a
// park) until stop is closed: the stream is driven by Fleet's clock.
func (f *fleet) pump(stop <-chan struct{}) {
	go func() {
		for {
			select {
			case <-f.parked:
				f.clk.Advance(time.Second)
			case <-stop:
				return
			}
		}
	}()
}

// cli is a runfleet for a test: its environment and home directory.
type cli struct {
	f    *fleet
	env  map[string]string
	home string
	tty  bool
}

// newCLI is a runfleet with a home of its own and env as its environment.
func (f *fleet) newCLI(env map[string]string) *cli {
	if env == nil {
		env = map[string]string{}
	}
	return &cli{f: f, env: env, home: f.t.TempDir()}
}

// asCaller is a runfleet with RUNFLEET_API and RUNFLEET_TOKEN set.
func (f *fleet) asCaller(token string) *cli {
	return f.newCLI(map[string]string{EnvAPI: f.srv.URL, EnvToken: token})
}

// result is one run of the CLI.
type result struct {
	args           []string
	code           int
	stdout, stderr *syncbuf.Buffer
	stdin          io.Reader
	interrupt      chan os.Signal
	done           chan struct{}
}

// start runs runfleet args in a goroutine; wait for it with r.wait.
func (c *cli) start(stdin string, args ...string) *result {
	r := &result{args: args, stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, interrupt: make(chan os.Signal, 2), done: make(chan struct{})}
	c.f.mu.Lock()
	c.f.outputs = append(c.f.outputs, r)
	c.f.mu.Unlock()
	now := time.Now
	if c.f.clk != nil {
		now = c.f.clk.Now
	}
	env := Env{
		Getenv: func(k string) string { return c.env[k] },
		Stdin:  strings.NewReader(stdin), Stdout: r.stdout, Stderr: r.stderr,
		StdoutTTY: c.tty, StderrTTY: c.tty,
		Home:      c.home,
		Interrupt: r.interrupt,
		Now:       now,
		// No real waits: a reconnection is at once.
		Wait: func(ctx context.Context, _ time.Duration) error { return ctx.Err() },
	}
	go func() {
		defer close(r.done)
		r.code = Main(context.Background(), args, env)
	}()
	return r
}

func (r *result) wait(t *testing.T) *result {
	t.Helper()
	await.Recv(t, "runfleet "+strings.Join(r.args, " ")+" to exit", r.done)
	t.Logf("runfleet %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
	return r
}

// run runs runfleet args to its end.
func (c *cli) run(t *testing.T, args ...string) *result {
	t.Helper()
	return c.start("", args...).wait(t)
}

// want fails the test unless the exit code is code.
func (r *result) want(t *testing.T, code int) *result {
	t.Helper()
	if r.code != code {
		t.Fatalf("runfleet %s exited %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, code, r.stdout, r.stderr)
	}
	return r
}

// jsonLines decodes stdout as JSON lines.
func (r *result) jsonLines(t *testing.T) []jsonLine {
	t.Helper()
	var lines []jsonLine
	dec := json.NewDecoder(bytes.NewReader([]byte(r.stdout.String())))
	for dec.More() {
		var l struct {
			Type string          `json:"type"`
			ID   string          `json:"id"`
			Data json.RawMessage `json:"data"`
		}
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("stdout is not JSON lines: %v\n%s", err, r.stdout)
		}
		lines = append(lines, jsonLine{Type: l.Type, ID: l.ID, Data: l.Data})
	}
	for i, line := range strings.Split(strings.TrimSuffix(r.stdout.String(), "\n"), "\n") {
		if !json.Valid([]byte(line)) {
			t.Fatalf("stdout line %d is not one JSON document: %s", i+1, line)
		}
	}
	return lines
}
