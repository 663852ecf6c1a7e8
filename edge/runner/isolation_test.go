package runner

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// hostPIDs are the host's ids of the processes in PID namespace ns whose
// command line holds marker.
func hostPIDs(t *testing.T, ns, marker string) []int {
	t.Helper()
	var pids []int
	for _, pid := range namespaceMembers(t, ns) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(strings.ReplaceAll(string(cmdline), "\x00", " "), marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Tasks all run as runner.user, yet one cannot touch another: task B finds
// no file task A keeps in /tmp (its /tmp, /var/tmp and /dev/shm are its
// own), sees none of A's processes in /proc, cannot signal them by the
// ids the host knows them by, and a kill of every process it may signal
// (kill -1) finds none. A runs on throughout.
func TestTasksCannotTouchEachOthersFilesOrProcesses(t *testing.T) {
	h := newHarness(t, nil)
	a := h.start(`umask 077; for d in /tmp /var/tmp /dev/shm; do echo secret-of-a > $d/a.txt; done
echo "ns=$(readlink /proc/$$/ns/pid) tmpdir=$TMPDIR"; exec sleep 1001`, nil)
	outA := h.waitOutput(a.RunID, "tmpdir=")
	nsA := strings.Fields(outA[strings.Index(outA, "ns=")+3:])[0]
	if !strings.Contains(outA, "tmpdir=/tmp") {
		t.Fatalf("task A's TMPDIR: %q", outA)
	}
	// The output comes before the shell execs sleep: wait for the exec.
	var pidsA []int
	await.Within(await.Limit, func() bool { pidsA = hostPIDs(t, nsA, "sleep 1001"); return len(pidsA) == 1 })
	if len(pidsA) != 1 {
		t.Fatalf("task A's sleep in its namespace %s: %v", nsA, pidsA)
	}
	initA := hostPIDs(t, nsA, "task-init")
	if len(initA) != 1 {
		t.Fatalf("task A's init: %v", initA)
	}
	// A's files, as the host sees them: in A's own run dir.
	aTmp := filepath.Join(h.cfg.WorkDir, a.RunID, "tmp", "a.txt")
	if b, err := os.ReadFile(aTmp); err != nil || string(b) != "secret-of-a\n" {
		t.Fatalf("task A's /tmp/a.txt is not in its run's tmp dir: %q %v", b, err)
	}

	targets := append(append([]int{}, pidsA...), initA...)
	var script strings.Builder
	for _, d := range []string{"/tmp", "/var/tmp", "/dev/shm"} {
		fmt.Fprintf(&script, "cat %[1]s/a.txt >/dev/null 2>&1 && echo READ:%[1]s || echo NOFILE:%[1]s\n", d)
		fmt.Fprintf(&script, "echo from-b >> %s/a.txt\n", d)
	}
	for _, pid := range targets {
		fmt.Fprintf(&script, "kill -KILL %[1]d 2>/dev/null && echo KILLED:%[1]d || echo NOSIGNAL:%[1]d\n", pid)
		fmt.Fprintf(&script, "[ -e /proc/%[1]d ] && echo SEEN:%[1]d || echo UNSEEN:%[1]d\n", pid)
	}
	script.WriteString("ps -eo args= | grep -c '^sleep' | sed 's/^/A-PROCESSES-SEEN:/'\n")
	script.WriteString("ls /proc | grep -c '^[0-9]' | sed 's/^/PROCESSES:/'\n")
	b := h.start(script.String(), nil)
	h.waitEnd(b.RunID)
	outB := h.output(b.RunID)
	for _, d := range []string{"/tmp", "/var/tmp", "/dev/shm"} {
		if !strings.Contains(outB, "NOFILE:"+d) {
			t.Errorf("task B found task A's %s/a.txt: %s", d, outB)
		}
	}
	for _, pid := range targets {
		if !strings.Contains(outB, "NOSIGNAL:"+strconv.Itoa(pid)) || !strings.Contains(outB, "UNSEEN:"+strconv.Itoa(pid)) {
			t.Errorf("task B could signal or see task A's process %d: %s", pid, outB)
		}
	}
	// B's /proc holds its own init, sh, ps or ls and grep: a handful.
	if !strings.Contains(outB, "A-PROCESSES-SEEN:0") {
		t.Errorf("task B saw task A's processes: %s", outB)
	}
	if b, err := os.ReadFile(aTmp); err != nil || string(b) != "secret-of-a\n" {
		t.Errorf("task A's file changed: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(h.cfg.WorkDir, b.RunID, "tmp", "a.txt")); err != nil || string(b) != "from-b\n" {
		t.Errorf("task B's own /tmp/a.txt: %q %v", b, err)
	}

	// Everything a task may signal (kill -1: all but init and itself) is
	// in its own namespace: here nothing.
	c := h.start(`kill -KILL -1`, nil)
	h.waitEnd(c.RunID)
	if out := h.output(c.RunID); !strings.Contains(out, "No such process") {
		t.Errorf("kill -1 found processes to signal: %q", out)
	}
	if run, _ := h.r.Get(a.RunID); run.Status != hostproto.StatusRunning || len(namespaceMembers(t, nsA)) != 2 {
		t.Fatalf("task A did not survive the others: %+v, namespace %v", run, namespaceMembers(t, nsA))
	}
	if _, err := h.r.Cancel(a.RunID); err != nil {
		t.Fatal(err)
	}
	h.waitEnd(a.RunID)
}
