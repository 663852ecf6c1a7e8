// Command runfleet is the runfleet CLI (package shared/cli): this main
// only wires the process's arguments, environment, standard streams and
// signals to cli.Main.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/runfleet/runfleet/shared/cli"
)

func main() {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	home, _ := os.UserHomeDir()
	os.Exit(cli.Main(context.Background(), os.Args[1:], cli.Env{
		Getenv: os.Getenv,
		Stdin:  os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		StdinTTY: isTerminal(os.Stdin), StdoutTTY: isTerminal(os.Stdout), StderrTTY: isTerminal(os.Stderr),
		Home:      home,
		Interrupt: sig,
	}))
}

// isTerminal reports whether f is a character device other than
// /dev/null: a terminal, without a dependency for the ioctl.
func isTerminal(f *os.File) bool {
	info, err := f.Stat()
	if err != nil || info.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(info, null)
}
