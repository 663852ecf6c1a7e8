package runner

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/internal/throttle"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// freeSpace is a Disk whose free space the test sets.
type freeSpace struct{ free atomic.Int64 }

func (d *freeSpace) FreeBytes() (int64, error) { return d.free.Load(), nil }

func newFreeSpace(n int64) *freeSpace {
	d := &freeSpace{}
	d.free.Store(n)
	return d
}

// notRecorded finds the one event saying the run's output was not all
// recorded and returns its count of bytes.
func notRecorded(t *testing.T, events []hostproto.Event) int64 {
	t.Helper()
	l := edgetest.LimitsReached(t, events)
	if len(l) != 1 || l[0].Limit != hostproto.LimitStorage || !strings.Contains(l[0].Detail, strconv.FormatInt(l[0].UnrecordedBytes, 10)+" bytes of output were not recorded") {
		t.Fatalf("limit events %+v, want one saying output was not recorded", l)
	}
	return l[0].UnrecordedBytes
}

// floodAfter is a task that says "up", waits for the test's marker and
// then writes output without end.
func floodAfter(marker string) string {
	return `echo up; while [ ! -e ` + marker + ` ]; do sleep 0.01; done; yes 0123456789`
}

func TestOutputUnderTheEndReserveEndsTheRunStorageFull(t *testing.T) {
	disk := newFreeSpace(10 << 30)
	h := newHarness(t, func(c *Config) { c.Disk = disk; c.MinFreeBytes = 1 << 30 })
	marker := filepath.Join(sharedDir(t), "go")
	run := h.start(floodAfter(marker), nil)
	h.waitOutput(run.RunID, "up")

	// Under the reserve (1 GiB) but over the quarter kept for ends.
	disk.free.Store(512 << 20)
	refused := h.start(`echo never`, nil)
	if refused.Status != hostproto.StatusFailed || refused.Reason != hostproto.ReasonHostStorageLow || !strings.Contains(refused.Detail, "512.0 MiB free, under its reserve of 1.0 GiB") {
		t.Fatalf("a start under the reserve: %+v, want host_storage_low naming both sizes", refused)
	}
	if out := h.output(refused.RunID); out != "" {
		t.Fatalf("a refused run has output %q", out)
	}
	// The running run still records its output meanwhile.
	if err := os.WriteFile(marker+"-not-yet", nil, 0o644); err != nil {
		t.Fatal(err)
	}

	disk.free.Store(200 << 20)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonStorageFull || end.ExitCode == nil || *end.ExitCode != 128+9 {
		t.Fatalf("the flooding run ended %+v, want failed storage_full, killed", end)
	}
	if !strings.Contains(end.Detail, "(200.0 MiB free) under the 256.0 MiB its reserve (runner.minFreeBytes, 1.0 GiB) keeps for recording runs' ends") || !strings.Contains(end.Detail, "bytes not recorded") {
		t.Fatalf("end detail %q", end.Detail)
	}
	out := h.output(run.RunID)
	if !strings.HasPrefix(out, "up") || strings.Contains(out, "0123456789") {
		t.Fatalf("recorded output %q, want what came before the reserve was reached and none after", out)
	}
	if n := notRecorded(t, h.events(run.RunID)); n <= 0 || !strings.Contains(end.Detail, "("+strconv.FormatInt(n, 10)+" bytes not recorded)") {
		t.Fatalf("the notice counts %d bytes; the end says %q", n, end.Detail)
	}
	states := h.states(run.RunID)
	if last := states[len(states)-1]; last.Reason != hostproto.ReasonStorageFull {
		t.Fatalf("the last event is %+v, want the storage_full end", last)
	}

	// Space returns: runs are admitted again.
	disk.free.Store(2 << 30)
	again := h.start(`echo back`, nil)
	if end := h.waitEnd(again.RunID); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("a start once space returned ended %+v", end)
	}
}

// Something other than output filling the disk (a task's files, another
// program) is not seen before a write fails: the failed write itself ends
// the run, and its end is still recorded (from the run log's own free
// pages, or the ballast's space).
func TestAWriteRefusedForSpaceEndsTheRunStorageFullAndRecordsTheEnd(t *testing.T) {
	dataDir := edgetest.Tmpfs(t, 8<<20)
	// The Disk sees plenty, as it does between its check and another
	// writer taking the rest: only the run log's failing write tells.
	disk := newFreeSpace(1 << 40)
	h := newHarness(t, func(c *Config) { c.Disk = disk; c.MinFreeBytes = 2 << 20 })
	h.close()
	h.dbPath = filepath.Join(dataDir, "runs.db")
	h.open(nil, nil)
	ballastPath := filepath.Join(dataDir, ballastName)
	if fi, err := os.Stat(ballastPath); err != nil || fi.Size() != ballastBytes(2<<20) {
		t.Fatalf("ballast %v %v, want %d bytes", fi, err, ballastBytes(2<<20))
	}

	marker := filepath.Join(sharedDir(t), "go")
	run := h.start(floodAfter(marker), nil)
	h.waitOutput(run.RunID, "up")
	filler := filepath.Join(dataDir, "filler")
	edgetest.Fill(t, filler)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	end := h.waitEnd(run.RunID)
	if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonStorageFull || !strings.Contains(end.Detail, "the host's data dir is full") {
		t.Fatalf("the run ended %+v, want failed storage_full", end)
	}
	out := h.output(run.RunID)
	if !strings.HasPrefix(out, "up") || notRecorded(t, h.events(run.RunID)) <= 0 {
		t.Fatalf("output %q", out)
	}
	// Space returns: the ballast is there (made again if the end took it), and runs run.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if s := h.r.Storage(); s.Low {
		t.Fatalf("storage %+v once space returned", s)
	}
	if _, err := os.Stat(ballastPath); err != nil {
		t.Fatalf("the ballast was not made again: %v", err)
	}
	again := h.start(`echo back`, nil)
	if end := h.waitEnd(again.RunID); end.Status != hostproto.StatusSucceeded || !strings.Contains(h.output(again.RunID), "back") {
		t.Fatalf("a run once space returned ended %+v", end)
	}
}

