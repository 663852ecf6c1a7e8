package cli

import (
	"fmt"
	"io"
	"strings"
)

// command is one node of the tree: a group (subs) or a runnable command
// (setup). --help, usage errors and the completion scripts are all read
// from this tree, so a command added here is complete everywhere.
type command struct {
	name    string
	summary string // one line, no final period
	// args is the positional part of the usage line ("RUN", "-- PROMPT...").
	args string
	// minArgs and maxArgs bound the positionals; maxArgs -1 is unbounded.
	minArgs, maxArgs int
	// argValues are the first positional's values, when it is one of a
	// few (completion's shells): checked, and offered by completion.
	argValues []string
	long      string
	// examples are command lines, each optionally preceded by "# why" lines.
	examples []string
	subs     []*command
	// local: the command never calls the API (no --api, --profile).
	local bool
	// setup defines the command's flags on fs and returns what runs it.
	setup func(fs *flagSet) func(*invocation) int
}

func (c *command) sub(name string) *command {
	for _, s := range c.subs {
		if s.name == name {
			return s
		}
	}
	return nil
}

func (c *command) subNames() []string {
	names := make([]string, len(c.subs))
	for i, s := range c.subs {
		names[i] = s.name
	}
	return names
}

// checkArgs checks the positionals' count (and values, where fixed).
func (c *command) checkArgs(path string, args []string) error {
	switch {
	case len(args) < c.minArgs:
		return usagef("missing %s: %s %s", strings.Fields(strings.TrimPrefix(c.args, "-- "))[len(args)], path, c.args)
	case c.maxArgs >= 0 && len(args) > c.maxArgs && c.args == "":
		// The extra argument is not quoted: it may be a secret typed in
		// the wrong place (runfleet login TOKEN).
		return usagef("%s takes no argument (got %d)", path, len(args))
	case c.maxArgs >= 0 && len(args) > c.maxArgs:
		return usagef("too many arguments (%d): %s %s", len(args), path, c.args)
	}
	if len(c.argValues) > 0 && len(args) > 0 && !contains(c.argValues, args[0]) {
		return usagef("%q: want one of %s", args[0], strings.Join(c.argValues, ", "))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// root is the whole command tree.
func root() *command {
	r := &command{
		name:    "runfleet",
		summary: "Dispatch runs to a runfleet fleet and follow them",
		long: "runfleet talks to Fleet's API: it dispatches runs and follows their output live, lists and\n" +
			"inspects runs and hosts, and reads a run's egress ledger. It reads the API and the token from\n" +
			"RUNFLEET_API and RUNFLEET_TOKEN, or from the profile `runfleet login` saved; --api and\n" +
			"--profile, on any command that calls the API, override them.",
		examples: []string{
			"# log in once (the token is read from stdin)",
			"runfleet login --api http://127.0.0.1:8080 < .dev/demo-caller-token",
			"# run a task and follow its output to the end; the exit code is the task's",
			"runfleet run --agent shell -- echo hello",
			"runfleet runs list --status running",
		},
	}
	r.subs = []*command{runCmd(), runsCmd(), hostsCmd(), capacityCmd(), egressCmd(), loginCmd(), logoutCmd(), completionCmd(), versionCmd(), helpCmd()}
	return r
}

// helpCmd is `runfleet help [COMMAND...]`, as gh has it.
func helpCmd() *command {
	return &command{
		name: "help", summary: "Show help for a command", args: "[COMMAND...]", maxArgs: -1, local: true,
		examples: []string{"runfleet help runs list"},
		setup: func(fs *flagSet) func(*invocation) int {
			return func(inv *invocation) int {
				cmd, path := root(), "runfleet"
				for _, name := range inv.args {
					sub := cmd.sub(name)
					if sub == nil {
						return inv.usage(path, usagef("unknown command %q for %s", name, path))
					}
					cmd, path = sub, path+" "+name
				}
				inv.ui.printHelp(cmd, path)
				return ExitOK
			}
		},
	}
}

// printHelp writes cmd's help to stdout: usage, description, commands or
// flags, and examples.
func (u *ui) printHelp(cmd *command, path string) {
	w := u.out
	fmt.Fprintf(w, "%s\n\n", cmd.summary)
	if cmd.long != "" {
		fmt.Fprintf(w, "%s\n\n", cmd.long)
	}
	if len(cmd.subs) > 0 {
		fmt.Fprintf(w, "USAGE\n  %s <command> [flags]\n\n", path)
		fmt.Fprintf(w, "COMMANDS\n")
		width := 0
		for _, s := range cmd.subs {
			width = max(width, len(s.name))
		}
		for _, s := range cmd.subs {
			fmt.Fprintf(w, "  %-*s  %s\n", width, s.name, s.summary)
		}
		fmt.Fprintln(w)
	} else {
		usage := path
		fs := newFlagSet(path)
		cmd.setup(fs)
		if !cmd.local {
			addGlobalFlags(fs)
		}
		if len(fs.order) > 0 {
			usage += " [flags]"
		}
		if cmd.args != "" {
			usage += " " + cmd.args
		}
		fmt.Fprintf(w, "USAGE\n  %s\n\n", usage)
		fmt.Fprintf(w, "FLAGS\n")
		fs.writeFlags(w)
		fmt.Fprintln(w)
	}
	writeExamples(w, cmd.examples)
	if len(cmd.subs) > 0 {
		fmt.Fprintf(w, "Run '%s <command> --help' for a command's flags and examples.\n", path)
	}
}

func writeExamples(w io.Writer, examples []string) {
	fmt.Fprintf(w, "EXAMPLES\n")
	for _, e := range examples {
		if strings.HasPrefix(e, "#") {
			fmt.Fprintf(w, "  %s\n", e)
			continue
		}
		fmt.Fprintf(w, "  $ %s\n", e)
	}
	fmt.Fprintln(w)
}

// suggest is the candidate closest to s within two edits, or "".
func suggest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
