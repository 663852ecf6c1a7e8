package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
	"github.com/runfleet/runfleet/shared/netname"
)

// connInfo is what the pipeline knows about an intercepted connection.
type connInfo struct {
	attempt *attempt
	target  policy.Authority
	// sniOK: the client's SNI named the CONNECT's name. Otherwise every
	// request on the connection is misdirected (421).
	sniOK bool
	// addr and hostHeader are target.String() and target.HostHeader(),
	// spelled once per connection instead of per request; empty means not
	// spelled yet.
	addr, hostHeader string
	// logHost is addr as the audit and the log may hold it (redacted).
	logHost string
	// via is the audit's Via: how the connection reached the proxy.
	via string
}

func newConnInfo(a *attempt, target policy.Authority, ix *placeholder.Index) *connInfo {
	addr := target.String()
	return &connInfo{attempt: a, target: target, addr: addr, hostHeader: target.HostHeader(), logHost: ix.Redacted(addr)}
}

// address is the CONNECT's authority as host:port.
func (ci *connInfo) address() string {
	if ci.addr != "" {
		return ci.addr
	}
	return ci.target.String()
}

// names reports whether an authority (a Host, :authority or absolute URL's
// host) names the CONNECT's. The CONNECT's own spellings, what clients send,
// are recognised without parsing: each is canonical, so it parses to the
// target itself.
func (ci *connInfo) names(authority string) bool {
	if ci.target.Name != "" && ci.addr != "" && (authority == ci.hostHeader || authority == ci.addr) {
		return true
	}
	a, err := policy.ParseAuthority(authority, false)
	return err == nil && policy.SameAuthority(a, ci.target)
}

type connInfoKey struct{}

func connInfoFrom(ctx context.Context) *connInfo {
	ci, _ := ctx.Value(connInfoKey{}).(*connInfo)
	return ci
}