func TestStatFSReadsTheLeastFreeSpace(t *testing.T) {
	edgetest.RequireRoot(t)
	small := edgetest.Tmpfs(t, 1<<20)
	free, err := StatFS{Paths: []string{t.TempDir(), small}}.FreeBytes()
	if err != nil || free != 1<<20 {
		t.Fatalf("free = %d, %v; want the 1 MiB tmpfs's", free, err)
	}
	if err := os.WriteFile(filepath.Join(small, "f"), make([]byte, 256<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	if free, _ = (StatFS{Paths: []string{small}}).FreeBytes(); free != 768<<10 {
		t.Fatalf("free = %d after writing 256 KiB, want %d", free, 768<<10)
	}
	if _, err := (StatFS{Paths: []string{filepath.Join(small, "missing")}}).FreeBytes(); err == nil {
		t.Fatal("a missing path reads")
	}
}

// The ballast's space goes to a write refused for want of space, which is
// tried again; the ballast is made again once there is room.
func TestTheBallastGivesItsSpaceToAWriteRefusedForSpace(t *testing.T) {
	edgetest.RequireRoot(t)
	dir := edgetest.Tmpfs(t, 1<<20)
	disk := StatFS{Paths: []string{dir}}
	b := &ballast{path: filepath.Join(dir, ballastName), size: 256 << 10}
	if err := b.fill(); err != nil {
		t.Fatal(err)
	}
	if free, _ := disk.FreeBytes(); free != 768<<10 {
		t.Fatalf("%d bytes free beside the ballast, want its 256 KiB taken", free)
	}
	filler := filepath.Join(dir, "filler")
	edgetest.Fill(t, filler)
	// A ballast a previous edge left is taken up on a full disk.
	b = &ballast{path: b.path, size: b.size}
	if err := b.fill(); err != nil || !b.isHeld() {
		t.Fatalf("taking up a ballast left on a full disk: %v", err)
	}
	r := &Runner{cfg: Config{Disk: disk, MinFreeBytes: 64 << 10}, ballast: b, logs: throttle.New(slog.New(slog.DiscardHandler), clock.Real{}, time.Minute)}

	end := filepath.Join(dir, "end")
	writes := 0
	err := r.record("run-1", func() error { writes++; return os.WriteFile(end, make([]byte, 128<<10), 0o600) })
	if err != nil || writes != 2 {
		t.Fatalf("record = %v after %d writes, want the second to succeed", err, writes)
	}
	if _, err := os.Stat(b.path); !errors.Is(err, fs.ErrNotExist) || b.isHeld() {
		t.Fatalf("the ballast is still held (%v)", err)
	}
	// Without a ballast a refused write is refused.
	if err := r.record("run-1", func() error { return os.WriteFile(end+"2", make([]byte, 256<<10), 0o600) }); !noSpace(err) {
		t.Fatalf("a second write on a full disk: %v, want ENOSPC", err)
	}

	// No room for it yet: not made (the reserve and the ballast must fit).
	if _, err := r.freeBytes(); err != nil || b.isHeld() {
		t.Fatalf("the ballast was made on a full disk (%v)", err)
	}
	os.Remove(filler)
	free, err := r.freeBytes()
	if err != nil || !b.isHeld() {
		t.Fatalf("the ballast was not made again once space returned (%v)", err)
	}
	if st, _ := disk.FreeBytes(); st != free {
		t.Fatalf("freeBytes says %d, the disk %d: the ballast's space is not counted free", free, st)
	}
}

// A restart on a full data dir still records the ends of the runs a crash
// left live, and refuses new ones. The ballast's space is what records
// them: without it the third end fails with ENOSPC and the runner cannot
// start (seen with record's release disabled).
func TestARestartOnAFullDataDir(t *testing.T) {
	dataDir := edgetest.Tmpfs(t, 2<<20)
	h := newHarness(t, func(c *Config) { c.MinFreeBytes = 1 << 20 })
	h.close()
	h.dbPath = filepath.Join(dataDir, "runs.db")
	h.cfg.Disk = StatFS{Paths: []string{dataDir}}
	h.open(nil, nil)
	if _, err := os.Stat(filepath.Join(dataDir, ballastName)); err != nil {
		t.Fatalf("no ballast: %v", err)
	}
	now := time.Now()
	for i := range 3 {
		id := "run-crashed-" + strconv.Itoa(i)
		h.log.Create(runlog.Record{RunID: id, ClientToken: id, Status: hostproto.StatusRunning, Attempt: 1, CreatedAt: now},
			stateEntry(now, hostproto.StateChange{Status: hostproto.StatusRunning, Attempt: 1}))
	}
	h.close()
	edgetest.Fill(t, filepath.Join(dataDir, "filler"))

	h.open(nil, nil)
	for i := range 3 {
		run, err := h.r.Get("run-crashed-" + strconv.Itoa(i))
		if err != nil || run.Status != hostproto.StatusFailed || run.Reason != hostproto.ReasonHostRestarted {
			t.Fatalf("after a restart on a full data dir: %+v, %v", run, err)
		}
	}
	if s := h.r.Storage(); !s.Low || s.FreeBytes >= 1<<20 {
		t.Fatalf("storage %+v on a full data dir", s)
	}
	if run := h.start(`echo never`, nil); run.Reason != hostproto.ReasonHostStorageLow {
		t.Fatalf("a start on a full data dir: %+v", run)
	}
}
