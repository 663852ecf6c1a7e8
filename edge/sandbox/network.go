package sandbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Inside a task's network, the ports edge listens on. Both are below 1024,
// so the task (no capabilities) could not bind them even if edge had not.
const (
	// TransparentPort receives every TCP connection the task opens to an
	// address off its loopback, redirected.
	TransparentPort = 1
	// DNSPort receives every DNS query the task sends, wherever addressed.
	DNSPort = 53
)

// Listeners are the sockets edge holds inside a task's network. They belong
// to that network: what connects to them is the task, and nothing else can.
type Listeners struct {
	// Explicit is the explicit proxy at 127.0.0.1:<NetworkConfig.ExplicitPort>,
	// where the task's HTTPS_PROXY points; nil when no port was asked.
	Explicit net.Listener
	// Transparent accept the redirected connections (IPv4, and IPv6 where
	// the namespace has it); OriginalDestination tells where each was going.
	Transparent []net.Listener
	// DNSPackets and DNSStreams receive DNS over UDP and TCP.
	DNSPackets []net.PacketConn
	DNSStreams []net.Listener
}

// NetworkConfig configures NewNetwork.
type NetworkConfig struct {
	// Serve: edge serves the task (Listeners, and the redirect to them).
	// Without it the network is a loopback alone: nothing off it is
	// reachable, and names do not resolve.
	Serve bool
	// ExplicitPort is the explicit proxy's port in the network (0: none).
	ExplicitPort int
	// NFT is the nft executable; default DefaultNFT.
	NFT string
}

// Network is one task's network namespace: its own loopback, and nothing
// else. With Serve, nftables inside it sends every TCP connection to an
// address off the loopback to a Transparent listener and every DNS query
// to edge's, and drops whatever else would leave the loopback: the task's
// one way off its loopback is edge. The host's loopback services, other
// tasks and the host's interfaces are not in this namespace at all.
//
// Edge opens the sockets inside the namespace (on a thread that enters it
// for the purpose) and serves them from its own; processes of the task
// start in it through Start. Close releases it; the namespace ends when the
// last of its processes and sockets does.
type Network struct {
	ns        *os.File // the namespace (an nsfs file)
	Listeners Listeners
}

// NewNetwork creates a task's network. It needs CAP_SYS_ADMIN (a new
// namespace) and, with Serve, nft.
func NewNetwork(cfg NetworkConfig) (*Network, error) {
	if cfg.ExplicitPort < 0 || cfg.ExplicitPort > 65535 || cfg.ExplicitPort == TransparentPort || cfg.ExplicitPort == DNSPort {
		return nil, fmt.Errorf("sandbox: explicit proxy port %d: must be 1-65535 and neither %d nor %d", cfg.ExplicitPort, TransparentPort, DNSPort)
	}
	n := &Network{}
	err := onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("creating a network namespace: %w", err)
		}
		ns, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return fmt.Errorf("opening the new network namespace: %w", err)
		}
		n.ns = ns
		return n.setUp(cfg)
	})
	if err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// setUp runs on a thread inside the new namespace.
func (n *Network) setUp(cfg NetworkConfig) error {
	lo, err := loopbackUp()
	if err != nil {
		return err
	}
	if !cfg.Serve {
		return nil
	}
	// IPv6 may be off in new namespaces (net.ipv6.conf.default.disable_ipv6);
	// then the task has no IPv6 at all, loopback included, and nothing of
	// it needs serving.
	v6 := hasIPv6Loopback()
	if err := addDefaultRoute(unix.AF_INET, lo); err != nil {
		return err
	}
	if v6 {
		if err := addDefaultRoute(unix.AF_INET6, lo); err != nil {
			return err
		}
	}
	if err := (NFTables{NFT: cfg.NFT}).run(taskRedirect()); err != nil {
		return err
	}
	var lc net.ListenConfig
	ctx := context.Background()
	listen := func(network, addr string) (net.Listener, error) {
		l, err := lc.Listen(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("sandbox: listening on %s in the task's network: %w", addr, err)
		}
		return l, nil
	}
	hosts := []string{"127.0.0.1"}
	if v6 {
		hosts = append(hosts, "::1")
	}
	ls := &n.Listeners
	for _, h := range hosts {
		l, err := listen("tcp", net.JoinHostPort(h, strconv.Itoa(TransparentPort)))
		if err != nil {
			return err
		}
		ls.Transparent = append(ls.Transparent, l)
		dnsAddr := net.JoinHostPort(h, strconv.Itoa(DNSPort))
		if l, err = listen("tcp", dnsAddr); err != nil {
			return err
		}
		ls.DNSStreams = append(ls.DNSStreams, l)
		pc, err := lc.ListenPacket(ctx, "udp", dnsAddr)
		if err != nil {
			return fmt.Errorf("sandbox: listening on udp %s in the task's network: %w", dnsAddr, err)
		}
		ls.DNSPackets = append(ls.DNSPackets, pc)
	}
	if cfg.ExplicitPort != 0 {
		if ls.Explicit, err = listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.ExplicitPort))); err != nil {
			return err
		}
	}
	return nil
}

