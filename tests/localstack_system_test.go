package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/infra/localstack/demo"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestLocalStackRunsTheWholeSystem runs `make dev`'s program as it ships,
// with nothing but its data dir and addresses set, as root and as an
// ordinary user: its ready record gives its commands; the dispatch curl
// starts a run of the demo agent that uses the demo secret, and the stream
// curl follows it to its end, where the upstream has said the credential
// was right. The real value reaches no output of the stack, and the task
// runs as nobody (root) or as the user itself, which the stack says.
func TestLocalStackRunsTheWholeSystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs the local stack as root and as nobody: it must run as root (as in CI)")
	}
	bin := localStackBinary(t) // built as root, run by both

	t.Run("root", func(t *testing.T) {
		dataDir := filepath.Join(t.TempDir(), "data")
		env := devEnv(dataDir, "")
		first := startDevStack(t, bin, "", env, nil)
		if got := first.ready.Edge.TasksRunAs; got != "nobody" {
			t.Fatalf("tasks run as %q, want nobody", got)
		}
		first.dispatchAndFollow(t)
		first.checkTaskUser(t, "65534")
		first.stop(t, syscall.SIGTERM)

		// A restart of the same data dir: the edge is found registered,
		// the demo caller's token still works, a run goes through again.
		again := startDevStack(t, bin, "", env, nil)
		if again.callerToken() != first.callerToken() {
			t.Fatal("the restarted stack minted another demo caller")
		}
		again.dispatchAndFollow(t)
		again.stop(t, syscall.SIGTERM)
	})

	t.Run("ordinary user", func(t *testing.T) {
		const nobody = 65534
		home := t.TempDir()
		for p := home; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
			must(t, os.Chmod(p, 0o755))
		}
		must(t, os.Chown(home, nobody, nobody))
		env := devEnv(filepath.Join(home, "data"), home)
		s := startDevStack(t, bin, "", env, &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}})
		if got, want := s.ready.Edge.TasksRunAs, fmt.Sprintf("uid %d", nobody); got != want {
			t.Fatalf("tasks run as %q, want %q", got, want)
		}
		if rec, _, ok := s.log.find("tasks run as this user, with open egress: runner.insecureSameUser is set because it cannot switch users; for this local stack only, never on a real host", 0); !ok || !strings.Contains(rec.line, `"level":"WARN"`) {
			t.Fatalf("the stack does not warn that tasks run as its user:\n%s", s.log.String())
		}
		s.dispatchAndFollow(t)
		s.checkTaskUser(t, "65534")
		s.stop(t, syscall.SIGTERM)
	})
}

// devEnv is the environment of a local stack: the test's without RUNFLEET_*
// settings, its own data dir, free ports, and HOME for a user.
func devEnv(dataDir, home string) []string {
	env := append(cleanEnv(), "RUNFLEET_DATA_DIR="+dataDir, "RUNFLEET_ADDR=127.0.0.1:0", "RUNFLEET_EDGE_ADDR="+freeAddr(),
		"RUNFLEET_DEMO_UPSTREAM_ADDR="+freeAddr())
	if home != "" {
		env = append(env, "HOME="+home)
	}
	return env
}

// freeAddr is a free loopback address (the local edge's must stay the same
// across a restart, so :0 will not do).
func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// devStack is a running local stack and its "ready" record.
type devStack struct {
	cmd     *exec.Cmd
	dataDir string
	ready   readyRecord
	log     *stackLog
	stderr  *syncbuf.Buffer
	exited  chan error
	// waited is set once the stack's Wait returned, before exited gets
	// its result.
	waited atomic.Bool
	// group: the stack is the command's process group (make dev's make
	// and the stack it runs), signalled as a whole, as a terminal's Ctrl-C
	// is.
	group bool
}

// startDevStack starts the local stack in dir ("": the data dir's parent)
// and waits for its "ready" record. Its stderr is no terminal, so it must
// stay empty: the banner is for a terminal alone.
func startDevStack(t testing.TB, bin, dir string, env []string, as *syscall.Credential) *devStack {
	t.Helper()
	s := newDevStack(t, bin, dir, env, as)
	s.cmd.Stderr = s.stderr
	s.start(t)
	return s
}

// newDevStack is the stack's command, to be started with start.
func newDevStack(t testing.TB, bin, dir string, env []string, as *syscall.Credential) *devStack {
	t.Helper()
	s := &devStack{stderr: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	s.dataDir = ".dev"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "RUNFLEET_DATA_DIR="); ok {
			s.dataDir = v
		}
	}
	if dir == "" {
		dir = filepath.Dir(s.dataDir)
	}
	if !filepath.IsAbs(s.dataDir) {
		s.dataDir = filepath.Join(dir, s.dataDir)
	}
	s.cmd = exec.Command(bin)
	s.cmd.Env = env
	s.cmd.Dir = dir
	if as != nil {
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: as}
	}
	return s
}

