package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/net/http2"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// taskNet is a task's network as these tests build it on the host's
// loopback: ServeNetwork is given plain 127.0.0.1 sockets, and a table
// stands in for conntrack, telling where each connection to the
// transparent listener was going (the kernel's redirect itself is tested
// in package sandbox). The task's clients resolve names through the
// taskdns server ServeNetwork runs on the DNS sockets, so their pins come
// from the real DNS path.
type taskNet struct {
	t           tb
	network     TaskNetwork
	explicit    net.Listener
	transparent net.Listener
	dnsPackets  net.PacketConn
	dnsStreams  net.Listener
	// resolver is the task's resolver: Go's own, every query sent to the
	// task's DNS (as the redirect of port 53 does), nothing else asked.
	resolver *net.Resolver

	mu  sync.Mutex
	nat map[int]*natEntry // by the client's local port
}

// natEntry is where one redirected connection was going; known is closed
// once dst is set. An invalid dst is a connection conntrack has no entry
// for.
type natEntry struct {
	known chan struct{}
	set   bool
	dst   netip.AddrPort
}

// newTaskNet makes a task network's sockets without serving them.
func newTaskNet(t tb) *taskNet {
	t.Helper()
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		must(t, err)
		return l
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	must(t, err)
	tn := &taskNet{t: t, explicit: listen(), transparent: listen(), dnsPackets: pc, dnsStreams: listen(), nat: map[int]*natEntry{}}
	tn.network = TaskNetwork{
		Explicit:            tn.explicit,
		Transparent:         []net.Listener{tn.transparent},
		OriginalDestination: tn.originalDestination,
		DNSPackets:          []net.PacketConn{pc},
		DNSStreams:          []net.Listener{tn.dnsStreams},
	}
	tn.resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		if strings.HasPrefix(network, "tcp") {
			return d.DialContext(ctx, "tcp", tn.dnsStreams.Addr().String())
		}
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
	t.Cleanup(func() {
		for _, c := range tn.network.closers() {
			c.Close()
		}
	})
	return tn
}

// network serves a new task network for runID's current attempt.
func (e *env) network(runID string) *taskNet {
	e.t.Helper()
	tn := newTaskNet(e.t)
	must(e.t, e.proxy.ServeNetwork(runID, tn.network))
	return tn
}

func (tn *taskNet) entryLocked(port int) *natEntry {
	en := tn.nat[port]
	if en == nil {
		en = &natEntry{known: make(chan struct{})}
		tn.nat[port] = en
	}
	return en
}

// originalDestination is the TaskNetwork's OriginalDestination: what the
// client recorded for its port, waited for (the proxy may accept before
// the client's dial has returned) and then forgotten, so a port the kernel
// hands out again is not mistaken for the old connection.
func (tn *taskNet) originalDestination(c net.Conn) (netip.AddrPort, error) {
	port := c.RemoteAddr().(*net.TCPAddr).Port
	tn.mu.Lock()
	en := tn.entryLocked(port)
	tn.mu.Unlock()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	select {
	case <-en.known:
	case <-timer.C:
		return netip.AddrPort{}, fmt.Errorf("no destination recorded for port %d", port)
	}
	tn.mu.Lock()
	if tn.nat[port] == en {
		delete(tn.nat, port)
	}
	tn.mu.Unlock()
	if !en.dst.IsValid() {
		// What SO_ORIGINAL_DST says of a connection that was not redirected.
		return netip.AddrPort{}, errors.New("getsockopt: no such file or directory")
	}
	return en.dst, nil
}

func (tn *taskNet) redirected(port int, dst netip.AddrPort) {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	en := tn.entryLocked(port)
	if en.set { // a stale entry nobody read
		en = &natEntry{known: make(chan struct{})}
		tn.nat[port] = en
	}
	en.dst, en.set = dst, true
	close(en.known)
}