// taskRedirect is the ruleset of a serving task network. DNS first: a
// query to any address (a resolver hard-coded to 8.8.8.8, or a stub at
// 127.0.0.53) reaches edge's. The task's own loopback stays its own. Every
// other TCP connection goes to the transparent listener, whose socket
// keeps the original destination (SO_ORIGINAL_DST). The filter runs after
// the redirect: whatever is still addressed off the loopback (UDP, ICMP)
// is dropped, and its send fails at once.
func taskRedirect() string {
	return fmt.Sprintf(`table inet runfleet_task {
	chain divert {
		type nat hook output priority -100; policy accept;
		udp dport 53 redirect to :%[2]d
		tcp dport 53 redirect to :%[2]d
		ip daddr 127.0.0.0/8 return
		ip6 daddr ::1 return
		meta l4proto tcp redirect to :%[1]d
	}
	chain confine {
		type filter hook output priority filter; policy accept;
		ip daddr != 127.0.0.0/8 drop
		ip6 daddr != ::1 drop
	}
}
`, TransparentPort, DNSPort)
}

// Start runs start (which starts a process: exec.Cmd.Start, pty.Start) on a
// thread inside the network, so the process it forks lives there. The
// thread leaves the namespace afterwards.
func (n *Network) Start(start func() error) error {
	if n == nil || n.ns == nil {
		return errors.New("sandbox: the task's network is closed")
	}
	return InNetwork(n.ns, start)
}

// InNetwork runs f on a thread inside the network namespace open as ns (an
// nsfs file: /proc/<pid>/ns/net, /run/netns/<name>), so the sockets f opens
// and the processes it starts belong to that namespace. The thread leaves
// it afterwards (see onThread).
func InNetwork(ns *os.File, f func() error) error {
	return onThread(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("sandbox: entering network namespace %s: %w", ns.Name(), err)
		}
		return f()
	})
}

// Close closes the listeners and the namespace's handle. The namespace
// ends with its last process. Closing twice does nothing.
func (n *Network) Close() error {
	var errs []error
	ls := &n.Listeners
	for _, l := range append(append(ls.Transparent, ls.DNSStreams...), ls.Explicit) {
		if l != nil {
			errs = append(errs, ignoreClosed(l.Close()))
		}
	}
	for _, pc := range ls.DNSPackets {
		errs = append(errs, ignoreClosed(pc.Close()))
	}
	*ls = Listeners{}
	if n.ns != nil {
		errs = append(errs, n.ns.Close())
		n.ns = nil
	}
	return errors.Join(errs...)
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// onThread runs f on a locked OS thread of its own and then puts the
// thread back in edge's network namespace. f may move the thread into
// another network namespace (and only that: nothing else of the thread may
// change). A thread that cannot be put back is never reused: its goroutine
// ends while locked, and the runtime ends the thread with it.
func onThread(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("sandbox: opening edge's network namespace: %w", err)
			return
		}
		defer home.Close()
		ferr := f()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("sandbox: returning to edge's network namespace: %w", err))
			return // still locked: the thread goes with this goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// loopbackUp brings the namespace's loopback up and returns its index.
