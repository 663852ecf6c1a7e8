package taskdns

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/runfleet/runfleet/tests/kit/await"
)

// serving is a Server on real loopback sockets, as edge hands them over.
type serving struct {
	*Server
	udp, tcp   string // addresses
	ln         net.Listener
	pc         net.PacketConn
	udpDone    chan error
	streamDone chan error
}

func serve(t *testing.T, s *Server) *serving {
	t.Helper()
	return serveOn(t, s, "127.0.0.1")
}

// serveOn serves on loopback address host ("127.0.0.1" or "::1").
func serveOn(t *testing.T, s *Server, host string) *serving {
	t.Helper()
	pc, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	sv := &serving{Server: s, udp: pc.LocalAddr().String(), tcp: ln.Addr().String(), ln: ln, pc: pc,
		udpDone: make(chan error, 1), streamDone: make(chan error, 1)}
	go func() { sv.udpDone <- s.ServePacket(pc) }()
	go func() { sv.streamDone <- s.ServeStream(ln) }()
	t.Cleanup(func() {
		pc.Close()
		ln.Close()
		for what, done := range map[string]chan error{"ServePacket": sv.udpDone, "ServeStream": sv.streamDone} {
			if err := <-done; err != nil {
				t.Errorf("%s after close: %v", what, err)
			}
		}
	})
	return sv
}

// resolver is Go's own DNS client, talking to the server over network
// ("udp" or "tcp") whatever address it thinks it dials.
func (sv *serving) resolver(network string) *net.Resolver {
	addr := sv.udp
	if network == "tcp" {
		addr = sv.tcp
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}

func TestGoResolverGetsPinsOverUDPAndTCP(t *testing.T) {
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			s, _ := newServer(t, Config{}, "api.example.test", "other.example.test")
			sv := serve(t, s)
			r := sv.resolver(network)
			ctx := context.Background()

			first, err := r.LookupHost(ctx, "api.example.test")
			if err != nil || len(first) != 1 || !strings.HasPrefix(first[0], "198.18.") {
				t.Fatalf("LookupHost(api.example.test) = %v, %v; want one pin", first, err)
			}
			again, err := r.LookupHost(ctx, "API.example.test")
			if err != nil || !slices.Equal(again, first) {
				t.Fatalf("again: %v, %v; want %v", again, err, first)
			}
			other, err := r.LookupIPAddr(ctx, "other.example.test")
			if err != nil || len(other) != 1 || other[0].IP.String() == first[0] || other[0].IP.To4() == nil {
				t.Fatalf("LookupIPAddr(other.example.test) = %v, %v; want one other IPv4 pin", other, err)
			}
			// What edge reads from a redirected connection leads back to
			// the name.
			for addr, want := range map[string]string{first[0]: "api.example.test", other[0].IP.String(): "other.example.test"} {
				if name, ok := s.cfg.Pins.Name(netip.MustParseAddr(addr)); !ok || name != want {
					t.Errorf("Pins.Name(%s) = %q %v, want %q", addr, name, ok, want)
				}
			}
			if ips, err := r.LookupIP(ctx, "ip6", "api.example.test"); !notFound(err) || len(ips) != 0 {
				t.Errorf("AAAA of a granted name: %v, %v; want none", ips, err)
			}

			// The fully qualified form, so that no search domain of the
			// machine's resolv.conf is tried.
			for _, lookup := range []func() error{
				func() error { _, err := r.LookupHost(ctx, "denied.example.test."); return err },
				func() error { _, err := r.LookupIPAddr(ctx, "intranet."); return err },
				func() error { _, err := r.LookupMX(ctx, "denied.example.test."); return err },
				func() error { _, err := r.LookupTXT(ctx, "denied.example.test."); return err },
			} {
				if err := lookup(); !notFound(err) {
					t.Errorf("a refused name: %v, want not found", err)
				}
			}

			// A granted name has only its pin: no mail or text records (Go
			// reports NODATA as not found, like NXDOMAIN; the wire tests
			// tell them apart).
			if mx, err := r.LookupMX(ctx, "api.example.test."); !notFound(err) || len(mx) != 0 {
				t.Errorf("LookupMX(granted) = %v, %v; want no records", mx, err)
			}
			if txt, err := r.LookupTXT(ctx, "api.example.test."); !notFound(err) || len(txt) != 0 {
				t.Errorf("LookupTXT(granted) = %v, %v; want no records", txt, err)
			}

			// A name under localhost is not in any hosts file, so this
			// answer is the server's.
			local, err := r.LookupHost(ctx, "db.localhost")
			slices.Sort(local)
			if err != nil || !slices.Equal(local, []string{"127.0.0.1", "::1"}) {
				t.Errorf("LookupHost(db.localhost) = %v, %v; want 127.0.0.1 and ::1", local, err)
			}
		})
	}
}

