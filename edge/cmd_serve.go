package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/runfleet/runfleet/edge/host"
	"github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/proxy"
)

// shutdownMargin is what Shutdown may take beyond the drain and the cancel
// grace: stopping listeners, the last trust deliveries, closing files.
const shutdownMargin = 30 * time.Second

// serveCommand is `edge serve --config edge.json`: the host API, the secrets
// proxy, the CA and the runner in one process.
func serveCommand() *command {
	return &command{
		name:    "serve",
		purpose: "Run this host: the host API, the secrets proxy, its CA and the runner, in one process.",
		about: "It first runs every check edge config check runs: a config with any problem is refused\n" +
			"with all of them listed (exit 1) before anything is written: no data dir, no CA.\n\n" +
			"SIGTERM or SIGINT drains: running tasks get runner.drainTimeout, then are cancelled; edge\n" +
			"exits 0. SIGHUP reloads the policy, as does a change to the config file (an invalid new\n" +
			"policy keeps the old one, logged). Logs are JSON lines on stderr.\n\n" +
			proxy.KillSwitchEnv + "=off starts it with the secrets proxy down (runs that declare secrets\n" +
			"are refused broker_not_ready); unset or on runs it; any other value refuses the start.",
		required:    []string{configFlag},
		readsConfig: true,
		flags: func(fs *flag.FlagSet) action {
			path := configFlagVar(fs)
			return func(_, stderr io.Writer) int { return serve(*path, stderr) }
		},
	}
}

// serve runs the host from the config at path until a signal or a fault
// stops it. A config edge config check refuses it refuses the same way,
// having written nothing.
func serve(path string, stderr io.Writer) int {
	checked := checkConfig(context.Background(), path, os.Getenv)
	if len(checked.report.Problems) > 0 {
		printProblems(stderr, "edge serve", path, checked.report.Problems)
		return 1
	}
	cfg := checked.cfg
	// Every log line passes through the redactor that learns each real
	// value the proxy reads: the last line of defence.
	redactor := redact.NewSet(0)
	log := newLogger(stderr, redactor)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(stop)
	defer signal.Stop(hup)

	h, err := host.Open(context.Background(), host.Options{
		Config:     cfg,
		KillSwitch: checked.killSwitch,
		Logger:     log,
		Redactor:   redactor,
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

// newLogger is edge serve's logger: JSON lines to stderr, each passed
// through redactor first (one Write per record, as the redactor needs).
func newLogger(stderr io.Writer, redactor *redact.Set) *slog.Logger {
	return slog.New(slog.NewJSONHandler(redactor.Writer(stderr), nil))
}
