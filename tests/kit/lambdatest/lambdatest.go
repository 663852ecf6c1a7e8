// Package lambdatest owns the test harness that runs a Fleet function's
// bootstrap as Lambda runs it: under the AWS Lambda runtime interface
// emulator (RIE). It builds a function for this machine with the flags that
// ship (Lambda's are linux/arm64; these machines are x86_64, so a test
// builds for the host's architecture), installs the pinned emulator into the
// repository's git-ignored .tools dir when it is missing (from the Go module
// proxy, about 10 s, once), starts it on a free loopback port with the
// function's environment, invokes it (serially: the emulator's default mode
// panics on overlapping invokes) and reads its REPORT lines.
//
// Usage:
//
//	bootstrap := lambdatest.Build(t, "./functions/stream")
//	fn := lambdatest.Start(t, bootstrap, env, 30*time.Second)
//	body := fn.Invoke(t, event) // the raw bytes the runtime answered
//	fn.Reports()                // init duration, duration, memory
package lambdatest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// EmulatorModule is the emulator, pinned.
const EmulatorModule = "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@v0.0.0-20261030222936-bef5c4ba774d"

// emulatorName is the installed binary's name.
const emulatorName = "aws-lambda-rie"

// BuildFlags are the Makefile's Lambda build flags (LAMBDA_FLAGS without
// the version stamp): no RPC shim, which streamed responses need.
var BuildFlags = []string{"-tags", "lambda.norpc", "-trimpath", "-ldflags", "-s -w"}

const (
	readyTimeout  = 15 * time.Second
	stopGrace     = 3 * time.Second
	reportTimeout = 5 * time.Second
)

// RepoRoot is the module's root directory (where go.mod is).
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("lambdatest: go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("lambdatest: not inside the module")
	}
	return filepath.Dir(mod), nil
}

var installMu sync.Mutex

