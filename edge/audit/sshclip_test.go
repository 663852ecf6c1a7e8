package audit

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// An SSH request's name is the task's to choose (a subsystem's, a
// channel's, a global request's type: up to an SSH packet, 256 KiB) and
// becomes the run's ledger record's method: it is cut as the method of an
// HTTP request is, in the line and in what the ledger is handed, so a task
// cannot make each of its ledger records (kept on edge, mirrored to Fleet,
// paged and verified there) hundreds of KiB. The caller's entry is not
// changed.
func TestTaskChosenSSHFieldsAreCut(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var got []Entry
	l, err := Open(Config{Dir: dir, Logger: slog.New(slog.DiscardHandler), Ledger: func(batch []Entry) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range batch {
			if e.SSH != nil {
				c := *e.SSH
				e.SSH = &c
			}
			got = append(got, e)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	huge := strings.Repeat("x", 200<<10)
	cmd := &SSHCommand{Request: "subsystem " + huge, Command: `"` + huge + `"`, Repository: huge}
	l.Record(Entry{Task: "run-1", Action: Blocked, Status: 403, Reason: "not allowed", SSH: cmd})
	l.Flush()
	if len(cmd.Request) != len("subsystem ")+len(huge) {
		t.Error("the caller's SSHCommand was changed")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].SSH == nil {
		t.Fatalf("the ledger got %d entries", len(got))
	}
	s := got[0].SSH
	if len(s.Request) > MaxMethodBytes || !strings.HasPrefix(s.Request, "subsystem x") {
		t.Errorf("the ledger got a request of %d bytes, want at most %d", len(s.Request), MaxMethodBytes)
	}
	if len(s.Command) > MaxPathBytes || len(s.Repository) > MaxPathBytes {
		t.Errorf("the ledger got a command of %d bytes and a repository of %d, want at most %d", len(s.Command), len(s.Repository), MaxPathBytes)
	}
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 8<<10 {
		t.Errorf("the audit line is %d bytes", len(b))
	}
}
