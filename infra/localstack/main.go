// Command localstack runs the whole system on this machine (`make dev`):
// Fleet, all five handlers in one process, on a bbolt store in a local data
// dir (the api handler served over HTTP through the same API Gateway v2
// adapter shape Lambda uses, the stream handler at /fleet/runs/{id}/stream
// on the same address, the scheduled probe and sweep handlers on timers:
// RUNFLEET_PROBE_INTERVAL, RUNFLEET_SWEEP_INTERVAL; once at start, then
// every interval; the dispatcher handler driven by an in-process wake
// queue, as SQS's event source mapping drives it in AWS, redelivering a
// failed delivery after the visibility timeout), and one edge host in the
// same process (package
// edge/host, as `edge serve` runs it), registered with Fleet as local-edge
// and probed, with a demo: a demo upstream on loopback (HTTPS under
// api.demo.test with its own CA, trusted by the proxy) that answers whether
// the credential it got was the demo secret's real value, the secret
// demo/DEMO_API_KEY granted for it alone, the demo agent that calls it with
// curl and its placeholder, and a caller minted for it. It keeps a second
// host ready that it does not run: edge-1's edge.json and credential, for
// `edge serve` and the README's "register another host". It stops cleanly
// on Ctrl-C or SIGTERM (open streams get their retry hint, the edge
// drains).
//
// Its stdout is its log, JSON lines only (Fleet's, the edge's and its own
// records); the "ready" record says where everything is and carries the
// curl commands that dispatch a run using the secret and follow its
// stream. The same, with the admin token, is printed as a banner on stderr
// when stderr is a terminal; a start that fails says why on both.
//
// As root, tasks run as nobody; as an ordinary user, edge cannot switch
// users and runs tasks as that user (runner.insecureSameUser, for this
// local stack only; it says so when it starts).
//
// Environment: every RUNFLEET_* variable of Fleet (README), plus
// RUNFLEET_DATA_DIR (default .dev, relative to the working directory),
// where the store, the generated admin token, the default credentials file
// and the local edge's files live; RUNFLEET_EDGE=off to run Fleet alone;
// RUNFLEET_EDGE_ADDR, the local edge's host API (default 127.0.0.1:7070);
// RUNFLEET_DEMO_UPSTREAM_ADDR, the demo upstream's (default
// 127.0.0.1:7443); EDGE_SECRETS_PROXY=off keeps the local edge's secrets
// proxy down, as for edge.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"golang.org/x/sys/unix"

	"github.com/runfleet/runfleet/edge/proxy"
	"github.com/runfleet/runfleet/edge/sandbox"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/fleetapp"
	"github.com/runfleet/runfleet/shared/lambdahttp"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/shared/stream"
	"github.com/runfleet/runfleet/shared/wake"
)

// EnvDataDir names the local stack's data directory.
const (
	EnvDataDir     = "RUNFLEET_DATA_DIR"
	defaultDataDir = ".dev"
)

// shutdownGrace bounds how long in-flight requests get after a signal.
const shutdownGrace = 10 * time.Second

// jobTimeout is each timed probe's and sweep's deadline, as a Lambda
// timeout would be: the jobs take their budget from it.
const jobTimeout = time.Minute

