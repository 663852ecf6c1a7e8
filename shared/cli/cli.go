// Package cli is the runfleet command line: one tree of commands over
// shared/fleetclient (run, runs, hosts, egress, login, logout, completion,
// version), each with its flags, help and examples, from which --help,
// usage errors and the shell completion scripts are all generated.
//
// Its contracts with a caller (README, "Command line"):
//   - Exit codes: 0 the command worked (a run: it succeeded); a failed
//     run's exit code (1 when it has none); 1 an API error or Fleet
//     unreachable; 2 a refused dispatch; 64 a usage error; 130 interrupted.
//   - A run's output goes to stdout exactly as the task printed it (on a
//     terminal, with the sequences that act on the terminal dropped:
//     terminal.go);
//     everything else to stderr, progress only when stderr is a terminal.
//   - The token is never printed: not in an error, not in --json, not in
//     --help.
//
// Main takes everything from the process through Env, so tests drive it
// in-process with buffers and an interrupt channel.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/runfleet/runfleet/shared/fleetclient"
	"github.com/runfleet/runfleet/shared/version"
)

// Exit codes.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitRefused     = 2
	ExitUsage       = 64
	ExitInterrupted = 130
)

// Environment variables the CLI reads.
const (
	EnvAPI     = "RUNFLEET_API"
	EnvToken   = "RUNFLEET_TOKEN"
	EnvProfile = "RUNFLEET_PROFILE"
	// EnvStream is the stream's base URL when it is on another origin than
	// the API (AWS: the StreamUrl output): the token goes to no other.
	EnvStream  = "RUNFLEET_STREAM_URL"
	EnvNoColor = "NO_COLOR"
	EnvXDG     = "XDG_CONFIG_HOME"
)

// Env is what the CLI takes from its process. main wires the real ones;
// tests pass buffers, a map's lookup and their own interrupt channel.
type Env struct {
	// Getenv reads an environment variable; nil reads none.
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// StdinTTY, StdoutTTY and StderrTTY say which are terminals: progress
	// goes to stderr only when it is one, colour only to a terminal.
	StdinTTY, StdoutTTY, StderrTTY bool
	// Home is the user's home directory: the config file is under
	// $XDG_CONFIG_HOME, else Home/.config.
	Home string
	// Interrupt delivers SIGINT and SIGTERM. The first one detaches a
	// followed run (or cancels it, --cancel-on-interrupt) and ends any
	// other command; a second one ends a cancel in flight. Nil: none.
	Interrupt <-chan os.Signal
	// HTTPClient sends the API's requests; nil is fleetclient's own.
	HTTPClient *http.Client
	// Now is the time tables show ages against; nil is time.Now.
	Now func() time.Time
	// Wait waits between retries and before a stream reconnects (the
	// client's Options.Wait); nil waits on a real timer.
	Wait func(ctx context.Context, d time.Duration) error
}

// Main runs the command line args (without the program's name) and
// returns the process's exit code.
func Main(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	if env.Stdout == nil {
		env.Stdout = io.Discard
	}
	if env.Stderr == nil {
		env.Stderr = io.Discard
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	intr := watchInterrupts(ctx, env.Interrupt)
	inv := &invocation{env: env, ctx: intr.ctx, afterFirst: intr.afterFirst, intr: intr, ui: newUI(env)}
	return inv.dispatch(root(), args)
}

// interrupts turns the signals into two contexts: ctx ends at the first
// signal, afterFirst (the cancel a first signal asks for) at the second.
type interrupts struct {
	ctx, afterFirst context.Context
	first           chan struct{}
}

func watchInterrupts(parent context.Context, sig <-chan os.Signal) *interrupts {
	ctx, cancelFirst := context.WithCancel(parent)
	afterFirst, cancelSecond := context.WithCancel(parent)
	in := &interrupts{ctx: ctx, afterFirst: afterFirst, first: make(chan struct{})}
	// With no signals (sig nil) this waits for parent alone: Main ends it.
	go func() {
		defer cancelFirst()
		defer cancelSecond()
		n := 0
		for {
			select {
			case <-parent.Done():
				return
			case <-sig:
				n++
				if n == 1 {
					close(in.first)
					cancelFirst()
					continue
				}
				cancelSecond()
				return
			}
		}
	}()
	return in
}

func (in *interrupts) interrupted() bool {
	select {
	case <-in.first:
		return true
	default:
		return false
	}
}

// invocation is one command being run: its environment, the parsed flags
// and positionals, and where it writes.
type invocation struct {
	env        Env
	ctx        context.Context
	afterFirst context.Context
	intr       *interrupts
	ui         *ui
	cmd        *command
	path       string // "runfleet runs get"
	args       []string
	global     globalFlags
	client     *fleetclient.Client
	target     target
}

// globalFlags are accepted by every command that calls the API.
type globalFlags struct {
	api, profile *string
}

func addGlobalFlags(fs *flagSet) globalFlags {
	return globalFlags{
		api:     fs.String("api", "URL", "Fleet's API (overrides RUNFLEET_API and the profile's)"),
		profile: fs.String("profile", "NAME", "the config file's profile to use (overrides RUNFLEET_PROFILE)"),
	}
}

// usageError is a command line the CLI cannot run: exit 64, with a hint
// to --help.
type usageError struct {
	msg  string
	path string
}

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// dispatch finds the command args name, parses its flags and runs it.
func (inv *invocation) dispatch(cmd *command, args []string) int {
	path := "runfleet"
	i := 0
	// --api and --profile may come before the command too
	// (runfleet --profile prod runs list): they are parsed with its flags.
	var global []string
	for ; i < len(args) && len(cmd.subs) > 0; i++ {
		a := args[i]
		if a == "-h" || a == "--help" {
			inv.ui.printHelp(cmd, path)
			return ExitOK
		}
		if name, _, hasValue := strings.Cut(a, "="); name == "--api" || name == "--profile" {
			global = append(global, a)
			if !hasValue && i+1 < len(args) {
				i++
				global = append(global, args[i])
			}
			continue
		}
		if strings.HasPrefix(a, "-") {
			return inv.usage(path, usagef("unknown flag %s before the command: only --api and --profile go there", a))
		}
		sub := cmd.sub(a)
		if sub == nil {
			msg := fmt.Sprintf("unknown command %q for %s", a, path)
			if s := suggest(a, cmd.subNames()); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			}
			return inv.usage(path, usagef("%s", msg))
		}
		cmd = sub
		path += " " + sub.name
	}
	if cmd.setup == nil {
		// A group without its subcommand: its help, as `gh run` prints.
		inv.ui.printHelp(cmd, path)
		return ExitOK
	}
	inv.cmd, inv.path = cmd, path
	fs := newFlagSet(path)
	run := cmd.setup(fs)
	if !cmd.local {
		inv.global = addGlobalFlags(fs)
	}
	positional, help, err := fs.parse(append(global, args[i:]...))
	if help {
		inv.ui.printHelp(cmd, path)
		return ExitOK
	}
	if err != nil {
		return inv.usage(path, err)
	}
	if err := cmd.checkArgs(path, positional); err != nil {
		return inv.usage(path, err)
	}
	inv.args = positional
	return run(inv)
}

