package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/runfleet/runfleet/edge/policy"
)

// runPolicy is `edge policy check F`: load F as edge serve would, compile its
// policy and print what each key may reach, or every problem found.
func runPolicy(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "check" {
		fmt.Fprintln(stderr, "usage: edge policy check <edge.json>")
		return 2
	}
	p, err := policy.LoadFile(args[1])
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
		fmt.Fprintf(stdout, "%s: domains %s; substituted in %s; placeholder %q + %d letters and digits\n",
			k.Ref, strings.Join(domains, ", "), k.In, k.Placeholder.Prefix, k.Placeholder.Length-len(k.Placeholder.Prefix))
	}
	fmt.Fprintf(stdout, "policy ok: %d key(s)\n", len(keys))
	return 0
}