func main() {
	// As root the local edge starts each task through this binary as its
	// init (edge/runner's DefaultTaskInit), as edge does.
	if len(os.Args) > 1 && os.Args[1] == sandbox.InitArg {
		os.Exit(sandbox.Main())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// stdout is the log alone, so `make dev > log` and `make dev | jq` read
	// JSON throughout; the banner is for a person, so it goes where one
	// reads: stderr, when that is a terminal.
	var human io.Writer
	if isTerminal(os.Stderr) {
		human = os.Stderr
	}
	os.Exit(run(ctx, os.Getenv, os.Stdout, human))
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// openBolt opens the local stack's store, a bbolt file (fleetapp's
// Deps.OpenBolt: the local stack links bbolt, the Lambda functions do not).
func openBolt(path string, clk clock.Clock) (fleetapp.StoreCloser, error) {
	return boltstore.Open(path, boltstore.WithClock(clk))
}

// run is the stack from start to stop. Its log, JSON lines, goes to out:
// every record of Fleet, the local edge and the demo, and the stack's own
// (the "ready" record carries what the banner says, commands included).
// human, when not nil (main: stderr, when it is a terminal), gets the same
// for a person: the banner at ready, and why a start failed. Tokens appear
// only there, never in the log: the commands read them from their files.
func run(ctx context.Context, getenv func(string) string, out, human io.Writer) int {
	cfg, err := config.FromEnv(getenv)
	edgeOn, edgeErr := config.Switch(getenv, EnvEdge, true)
	upstreamAddr, upstreamErr := demoUpstreamAddr(getenv)
	killSwitch, killSwitchErr := proxy.KillSwitch(getenv)
	if !edgeOn {
		// Read by the local edge and its demo alone.
		upstreamErr, killSwitchErr = nil, nil
	}
	log := fleetapp.NewLogger(out, cfg.LogLevel)
	stop := func(err error) int {
		log.Error("localstack failed", "err", err.Error())
		if human != nil {
			fmt.Fprintln(human, "localstack:", err)
		}
		return 1
	}
	if err == nil && cfg.WakeQueue != "" {
		// The stack consumes no SQS queue: wakes sent there would reach
		// no dispatcher.
		err = fmt.Errorf("%s=%q: the local stack wakes through a queue in its own process; unset it", config.EnvWakeQueue, cfg.WakeQueue)
	}
	if err := errors.Join(err, edgeErr, upstreamErr, killSwitchErr); err != nil {
		stop(fmt.Errorf("configuration: %w", err))
		return 2
	}
	dataDir, err := absDataDir(getenv(EnvDataDir))
	if err != nil {
		return stop(err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return stop(err)
	}
	if cfg.Store == "" {
		cfg.Store = config.StoreBolt + ":" + filepath.Join(dataDir, "fleet.db")
	}
	edgeFiles := filesIn(dataDir)
	// ownCredentials: the credentials file is the stack's, so it can hold
	// the second host's token too.
	ownCredentials := false
	if cfg.Credentials == (credentials.Spec{}) {
		path := filepath.Join(dataDir, "credentials.json")
		if err := writeIfMissing(path, "{}\n"); err != nil {
			return stop(err)
		}
		if edgeOn {
			if err := addCredential(path, localEdgeRef, edgeFiles.token); err != nil {
				return stop(fmt.Errorf("the local edge's credential: %w", err))
			}
			if err := addCredential(path, secondEdgeID, edgeFiles.secondToken); err != nil {
				return stop(fmt.Errorf("%s's credential: %w", secondEdgeID, err))
			}
			ownCredentials = true
		}
		cfg.Credentials = credentials.Spec{Kind: "file", Arg: path}
	}
	rep := report{Store: cfg.Store, Credentials: cfg.Credentials.Kind + ":" + cfg.Credentials.Arg,
		ProbeEvery: cfg.ProbeInterval, SweepEvery: cfg.SweepInterval}
	cli, cliMissing := runfleetCommand()
	rep.cliMissing = cliMissing
	if cfg.AdminToken == "" {
		rep.AdminTokenFile = filepath.Join(dataDir, "admin-token")
		if cfg.AdminToken, err = localAdminToken(rep.AdminTokenFile); err != nil {
			return stop(err)
		}
	}
	rep.adminToken = cfg.AdminToken

	wakes, err := wake.NewLocal(wake.LocalConfig{Logger: log})
	if err != nil {
		return stop(err)
	}
	app, err := fleetapp.New(ctx, cfg, fleetapp.Deps{Logger: log, CreateTables: true, OpenBolt: openBolt, Waker: wakes})
	if err != nil {
		return stop(err)
	}
	defer app.Close()

	// Fleet's address is taken first: a busy one fails the start before
	// anything else is started.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return stop(inUse(err, config.EnvAddr))
	}
	defer ln.Close()
	rep.Fleet = "http://" + ln.Addr().String()

	var edge *localEdge
	if edgeOn {
		edgeAddr := getenv(EnvEdgeAddr)
		if edgeAddr == "" {
			edgeAddr = defaultEdgeAddr
		}
		if edge, err = openLocalEdge(ctx, app, edgeFiles, edgeAddr, upstreamAddr, killSwitch, log); err != nil {
			return stop(fmt.Errorf("the local edge: %w", err))
		}
		defer func() {
			if edge != nil {
				edge.stop(context.Background())
			}
		}()
		rep.Edge = edge.report(rep.Fleet, cli)
		if ownCredentials {
			if rep.SecondEdge, err = edge.writeSecondEdge(); err != nil {
				return stop(err)
			}
		}
	}

	handler, err := app.HTTPHandler(log, nil)
	if err != nil {
		return stop(err)
	}
	// Open streams end (with their retry hint) when the stack stops, rather
	// than holding the shutdown until its grace runs out.
	stopping, stopStreams := context.WithCancel(context.Background())
	defer stopStreams()
	served := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := stream.Path(r.URL.EscapedPath()); ok {
			ctx, cancel := context.WithCancel(r.Context())
			defer context.AfterFunc(stopping, cancel)()
			r = r.WithContext(ctx)
		}
		handler.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: served, ReadHeaderTimeout: lambdahttp.DefaultReadHeaderTimeout}
	serving := make(chan error, 1)
	go func() { serving <- srv.Serve(ln) }()

	var jobs sync.WaitGroup
	jobsCtx, stopJobs := context.WithCancel(ctx)
	defer stopJobs()
	every(jobsCtx, &jobs, cfg.ProbeInterval, func(ctx context.Context) {
		app.Jobs.Probe(ctx, scheduledEvent("probe"))
	})
	every(jobsCtx, &jobs, cfg.SweepInterval, func(ctx context.Context) {
		app.Jobs.Sweep(ctx, scheduledEvent("sweep"))
	})
	jobs.Add(1)
	go func() {
		defer jobs.Done()
		wakes.Run(jobsCtx, app.Dispatcher.Handle)
	}()

	rep.Try = tryCommands(rep.Fleet, rep.AdminTokenFile, cli)
	if rep.Edge != nil && rep.Edge.SameUser {
		log.Warn("tasks run as this user, with open egress: runner.insecureSameUser is set because it cannot switch users; for this local stack only, never on a real host", "uid", os.Getuid())
	}
	rep.log(log)
	if human != nil {
		rep.print(human)
	}

	select {
	case err := <-serving:
		return stop(fmt.Errorf("serving: %w", err))
	case <-ctx.Done():
	}
	log.Info("stopping")
	stopJobs()
	stopStreams()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Error("shutdown", "err", err.Error())
	}
	if err := <-serving; err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("serving", "err", err.Error())
	}
	jobs.Wait()
	if edge != nil {
		// The edge drains after Fleet stopped: no dispatch arrives meanwhile.
		ctx, cancel := context.WithTimeout(context.Background(), edgeStopTimeout)
		err := edge.stop(ctx)
		cancel()
		edge = nil
		if err != nil {
			log.Error("stopping the local edge", "err", err.Error())
		}
	}
	if err := app.Close(); err != nil {
		log.Error("closing the store", "err", err.Error())
		return 1
	}
	log.Info("stopped")
	return 0
}

