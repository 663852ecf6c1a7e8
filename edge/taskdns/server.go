// Package taskdns answers the DNS of one task's network. Edge creates the
// sockets inside the task's network namespace (UDP and TCP on 127.0.0.1:53
// and [::1]:53, where every DNS packet of the task is redirected) and hands
// them to ServePacket and ServeStream; this package opens no socket and
// never forwards a query, so neither the host's resolvers nor its hosts file
// ever answer a task, and a query name (which a task can fill with data)
// goes nowhere but the policy.
//
// A name the policy lets the task reach is answered with a pin: an address
// of the attempt's pin range that maps back to the name (Pins), so that a
// connection to it, redirected to edge, tells edge which name the task
// resolved. Every other name is NXDOMAIN. Only A records carry pins: AAAA
// and every other type get NODATA (an empty success), so a client falls back
// to the IPv4 pin, and no AAAA, HTTPS or SVCB record can steer it to an
// address or endpoint edge did not choose. localhost and *.localhost answer
// loopback (RFC 6761) without asking the policy. Each name refused is told
// to Config.Refused once, for the run's egress ledger.
package taskdns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Verdict is what the policy says about one name.
type Verdict int

const (
	// Refuse answers NXDOMAIN, whatever the type asked.
	Refuse Verdict = iota
	// Resolve pins the name: its A record is the pin.
	Resolve
)

func (v Verdict) String() string {
	switch v {
	case Refuse:
		return "refuse"
	case Resolve:
		return "resolve"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Defaults of Config.
const (
	DefaultTTL         = 60 * time.Second
	DefaultIdleTimeout = 10 * time.Second
	DefaultMaxConns    = 16
)

// Config configures a Server. One Server serves one task.
type Config struct {
	// Decide is asked per query with the canonical name
	// (netname.Canonical of the question's name), on the goroutine
	// serving the query, possibly on several at once; it must not block
	// (no I/O). The proxy answers Resolve for a name a task's key may
	// reach, and for any name when proxy.egress is open. Any verdict but
	// Resolve refuses. Required.
	Decide func(name string) Verdict
	// Pins is the attempt's pin table. Required.
	Pins *Pins
	// Logger receives faults only (a full pin table, a failed write); never
	// a queried name at Info or above, since a name can carry data. Nil
	// discards.
	Logger *slog.Logger
	// TTL of the answers, whole seconds; zero means DefaultTTL. A pin lasts
	// as long as its table, so a long TTL is safe; a short one makes a
	// policy change show sooner in a task's cached answers.
	TTL time.Duration
	// IdleTimeout closes a TCP connection that sends no complete query for
	// this long after the last answer (RFC 7766 6.2.3); zero means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxConns bounds a ServeStream's open connections: each holds a
	// descriptor and a goroutine of edge's, so a task must not hold many. A
	// connection past the bound is closed at once. Zero means
	// DefaultMaxConns.
	MaxConns int
	// Refused, if set, is told of each name answered NXDOMAIN, with why: a
	// name Decide refused (canonical), or a question that is no name edge
	// resolves (as asked, without its final dot). It is called once per
	// name, at its first refusal (resolvers ask again, and for A and AAAA
	// alike), until maxReported names were; past them, at every refusal.
	// A name can carry data, so the proxy hands it to the run's egress
	// ledger alone, never a log. Called on the query's goroutine; it must
	// not block.
	Refused func(name, reason string)
}

// maxReported bounds the names a Server remembers having reported
// (Config.Refused): a task asking name after name costs a bounded set.
const maxReported = 4096

// Reasons given to Config.Refused.
const (
	// ReasonNotReached: Decide refused the name.
	ReasonNotReached = "no key of this run reaches the name"
	// reasonNotAName prefixes why a question is no name edge resolves.
	reasonNotAName = "not a name edge resolves: "
)

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	return c
}

// Validate checks a defaulted Config, naming the field at fault.
func (c Config) Validate() error {
	var errs []error
	if c.Decide == nil {
		errs = append(errs, errors.New("taskdns: Decide is required"))
	}
	if c.Pins == nil {
		errs = append(errs, errors.New("taskdns: Pins is required"))
	}
	// RFC 2181 8: a TTL is at most 2^31-1 seconds.
	if c.TTL < 0 || c.TTL > math.MaxInt32*time.Second {
		errs = append(errs, fmt.Errorf("taskdns: TTL must be 0 to %v, not %v", math.MaxInt32*time.Second, c.TTL))
	}
	if c.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("taskdns: IdleTimeout must not be negative, not %v", c.IdleTimeout))
	}
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("taskdns: MaxConns must not be negative, not %d", c.MaxConns))
	}
	return errors.Join(errs...)
}

