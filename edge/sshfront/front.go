// Package sshfront owns edge's terminating SSH front: the SSH server a
// task's ssh and git reach when they connect to a domain of one of its
// ssh keys, its host key (sealed at rest, stable across restarts), and the
// upstream client that runs there, with the key's real private key, each
// git command package policy allows (DecideSSHExec), relaying one channel
// per command. The private key never enters the task, and nothing but the
// allowed git commands ever runs upstream with it: no shell, pty,
// subsystem, environment, port, agent or X11 forwarding.
//
// Contracts a caller may rely on:
//   - A refused command is answered on its own channel (a "runfleet: ..."
//     line on stderr, exit status 1) and the connection stays usable.
//   - The upstream is dialled at an allowed command, one connection per
//     key at a time, kept for the connection's next commands until none
//     has used it for UpstreamIdle: a connection that only asks for what
//     is refused never reaches it, and one left idle holds none. Its host
//     key must be one knownHosts lists.
//   - Every decision is one audit line; none holds a value, and what the
//     task chose to send passes through the session's Redact first.
package sshfront

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/clock"
)

// Defaults of Config's bounds.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultMaxChannels      = 8
	DefaultMaxConns         = 32
	DefaultUpstreamIdle     = 10 * time.Second
	// upstreamTimeout bounds dialling an upstream and its SSH handshake.
	upstreamTimeout = 20 * time.Second
)

// Recorder takes audit lines; *audit.Log satisfies it.
type Recorder interface {
	Record(audit.Entry)
}

// Dialer reaches upstreams through edge's upstream guard, which resolves
// and classifies the address itself.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config configures a Front.
type Config struct {
	// HostKey is edge's host key (LoadHostKey). Required.
	HostKey ssh.Signer
	// Secrets gives each key's private key, read per upstream connection.
	// Required.
	Secrets secrets.Source
	// Upstream dials upstreams. Required.
	Upstream Dialer
	// Audit records every decision. Required.
	Audit Recorder
	// Logger gets faults, never shown to the task. Required.
	Logger *slog.Logger
	// Clock times audit lines; nil is the real clock.
	Clock clock.Clock
	// HandshakeTimeout bounds a task's SSH handshake; zero is
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxChannels bounds the sessions open at once on one connection;
	// zero is DefaultMaxChannels.
	MaxChannels int
	// MaxConns bounds the SSH connections one task holds at once; zero is
	// DefaultMaxConns.
	MaxConns int
	// UpstreamIdle is how long an upstream connection no command uses is
	// kept for the task connection's next command of its key; zero is
	// DefaultUpstreamIdle. An idle task connection then costs its own
	// memory alone, about half of what it costs with its upstream.
	UpstreamIdle time.Duration
}

// Front serves tasks' SSH connections. Safe for concurrent use.
type Front struct {
	cfg    Config
	server *ssh.ServerConfig
	keys   keyCache

	mu    sync.Mutex
	conns map[string]int // open connections by task
}

