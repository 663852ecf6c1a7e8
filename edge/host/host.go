// Package host assembles one edge host in one process, as `edge serve`
// runs it: the proxy's CA with its rotation, the secrets proxy with its
// policy, secrets source, upstream guard and audit log, runs' egress
// ledgers, the harness runner with admission, and the host API, all from
// edge.json. It owns their order: what starts first, and how the host
// drains and stops.
package host

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/hostapi"
	"github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/ledger"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/runner"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/edge/sshfront"
	"github.com/runfleet/runfleet/edge/stssession"
	"github.com/runfleet/runfleet/edge/upstream"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// Options configures a Host.
type Options struct {
	// Config is edge.json, loaded (config.Load) so its path is known: the
	// policy is re-read from it. Required.
	Config *config.Config
	// KillSwitch keeps the secrets proxy down (EDGE_SECRETS_PROXY=off); main
	// reads the environment.
	KillSwitch bool
	// Logger; default discards.
	Logger *slog.Logger
	// Redactor learns every real value the secrets proxy reads and is
	// applied to every audit line; main also passes Logger's output through
	// it (redact.Set.Writer); the proxy's tripwire looks for its values in
	// what tasks send. Nil makes one for the audit and the tripwire.
	Redactor *redact.Set
	// Clock drives the CA's rotation and the runner; default the real clock.
	Clock clock.Clock
	// Rand; default crypto/rand.
	Rand io.Reader
	// AWS loads edge's own AWS configuration: for ca.kmsKeyId,
	// secrets.awsSecretsManager, and the STS sessions of aws keys that
	// name a role (loaded at start; the SDK asks for credentials only when
	// a call needs them). Nil uses the SDK's default chain.
	AWS func(context.Context) (aws.Config, error)
	// SystemRootsFile overrides where tasks' trust files take the system
	// roots from (runner.Config.SystemRootsFile).
	SystemRootsFile string
	// BeforeExec is the runner's test hook (runner.Config.BeforeExec).
	BeforeExec func(runID string)

	// ledgerOff runs the host without egress ledgers: the benchmarks'
	// baseline, set by this package's tests alone.
	ledgerOff bool
}

// Host is one running edge. Open it, Start it, Shutdown it.
type Host struct {
	opts     Options
	cfg      *config.Config
	log      *slog.Logger
	clock    clock.Clock
	registry *prometheus.Registry

	runs      *runlog.Log
	watcher   *policy.Watcher
	authority *ca.Authority
	// sshHostKey is edge's SSH host key, sealed beside the CA.
	sshHostKey ssh.Signer
	// ledgerKey seals runs' egress ledgers; sealed beside the CA too.
	ledgerKey ed25519.PrivateKey
	ledger    *ledger.Ledger // nil when Options.ledgerOff
	auditLog  *audit.Log
	proxy     *proxy.Proxy
	runner    *runner.Runner

	apiListener   net.Listener
	proxyListener net.Listener
	apiServer     *http.Server
	pprofListener net.Listener // nil unless proxy.pprof is set
	pprofServer   *http.Server

	stop     context.CancelFunc
	errs     chan error
	serving  sync.WaitGroup
	shutOnce sync.Once
	shutErr  error
}

// Open checks the config (Check) and refuses it, writing nothing, on any
// problem; then it builds every part and binds both listeners; nothing is
// served until Start. On error everything opened so far is closed again.
func Open(ctx context.Context, o Options) (_ *Host, err error) {
	if o.Config == nil || o.Config.Path() == "" {
		return nil, errors.New("host: Options.Config must be loaded from a file (config.Load)")
	}
	o = withDefaults(o)
	h := &Host{opts: o, cfg: o.Config, log: o.Logger, clock: o.Clock, registry: prometheus.NewRegistry(), errs: make(chan error, 4)}
	var undo closers
	defer func() {
		if err != nil {
			undo.close()
		}
	}()
	h.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edge_log_redactor_evicted_total",
			Help: "Real values the log and audit redactor forgot past its bound (" + strconv.Itoa(redact.MaxValues) + " values): one it forgot and the proxy does not read again is no longer redacted.",
		}, func() float64 { return float64(o.Redactor.Evicted()) }))

	report := Check(ctx, o)
	if len(report.Problems) > 0 {
		return nil, fmt.Errorf("host: %w", report.Problems)
	}
	for _, n := range report.Notes {
		h.log.Info("edge config note", "field", n.Path, "note", n.Msg)
	}
	token, err := prepareFiles(h.cfg)
	if err != nil {
		return nil, err
	}
	trust, err := h.openStores(ctx, &undo)
	if err != nil {
		return nil, err
	}
	if err := h.listen(&undo); err != nil {
		return nil, err
	}
	if err := h.openParts(ctx, trust, &undo); err != nil {
		return nil, err
	}
	if err := h.openAPI(token); err != nil {
		return nil, err
	}
	return h, nil
}

