package main

import (
	"io"

	"github.com/runfleet/runfleet/edge/sandbox"
)

// runTaskInit is `edge task-init`, hidden: edge starts itself so to be a
// task's init in the task's own namespaces (package sandbox); its spec and
// reports travel on inherited descriptors, never on the command line.
func runTaskInit(_ []string, _, _ io.Writer) int {
	return sandbox.Main()
}