// dial opens a connection of the task to dst, which arrives at the
// transparent listener as the task network's redirect makes it.
func (tn *taskNet) dial(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", tn.transparent.Addr().String())
	if err != nil {
		return nil, err
	}
	tn.redirected(c.LocalAddr().(*net.TCPAddr).Port, dst)
	return c, nil
}

func (tn *taskNet) mustDial(dst netip.AddrPort) net.Conn {
	tn.t.Helper()
	c, err := tn.dial(context.Background(), dst)
	must(tn.t, err)
	tn.t.Cleanup(func() { c.Close() })
	return c
}

// dialContext is a task's client's dial with no proxy setting: the name
// resolved by the task's DNS (as its libc would), then dialled.
func (tn *taskNet) dialContext(ctx context.Context, _, address string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, err
	}
	ips, err := tn.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	return tn.dial(ctx, netip.AddrPortFrom(ips[0], uint16(port)))
}

// pin resolves name through the task's DNS and requires a pin.
func (tn *taskNet) pin(name string) netip.Addr {
	tn.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := tn.resolver.LookupNetIP(ctx, "ip", name)
	must(tn.t, err)
	if len(ips) != 1 || !pinRange.Contains(ips[0]) {
		tn.t.Fatalf("%s resolved to %v, not one pin of %v", name, ips, pinRange)
	}
	return ips[0]
}

// client is a task's Go program with no proxy setting (the variables are
// ignored: Proxy is nil), trusting roots.
func (tn *taskNet) client(roots []byte, h2 bool) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	return &http.Client{Transport: &http.Transport{
		DialContext:       tn.dialContext,
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2: h2,
	}, Timeout: 20 * time.Second}
}

// tlsDial opens a TLS connection of the task to dst.
func (tn *taskNet) tlsDial(dst netip.AddrPort, cfg *tls.Config) *tls.Conn {
	tn.t.Helper()
	tc := tls.Client(tn.mustDial(dst), cfg)
	must(tn.t, tc.Handshake())
	return tc
}

// closedUnanswered: edge ends the connection without a byte (a refused
// transparent connection has no answer to carry), rather than leaving it
// open as a tunnel would.
func closedUnanswered(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	if n > 0 || err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the connection was not closed unanswered: %d bytes, %v", n, err)
	}
}

func authorityOf(ip netip.Addr, port int) netip.AddrPort {
	return netip.AddrPortFrom(ip, uint16(port))
}

func echoAuthorization(w http.ResponseWriter, r *http.Request) {
	io.WriteString(w, "you sent: "+r.Header.Get("Authorization"))
}

func viaTransparent(m map[string]any) bool { return m["via"] == "transparent" }

// A Go client that knows nothing of the proxy reaches a granted name:port
// over TLS through the name's pin: intercepted (the proxy CA's leaf), the
// upstream gets the real value, the task sees only its placeholder, even
// in the upstream's echo of it.
func TestTransparentInterceptsAGrantedNameViaItsPin(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newFixture(t, "open")
			f.up.handler = echoAuthorization
			tn := f.network("run-a")
			tn.pin("api.example.test")
			res, err := tn.client(f.authority.Bundle(), h2).Do(mustRequest(t, "https://"+f.api+"/v1/models", "Bearer "+f.phA))
			must(t, err)
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			wantMajor := 1
			if h2 {
				wantMajor = 2
			}
			if res.StatusCode != 200 || res.ProtoMajor != wantMajor {
				t.Fatalf("%s %d", res.Proto, res.StatusCode)
			}
			if string(body) != "you sent: Bearer "+f.phA {
				t.Fatalf("the task got %d bytes that are not the echo with its placeholder (hold the value: %v)", len(body), strings.Contains(string(body), realA))
			}
			got := f.up.requests()
			if len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+realA || got[0].Host != f.api || got[0].Path != "/v1/models" {
				t.Fatalf("the upstream did not get the request with the real value: %d requests", len(got))
			}
			line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/v1/models" })
			if line["action"] != "substituted" || line["via"] != "transparent" || line["host"] != f.api || line["task"] != "run-a" ||
				fmt.Sprint(line["keys"]) != "[acme/A]" || line["scrubbed"] != float64(1) {
				t.Errorf("audit %v", line)
			}
		})
	}
}