func loopbackUp() (uint32, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("sandbox: a socket to configure the loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return 0, fmt.Errorf("sandbox: reading the loopback's flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return 0, fmt.Errorf("sandbox: bringing the loopback up: %w", err)
	}
	idx, err := unix.NewIfreq("lo")
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, idx); err != nil {
		return 0, fmt.Errorf("sandbox: reading the loopback's index: %w", err)
	}
	return idx.Uint32(), nil
}

// hasIPv6Loopback reports whether ::1 can be bound (IPv6 is on here).
func hasIPv6Loopback() bool {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.Bind(fd, &unix.SockaddrInet6{Addr: [16]byte{15: 1}}) == nil
}

// addDefaultRoute routes every address of family through the loopback, so
// that a connect off it reaches the output hook (and the redirect) instead
// of failing for want of a route. The kernel's route table is changed over
// rtnetlink, the interface ip(8) uses.
func addDefaultRoute(family int, ifindex uint32) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("sandbox: opening rtnetlink: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sandbox: binding rtnetlink: %w", err)
	}
	msg := routeMessage(family, ifindex)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sandbox: adding the default route: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("sandbox: reading rtnetlink's answer: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil || len(msgs) == 0 || msgs[0].Header.Type != unix.NLMSG_ERROR || len(msgs[0].Data) < 4 {
		return errors.New("sandbox: adding the default route: rtnetlink's answer is not an acknowledgement")
	}
	if errno := int32(binary.NativeEndian.Uint32(msgs[0].Data[:4])); errno != 0 {
		return fmt.Errorf("sandbox: adding the default route: %w", syscall.Errno(-errno))
	}
	return nil
}

// routeMessage is RTM_NEWROUTE for "default dev <ifindex> src <loopback
// address>" in the main table (what ip(8) sends). The source matters: a
// connection's replies must be addressed to the loopback too, or the
// confinement would drop them.
func routeMessage(family int, ifindex uint32) []byte {
	src := []byte{127, 0, 0, 1}
	if family == unix.AF_INET6 {
		src = make([]byte, 16)
		src[15] = 1
	}
	const hdr, rtm = unix.SizeofNlMsghdr, unix.SizeofRtMsg
	oif := unix.SizeofRtAttr + 4
	pref := unix.SizeofRtAttr + len(src)
	b := make([]byte, hdr+rtm+oif+pref)
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:], unix.RTM_NEWROUTE)
	binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	binary.NativeEndian.PutUint32(b[8:], 1) // sequence
	r := b[hdr:]
	r[0] = byte(family)
	r[4] = unix.RT_TABLE_MAIN
	r[5] = unix.RTPROT_BOOT
	r[6] = unix.RT_SCOPE_LINK
	r[7] = unix.RTN_UNICAST
	a := b[hdr+rtm:]
	binary.NativeEndian.PutUint16(a[0:], uint16(oif))
	binary.NativeEndian.PutUint16(a[2:], unix.RTA_OIF)
	binary.NativeEndian.PutUint32(a[4:], ifindex)
	a = a[oif:]
	binary.NativeEndian.PutUint16(a[0:], uint16(pref))
	binary.NativeEndian.PutUint16(a[2:], unix.RTA_PREFSRC)
	copy(a[4:], src)
	return b
}

// soOriginalDst is SO_ORIGINAL_DST (IPv4) and IP6T_SO_ORIGINAL_DST (IPv6):
// where a redirected connection was addressed, kept by conntrack.
const soOriginalDst = 80

// OriginalDestination is where a connection a Transparent listener
// accepted was going before the redirect.
func OriginalDestination(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("sandbox: not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	var dst netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if local.Addr().Is4() || local.Addr().Is4In6() {
			// A sockaddr_in fits the 20 bytes of an ipv6_mreq.
			m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, soOriginalDst)
			if err != nil {
				serr = err
				return
			}
			sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(m))
			port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
			dst = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
			return
		}
		// A sockaddr_in6 fits the 32 bytes of an ip6_mtuinfo.
		m, err := unix.GetsockoptIPv6MTUInfo(int(fd), unix.IPPROTO_IPV6, soOriginalDst)
		if err != nil {
			serr = err
			return
		}
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&m.Addr.Port))[:])
		dst = netip.AddrPortFrom(netip.AddrFrom16(m.Addr.Addr), port)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("sandbox: reading a connection's original destination: %w", err)
	}
	return dst, nil
}
