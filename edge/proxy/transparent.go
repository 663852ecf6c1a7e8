package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/edge/taskdns"
)

// maxPins bounds the names one attempt may resolve: a task querying random
// names cannot grow edge's memory past it (about 100 bytes a name).
const maxPins = taskdns.DefaultMaxPins

// pinRange is where a task's pins come from.
var pinRange = netip.MustParsePrefix(taskdns.DefaultPinRange)

// TaskNetwork is what edge serves inside one task's network (package
// sandbox makes it): the task reaches these sockets alone, so what arrives
// on them is the task's.
type TaskNetwork struct {
	// Explicit is the explicit proxy where the task's HTTPS_PROXY points
	// (its credential is still required, and no other task's serves
	// there); nil when none.
	Explicit net.Listener
	// Transparent accept the connections redirected from the task's
	// network; OriginalDestination tells where each was going.
	Transparent         []net.Listener
	OriginalDestination func(net.Conn) (netip.AddrPort, error)
	// DNSPackets and DNSStreams are the task's DNS server (UDP, TCP).
	DNSPackets []net.PacketConn
	DNSStreams []net.Listener
}

// ServeNetwork serves the task's network for its current attempt: its DNS
// (a name a key of the task may reach, and with egress open any name,
// resolves to a pin: an address that stands for that name in this
// attempt), its redirected connections (to a pin: the pinned name is the
// authority, decided as a CONNECT to it would be; to any other address:
// that address is), and its explicit proxy. Everything is closed when the
// attempt ends; a network given once the attempt has ended is closed at
// once and refused.
func (p *Proxy) ServeNetwork(runID string, n TaskNetwork) error {
	closeAll := func() {
		for _, c := range n.closers() {
			c.Close()
		}
	}
	if p.cfg.Disabled {
		closeAll()
		return ErrDisabled
	}
	if len(n.Transparent) > 0 && n.OriginalDestination == nil {
		closeAll()
		return errors.New("proxy: a task network's transparent listeners need OriginalDestination")
	}
	p.reg.mu.Lock()
	var a *attempt
	if t, ok := p.reg.tasks[runID]; ok {
		a = t.attempt
	}
	p.reg.mu.Unlock()
	if a == nil {
		closeAll()
		return fmt.Errorf("%w: %s has no attempt", ErrUnknownTask, runID)
	}
	pins, err := taskdns.NewPins(pinRange, maxPins)
	if err != nil {
		closeAll()
		return err
	}
	dns, err := taskdns.NewServer(taskdns.Config{Pins: pins, Logger: p.cfg.Logger, Decide: func(name string) taskdns.Verdict {
		return p.resolves(a, name)
	}, Refused: func(name, reason string) {
		// The run's ledger alone: a name can carry data.
		p.cfg.Audit.RecordLedgerOnly(audit.Entry{Task: runID, Via: audit.ViaDNS, Host: p.reg.index.Load().Redacted(name), Action: audit.Denied, Reason: reason})
	}})
	if err != nil {
		closeAll()
		return err
	}
	if !a.attach(n.closers()) {
		closeAll()
		return fmt.Errorf("proxy: task %s: the attempt ended", runID)
	}
	bound := &connBound{held: make(chan struct{}, p.cfg.MaxTaskConns), full: func() {
		p.cfg.Logger.Warn("the task's connections reached their bound; more are closed unserved until some end",
			slog.String("task", runID), slog.Int("bound", p.cfg.MaxTaskConns))
	}}
	p.goServe(func() { p.acceptEach(n.Explicit, bound, func(c net.Conn) { p.serveFrontFor(c, a) }) })
	for _, l := range n.Transparent {
		p.goServe(func() {
			p.acceptEach(l, bound, func(c net.Conn) { p.serveTransparent(a, n.OriginalDestination, pins, c) })
		})
	}
	for _, pc := range n.DNSPackets {
		p.goServe(func() { dns.ServePacket(pc) })
	}
	for _, l := range n.DNSStreams {
		p.goServe(func() { dns.ServeStream(l) })
	}
	return nil
}

func (n TaskNetwork) closers() []io.Closer {
	var cs []io.Closer
	if n.Explicit != nil {
		cs = append(cs, n.Explicit)
	}
	for _, l := range append(n.Transparent, n.DNSStreams...) {
		cs = append(cs, l)
	}
	for _, pc := range n.DNSPackets {
		cs = append(cs, pc)
	}
	return cs
}