// New checks cfg and fills its defaults.
func New(cfg Config) (*Front, error) {
	var missing []string
	for name, ok := range map[string]bool{"HostKey": cfg.HostKey != nil, "Secrets": cfg.Secrets != nil,
		"Upstream": cfg.Upstream != nil, "Audit": cfg.Audit != nil, "Logger": cfg.Logger != nil} {
		if !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("sshfront: Config needs %v", missing)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxChannels <= 0 {
		cfg.MaxChannels = DefaultMaxChannels
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.UpstreamIdle <= 0 {
		cfg.UpstreamIdle = DefaultUpstreamIdle
	}
	server := &ssh.ServerConfig{
		// The connection's origin is the task's identity (its own network
		// namespace reaches this front alone), as for the transparent
		// proxy: the task holds no key, so it authenticates with none.
		NoClientAuth:  true,
		ServerVersion: "SSH-2.0-runfleet",
		MaxAuthTries:  6,
	}
	server.AddHostKey(cfg.HostKey)
	return &Front{cfg: cfg, server: server, conns: map[string]int{}}, nil
}

// HostKey is the public key tasks' known_hosts list.
func (f *Front) HostKey() ssh.PublicKey { return f.cfg.HostKey.PublicKey() }

// Session is what the proxy knows of one task connection.
type Session struct {
	Task      string
	Authority policy.Authority
	// Granted returns the task's keys under the policy in force, asked
	// at each command, so a reload that revokes a key refuses its next
	// command.
	Granted func() []policy.Granted
	// Via is the audit's via (audit.ViaTransparent, or "" for CONNECT).
	Via string
	// Redact takes placeholders out of what the task chose (a command
	// line) before it reaches the audit.
	Redact func(string) string
}

// Serve answers one task connection until either side closes it; c is
// closed when Serve returns.
func (f *Front) Serve(c net.Conn, s Session) {
	defer c.Close()
	if s.Redact == nil {
		s.Redact = func(string) string { return "[redacted]" }
	}
	if !f.acquire(s.Task) {
		f.record(s, f.cfg.Clock.Now(), audit.Entry{Action: audit.Denied, Status: 429,
			Reason: fmt.Sprintf("the task holds %d SSH connections, its bound; this one is closed", f.cfg.MaxConns)})
		return
	}
	defer f.release(s.Task)
	start := f.cfg.Clock.Now()
	_ = c.SetDeadline(time.Now().Add(f.cfg.HandshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(c, f.server)
	if err != nil {
		f.record(s, start, audit.Entry{Action: audit.Denied, Status: 400, Reason: "the task's SSH handshake failed or timed out"})
		f.cfg.Logger.Debug("a task's SSH handshake failed", slog.String("task", s.Task), slog.String("error", err.Error()))
		return
	}
	_ = c.SetDeadline(time.Time{})
	cn := &conn{front: f, s: s, sc: sc, upstream: map[policy.KeyRef]*upstreamConn{}}
	cn.serve(chans, reqs)
	// The task's side is gone: its upstream connections go too, which ends
	// any relay still waiting on an idle upstream, and only then are the
	// sessions waited for.
	cn.closeUpstreams()
	cn.wg.Wait()
}

func (f *Front) acquire(task string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns[task] >= f.cfg.MaxConns {
		return false
	}
	f.conns[task]++
	return true
}

func (f *Front) release(task string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns[task]--; f.conns[task] <= 0 {
		delete(f.conns, task)
	}
}

// record writes one audit line for the session, filling what every line
// shares.
func (f *Front) record(s Session, start time.Time, e audit.Entry) {
	e.TS, e.Task, e.Host, e.Via = start, s.Task, s.Authority.String(), s.Via
	e.Duration = f.cfg.Clock.Now().Sub(start)
	f.cfg.Audit.Record(e)
}

// conn is one task connection: its sessions, and its upstream connections
// by key, each dialled at a command of its key when none is open and
// closed once no command has used it for UpstreamIdle.
type conn struct {
	front *Front
	s     Session
	sc    *ssh.ServerConn

	mu       sync.Mutex
	upstream map[policy.KeyRef]*upstreamConn
	closed   bool // the task's side ended: no upstream is dialled or kept
	open     int  // session channels open
	wg       sync.WaitGroup
}

// upstreamConn is one dial of an upstream, shared by the commands of one
// key on one task connection; err is the dial's failure, kept so that
// every later command of the key is refused the same way.
type upstreamConn struct {
	once   sync.Once
	client ssh.Conn
	err    error
	// Under the conn's mu: the commands using it now, and the timer that
	// closes it once none has for UpstreamIdle.
	users int
	idle  clock.Timer
}

// serve answers the connection's channel opens and its global requests
// until the connection ends.
func (cn *conn) serve(chans <-chan ssh.NewChannel, reqs <-chan *ssh.Request) {
	serveBoth(chans, reqs, cn.channel, cn.globalRequest)
}

// globalRequest refuses a connection-wide request: remote forwarding (-R)
// is audited; keep-alives and the like are answered no, which OpenSSH
// counts as alive.
func (cn *conn) globalRequest(r *ssh.Request) {
	switch r.Type {
	case "tcpip-forward", "streamlocal-forward@openssh.com":
		cn.blocked(cn.front.cfg.Clock.Now(), "request "+r.Type, "remote port forwarding (ssh -R) is not allowed: only git commands run over SSH here")
	}
	if r.WantReply {
		_ = r.Reply(false, nil)
	}
}

// channel accepts a session, up to MaxChannels open at once, and refuses
// any other channel.
func (cn *conn) channel(nc ssh.NewChannel) {
	start := cn.front.cfg.Clock.Now()
	switch nc.ChannelType() {
	case "session":
	case "direct-tcpip", "direct-streamlocal@openssh.com":
		reason := "port forwarding (ssh -L, -D) is not allowed: only git commands run over SSH here"
		_ = nc.Reject(ssh.Prohibited, "runfleet: "+reason)
		cn.blocked(start, "channel "+nc.ChannelType(), reason)
		return
	default:
		_ = nc.Reject(ssh.UnknownChannelType, "runfleet: only sessions running git commands are served here")
		cn.blocked(start, "channel "+cn.s.Redact(nc.ChannelType()), "only sessions running git commands are served here")
		return
	}
	cn.mu.Lock()
	full := cn.open >= cn.front.cfg.MaxChannels
	if !full {
		cn.open++
	}
	cn.mu.Unlock()
	if full {
		_ = nc.Reject(ssh.ResourceShortage, fmt.Sprintf("runfleet: at most %d sessions at once on one connection", cn.front.cfg.MaxChannels))
		cn.blocked(start, "channel session", fmt.Sprintf("the connection has %d sessions open, its bound", cn.front.cfg.MaxChannels))
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		cn.closeChannel()
		return
	}
	cn.wg.Add(1)
	go func() {
		defer cn.wg.Done()
		defer cn.closeChannel()
		cn.session(ch, reqs)
	}()
}

func (cn *conn) closeChannel() {
	cn.mu.Lock()
	cn.open--
	cn.mu.Unlock()
}

// blocked audits a refused request that is not a command.
func (cn *conn) blocked(start time.Time, what, reason string) {
	cn.front.record(cn.s, start, audit.Entry{Action: audit.Blocked, Status: 403, Reason: reason, SSH: &audit.SSHCommand{Request: what}})
}

// dial returns the key's upstream client, dialling it when none is open,
// and done, which the command calls when it has ended.
func (cn *conn) dial(g *policy.Granted) (ssh.Conn, func(), error) {
	cn.mu.Lock()
	if cn.closed {
		cn.mu.Unlock()
		return nil, nil, errTaskGone
	}
	u, ok := cn.upstream[g.Ref]
	if !ok {
		u = &upstreamConn{}
		cn.upstream[g.Ref] = u
	}
	u.users++
	if u.idle != nil {
		u.idle.Stop()
		u.idle = nil
	}
	cn.mu.Unlock()
	u.once.Do(func() {
		client, err := cn.front.dialUpstream(cn.s.Authority, g, func() { cn.forget(g.Ref, u) })
		cn.mu.Lock()
		defer cn.mu.Unlock()
		if cn.closed && client != nil {
			// Dialled while the task's side ended: closeUpstreams has
			// passed it by.
			client.Close()
			client, err = nil, errTaskGone
		}
		u.client, u.err = client, err
	})
	done := func() { cn.release(g.Ref, u) }
	if u.err != nil {
		done()
		return nil, nil, u.err
	}
	return u.client, done, nil
}

// release ends a command's use of u; the last one out leaves it idle, to
// be closed once UpstreamIdle has passed with no command using it (a
// failed dial stays, so that the key's next commands are refused the same
// way).
func (cn *conn) release(ref policy.KeyRef, u *upstreamConn) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if u.users--; u.users > 0 || u.client == nil || cn.closed {
		return
	}
	u.idle = cn.front.cfg.Clock.AfterFunc(cn.front.cfg.UpstreamIdle, func() {
		cn.mu.Lock()
		if u.users > 0 || cn.closed || cn.upstream[ref] != u {
			cn.mu.Unlock()
			return
		}
		delete(cn.upstream, ref)
		cn.mu.Unlock()
		u.client.Close()
	})
}

// forget drops u once its connection has ended, whoever ended it (the
// upstream, the network, edge): the key's next command dials again
// instead of failing on a connection that is gone.
func (cn *conn) forget(ref policy.KeyRef, u *upstreamConn) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.upstream[ref] == u {
		delete(cn.upstream, ref)
	}
	if u.idle != nil {
		u.idle.Stop()
		u.idle = nil
	}
}

// errTaskGone is a dial that completed after the task's connection ended.
var errTaskGone = &upstreamError{reason: "the task's connection ended"}

// closeUpstreams closes every upstream connection, dialled or not yet.
func (cn *conn) closeUpstreams() {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	cn.closed = true
	for _, u := range cn.upstream {
		if u.idle != nil {
			u.idle.Stop()
		}
		if u.client != nil {
			u.client.Close()
		}
	}
}

// upstreamError is why an upstream could not be used, in words the task
// may see: they name the upstream and the key, never a value.
type upstreamError struct {
	reason string
	// hostKey: the upstream presented a key knownHosts does not list.
	hostKey bool
}

func (e *upstreamError) Error() string { return e.reason }

// dialUpstream dials the authority through the guard, checks its host key
// against the key's knownHosts and authenticates as its user with the
// real private key, read now; ended is called once the connection has
// ended.
func (f *Front) dialUpstream(a policy.Authority, g *policy.Granted, ended func()) (ssh.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), upstreamTimeout)
	defer cancel()
	d, _ := a.Domain()
	signer, err := f.keys.signer(ctx, f.cfg.Secrets, g.Ref)
	if err != nil {
		var ke *KeyError
		if errors.As(err, &ke) {
			return nil, &upstreamError{reason: ke.Error()}
		}
		f.cfg.Logger.Error("reading an ssh key's value", slog.String("key", g.Ref.String()), slog.String("error", err.Error()))
		return nil, &upstreamError{reason: fmt.Sprintf("key %s could not be read", g.Ref.Key)}
	}
	raw, err := f.cfg.Upstream.DialContext(ctx, "tcp", a.String())
	if err != nil {
		f.cfg.Logger.Warn("dialling an ssh upstream", slog.String("upstream", a.String()), slog.String("error", err.Error()))
		return nil, &upstreamError{reason: fmt.Sprintf("%s could not be reached", a)}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	var hostKeyErr error
	cfg := &ssh.ClientConfig{
		User: g.SSH.User,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			hostKeyErr = g.SSH.CheckHostKey(d, key)
			return hostKeyErr
		},
		HostKeyAlgorithms: g.SSH.HostKeyAlgorithms(d),
		ClientVersion:     "SSH-2.0-runfleet",
	}
	c, chans, reqs, err := ssh.NewClientConn(raw, a.String(), cfg)
	if err != nil {
		raw.Close()
		if hostKeyErr != nil {
			return nil, &upstreamError{reason: hostKeyErr.Error(), hostKey: true}
		}
		f.cfg.Logger.Warn("the SSH handshake with an upstream failed", slog.String("upstream", a.String()), slog.String("key", g.Ref.String()), slog.String("error", err.Error()))
		return nil, &upstreamError{reason: fmt.Sprintf("%s refused key %s, or its SSH handshake failed", a, g.Ref.Key)}
	}
	_ = raw.SetDeadline(time.Time{})
	// Not ssh.NewClient, whose three goroutines an idle connection would
	// keep: the front opens sessions on the connection itself, and one
	// goroutine refuses what the upstream asks.
	go func() {
		refuseUpstream(chans, reqs)
		ended()
	}()
	return c, nil
}

