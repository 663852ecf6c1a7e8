package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/host"
	"github.com/runfleet/runfleet/edge/proxy"
)

// shutdownMargin is what Shutdown may take beyond the drain and the cancel
// grace: stopping listeners, the last trust deliveries, closing files.
const shutdownMargin = 30 * time.Second

// runServe is `edge serve --config edge.json`: the host API, the secrets
// proxy, the CA and the runner in one process. SIGTERM (or SIGINT) drains
// and exits 0; SIGHUP reloads the policy.
func runServe(args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "path to edge.json")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *path == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: edge serve --config edge.json")
		return 2
	}
	killSwitch, err := proxy.KillSwitch(os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "edge serve:", err)
		return 1
	}
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(stop)
	defer signal.Stop(hup)

	h, err := host.Open(context.Background(), host.Options{
		Config:     cfg,
		KillSwitch: killSwitch,
		Logger:     log,
	})
	if err != nil {
		log.Error("edge cannot start", "error", err.Error())
		return 1
	}
	h.Start(hup)

	code := 0
	select {
	case sig := <-stop:
		log.Info("edge draining", "signal", sig.String(), "drainTimeout", cfg.Runner.DrainTimeout.D().String())
	case err := <-h.Errs():
		log.Error("edge stopping on a fault", "error", err.Error())
		code = 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Runner.DrainTimeout.D()+cfg.Runner.CancelGrace.D()+shutdownMargin)
	defer cancel()
	if err := h.Shutdown(ctx); err != nil {
		log.Error("edge shutdown", "error", err.Error())
		code = 1
	}
	return code
}
