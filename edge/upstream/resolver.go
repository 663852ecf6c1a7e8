package upstream

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Resolver turns a canonical name into addresses. Implementations honour ctx
// and are safe for concurrent use. *net.Resolver satisfies it ("system").
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var _ Resolver = (*net.Resolver)(nil)

// ErrNoUplink is the uplink resolver failing closed: no DNS server that is
// not on this host is configured.
var ErrNoUplink = errors.New("upstream: no uplink DNS server: refusing to resolve through a local stub")

// uplinkResolvConfFiles lists where the machine's real DNS servers are
// written: systemd-resolved's upstream list first, then the classic file.
func uplinkResolvConfFiles() []string {
	return []string{"/run/systemd/resolve/resolv.conf", "/etc/resolv.conf"}
}

// DialFunc dials a network address; net.Dialer.DialContext satisfies it.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// UplinkResolver asks the machine's uplink DNS servers directly, never the
// hosts file and never a server on this host (a local stub such as
// systemd-resolved's 127.0.0.53 or dnsmasq answers from the hosts file, which
// may carry a task's pins). The servers are re-read per lookup, since DHCP
// may change them; with none it fails closed with ErrNoUplink.
type UplinkResolver struct {
	// Files are read in order; the first that lists a server not on this
	// host wins. Nil means systemd-resolved's upstream list
	// (/run/systemd/resolve/resolv.conf), then /etc/resolv.conf.
	Files []string
	// LocalAddrs returns this host's interface addresses; nil means the
	// system's.
	LocalAddrs func() []netip.Addr
	// Dial reaches a DNS server ("udp" or "tcp", "ip:53"); nil means a
	// net.Dialer.
	Dial DialFunc
	// Timeout bounds one query to one server; zero means 3s.
	Timeout time.Duration
	// Rand draws query ids (unpredictable ids make off-path spoofing
	// harder); nil means crypto/rand.
	Rand io.Reader
}

var _ Resolver = (*UplinkResolver)(nil)

// Servers returns the uplink DNS servers as they are configured now.
func (r *UplinkResolver) Servers() []netip.Addr {
	files := r.Files
	if files == nil {
		files = uplinkResolvConfFiles()
	}
	local := r.LocalAddrs
	if local == nil {
		local = InterfaceAddrs
	}
	own := local()
	for _, f := range files {
		servers := readNameservers(f, own)
		if len(servers) > 0 {
			return servers
		}
	}
	return nil
}

func readNameservers(path string, local []netip.Addr) []netip.Addr {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		ip, err := netip.ParseAddr(fields[1])
		if err != nil {
			continue
		}
		ip = ip.WithZone("").Unmap()
		if isLocalServer(ip, local) {
			continue
		}
		dup := false
		for _, o := range out {
			dup = dup || o == ip
		}
		if !dup {
			out = append(out, ip)
		}
	}
	return out
}

// isLocalServer: loopback, unspecified, or one of this host's addresses.
func isLocalServer(ip netip.Addr, local []netip.Addr) bool {
	if ip.IsLoopback() || ip.IsUnspecified() || netip.MustParsePrefix("0.0.0.0/8").Contains(ip) || netip.MustParsePrefix("::/96").Contains(ip) {
		return true
	}
	for _, l := range local {
		if l.WithZone("").Unmap() == ip {
			return true
		}
	}
	return false
}

// InterfaceAddrs returns this host's interface addresses.
func InterfaceAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out
}

