package tests

import (
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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestLocalStackOnAFreshClone runs `make dev`'s program as a new user does
// right after cloning: from the repository's folder (a copy of its tracked
// files, nothing built, no data dir; its path has a space) with nothing set
// but free addresses, so the data dir is the default, relative `.dev`. The
// commands it gives, pasted in another directory, reach /healthz and run
// the demo to its success (the one-go script following the dispatch
// answer's links); after a restart (Ctrl-C, then start again) the commands
// given before still work. A relative RUNFLEET_DATA_DIR works the same. On
// a terminal, the banner on stderr gives the same commands as the log's
// ready record.
func TestLocalStackOnAFreshClone(t *testing.T) {
	bin := localStackBinary(t)
	clone := cloneLike(t)
	script := filepath.Join(clone, "infra", "scripts", "demo-run.sh")

	t.Run("default data dir", func(t *testing.T) {
		env := append(cleanEnv(), stackAddrs()...)
		first := startDevStack(t, bin, clone, env, nil)
		checkDataDir(t, filepath.Join(clone, ".dev"))
		first.healthz(t)
		if line := first.oneCommand(t); !strings.HasPrefix(line, shellQuoted(script)+" ") {
			t.Fatalf("the one-go command does not start with the script's absolute path %s: %s", script, line)
		}
		first.oneGo(t)
		first.dispatchAndFollow(t)
		// Refused dispatches: the script prints the answer and exits 1.
		first.scriptRefused(t, script, "rft_not-a-token", "{}", 401, "unauthenticated")
		// The demo key declared for a port the edge's policy does not grant.
		outside := `{"agent":"demo","secrets":[{"projectId":"demo","key":"DEMO_API_KEY","domains":["api.demo.test:1"]}]}`
		first.scriptRefused(t, script, first.callerToken(), outside, 409, "key_not_granted")
		first.stop(t, syscall.SIGINT)

		again := startDevStack(t, bin, clone, env, nil)
		was, is := first.ready, again.ready
		if *was.Demo != *is.Demo || !slices.Equal(was.Try, is.Try) {
			t.Fatalf("a restart changed the commands:\nwas %+v %q\nis  %+v %q", *was.Demo, was.Try, *is.Demo, is.Try)
		}
		// The commands the first start gave, pasted against the restarted
		// stack.
		before := *again
		before.ready = first.ready
		before.healthz(t)
		before.oneGo(t)
		before.dispatchAndFollow(t)
		again.stop(t, syscall.SIGTERM)
	})

	t.Run("banner on a terminal", func(t *testing.T) {
		env := append(cleanEnv(), append(stackAddrs(), "RUNFLEET_DATA_DIR="+filepath.Join(t.TempDir(), "data"))...)
		s := newDevStack(t, bin, clone, env, nil)
		terminal, tty, err := pty.Open()
		must(t, err)
		defer terminal.Close()
		s.cmd.Stderr = tty
		var banner syncbuf.Buffer
		read := make(chan struct{})
		go func() {
			defer close(read)
			io.Copy(&banner, terminal) // ends with EIO once the stack has exited
		}()
		s.start(t)
		tty.Close() // the stack holds its own
		await.Cond(t, 30*time.Second, "the banner's last line", func() bool { return strings.HasSuffix(banner.String(), "\r\nready\r\n") })
		text := strings.ReplaceAll(banner.String(), "\r\n", "\n")
		admin, err := os.ReadFile(s.ready.AdminTokenFile)
		must(t, err)
		for _, want := range append([]string{
			"runfleet local stack listening on " + s.ready.Fleet + "\n",
			"  admin token: " + strings.TrimSpace(string(admin)) + " (kept in " + s.ready.AdminTokenFile + ")\n",
			"  tasks' dirs: " + s.ready.Edge.TaskDirs + "\n",
			"\n  " + s.ready.Demo.Dispatch + "\n  " + s.ready.Demo.Stream + "\n",
			"or both in one go (prints the answer, follows its links.stream; exits 0 once the run succeeded):\n  " + s.ready.Demo.DemoRun + "\n",
		}, s.ready.Try...) {
			if !strings.Contains(text, want) {
				t.Errorf("the banner lacks %q:\n%s", want, text)
			}
		}
		// Tokens go to the terminal alone: the log's commands read them
		// from their files.
		for what, tok := range map[string]string{"admin": strings.TrimSpace(string(admin)), "demo caller": s.callerToken()} {
			if strings.Contains(s.log.String(), tok) {
				t.Errorf("the %s token is in the log", what)
			}
		}
		s.stop(t, syscall.SIGINT)
		<-read
	})

	t.Run("relative data dir", func(t *testing.T) {
		env := append(cleanEnv(), append(stackAddrs(), "RUNFLEET_DATA_DIR=state/dev")...)
		s := startDevStack(t, bin, clone, env, nil)
		checkDataDir(t, filepath.Join(clone, "state", "dev"))
		s.healthz(t)
		s.oneGo(t)
		s.stop(t, syscall.SIGTERM)
	})

	t.Run("one go across a planned end of the stream", func(t *testing.T) {
		env := append(cleanEnv(), append(stackAddrs(), "RUNFLEET_DATA_DIR="+filepath.Join(t.TempDir(), "data"), "RUNFLEET_STREAM_MAX_DURATION=1s")...)
		s := startDevStack(t, bin, clone, env, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var out syncbuf.Buffer
		cmd := exec.CommandContext(ctx, script, s.base()+"/fleet/runs", s.callerToken(), `{"agent":"shell","prompt":"read line; echo got: $line"}`)
		cmd.Stdout, cmd.Stderr = &out, &out
		must(t, cmd.Start())
		// The run waits for its line until the stream has ended once with
		// its retry hint (and the script reconnected).
		await.Cond(t, 30*time.Second, "a planned end of the stream", func() bool { return strings.Contains(out.String(), "\nretry: ") })
		answer, _, _ := strings.Cut(out.String(), "\n")
		var run dispatchAnswer
		must(t, json.Unmarshal([]byte(answer), &run))
		req, err := http.NewRequest("POST", run.Links.Self+"/input", strings.NewReader(`{"input":"yes\n"}`))
		must(t, err)
		req.Header.Set("Authorization", "Bearer "+s.callerToken())
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		resp.Body.Close()
		if err := cmd.Wait(); err != nil || resp.StatusCode != 200 {
			t.Fatalf("the script: %v (input answered %d)\n%s", err, resp.StatusCode, out.String())
		}
		// Resumed from the last event: none repeated or lost, the line
		// reached the task.
		var ids []string
		for _, line := range strings.Split(out.String(), "\n") {
			if id, ok := strings.CutPrefix(line, "id: "); ok {
				ids = append(ids, id)
			}
		}
		for i, id := range ids {
			if id != strconv.Itoa(i+1) {
				t.Fatalf("event ids %v across the reconnect:\n%s", ids, out.String())
			}
		}
		if !strings.Contains(out.String(), `got: yes`) || !strings.Contains(out.String(), `"status":"succeeded"`) {
			t.Fatalf("the script's output:\n%s", out.String())
		}
		s.stop(t, syscall.SIGTERM)
	})

	t.Run("demo upstream address in use", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		must(t, err)
		defer l.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin)
		cmd.Dir = clone
		cmd.Env = append(cleanEnv(), "RUNFLEET_DATA_DIR="+t.TempDir(), "RUNFLEET_ADDR="+freeAddr(), "RUNFLEET_EDGE_ADDR="+freeAddr(),
			"RUNFLEET_DEMO_UPSTREAM_ADDR="+l.Addr().String())
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 ||
			!strings.Contains(string(out), "address already in use: another program listens there; set RUNFLEET_DEMO_UPSTREAM_ADDR to a free address") {
			t.Fatalf("with the demo upstream's address taken: %v\n%s", err, out)
		}
	})
}