// The rule CONNECT keeps holds through a pin: the SNI must name the pinned
// name (another name, or none, makes every request 421), and so must every
// request's Host or :authority. Nothing reaches the upstream.
func TestTransparentMisdirectedRequests(t *testing.T) {
	f := newFixture(t, "open")
	tn := f.network("run-a")
	dst := authorityOf(tn.pin("api.example.test"), f.up.port)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.authority.Bundle())
	cases := []struct{ name, sni, host string }{
		{"sni-other", "other.example.test", f.api},
		{"no-sni", "", f.api},
		{"host-other", "api.example.test", f.other},
	}
	for _, c := range cases {
		cfg := func(proto string) *tls.Config {
			cfg := &tls.Config{RootCAs: pool, ServerName: c.sni, NextProtos: []string{proto}}
			if c.sni != "api.example.test" {
				// The leaf is api.example.test's whatever the SNI says;
				// without an SNI Go sends none only when not verifying.
				cfg.InsecureSkipVerify = true
			}
			return cfg
		}
		tc := tn.tlsDial(dst, cfg("http/1.1"))
		res, _ := roundTrip(t, tc, bufio.NewReader(tc), "GET /"+c.name+"/h1 HTTP/1.1\r\nHost: "+c.host+"\r\nAuthorization: Bearer "+f.phA+"\r\n\r\n")
		tc.Close()
		if res.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("%s over HTTP/1.1: %d", c.name, res.StatusCode)
		}
		// Over HTTP/2 (ALPN) likewise; the refusal ends the connection
		// (GOAWAY), as it does a CONNECT's.
		tc = tn.tlsDial(dst, cfg("h2"))
		cc, err := (&http2.Transport{}).NewClientConn(tc)
		must(t, err)
		req := mustRequest(t, "https://"+f.api+"/"+c.name+"/h2", "Bearer "+f.phA)
		req.Host = c.host
		res, err = cc.RoundTrip(req)
		must(t, err)
		res.Body.Close()
		if res.StatusCode != http.StatusMisdirectedRequest || res.ProtoMajor != 2 {
			t.Errorf("%s over HTTP/2: %s %d", c.name, res.Proto, res.StatusCode)
		}
		cc.Close()
		for _, path := range []string{"/" + c.name + "/h1", "/" + c.name + "/h2"} {
			line := f.waitAudit(func(m map[string]any) bool { return m["path"] == path })
			if line["action"] != "denied" || line["status"] != float64(http.StatusMisdirectedRequest) || !viaTransparent(line) || line["host"] != f.api {
				t.Errorf("audit %v", line)
			}
		}
	}
	if n := len(f.up.requests()); n != 0 {
		t.Fatalf("%d misdirected requests reached the upstream", n)
	}
}

// Plain HTTP to an authority a key of the task may reach is answered 403
// with the reason: a placeholder is substituted over HTTPS only. Nothing
// is sent upstream (the upstream's name is never even resolved).
func TestTransparentPlainHTTPToAGrantedAuthorityIsRefused(t *testing.T) {
	f := newFixture(t, "open")
	tn := f.network("run-a")
	c := tn.mustDial(authorityOf(tn.pin("api.example.test"), f.up.port))
	before := len(f.resolver.lookups())
	res, body := roundTrip(t, c, bufio.NewReader(c), "GET /plain?k=v HTTP/1.1\r\nHost: "+f.api+"\r\nAuthorization: Bearer "+f.phA+"\r\n\r\n")
	reason := "plain HTTP to " + f.api + ", which a key of this task may reach: placeholders are substituted over HTTPS only"
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, reason) {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/plain" })
	if line["action"] != "blocked" || line["status"] != float64(http.StatusForbidden) || !viaTransparent(line) ||
		line["host"] != f.api || line["reason"] != reason || line["method"] != "GET" {
		t.Errorf("audit %v", line)
	}
	if len(f.up.requests()) != 0 || len(f.resolver.lookups()) != before {
		t.Fatal("plain HTTP to a granted authority went upstream")
	}
}

