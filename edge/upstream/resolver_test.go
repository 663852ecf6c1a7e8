package upstream

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is a real UDP DNS server on loopback answering from a table.
type dnsServer struct {
	conn    net.PacketConn
	mu      sync.Mutex
	queries []string
	answers map[string][]netip.Addr
}

func startDNS(t *testing.T, answers map[string][]netip.Addr) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{conn: pc, answers: answers}
	t.Cleanup(func() { pc.Close() })
	go s.serve()
	return s
}

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		var q dnsmessage.Message
		if q.Unpack(buf[:n]) != nil || len(q.Questions) != 1 {
			continue
		}
		qq := q.Questions[0]
		name := strings.TrimSuffix(qq.Name.String(), ".")
		s.mu.Lock()
		s.queries = append(s.queries, name+"/"+qq.Type.String())
		s.mu.Unlock()
		resp := dnsmessage.Message{Header: dnsmessage.Header{ID: q.ID, Response: true, RCode: dnsmessage.RCodeSuccess}, Questions: q.Questions}
		addrs, ok := s.answers[name]
		if !ok {
			resp.RCode = dnsmessage.RCodeNameError
		}
		for _, a := range addrs {
			h := dnsmessage.ResourceHeader{Name: qq.Name, Class: dnsmessage.ClassINET, TTL: 60}
			switch {
			case a.Is4() && qq.Type == dnsmessage.TypeA:
				h.Type = dnsmessage.TypeA
				resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: h, Body: &dnsmessage.AResource{A: a.As4()}})
			case a.Is6() && qq.Type == dnsmessage.TypeAAAA:
				h.Type = dnsmessage.TypeAAAA
				resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: h, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
			}
		}
		out, _ := resp.Pack()
		s.conn.WriteTo(out, from)
	}
}

func (s *dnsServer) Queries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.queries...)
}

// uplinkTo returns an UplinkResolver whose resolv.conf lists a non-local
// server (192.0.2.53) that the injected dial routes to srv on loopback.
func uplinkTo(t *testing.T, srv *dnsServer, resolvConf string) *UplinkResolver {
	t.Helper()
	path := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(path, []byte(resolvConf), 0o644); err != nil {
		t.Fatal(err)
	}
	return &UplinkResolver{
		Files:      []string{filepath.Join(t.TempDir(), "missing"), path},
		LocalAddrs: func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("192.0.2.10")} },
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			if address != "192.0.2.53:53" {
				t.Errorf("dialled DNS server %s, want 192.0.2.53:53", address)
				return nil, errors.New("unexpected server")
			}
			return (&net.Dialer{}).DialContext(ctx, network, srv.conn.LocalAddr().String())
		},
	}
}

func TestUplinkResolverIgnoresHostsFileAndLocalServers(t *testing.T) {
	srv := startDNS(t, map[string][]netip.Addr{
		"api.example.test": {netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::7")},
	})
	r := uplinkTo(t, srv, "# local stubs never count\nnameserver 127.0.0.53\nnameserver ::1\nnameserver 192.0.2.10\nnameserver 192.0.2.53\n")
	got, err := r.LookupNetIP(context.Background(), "ip", "api.example.test")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != netip.MustParseAddr("203.0.113.7") || got[1] != netip.MustParseAddr("2001:db8::7") {
		t.Errorf("got %v", got)
	}
	// "localhost" is in /etc/hosts; the uplink resolver must ask DNS instead.
	if _, err := r.LookupNetIP(context.Background(), "ip", "localhost"); err == nil {
		t.Error("localhost resolved: the hosts file answered")
	}
	if q := srv.Queries(); len(q) != 4 || q[2] != "localhost/TypeA" {
		t.Errorf("queries = %v", q)
	}
}

func TestUplinkResolverFailsClosedWithoutAnUplinkServer(t *testing.T) {
	srv := startDNS(t, nil)
	r := uplinkTo(t, srv, "nameserver 127.0.0.53\nnameserver 192.0.2.10\nnameserver ::ffff:127.0.0.1\n")
	if _, err := r.LookupNetIP(context.Background(), "ip", "api.example.test"); !errors.Is(err, ErrNoUplink) {
		t.Fatalf("err = %v, want ErrNoUplink", err)
	}
	if q := srv.Queries(); len(q) != 0 {
		t.Errorf("a local server was asked: %v", q)
	}
}

func TestUplinkResolverRereadsServersPerLookup(t *testing.T) {
	srv := startDNS(t, map[string][]netip.Addr{"a.example.test": {netip.MustParseAddr("203.0.113.1")}})
	r := uplinkTo(t, srv, "nameserver 127.0.0.53\n")
	if _, err := r.LookupNetIP(context.Background(), "ip", "a.example.test"); !errors.Is(err, ErrNoUplink) {
		t.Fatalf("err = %v", err)
	}
	os.WriteFile(r.Files[1], []byte("nameserver 192.0.2.53\n"), 0o644)
	if got, err := r.LookupNetIP(context.Background(), "ip4", "a.example.test"); err != nil || len(got) != 1 {
		t.Fatalf("after the change: %v %v", got, err)
	}
}
