// Package motoserver owns the test harness around moto_server, the AWS
// emulator that runfleet's tests use for DynamoDB, KMS, Secrets Manager and
// friends: it starts one on a free loopback port, waits until it answers,
// hands out AWS clients configured for it, and stops it (its whole process
// group) afterwards.
//
// A missing moto_server is an error that says how to install it, never a
// skipped test: the tests that need AWS are the ones that prove the stores
// and the AWS integrations work.
//
// moto takes about half a second to start, so a test binary should start one
// server in TestMain (see Run) and share it; tests isolate themselves with
// their own table or resource names, or with Reset.
//
// Clients reach moto through a loopback front that passes one request at a
// time. moto_server answers on parallel threads, and its DynamoDB handlers
// read an item, evaluate the condition and write without a lock (moto 5.2:
// dynamodb/models update_item, Table.put_item), so two concurrent
// conditional updates of one item can both succeed there; on DynamoDB one
// fails. Serialising requests gives tests DynamoDB's atomicity while the
// code under test still sends them concurrently. moto is bound to one core
// by Python's GIL anyway, so little throughput is lost.
package motoserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Region, AccessKeyID and SecretAccessKey are what every client of the
// harness uses; moto accepts any credentials.
const (
	Region          = "us-east-1"
	AccessKeyID     = "test"
	SecretAccessKey = "test"
)

// InstallHint is the part of every "not found" error that says what to do.
const InstallHint = "install it with: pip install 'moto[server]'"

// uniqueSeq numbers the names Unique hands out.
var uniqueSeq atomic.Int64

// Unique returns prefix followed by a number that no earlier call in this
// process returned, so resources on a server a test binary shares (and
// keeps across -count reruns) never collide. Table names stay valid: the
// number is decimal digits.
func Unique(prefix string) string {
	return prefix + strconv.FormatInt(uniqueSeq.Add(1), 10)
}

// pyenvShim is where moto_server lives on the documented machines when it is
// not on PATH (it is installed with the pyenv Python).
const pyenvShim = "/root/.pyenv/shims/moto_server"

const (
	// readyTimeout bounds the wait for the first answer: moto needs ~0.5 s,
	// more on a loaded 2-core machine.
	readyTimeout = 30 * time.Second
	// pollEvery is how often readiness is asked for while waiting.
	pollEvery = 25 * time.Millisecond
	// stopGrace is how long moto gets to exit on SIGTERM before SIGKILL.
	stopGrace = 3 * time.Second
	// startAttempts covers the rare case where another process takes the
	// free port between our probe and moto's bind.
	startAttempts = 3
)

// Lookup finds the moto_server executable: on PATH first, then the pyenv
// shim. The error names both places and how to install it.
func Lookup() (string, error) { return lookup(pyenvShim) }

func lookup(fallback string) (string, error) {
	if p, err := exec.LookPath("moto_server"); err == nil {
		return p, nil
	}
	if executable(fallback) {
		return fallback, nil
	}
	return "", fmt.Errorf("motoserver: moto_server not found on PATH nor at %s; %s", fallback, InstallHint)
}

// Server is a running moto_server. Its methods are safe for concurrent use.
type Server struct {
	// URL is the endpoint clients use, e.g. http://127.0.0.1:40123 (no
	// trailing slash): the serialising front.
	URL string
	// MotoURL is moto_server itself, for a test that needs requests to
	// overlap (none should need it for correctness).
	MotoURL string

	front    *http.Server
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the process has been waited for
	output   *tailBuffer
	stopOnce sync.Once
	stopErr  error
}

// Options tune a server that Start would start with none: the zero value
// is Start's server.
type Options struct {
	// Env is added to moto_server's environment, each "KEY=value", after
	// this process's own (so it wins). Nil adds nothing. A test that needs
	// moto to check signatures sets INITIAL_NO_AUTH_ACTION_COUNT here, on
	// a server of its own: it changes how every later request is treated,
	// so it must never be the server other tests share.
	Env []string
}

// Start launches moto_server on a free loopback port and returns once it
// answers GET /moto-api/. ctx bounds the start only; the server runs until
// Stop. The caller must call Stop.
func Start(ctx context.Context) (*Server, error) { return StartWith(ctx, Options{}) }

// StartWith is Start with options.
func StartWith(ctx context.Context, o Options) (*Server, error) {
	bin, err := Lookup()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		s, err := start(ctx, bin, o)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// StartT starts a server for one test (or benchmark) and stops it in
// t.Cleanup; it fails the test, with the install hint, if it cannot.
// Prefer one server per test binary (Run) where many tests need one.
func StartT(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	s, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("motoserver: stop: %v", err)
		}
	})
	return s
}

