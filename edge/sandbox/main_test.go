package sandbox_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// goClientArg makes this test binary act as a task's Go program: net/http's
// default client, with Go's default roots, fetching the URL that follows.
const goClientArg = "go-client"

func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == goClientArg {
		syscall.Exit(goClientMain(os.Args[2])) // without the race detector's pause at exit
	}
	edgetest.RunTests(m)
}

func goClientMain(url string) int {
	res, err := http.Get(url)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	fmt.Printf("%s\n", body)
	return 0
}

// The task's user, and a group of its own outside the runner's range
// (runner.DefaultTaskGroupFirst on): a runner of another test ends every
// process of its runs' groups.
const taskUID = 65534

var taskGID = uint32(0x6ff00000 + os.Getpid()%0x10000)

// taskPath is the PATH a task starts with (edge/runner's).
const taskPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// runDirs are a run's directories laid out as edge lays them out (see
// edge/runner's workdir.go): the run dir only the run's group may enter,
// edge's trust dir in it, the task's own work and tmp dirs.
type runDirs struct {
	Run, Trust, Work, Tmp, VarTmp string
}

func (d runDirs) trustFile() string { return filepath.Join(d.Trust, "trust.pem") }

func newRunDirs(t testing.TB) runDirs {
	t.Helper()
	run := filepath.Join(edgetest.TraversableDir(t), "run-1")
	d := runDirs{Run: run, Trust: filepath.Join(run, "trust"), Work: filepath.Join(run, "work"),
		Tmp: filepath.Join(run, "tmp"), VarTmp: filepath.Join(run, "var-tmp")}
	for _, x := range []struct {
		path     string
		uid, gid int
		mode     os.FileMode
	}{
		{d.Run, 0, int(taskGID), 0o750}, {d.Trust, 0, 0, 0o755}, {d.Work, taskUID, int(taskGID), 0o770},
		{d.Tmp, taskUID, int(taskGID), os.ModeSticky | 0o777}, {d.VarTmp, taskUID, int(taskGID), os.ModeSticky | 0o777},
	} {
		if err := os.Mkdir(x.path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(x.path, x.uid, x.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(x.path, x.mode); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// spec is what edge's runner sends for a task running script in d.
func (d runDirs) spec(script string) sandbox.Spec {
	return sandbox.Spec{
		UID: taskUID, GID: taskGID,
		Private: []sandbox.Mount{{Target: "/tmp", Source: d.Tmp}, {Target: "/var/tmp", Source: d.VarTmp}},
		Tmpfs:   []sandbox.Tmpfs{{Target: "/dev/shm", Bytes: 1 << 20}, {Target: "/run/lock", Bytes: 1 << 20}},
		Keep:    []string{d.Run},
		Dir:     d.Work,
		Path:    "/bin/sh",
		Argv:    []string{"sh", "-c", script},
	}
}

// task is a task started as edge starts one: this binary as its init
// (sandbox.Prepare), in a new session on a pseudo-terminal.
type task struct {
	t     testing.TB
	cmd   *exec.Cmd
	ptmx  *os.File
	out   syncbuf.Buffer
	ended chan struct{} // the terminal's output ended
	once  sync.Once
}

func startTask(t testing.TB, spec sandbox.Spec) *task {
	t.Helper()
	edgetest.RequireRoot(t)
	// No proxy or CA variable: only the system trust store says whom to
	// trust.
	cmd := &exec.Cmd{Env: []string{"PATH=" + taskPath, "HOME=/nonexistent", "LANG=C.UTF-8"}, Dir: "/"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Pdeathsig: syscall.SIGKILL}
	box, err := sandbox.Prepare(cmd, "/proc/self/exe", spec)
	if err != nil {
		t.Fatal(err)
	}
	defer box.Close()
	ptmx, err := pty.StartWithAttrs(cmd, &pty.Winsize{Rows: 40, Cols: 200}, cmd.SysProcAttr)
	if err != nil {
		t.Fatal(err)
	}
	tk := &task{t: t, cmd: cmd, ptmx: ptmx, ended: make(chan struct{})}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		tk.wait()
	})
	go func() {
		defer close(tk.ended)
		io.Copy(&tk.out, ptmx)
	}()
	if err := box.Started(); err != nil {
		t.Fatalf("the task did not start: %v", err)
	}
	return tk
}

// output is what the task wrote so far, the terminal's line ends as "\n".
func (tk *task) output() string { return strings.ReplaceAll(tk.out.String(), "\r\n", "\n") }

// waitOutput polls (a real process writes it) until the output holds want.
func (tk *task) waitOutput(want string) string {
	tk.t.Helper()
	var out string
	if !await.Within(20*time.Second, func() bool { out = tk.output(); return strings.Contains(out, want) }) {
		tk.t.Fatalf("the task's output never held %q: %q", want, out)
	}
	return out
}

// input types a line on the task's terminal.
func (tk *task) input(line string) {
	tk.t.Helper()
	if _, err := tk.ptmx.Write([]byte(line + "\n")); err != nil {
		tk.t.Fatal(err)
	}
}

// wait waits for the init to exit and the terminal's output to end; it
// returns the whole output.
func (tk *task) wait() string {
	tk.t.Helper()
	tk.once.Do(tk.reap)
	return tk.output()
}

func (tk *task) reap() {
	exited := make(chan struct{})
	go func() { tk.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		syscall.Kill(-tk.cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		tk.t.Errorf("the task ran past 30s: %q", tk.output())
	}
	// The terminal's output ends once nothing holds it open.
	syscall.Kill(-tk.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-tk.ended:
	case <-time.After(5 * time.Second):
	}
	tk.ptmx.Close()
}

// run runs script as a task and returns its output.
func run(t testing.TB, spec sandbox.Spec) string {
	t.Helper()
	return startTask(t, spec).wait()
}
