package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/edge/config"
)

const caUsage = "usage: edge ca bundle|status --config edge.json"

// runCA is `edge ca bundle|status --config edge.json`: the proxy CA as
// stored under the data dir, read without unsealing a key or writing
// anything, so it is safe beside a running edge serve. bundle prints the PEM
// tasks install; status prints the signer and its successor.
func runCA(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "bundle" && args[0] != "status") {
		fmt.Fprintln(stderr, caUsage)
		return 2
	}
	fs := flag.NewFlagSet("ca "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "path to edge.json")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *path == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, caUsage)
		return 2
	}
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	caCfg := ca.Config{
		Dir:             filepath.Join(cfg.DataDir, "ca"),
		Lifetime:        cfg.CA.Lifetime.D(),
		SuccessorWindow: cfg.CA.SuccessorWindow.D(),
		SwitchBefore:    cfg.CA.SwitchBefore.D(),
		LeafLifetime:    cfg.CA.LeafLifetime.D(),
	}
	in, err := ca.Inspect(caCfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if args[0] == "bundle" {
		stdout.Write(in.Bundle)
		return 0
	}
	printCAStatus(stdout, in, caCfg)
	return 0
}

func printCAStatus(w io.Writer, in ca.Inspection, cfg ca.Config) {
	date := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	describe := func(role string, c ca.CertInfo) {
		fmt.Fprintf(w, "%-10s %s\n", role+":", c.Subject)
		fmt.Fprintf(w, "  sha256:  %s\n", c.Fingerprint)
		fmt.Fprintf(w, "  valid:   %s to %s\n", date(c.NotBefore), date(c.NotAfter))
	}
	signer := in.Status.Signer
	describe("signer", signer)
	fmt.Fprintf(w, "  switch:  %s (to its successor)\n", date(signer.NotAfter.Add(-cfg.SwitchBefore)))
	switch {
	case in.Status.Successor != nil:
		describe("successor", *in.Status.Successor)
	case in.SuccessorDue:
		fmt.Fprintf(w, "successor: due since %s; the running edge mints it at its next review\n",
			date(signer.NotAfter.Add(-cfg.SuccessorWindow)))
	default:
		fmt.Fprintf(w, "successor: none yet (minted from %s)\n", date(signer.NotAfter.Add(-cfg.SuccessorWindow)))
	}
}
