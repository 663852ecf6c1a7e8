package host

import (
	"os"
	"syscall"
	"testing"

	"github.com/runfleet/runfleet/edge/sandbox"
)

// TestMain lets this test binary act as each task's init: as root the
// runner starts tasks through the binary running it (runner.DefaultTaskInit).
// The init exits through syscall.Exit, skipping the race detector's
// one-second pause at exit, which every task would otherwise wait out.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == sandbox.InitArg {
		syscall.Exit(sandbox.Main())
	}
	os.Exit(m.Run())
}
