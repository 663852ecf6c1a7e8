package main

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/version"
)

// The commands a user types, with the flags each takes, as README.md
// documents them: the usage must name each one.
var userCommands = []struct {
	words []string
	flags []string
}{
	{[]string{"serve"}, []string{"--config edge.json"}},
	{[]string{"ca", "bundle"}, []string{"--config edge.json"}},
	{[]string{"ca", "status"}, []string{"--config edge.json"}},
	{[]string{"config", "check"}, []string{"--config edge.json"}},
	{[]string{"policy", "check"}, []string{"--config edge.json"}},
	{[]string{"version"}, nil},
}

// Where the usage sends a user for the config; both must exist.
const (
	readmeConfig  = `README.md, "Configuration (edge)"`
	exampleConfig = "infra/edge.example.json"
)

func TestConfigDocsTheUsageNamesExist(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "\n## Configuration (edge)\n") {
		t.Errorf("README.md has no section %q, which edge's usage points to", "Configuration (edge)")
	}
	if _, err := os.Stat("../" + exampleConfig); err != nil {
		t.Errorf("edge's usage points to %s: %v", exampleConfig, err)
	}
}

// edge, edge help, edge --help, edge -h: one usage on stdout, exit 0, naming
// each command with its purpose and flags, how to get a command's usage and
// where the config is documented; never the hidden task-init.
func TestUsageOnRequest(t *testing.T) {
	code, usage, errOut := runCmd(t)
	if code != 0 || errOut != "" {
		t.Fatalf("edge: exit %d, stderr %q; want the usage on stdout and exit 0", code, errOut)
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}, {"-help"}} {
		code, out, errOut := runCmd(t, args...)
		if code != 0 || errOut != "" || out != usage {
			t.Errorf("edge %s: exit %d, stderr %q, stdout\n%s\nwant exit 0 and the usage edge prints:\n%s", args[0], code, errOut, out, usage)
		}
	}
	for _, c := range userCommands {
		line := "  edge " + strings.Join(append(c.words, c.flags...), " ")
		if !strings.Contains(usage, line+"\n") && !strings.Contains(usage, line+" ") {
			t.Errorf("the usage lacks the line %q:\n%s", line, usage)
		}
	}
	for _, c := range commands() {
		fs, _ := c.flagSet()
		want := "  " + c.synopsis(fs) + "\n        " + c.purpose + "\n"
		if c.purpose == "" || strings.Contains(c.purpose, "\n") || !strings.Contains(usage, want) {
			t.Errorf("the usage lacks %q (its synopsis and one-line purpose):\n%s", want, usage)
		}
		fs.VisitAll(func(f *flag.Flag) {
			if !strings.Contains(c.synopsis(fs), "--"+f.Name) {
				t.Errorf("edge %s's synopsis %q lacks its flag --%s", c.name, c.synopsis(fs), f.Name)
			}
		})
	}
	for _, want := range []string{
		"usage: edge <command> [flags]",
		"  edge help [command]\n",
		"edge <command> --help (or edge help <command>)",
		readmeConfig, exampleConfig,
	} {
		if !strings.Contains(usage, want) {
			t.Errorf("the usage lacks %q:\n%s", want, usage)
		}
	}
	if strings.Contains(usage, sandbox.InitArg) {
		t.Errorf("the usage shows the hidden %s:\n%s", sandbox.InitArg, usage)
	}
}

// edge <cmd> --help, -h and edge help <cmd> print the same usage of that
// command on stdout and exit 0: its synopsis, each flag with what it means,
// where the config is documented.
func TestCommandUsageOnRequest(t *testing.T) {
	for _, c := range userCommands {
		name := strings.Join(c.words, " ")
		code, usage, errOut := runCmd(t, append([]string{"help"}, c.words...)...)
		if code != 0 || errOut != "" {
			t.Errorf("edge help %s: exit %d, stderr %q", name, code, errOut)
			continue
		}
		for _, h := range []string{"--help", "-h", "-help"} {
			code, out, errOut := runCmd(t, append(c.words, h)...)
			if code != 0 || errOut != "" || out != usage {
				t.Errorf("edge %s %s: exit %d, stderr %q, stdout\n%s\nwant exit 0 and, as edge help %s prints:\n%s", name, h, code, errOut, out, name, usage)
			}
		}
		synopsis := "usage: edge " + strings.Join(append(c.words, c.flags...), " ")
		if !strings.HasPrefix(usage, synopsis) {
			t.Errorf("edge help %s begins %q, want %q", name, strings.SplitN(usage, "\n", 2)[0], synopsis)
		}
		for _, f := range c.flags {
			// The flag on a line of its own, its meaning on the next.
			if !strings.Contains(usage, "\n  "+f+"\n        read the config from edge.json") {
				t.Errorf("edge help %s does not explain %s:\n%s", name, f, usage)
			}
		}
		readsConfig := name != "version"
		if strings.Contains(usage, readmeConfig) != readsConfig || strings.Contains(usage, exampleConfig) != readsConfig {
			t.Errorf("edge help %s: names where the config is documented: %v, want %v:\n%s", name, !readsConfig, readsConfig, usage)
		}
	}
}