// goServe runs f as one of the proxy's goroutines, which Close waits for.
// Nothing starts once Close has begun (false then): Close's wait must not
// see the count rise from zero.
func (p *Proxy) goServe(f func()) bool {
	p.spawnMu.Lock()
	defer p.spawnMu.Unlock()
	if p.closed.Load() {
		return false
	}
	p.conns.Add(1)
	go func() {
		defer p.conns.Done()
		f()
	}()
	return true
}

// connBound is the bound of one task network's open connections
// (Config.MaxTaskConns), shared by its listeners.
type connBound struct {
	held   chan struct{} // one token per connection being served
	warned atomic.Bool
	full   func() // called the first time a connection is refused
}

// acceptEach serves every connection l accepts until it is closed, as
// many at once as bound allows; one past it is closed at once, before any
// of it is read.
func (p *Proxy) acceptEach(l net.Listener, bound *connBound, serve func(net.Conn)) {
	if l == nil {
		return
	}
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		select {
		case bound.held <- struct{}{}:
		default:
			c.Close()
			if bound.warned.CompareAndSwap(false, true) {
				bound.full()
			}
			continue
		}
		if !p.goServe(func() {
			defer func() { <-bound.held }()
			serve(c)
		}) {
			<-bound.held
			c.Close()
		}
	}
}

// resolves is the task's DNS policy: a name a key of the task may reach
// (on any port) resolves, and with egress open every name does; the
// connection that follows is decided as a CONNECT would be.
func (p *Proxy) resolves(a *attempt, name string) taskdns.Verdict {
	if p.cfg.Egress == policy.EgressOpen {
		return taskdns.Resolve
	}
	for _, g := range a.task.grantsUnder(p.cfg.Policy.Current()).granted {
		for _, d := range g.Domains {
			if d.Name == name {
				return taskdns.Resolve
			}
		}
	}
	return taskdns.Refuse
}

// transparentTarget is the authority of a redirected connection: the name
// the task resolved when it connected to one of its pins, else the address
// itself, as a CONNECT to that address would name it. A destination on the
// loopback, or none, means the task connected to the listener itself.
func transparentTarget(dst netip.AddrPort, pins *taskdns.Pins) (policy.Authority, error) {
	addr := dst.Addr().Unmap()
	if !dst.IsValid() || addr.IsLoopback() || addr.IsUnspecified() || dst.Port() == 0 {
		return policy.Authority{}, errors.New("the connection has no destination off the task's loopback")
	}
	if name, ok := pins.Name(addr); ok {
		return policy.Authority{Name: name, Port: int(dst.Port())}, nil
	}
	return policy.Authority{IP: addr, Port: int(dst.Port())}, nil
}

