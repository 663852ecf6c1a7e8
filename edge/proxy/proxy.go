// Package proxy owns the secrets proxy: the task registry (tasks, attempts
// and their proxy credentials, and the placeholders minted for them, kept on
// disk for each task's life), its two fronts (the explicit CONNECT listener,
// and each task network's redirected connections and DNS: ServeNetwork),
// which intercept what a task's keys may reach under the same rules (and,
// under open egress, every other name for a run holding a url or body key:
// egress.go), and the one request pipeline that HTTP/1.1 and HTTP/2 share,
// WebSockets included.
// Package placeholder finds and rewrites placeholders and values in bytes,
// asking the pipeline about each occurrence; package http1 frames HTTP/1.1;
// decisions are package policy's pure functions.
//
// Its contracts:
//   - A placeholder becomes its real value only where the policy in force
//     lets the task's key go (the domain, the part of the request);
//     anywhere else, or another task's, it blocks the request whole.
//     Substitution is bounded per request and message (limits.go).
//   - A real value edge holds, sent by a task itself, blocks its request
//     before any of the value leaves; that and a placeholder escaping its
//     bounds raise an alert (tripwire.go).
//   - What a task is sent back never holds, byte for byte, a value its
//     request carried; an answer that cannot be scanned is refused.
//   - Every decision has its audit line, recorded before the task has the
//     whole answer. The audit and the log hold no value, and what a task
//     chose to send (a target, a method, a path) only with its
//     placeholders redacted.
//
// The runner calls Ready, CheckGrant and CheckFleetValues (admission),
// Register, SetCredentials (the values Fleet sends a run, held in memory
// for it: fleetvalues.go), StartAttempt (the task's HTTPS_PROXY),
// ServeNetwork, TaskKeys, ProxiedKeys, MissingCredentials, EndAttempt, Stop
// and Drop; edge serve builds it (New, Serve, Close). A Proxy's methods are
// safe for concurrent use.
//
// See DESIGN.md, section "The secrets proxy", for what is scanned and what
// is not, how answers are scrubbed and streamed, and how edge wires it.
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/internal/throttle"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/edge/sshfront"
	"github.com/runfleet/runfleet/edge/stssession"
	"github.com/runfleet/runfleet/shared/clock"
)

// KillSwitchEnv is the variable that keeps the proxy down: "off".
const KillSwitchEnv = "EDGE_SECRETS_PROXY"

// KillSwitch reads the kill switch through getenv (main passes os.Getenv,
// since main owns the environment): "off" engages it (true: the proxy stays
// down), "" or "on" leaves the proxy up, and anything else is an error
// naming the variable: a typo ("0", "false", "OFF ") must refuse the start,
// not silently leave the proxy up (it failed open).
func KillSwitch(getenv func(string) string) (bool, error) {
	switch v := getenv(KillSwitchEnv); v {
	case "off":
		return true, nil
	case "", "on":
		return false, nil
	default:
		return false, fmt.Errorf("%s=%q: set it to \"off\" to keep the secrets proxy down, or leave it unset (or \"on\") to run it", KillSwitchEnv, v)
	}
}

// PolicySource gives the host policy in force, read per request so a reload
// applies to the next one. *policy.Watcher satisfies it.
type PolicySource interface {
	Current() *policy.Policy
}

var _ PolicySource = (*policy.Watcher)(nil)

// LeafSource issues the certificate for an intercepted name.
// *ca.Authority satisfies it.
type LeafSource interface {
	// GetCertificate is called from the handshake's goroutine with
	// ServerName set to the CONNECT's canonical name (never the client's
	// SNI). It issues only for a name the policy lists, or one AdmitName
	// holds now.
	GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error)
	// AdmitName lets name, which the policy need not list, get a leaf
	// until release is called. The proxy calls it only for a connection
	// decided policy.InterceptToScrub, from that connection's goroutine,
	// and releases it as soon as the handshake ends.
	AdmitName(name string) (release func())
}

