package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// mountTmpfs mounts a tmpfs of size bytes on dir (made if missing) until
// the test ends; opts are more of its mount options ("nr_inodes=3000").
func mountTmpfs(t *testing.T, dir string, size int64, opts ...string) {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o700))
	data := strings.Join(append([]string{fmt.Sprintf("size=%d,mode=0700", size)}, opts...), ",")
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, data); err != nil {
		t.Fatalf("mounting a tmpfs on %s: %v", dir, err)
	}
	// Cleanups run last first, so this one runs before newEdgeProc's stops
	// edge: a lazy unmount lets the mount go once edge has let go of it.
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

// TestEdgeServeOnAFullDataDir: with edge's data dir on a 16 MiB
// filesystem, a task flooding its output is ended storage_full within
// seconds, its events up to then readable; the next start is refused
// host_storage_low and /healthz says storage is low; edge keeps running
// and logs the condition in a bounded number of lines; once space returns
// runs are admitted again.
func TestEdgeServeOnAFullDataDir(t *testing.T) {
	e := newEdgeProc(t)
	data := filepath.Join(e.dir, "data")
	mountTmpfs(t, data, 16<<20)
	// A reserve of 4 MiB: output stops being recorded under 1 MiB free.
	e.runner = `{"user": "nobody", "minFreeBytes": 4194304}`
	e.writeConfig()
	// 6 MiB the test gives back later, as an operator freeing space would.
	filler := filepath.Join(data, "filler")
	must(t, os.WriteFile(filler, make([]byte, 6<<20), 0o600))
	e.start()
	ctx := context.Background()

	h, err := e.client.Health(ctx)
	must(t, err)
	if h.Storage == nil || h.Storage.Low || h.Storage.MinFreeBytes != 4<<20 || h.Storage.FreeBytes < 4<<20 || h.Storage.FreeBytes > 10<<20 {
		t.Fatalf("health storage at start: %+v", h.Storage)
	}

	began := time.Now()
	flood := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo before-the-flood; yes 0123456789abcdef`}})
	end := e.waitFor(flood.RunID, terminal)
	took := time.Since(began)
	t.Logf("the flood ended %s after its start: %+v", took.Round(time.Millisecond), end)
	if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonStorageFull || !strings.Contains(end.Detail, "bytes not recorded") {
		t.Fatalf("the flooding run ended %+v, want failed storage_full", end)
	}
	if took > 10*time.Second {
		t.Fatalf("the flood took %s to end", took)
	}
	out, _ := e.output(flood.RunID, 0)
	if !strings.HasPrefix(out, "before-the-flood") || !strings.Contains(out, "0123456789abcdef") {
		t.Fatalf("the flood's output (%d bytes) reads %.200q ... %q", len(out), out, out[max(0, len(out)-200):])
	}
	said := e.limitsReached(flood.RunID)
	if len(said) != 1 || said[0].Limit != hostproto.LimitStorage || said[0].UnrecordedBytes <= 0 || !strings.Contains(end.Detail, fmt.Sprintf("(%d bytes not recorded)", said[0].UnrecordedBytes)) {
		t.Fatalf("the flood's limit events %+v, want one counting the bytes not recorded, as its end (%q) does", said, end.Detail)
	}
	t.Logf("recorded %d bytes of the flood's output; %d were not", len(out), said[0].UnrecordedBytes)

	refused := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo never`}})
	if refused.Status != hostproto.StatusFailed || refused.Reason != hostproto.ReasonHostStorageLow || !strings.Contains(refused.Detail, "under its reserve of 4.0 MiB (runner.minFreeBytes)") {
		t.Fatalf("a start on the full data dir: %+v, want refused host_storage_low", refused)
	}
	if h, err = e.client.Health(ctx); err != nil || h.Storage == nil || !h.Storage.Low {
		t.Fatalf("health storage on the full data dir: %+v %v", h.Storage, err)
	}
	// A retry of the flood is refused the same way.
	if _, err := e.client.Retry(ctx, flood.RunID); err != nil {
		t.Fatal(err)
	}
	if again := e.waitFor(flood.RunID, terminal); again.Reason != hostproto.ReasonHostStorageLow || again.Attempt != 2 {
		t.Fatalf("a retry on the full data dir: %+v", again)
	}

	select {
	case <-e.done:
		t.Fatalf("edge exited:\n%s", e.logs.String())
	default:
	}
	logs := e.logs.String()
	if strings.Contains(logs, "panic") {
		t.Fatalf("edge panicked:\n%s", logs)
	}
	// Beside one line per run and decision (run refused, run ended), the
	// condition itself is logged a few times, not once per chunk of output.
	var warnings []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`) {
			warnings = append(warnings, l)
		}
	}
	t.Logf("%d warnings and errors:\n%s", len(warnings), strings.Join(warnings, "\n"))
	if len(warnings) > 4 || strings.Count(logs, "no space left on device") > 2 {
		t.Fatalf("edge logged %d warnings and errors about the full data dir, want a handful:\n%s", len(warnings), logs)
	}

	// Space returns: runs are admitted again.
	must(t, os.Remove(filler))
	if h, err = e.client.Health(ctx); err != nil || h.Storage == nil || h.Storage.Low {
		t.Fatalf("health storage once space returned: %+v %v", h.Storage, err)
	}
	back := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo back`}})
	if end := e.waitFor(back.RunID, terminal); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("a start once space returned ended %+v", end)
	}
	if out, _ := e.output(back.RunID, 0); !strings.Contains(out, "back") {
		t.Fatalf("output %q", out)
	}
}