// withDefaults fills Options' zero values.
func withDefaults(o Options) Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Redactor == nil {
		o.Redactor = redact.NewSet(0)
	}
	if o.AWS == nil {
		o.AWS = func(ctx context.Context) (aws.Config, error) { return awsconfig.LoadDefaultConfig(ctx) }
	}
	return o
}

// closers undoes a partial Open, last opened first closed.
type closers []func()

func (c *closers) add(f func()) { *c = append(*c, f) }

func (c closers) close() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// prepareFiles prepares the data dir and reads the host credential.
func prepareFiles(cfg *config.Config) (token string, err error) {
	if err := prepareDataDir(cfg); err != nil {
		return "", err
	}
	if token, err = readToken(cfg.API.TokenFile); err != nil {
		return "", fmt.Errorf("host: api.tokenFile: %w", err)
	}
	return token, nil
}

// openStores opens what the host keeps in its data dir: the run log, the
// policy (from edge.json) and the proxy's CA, which tasks trust.
func (h *Host) openStores(ctx context.Context, undo *closers) (caTrust, error) {
	var err error
	h.runs, err = runlog.Open(filepath.Join(h.cfg.DataDir, "runs.db"), h.opts.Rand)
	if err != nil {
		return caTrust{}, err
	}
	undo.add(func() { h.runs.Close() })
	h.watcher, err = policy.NewWatcher(policy.WatcherConfig{Path: h.cfg.Path(), Clock: h.clock, Logger: h.log})
	if err != nil {
		return caTrust{}, fmt.Errorf("host: %w", err)
	}
	sealer, err := h.sealer(ctx)
	if err != nil {
		return caTrust{}, err
	}
	c := h.cfg.CA
	h.authority, err = ca.Open(ctx, ca.Config{
		Dir: filepath.Join(h.cfg.DataDir, "ca"), Lifetime: c.Lifetime.D(), SuccessorWindow: c.SuccessorWindow.D(),
		SwitchBefore: c.SwitchBefore.D(), LeafLifetime: c.LeafLifetime.D(),
		Sealer: sealer, Clock: h.clock, Rand: h.opts.Rand, Logger: h.log, AllowName: h.watcher.AllowName,
	})
	if err != nil {
		return caTrust{}, err
	}
	undo.add(func() { h.authority.Close() })
	if h.sshHostKey, err = sshfront.LoadHostKey(ctx, h.cfg.DataDir, sealer, h.opts.Rand); err != nil {
		return caTrust{}, fmt.Errorf("host: %w", err)
	}
	if h.ledgerKey, err = ledger.LoadKey(ctx, h.cfg.DataDir, sealer, h.opts.Rand); err != nil {
		return caTrust{}, fmt.Errorf("host: %w", err)
	}
	return caTrust{ca: h.authority, clock: h.clock}, nil
}

// listen binds the host API, the secrets proxy (unless the kill switch
// keeps it down) and pprof (when proxy.pprof is set).
func (h *Host) listen(undo *closers) error {
	var err error
	if h.apiListener, err = net.Listen("tcp", h.cfg.API.Listen); err != nil {
		return fmt.Errorf("host: api.listen: %w", err)
	}
	undo.add(func() { h.apiListener.Close() })
	if !h.opts.KillSwitch {
		if h.proxyListener, err = net.Listen("tcp", h.cfg.Proxy.Listen); err != nil {
			return fmt.Errorf("host: proxy.listen: %w", err)
		}
		undo.add(func() { h.proxyListener.Close() })
	}
	if h.cfg.Proxy.Pprof != "" {
		if h.pprofListener, err = net.Listen("tcp", h.cfg.Proxy.Pprof); err != nil {
			return fmt.Errorf("host: proxy.pprof: %w", err)
		}
		undo.add(func() { h.pprofListener.Close() })
		h.pprofServer = newPprofServer()
	}
	return nil
}

