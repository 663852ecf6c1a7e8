package tests

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestLocalStackOnAFreshClone runs `make dev`'s program as a new user does
// right after cloning: from the repository's folder (a copy of its tracked
// files, no data dir; its path has a space) with nothing set but free
// addresses, so the data dir is the default, relative `.dev`. The
// commands it gives (runfleet's, by the absolute path of the one built
// beside the stack, as make dev builds both), pasted in another directory,
// list the hosts and run the demo to its success, in one go and as a
// dispatch then a follow; after a restart (Ctrl-C, then start again) the
// commands given before still work. A relative RUNFLEET_DATA_DIR works the
// same. On a terminal, the banner on stderr gives the same commands as the
// log's ready record.
func TestLocalStackOnAFreshClone(t *testing.T) {
	bin := localStackBinary(t)
	cli := cliBinary(t)
	clone := cloneLike(t)

	t.Run("default data dir", func(t *testing.T) {
		env := append(cleanEnv(), stackAddrs()...)
		first := startDevStack(t, bin, clone, env, nil)
		checkDataDir(t, filepath.Join(clone, ".dev"))
		first.tryHosts(t)
		for _, line := range append([]string{first.ready.Demo.DemoRun, first.ready.Demo.Dispatch, first.ready.Demo.Stream}, first.ready.Try...) {
			if !strings.Contains(line, `)" `+cli+" ") {
				t.Fatalf("the command does not run the runfleet beside the stack, %s, by its absolute path: %s", cli, line)
			}
		}
		first.oneGo(t)
		first.dispatchAndFollow(t)
		first.stop(t, syscall.SIGINT)

		again := startDevStack(t, bin, clone, env, nil)
		was, is := first.ready, again.ready
		if *was.Demo != *is.Demo || !slices.Equal(was.Try, is.Try) {
			t.Fatalf("a restart changed the commands:\nwas %+v %q\nis  %+v %q", *was.Demo, was.Try, *is.Demo, is.Try)
		}
		// The commands the first start gave, pasted against the restarted
		// stack.
		again.ready = was
		again.tryHosts(t)
		again.oneGo(t)
		again.dispatchAndFollow(t)
		again.ready = is
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
			"run the demo agent using the secret, its output followed to its end (exits 0 once the run succeeded):\n  " + s.ready.Demo.DemoRun + "\n",
			"\n  " + s.ready.Demo.Dispatch + "\n  " + s.ready.Demo.Stream + "\n",
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
		s.tryHosts(t)
		s.oneGo(t)
		s.stop(t, syscall.SIGTERM)
	})

	t.Run("runfleet across a planned end of the stream", func(t *testing.T) {
		env := append(cleanEnv(), append(stackAddrs(), "RUNFLEET_DATA_DIR="+filepath.Join(t.TempDir(), "data"), "RUNFLEET_STREAM_MAX_DURATION=1s")...)
		s := startDevStack(t, bin, clone, env, nil)
		c := newCLIUser(t, s, s.base(), s.callerToken())
		p := c.start(t, "run", "--json", "--agent", "shell", "--", `stty -echo; echo waiting; read v; echo "got: $v"`)
		// The run waits for its input until its stream has ended once,
		// planned (the stack logs each stream's end).
		await.Cond(t, 30*time.Second, "the task's first line", func() bool { return strings.Contains(p.stdout.String(), `"data":"waiting\r\n"`) })
		id := runIDPattern.FindString(p.stdout.String())
		await.Cond(t, 30*time.Second, "a planned end of the run's stream", func() bool {
			for i := 0; ; {
				rec, next, ok := s.log.find("stream", i)
				if !ok {
					return false
				}
				if strings.Contains(rec.line, `"fleetRunId":"`+id+`"`) && strings.Contains(rec.line, `"end":"planned"`) {
					return true
				}
				i = next
			}
		})
		c.run(t, "runs", "input", "--newline", id, "yes").exits(t, 0)
		r := p.wait(t)
		r.exits(t, 0)
		// runfleet reconnected after the planned end, resuming from the last
		// event: none repeated or lost, the input reached the task.
		var seqs []int64
		for _, l := range jsonLines(t, r) {
			if l.Type == "event" {
				var ev fleetapi.Event
				must(t, json.Unmarshal(l.Data, &ev))
				seqs = append(seqs, ev.Sequence)
			}
		}
		for i, seq := range seqs {
			if seq != int64(i+1) {
				t.Fatalf("event sequences %v across the reconnect:\n%s", seqs, r)
			}
		}
		if !strings.Contains(r.stdout, `got: yes`) || !strings.Contains(r.stdout, `"status":"succeeded"`) {
			t.Fatalf("runfleet's output:\n%s", r)
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

// tryHosts runs the first of the stack's commands to try, the hosts list
// with the admin token, in a directory of its own: it lists the local edge.
func (s *devStack) tryHosts(t *testing.T) {
	t.Helper()
	line := s.ready.Try[0]
	out, err := shellIn(context.Background(), t.TempDir(), line).CombinedOutput()
	if err != nil || !strings.Contains(string(out), localEdge) {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
}