// A group's commands (edge ca, edge config, edge policy) on request.
func TestGroupUsageOnRequest(t *testing.T) {
	for group, want := range map[string][]string{
		"ca":     {"  edge ca bundle --config edge.json\n", "  edge ca status --config edge.json\n"},
		"config": {"  edge config check --config edge.json\n"},
		"policy": {"  edge policy check --config edge.json\n"},
	} {
		code, usage, errOut := runCmd(t, "help", group)
		if code != 0 || errOut != "" || !strings.HasPrefix(usage, "usage: edge "+group+" <command>") {
			t.Errorf("edge help %s: exit %d, stderr %q, stdout\n%s", group, code, errOut, usage)
		}
		for _, w := range want {
			if !strings.Contains(usage, w) {
				t.Errorf("edge help %s lacks %q:\n%s", group, w, usage)
			}
		}
		if strings.Contains(usage, "edge serve") {
			t.Errorf("edge help %s lists another group's commands:\n%s", group, usage)
		}
		for _, h := range []string{"--help", "-h"} {
			if code, out, errOut := runCmd(t, group, h); code != 0 || errOut != "" || out != usage {
				t.Errorf("edge %s %s: exit %d, stderr %q, stdout\n%s\nwant as edge help %s", group, h, code, errOut, out, group)
			}
		}
	}
}

// A wrong invocation exits 2 with nothing on stdout, and on stderr what is
// wrong followed by the usage that applies: edge's for an unknown command, a
// group's for an unknown command in it, the command's for a bad flag or
// operand.
func TestWrongInvocationsGetTheUsage(t *testing.T) {
	commandUsage := func(words ...string) string {
		_, out, _ := runCmd(t, append([]string{"help"}, words...)...)
		return out
	}
	_, usage, _ := runCmd(t, "help")
	tests := []struct {
		args  []string
		says  string
		usage string
	}{
		{[]string{"nope"}, `edge: unknown command "nope"`, usage},
		{[]string{"--version"}, `edge: unknown command "--version"`, usage},
		{[]string{"help", "nope"}, `edge help: unknown command "nope"`, usage},
		{[]string{"help", "ca", "rotate"}, `edge help: unknown command "ca rotate"`, usage},
		{[]string{"policy"}, "edge policy: a command is missing", commandUsage("policy")},
		{[]string{"policy", "lint", "f.json"}, `edge policy: unknown command "lint"`, commandUsage("policy")},
		{[]string{"serve"}, "edge serve: --config is required", commandUsage("serve")},
		{[]string{"serve", "--bogus"}, "edge serve: flag provided but not defined: -bogus", commandUsage("serve")},
		{[]string{"serve", "--config", "a.json", "b.json"}, `edge serve: unexpected argument "b.json"`, commandUsage("serve")},
		{[]string{"ca", "status", "-x", "--config", "a.json"}, "edge ca status: flag provided but not defined: -x", commandUsage("ca", "status")},
		{[]string{"ca", "bundle", "--config"}, "edge ca bundle: flag needs an argument: -config", commandUsage("ca", "bundle")},
		{[]string{"config"}, "edge config: a command is missing", commandUsage("config")},
		{[]string{"config", "check"}, "edge config check: --config is required", commandUsage("config", "check")},
		{[]string{"config", "check", "--config", "a.json", "b.json"}, `edge config check: unexpected argument "b.json"`, commandUsage("config", "check")},
		{[]string{"policy", "check"}, "edge policy check: --config is required", commandUsage("policy", "check")},
		// A config as an operand, as edge policy check once took it: the
		// spelling every command takes.
		{[]string{"policy", "check", "a.json"}, "edge policy check: --config is required: write edge policy check --config a.json", commandUsage("policy", "check")},
		{[]string{"config", "check", "a.json"}, "edge config check: --config is required: write edge config check --config a.json", commandUsage("config", "check")},
		{[]string{"serve", "a.json"}, "edge serve: --config is required: write edge serve --config a.json", commandUsage("serve")},
		{[]string{"policy", "check", "a.json", "b.json"}, "edge policy check: --config is required", commandUsage("policy", "check")},
		{[]string{"version", "now"}, `edge version: unexpected argument "now"`, commandUsage("version")},
		{[]string{"version", "--short"}, "edge version: flag provided but not defined: -short", commandUsage("version")},
	}
	for _, tc := range tests {
		code, out, errOut := runCmd(t, tc.args...)
		if want := tc.says + "\n\n" + tc.usage; code != 2 || out != "" || errOut != want || tc.usage == "" {
			t.Errorf("edge %s: exit %d, stdout %q, stderr\n%s\nwant exit 2 and on stderr\n%s", strings.Join(tc.args, " "), code, out, errOut, want)
		}
	}
}

func TestVersion(t *testing.T) {
	code, out, errOut := runCmd(t, "version")
	if want := version.Product + " edge " + version.Version + "\n"; code != 0 || out != want || errOut != "" {
		t.Errorf("edge version: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, want)
	}
}
