package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/infra/localstack/demo"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestLocalStackRunsTheWholeSystem runs `make dev`'s program as it ships,
// with nothing but its data dir and addresses set, as root and as an
// ordinary user: it prints its commands; the printed dispatch curl starts a
// run of the demo agent that uses the demo secret, and the printed stream
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
		first.mustSay(t, "tasks run as nobody")
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
		s.mustSay(t, fmt.Sprintf("tasks run as you (uid %d): runner.insecureSameUser", nobody))
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

// devStack is a running local stack and what it printed up to "ready".
type devStack struct {
	cmd     *exec.Cmd
	dataDir string
	printed []string
	rest    chan string
	stderr  *syncbuf.Buffer
	exited  chan error
}

// startDevStack starts the local stack in dir ("": the data dir's parent)
// and waits for its "ready".
func startDevStack(t *testing.T, bin, dir string, env []string, as *syscall.Credential) *devStack {
	t.Helper()
	s := &devStack{stderr: &syncbuf.Buffer{}, rest: make(chan string, 256), exited: make(chan error, 1)}
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
	s.cmd.Stderr = s.stderr
	if as != nil {
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: as}
	}
	stdout, err := s.cmd.StdoutPipe()
	must(t, err)
	must(t, s.cmd.Start())
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			s.cmd.Process.Kill()
			<-s.exited
		}
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.rest <- sc.Text()
		}
		close(s.rest)
	}()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-s.rest:
			if !ok {
				t.Fatalf("the local stack exited before it was ready:\n%s\nstderr:\n%s", strings.Join(s.printed, "\n"), s.stderr.String())
			}
			s.printed = append(s.printed, line)
			if line == "ready" {
				t.Cleanup(func() { s.removeTaskDir(t) })
				return s
			}
		case <-timeout:
			t.Fatalf("not ready in 60s:\n%s\nstderr:\n%s", strings.Join(s.printed, "\n"), s.stderr.String())
		}
	}
}

func (s *devStack) mustSay(t *testing.T, want string) {
	t.Helper()
	if !strings.Contains(strings.Join(s.printed, "\n"), want) {
		t.Fatalf("the local stack does not say %q:\n%s", want, strings.Join(s.printed, "\n"))
	}
}

// commands are the printed dispatch and stream commands.
func (s *devStack) commands(t *testing.T) (dispatch, stream string) {
	t.Helper()
	return s.printedAfter(t, "dispatch a run of the demo agent", 0), s.printedAfter(t, "dispatch a run of the demo agent", 1)
}

// oneCommand is the printed command that dispatches and follows in one go.
func (s *devStack) oneCommand(t *testing.T) string {
	t.Helper()
	return s.printedAfter(t, "or both in one go", 0)
}

// printedAfter is the command printed n+1 lines after the line starting
// with heading.
func (s *devStack) printedAfter(t *testing.T, heading string, n int) string {
	t.Helper()
	for i, line := range s.printed {
		if strings.HasPrefix(line, heading) && i+1+n < len(s.printed) {
			return strings.TrimSpace(s.printed[i+1+n])
		}
	}
	t.Fatalf("no command under %q printed:\n%s", heading, strings.Join(s.printed, "\n"))
	return ""
}

func (s *devStack) callerToken() string {
	for _, line := range s.printed {
		if _, rest, ok := strings.Cut(line, "curl -sS -N -H \"Authorization: Bearer "); ok {
			tok, _, _ := strings.Cut(rest, "\"")
			return tok
		}
	}
	return ""
}

// base is the stack's address.
func (s *devStack) base() string {
	for _, line := range s.printed {
		if b, ok := strings.CutPrefix(line, "runfleet local stack listening on "); ok {
			return b
		}
	}
	return ""
}

// dispatchAnswer is the part of the dispatch answer the tests read.
type dispatchAnswer struct {
	FleetRunID string `json:"fleetRunId"`
	HostID     string `json:"hostId"`
	Status     string `json:"status"`
	Links      struct {
		Self   string `json:"self"`
		Events string `json:"events"`
		Stream string `json:"stream"`
	} `json:"links"`
}