// With egress open, a name no key reaches resolves to a pin too, and for a
// task whose keys go in headers alone a connection to it is tunnelled
// untouched: the task speaks TLS with the upstream itself (its
// certificate, not the proxy's), and a placeholder it sends arrives as it
// is, worthless. (A task holding a url or body key has it intercepted to
// scrub instead: egress_open_test.go.)
func TestTransparentTunnelsANonGrantedNameWithEgressOpen(t *testing.T) {
	f := newFixture(t, "open")
	_, phA := f.headerOnlyTask()
	tn := f.network("run-h")
	tn.pin("third.example.test")
	third := "third.example.test:" + itoa(f.up.port)
	client := tn.client(f.uca.PEM, false)
	res, err := client.Do(mustRequest(t, "https://"+third+"/t?key="+phA, "Bearer "+phA))
	must(t, err)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	client.CloseIdleConnections() // the tunnel's line is written when it closes
	got := f.up.requests()
	if res.StatusCode != 200 || len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+phA || !strings.Contains(got[0].RawQuery, phA) {
		t.Fatalf("status %d; the upstream did not get the placeholder untouched (%d requests)", res.StatusCode, len(got))
	}
	f.upstreamNeverSaw(t, realA, realB)
	line := f.waitAudit(func(m map[string]any) bool { return m["action"] == "tunnelled" && m["host"] == third })
	if !viaTransparent(line) || line["status"] != float64(200) || line["task"] != "run-h" || line["bytesIn"] == float64(0) || line["bytesOut"] == float64(0) {
		t.Errorf("audit %v", line)
	}
}

// With egress strict, a name no key reaches does not resolve (NXDOMAIN),
// and a connection to an address no key reaches (an IP literal, a pin this
// attempt never handed out, a granted name on a port no key names) is
// refused before anything is resolved or dialled.
func TestTransparentStrictEgressRefusesWhatNoKeyReaches(t *testing.T) {
	f := newFixture(t, "strict")
	tn := f.network("run-a")
	api := tn.pin("api.example.test")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := tn.resolver.LookupNetIP(ctx, "ip", "third.example.test")
	var de *net.DNSError
	if !errors.As(err, &de) || !de.IsNotFound {
		t.Fatalf("a name no key reaches resolved under strict egress: %v", err)
	}
	before := len(f.resolver.lookups())
	cases := []struct {
		dst          netip.AddrPort
		host, reason string
	}{
		{netip.MustParseAddrPort("203.0.113.7:443"), "203.0.113.7:443", "egress is strict"},
		{netip.MustParseAddrPort("198.18.0.200:" + itoa(f.up.port)), "198.18.0.200:" + itoa(f.up.port), "egress is strict"},
		{authorityOf(api, 8443), "api.example.test:8443", "no key of this task names port 8443 of api.example.test"},
	}
	for _, c := range cases {
		closedUnanswered(t, tn.mustDial(c.dst))
		line := f.waitAudit(func(m map[string]any) bool { return m["host"] == c.host && viaTransparent(m) })
		if line["action"] != "denied" || line["status"] != float64(http.StatusForbidden) || !strings.Contains(fmt.Sprint(line["reason"]), c.reason) {
			t.Errorf("audit %v", line)
		}
	}
	if len(f.up.requests()) != 0 || len(f.resolver.lookups()) != before {
		t.Fatal("a refused destination was resolved or reached")
	}
}