// refuseUpstream answers what an upstream asks of edge until its
// connection ends, as x/crypto's client does: a channel it opens is
// refused (edge asks for no forwarding), a global request
// (hostkeys-00@openssh.com, a keep-alive) is answered no.
func refuseUpstream(chans <-chan ssh.NewChannel, reqs <-chan *ssh.Request) {
	serveBoth(chans, reqs,
		func(nc ssh.NewChannel) { _ = nc.Reject(ssh.UnknownChannelType, "unknown channel type") },
		func(r *ssh.Request) {
			if r.WantReply {
				_ = r.Reply(false, nil)
			}
		})
}

// serveBoth hands each channel open and each global request of one
// connection to its function, on the calling goroutine, until both
// streams end: x/crypto needs both read, and one goroutine for both is
// half of what a second would cost an idle connection.
func serveBoth(chans <-chan ssh.NewChannel, reqs <-chan *ssh.Request, onChannel func(ssh.NewChannel), onRequest func(*ssh.Request)) {
	for chans != nil || reqs != nil {
		select {
		case nc, ok := <-chans:
			if !ok {
				chans = nil
				continue
			}
			onChannel(nc)
		case r, ok := <-reqs:
			if !ok {
				reqs = nil
				continue
			}
			onRequest(r)
		}
	}
}
