package runlog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// A commit that fails for want of space (bbolt rolls it back and reloads
// its free pages) leaves the log usable: what was stored before reads
// back whole, and once space returns appends go on from the next sequence.
// The runner's storage reserve relies on this (package runner).
func TestAFullFilesystemFailsAppendsWithENOSPCAndLosesNothingStored(t *testing.T) {
	edgetest.RequireRoot(t)
	dir := edgetest.Tmpfs(t, 4<<20)
	path := filepath.Join(dir, "runs.db")
	l, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Close() }()
	if _, _, err := l.Create(Record{RunID: "run-1", ClientToken: "tok", Status: hostproto.StatusRunning, Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}

	chunk := strings.Repeat("x", hostproto.MaxEventData)
	var last int64
	var appendErr error
	for i := 0; i < 1000 && appendErr == nil; i++ {
		var seq int64
		if seq, appendErr = l.Append("run-1", output(chunk)); appendErr == nil {
			last = seq
		}
	}
	if !errors.Is(appendErr, syscall.ENOSPC) {
		t.Fatalf("appending to a full filesystem: %v, want ENOSPC", appendErr)
	}
	t.Logf("after %d events: %v", last, appendErr)
	if last < 10 {
		t.Fatalf("only %d events fit in 3 MiB", last)
	}
	checkEvents := func(want int64) {
		t.Helper()
		var got int64
		for after := int64(0); ; {
			page, err := l.Page("run-1", after, 1000)
			if err != nil {
				t.Fatalf("reading events after a failed commit: %v", err)
			}
			for _, e := range page.Events {
				got++
				if e.Sequence != got {
					t.Fatalf("event %d has sequence %d", got, e.Sequence)
				}
			}
			after = page.NextCursor
			if !page.HasMore {
				break
			}
		}
		if got != want {
			t.Fatalf("%d events read back, want %d", got, want)
		}
	}
	checkEvents(last)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Update("run-1", func(r *Record) error { r.Status = hostproto.StatusFailed; return nil }, output("end")); err != nil {
		t.Fatalf("recording an end once space returned: %v", err)
	}
	checkEvents(last + 1)
	l.Close()
	if l, err = Open(path, nil); err != nil {
		t.Fatalf("reopening: %v", err)
	}
	checkEvents(last + 1)
	if rec, err := l.Get("run-1"); err != nil || rec.Status != hostproto.StatusFailed {
		t.Fatalf("record after reopening: %+v %v", rec, err)
	}
}
