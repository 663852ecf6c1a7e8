package runner

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A task starts with the terminal on descriptors 0-2 and nothing else,
// though the process that runs the runner holds a descriptor without
// close-on-exec (as one edge's parent passed down would be), which every
// process it starts inherits, the task's init included.
func TestTaskInheritsDescriptors0To2Alone(t *testing.T) {
	h := newHarness(t, nil)
	stray, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close()
	if _, err := unix.FcntlInt(stray.Fd(), unix.F_SETFD, 0); err != nil {
		t.Fatal(err)
	}
	// ls, a child, lists the shell's descriptors while the shell waits.
	run := h.start(`ls -m /proc/$$/fd; true`, nil)
	h.waitEnd(run.RunID)
	if out := strings.TrimSpace(h.output(run.RunID)); out != "0, 1, 2" {
		t.Fatalf("the task's descriptors: %q, want 0, 1, 2 (the stray one is %d)", out, stray.Fd())
	}
}