// Run is a TestMain body that starts one server for the whole test binary,
// hands it to use (typically storing it in a package variable of the test),
// runs the tests and stops the server. It returns the exit code for os.Exit.
// When moto_server cannot start, it prints why (with the install hint) and
// returns 1: the tests fail, they are not skipped.
//
//	var moto *motoserver.Server
//
//	func TestMain(m *testing.M) {
//		os.Exit(motoserver.Run(m, func(s *motoserver.Server) { moto = s }))
//	}
func Run(m *testing.M, use func(*Server)) int {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	s, err := Start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	use(s)
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func start(ctx context.Context, bin string, o Options) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	out := &tailBuffer{max: 8 << 10}
	// Not exec.CommandContext: ctx bounds the start, not the server's life.
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Stdout = out
	cmd.Stderr = out
	if o.Env != nil {
		cmd.Env = append(os.Environ(), o.Env...)
	}
	// Its own process group, so Stop reaches the Python process behind the
	// pyenv shim and anything it forks.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("motoserver: starting %s: %w", bin, err)
	}
	s := &Server{MotoURL: url, cmd: cmd, exited: make(chan struct{}), output: out}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(ctx); err != nil {
		_ = s.Stop()
		return nil, err
	}
	if err := s.startFront(); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// startFront serves URL: a reverse proxy to moto that holds a lock for the
// whole of each request (see the package comment for why).
func (s *Server) startFront() error {
	target, err := neturl.Parse(s.MotoURL)
	if err != nil {
		return fmt.Errorf("motoserver: parsing %s: %w", s.MotoURL, err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var one sync.Mutex
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("motoserver: listening for the front: %w", err)
	}
	s.front = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			one.Lock()
			defer one.Unlock()
			proxy.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	s.URL = "http://" + ln.Addr().String()
	go func() { _ = s.front.Serve(ln) }()
	return nil
}

// waitReady polls GET /moto-api/ until it answers 200, the process exits, or
// the deadline passes.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.MotoURL+"/moto-api/", nil)
		if err != nil {
			return fmt.Errorf("motoserver: building readiness request: %w", err)
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("motoserver: moto_server exited before answering on %s; its output:\n%s", s.MotoURL, s.output.String())
		case <-ctx.Done():
			return fmt.Errorf("motoserver: moto_server did not answer on %s: %w; its output:\n%s", s.MotoURL, ctx.Err(), s.output.String())
		case <-tick.C:
		}
	}
}

// Stop terminates the server's process group (SIGTERM, then SIGKILL after a
// grace period) and waits for it. It is idempotent.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if s.front != nil {
			_ = s.front.Close()
		}
		pgid := s.cmd.Process.Pid
		select {
		case <-s.exited:
			// Already gone; still sweep the group in case it forked.
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return
		default:
		}
		if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			s.stopErr = fmt.Errorf("motoserver: signalling process group %d: %w", pgid, err)
		}
		t := time.NewTimer(stopGrace)
		defer t.Stop()
		select {
		case <-s.exited:
		case <-t.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-s.exited
		}
		// Children that ignored SIGTERM must not outlive the harness.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	})
	return s.stopErr
}

// Reset discards every resource in the server (POST /moto-api/reset), for
// tests that share a server but need a clean account.
func (s *Server) Reset(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/moto-api/reset", nil)
	if err != nil {
		return fmt.Errorf("motoserver: building reset request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("motoserver: reset: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("motoserver: reset: status %d", resp.StatusCode)
	}
	return nil
}

// AWSConfig returns an aws.Config for any service client: region us-east-1,
// static credentials test/test, and BaseEndpoint pointing at the server, so
// every service built from it (dynamodb.NewFromConfig, kms.NewFromConfig,
// secretsmanager.NewFromConfig, ...) talks to moto. Nothing is read from the
// environment or shared config files that could reach a real account.
func (s *Server) AWSConfig() aws.Config {
	return aws.Config{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, ""),
		BaseEndpoint: aws.String(s.URL),
		// Retries would only hide a failing emulator behind latency.
		RetryMaxAttempts: 1,
	}
}

// LoadAWSConfig is AWSConfig through config.LoadDefaultConfig, for code
// under test that takes its options that way (config.WithRegion and a
// static credentials provider); the static credentials and region override
// anything in the environment.
func (s *Server) LoadAWSConfig(ctx context.Context) (aws.Config, error) {
	cfg, err := config.LoadDefaultConfig(ctx,
		config.WithRegion(Region),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, "")),
		config.WithBaseEndpoint(s.URL),
		config.WithRetryMaxAttempts(1),
	)
	if err != nil {
		return aws.Config{}, fmt.Errorf("motoserver: loading AWS config: %w", err)
	}
	return cfg, nil
}

// DynamoDB returns a DynamoDB client for the server.
func (s *Server) DynamoDB() *dynamodb.Client {
	return dynamodb.NewFromConfig(s.AWSConfig())
}

// freePort asks the kernel for a free loopback port. moto binds it a moment
// later; Start retries if someone else won the race.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("motoserver: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tailBuffer keeps the last max bytes written: enough of moto's log to
// explain a failed start without holding every request line it prints.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - b.max; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// executable reports whether path names an executable regular file.
func executable(path string) bool {
	st, err := os.Stat(filepath.Clean(path))
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}