// A redirected connection whose destination is the task's loopback (the
// task dialling the listener itself), an unspecified address, or none at
// all (conntrack has no entry) is refused: it must never become a tunnel
// to the host's loopback, which the harness's guard would allow.
func TestTransparentRefusesADestinationOnTheLoopback(t *testing.T) {
	f := newFixture(t, "open")
	tn := f.network("run-a")
	before := len(f.resolver.lookups())
	for _, dst := range []netip.AddrPort{
		netip.MustParseAddrPort(tn.transparent.Addr().String()),
		authorityOf(netip.MustParseAddr("127.0.0.1"), f.up.port),
		authorityOf(netip.MustParseAddr("127.9.9.9"), f.up.port),
		authorityOf(netip.MustParseAddr("::1"), f.up.port),
		authorityOf(netip.MustParseAddr("::ffff:127.0.0.1"), f.up.port),
		authorityOf(netip.MustParseAddr("0.0.0.0"), f.up.port),
		authorityOf(netip.MustParseAddr("203.0.113.7"), 0),
	} {
		closedUnanswered(t, tn.mustDial(dst))
		line := f.waitAudit(func(m map[string]any) bool { return m["host"] == dst.String() && viaTransparent(m) })
		if line["action"] != "denied" || line["status"] != float64(http.StatusBadRequest) || line["reason"] != "the connection has no destination off the task's loopback" {
			t.Errorf("%v: audit %v", dst, line)
		}
	}
	closedUnanswered(t, tn.mustDial(netip.AddrPort{})) // not redirected
	line := f.waitAudit(func(m map[string]any) bool { return m["host"] == "unknown" && viaTransparent(m) })
	if line["action"] != "denied" || line["status"] != float64(http.StatusInternalServerError) || line["task"] != "run-a" {
		t.Errorf("audit %v", line)
	}
	if len(f.up.requests()) != 0 || len(f.resolver.lookups()) != before {
		t.Fatal("a loopback destination was resolved or reached")
	}
}

// With egress open and no private range allowed (the harness's guard
// without allowPrivate), a tunnel toward a private, metadata or loopback
// address, by name through its pin or by IP literal, is refused by the
// upstream guard: nothing is dialled, and the task's connection closes.
func TestTransparentTunnelToAPrivateAddressIsRefusedByTheGuard(t *testing.T) {
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, false, "loop.example.test")
	e := newEnv(t, envOptions{uca: uca, egress: "open", noAllowPrivate: true,
		pins: map[string]string{"ten.example.test": "10.1.2.3", "meta.example.test": "169.254.169.254", "loop.example.test": "127.0.0.1"},
		keys: `{"acme": {"keys": {"K": {"domains": ["api.example.test"]}}}}`, secrets: map[string]string{"acme/K": realA}})
	e.task("run-g", runspec.Secret{ProjectID: "acme", Key: "K"})
	tn := e.network("run-g")
	type target struct {
		dst  netip.AddrPort
		host string
	}
	var targets []target
	for name, port := range map[string]int{"ten.example.test": 443, "meta.example.test": 80, "loop.example.test": up.port} {
		targets = append(targets, target{authorityOf(tn.pin(name), port), name + ":" + itoa(port)})
	}
	for _, lit := range []string{"10.0.0.1:443", "169.254.169.254:80", "[::ffff:10.0.0.1]:443", "[fd00::1]:443", "[fd00:ec2::254]:80"} {
		dst := netip.MustParseAddrPort(lit)
		targets = append(targets, target{dst, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()).String()})
	}
	for _, tg := range targets {
		closedUnanswered(t, tn.mustDial(tg.dst))
		line := e.waitAudit(func(m map[string]any) bool { return m["host"] == tg.host && viaTransparent(m) })
		if line["action"] != "denied" || line["status"] != float64(http.StatusForbidden) || !strings.HasPrefix(fmt.Sprint(line["reason"]), "upstream refused: ") {
			t.Errorf("%s: audit %v", tg.host, line)
		}
	}
	if len(up.requests()) != 0 {
		t.Fatal("the loopback upstream was reached")
	}
}

