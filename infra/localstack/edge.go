package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/host"
	"github.com/runfleet/runfleet/infra/localstack/demo"
	"github.com/runfleet/runfleet/shared/auth"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapp"
	"github.com/runfleet/runfleet/shared/store"
)

// The local edge host: `edge serve`'s host (package edge/host) in this
// process, rather than a child `edge` process, so one Ctrl-C stops
// everything in order and nothing is left running: Fleet stops taking
// requests, the edge drains, the store closes.
const (
	// EnvEdge "off" runs Fleet alone (to register edges or fake hosts of
	// your own).
	EnvEdge = "RUNFLEET_EDGE"
	// EnvEdgeAddr is the local edge's host API address. It is registered
	// with Fleet, so it should stay the same across restarts of one data
	// dir.
	EnvEdgeAddr     = "RUNFLEET_EDGE_ADDR"
	defaultEdgeAddr = "127.0.0.1:7070"
	// EnvDemoUpstreamAddr is the demo upstream's address. Its port is part
	// of the demo domain (api.demo.test:<port>), which the edge's policy
	// grants and the printed commands declare, so it is fixed: a restart
	// leaves both valid.
	EnvDemoUpstreamAddr     = "RUNFLEET_DEMO_UPSTREAM_ADDR"
	defaultDemoUpstreamAddr = "127.0.0.1:7443"

	// localEdgeID is the host's id in Fleet and localEdgeRef its
	// credentialRef.
	localEdgeID  = "local-edge"
	localEdgeRef = "local-edge"
	// demoOwner is the caller the local stack mints for the demo.
	demoOwner = "demo"

	// The second local host, which the stack never runs: it writes its
	// edge.json, ready for `edge serve`, and its credential, so that the
	// README's "register another host" asks for no file of the reader's.
	// Its id is its credentialRef; its address is fixed, like the others,
	// so what the README says of it holds.
	secondEdgeID   = "edge-1"
	secondEdgeAddr = "127.0.0.1:7171"
)

// edgeFiles are the local edge's files under the data dir.
type edgeFiles struct {
	dataDir    string // edge's own data dir, private
	config     string // edge.json, rewritten at each start
	token      string // the host token (0600)
	secrets    string // the demo secret's real value (0600)
	upstreamCA string // the demo upstream's CA, for the proxy
	caller     string // the demo caller's token (0600)
	// The second host's, edge-1: its edge.json, data dir and host token.
	secondConfig, secondDataDir, secondToken string
}

func filesIn(dataDir string) edgeFiles {
	return edgeFiles{
		dataDir:    filepath.Join(dataDir, "edge"),
		config:     filepath.Join(dataDir, "edge.json"),
		token:      filepath.Join(dataDir, "edge-host-token"),
		secrets:    filepath.Join(dataDir, "edge-secrets.json"),
		upstreamCA: filepath.Join(dataDir, "demo-upstream-ca.pem"),
		caller:     filepath.Join(dataDir, "demo-caller-token"),

		secondConfig:  filepath.Join(dataDir, secondEdgeID+".json"),
		secondDataDir: filepath.Join(dataDir, secondEdgeID),
		secondToken:   filepath.Join(dataDir, secondEdgeID+"-host-token"),
	}
}

// addCredential puts a host token, minted on first start and kept in
// tokenPath, into the stack's own credentials file under ref, keeping what
// else the file holds.
func addCredential(credsPath, ref, tokenPath string) error {
	token, err := localSecret(tokenPath)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(credsPath)
	if err != nil {
		return err
	}
	creds := map[string]string{}
	if err := json.Unmarshal(raw, &creds); err != nil {
		return fmt.Errorf("%s is not a JSON object of strings", credsPath)
	}
	if creds[ref] == token {
		return nil
	}
	creds[ref] = token
	b, err := json.MarshalIndent(creds, "", "  ")
	if err != nil {
		return err
	}
	return writeFilePrivate(credsPath, append(b, '\n'))
}

// localEdgeToken makes sure the edge's token file holds what Fleet's
// credential source has for localEdgeRef (with RUNFLEET_CREDENTIALS of the
// user's own, the local edge takes its token from there).
func localEdgeToken(ctx context.Context, app *fleetapp.App, f edgeFiles) error {
	token, err := app.Credentials.Secret(ctx, localEdgeRef)
	if err != nil {
		return fmt.Errorf("the credential source does not resolve credentialRef %q for the local edge (%v): add it (any secret of 16 or more characters), or set %s=off", localEdgeRef, err, EnvEdge)
	}
	if len(token) < 16 {
		return fmt.Errorf("the credential %q is shorter than 16 characters", localEdgeRef)
	}
	if b, err := os.ReadFile(f.token); err == nil && strings.TrimSpace(string(b)) == token {
		return nil
	}
	return writeFilePrivate(f.token, []byte(token+"\n"))
}