// bufferedConn replays what the CONNECT's reader buffered past the request
// (a client may send its ClientHello right behind the CONNECT).
type bufferedConn struct {
	net.Conn
	pending []byte
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil // the buffer is not kept for the connection's life
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// serveFront reads one CONNECT, authenticates it and intercepts, tunnels or
// refuses it.
func (p *Proxy) serveFront(c net.Conn) { p.serveFrontFor(c, nil) }

// serveFrontFor is serveFront for the explicit proxy in a task's network
// when only is that task's attempt: a credential of any other attempt is
// refused there as an unknown one is, so that a credential leaked to
// another task is of no use in that task's network.
func (p *Proxy) serveFrontFor(c net.Conn, only *attempt) {
	defer c.Close()
	start := p.cfg.Clock.Now()
	_ = c.SetDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
	// What follows the CONNECT's head is read from c itself (pending
	// replays what br read ahead), so the bound is on the head alone.
	br := bufio.NewReaderSize(&io.LimitedReader{R: c, N: maxHeadBytes}, 2048)
	req, err := http.ReadRequest(br)
	if err != nil {
		if err != io.EOF {
			writeStatus(c, http.StatusBadRequest, "malformed proxy request", nil)
		}
		return
	}
	// The audit line holds only what was parsed of the target, redacted,
	// and the method redacted: a local user may send any bytes here,
	// credentials or not.
	ix := p.reg.index.Load()
	target, targetErr := policy.ParseAuthority(req.RequestURI, true)
	entry := audit.Entry{TS: start, Method: ix.Redacted(req.Method), Host: fmt.Sprintf("unparseable (%d bytes)", len(req.RequestURI))}
	if targetErr == nil {
		entry.Host = ix.Redacted(target.String())
	}
	deny := func(r *refusal) {
		writeStatus(c, r.status, r.reason, r.header)
		entry.Action, entry.Status, entry.Reason = r.action, r.status, r.reason
		if r.key != (policy.KeyRef{}) {
			entry.Keys = []string{r.key.String()}
		}
		p.alerted(&entry, r)
		entry.Duration = p.cfg.Clock.Now().Sub(start)
		p.cfg.Audit.Record(entry)
	}
	runID, password, ok := proxyCredentials(req.Header.Get("Proxy-Authorization"))
	var a *attempt
	if ok {
		a = p.reg.authenticate(runID, password)
	}
	if only != nil && a != only {
		a = nil
	}
	if a == nil {
		deny(refuseCredentials("proxy credentials missing, unknown or revoked"))
		return
	}
	entry.Task = a.task.runID
	if req.Method != http.MethodConnect {
		deny(refuseMethod("only CONNECT is proxied", http.MethodConnect))
		return
	}
	if refused := p.tripTarget(req.RequestURI); refused != nil {
		deny(refused)
		return
	}
	if targetErr != nil {
		// The parser may quote what it refused (a port): redacted.
		deny(refuseBadRequest("CONNECT target: " + ix.Redacted(targetErr.Error())))
		return
	}
	granted := a.task.grantsUnder(p.cfg.Policy.Current()).granted
	decision := policy.DecideConnect(policy.ConnectInput{Target: target, Granted: granted, Egress: p.cfg.Egress})
	if decision.Action == policy.Refuse {
		// The reason names the target, which the task chose.
		deny(refuseTarget(ix.Redacted(decision.Reason)))
		return
	}
	if !a.track(c) {
		deny(refuseCredentials("the attempt ended"))
		return
	}
	defer a.untrack(c)
	var pending []byte
	if n := br.Buffered(); n > 0 {
		pending, _ = br.Peek(n)
		pending = append([]byte(nil), pending...)
	}
	conn := &bufferedConn{Conn: c, pending: pending}
	if decision.Action == policy.Tunnel {
		p.tunnel(a, conn, target, entry, true)
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	if decision.Action == policy.TerminateSSH {
		// An ssh ProxyCommand through the explicit proxy meets the same
		// front as a redirected connection.
		p.serveSSH(a, conn, target, ix, entry)
		return
	}
	if decision.Action == policy.InterceptToScrub {
		p.interceptToScrub(a, conn, newConnInfo(a, target, ix), ix, entry)
		return
	}
	p.intercept(a, conn, newConnInfo(a, target, ix), ix)
}

// proxyCredentials reads "Basic base64(runID:password)".
func proxyCredentials(h string) (user, password string, ok bool) {
	scheme, b64, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return "", "", false
	}
	return strings.Cut(string(raw), ":")
}

func writeStatus(w io.Writer, status int, reason string, hdr http.Header) {
	body := "runfleet edge: " + reason + "\n"
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	for k, vs := range hdr {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	fmt.Fprintf(&b, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	io.WriteString(w, b.String())
}

// tunnel relays bytes untouched to a target no key of the task reaches
// (egress open). The dial still goes through the upstream guard. explicit:
// the task asked with a CONNECT, which is answered; a transparent
// connection has nothing to answer, and a failed dial just closes it.
func (p *Proxy) tunnel(a *attempt, c *bufferedConn, target policy.Authority, entry audit.Entry, explicit bool) {
	start := entry.TS
	ctx, cancel := context.WithTimeout(a.ctx, p.cfg.HandshakeTimeout)
	up, err := p.cfg.Upstream.DialContext(ctx, "tcp", target.String())
	cancel()
	if err != nil {
		r := exchangeFailed(err)
		if explicit {
			writeStatus(c, r.status, r.reason, r.header)
		}
		entry.Action, entry.Status, entry.Reason = r.action, r.status, r.reason
		entry.Duration = p.cfg.Clock.Now().Sub(start)
		p.cfg.Audit.Record(entry)
		return
	}
	defer up.Close()
	_ = c.SetDeadline(time.Time{})
	if explicit {
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
	}
	var wg sync.WaitGroup
	var in, out int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		in, _ = io.Copy(up, c)
		closeWrite(up)
	}()
	out, _ = io.Copy(c, up)
	closeWrite(c.Conn)
	wg.Wait()
	entry.Action, entry.Status = audit.Tunnelled, http.StatusOK
	entry.BytesIn, entry.BytesOut = in, out
	entry.Duration = p.cfg.Clock.Now().Sub(start)
	p.cfg.Audit.Record(entry)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// intercept terminates TLS with a leaf for the connection's authority (the
// CONNECT's, or a transparent connection's pin) and serves the connection's
// requests through the pipeline (HTTP/2 when ALPN picks it). A failed
// handshake is logged (debug): the authority is one a key reaches, and the
// client that failed it is the task's own business.
func (p *Proxy) intercept(a *attempt, c *bufferedConn, ci *connInfo, ix *placeholder.Index) {
	tc, err := p.handshake(a, c, ci)
	if err != nil {
		p.cfg.Logger.Debug("intercepted handshake failed", slog.String("task", a.task.runID), slog.String("host", ci.logHost),
			slog.String("error", ix.Redacted(err.Error())))
		return
	}
	p.serveIntercepted(a, tc, ci)
}

// handshake terminates the intercepted connection's TLS with a leaf for
// its authority, within the handshake timeout.
func (p *Proxy) handshake(a *attempt, c *bufferedConn, ci *connInfo) (*tls.Conn, error) {
	c.Conn = newRawConn(c.Conn, p.busy)
	target := ci.target
	tc := tls.Server(c, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			// The leaf is always for the CONNECT's name, whatever the SNI
			// says; a mismatched SNI makes every request a 421.
			ci.sniOK = sameName(hello.ServerName, target.Name)
			h := *hello
			h.ServerName = target.Name
			return p.cfg.Leaves.GetCertificate(&h)
		},
	})
	ctx, cancel := context.WithTimeout(a.ctx, p.cfg.HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return tc, nil
}

// serveIntercepted serves an intercepted connection's requests, its TLS
// established, through the pipeline (HTTP/2 when ALPN picked it).
func (p *Proxy) serveIntercepted(a *attempt, tc *tls.Conn, ci *connInfo) {
	connCtx := context.WithValue(a.ctx, connInfoKey{}, ci)
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		in := newH2Inbound(tc)
		in.overBound = func() { p.auditHeadOverBound(ci) }
		p.h2.ServeConn(in, &http2.ServeConnOpts{
			Context: connCtx,
			Handler: pipeline{p},
			// x/net/http2 advertises and enforces this, plus its
			// allowance for ten fields' overhead, as
			// SETTINGS_MAX_HEADER_LIST_SIZE: maxHeadBytes, HTTP/1.1's
			// bound, instead of net/http's 1 MiB default.
			BaseConfig: &http.Server{ErrorLog: log.New(redactingLog{p}, "", 0), MaxHeaderBytes: h2MaxHeaderBytes},
		})
		return
	}
	p.serveHTTP1(connCtx, ci, tc)
}

func sameName(sni, name string) bool {
	if sni == "" {
		return false
	}
	canon, err := netname.Canonical(sni)
	return err == nil && canon == name
}

// redactingLog is x/net/http2's error log: its lines may quote what a task
// sent (a malformed field name), so any placeholder is redacted before the
// line reaches the log, at debug level.
type redactingLog struct{ p *Proxy }

func (l redactingLog) Write(b []byte) (int, error) {
	msg := l.p.reg.index.Load().Redacted(strings.TrimSuffix(string(b), "\n"))
	l.p.cfg.Logger.Debug(msg)
	return len(b), nil
}
