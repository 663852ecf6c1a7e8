// Command edge is runfleet's host binary: the host agent Fleet dispatches to,
// the harness runner with admission, and the secrets proxy with its CA.
//
//	edge serve --config edge.json
//	edge ca bundle|status --config edge.json
//	edge config check --config edge.json (alias: edge policy check)
//	edge version
//	edge help [command]
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/version"
)

// configDocs says where a user finds the config a command reads.
const configDocs = `The config: README.md, "Configuration (edge)"; every key in an example: infra/edge.example.json.`

// configFlag names the config file for every command that reads one.
const configFlag = "config"

// configFlagVar declares --config on fs.
func configFlagVar(fs *flag.FlagSet) *string {
	return fs.String(configFlag, "", "read the config from `edge.json` (relative paths in it resolve against its folder)")
}

// A command is one of edge's subcommands. Its flags live on a flag.FlagSet
// that both parses them and generates the usage edge prints, so the usage
// cannot drift from what the command accepts.
type command struct {
	// name is the command as typed after "edge": "serve", "ca bundle".
	name string
	// purpose is its line in the command list.
	purpose string
	// about, when set, says more in the command's own usage.
	about string
	// required are the flags that must be given.
	required []string
	// readsConfig points the usage at where the config is documented.
	readsConfig bool
	// flags declares the command's flags on fs and returns what runs once
	// they are parsed. A command takes no operands (checkGiven refuses them).
	flags func(fs *flag.FlagSet) action
}

// action runs a command and returns edge's exit code.
type action func(stdout, stderr io.Writer) int

// commands are edge's commands in the order its usage lists them. task-init
// is not one: it is edge as a task's init (runner.DefaultTaskInit), never
// typed by a user, and dispatched before these.
func commands() []*command {
	return []*command{serveCommand(), caCommand("bundle"), caCommand("status"),
		configCheckCommand("config check"), configCheckCommand("policy check"), versionCommand()}
}

func main() {
	// A descriptor edge's parent passed down without close-on-exec would
	// reach every process edge starts (git, nft, a task's init, and a task
	// edge runs as itself): from here on a child gets what it is handed.
	if err := sandbox.CloseExtraFilesOnExec(); err != nil {
		fmt.Fprintf(os.Stderr, "edge: %v\n", err)
		os.Exit(1)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is edge with its arguments. Asked for help (edge, edge help, -h,
// --help) it prints to stdout and returns 0; a wrong invocation prints what
// is wrong and the usage to stderr and returns 2.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == sandbox.InitArg {
		return runTaskInit(args[1:], stdout, stderr)
	}
	cmds := commands()
	if len(args) == 0 {
		printUsage(stdout, cmds, "")
		return 0
	}
	if args[0] == "help" || isHelpFlag(args[0]) {
		return runHelp(cmds, args[1:], stdout, stderr)
	}
	cmd, rest, group := lookup(cmds, args)
	switch {
	case cmd != nil:
		return cmd.run(rest, stdout, stderr)
	case group != "" && len(rest) == 1 && isHelpFlag(rest[0]):
		printUsage(stdout, cmds, group)
		return 0
	case group != "" && len(rest) == 0:
		fmt.Fprintf(stderr, "edge %s: a command is missing\n\n", group)
	case group != "":
		fmt.Fprintf(stderr, "edge %s: unknown command %q\n\n", group, rest[0])
	default:
		fmt.Fprintf(stderr, "edge: unknown command %q\n\n", args[0])
	}
	printUsage(stderr, cmds, group)
	return 2
}

// runHelp is `edge help [command]`.
func runHelp(cmds []*command, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printUsage(stdout, cmds, "")
		return 0
	}
	cmd, rest, group := lookup(cmds, args)
	switch {
	case cmd != nil && len(rest) == 0:
		fs, _ := cmd.flagSet()
		cmd.printUsage(stdout, fs)
		return 0
	case cmd == nil && group != "" && len(rest) == 0:
		printUsage(stdout, cmds, group)
		return 0
	}
	fmt.Fprintf(stderr, "edge help: unknown command %q\n\n", strings.Join(args, " "))
	printUsage(stderr, cmds, "")
	return 2
}

func isHelpFlag(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}