// taskDir is where the local edge keeps its tasks' directories and trust
// files: they must be reachable by the task's user (nobody, when the stack
// runs as root), and the repository the data dir lives in may not be (a
// checkout under /root is not). So they live under the system's temporary
// directory, one per user and data dir, stable across restarts (a retried
// run finds its work dir again).
func taskDir(dataDir string) (string, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(abs))
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("runfleet-dev-%d-%x", os.Getuid(), sum[:6]))
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	// In a directory every user may write, the name may have been taken
	// first: use it only if it is our own directory that nobody else can
	// write to.
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Getuid() || fi.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("%s exists and is not a directory of uid %d that only it can write; remove it", dir, os.Getuid())
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", err
	}
	return filepath.Join(dir, "work"), nil
}

// demoUpstreamAddr is EnvDemoUpstreamAddr, or its default: an IPv4
// loopback address (the proxy pins the demo's name to its IP and lets
// 127.0.0.0/8 through) and a port.
func demoUpstreamAddr(getenv func(string) string) (string, error) {
	addr := getenv(EnvDemoUpstreamAddr)
	if addr == "" {
		return defaultDemoUpstreamAddr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	if _, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || ip.To4() == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("%s=%q: want an IPv4 loopback address and a port, such as %s", EnvDemoUpstreamAddr, addr, defaultDemoUpstreamAddr)
	}
	return addr, nil
}

// localEdge is the running local edge host and its demo upstream.
type localEdge struct {
	host     *host.Host
	upstream *demo.Upstream
	files    edgeFiles
	workDir  string
	sameUser bool
	baseURL  string
	probe    store.Probe // Fleet's first probe of it
}

// startLocalEdge starts the demo upstream and the edge host (the demo
// secret minted on first start), serving until stop; killSwitch keeps its
// secrets proxy down, as edge's EDGE_SECRETS_PROXY=off does.
func startLocalEdge(ctx context.Context, f edgeFiles, addr, upstreamAddr string, killSwitch bool, log *slog.Logger) (*localEdge, error) {
	secret, err := demo.ReadSecretsFile(f.secrets)
	if errors.Is(err, os.ErrNotExist) {
		if secret, err = demo.NewSecret(nil); err == nil {
			err = demo.WriteSecretsFile(f.secrets, secret)
		}
	}
	if err != nil {
		return nil, err
	}
	// The upstream's address first: one in use stops the start before
	// anything is made under the temporary dir.
	up, err := demo.StartUpstream(demo.UpstreamConfig{Secret: secret, Listen: upstreamAddr, Logger: log.With("component", "demo-upstream")})
	if err != nil {
		return nil, inUse(err, EnvDemoUpstreamAddr)
	}
	ok := false
	defer func() {
		if !ok {
			up.Close(context.Background())
		}
	}()
	workDir, err := taskDir(filepath.Dir(f.config))
	if err != nil {
		return nil, fmt.Errorf("the tasks' directory: %w", err)
	}
	e := &localEdge{upstream: up, files: f, workDir: workDir, sameUser: os.Geteuid() != 0}
	spec := demo.Edge{DataDir: f.dataDir, WorkDir: workDir, TokenFile: f.token, SecretsFile: f.secrets,
		UpstreamCAFile: f.upstreamCA, APIListen: addr, InsecureSameUser: e.sameUser, Upstream: up}
	if err := spec.Write(f.config, spec.Config()); err != nil {
		return nil, err
	}
	cfg, err := config.Load(f.config)
	if err != nil {
		return nil, err
	}
	e.host, err = host.Open(ctx, host.Options{Config: cfg, KillSwitch: killSwitch, Logger: log.With("component", "edge")})
	if err != nil {
		// The proxy listens on a free port: only the API's address, which
		// EnvEdgeAddr sets, can be in use.
		return nil, inUse(err, EnvEdgeAddr)
	}
	e.host.Start(nil)
	e.baseURL = "http://" + e.host.APIAddr().String()
	ok = true
	return e, nil
}

