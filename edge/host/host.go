// Package host assembles one edge host in one process, as `edge serve`
// runs it: the proxy's CA with its rotation, the secrets proxy with its
// policy, secrets source, upstream guard and audit log, the harness runner
// with admission, and the host API, all from edge.json. It owns their
// order: what starts first, and how the host drains and stops.
package host

import (
	"context"
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

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/hostapi"
	"github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy"
	"github.com/runfleet/runfleet/edge/runlog"
	"github.com/runfleet/runfleet/edge/runner"
	"github.com/runfleet/runfleet/edge/secrets"
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
	// it (redact.Set.Writer). Nil makes one for the audit alone.
	Redactor *redact.Set
	// Clock drives the CA's rotation and the runner; default the real clock.
	Clock clock.Clock
	// Rand; default crypto/rand.
	Rand io.Reader
	// AWS loads the AWS configuration, asked only when ca.kmsKeyId or
	// secrets.awsSecretsManager is set; nil uses the SDK's default chain.
	AWS func(context.Context) (aws.Config, error)
	// SystemRootsFile overrides where tasks' trust files take the system
	// roots from (runner.Config.SystemRootsFile).
	SystemRootsFile string
	// BeforeExec is the runner's test hook (runner.Config.BeforeExec).
	BeforeExec func(runID string)
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

// Open builds every part and binds both listeners; nothing is served until
// Start. On error everything opened so far is closed again.
func Open(ctx context.Context, o Options) (_ *Host, err error) {
	if o.Config == nil || o.Config.Path() == "" {
		return nil, errors.New("host: Options.Config must be loaded from a file (config.Load)")
	}
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
	cfg := o.Config
	h := &Host{opts: o, cfg: cfg, log: o.Logger, clock: o.Clock, registry: prometheus.NewRegistry(), errs: make(chan error, 4)}
	var closers []func()
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()
	h.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edge_log_redactor_evicted_total",
			Help: "Real values the log and audit redactor forgot past its bound (" + strconv.Itoa(redact.MaxValues) + " values): one it forgot and the proxy does not read again is no longer redacted.",
		}, func() float64 { return float64(o.Redactor.Evicted()) }))

	if err := prepareDataDir(cfg); err != nil {
		return nil, err
	}
	if err := checkPrivate("api.tokenFile", cfg.API.TokenFile); err != nil {
		return nil, err
	}
	if cfg.Secrets.File != "" {
		if err := checkPrivate("secrets.file", cfg.Secrets.File); err != nil {
			return nil, err
		}
	}
	if cfg.API.TLS.Enabled() {
		// The host API's private key in a task's hands lets it pose as
		// this host to Fleet.
		if err := checkPrivate("api.tls.keyFile", cfg.API.TLS.KeyFile); err != nil {
			return nil, err
		}
	}
	token, err := readToken(cfg.API.TokenFile)
	if err != nil {
		return nil, err
	}

	h.runs, err = runlog.Open(filepath.Join(cfg.DataDir, "runs.db"), o.Rand)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { h.runs.Close() })

	h.watcher, err = policy.NewWatcher(policy.WatcherConfig{Path: cfg.Path(), Clock: o.Clock, Logger: o.Logger})
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}

	sealer, err := h.sealer(ctx)
	if err != nil {
		return nil, err
	}
	h.authority, err = ca.Open(ctx, ca.Config{
		Dir: filepath.Join(cfg.DataDir, "ca"), Lifetime: cfg.CA.Lifetime.D(), SuccessorWindow: cfg.CA.SuccessorWindow.D(),
		SwitchBefore: cfg.CA.SwitchBefore.D(), LeafLifetime: cfg.CA.LeafLifetime.D(),
		Sealer: sealer, Clock: o.Clock, Rand: o.Rand, Logger: o.Logger, AllowName: h.watcher.AllowName,
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { h.authority.Close() })
	trust := caTrust{ca: h.authority, clock: o.Clock}

	h.apiListener, err = net.Listen("tcp", cfg.API.Listen)
	if err != nil {
		return nil, fmt.Errorf("host: api.listen: %w", err)
	}
	closers = append(closers, func() { h.apiListener.Close() })
	if !o.KillSwitch {
		h.proxyListener, err = net.Listen("tcp", cfg.Proxy.Listen)
		if err != nil {
			return nil, fmt.Errorf("host: proxy.listen: %w", err)
		}
		closers = append(closers, func() { h.proxyListener.Close() })
	}
	if cfg.Proxy.Pprof != "" {
		h.pprofListener, err = net.Listen("tcp", cfg.Proxy.Pprof)
		if err != nil {
			return nil, fmt.Errorf("host: proxy.pprof: %w", err)
		}
		closers = append(closers, func() { h.pprofListener.Close() })
		h.pprofServer = newPprofServer()
	}

	h.auditLog, err = audit.Open(audit.Config{
		Dir: filepath.Join(cfg.DataDir, "logs"), MaxBytes: cfg.Proxy.Audit.MaxBytes, Keep: cfg.Proxy.Audit.Keep,
		Registerer: h.registry, Clock: o.Clock, Logger: o.Logger, Redact: o.Redactor.Redact,
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { h.auditLog.Close() })
	if h.proxy, err = h.newProxy(ctx, trust); err != nil {
		return nil, err
	}
	closers = append(closers, func() { h.proxy.Close() })

	rc := runner.FromConfig(cfg)
	rc.Clock, rc.Rand, rc.Logger = o.Clock, o.Rand, o.Logger
	rc.SystemRootsFile, rc.BeforeExec = o.SystemRootsFile, o.BeforeExec
	var broker runner.Broker
	if !o.KillSwitch {
		broker = proxyBroker{proxy: h.proxy}
	}
	h.runner, err = runner.New(rc, h.runs, broker, trust)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { h.runner.Shutdown(context.Background(), 0) })
	h.registry.MustRegister(h.runner.Collectors()...)

	api, err := hostapi.New(hostapi.Config{
		Runner:       h.runner,
		Token:        token,
		SecretsProxy: h.proxy.Ready,
		CA:           h.caInfo,
		Gatherer:     h.registry,
		Logger:       o.Logger,
		Clock:        o.Clock,
	})
	if err != nil {
		return nil, err
	}
	h.apiServer = hostapi.NewServer(api, o.Logger)
	if cfg.API.TLS.Enabled() {
		cert, err := tls.LoadX509KeyPair(cfg.API.TLS.CertFile, cfg.API.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("host: api.tls: %w", err)
		}
		h.apiListener = tls.NewListener(h.apiListener, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}
	return h, nil
}

// prepareDataDir creates the data dir 0700, or 0711 when the runner's work
// dir lies inside it (the default): tasks must reach their own directories
// there, and may pass through the data dir without listing it; everything
// else in it stays 0700/0600.
func prepareDataDir(cfg *config.Config) error {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("host: creating dataDir: %w", err)
	}
	mode := os.FileMode(0o700)
	if rel, err := filepath.Rel(cfg.DataDir, cfg.Runner.WorkDir); err == nil && !strings.HasPrefix(rel, "..") {
		mode = 0o711
	}
	if err := os.Chmod(cfg.DataDir, mode); err != nil {
		return fmt.Errorf("host: setting dataDir's mode: %w", err)
	}
	return nil
}