// TestEdgeServeOnADataDirOutOfInodes: a task that makes files until the
// data dir has no inode left (its bytes mostly free) leaves the host
// unable to make a run's directories. /healthz says storage is low and
// starts are refused host_storage_low saying why, rather than admitted and
// failed host_unavailable while Fleet goes on routing here; once the task
// ends, its files go with it and runs are admitted again.
func TestEdgeServeOnADataDirOutOfInodes(t *testing.T) {
	e := newEdgeProc(t)
	data := filepath.Join(e.dir, "data")
	mountTmpfs(t, data, 64<<20, "nr_inodes=3000")
	e.runner = `{"user": "nobody", "minFreeBytes": 4194304}`
	e.writeConfig()
	e.start()
	ctx := context.Background()

	hog := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `i=0; while touch f$i 2>/dev/null; do i=$((i+1)); done; echo made $i files; read go`}})
	e.waitOutput(hog.RunID, "files")
	h, err := e.client.Health(ctx)
	if err != nil || h.Storage == nil || !h.Storage.Low || h.Storage.FreeBytes < 32<<20 {
		t.Fatalf("health storage with no inode left: %+v %v", h.Storage, err)
	}
	refused := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo never`}})
	if refused.Status != hostproto.StatusFailed || refused.Reason != hostproto.ReasonHostStorageLow || !strings.Contains(refused.Detail, "free inodes") {
		t.Fatalf("a start with no inode left: %+v, want refused host_storage_low", refused)
	}

	e.input(hog.RunID, "go")
	if end := e.waitFor(hog.RunID, terminal); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("the task making files: %+v", end)
	}
	back := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo back`}})
	if end := e.waitFor(back.RunID, terminal); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("a start once the task making files ended: %+v", end)
	}
}

// TestEdgeServeReclaimsWhatATaskLeftOnAFullDataDir: a task that fills the
// data dir with files of its own (no output) and ends must not leave the
// host refusing every run host_storage_low until its run is purged (a week
// by default): its directories go with its end when the data dir is under
// its reserve, and the next run is admitted and succeeds.
func TestEdgeServeReclaimsWhatATaskLeftOnAFullDataDir(t *testing.T) {
	e := newEdgeProc(t)
	data := filepath.Join(e.dir, "data")
	mountTmpfs(t, data, 32<<20)
	e.runner = `{"user": "nobody", "minFreeBytes": 4194304}`
	e.writeConfig()
	e.start()
	ctx := context.Background()

	hog := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `dd if=/dev/zero of=big bs=1M count=100 >/dev/null 2>&1; exit 0`}})
	if end := e.waitFor(hog.RunID, terminal); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("the task filling the data dir: %+v", end)
	}
	if _, err := os.Stat(filepath.Join(data, "work", hog.RunID)); !os.IsNotExist(err) {
		t.Fatalf("the filling run's directories are still there: %v", err)
	}
	if h, err := e.client.Health(ctx); err != nil || h.Storage == nil || h.Storage.Low {
		t.Fatalf("health storage once the filling run ended: %+v %v", h.Storage, err)
	}
	next := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo next`}})
	if end := e.waitFor(next.RunID, terminal); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("the run after the filling one: %+v", end)
	}
	// An ended run's directories stay while there is room (a retry
	// reuses them).
	if _, err := os.Stat(filepath.Join(data, "work", next.RunID)); err != nil {
		t.Fatalf("a run's directories went though the data dir has room: %v", err)
	}
}

// TestEdgeServeWorkDirFullApart: with runner.workDir on a filesystem of
// its own, a task filling it with files stops new starts
// (host_storage_low) but not the recording of another running task's
// output: the run log's filesystem has room, and the task beside the
// filler succeeds instead of ending storage_full for space it never used.
func TestEdgeServeWorkDirFullApart(t *testing.T) {
	e := newEdgeProc(t)
	data, work := filepath.Join(e.dir, "data"), filepath.Join(e.dir, "work")
	mountTmpfs(t, data, 32<<20)
	mountTmpfs(t, work, 16<<20)
	must(t, os.Chmod(work, 0o755))
	e.runner = fmt.Sprintf(`{"user": "nobody", "minFreeBytes": 4194304, "workDir": %q}`, work)
	e.writeConfig()
	e.start()

	beside := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo waiting; read go; echo beside-the-filler`}})
	e.waitOutput(beside.RunID, "waiting")
	filler := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `dd if=/dev/zero of=big bs=1M count=100 >/dev/null 2>&1; echo filled; read go`}})
	e.waitOutput(filler.RunID, "filled")
	refused := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo never`}})
	if refused.Status != hostproto.StatusFailed || refused.Reason != hostproto.ReasonHostStorageLow {
		t.Fatalf("a start with the work dirs full: %+v, want refused host_storage_low", refused)
	}
	e.input(beside.RunID, "go")
	if end := e.waitFor(beside.RunID, terminal); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("the task beside the filler: %+v", end)
	}
	if out, _ := e.output(beside.RunID, 0); !strings.Contains(out, "beside-the-filler") {
		t.Fatalf("the task beside the filler wrote %q", out)
	}
	e.input(filler.RunID, "go")
	e.waitFor(filler.RunID, terminal)
}