// register makes the local edge Fleet's host localEdgeID at its address.
// A restart finds it registered already; registered at another address, it
// is registered again, unless runs still refer to it.
func (e *localEdge) register(ctx context.Context, f *fleet.Fleet) error {
	spec := fleet.HostSpec{ID: localEdgeID, BaseURL: e.baseURL, CredentialRef: localEdgeRef, Labels: map[string]string{"stack": "local"}}
	_, err := f.RegisterHost(ctx, spec)
	if !isFleetCode(err, fleet.CodeHostExists) {
		return err
	}
	h, err := f.Host(ctx, localEdgeID)
	if err != nil {
		return err
	}
	if h.BaseURL == e.baseURL && h.CredentialRef == localEdgeRef {
		return nil
	}
	// Each call is a bounded step (expired runs go a page at a time).
	for done := false; !done; {
		res, err := f.DeleteHost(ctx, localEdgeID, false)
		if isFleetCode(err, fleet.CodeHostInUse) {
			return fmt.Errorf("host %s is registered at %s and runs refer to it: start the local edge there (%s=%s), or start from an empty data dir",
				localEdgeID, h.BaseURL, EnvEdgeAddr, strings.TrimPrefix(h.BaseURL, "http://"))
		}
		if err != nil {
			return err
		}
		done = res.Done
	}
	_, err = f.RegisterHost(ctx, spec)
	return err
}

// writeSecondEdge writes edge-1's edge.json: the local edge's demo (its
// policy, secrets file and upstream), its own data dir, token and host API
// address (secondEdgeAddr), its tasks' dirs beside the local edge's. The
// stack's credentials file must have its token (addCredential).
func (e *localEdge) writeSecondEdge() (*secondEdgeReport, error) {
	spec := demo.Edge{DataDir: e.files.secondDataDir, WorkDir: filepath.Join(filepath.Dir(e.workDir), secondEdgeID+"-work"),
		TokenFile: e.files.secondToken, SecretsFile: e.files.secrets, UpstreamCAFile: e.files.upstreamCA,
		APIListen: secondEdgeAddr, InsecureSameUser: e.sameUser, Upstream: e.upstream}
	if err := spec.Write(e.files.secondConfig, spec.Config()); err != nil {
		return nil, fmt.Errorf("%s's edge.json: %w", secondEdgeID, err)
	}
	return &secondEdgeReport{ID: secondEdgeID, Config: e.files.secondConfig, API: "http://" + secondEdgeAddr, CredentialRef: secondEdgeID}, nil
}

// stop drains the edge host (its runner.drainTimeout, then cancels) and
// stops the upstream.
func (e *localEdge) stop(ctx context.Context) error {
	return errors.Join(e.host.Shutdown(ctx), e.upstream.Close(ctx))
}

// demoCaller makes sure path holds the demo caller's token: the one kept
// there while Fleet still knows it, else a new caller minted (the old one
// revoked first) and kept. The caller may use the local edge and the demo
// project only.
func demoCaller(ctx context.Context, app *fleetapp.App, path string) error {
	if b, err := os.ReadFile(path); err == nil {
		tok := strings.TrimSpace(string(b))
		c, err := app.Store.CallerByTokenHash(ctx, auth.HashToken(tok))
		if err == nil && c.OwnerID == demoOwner {
			return nil
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	if err := app.Fleet.RevokeCaller(ctx, demoOwner); err != nil && !isFleetCode(err, fleet.CodeNotFound) {
		return err
	}
	_, tok, err := app.Fleet.MintCaller(ctx, fleet.CallerSpec{OwnerID: demoOwner,
		AllowedHosts: &store.Scope{IDs: []string{localEdgeID}}, AllowedProjects: &store.Scope{IDs: []string{demo.Project}}})
	if err != nil {
		return err
	}
	if err := writeFilePrivate(path, []byte(tok+"\n")); err != nil {
		return fmt.Errorf("keeping the demo caller's token: %w", err)
	}
	return nil
}

func isFleetCode(err error, code string) bool {
	var fe *fleet.Error
	return errors.As(err, &fe) && fe.Code == code
}

// localSecret reads a secret kept in path, minting and keeping one (0600)
// on first start.
func localSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if tok := strings.TrimSpace(string(b)); len(tok) >= 16 {
			return tok, nil
		}
		return "", fmt.Errorf("%s holds fewer than 16 characters; delete it to mint a new one", path)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	tok, _, err := auth.MintToken(nil)
	if err != nil {
		return "", err
	}
	return tok, writeFilePrivate(path, []byte(tok+"\n"))
}

func writeFilePrivate(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