// edgeStopTimeout bounds the local edge's drain (demo.Edge: 5 s, then 2 s
// of cancel grace) and its shutdown.
const edgeStopTimeout = 30 * time.Second

// openLocalEdge starts the local edge, registers and probes it, and makes
// sure the demo caller exists.
func openLocalEdge(ctx context.Context, app *fleetapp.App, files edgeFiles, addr, upstreamAddr string, killSwitch bool, log *slog.Logger) (*localEdge, error) {
	if err := localEdgeToken(ctx, app, files); err != nil {
		return nil, err
	}
	edge, err := startLocalEdge(ctx, files, addr, upstreamAddr, killSwitch, log)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*localEdge, error) {
		edge.stop(context.Background())
		return nil, err
	}
	if err := edge.register(ctx, app.Fleet); err != nil {
		return fail(fmt.Errorf("registering it with Fleet: %w", err))
	}
	probe, err := app.Fleet.ProbeHost(ctx, localEdgeID)
	if err != nil {
		return fail(fmt.Errorf("probing it: %w", err))
	}
	if probe.Status != "ok" {
		log.Warn("the local edge's first probe is not ok", "status", probe.Status, "detail", probe.Detail)
	}
	edge.probe = probe
	if err := demoCaller(ctx, app, files.caller); err != nil {
		return fail(fmt.Errorf("the demo caller: %w", err))
	}
	return edge, nil
}

