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

// caReadOnly is what both ca commands promise.
const caReadOnly = "It reads the CA as stored under the config's dataDir, without unsealing a key or\n" +
	"writing anything: safe beside a running edge serve."

// caCommand is `edge ca bundle|status --config edge.json`: the proxy CA as
// stored under the data dir. bundle prints the PEM tasks install; status
// prints the signer and its successor.
func caCommand(sub string) *command {
	c := &command{
		name:        "ca " + sub,
		about:       caReadOnly,
		required:    []string{configFlag},
		readsConfig: true,
		flags: func(fs *flag.FlagSet) action {
			path := configFlagVar(fs)
			return func(stdout, stderr io.Writer) int { return showCA(sub, *path, stdout, stderr) }
		},
	}
	if sub == "bundle" {
		c.purpose = "Print the CA bundle tasks trust (PEM: the signer, and its successor once minted)."
	} else {
		c.purpose = "Print the proxy CA's signer and successor: subjects, fingerprints, dates."
	}
	return c
}

// showCA prints the bundle or the status of the CA of the config at path.
func showCA(sub, path string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(path)
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
	if sub == "bundle" {
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