// Server answers one task's DNS queries. Safe for concurrent use: one
// Server may serve several sockets at once (UDP and TCP, IPv4 and IPv6).
type Server struct {
	cfg        Config
	ttl        uint32 // cfg.TTL in seconds
	warnedFull atomic.Bool

	// reportedMu guards reported: the names told to Config.Refused.
	reportedMu sync.Mutex
	reported   map[string]struct{}
}

// NewServer checks cfg and fills its defaults.
func NewServer(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, ttl: uint32(cfg.TTL / time.Second), reported: map[string]struct{}{}}, nil
}

// refused tells Config.Refused of name, once while the set has room.
func (s *Server) refused(name, reason string) {
	if s.cfg.Refused == nil {
		return
	}
	s.reportedMu.Lock()
	_, known := s.reported[name]
	if !known && len(s.reported) < maxReported {
		s.reported[name] = struct{}{}
	}
	s.reportedMu.Unlock()
	if !known {
		s.cfg.Refused(name, reason)
	}
}

// ServePacket answers queries on pc (UDP) until pc is closed; it returns nil
// then, and the error otherwise. Queries are answered one at a time:
// answering never waits on anything, so one goroutine keeps up.
func (s *Server) ServePacket(pc net.PacketConn) error {
	buf := make([]byte, maxMessageSize) // the largest datagram; a query is never close
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("taskdns: reading a query: %w", err)
		}
		resp := s.respond(buf[:n], maxUDPSize)
		if resp == nil {
			continue
		}
		if _, err := pc.WriteTo(resp, from); err != nil {
			// The client's loss (it went away, or its socket is full); it
			// asks again.
			s.cfg.Logger.Debug("taskdns: answering over UDP", "error", err)
		}
	}
}

// ServeStream answers DNS over TCP (RFC 7766: a 2-byte length before each
// message, several queries per connection, answered in order; an idle
// timeout) on ln until ln is closed. It then closes the connections it
// accepted and waits for their goroutines before it returns nil; on any
// other accept error it does the same and returns that error.
func (s *Server) ServeStream(ln net.Listener) error {
	var (
		mu    sync.Mutex
		conns = make(map[net.Conn]struct{})
		wg    sync.WaitGroup
	)
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("taskdns: accepting: %w", err)
		}
		mu.Lock()
		full := len(conns) >= s.cfg.MaxConns
		if !full {
			conns[c] = struct{}{}
		}
		mu.Unlock()
		if full {
			c.Close()
			continue
		}
		wg.Go(func() {
			s.serveConn(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			c.Close()
		})
	}
}

// serveConn answers the queries of one TCP connection until the client
// closes it, goes idle, or sends what is not a query.
func (s *Server) serveConn(c net.Conn) {
	var size [2]byte
	var query []byte
	for {
		// One deadline for reading a whole query and writing its answer,
		// so a client trickling bytes is idle too.
		if err := c.SetDeadline(time.Now().Add(s.cfg.IdleTimeout)); err != nil {
			return
		}
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(size[:]))
		query = slices.Grow(query[:0], n)[:n]
		if _, err := io.ReadFull(c, query); err != nil {
			return
		}
		resp := s.respond(query, maxMessageSize)
		if resp == nil {
			return
		}
		framed := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp)))
		if _, err := c.Write(append(framed, resp...)); err != nil {
			return
		}
	}
}