// dispatchAndFollow runs the printed dispatch command, then the printed
// stream command with the run's id, as a user would paste them, in a
// directory of their own; the stream command is where the answer's
// links.stream points.
func (s *devStack) dispatchAndFollow(t *testing.T) {
	t.Helper()
	dispatch, stream := s.commands(t)
	if !strings.HasPrefix(dispatch, "curl ") || !strings.HasPrefix(stream, "curl ") || !strings.Contains(stream, "<fleetRunId>") {
		t.Fatalf("printed commands:\n%s\n%s", dispatch, stream)
	}
	out, err := shellIn(context.Background(), t.TempDir(), dispatch).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", dispatch, err, out)
	}
	var run dispatchAnswer
	if err := json.Unmarshal(out, &run); err != nil || run.FleetRunID == "" || run.HostID != "local-edge" {
		t.Fatalf("the dispatch answered %s (%v)", out, err)
	}
	stream = strings.ReplaceAll(stream, "<fleetRunId>", run.FleetRunID)
	if !strings.HasSuffix(stream, " "+run.Links.Stream) {
		t.Fatalf("the printed stream command %q does not follow the answer's links.stream %q", stream, run.Links.Stream)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sse, err := shellIn(ctx, t.TempDir(), stream).Output()
	if err != nil {
		t.Fatalf("the stream command: %v\n%s\nstderr:\n%s", err, sse, s.stderr.String())
	}
	s.checkDemoRan(t, string(sse))
}

// oneGo runs the printed one-go command in a directory of its own and
// checks it printed the dispatch answer, then followed the stream to the
// demo run's success, exiting 0.
func (s *devStack) oneGo(t *testing.T) {
	t.Helper()
	line := s.oneCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := shellIn(ctx, t.TempDir(), line)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s\nstderr: %s\nthe stack's log:\n%s", line, err, out, stderr.String(), s.stderr.String())
	}
	answer, sse, _ := strings.Cut(string(out), "\n")
	var run dispatchAnswer
	if err := json.Unmarshal([]byte(answer), &run); err != nil || run.FleetRunID == "" || run.Links.Stream == "" {
		t.Fatalf("the script's first line is not the dispatch answer: %s (%v)", answer, err)
	}
	s.checkDemoRan(t, sse)
}

// checkDemoRan reads a demo run's stream: it ended by itself at done, the
// run succeeded, and the demo agent printed the upstream's verdict on the
// credential it got. The real value reaches no output of the stack.
func (s *devStack) checkDemoRan(t *testing.T, sse string) {
	t.Helper()
	var output strings.Builder
	var done string
	for m := range ssetest.Read(strings.NewReader(sse)) {
		switch m.Event {
		case "event":
			var ev struct {
				Type string          `json:"type"`
				Data json.RawMessage `json:"data"`
			}
			json.Unmarshal([]byte(m.Data), &ev)
			var text string
			if ev.Type == "output" && json.Unmarshal(ev.Data, &text) == nil {
				output.WriteString(text)
			}
		case "done":
			done = m.Data
		}
	}
	if !strings.Contains(done, `"status":"succeeded"`) || !strings.Contains(output.String(), `the upstream answered: {"authorized": true}`) {
		t.Fatalf("the stream's end %q, the task's output:\n%s\nthe stream:\n%s", done, output.String(), sse)
	}
	secret, err := demo.ReadSecretsFile(filepath.Join(s.dataDir, "edge-secrets.json"))
	must(t, err)
	for what, text := range map[string]string{"printed": strings.Join(s.printed, "\n"), "log": s.stderr.String(), "stream": sse} {
		if strings.Contains(text, secret) {
			t.Fatalf("the real value is in the stack's %s", what)
		}
	}
}

// shellIn is a printed command line as a shell runs it, in dir.
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
// order and exits 0.
func (s *devStack) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	must(t, s.cmd.Process.Signal(sig))
	select {
	case err := <-s.exited:
		if err != nil {
			t.Fatalf("exit after %v: %v\nstderr:\n%s", sig, err, s.stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("still running 60s after %v", sig)
	}
	var tail []string
	for line := range s.rest {
		tail = append(tail, line)
	}
	if len(tail) == 0 || tail[len(tail)-1] != "stopped" {
		t.Fatalf("no clean stop: %q\nstderr:\n%s", tail, s.stderr.String())
	}
	if !strings.Contains(s.stderr.String(), `"msg":"edge stopped"`) {
		t.Fatal("the local edge did not stop in order")
	}
}

// removeTaskDir removes the tasks' directory the stack made under the
// temporary dir (it outlives the stack on purpose).
func (s *devStack) removeTaskDir(t *testing.T) {
	for _, line := range s.printed {
		if dir, ok := strings.CutPrefix(line, "  tasks' dirs: "); ok && strings.HasPrefix(dir, os.TempDir()) {
			os.RemoveAll(filepath.Dir(dir))
		}
	}
}