// openParts builds runs' egress ledgers, the audit log that feeds them,
// the secrets proxy and the runner, which knows the proxy as its broker
// (none while the kill switch keeps it down) and seals a run's ledger as
// each attempt ends.
func (h *Host) openParts(ctx context.Context, trust caTrust, undo *closers) error {
	var err error
	var toLedger func([]audit.Entry)
	if !h.opts.ledgerOff {
		h.ledger, err = ledger.New(ledger.Config{
			Store: h.runs, Key: h.ledgerKey, MaxRecords: h.cfg.Proxy.Ledger.MaxRecords, Redact: h.opts.Redactor.Redact,
			// h.auditLog is opened below, before anything can seal: the
			// runner is made last.
			Flush: func() { h.auditLog.Flush() },
			Clock: h.clock, Logger: h.log,
		})
		if err != nil {
			return fmt.Errorf("host: %w", err)
		}
		undo.add(func() { h.ledger.Close() })
		toLedger = h.ledger.Record
	}
	a := h.cfg.Proxy.Audit
	h.auditLog, err = audit.Open(audit.Config{
		Dir: filepath.Join(h.cfg.DataDir, "logs"), MaxBytes: a.MaxBytes, Keep: a.Keep,
		Registerer: h.registry, Clock: h.clock, Logger: h.log, Redact: h.opts.Redactor.Redact, Ledger: toLedger,
	})
	if err != nil {
		return err
	}
	undo.add(func() { h.auditLog.Close() })
	if h.proxy, err = h.newProxy(ctx, trust); err != nil {
		return err
	}
	undo.add(func() { h.proxy.Close() })

	rc := runnerConfig(h.cfg)
	rc.Clock, rc.Rand, rc.Logger = h.clock, h.opts.Rand, h.log
	rc.SystemRootsFile, rc.BeforeExec = h.opts.SystemRootsFile, h.opts.BeforeExec
	if h.ledger != nil {
		rc.AttemptEnded = h.sealLedger
	}
	var broker runner.Broker
	if !h.opts.KillSwitch {
		broker = proxyBroker{proxy: h.proxy, ledger: h.ledger}
	}
	if h.runner, err = runner.New(rc, h.runs, broker, trust); err != nil {
		return err
	}
	undo.add(func() { h.runner.Shutdown(context.Background(), 0) })
	h.registry.MustRegister(h.runner.Collectors()...)
	return nil
}

// sealLedger seals the run's egress ledger as an attempt ends
// (runner.Config.AttemptEnded), once the proxy's handlers of the attempt's
// closed connections have recorded their decisions: a tunnel the task
// closed as it exited is in the seal, so a verifier never finds the
// host's seal ahead of a mirror taken at the run's end. A seal that
// cannot be stored leaves the ledger unsealed, which a verifier reports:
// the run's end goes on.
func (h *Host) sealLedger(runID string) {
	h.proxy.Settle(runID)
	if err := h.ledger.Seal(runID); err != nil {
		h.log.Error("sealing a run's egress ledger", "run", runID, "error", err.Error())
	}
}

// runnerConfig takes the runner's settings from edge.json, defaulted.
func runnerConfig(c *config.Config) runner.Config {
	agents := make(map[string]runner.Agent, len(c.Agents))
	for name, a := range c.Agents {
		agents[name] = runner.Agent{Argv: a.Argv, Env: a.Env}
	}
	r := c.Runner
	return runner.Config{
		Agents:           agents,
		User:             r.User,
		InsecureSameUser: r.InsecureSameUser,
		Egress:           r.Egress,
		Roots:            r.Roots,
		WorkDir:          r.WorkDir,
		MaxConcurrent:    r.MaxConcurrent,
		MaxDuration:      r.MaxDuration.D(),
		MaxOutputBytes:   r.MaxOutputBytes,
		CancelGrace:      r.CancelGrace.D(),
		Retention:        r.Retention.D(),
		MinFreeBytes:     int64(r.MinFreeBytes),
		Limits:           runner.Limits{None: r.Limits.None, MemoryBytes: int64(r.Limits.Memory), Pids: r.Limits.Pids, CPU: r.Limits.CPU},
	}
}