// LookupNetIP asks each uplink server in turn for A and AAAA records of host
// (network "ip", "ip4" or "ip6").
func (r *UplinkResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	servers := r.Servers()
	if len(servers) == 0 {
		return nil, ErrNoUplink
	}
	name, err := dnsmessage.NewName(strings.TrimSuffix(host, ".") + ".")
	if err != nil {
		return nil, fmt.Errorf("upstream: resolving %s: %w", host, err)
	}
	var types []dnsmessage.Type
	if network != "ip6" {
		types = append(types, dnsmessage.TypeA)
	}
	if network != "ip4" {
		types = append(types, dnsmessage.TypeAAAA)
	}
	var lastErr error
	for _, server := range servers {
		var addrs []netip.Addr
		answered := false
		for _, t := range types {
			got, err := r.query(ctx, server, name, t)
			if err != nil {
				lastErr = err
				continue
			}
			answered = true
			addrs = append(addrs, got...)
		}
		if len(addrs) > 0 {
			return addrs, nil
		}
		if answered {
			return nil, fmt.Errorf("upstream: resolving %s: no A or AAAA records", host)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("upstream: resolving %s: %w", host, lastErr)
}

func (r *UplinkResolver) query(ctx context.Context, server netip.Addr, name dnsmessage.Name, qtype dnsmessage.Type) ([]netip.Addr, error) {
	timeout := r.Timeout
	if timeout == 0 {
		timeout = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var idBytes [2]byte
	rnd := r.Rand
	if rnd == nil {
		rnd = rand.Reader
	}
	if _, err := io.ReadFull(rnd, idBytes[:]); err != nil {
		return nil, err
	}
	id := uint16(idBytes[0])<<8 | uint16(idBytes[1])
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: name, Type: qtype, Class: dnsmessage.ClassINET}},
	}
	packed, err := msg.Pack()
	if err != nil {
		return nil, err
	}
	resp, err := r.exchange(ctx, "udp", server, packed, id)
	if err == nil && resp.Truncated {
		resp, err = r.exchange(ctx, "tcp", server, packed, id)
	}
	if err != nil {
		return nil, err
	}
	if resp.RCode == dnsmessage.RCodeNameError {
		return nil, nil // NXDOMAIN: an answer with nothing in it
	}
	if resp.RCode != dnsmessage.RCodeSuccess {
		return nil, fmt.Errorf("DNS server %s answered %v", server, resp.RCode)
	}
	return followAnswers(resp, name, qtype), nil
}

func (r *UplinkResolver) exchange(ctx context.Context, network string, server netip.Addr, query []byte, id uint16) (*dnsmessage.Message, error) {
	dial := r.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	conn, err := dial(ctx, network, netip.AddrPortFrom(server, 53).String())
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if network == "tcp" {
		framed := append([]byte{byte(len(query) >> 8), byte(len(query))}, query...)
		if _, err := conn.Write(framed); err != nil {
			return nil, err
		}
		var lenBuf [2]byte
		if _, err := io.ReadFull(conn, lenBuf[:]); err != nil {
			return nil, err
		}
		buf := make([]byte, int(lenBuf[0])<<8|int(lenBuf[1]))
		if _, err := io.ReadFull(conn, buf); err != nil {
			return nil, err
		}
		return parseReply(buf, id)
	}
	if _, err := conn.Write(query); err != nil {
		return nil, err
	}
	buf := make([]byte, 1232)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return nil, err
		}
		if m, err := parseReply(buf[:n], id); err == nil {
			return m, nil
		}
		// A reply with another id or garbage: keep waiting for ours.
	}
}

func parseReply(b []byte, id uint16) (*dnsmessage.Message, error) {
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil {
		return nil, err
	}
	if m.ID != id || !m.Response {
		return nil, errors.New("not the reply to this query")
	}
	return &m, nil
}

// followAnswers collects the addresses for name, following CNAMEs within the
// answer section only, so a record for some other name cannot slip in.
func followAnswers(m *dnsmessage.Message, name dnsmessage.Name, qtype dnsmessage.Type) []netip.Addr {
	want := strings.ToLower(name.String())
	var out []netip.Addr
	for hops := 0; hops < 8; hops++ {
		next := ""
		for _, a := range m.Answers {
			if strings.ToLower(a.Header.Name.String()) != want {
				continue
			}
			switch body := a.Body.(type) {
			case *dnsmessage.AResource:
				if qtype == dnsmessage.TypeA {
					out = append(out, netip.AddrFrom4(body.A))
				}
			case *dnsmessage.AAAAResource:
				if qtype == dnsmessage.TypeAAAA {
					out = append(out, netip.AddrFrom16(body.AAAA))
				}
			case *dnsmessage.CNAMEResource:
				next = strings.ToLower(body.CNAME.String())
			}
		}
		if len(out) > 0 || next == "" {
			return out
		}
		want = next
	}
	return out
}

// PinnedResolver answers pinned names (upstream.resolve) itself and passes
// every other name to Next.
type PinnedResolver struct {
	Pins map[string]netip.Addr
	Next Resolver
}

var _ Resolver = (*PinnedResolver)(nil)

// LookupNetIP returns the pin for host, or asks Next.
func (r *PinnedResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if ip, ok := r.Pins[host]; ok {
		return []netip.Addr{ip}, nil
	}
	return r.Next.LookupNetIP(ctx, network, host)
}