// serveTransparent serves one redirected connection: the same decisions,
// interception and audit as a CONNECT to its authority, without the task
// having asked. A tunnel starts at once (the upstream may speak first);
// an intercepted authority must be TLS, and plain HTTP to it is refused:
// a placeholder is substituted over HTTPS only.
func (p *Proxy) serveTransparent(a *attempt, originalDst func(net.Conn) (netip.AddrPort, error), pins *taskdns.Pins, c net.Conn) {
	defer c.Close()
	start := p.cfg.Clock.Now()
	_ = c.SetDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
	ix := p.reg.index.Load()
	entry := audit.Entry{TS: start, Task: a.task.runID, Via: audit.ViaTransparent}
	refuse := func(status int, action audit.Action, reason string) {
		entry.Action, entry.Status, entry.Reason = action, status, reason
		entry.Duration = p.cfg.Clock.Now().Sub(start)
		p.cfg.Audit.Record(entry)
	}
	dst, err := originalDst(c)
	if err != nil {
		p.cfg.Logger.Error("reading a redirected connection's destination", slog.String("task", a.task.runID), slog.String("error", err.Error()))
		entry.Host = "unknown"
		refuse(http.StatusInternalServerError, audit.Denied, "internal error")
		return
	}
	target, err := transparentTarget(dst, pins)
	if err != nil {
		entry.Host = dst.String()
		refuse(http.StatusBadRequest, audit.Denied, err.Error())
		return
	}
	entry.Host = ix.Redacted(target.String())
	if r := p.tripTarget(target.String()); r != nil {
		// The name the task resolved holds a real value (tripwire.go).
		if r.key != (policy.KeyRef{}) {
			entry.Keys = []string{r.key.String()}
		}
		p.alerted(&entry, r)
		refuse(r.status, r.action, r.reason)
		return
	}
	granted := a.task.grantsUnder(p.cfg.Policy.Current()).granted
	decision := policy.DecideConnect(policy.ConnectInput{Target: target, Granted: granted, Egress: p.cfg.Egress})
	if decision.Action == policy.Refuse {
		// The reason names the target, which the task chose.
		refuse(http.StatusForbidden, audit.Denied, ix.Redacted(decision.Reason))
		return
	}
	if !a.track(c) {
		refuse(http.StatusProxyAuthRequired, audit.Denied, "the attempt ended")
		return
	}
	defer a.untrack(c)
	if decision.Action == policy.Tunnel {
		p.tunnel(a, &bufferedConn{Conn: c}, target, entry, false)
		return
	}
	if decision.Action == policy.TerminateSSH {
		p.serveSSH(a, c, target, ix, entry)
		return
	}
	conn := &bufferedConn{Conn: c}
	ci := newConnInfo(a, target, ix)
	ci.via = audit.ViaTransparent
	if decision.Action == policy.InterceptToScrub {
		p.interceptToScrub(a, conn, ci, ix, entry)
		return
	}
	first, err := conn.peekByte()
	if err != nil {
		return // closed before saying anything
	}
	if first != tlsHandshakeRecord {
		p.refusePlainHTTP(conn, target, ix, entry)
		return
	}
	p.intercept(a, conn, ci, ix)
}

// tlsHandshakeRecord is the first byte of a TLS connection (a ClientHello's
// record type).
const tlsHandshakeRecord = 0x16

// peekByte returns the connection's first byte, reading it into pending
// when nothing is pending yet. One byte tells TLS from the rest. Reading
// only that byte, not buffering the ClientHello, keeps an idle
// intercepted connection as small as a CONNECT's: what a bufferedConn
// replays stays referenced for the connection's life
// (BenchmarkIdleInterceptedConnMemory).
func (c *bufferedConn) peekByte() (byte, error) {
	if len(c.pending) == 0 {
		first := make([]byte, 1)
		if _, err := io.ReadFull(c.Conn, first); err != nil {
			return 0, err
		}
		c.pending = first
	}
	return c.pending[0], nil
}

// refusePlainHTTP answers a plain HTTP request to an authority a key of the
// task may reach: 403, audited as blocked, nothing sent upstream. Anything
// that is not HTTP, or whose head passes maxHeadBytes, is just closed.
func (p *Proxy) refusePlainHTTP(c net.Conn, target policy.Authority, ix *placeholder.Index, entry audit.Entry) {
	entry.Action = audit.Blocked
	p.refuseNotTLS(c, ix, entry,
		"plain HTTP to "+target.String()+", which a key of this task may reach: placeholders are substituted over HTTPS only",
		"neither TLS nor HTTP to "+target.String()+", which a key of this task may reach")
}

// refuseNotTLS refuses a connection whose first byte is not TLS, audited
// as entry.Action with status 403: a plain HTTP request is answered 403
// with httpReason (its method and path audited, redacted); anything else,
// or a head past maxHeadBytes, is closed unanswered and audited with
// otherReason. Nothing is sent upstream.
func (p *Proxy) refuseNotTLS(c net.Conn, ix *placeholder.Index, entry audit.Entry, httpReason, otherReason string) {
	req, err := http.ReadRequest(bufio.NewReader(&io.LimitedReader{R: c, N: maxHeadBytes}))
	reason := otherReason
	if err == nil {
		reason = httpReason
		entry.Method = ix.Redacted(req.Method)
		entry.Path = ix.Redacted(req.URL.Path)
		writeStatus(c, http.StatusForbidden, reason, nil)
	}
	entry.Status, entry.Reason = http.StatusForbidden, reason
	entry.Duration = p.cfg.Clock.Now().Sub(entry.TS)
	p.cfg.Audit.Record(entry)
}

// attach ties closers (a task network's sockets) to the attempt, closed
// when it ends; false, and nothing attached, when it already has.
func (a *attempt) attach(cs []io.Closer) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conns == nil {
		return false
	}
	a.closers = append(a.closers, cs...)
	return true
}