// Dialer reaches upstreams; *upstream.Guard satisfies it. It must resolve
// and classify the address itself: the proxy hands it names.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config configures a Proxy.
type Config struct {
	// Disabled is the kill switch (EDGE_SECRETS_PROXY=off): nothing listens,
	// Ready reports ErrDisabled and no task is registered.
	Disabled bool
	// Listener is the bound proxy.listen socket. Required unless Disabled.
	Listener net.Listener
	// Egress is policy.EgressOpen or policy.EgressStrict; empty means strict.
	Egress string
	// DataDir is edge's data dir; placeholders live under
	// <DataDir>/secrets-proxy/placeholders. Required.
	DataDir string
	// Policy is the host policy in force. Required.
	Policy PolicySource
	// Leaves issues intercepted names' certificates. Required.
	Leaves LeafSource
	// CAReady, if set, reports whether the CA can issue (nil = ready); Ready
	// consults it.
	CAReady func() error
	// Secrets gives real values. Required.
	Secrets secrets.Source
	// AWSSessions mints the STS sessions of aws keys that name a role
	// (aws.assumeRole); nil refuses the runs of such keys.
	AWSSessions *stssession.Sessions
	// AWSBodyLimit bounds the body of a SigV4 request whose signature
	// covers the body's hash without stating it (most services but S3):
	// such a body is read whole to check it before anything is sent, to
	// memory up to BodyBufferLimit and beyond that to an unlinked file
	// under <DataDir>/secrets-proxy/spool. Zero means DefaultAWSBodyLimit.
	AWSBodyLimit int64
	// Observe, if set, is handed every real value the proxy derives from
	// what Secrets gave (an AWS key's parts), mints (an STS session's) or
	// holds from Fleet (SetCredentials, and each read after), before it is
	// used: edge's log redaction learns them there.
	Observe func(secrets.Value)
	// RealValues is the tripwire's index of the real values edge holds
	// (tripwire.go): edge's log redactor, which learns every value read
	// through Secrets and handed to Observe. A request from a task that
	// carries one is blocked. nil turns the tripwire off (its alerts on
	// placeholders stay).
	RealValues RealValues
	// SSH is edge's SSH front, which serves the connections to an ssh key's
	// domains; nil refuses the runs of such keys.
	SSH *sshfront.Front
	// Upstream dials upstreams (tunnels and intercepted requests). Required.
	Upstream Dialer
	// UpstreamTLS verifies upstreams (upstream.ClientTLSConfig). Required.
	UpstreamTLS *tls.Config
	// Audit records every decision. Required.
	Audit *audit.Log
	// Logger is for faults; it never receives a value or a placeholder.
	// Required.
	Logger *slog.Logger
	// Clock times audit lines; nil means the real clock.
	Clock clock.Clock
	// Rand mints placeholders and passwords; nil means crypto/rand.
	Rand io.Reader
	// HandshakeTimeout bounds reading a CONNECT and the intercepted TLS
	// handshake; zero means 10s.
	HandshakeTimeout time.Duration
	// IdleTimeout closes an intercepted HTTP/1.1 connection idle this long
	// (to within a second); zero means 5m.
	IdleTimeout time.Duration
	// BodyBufferLimit: a request body with a Content-Length up to this is
	// read whole, scanned and forwarded with an exact length (a block then
	// sends nothing upstream); a longer or unsized body is streamed through
	// the bounded scanner. Zero means 64 KiB.
	BodyBufferLimit int64
	// MaxTaskConns bounds the connections one attempt's network (its
	// explicit proxy and transparent listeners together) has open at once;
	// one past it is closed unserved. Each holds a descriptor and a
	// goroutine of edge's, and usually an upstream connection too, so
	// without a bound one task could take every descriptor edge has, and
	// with them every other task's proxy and the host API. Zero means
	// DefaultMaxTaskConns.
	MaxTaskConns int
}

// DefaultAWSBodyLimit is Config.AWSBodyLimit's default: DynamoDB's
// largest request (BatchWriteItem, 16 MB) and Lambda's synchronous
// payload (6 MB) fit, with room.
const DefaultAWSBodyLimit = 64 << 20

// DefaultMaxTaskConns is Config.MaxTaskConns's default: far above what a
// task's tools open at once (a package manager's tens of parallel
// downloads), and, with runner.maxConcurrent tasks each at the bound and
// an upstream connection for each, well inside the systemd unit's
// LimitNOFILE of 65536.
const DefaultMaxTaskConns = 1024

// Validate reports what is missing, naming the field.
func (c *Config) Validate() error {
	if c.Disabled {
		return nil
	}
	var errs []error
	req := func(ok bool, field string) {
		if !ok {
			errs = append(errs, fmt.Errorf("proxy: %s is required", field))
		}
	}
	req(c.Listener != nil, "Listener")
	req(c.DataDir != "", "DataDir")
	req(c.Policy != nil, "Policy")
	req(c.Leaves != nil, "Leaves")
	req(c.Secrets != nil, "Secrets")
	req(c.Upstream != nil, "Upstream")
	req(c.UpstreamTLS != nil, "UpstreamTLS")
	req(c.Audit != nil, "Audit")
	req(c.Logger != nil, "Logger")
	if c.MaxTaskConns < 0 {
		errs = append(errs, fmt.Errorf("proxy: MaxTaskConns must not be negative, not %d", c.MaxTaskConns))
	}
	if c.Egress != "" && c.Egress != policy.EgressOpen && c.Egress != policy.EgressStrict {
		errs = append(errs, fmt.Errorf("proxy: Egress %q is not %q or %q", c.Egress, policy.EgressOpen, policy.EgressStrict))
	}
	return errors.Join(errs...)
}