// checkPrivate refuses a file every user may read: tasks run as another
// user (with no supplementary group), so only its "other" bits would let
// them, and the host token, the secrets file or the host API's TLS key in
// a task's hands is the host's API, every real value, or the host's
// identity.
func checkPrivate(field, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("host: %s: %w", field, err)
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return fmt.Errorf("host: %s %s is readable by every user (mode %04o), tasks included; make it private (chmod o-rwx)", field, path, fi.Mode().Perm())
	}
	return nil
}

// readToken reads the host credential: the file's content without
// surrounding white space, never empty.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("host: api.tokenFile: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("host: api.tokenFile %s is empty", path)
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
	return nil, errors.New("host: secrets: set secrets.file or secrets.awsSecretsManager (or keep the proxy down with EDGE_SECRETS_PROXY=off)")
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
	resolver, err := upstream.NewResolver(h.cfg.Proxy.Upstream, nil)
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
	return proxy.New(proxy.Config{
		Listener: h.proxyListener, Egress: h.cfg.Proxy.Egress, DataDir: h.cfg.DataDir,
		Policy: h.watcher, Leaves: h.authority, CAReady: trust.Valid, Secrets: src,
		Upstream: guard, UpstreamTLS: upstreamTLS, Audit: h.auditLog, Logger: h.log, Clock: h.clock, Rand: h.opts.Rand,
	})
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
