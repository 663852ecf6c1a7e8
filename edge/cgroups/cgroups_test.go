package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// fakeProc writes a proc tree whose self/mountinfo and self/cgroup are
// given, for Open to read.
func fakeProc(t *testing.T, mountinfo, cgroup string) string {
	t.Helper()
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"mountinfo": mountinfo, "cgroup": cgroup} {
		if err := os.WriteFile(filepath.Join(proc, "self", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return proc
}

func TestFindsOwnCgroupsInMountinfo(t *testing.T) {
	// This machine's layout: v1 controllers, edge's memory cgroup nested,
	// a cgroup2 mount offering none of them, and a mount point with a
	// space (escaped) whose root is not the hierarchy's.
	mounts, err := readMounts(filepath.Join(fakeProc(t, `
24 23 0:21 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
25 24 0:22 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
26 24 0:23 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
27 24 0:24 /tasks /srv/pids\040tree rw,relatime shared:9 - cgroup cgroup rw,pids
28 24 0:25 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
29 1 8:1 / / rw - ext4 /dev/root rw
`, ""), "self/mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	own, err := readOwn(filepath.Join(fakeProc(t, "", "9:name=systemd:/\n4:memory:/process_api/abc\n8:pids:/tasks/edge\n1:cpu,cpuacct:/\n0::/\n"), "self/cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for c, want := range map[string]string{
		"memory": "/sys/fs/cgroup/memory/process_api/abc",
		"pids":   "/srv/pids tree/edge",
		"cpu":    "/sys/fs/cgroup/cpu",
	} {
		if got, ok := mounts.v1Dir(c, own); !ok || got != want {
			t.Errorf("v1 %s: got %q, %v; want %q", c, got, ok, want)
		}
	}
	if _, ok := mounts.v1Dir("blkio", own); ok {
		t.Error("found a blkio hierarchy that is not mounted")
	}
	if got, ok := mounts.v2Dir(own); !ok || got != "/sys/fs/cgroup/unified" {
		t.Errorf("v2: got %q, %v", got, ok)
	}
}

func TestV2EnablesControllersAndWritesLimits(t *testing.T) {
	// A v2 tree as regular files: what Open and New write, and where.
	root := t.TempDir()
	own := filepath.Join(root, "system.slice/edge.service")
	if err := os.MkdirAll(own, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n", "cgroup.subtree_control": ""} {
		if err := os.WriteFile(filepath.Join(own, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	proc := fakeProc(t, "30 1 0:26 / "+root+" rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n", "0::/system.slice/edge.service\n")
	h, err := Open(Options{Name: "runfleet-test", Proc: proc})
	if err != nil {
		t.Fatal(err)
	}
	if h.Version() != V2 {
		t.Fatalf("version %d, want 2", h.Version())
	}
	for _, dir := range []string{own, filepath.Join(own, "runfleet-test")} {
		if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control")); string(b) != "+memory +pids +cpu" {
			t.Errorf("%s: subtree_control %q", dir, b)
		}
	}
	g, err := h.New("run-1", Limits{MemoryBytes: 2 << 30, Pids: 512, CPU: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(own, "runfleet-test/run-1")
	if got := g.ProcsFiles(); len(got) != 1 || got[0] != filepath.Join(dir, "cgroup.procs") {
		t.Errorf("procs files %q", got)
	}
	for file, want := range map[string]string{
		"memory.max": "2147483648", "pids.max": "512", "cpu.max": "150000 100000",
	} {
		if b, err := os.ReadFile(filepath.Join(dir, file)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", file, b, err, want)
		}
	}
}

func TestV2RefusesWithoutControllers(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("hugetlb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	proc := fakeProc(t, "30 1 0:26 / "+root+" rw - cgroup2 cgroup2 rw\n", "0::/\n")
	_, err := Open(Options{Name: "runfleet-test", Proc: proc})
	if err == nil || !strings.Contains(err.Error(), "does not offer the memory controller") || !strings.Contains(err.Error(), "no cgroup v1 hierarchy") {
		t.Fatalf("got %v, want an error saying neither v2 nor v1 works", err)
	}
}

// openHost opens this machine's hierarchy under a name of the test's own.
func openHost(t *testing.T) *Hierarchy {
	t.Helper()
	edgetest.RequireRoot(t)
	h, err := Open(Options{Name: fmt.Sprintf("runfleet-test-%d", os.Getpid())})
	if err != nil {
		t.Fatalf("this host offers no usable cgroups: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	})
	return h
}

// run runs a shell script in g and returns its output and how it ended.
func run(t *testing.T, g *Group, script string) (string, error) {
	t.Helper()
	// The script waits for its line on stdin, so it joins the group
	// before anything it forks.
	cmd := exec.Command("sh", "-c", "read go; "+script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Join(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	in.Write([]byte("go\n"))
	in.Close()
	err = cmd.Wait()
	return out.String(), err
}

func TestLimitsHoldOnThisHost(t *testing.T) {
	h := openHost(t)
	t.Run("pids", func(t *testing.T) {
		g, err := h.New("pids", Limits{Pids: 16})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		// 40 sleepers wanted, left running: the forks past the limit
		// fail, and the group holds at most its limit.
		run(t, g, `for i in $(seq 40); do sleep 600 >/dev/null 2>&1 & done 2>/dev/null; exit 0`)
		procs, err := readPids(filepath.Join(g.pids, "cgroup.procs"))
		if err != nil || len(procs) == 0 || len(procs) > 16 {
			t.Errorf("%d processes left in the group (%v), want some and at most its limit of 16", len(procs), err)
		}
		ev, err := g.Events()
		if err != nil || ev.ForksRefused == 0 {
			t.Errorf("events %+v, %v: want refused forks counted", ev, err)
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(g.pids); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the group outlived Close, its sleepers with it: %v", err)
		}
	})
	t.Run("memory", func(t *testing.T) {
		g, err := h.New("memory", Limits{MemoryBytes: 32 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		_, err = run(t, g, `exec python3 -c 'x = b"a" * (256 << 20)'`)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ProcessState.String() != "signal: killed" {
			t.Errorf("allocating 256 MiB under a 32 MiB limit: %v, want killed", err)
		}
		if ev, err := g.Events(); err != nil || ev.OOMKills != 1 {
			t.Errorf("events %+v, %v: want one OOM kill", ev, err)
		}
	})
	t.Run("cpu", func(t *testing.T) {
		g, err := h.New("cpu", Limits{CPU: 0.25})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		// Half a second of spinning at a quarter core: the kernel holds
		// the group back in most of its 100 ms periods. (tests/ measures
		// what a task sees: its CPU time against its wall time.)
		if out, err := run(t, g, `exec python3 -c 'import time
end = time.monotonic() + 0.5
while time.monotonic() < end: pass'`); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		throttled, err := readKey(filepath.Join(g.cpu, "cpu.stat"), "nr_throttled")
		if err != nil || throttled < 2 {
			t.Errorf("the spinner was throttled in %d periods (%v), want at least 2", throttled, err)
		}
	})
	t.Run("a restarted edge ends what its predecessor left", func(t *testing.T) {
		g, err := h.New("left", Limits{Pids: 16})
		if err != nil {
			t.Fatal(err)
		}
		sleeper := exec.Command("sleep", "600")
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		ended := make(chan error, 1)
		go func() { ended <- sleeper.Wait() }()
		if err := g.Join(sleeper.Process.Pid); err != nil {
			sleeper.Process.Kill()
			t.Fatal(err)
		}
		if _, err := Open(Options{Name: filepath.Base(h.parents["pids"])}); err != nil {
			t.Fatal(err)
		}
		if err := await.Recv(t, "the left process to be killed", ended); err == nil || err.Error() != "signal: killed" {
			t.Errorf("the left process: %v, want killed", err)
		}
		if _, err := os.Stat(g.pids); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the left group is still there: %v", err)
		}
	})
}
