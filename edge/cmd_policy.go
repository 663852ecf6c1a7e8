package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/runfleet/runfleet/edge/policy"
)

// policyCheckCommand is `edge policy check F`: load F as edge serve would,
// compile its policy and print what each key may reach, or every problem
// found.
func policyCheckCommand() *command {
	return &command{
		name:    "policy check",
		purpose: "Check a config's policy and print what each key may reach, or every problem found.",
		about: "It loads the config as edge serve would (every key checked) and compiles its policy as\n" +
			"SIGHUP reloads it, touching nothing; any problem found exits 1.",
		operands:    []string{"edge.json"},
		readsConfig: true,
		flags: func(*flag.FlagSet) action {
			return func(operands []string, stdout, stderr io.Writer) int { return checkPolicy(operands[0], stdout, stderr) }
		},
	}
}

// checkPolicy prints what each key of the policy at path may reach.
func checkPolicy(path string, stdout, stderr io.Writer) int {
	p, err := policy.LoadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "policy check failed:\n%v\n", err)
		return 1
	}
	keys := p.Keys()
	for _, k := range keys {
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
			fmt.Fprintf(stdout, "%s: aws; domains %s; signs for regions %s, services %s; task variables %s, %s[, %s]; credentials from %s\n",
				k.Ref, strings.Join(domains, ", "), strings.Join(a.Regions, ", "), strings.Join(a.Services, ", "),
				env.AccessKeyID, env.SecretAccessKey, env.SessionToken, source)
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
			fmt.Fprintf(stdout, "%s: ssh; domains %s; logs in as %s; runs %s on %s; %d known host key(s); no task variable\n",
				k.Ref, strings.Join(domains, ", "), sk.User, strings.Join(sk.Allow, ", "), repos, len(sk.KnownHosts))
			continue
		}
		fmt.Fprintf(stdout, "%s: domains %s; substituted in %s; placeholder %q + %d letters and digits\n",
			k.Ref, strings.Join(domains, ", "), k.In, k.Placeholder.Prefix, k.Placeholder.Length-len(k.Placeholder.Prefix))
	}
	fmt.Fprintf(stdout, "policy ok: %d key(s)\n", len(keys))
	return 0
}