// Emulator returns the emulator's path: <repo>/.tools/aws-lambda-rie, or
// on PATH; when neither has it, it is installed into .tools first (built in
// a temporary dir and renamed into place, so concurrent test binaries
// never see half a file).
func Emulator() (string, error) {
	installMu.Lock()
	defer installMu.Unlock()
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	tools := filepath.Join(root, ".tools")
	path := filepath.Join(tools, emulatorName)
	if st, err := os.Stat(path); err == nil && st.Mode()&0o111 != 0 {
		return path, nil
	}
	if p, err := exec.LookPath(emulatorName); err == nil {
		return p, nil
	}
	if err := os.MkdirAll(tools, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(tools, "install-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "install", EmulatorModule)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("lambdatest: installing the emulator (GOBIN=%s go install %s): %v\n%s", tools, EmulatorModule, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, emulatorName), path); err != nil {
		return "", err
	}
	return path, nil
}

// Build builds the function package pkg (relative to the repository root,
// e.g. "./functions/stream") for this machine with BuildFlags, static, and
// returns the bootstrap's path in a test-owned directory.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	out, err := BuildInto(tb.TempDir(), pkg)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// BuildInto is Build into dir (as dir/bootstrap; the emulator names the
// function after dir), for tests that build each function once per test
// binary and keep it beyond one test.
func BuildInto(dir, pkg string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "bootstrap")
	args := append([]string{"build"}, BuildFlags...)
	args = append(args, "-o", out, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("lambdatest: go build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}

// Function is a bootstrap running under the emulator.
type Function struct {
	// URL is the emulator's address, e.g. http://127.0.0.1:40123.
	URL string

	mu      sync.Mutex // one invoke at a time
	invokes int        // answered so far, under mu
	cmd     *exec.Cmd
	output  *syncbuf.Buffer
	done    chan struct{}
}

// Start runs bootstrap under the emulator with env (and nothing else of
// the test's environment but PATH), timeout as the function's timeout, and
// stops it when the test ends.
func Start(tb testing.TB, bootstrap string, env map[string]string, timeout time.Duration) *Function {
	tb.Helper()
	rie, err := Emulator()
	if err != nil {
		tb.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	// The emulator's own Runtime API (what the bootstrap polls) defaults to
	// 127.0.0.1:9001: a second emulator on the machine, in this test binary
	// or another one, would fail to bind it. Each gets a free port.
	runtimePort, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(rie, "--runtime-interface-emulator-address", addr,
		"--runtime-api-address", "127.0.0.1:"+strconv.Itoa(runtimePort), "./"+filepath.Base(bootstrap))
	cmd.Dir = filepath.Dir(bootstrap)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"AWS_LAMBDA_FUNCTION_TIMEOUT=" + strconv.Itoa(int(timeout.Seconds())),
		"AWS_LAMBDA_FUNCTION_NAME=" + filepath.Base(filepath.Dir(bootstrap)),
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("lambdatest: starting the emulator: %v", err)
	}
	f := &Function{URL: "http://" + addr, cmd: cmd, output: out, done: make(chan struct{})}
	go func() { cmd.Wait(); close(f.done) }()
	tb.Cleanup(f.stop)
	if err := f.waitReady(); err != nil {
		tb.Fatalf("%v\noutput:\n%s", err, out.String())
	}
	return f
}

func (f *Function) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	for {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(f.URL, "http://"), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-f.done:
			return errors.New("lambdatest: the emulator exited before listening")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lambdatest: the emulator did not listen within %s", readyTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the emulator and the bootstrap (its process group).
func (f *Function) stop() {
	syscall.Kill(-f.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-f.done:
	case <-time.After(stopGrace):
		syscall.Kill(-f.cmd.Process.Pid, syscall.SIGKILL)
		<-f.done
	}
}

// Kill ends the emulator and the bootstrap at once (SIGKILL to their
// process group), as a Lambda execution environment dies mid-invocation:
// an invoke in flight gets an error, the bootstrap's open connections are
// closed by the kernel, and nothing it had not finished is finished. The
// Function is unusable after; Start another.
func (f *Function) Kill() {
	syscall.Kill(-f.cmd.Process.Pid, syscall.SIGKILL)
	<-f.done
}

// Invoke sends event (marshalled to JSON unless it is []byte) as one
// invocation and returns the body the emulator answered: the function's
// response as the runtime sent it (for a streamed response, the prelude,
// 8 NUL bytes and the body).
func (f *Function) Invoke(tb testing.TB, event any) []byte {
	tb.Helper()
	body, err := f.TryInvoke(event)
	if err != nil {
		tb.Fatalf("%v\noutput:\n%s", err, f.Output())
	}
	return body
}

// TryInvoke is Invoke returning its error.
func (f *Function) TryInvoke(event any) ([]byte, error) {
	payload, ok := event.([]byte)
	if !ok {
		var err error
		if payload, err = json.Marshal(event); err != nil {
			return nil, fmt.Errorf("lambdatest: encoding the event: %w", err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/2015-03-31/functions/function/invocations", bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("lambdatest: invoking: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("lambdatest: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("lambdatest: the emulator answered %d: %s", resp.StatusCode, b)
	}
	f.invokes++
	f.waitReport(f.invokes)
	return b, nil
}

// waitReport waits (briefly) until the emulator has written n REPORT
// lines: it writes an invocation's REPORT line after it answered, so a
// test reading Reports right after Invoke could miss the last one.
func (f *Function) waitReport(n int) {
	deadline := time.Now().Add(reportTimeout)
	for len(f.Reports()) < n && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
}

// Output is what the emulator and the function wrote so far.
func (f *Function) Output() string { return f.output.String() }

// Report is one invocation's REPORT line.
type Report struct {
	RequestID string
	Duration  time.Duration
	// InitDuration is the REPORT line's "Init Duration" (zero when the line
	// has none). The pinned emulator measures it around a call that returns
	// before the runtime has initialised, so it reads near zero; Init is
	// the bootstrap's real init.
	InitDuration time.Duration
	MaxMemoryMB  int
}

var initReportLine = regexp.MustCompile(`INIT REPORT\(durationMs: ([0-9.]+)\)`)

// Init is the bootstrap's init as the emulator's "INIT REPORT(durationMs:
// ...)" line gives it: from the runtime's start until it asks for its
// first event (main's work before lambda.Start: configuration, clients,
// secrets). ok is false before the first invoke.
func (f *Function) Init() (d time.Duration, ok bool) {
	m := initReportLine.FindStringSubmatch(f.Output())
	if m == nil {
		return 0, false
	}
	return ms(m[1]), true
}

var reportLine = regexp.MustCompile(`REPORT RequestId: (\S+)\s+(?:Init Duration: ([0-9.]+) ms\s+)?Duration: ([0-9.]+) ms.*?Max Memory Used: (\d+) MB`)

// Reports parses the REPORT lines so far.
func (f *Function) Reports() []Report {
	var out []Report
	for _, m := range reportLine.FindAllStringSubmatch(f.Output(), -1) {
		r := Report{RequestID: m[1], Duration: ms(m[3])}
		if m[2] != "" {
			r.InitDuration = ms(m[2])
		}
		r.MaxMemoryMB, _ = strconv.Atoi(m[4])
		out = append(out, r)
	}
	return out
}

func ms(s string) time.Duration {
	v, _ := strconv.ParseFloat(s, 64)
	return time.Duration(v * float64(time.Millisecond))
}

// StreamedResponse splits a streamed response (InvokeMode RESPONSE_STREAM)
// as the runtime sends it: the JSON prelude (statusCode, headers, cookies),
// 8 NUL bytes, then the body.
func StreamedResponse(wire []byte) (prelude Prelude, body []byte, err error) {
	head, body, ok := bytes.Cut(wire, make([]byte, 8))
	if !ok {
		return Prelude{}, nil, fmt.Errorf("lambdatest: no 8 NUL bytes after the prelude in %q", truncate(wire))
	}
	if err := json.Unmarshal(head, &prelude); err != nil {
		return Prelude{}, nil, fmt.Errorf("lambdatest: the prelude %q: %w", truncate(head), err)
	}
	return prelude, body, nil
}

// Prelude is a streamed response's head.
type Prelude struct {
	StatusCode int               `json:"statusCode"`
	Headers    map[string]string `json:"headers"`
	Cookies    []string          `json:"cookies"`
}

func truncate(b []byte) []byte {
	if len(b) > 300 {
		return b[:300]
	}
	return b
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