// Readiness errors.
var (
	ErrDisabled   = errors.New("proxy: disabled by " + KillSwitchEnv + "=off")
	ErrNotServing = errors.New("proxy: not serving")
	ErrClosed     = errors.New("proxy: closed")
)

// Proxy is the secrets proxy. Its methods are safe for concurrent use.
type Proxy struct {
	cfg Config
	reg *registry
	// awsParsed keeps each aws key's value as last parsed
	// (awsCredentials).
	awsParsed sync.Map
	// faults rate-limits the log lines of failed requests (logFault): a
	// task sending request after request to an upstream that fails costs
	// edge's log a line a minute (the audit keeps each).
	faults *throttle.Log

	transport *roundTripper
	h2        *http2.Server

	// inFlight counts the requests being served (serve); with more than
	// one the proxy is busy, and intercepted sockets are read and written
	// with net.Conn's calls rather than raw ones (rawConn).
	inFlight atomic.Int64

	serving atomic.Bool
	closed  atomic.Bool
	// spawnMu orders goServe against Close's setting closed.
	spawnMu sync.Mutex
	done    chan struct{}
	conns   sync.WaitGroup
}

// New builds the proxy and loads every persisted placeholder (so any task's
// placeholder is recognised from the first request after a restart).
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.AWSBodyLimit == 0 {
		cfg.AWSBodyLimit = DefaultAWSBodyLimit
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	if cfg.Egress == "" {
		cfg.Egress = policy.EgressStrict
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.BodyBufferLimit == 0 {
		cfg.BodyBufferLimit = 64 << 10
	}
	if cfg.MaxTaskConns == 0 {
		cfg.MaxTaskConns = DefaultMaxTaskConns
	}
	p := &Proxy{cfg: cfg, done: make(chan struct{}), faults: throttle.New(cfg.Logger, cfg.Clock, time.Minute)}
	if cfg.Disabled {
		return p, nil
	}
	reg, err := newRegistry(placeholderStore{dir: filepath.Join(cfg.DataDir, "secrets-proxy", "placeholders")}, cfg.Rand)
	if err != nil {
		return nil, err
	}
	p.reg = reg
	p.transport = newRoundTripper(cfg.Upstream.DialContext, cfg.UpstreamTLS, 90*time.Second)
	p.transport.busy = p.busy
	p.h2 = &http2.Server{IdleTimeout: cfg.IdleTimeout, MaxReadFrameSize: h2MaxFrameSize}
	return p, nil
}

// busy reports whether another request than the caller's may be in flight:
// then a raw system call the kernel preempts may strand goroutines queued
// behind it (rawConn). Requests waiting for a processor to read their head
// are not counted yet, so the count runs low under load, whence one.
func (p *Proxy) busy() bool { return p.inFlight.Load() > 1 }

// Serve accepts CONNECTs until Close. With the kill switch on it returns
// ErrDisabled at once.
func (p *Proxy) Serve() error {
	if p.cfg.Disabled {
		return ErrDisabled
	}
	if p.closed.Load() {
		return ErrClosed
	}
	p.serving.Store(true)
	defer p.serving.Store(false)
	for {
		c, err := p.cfg.Listener.Accept()
		if err != nil {
			if p.closed.Load() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("proxy: accepting: %w", err)
		}
		if !p.goServe(func() { p.serveFront(c) }) {
			c.Close()
		}
	}
}

// Close stops accepting, closes every connection and waits for them.
func (p *Proxy) Close() error {
	if p.cfg.Disabled {
		return nil
	}
	p.spawnMu.Lock()
	first := p.closed.CompareAndSwap(false, true)
	p.spawnMu.Unlock()
	if !first {
		return nil
	}
	close(p.done)
	err := p.cfg.Listener.Close()
	p.reg.closeAll()
	p.conns.Wait()
	p.transport.CloseIdleConnections()
	return err
}

// Ready is nil when the proxy can serve a task now: not disabled, serving,
// and the CA ready. Admission refuses with broker_not_ready otherwise.
func (p *Proxy) Ready() error {
	switch {
	case p.cfg.Disabled:
		return ErrDisabled
	case p.closed.Load():
		return ErrClosed
	case !p.serving.Load():
		return ErrNotServing
	}
	if p.cfg.CAReady != nil {
		if err := p.cfg.CAReady(); err != nil {
			return fmt.Errorf("proxy: CA not ready: %w", err)
		}
	}
	return nil
}

// Addr is where the proxy listens (nil when disabled).
func (p *Proxy) Addr() net.Addr {
	if p.cfg.Listener == nil {
		return nil
	}
	return p.cfg.Listener.Addr()
}
