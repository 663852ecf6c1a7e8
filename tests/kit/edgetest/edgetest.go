// Package edgetest holds what edge's tests share, so each is written once:
// a test CA for loopback TLS servers, and what the tests that start tasks
// need (root, directories a task can traverse, the test binary as the
// task's init, a run's output, a small filesystem to fill). Waiting on
// another goroutine or process is package await's.
package edgetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// TB is the part of testing.TB the helpers use, so that a process without
// a *testing.T (the proxy benchmarks' child) can use them too.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// RequireRoot fails a test that starts tasks as another user unless it runs
// as root, as CI does (never a skip: a missing capability is a failure).
func RequireRoot(t TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests start tasks as another user and must run as root (as in CI)")
	}
}

// TraversableDir is a temp dir that every user (a task's included) can
// reach and read, down from /, but only its owner write.
func TraversableDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for p := dir; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// HostDir is a directory every user can traverse and read that a
// sandboxed task sees at its own path: outside /tmp and /var/tmp, which are
// the task's own. Removed when the test ends.
func HostDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/lib", "runfleet-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// RunTests is the TestMain of a package whose tests start tasks: as root
// the runner starts each task through the binary running it
// (runner.DefaultTaskInit), so the test binary acts as the task's init when
// called so. The init exits through syscall.Exit, skipping the race
// detector's one-second pause at exit, which every task would wait out.
// Each of after runs once the tests have: it removes what they made once
// for the whole test binary.
func RunTests(m *testing.M, after ...func()) {
	if len(os.Args) > 1 && os.Args[1] == sandbox.InitArg {
		syscall.Exit(sandbox.Main())
	}
	code := m.Run()
	for _, f := range after {
		f()
	}
	os.Exit(code)
}

// Output is a run's output: its output events' text, in order.
func Output(events []hostproto.Event) string {
	var b bytes.Buffer
	for _, e := range events {
		if e.Type == hostproto.EventOutput {
			var s string
			json.Unmarshal(e.Data, &s)
			b.WriteString(s)
		}
	}
	return b.String()
}

// LimitsReached are the data of a run's limit events, in order.
func LimitsReached(t TB, events []hostproto.Event) []hostproto.LimitReached {
	t.Helper()
	var out []hostproto.LimitReached
	for _, e := range events {
		if e.Type == hostproto.EventLimit {
			var l hostproto.LimitReached
			if err := json.Unmarshal(e.Data, &l); err != nil {
				t.Fatalf("a limit event's data %s: %v", e.Data, err)
			}
			out = append(out, l)
		}
	}
	return out
}

// Tmpfs mounts a tmpfs of size bytes (rounded up to whole pages) on a new
// temp dir, made 0755, for a test that fills a filesystem; it is unmounted
// when the test ends. Root only.
func Tmpfs(t testing.TB, size int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		t.Fatalf("mounting a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting the tmpfs on %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes zeros to path until its filesystem is full (ENOSPC),
// returning how many bytes it wrote: what removing path frees again.
func Fill(t testing.TB, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		m, err := f.Write(buf)
		n += int64(m)
		if errors.Is(err, syscall.ENOSPC) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