// lookup finds the command args begin with and returns the arguments after
// its name. When none matches but args[0] is the first word of commands
// (edge ca ...), group is that word and rest what follows it.
func lookup(cmds []*command, args []string) (cmd *command, rest []string, group string) {
	for _, c := range cmds {
		words := strings.Fields(c.name)
		if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == c.name {
			return c, args[len(words):], ""
		}
		if len(words) > 1 && words[0] == args[0] {
			group = words[0]
		}
	}
	if group != "" {
		rest = args[1:]
	}
	return nil, rest, group
}

// flagSet is the command's flags, declared on a fresh set that prints
// nothing itself (run and printUsage say what is wrong and where), and what
// runs once they are parsed.
func (c *command) flagSet() (*flag.FlagSet, action) {
	fs := flag.NewFlagSet("edge "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs, c.flags(fs)
}

// run parses the command's flags, then runs it: -h or --help
// prints its usage to stdout (exit 0); a bad flag, a missing required flag or
// an operand print what is wrong and its usage to stderr (exit 2).
func (c *command) run(args []string, stdout, stderr io.Writer) int {
	fs, act := c.flagSet()
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		c.printUsage(stdout, fs)
		return 0
	}
	if err == nil {
		err = c.checkGiven(fs)
	}
	if err != nil {
		fmt.Fprintf(stderr, "edge %s: %v\n\n", c.name, err)
		c.printUsage(stderr, fs)
		return 2
	}
	return act(stdout, stderr)
}

// checkGiven reports a required flag left out or an operand. A config
// given as an operand, as edge policy check once took it, gets the
// spelling every command takes.
func (c *command) checkGiven(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range c.required {
		if set[name] {
			continue
		}
		if name == configFlag && fs.NArg() == 1 {
			return fmt.Errorf("--%s is required: write edge %s --%s %s", name, c.name, name, fs.Arg(0))
		}
		return fmt.Errorf("--%s is required", name)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// synopsis is the command line: required flags and [optional flags], from
// the flag set.
func (c *command) synopsis(fs *flag.FlagSet) string {
	parts := []string{"edge", c.name}
	required := map[string]bool{}
	for _, name := range c.required {
		required[name] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		s := "--" + f.Name
		if arg, _ := flag.UnquoteUsage(f); arg != "" {
			s += " " + arg
		}
		if !required[f.Name] {
			s = "[" + s + "]"
		}
		parts = append(parts, s)
	})
	return strings.Join(parts, " ")
}

// printUsage is the command's usage: its synopsis, what it does, each flag.
func (c *command) printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", c.synopsis(fs), c.purpose)
	if c.about != "" {
		fmt.Fprintf(w, "\n%s\n", c.about)
	}
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		if n == 0 {
			fmt.Fprintf(w, "\nflags:\n")
		}
		n++
		arg, usage := flag.UnquoteUsage(f)
		if arg != "" {
			arg = " " + arg
		}
		fmt.Fprintf(w, "  --%s%s\n        %s", f.Name, arg, usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
	if c.readsConfig {
		fmt.Fprintf(w, "\n%s\n", configDocs)
	}
}

// printUsage lists the commands whose name starts with group ("" for all):
// each one's synopsis and purpose.
func printUsage(w io.Writer, cmds []*command, group string) {
	prefix := "edge"
	if group != "" {
		prefix += " " + group
	} else {
		fmt.Fprintf(w, "edge is runfleet's host binary: the host API Fleet dispatches runs to, the harness\n"+
			"runner with admission, and the TLS-intercepting secrets proxy with its CA.\n\n")
	}
	fmt.Fprintf(w, "usage: %s <command> [flags]\n\ncommands:\n", prefix)
	for _, c := range cmds {
		if group == "" || strings.HasPrefix(c.name, group+" ") {
			fs, _ := c.flagSet()
			fmt.Fprintf(w, "  %s\n        %s\n", c.synopsis(fs), c.purpose)
		}
	}
	if group == "" {
		fmt.Fprintf(w, "  edge help [command]\n        Print this usage, or a command's.\n")
	}
	fmt.Fprintf(w, "\nA command's usage and flags: %s <command> --help (or edge help %s<command>).\n%s\n",
		prefix, strings.TrimPrefix(prefix+" ", "edge "), configDocs)
}

func versionCommand() *command {
	return &command{
		name:    "version",
		purpose: "Print edge's version.",
		flags: func(*flag.FlagSet) action {
			return func(stdout, _ io.Writer) int {
				fmt.Fprintf(stdout, "%s edge %s\n", version.Product, version.Version)
				return 0
			}
		},
	}
}