// TestOneServerServesIPv4AndIPv6Loopback: edge hands one Server the
// sockets of 127.0.0.1:53 and [::1]:53, and a name has one pin on both.
func TestOneServerServesIPv4AndIPv6Loopback(t *testing.T) {
	s, _ := newServer(t, Config{}, "api.example.test")
	v4, v6 := serveOn(t, s, "127.0.0.1"), serveOn(t, s, "::1")
	var got []string
	for _, sv := range []*serving{v4, v6} {
		for _, network := range []string{"udp", "tcp"} {
			addrs, err := sv.resolver(network).LookupHost(context.Background(), "api.example.test")
			if err != nil || len(addrs) != 1 {
				t.Fatalf("%s over %s: %v, %v", sv.udp, network, addrs, err)
			}
			got = append(got, addrs[0])
		}
	}
	if want := []string{"198.18.0.1", "198.18.0.1", "198.18.0.1", "198.18.0.1"}; !slices.Equal(got, want) {
		t.Fatalf("pins over 127.0.0.1 and ::1: %v, want 198.18.0.1 every time", got)
	}
}

func notFound(err error) bool {
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr) && dnsErr.IsNotFound
}

// exchange sends one query over network and returns the answer.
func exchange(t *testing.T, network, addr string, q []byte) dnsmessage.Message {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if network == "tcp" {
		writeFramed(t, c, q)
		return parse(t, readFramed(t, c))
	}
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, buf[:n])
}

