package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// commandPaths is every runnable command's words ("runs list").
func commandPaths() [][]string {
	var paths [][]string
	var walk func(c *command, path []string)
	walk = func(c *command, path []string) {
		if c.setup != nil {
			paths = append(paths, path)
		}
		for _, s := range c.subs {
			walk(s, append(append([]string{}, path...), s.name))
		}
	}
	walk(root(), nil)
	return paths
}

// TestEveryCommandHasHelpWithAnExample: --help of every command and group
// (and `runfleet help ...`) describes it, lists its flags and shows at
// least one example of itself, on stdout, exit 0.
func TestEveryCommandHasHelpWithAnExample(t *testing.T) {
	f := newFleet(t)
	c := f.asCaller(f.mint("alice"))
	paths := append(commandPaths(), nil, []string{"runs"}, []string{"hosts"})
	if len(paths) < 20 {
		t.Fatalf("only %d commands found", len(paths))
	}
	for _, p := range paths {
		name := strings.TrimSpace("runfleet " + strings.Join(p, " "))
		r := c.run(t, append(p, "--help")...).want(t, 0)
		out := r.stdout.String()
		if !strings.Contains(out, "EXAMPLES\n  ") || !strings.Contains(out, "\n  $ "+name) || !strings.Contains(out, "USAGE\n  "+name) {
			t.Errorf("%s --help lacks its usage or an example of itself:\n%s", name, out)
		}
		if len(p) > 0 && c.run(t, append([]string{"help"}, p...)...).want(t, 0).stdout.String() != out {
			t.Errorf("runfleet help %s differs from %s --help", strings.Join(p, " "), name)
		}
	}
	// -h after positionals, as any flag may be.
	if r := c.run(t, "runs", "get", "fr-x", "-h").want(t, 0); !strings.Contains(r.stdout.String(), "runfleet runs get [flags] RUN") {
		t.Errorf("runs get fr-x -h:\n%s", r.stdout)
	}
}

// TestUsageErrors: an unknown command or flag, a missing or extra argument
// is exit 64 naming it, with a suggestion where one is close, and the way
// to --help.
func TestUsageErrors(t *testing.T) {
	f := newFleet(t)
	c := f.asCaller(f.mint("alice"))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"hots", "list"}, `unknown command "hots" for runfleet; did you mean "hosts"?`},
		{[]string{"runs", "lst"}, `unknown command "lst" for runfleet runs; did you mean "list"?`},
		{[]string{"runs", "list", "--stauts", "x"}, "unknown flag --stauts for runfleet runs list; did you mean --status?"},
		{[]string{"runs", "get"}, "missing RUN: runfleet runs get RUN"},
		{[]string{"runs", "get", "a", "b"}, "too many arguments (2): runfleet runs get RUN"},
		{[]string{"runs", "list", "-json"}, "flags are spelled --name"},
		{[]string{"--json", "runs", "list"}, "unknown flag --json before the command: only --api and --profile go there"},
		{[]string{"--profile", "p", "version"}, "unknown flag --profile for runfleet version"},
		{[]string{"runs", "list", "--limit"}, "flag --limit needs a value: --limit N"},
		{[]string{"completion", "powershell"}, `"powershell": want one of bash, zsh, fish`},
		{[]string{"login", "rft_typed-as-an-argument"}, "runfleet login takes no argument"},
	} {
		r := c.run(t, tc.args...).want(t, ExitUsage)
		if !strings.Contains(r.stderr.String(), tc.want) || !strings.Contains(r.stderr.String(), "--help' for usage") {
			t.Errorf("%v: stderr\n%s\nwant %q and the way to --help", tc.args, r.stderr, tc.want)
		}
		if strings.Contains(r.stderr.String(), "rft_typed") {
			t.Errorf("%v: a token typed as an argument is repeated: %s", tc.args, r.stderr)
		}
	}
}

