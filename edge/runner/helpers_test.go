package runner

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/runfleet/runfleet/tests/kit/await"
)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func execCommand(name string, args ...string) *exec.Cmd { return exec.Command(name, args...) }

// chmodTree makes a tree readable by everyone (a repository a task clones).
func chmodTree(t *testing.T, root string) {
	t.Helper()
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Chmod(p, 0o755)
		}
		return os.Chmod(p, 0o644)
	})
}

func chownTree(t *testing.T, root string, uid, gid int) {
	t.Helper()
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// namespaceMembers lists the processes of PID namespace ns (as
// readlink /proc/<pid>/ns/pid says it: "pid:[inode]") that are not dead:
// a killed process stays a zombie until it is reaped, and a zombie runs
// nothing. Edge's and the test's own namespace never qualifies here.
func namespaceMembers(t *testing.T, ns string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var alive []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		link, err := os.Readlink("/proc/" + e.Name() + "/ns/pid")
		if err != nil || link != ns {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ...; comm may hold spaces, so split after ')'.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 0 && fields[0] != "Z" && fields[0] != "X" {
			alive = append(alive, pid)
		}
	}
	return alive
}

// waitNamespaceEmpty polls (the kernel finishes killed processes' exits
// on its own time) until no process of ns is alive.
func waitNamespaceEmpty(t *testing.T, ns string) {
	t.Helper()
	var alive []int
	if !await.Within(5*time.Second, func() bool { alive = namespaceMembers(t, ns); return len(alive) == 0 }) {
		t.Fatalf("processes %v of the task's PID namespace %s still run", alive, ns)
	}
}
