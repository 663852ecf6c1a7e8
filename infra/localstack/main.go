// Command localstack runs Fleet on this machine (`make dev`): the api
// handler served over HTTP through the same API Gateway v2 adapter shape
// Lambda uses, on a bbolt store in a local data dir. It prints the admin
// token and a curl example, and stops cleanly on Ctrl-C or SIGTERM.
//
// Environment: every RUNFLEET_* variable of Fleet (README), plus
// RUNFLEET_DATA_DIR (default .dev), where the store, the generated admin
// token and the default credentials file live.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/shared/fleetapp"
	"github.com/runfleet/runfleet/shared/lambdahttp"
)

// EnvDataDir names the local stack's data directory.
const EnvDataDir = "RUNFLEET_DATA_DIR"

// shutdownGrace bounds how long in-flight requests get after a signal.
const shutdownGrace = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Getenv, os.Stdout, os.Stderr))
}

func run(ctx context.Context, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := config.FromEnv(getenv)
	if err != nil {
		fmt.Fprintln(stderr, "localstack: configuration:", err)
		return 2
	}
	dataDir := getenv(EnvDataDir)
	if dataDir == "" {
		dataDir = ".dev"
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		fmt.Fprintln(stderr, "localstack:", err)
		return 1
	}
	if cfg.Store == "" {
		cfg.Store = config.StoreBolt + ":" + filepath.Join(dataDir, "fleet.db")
	}
	if cfg.Credentials == (credentials.Spec{}) {
		path := filepath.Join(dataDir, "credentials.json")
		if err := writeIfMissing(path, "{}\n"); err != nil {
			fmt.Fprintln(stderr, "localstack:", err)
			return 1
		}
		cfg.Credentials = credentials.Spec{Kind: "file", Arg: path}
	}
	tokenFile := filepath.Join(dataDir, "admin-token")
	tokenShown := "(from " + config.EnvAdminToken + ")"
	tokenRef := "$" + config.EnvAdminToken
	if cfg.AdminToken == "" {
		if cfg.AdminToken, err = localAdminToken(tokenFile); err != nil {
			fmt.Fprintln(stderr, "localstack:", err)
			return 1
		}
		tokenShown = cfg.AdminToken + " (kept in " + tokenFile + ")"
		tokenRef = "$(cat " + tokenFile + ")"
	}

	log := fleetapp.NewLogger(stderr, cfg.LogLevel)
	app, err := fleetapp.New(ctx, cfg, fleetapp.Deps{Logger: log, CreateTables: true})
	if err != nil {
		fmt.Fprintln(stderr, "localstack:", err)
		return 1
	}
	defer app.Close()
	adapter, err := lambdahttp.New(lambdahttp.Config{Handler: app.API.Handle, Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, "localstack:", err)
		return 1
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		fmt.Fprintln(stderr, "localstack:", err)
		return 1
	}
	srv := &http.Server{Handler: adapter, ReadHeaderTimeout: lambdahttp.DefaultReadHeaderTimeout}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	base := "http://" + ln.Addr().String()
	fmt.Fprintf(stdout, "runfleet local stack listening on %s\n", base)
	fmt.Fprintf(stdout, "  store:       %s\n", cfg.Store)
	fmt.Fprintf(stdout, "  credentials: %s:%s (host credentialRef -> secret)\n", cfg.Credentials.Kind, cfg.Credentials.Arg)
	fmt.Fprintf(stdout, "  admin token: %s\n", tokenShown)
	fmt.Fprintf(stdout, "try:\n  curl -s %s/healthz\n  curl -s -H \"Authorization: Bearer %s\" %s/fleet/hosts\n", base, tokenRef, base)

	select {
	case err := <-served:
		fmt.Fprintln(stderr, "localstack: serving:", err)
		return 1
	case <-ctx.Done():
	}
	fmt.Fprintln(stdout, "stopping")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		fmt.Fprintln(stderr, "localstack: shutdown:", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "localstack: serving:", err)
	}
	if err := app.Close(); err != nil {
		fmt.Fprintln(stderr, "localstack: closing the store:", err)
		return 1
	}
	fmt.Fprintln(stdout, "stopped")
	return 0
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