// dnsOverTCP sends one A query for name on c (RFC 7766 framing) and
// returns the answer's header.
func dnsOverTCP(t *testing.T, c net.Conn, name string) dnsmessage.Header {
	t.Helper()
	b := dnsmessage.NewBuilder(make([]byte, 2, 512), dnsmessage.Header{ID: 7, RecursionDesired: true})
	must(t, b.StartQuestions())
	must(t, b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}))
	msg, err := b.Finish()
	must(t, err)
	binary.BigEndian.PutUint16(msg, uint16(len(msg)-2))
	_, err = c.Write(msg)
	must(t, err)
	var size [2]byte
	_, err = io.ReadFull(c, size[:])
	must(t, err)
	resp := make([]byte, binary.BigEndian.Uint16(size[:]))
	_, err = io.ReadFull(c, resp)
	must(t, err)
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	must(t, err)
	return h
}

// cut: the connection ends (edge closed it) rather than staying open.
func cut(t *testing.T, what string, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("the %s connection is still open after the attempt ended", what)
	}
}

// assertClosed: every socket of the network was closed by the proxy (one
// left open fails after a deadline instead of blocking).
func (tn *taskNet) assertClosed(t *testing.T, which string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for what, l := range map[string]net.Listener{"transparent": tn.transparent, "explicit": tn.explicit, "DNS over TCP": tn.dnsStreams} {
		l.(*net.TCPListener).SetDeadline(deadline)
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s: the %s listener was not closed: %v", which, what, err)
		}
	}
	tn.dnsPackets.SetReadDeadline(deadline)
	if _, _, err := tn.dnsPackets.ReadFrom(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("%s: the DNS socket was not closed: %v", which, err)
	}
}

// When the attempt ends (EndAttempt, Stop, or the next attempt starting),
// its network goes with it: open connections are cut, the listeners and
// the DNS stop answering. A network handed over once the attempt ended is
// closed at once and refused.
func TestTransparentNetworkClosesWhenTheAttemptEnds(t *testing.T) {
	for _, end := range []string{"EndAttempt", "Stop", "StartAttempt"} {
		t.Run(end, func(t *testing.T) {
			// run-h holds key A alone (header), so third.example.test is
			// tunnelled for it: both kinds of connection are cut.
			f := newFixture(t, "open")
			_, phA := f.headerOnlyTask()
			tn := f.network("run-h")
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(f.authority.Bundle())
			intercepted := tn.tlsDial(authorityOf(tn.pin("api.example.test"), f.up.port), &tls.Config{RootCAs: pool, ServerName: "api.example.test", NextProtos: []string{"http/1.1"}})
			ibr := bufio.NewReader(intercepted)
			if res, _ := roundTrip(t, intercepted, ibr, "GET /before HTTP/1.1\r\nHost: "+f.api+"\r\nAuthorization: Bearer "+phA+"\r\n\r\n"); res.StatusCode != 200 {
				t.Fatalf("before: %d", res.StatusCode)
			}
			upstreamPool := x509.NewCertPool()
			upstreamPool.AppendCertsFromPEM(f.uca.PEM)
			tunnelled := tn.tlsDial(authorityOf(tn.pin("third.example.test"), f.up.port), &tls.Config{RootCAs: upstreamPool, ServerName: "third.example.test"})
			dnsConn, err := net.Dial("tcp", tn.dnsStreams.Addr().String())
			must(t, err)
			defer dnsConn.Close()
			if h := dnsOverTCP(t, dnsConn, "api.example.test"); h.RCode != dnsmessage.RCodeSuccess {
				t.Fatalf("DNS over TCP: %v", h.RCode)
			}

			switch end {
			case "EndAttempt":
				f.proxy.EndAttempt("run-h")
			case "Stop":
				f.proxy.Stop("run-h")
			case "StartAttempt":
				_, err := f.proxy.StartAttempt("run-h")
				must(t, err)
			}

			cut(t, "intercepted", intercepted)
			cut(t, "tunnelled", tunnelled)
			cut(t, "DNS over TCP", dnsConn)
			for what, l := range map[string]net.Listener{"transparent": tn.transparent, "explicit": tn.explicit, "DNS over TCP": tn.dnsStreams} {
				if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
					c.Close()
					t.Errorf("the %s listener still accepts", what)
				}
			}
			if _, err := tn.dnsPackets.WriteTo([]byte{0}, tn.dnsPackets.LocalAddr()); !errors.Is(err, net.ErrClosed) {
				t.Errorf("the DNS socket is still open: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := tn.resolver.LookupNetIP(ctx, "ip", "api.example.test"); err == nil {
				t.Error("the task's DNS still answers")
			}

			late := newTaskNet(t)
			err = f.proxy.ServeNetwork("run-h", late.network)
			if end == "StartAttempt" {
				// The new attempt has a network of its own, served afresh.
				must(t, err)
				res, err := late.client(f.authority.Bundle(), false).Do(mustRequest(t, "https://"+f.api+"/after", "Bearer "+phA))
				must(t, err)
				res.Body.Close()
				if res.StatusCode != 200 {
					t.Fatalf("the new attempt's network: %d", res.StatusCode)
				}
				return
			}
			if !errors.Is(err, ErrUnknownTask) {
				t.Fatalf("ServeNetwork after the attempt ended: %v", err)
			}
			late.assertClosed(t, "the refused network")
		})
	}
}