func writeFramed(t *testing.T, c net.Conn, msgs ...[]byte) {
	t.Helper()
	var b []byte
	for _, m := range msgs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

func readFramed(t *testing.T, c net.Conn) []byte {
	t.Helper()
	var size [2]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, binary.BigEndian.Uint16(size[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestWireAnswersForLocalhostAndNodata(t *testing.T) {
	s, _ := newServer(t, Config{}, "api.example.test")
	sv := serve(t, s)
	for _, network := range []string{"udp", "tcp"} {
		addr := map[string]string{"udp": sv.udp, "tcp": sv.tcp}[network]
		for _, tc := range []struct {
			name  string
			qtype dnsmessage.Type
			rcode dnsmessage.RCode
			addrs []string
		}{
			{"localhost.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"127.0.0.1"}},
			{"localhost.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, []string{"::1"}},
			{"api.example.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, nil},
			{"api.example.test.", dnsmessage.Type(65), dnsmessage.RCodeSuccess, nil},
			{"denied.example.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeNameError, nil},
		} {
			resp := exchange(t, network, addr, query(t, 42, tc.name, tc.qtype))
			if resp.ID != 42 || resp.RCode != tc.rcode || !slices.Equal(addrs(resp), tc.addrs) {
				t.Errorf("%s %s %v: %v %v, want %v %v", network, tc.name, tc.qtype, resp.RCode, addrs(resp), tc.rcode, tc.addrs)
			}
		}
	}
}

func TestAFullPinTableIsServfailOverTheWire(t *testing.T) {
	s, _ := newServer(t, Config{Pins: newPins(t, 1)}, "one.example.test", "two.example.test")
	sv := serve(t, s)
	if resp := exchange(t, "udp", sv.udp, query(t, 1, "one.example.test.", dnsmessage.TypeA)); len(resp.Answers) != 1 {
		t.Fatalf("first name: %+v", resp)
	}
	for _, network := range []string{"udp", "tcp"} {
		addr := map[string]string{"udp": sv.udp, "tcp": sv.tcp}[network]
		if resp := exchange(t, network, addr, query(t, 2, "two.example.test.", dnsmessage.TypeA)); resp.RCode != dnsmessage.RCodeServerFailure {
			t.Errorf("%s: second name past max: %v, want SERVFAIL", network, resp.RCode)
		}
	}
	// Go's client gives up on the name rather than taking it as absent.
	_, err := sv.resolver("udp").LookupHost(context.Background(), "two.example.test.")
	if err == nil || notFound(err) {
		t.Errorf("LookupHost past max: %v, want a server failure", err)
	}
}

func TestTCPCarriesSeveralQueriesOnOneConnection(t *testing.T) {
	s, _ := newServer(t, Config{}, "api.example.test", "other.example.test")
	sv := serve(t, s)
	c, err := net.Dial("tcp", sv.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// Pipelined in one write (RFC 7766 6.2.1.1), then one more after the
	// answers.
	writeFramed(t, c, query(t, 1, "api.example.test.", dnsmessage.TypeA), query(t, 2, "other.example.test.", dnsmessage.TypeA))
	a, b := parse(t, readFramed(t, c)), parse(t, readFramed(t, c))
	writeFramed(t, c, query(t, 3, "denied.example.test.", dnsmessage.TypeA))
	d := parse(t, readFramed(t, c))
	if a.ID != 1 || b.ID != 2 || d.ID != 3 {
		t.Fatalf("IDs %d %d %d, want 1 2 3", a.ID, b.ID, d.ID)
	}
	if got := [][]string{addrs(a), addrs(b)}; !slices.Equal(got[0], []string{"198.18.0.1"}) || !slices.Equal(got[1], []string{"198.18.0.2"}) || d.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("answers %v, then %v", got, d.RCode)
	}
}

// connClosedByServer waits for the server to close c: a read ends in EOF
// (or a reset) long before the client's own deadline.
func connClosedByServer(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection: %v", err)
	}
}

func TestTCPClosesAnIdleConnection(t *testing.T) {
	s, _ := newServer(t, Config{IdleTimeout: 50 * time.Millisecond}, "api.example.test")
	sv := serve(t, s)
	c, err := net.Dial("tcp", sv.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	writeFramed(t, c, query(t, 1, "api.example.test.", dnsmessage.TypeA))
	readFramed(t, c)
	connClosedByServer(t, c)

	// Half a query is no better than none.
	trickle, err := net.Dial("tcp", sv.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer trickle.Close()
	if _, err := trickle.Write([]byte{0, 40, 0xbe}); err != nil {
		t.Fatal(err)
	}
	connClosedByServer(t, trickle)
}

// Idle connections stay open for a minute in these tests, so that a
// connection closed within connClosedByServer's 10s was closed for another
// reason.
const longIdle = time.Minute

func TestTCPClosesSurplusConnectionsAndNonQueries(t *testing.T) {
	s, _ := newServer(t, Config{IdleTimeout: longIdle, MaxConns: 2}, "api.example.test")
	sv := serve(t, s)

	// Two connections in use fill the server; a third is closed at once.
	var open []net.Conn
	for i := range 2 {
		c, err := net.Dial("tcp", sv.tcp)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		writeFramed(t, c, query(t, uint16(i), "api.example.test.", dnsmessage.TypeA))
		readFramed(t, c)
		open = append(open, c)
	}
	surplus, err := net.Dial("tcp", sv.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer surplus.Close()
	connClosedByServer(t, surplus)
	for _, c := range open {
		c.Close()
	}

	// A message that is not a query ends the conversation.
	c, err := net.Dial("tcp", sv.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	notQuery := query(t, 9, "api.example.test.", dnsmessage.TypeA)
	notQuery[2] |= 0x80
	writeFramed(t, c, notQuery)
	connClosedByServer(t, c)
}

func TestClosingTheListenerEndsServeStreamAndItsConnections(t *testing.T) {
	s, _ := newServer(t, Config{IdleTimeout: longIdle}, "api.example.test")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.ServeStream(ln) }()
	var conns []net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		writeFramed(t, c, query(t, uint16(i), "api.example.test.", dnsmessage.TypeA))
		readFramed(t, c) // served: its goroutine is running
		conns = append(conns, c)
	}
	if !serveConnRunning() {
		t.Fatal("no connection goroutine found while connections are open")
	}

	ln.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeStream after close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeStream still running 10s after its listener closed")
	}
	for _, c := range conns {
		connClosedByServer(t, c)
	}
	await.Cond(t, 10*time.Second, "no serveConn goroutine left", func() bool { return !serveConnRunning() })
}

func serveConnRunning() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "taskdns.(*Server).serveConn")
}

func TestServePacketEndsWhenItsConnCloses(t *testing.T) {
	s, _ := newServer(t, Config{})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.ServePacket(pc) }()
	pc.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServePacket after close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServePacket still running 10s after its conn closed")
	}
}
