package tests

import (
	"os"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// Nothing edge's parent passes down beyond descriptors 0-2 reaches a
// process edge starts. An edge that runs tasks as itself (not root,
// insecureSameUser) starts the agent with no init in between, so only
// edge's own start can keep a descriptor it inherited without
// close-on-exec from the task.
func TestEdgePassesNoInheritedDescriptorOn(t *testing.T) {
	e := newEdgeProc(t)
	configure := e.asUser(65534)
	configure(`{"user": "nobody", "insecureSameUser": true, "egress": "insecureOpen", "limits": "none"}`)
	stray, err := os.Open(os.DevNull)
	must(t, err)
	defer stray.Close()
	e.extraFiles = []*os.File{stray}
	e.start()
	// ls, a child, lists the shell's descriptors while the shell waits.
	r := e.waitFor(e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: "ls -m /proc/$$/fd; true"}}).RunID, terminal)
	if out, _ := e.output(r.RunID, 0); r.Status != hostproto.StatusSucceeded || strings.TrimSpace(out) != "0, 1, 2" {
		t.Fatalf("the task ended %+v with descriptors %q, want 0, 1, 2", r, out)
	}
}