// The explicit proxy inside the task's network still asks for the task's
// credential: none, or a wrong one, is a 407; the task's own works.
func TestTransparentNetworkExplicitProxyNeedsTheCredential(t *testing.T) {
	f := newFixture(t, "open")
	tn := f.network("run-a")
	host := tn.explicit.Addr().String()
	for _, u := range []*url.URL{
		{Scheme: "http", Host: host},
		{Scheme: "http", Host: host, User: url.UserPassword("run-a", "not-the-password")},
	} {
		c, _, status := f.connect(u, f.api)
		c.Close()
		if status != http.StatusProxyAuthRequired {
			t.Fatalf("CONNECT without the credential: %d", status)
		}
	}
	f.waitAudit(func(m map[string]any) bool {
		return m["status"] == float64(http.StatusProxyAuthRequired) && m["host"] == f.api && m["via"] == nil
	})
	own := *f.proxyURL
	own.Host = host
	res, err := f.goClient(&own, false).Do(mustRequest(t, "https://"+f.api+"/explicit", "Bearer "+f.phA))
	must(t, err)
	res.Body.Close()
	got := f.up.requests()
	if res.StatusCode != 200 || len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+realA {
		t.Fatalf("with the credential: %d, %d requests", res.StatusCode, len(got))
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/explicit" })
	if line["action"] != "substituted" || line["via"] != nil {
		t.Errorf("audit %v", line)
	}
}

// A network the proxy cannot serve (it is disabled, the task is unknown,
// transparent listeners come without OriginalDestination) is refused with
// the reason, and every socket given is closed: none is left half-served
// in the task's network.
func TestTransparentServeNetworkRefusesAndClosesWhatItCannotServe(t *testing.T) {
	f := newFixture(t, "open")
	disabled, err := New(Config{Disabled: true})
	must(t, err)
	noDst := newTaskNet(t)
	noDst.network.OriginalDestination = nil
	cases := []struct {
		name  string
		serve func(TaskNetwork) error
		tn    *taskNet
		want  string
	}{
		{"disabled", func(n TaskNetwork) error { return disabled.ServeNetwork("run-a", n) }, newTaskNet(t), ErrDisabled.Error()},
		{"unknown task", func(n TaskNetwork) error { return f.proxy.ServeNetwork("run-nobody", n) }, newTaskNet(t), ErrUnknownTask.Error()},
		{"no OriginalDestination", func(n TaskNetwork) error { return f.proxy.ServeNetwork("run-a", n) }, noDst, "need OriginalDestination"},
	}
	for _, c := range cases {
		if err := c.serve(c.tn.network); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
		c.tn.assertClosed(t, c.name)
	}
}