// openAPI builds the host API's server over the runner, on TLS when
// api.tls is set.
func (h *Host) openAPI(token string) error {
	api, err := hostapi.New(hostapi.Config{
		Runner:       h.runner,
		Token:        token,
		SecretsProxy: h.proxy.Ready,
		CA:           h.caInfo,
		Ledger:       h.hostapiLedger(),
		Gatherer:     h.registry,
		Logger:       h.log,
		Clock:        h.clock,
	})
	if err != nil {
		return err
	}
	h.apiServer = hostapi.NewServer(api, h.log)
	if !h.cfg.API.TLS.Enabled() {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(h.cfg.API.TLS.CertFile, h.cfg.API.TLS.KeyFile)
	if err != nil {
		return fmt.Errorf("host: api.tls: %w", err)
	}
	h.apiListener = tls.NewListener(h.apiListener, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	return nil
}

// hostapiLedger is the ledger the host API serves, none when it is off.
func (h *Host) hostapiLedger() hostapi.Ledger {
	if h.ledger == nil {
		return nil
	}
	return h.ledger
}

// prepareDataDir creates the data dir and gives it dataDirMode.
func prepareDataDir(cfg *config.Config) error {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("host: creating dataDir: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, dataDirMode(cfg)); err != nil {
		return fmt.Errorf("host: setting dataDir's mode: %w", err)
	}
	return nil
}

// dataDirMode is 0700, or 0711 when the runner's work dir lies inside the
// data dir (the default): tasks must reach their own directories there, and
// may pass through the data dir without listing it; everything else in it
// stays 0700/0600.
func dataDirMode(cfg *config.Config) os.FileMode {
	if within(cfg.DataDir, cfg.Runner.WorkDir) {
		return 0o711
	}
	return 0o700
}

// readToken reads the host credential: the file's content without
// surrounding white space, never empty.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return token, nil
}

func (h *Host) sealer(ctx context.Context) (ca.Sealer, error) {
	if id := h.cfg.CA.KMSKeyID; id != "" {
		ac, err := h.opts.AWS(ctx)
		if err != nil {
			return nil, fmt.Errorf("host: ca.kmsKeyId: loading the AWS configuration: %w", err)
		}
		return ca.NewKMSSealer(kms.NewFromConfig(ac), id), nil
	}
	s, err := ca.NewFileSealer(h.cfg.CA.SealKeyFile, h.opts.Rand)
	if err != nil {
		return nil, fmt.Errorf("host: ca.sealKeyFile: %w", err)
	}
	return s, nil
}

func (h *Host) secretsSource(ctx context.Context) (secrets.Source, error) {
	switch s := h.cfg.Secrets; {
	case s.File != "":
		return secrets.NewFileSource(s.File)
	case s.AWSSecretsManager != nil:
		ac, err := h.opts.AWS(ctx)
		if err != nil {
			return nil, fmt.Errorf("host: secrets.awsSecretsManager: loading the AWS configuration: %w", err)
		}
		return secrets.NewAWSSource(secrets.AWSConfig{
			Client: secretsmanager.NewFromConfig(ac), Prefix: s.AWSSecretsManager.Prefix,
			CacheTTL: s.AWSSecretsManager.CacheTTL.D(), Clock: h.clock,
		})
	}
	return nil, errors.New("host: secrets: " + noSecretsSource)
}

func (h *Host) newProxy(ctx context.Context, trust caTrust) (*proxy.Proxy, error) {
	if h.opts.KillSwitch {
		h.log.Warn("secrets proxy kept down by " + proxy.KillSwitchEnv + "=off: runs that declare secrets are refused")
		return proxy.New(proxy.Config{Disabled: true})
	}
	src, err := h.secretsSource(ctx)
	if err != nil {
		return nil, err
	}
	src = secrets.Observed(src, h.opts.Redactor.Add)
	u := h.cfg.Proxy.Upstream
	resolver, err := upstream.NewResolver(u.Resolver, u.Resolve, nil)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	allow, err := upstream.ParseAllowPrivate(h.cfg.Proxy.Upstream.AllowPrivate)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	var own []netip.AddrPort
	for _, l := range []net.Listener{h.proxyListener, h.apiListener} {
		if ap, err := netip.ParseAddrPort(l.Addr().String()); err == nil {
			own = append(own, ap)
		}
	}
	guard, err := upstream.NewGuard(upstream.GuardConfig{Resolver: resolver, AllowPrivate: allow, Own: own})
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	upstreamTLS, err := upstream.ClientTLSConfig(h.cfg.Proxy.Upstream.ExtraRootsFile)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	sshFront, err := sshfront.New(sshfront.Config{HostKey: h.sshHostKey, Secrets: src, Upstream: guard, Audit: h.auditLog, Logger: h.log, Clock: h.clock})
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	return proxy.New(proxy.Config{
		Listener: h.proxyListener, Egress: h.cfg.Proxy.Egress, DataDir: h.cfg.DataDir,
		Policy: h.watcher, Leaves: h.authority, CAReady: trust.Valid, Secrets: src, SSH: sshFront,
		AWSSessions: h.awsSessions(ctx), Observe: h.opts.Redactor.Add, RealValues: h.opts.Redactor,
		Upstream: guard, UpstreamTLS: upstreamTLS, Audit: h.auditLog, Logger: h.log, Clock: h.clock, Rand: h.opts.Rand,
	})
}

// awsSessions mints the STS sessions of aws keys that name a role, with
// edge's own AWS configuration. It is made whatever the policy holds now
// (a reload may add such a key); when the configuration cannot be loaded,
// the runs of such keys are refused broker_not_ready, saying so.
func (h *Host) awsSessions(ctx context.Context) *stssession.Sessions {
	ac, err := h.opts.AWS(ctx)
	if err != nil {
		h.log.Warn("aws keys with aws.assumeRole cannot be used: loading edge's AWS configuration failed", slog.String("error", err.Error()))
		return nil
	}
	return stssession.New(stssession.NewClient(ac), h.clock)
}

func (h *Host) caInfo() *hostproto.CAInfo {
	st := h.authority.Status()
	info := &hostproto.CAInfo{NotAfter: st.Signer.NotAfter}
	if st.Successor != nil {
		na := st.Successor.NotAfter
		info.SuccessorNotAfter = &na
	}
	return info
}

// Start serves the host API and the proxy, and follows the policy file
// (and hup: main's SIGHUP channel, nil for none) until Shutdown.
func (h *Host) Start(hup <-chan os.Signal) {
	ctx, stop := context.WithCancel(context.Background())
	h.stop = stop
	h.serving.Add(2)
	go func() {
		defer h.serving.Done()
		h.watcher.Run(ctx, hup)
	}()
	go func() {
		defer h.serving.Done()
		if err := h.apiServer.Serve(h.apiListener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.errs <- fmt.Errorf("host: serving the host API: %w", err)
		}
	}()
	if !h.opts.KillSwitch {
		h.serving.Add(1)
		go func() {
			defer h.serving.Done()
			if err := h.proxy.Serve(); err != nil {
				h.errs <- fmt.Errorf("host: serving the secrets proxy: %w", err)
			}
		}()
	}
	if h.pprofServer != nil {
		h.serving.Add(1)
		go func() {
			defer h.serving.Done()
			if err := h.pprofServer.Serve(h.pprofListener); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.errs <- fmt.Errorf("host: serving proxy.pprof: %w", err)
			}
		}()
		h.log.Warn("profiling edge on proxy.pprof", "addr", h.pprofListener.Addr().String())
	}
	h.log.Info("edge serving", "api", h.apiListener.Addr().String(), "proxy", h.ProxyAddr(), "secretsProxy", !h.opts.KillSwitch)
}

