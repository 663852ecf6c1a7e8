// Command edge is runfleet's host binary: the host agent Fleet dispatches to,
// the harness runner with admission, and the secrets proxy with its CA.
//
//	edge serve --config edge.json
//	edge ca bundle|status --config edge.json
//	edge policy check edge.json
//	edge version
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/version"
)

// command runs one subcommand with the rest of the arguments and returns the exit code.
type command func(args []string, stdout, stderr io.Writer) int

func commands() map[string]command {
	return map[string]command{
		"version": runVersion,
		"ca":      runCA,
		"policy":  runPolicy,
		"serve":   runServe,
		// Hidden: edge as a task's init (runner.DefaultTaskInit).
		sandbox.InitArg: runTaskInit,
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 || cmds[args[0]] == nil {
		names := make([]string, 0, len(cmds))
		for n := range cmds {
			if n != sandbox.InitArg {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		fmt.Fprintf(stderr, "usage: edge <%s> ...\n", strings.Join(names, "|"))
		return 2
	}
	return cmds[args[0]](args[1:], stdout, stderr)
}

func runVersion(_ []string, stdout, _ io.Writer) int {
	fmt.Fprintf(stdout, "%s edge %s\n", version.Product, version.Version)
	return 0
}