// stackAddrs sets a local stack's three addresses to free ones, fixed for
// the test (a restart keeps them, as the defaults do).
func stackAddrs() []string {
	return []string{"RUNFLEET_ADDR=" + freeAddr(), "RUNFLEET_EDGE_ADDR=" + freeAddr(), "RUNFLEET_DEMO_UPSTREAM_ADDR=" + freeAddr()}
}

// cloneLike is a copy of the repository's tracked files as they are in the
// work tree, as a fresh clone has them: nothing built, no data dir. Its
// path has a space, as a user's folder may.
func cloneLike(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "-C", "..", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files (this test copies the repository's tracked files): %v", err)
	}
	dir := filepath.Join(t.TempDir(), "fresh clone")
	for _, name := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		src := filepath.Join("..", filepath.FromSlash(name))
		fi, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree
		}
		must(t, err)
		if !fi.Mode().IsRegular() {
			continue
		}
		b, err := os.ReadFile(src)
		must(t, err)
		dst := filepath.Join(dir, filepath.FromSlash(name))
		must(t, os.MkdirAll(filepath.Dir(dst), 0o755))
		must(t, os.WriteFile(dst, b, fi.Mode().Perm()))
	}
	return dir
}

// checkDataDir: the stack keeps its files in dir, and the local edge's
// edge.json names them by absolute paths (edge resolves a relative one
// against edge.json's folder).
func checkDataDir(t *testing.T, dir string) {
	t.Helper()
	for _, name := range []string{"fleet.db", "admin-token", "credentials.json", "edge-host-token", "demo-caller-token"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("the data dir %s: %v", dir, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "edge.json"))
	must(t, err)
	var cfg struct {
		DataDir string `json:"dataDir"`
		API     struct {
			TokenFile string `json:"tokenFile"`
		} `json:"api"`
		Secrets struct {
			File string `json:"file"`
		} `json:"secrets"`
	}
	must(t, json.Unmarshal(b, &cfg))
	for _, p := range []string{cfg.DataDir, cfg.API.TokenFile, cfg.Secrets.File} {
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("edge.json names %q, not a path under %s:\n%s", p, dir, b)
		}
	}
}

// scriptRefused runs the one-go script with a dispatch Fleet refuses:
// it prints the answer (status and code as given) and exits 1, following
// nothing.
func (s *devStack) scriptRefused(t *testing.T, script, token, body string, status int, code string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, s.base()+"/fleet/runs", token, body)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	var answer struct {
		Code string `json:"code"`
	}
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || json.Unmarshal(out, &answer) != nil || answer.Code != code ||
		!strings.Contains(stderr.String(), fmt.Sprintf("the dispatch was answered HTTP %d", status)) {
		t.Fatalf("the script with %s: %v\n%s\nstderr: %s", body, err, out, stderr.String())
	}
}

// healthz runs the stack's /healthz command in a directory of its own.
func (s *devStack) healthz(t *testing.T) {
	t.Helper()
	line := s.ready.Try[0]
	out, err := shellIn(context.Background(), t.TempDir(), line).Output()
	var health struct {
		OK bool `json:"ok"`
	}
	if err != nil || json.Unmarshal(out, &health) != nil || !health.OK {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
}

// shellQuoted is path as the stack prints it in a command: single-quoted,
// since the clone's path has a space.
func shellQuoted(path string) string { return "'" + path + "'" }