// runfleetCommand is how the stack's commands name the runfleet CLI: its
// absolute path when it is beside the stack's own binary (make dev builds
// both into build/), so the commands work pasted in any directory; else
// the bare name, as `go install` puts it on the PATH (missing: true).
func runfleetCommand() (cmd string, missing bool) {
	if exe, err := os.Executable(); err == nil {
		path := filepath.Join(filepath.Dir(exe), "runfleet")
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
			return shellQuote(path), false
		}
	}
	return "runfleet", true
}

// absDataDir is the data dir as an absolute path, so that everything
// derived from it is absolute too: edge resolves a relative path in
// edge.json against edge.json's own folder (a relative data dir once made
// that .dev/.dev/...), and the printed commands work in any directory.
func absDataDir(dir string) (string, error) {
	if dir == "" {
		dir = defaultDataDir
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("%s: %w", EnvDataDir, err)
	}
	return abs, nil
}

// inUse names the variable that sets a listen address when the address
// is taken, so the message says what to change.
func inUse(err error, env string) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w: another program listens there; set %s to a free address", err, env)
	}
	return err
}

// shellQuote is s as one word of a POSIX shell command: as is when it
// holds nothing the shell would interpret, else single-quoted.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:@%+=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// killSwitchEnv is edge's kill switch, which the local edge honours.
const killSwitchEnv = proxy.KillSwitchEnv

// every runs job now and then every interval until ctx ends, each run with
// jobTimeout as its deadline (the jobs derive their budget from it), one at
// a time.
func every(ctx context.Context, wg *sync.WaitGroup, interval time.Duration, job func(ctx context.Context)) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			jobCtx, cancel := context.WithTimeout(ctx, jobTimeout)
			job(jobCtx)
			cancel()
			if !clock.Sleep(clock.Real{}, interval, ctx.Done()) {
				return
			}
		}
	}()
}

// scheduledEvent is the event EventBridge Scheduler would send.
func scheduledEvent(job string) events.EventBridgeEvent {
	return events.EventBridgeEvent{Version: "0", DetailType: "Scheduled Event", Source: "runfleet.localstack", Detail: json.RawMessage(`{"job":"` + job + `"}`)}
}

// localAdminToken reads the data dir's admin token, minting and keeping one
// (0600) on first start so the token survives restarts.
func localAdminToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		tok := strings.TrimSpace(string(b))
		if len(tok) < config.MinAdminTokenLength {
			return "", fmt.Errorf("%s holds a token shorter than %d characters; delete it to mint a new one", path, config.MinAdminTokenLength)
		}
		return tok, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	tok, _, err := auth.MintToken(nil)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("keeping the admin token: %w", err)
	}
	return tok, nil
}

func writeIfMissing(path, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