// TestColourAndProgress: on a terminal, tables are coloured and run shows
// its progress on stderr; NO_COLOR removes the colour (not the progress);
// off a terminal there is neither.
func TestColourAndProgress(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{})
	tok := f.mint("alice")
	stop := make(chan struct{})
	defer close(stop)
	for i, tc := range []struct {
		tty, noColor     bool
		colour, progress bool
	}{
		{tty: true, colour: true, progress: true},
		{tty: true, noColor: true, progress: true},
		{tty: false},
	} {
		c := f.asCaller(tok)
		c.tty = tc.tty
		if tc.noColor {
			c.env[EnvNoColor] = "1"
		}
		r := startedRun(t, f, c, "--", "true")
		child := "run-" + string(rune('1'+i))
		h.AppendOutput(child, "out\n")
		h.SetRun(child, "succeeded", new(int), "")
		if i == 0 {
			f.pump(stop) // drives every session from now on
		}
		r.wait(t).want(t, 0)
		if r.stdout.String() != "out\n" {
			t.Errorf("%+v: stdout %q: the output is never coloured nor framed", tc, r.stdout)
		}
		if got := strings.Contains(r.stderr.String(), "dispatched run fr-"); got != tc.progress {
			t.Errorf("%+v: progress on stderr %v, want %v:\n%s", tc, got, tc.progress, r.stderr)
		}
		list := c.run(t, "runs", "list").want(t, 0)
		hosts := c.run(t, "hosts", "list").want(t, 0)
		for _, out := range []string{list.stdout.String(), hosts.stdout.String(), r.stderr.String()} {
			if got := strings.Contains(out, "\x1b["); got != tc.colour {
				t.Errorf("%+v: colour %v, want %v:\n%q", tc, got, tc.colour, out)
			}
		}
	}
}