// Errs delivers a fault that stops serving (a listener failing); main
// then shuts the host down.
func (h *Host) Errs() <-chan error { return h.errs }

// ReloadPolicy re-reads the policy now (SIGHUP does the same); an invalid
// file keeps the policy in force and says why.
func (h *Host) ReloadPolicy() error { return h.watcher.Reload() }

// Shutdown drains the host as DESIGN.md says: it admits nothing more,
// waits for idle up to runner.drainTimeout, cancels what still runs
// (host_shutdown), stops the listeners, waits for the CA's trust
// deliveries, and closes its files. ctx bounds it all.
func (h *Host) Shutdown(ctx context.Context) error {
	h.shutOnce.Do(func() {
		var errs []error
		if err := h.runner.Shutdown(ctx, h.cfg.Runner.DrainTimeout.D()); err != nil {
			errs = append(errs, err)
		}
		if err := h.apiServer.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("host: stopping the host API: %w", err))
		}
		if h.pprofServer != nil {
			h.pprofServer.Close()
		}
		if err := h.proxy.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("host: stopping the proxy: %w", err))
		}
		if h.stop != nil {
			h.stop()
		}
		h.serving.Wait()
		if err := h.authority.Close(); err != nil {
			errs = append(errs, err)
		}
		if err := h.auditLog.Close(); err != nil {
			errs = append(errs, err)
		}
		// After the audit, whose last flush it stores; before the run log.
		if h.ledger != nil {
			if err := h.ledger.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := h.runs.Close(); err != nil {
			errs = append(errs, err)
		}
		h.shutErr = errors.Join(errs...)
		h.log.Info("edge stopped")
	})
	return h.shutErr
}

// APIAddr is where the host API listens.
func (h *Host) APIAddr() net.Addr { return h.apiListener.Addr() }

// ProxyAddr is where the secrets proxy listens, "" when it is down.
func (h *Host) ProxyAddr() string {
	if h.proxyListener == nil {
		return ""
	}
	return h.proxyListener.Addr().String()
}

// PprofAddr is where proxy.pprof serves profiles, "" when it is off.
func (h *Host) PprofAddr() string {
	if h.pprofListener == nil {
		return ""
	}
	return h.pprofListener.Addr().String()
}

// Runner is the host's runner (tests drive its hooks through it).
func (h *Host) Runner() *runner.Runner { return h.runner }

// CABundle is the proxy CA's bundle.
func (h *Host) CABundle() []byte { return h.authority.Bundle() }