// usage reports a usage error: exit 64.
func (inv *invocation) usage(path string, err error) int {
	inv.ui.errorf("%v", err)
	fmt.Fprintf(inv.ui.err, "Run '%s --help' for usage.\n", path)
	return ExitUsage
}

// connect resolves the API and token and builds the client.
func (inv *invocation) connect() error {
	t, err := inv.resolveTarget()
	if err != nil {
		return err
	}
	c, err := fleetclient.New(fleetclient.Options{BaseURL: t.api, StreamURL: t.stream, Token: t.token, HTTPClient: inv.env.HTTPClient,
		Wait: inv.env.Wait, UserAgent: "runfleet-cli/" + version.Version})
	if err != nil {
		return fmt.Errorf("%s (from %s)", strings.TrimPrefix(err.Error(), "fleetclient: "), t.apiSource)
	}
	inv.client, inv.target = c, t
	return nil
}

// fail reports err as the command's failure and returns its exit code:
// 130 when the command was interrupted, 64 for a usage error, else 1.
func (inv *invocation) fail(err error) int {
	var ue *usageError
	switch {
	case inv.intr.interrupted() && errors.Is(err, context.Canceled):
		inv.ui.errorf("interrupted")
		return ExitInterrupted
	case errors.As(err, &ue):
		return inv.usage(inv.path, err)
	}
	inv.ui.errorf("%s", inv.describe(err))
	return ExitError
}

// describe words an error of the client for a person: what failed and
// what to change. Never the token: the client's errors hold none, and
// neither does anything added here.
func (inv *invocation) describe(err error) string {
	var apiErr *fleetclient.Error
	var foreign *fleetclient.StreamOriginError
	if errors.As(err, &foreign) {
		return fmt.Sprintf("the run's stream is on %[1]s, neither the API's origin nor the configured stream's (nor https from an https API), so the token was not sent there; "+
			"if %[1]s is your Fleet's stream, set %[2]s=%[1]s or run runfleet login --api %[3]s --stream-url %[1]s",
			strings.TrimSuffix(strings.TrimSuffix(foreign.Origin, ":80"), ":443"), EnvStream, inv.target.api)
	}
	if !errors.As(err, &apiErr) {
		msg := strings.TrimPrefix(err.Error(), "fleetclient: ")
		if inv.client == nil {
			return msg
		}
		fix := "check " + inv.target.apiSource
		if inv.target.profile != "" && inv.target.apiSource != "--api" && inv.target.apiSource != EnvAPI {
			fix = "check the profile's API, or log in again: runfleet login --api URL --profile " + inv.target.profile
		}
		return fmt.Sprintf("cannot reach Fleet at %s (from %s): %s; %s", inv.target.api, inv.target.apiSource, msg, fix)
	}
	msg := apiErr.Error()
	switch apiErr.Status {
	case http.StatusUnauthorized:
		return fmt.Sprintf("the API refused the token from %s: %s; run runfleet login --api %s, or set RUNFLEET_TOKEN",
			inv.target.tokenSource, msg, inv.target.api)
	case http.StatusForbidden:
		if apiErr.Code == "admin_required" {
			return msg + ": use an admin's token (--profile NAME, or RUNFLEET_TOKEN)"
		}
		return msg + ": this token's caller is not allowed it; an admin can widen its scope"
	}
	return msg
}

// now is the time of the invocation's tables.
func (inv *invocation) now() time.Time { return inv.env.Now() }

// flagHint is the --api/--profile of this command line, for a hint that
// names a command to run next the same way.
func (inv *invocation) flagHint() string {
	var b strings.Builder
	if inv.global.profile != nil && *inv.global.profile != "" {
		fmt.Fprintf(&b, " --profile %s", *inv.global.profile)
	}
	if inv.global.api != nil && *inv.global.api != "" {
		fmt.Fprintf(&b, " --api %s", *inv.global.api)
	}
	return b.String()
}