// start starts the stack and waits for its "ready" record.
func (s *devStack) start(t testing.TB) {
	t.Helper()
	stdout, err := s.cmd.StdoutPipe()
	must(t, err)
	s.startLog(t, stdout, nil)
}

// startLog is start with the log read from r; w, when not nil, is the
// test's copy of the write end of r's pipe, closed once the stack has its
// own, so the log ends when the stack exits.
func (s *devStack) startLog(t testing.TB, r io.Reader, w io.Closer) {
	t.Helper()
	if s.group {
		if s.cmd.SysProcAttr == nil {
			s.cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		s.cmd.SysProcAttr.Setpgid = true
	}
	must(t, s.cmd.Start())
	if w != nil {
		w.Close()
	}
	s.log = readStackLog(r)
	go func() {
		err := s.cmd.Wait()
		s.waited.Store(true)
		s.exited <- err
	}()
	t.Cleanup(func() {
		// Not cmd.ProcessState: Wait writes it on its own goroutine.
		if !s.waited.Load() {
			s.signal(syscall.SIGKILL)
			<-s.exited
		}
	})
	s.ready = s.log.awaitReady(t, 60*time.Second, s.stderr.String)
	if s.ready.Edge != nil {
		t.Cleanup(func() { s.removeTaskDir(t) })
	}
}

// commands are the demo caller's runfleet commands the stack gives: the
// run followed to its end, the dispatch alone and the follow of a run.
func (s *devStack) commands(t testing.TB) (run, dispatch, follow string) {
	t.Helper()
	if s.ready.Demo == nil {
		t.Fatalf("the ready record has no demo: %+v", s.ready)
	}
	d := s.ready.Demo
	for _, line := range []string{d.DemoRun, d.Dispatch, d.Stream} {
		if !strings.HasPrefix(line, "RUNFLEET_API="+s.base()+` RUNFLEET_TOKEN="$(cat `) {
			t.Fatalf("the stack's command %q does not start by setting RUNFLEET_API and RUNFLEET_TOKEN from a file", line)
		}
	}
	return d.DemoRun, d.Dispatch, d.Stream
}

// callerToken is the demo caller's token, from the file the commands read.
func (s *devStack) callerToken() string {
	if s.ready.Demo == nil {
		return ""
	}
	b, _ := os.ReadFile(s.ready.Demo.CallerTokenFile)
	return strings.TrimSpace(string(b))
}

// base is the stack's address.
func (s *devStack) base() string { return s.ready.Fleet }

// runIDPattern matches a Fleet run id in a command's output.
var runIDPattern = regexp.MustCompile(`\bfr-[a-z2-7]{26}\b`)

// dispatchAndFollow runs the stack's dispatch command, then its follow
// command with the run's id the first printed, as a user would paste them,
// in a directory of their own.
func (s *devStack) dispatchAndFollow(t *testing.T) {
	t.Helper()
	_, dispatch, follow := s.commands(t)
	if !strings.Contains(follow, " <fleetRunId>") {
		t.Fatalf("the follow command names no <fleetRunId>: %s", follow)
	}
	out, err := shellIn(context.Background(), t.TempDir(), dispatch).CombinedOutput()
	id := runIDPattern.FindString(string(out))
	if err != nil || id == "" || !strings.Contains(string(out), "local-edge") {
		t.Fatalf("%s: %v\n%s", dispatch, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	follow = strings.ReplaceAll(follow, "<fleetRunId>", id)
	cmd := shellIn(ctx, t.TempDir(), follow)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	output, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s\nstderr: %s\nlog:\n%s", follow, err, output, stderr.String(), s.log.String())
	}
	s.checkDemoRan(t, string(output), stderr.String())
}

// oneGo runs the stack's command that dispatches the demo run and follows
// it, in a directory of its own: it exits 0 with the demo's output.
func (s *devStack) oneGo(t *testing.T) {
	t.Helper()
	line, _, _ := s.commands(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := shellIn(ctx, t.TempDir(), line)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s\nstderr: %s\nthe stack's log:\n%s", line, err, out, stderr.String(), s.log.String())
	}
	s.checkDemoRan(t, string(out), stderr.String())
}

// checkDemoRan reads what runfleet printed of a demo run that exited 0
// (the run succeeded): the demo agent's output, the upstream's verdict on
// the credential it got, and nothing else. The real value reaches no
// output of the stack, and the tokens reach none of the stack's nor the
// CLI's.
func (s *devStack) checkDemoRan(t *testing.T, stdout, stderr string) {
	t.Helper()
	if !strings.Contains(stdout, `the upstream answered: {"authorized": true}`) {
		t.Fatalf("the task's output:\n%s\nstderr:\n%s", stdout, stderr)
	}
	secret, err := demo.ReadSecretsFile(filepath.Join(s.dataDir, "edge-secrets.json"))
	must(t, err)
	for what, text := range map[string]string{"log": s.log.String(), "stderr": s.stderr.String(), "runfleet's stdout": stdout, "runfleet's stderr": stderr} {
		if strings.Contains(text, secret) {
			t.Fatalf("the real value is in the %s", what)
		}
	}
	// The ready record names the tokens' files and commands that read
	// them; the tokens themselves reach no output (stderr is no terminal
	// here, so no banner either).
	for _, name := range []string{"admin-token", "demo-caller-token"} {
		token, err := os.ReadFile(filepath.Join(s.dataDir, name))
		must(t, err)
		tok := strings.TrimSpace(string(token))
		if tok == "" {
			t.Fatalf("%s is empty", name)
		}
		for what, text := range map[string]string{"log": s.log.String(), "stderr": s.stderr.String(), "runfleet's stdout": stdout, "runfleet's stderr": stderr} {
			if strings.Contains(text, tok) {
				t.Fatalf("the token in %s is in the %s", name, what)
			}
		}
	}
}

// shellIn is a command line the stack gives, as a shell runs it, in dir.
func shellIn(ctx context.Context, dir, line string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Dir = dir
	return cmd
}

// checkTaskUser dispatches a shell run that prints its uid and reads it
// from the run's stream.
func (s *devStack) checkTaskUser(t *testing.T, uid string) {
	t.Helper()
	tok := s.callerToken()
	body := `{"agent":"shell","prompt":"echo uid=$(id -u)"}`
	out, err := exec.Command("curl", "-sS", "-H", "Authorization: Bearer "+tok, "-H", "Content-Type: application/json",
		"-d", body, s.base()+"/fleet/runs").Output()
	must(t, err)
	var run struct {
		FleetRunID string `json:"fleetRunId"`
	}
	if json.Unmarshal(out, &run) != nil || run.FleetRunID == "" {
		t.Fatalf("dispatch: %s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sse, err := exec.CommandContext(ctx, "curl", "-sS", "-N", "-H", "Authorization: Bearer "+tok,
		s.base()+"/fleet/runs/"+run.FleetRunID+"/stream").Output()
	if err != nil || !strings.Contains(string(sse), "event: done") || !strings.Contains(string(sse), `"status":"succeeded"`) {
		t.Fatalf("the shell run's stream: %v\n%s", err, sse)
	}
	if !strings.Contains(string(sse), "uid="+uid) {
		t.Fatalf("the task ran as another user than %s:\n%s", uid, sse)
	}
}

// stop sends sig (SIGTERM, or SIGINT as Ctrl-C does): the stack stops in
// order and exits 0, its last record "stopped"; its stdout was JSON
// throughout and, being no terminal, its stderr got nothing.
func (s *devStack) stop(t testing.TB, sig syscall.Signal) {
	t.Helper()
	must(t, s.signal(sig))
	select {
	case err := <-s.exited:
		// make, signalled with the stack, dies of the signal once its
		// recipe is done, as GNU make does: the stack's own clean end is
		// its "stopped" record, below.
		var exit *exec.ExitError
		makeDied := s.group && errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == sig
		if err != nil && !makeDied {
			t.Fatalf("exit after %v: %v\nlog:\n%s\nstderr:\n%s", sig, err, s.log.String(), s.stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("still running 60s after %v", sig)
	}
	lines := s.log.wait(t)
	s.log.checkJSON(t)
	var last logRecord
	if len(lines) > 0 {
		json.Unmarshal([]byte(lines[len(lines)-1]), &last)
	}
	if last.Msg != "stopped" {
		t.Fatalf("no clean stop: the log ends %q", lines[max(0, len(lines)-3):])
	}
	if s.ready.Edge != nil {
		if _, _, ok := s.log.find("edge stopped", 0); !ok {
			t.Fatal("the local edge did not stop in order")
		}
	}
	if s.cmd.Stderr == s.stderr && s.stderr.String() != "" {
		t.Fatalf("the stack wrote to its stderr, which is no terminal:\n%s", s.stderr.String())
	}
}

// signal sends sig to the stack (its whole group when it is one).
func (s *devStack) signal(sig syscall.Signal) error {
	if s.group {
		return syscall.Kill(-s.cmd.Process.Pid, sig)
	}
	return s.cmd.Process.Signal(sig)
}

// removeTaskDir removes the tasks' directory the stack made under the
// temporary dir (it outlives the stack on purpose).
func (s *devStack) removeTaskDir(t testing.TB) {
	if dir := s.ready.Edge.TaskDirs; strings.HasPrefix(dir, os.TempDir()+string(filepath.Separator)) {
		os.RemoveAll(filepath.Dir(dir))
	}
}