// TestEgressCommand: the ledger as a table with its summary, --limit,
// --json as one egress page, and --verify.
func TestEgressCommand(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{})
	c := f.asCaller(f.mint("alice"))
	id := runIDOf(t, c.run(t, "run", "--agent", "shell", "--detach", "--", "true").want(t, 0).stdout.String())
	h.AddEgress("run-1",
		egress.Record{Via: egress.ViaProxy, Authority: "api.example.com:443", Method: "GET", Path: "/v1/items?page=*", Status: 200,
			BytesUp: 120, BytesDown: 2048, Keys: []string{"acme/API_KEY"}, Action: egress.Substituted},
		egress.Record{Via: egress.ViaDNS, Authority: "exfil.example.net", Action: egress.Blocked, Reason: "name_not_granted"},
		egress.Record{Via: egress.ViaProxy, Authority: "paste.example.com:443", Method: "POST", Path: "/p", Status: 403,
			Keys: []string{"acme/API_KEY"}, Action: egress.Blocked, Reason: egress.AlertRealValue, Alert: egress.AlertRealValue})
	h.SetRun("run-1", "succeeded", new(int), "")
	f.sweep()

	r := c.run(t, "egress", id).want(t, 0)
	out := r.stdout.String()
	for _, want := range []string{"SEQ  TIME", "substituted  proxy  GET api.example.com:443/v1/items?page=*  200     acme/API_KEY",
		"exfil.example.net", "ALERT real_value_from_task"} {
		if !strings.Contains(out, want) {
			t.Errorf("egress table lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(r.stderr.String(), "3 requests, 2 blocked") || !strings.Contains(r.stderr.String(), "1 ALERTS") ||
		!strings.Contains(r.stderr.String(), "Sealed by the host at 3 records") {
		t.Errorf("egress summary:\n%s", r.stderr)
	}

	var page fleetapi.EgressPage
	r = c.run(t, "egress", id, "--limit", "2", "--json").want(t, 0)
	if err := json.Unmarshal([]byte(r.stdout.String()), &page); err != nil || len(page.Records) != 2 || !page.HasMore || page.Summary == nil {
		t.Errorf("egress --limit 2 --json: %s (%v)", r.stdout, err)
	}
	r = c.run(t, "egress", id, "--verify").want(t, 0)
	if !strings.Contains(r.stderr.String(), "Verified: 3 records") {
		t.Errorf("egress --verify:\n%s", r.stderr)
	}
}

// TestCompletionScripts: each script parses in its shell, and completes
// commands, subcommands, flags and a flag's values as a user types them
// (bash and fish are asked; zsh is parsed).
func TestCompletionScripts(t *testing.T) {
	f := newFleet(t)
	c := f.newCLI(nil)
	dir := t.TempDir()
	scripts := map[string]string{}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		r := c.run(t, "completion", shell).want(t, 0)
		scripts[shell] = filepath.Join(dir, "runfleet."+shell)
		if err := os.WriteFile(scripts[shell], []byte(r.stdout.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		// Every command and flag of the tree is in every script.
		for _, p := range commandPaths() {
			for _, w := range p {
				if !strings.Contains(r.stdout.String(), w) {
					t.Errorf("the %s script lacks the command %s", shell, w)
				}
			}
		}
		for _, flag := range []string{"cancel-on-interrupt", "idempotency-key", "with-token", "verify", "newline"} {
			if !strings.Contains(r.stdout.String(), flag) {
				t.Errorf("the %s script lacks --%s", shell, flag)
			}
		}
	}

	if out, err := exec.Command("bash", "-n", scripts["bash"]).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	// COMP_WORDS as bash splits a line typed so far; the last word is the
	// one being completed.
	for line, want := range map[string]string{
		"runfleet ":                               "run runs hosts capacity egress login logout completion version help",
		"runfleet ru":                             "run runs",
		"runfleet runs ":                          "list get logs follow input cancel retry",
		"runfleet runs list --st":                 "--status",
		"runfleet runs list --status ":            strings.Join(runStatuses, " "),
		"runfleet runs list --status run":         "running",
		"runfleet --api http://x runs li":         "list",
		"runfleet runs list --agent shell --li":   "--limit",
		"runfleet completion ":                    "bash zsh fish",
		"runfleet run --agent shell -- echo --js": "",
	} {
		words := strings.Fields(line)
		if strings.HasSuffix(line, " ") {
			words = append(words, "''")
		}
		script := ". " + scripts["bash"] + "\nCOMP_WORDS=(" + strings.Join(words, " ") + ")\nCOMP_CWORD=" +
			strconv.Itoa(len(words)-1) + "\n_runfleet\necho \"${COMPREPLY[*]}\"\n"
		out, err := exec.Command("bash", "-c", script).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("bash completes %q as %q (%v), want %q", line, strings.TrimSpace(string(out)), err, want)
		}
	}

	// infra/scripts/test-deps.sh installs both shells (make deps).
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		t.Fatal("zsh is not installed: run infra/scripts/test-deps.sh (make deps)")
	}
	if out, err := exec.Command(zsh, "-n", scripts["zsh"]).CombinedOutput(); err != nil {
		t.Errorf("zsh -n: %v\n%s", err, out)
	}
	if fish, err := exec.LookPath("fish"); err == nil {
		if out, err := exec.Command(fish, "-n", scripts["fish"]).CombinedOutput(); err != nil {
			t.Errorf("fish -n: %v\n%s", err, out)
		}
		for line, want := range map[string]string{
			"runfleet runs l":               "list\tList the runs this token may see, newest first\nlogs\tPrint a run's output so far, then exit",
			"runfleet runs list --status s": "succeeded\tonly runs with this status",
			"runfleet hosts drain --js":     "--json\tprint the API's answer as JSON",
		} {
			cmd := exec.Command(fish, "--no-config", "-c", "source "+scripts["fish"]+"; complete -C '"+line+"'")
			out, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != want {
				t.Errorf("fish completes %q as %q (%v), want %q", line, strings.TrimSpace(string(out)), err, want)
			}
		}
	} else {
		t.Fatal("fish is not installed: run infra/scripts/test-deps.sh (make deps)")
	}
}
