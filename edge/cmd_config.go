package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/host"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy"
)

// configCheckAbout says what `edge config check` and its alias promise.
const configCheckAbout = "It runs every check edge serve runs before it writes anything, and lists every problem\n" +
	"at its JSON path (runner.maxConcurrent, policy.projects.acme.keys.API_KEY.domains[0]):\n" +
	"the config's keys and values, the policy, the secrets source, and the files the config\n" +
	"names on this machine (present, private where they must be, of the right content).\n" +
	proxy.KillSwitchEnv + " is read from this environment, as edge serve reads it. Any problem\n" +
	"exits 1. It writes nothing, and notes instead what edge serve would make (the data dir,\n" +
	"the seal key). Left to edge serve's start: binding its addresses, and setting up tasks'\n" +
	"networks and control groups."

// configCheckCommand is `edge config check --config edge.json`, and with
// name "policy check" its alias, which edge had first (taking the file as
// an operand; a lone operand now gets the --config spelling back).
func configCheckCommand(name string) *command {
	c := &command{
		name:        name,
		purpose:     "Check a config with serve's checks, changing nothing: every problem, or what each key reaches.",
		about:       configCheckAbout,
		required:    []string{configFlag},
		readsConfig: true,
		flags: func(fs *flag.FlagSet) action {
			path := configFlagVar(fs)
			return func(stdout, stderr io.Writer) int { return checkConfigCommand(name, *path, stdout, stderr) }
		},
	}
	if name != "config check" {
		c.purpose = "The same as edge config check (an alias)."
	}
	return c
}

// checkConfigCommand prints what each key of the config at path may reach
// and notes on the start, then "config ok", or every problem (exit 1).
func checkConfigCommand(name, path string, stdout, stderr io.Writer) int {
	checked := checkConfig(context.Background(), path, os.Getenv)
	if checked.policy != nil {
		printKeys(stdout, checked.policy)
	}
	for _, n := range checked.report.Notes {
		fmt.Fprintf(stdout, "note: %s\n", n.Error())
	}
	if len(checked.report.Problems) > 0 {
		printProblems(stderr, "edge "+name, path, checked.report.Problems)
		return 1
	}
	fmt.Fprintf(stdout, "config ok: %s: %d key(s), %d agent(s)\n", path, len(checked.policy.Keys()), len(checked.cfg.Agents))
	return 0
}

// checked is the config at a path and what checking it found.
type checked struct {
	// cfg is nil when the file cannot be read as a JSON object.
	cfg        *config.Config
	killSwitch bool
	// policy is the config's policy, nil unless it compiled.
	policy *policy.Policy
	report host.Report
}

// checkConfig is every check edge serve runs before it writes anything:
// the kill switch (read with getenv), the config (config.Read), and what
// host.Check finds on this machine. Both edge serve and edge config check
// run it, so the check passes exactly what serve gets past.
func checkConfig(ctx context.Context, path string, getenv func(string) string) checked {
	var c checked
	var err error
	if c.killSwitch, err = proxy.KillSwitch(getenv); err != nil {
		c.report.Problems = append(c.report.Problems, config.Problem{Msg: err.Error()})
	}
	cfg, ps := config.Read(path)
	c.report.Problems = append(c.report.Problems, ps...)
	if cfg == nil {
		return c
	}
	c.cfg = cfg
	r := host.Check(ctx, host.Options{Config: cfg, KillSwitch: c.killSwitch})
	// A field that did not decode is named once, by the decoder.
	named := map[string]bool{}
	for _, p := range ps {
		named[p.Path] = true
	}
	for _, p := range r.Problems {
		if !named[p.Path] {
			c.report.Problems = append(c.report.Problems, p)
		}
	}
	c.report.Notes, c.policy = r.Notes, r.Policy
	return c
}

// printProblems lists every problem under a line saying whose they are.
func printProblems(w io.Writer, who, path string, ps config.Problems) {
	noun := "problems"
	if len(ps) == 1 {
		noun = "problem"
	}
	fmt.Fprintf(w, "%s: config %s has %d %s; edge serve refuses it until each is fixed:\n", who, path, len(ps), noun)
	for _, p := range ps {
		fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(p.Error(), "\n", "\n    "))
	}
}

// printKeys prints what each key of the policy may reach, one line each.
func printKeys(w io.Writer, p *policy.Policy) {
	for _, k := range p.Keys() {
		domains := make([]string, len(k.Domains))
		for i, d := range k.Domains {
			domains[i] = d.String()
		}
		if a := k.AWS; a != nil {
			source := "the secrets source's value"
			if a.AssumeRole != nil {
				source = fmt.Sprintf("a per-run session of %s (%s)", a.AssumeRole.RoleARN, a.AssumeRole.Duration)
			}
			env := a.Env()
			fmt.Fprintf(w, "%s: aws; domains %s; signs for regions %s, services %s; task variables %s, %s[, %s]; credentials from %s%s\n",
				k.Ref, strings.Join(domains, ", "), strings.Join(a.Regions, ", "), strings.Join(a.Services, ", "),
				env.AccessKeyID, env.SecretAccessKey, env.SessionToken, source, rulesNote(k))
			continue
		}
		if sk := k.SSH; sk != nil {
			repos := "any repository"
			if len(sk.Repositories) > 0 {
				texts := make([]string, len(sk.Repositories))
				for i, r := range sk.Repositories {
					texts[i] = r.Text
				}
				repos = "repositories " + strings.Join(texts, ", ")
			}
			fmt.Fprintf(w, "%s: ssh; domains %s; logs in as %s; runs %s on %s; %d known host key(s); no task variable\n",
				k.Ref, strings.Join(domains, ", "), sk.User, strings.Join(sk.Allow, ", "), repos, len(sk.KnownHosts))
			continue
		}
		source := ""
		if k.Source == policy.SourceFleet {
			source = "; value from Fleet, per run (never the secrets source)"
		}
		fmt.Fprintf(w, "%s: domains %s; substituted in %s; placeholder %q + %d letters and digits%s%s\n",
			k.Ref, strings.Join(domains, ", "), k.In, k.Placeholder.Prefix, k.Placeholder.Length-len(k.Placeholder.Prefix), source, rulesNote(k))
	}
}

// rulesNote is what printKeys says of a key's request rules, in order,
// "" for a key without.
func rulesNote(k *policy.Key) string {
	if k.Rules == nil {
		return ""
	}
	return "; request rules, " + k.Rules.String()
}
