package host

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/internal/edgetest"
	"github.com/runfleet/runfleet/shared/hostproto"
)

// netnsPeer is a listener on another network stack: a network namespace
// joined to this one by a veth pair, so reaching it takes a route through
// a real interface that is not loopback, as the cloud metadata service or
// any other host would.
type netnsPeer struct {
	v4, v6 string // host:port of the listener
}

func newNetnsPeer(t *testing.T) *netnsPeer {
	t.Helper()
	id := os.Getpid() % 50000
	ns := fmt.Sprintf("rfegress%d", id)
	hostIf, peerIf := fmt.Sprintf("rfe%dh", id), fmt.Sprintf("rfe%dp", id)
	v4net := fmt.Sprintf("10.%d.%d", 200+id/256%50, id%256)
	v6net := fmt.Sprintf("fd52:7266:%x:", id)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("/usr/sbin/ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		exec.Command("/usr/sbin/ip", "link", "del", hostIf).Run()
		exec.Command("/usr/sbin/ip", "netns", "del", ns).Run()
	})
	ip("netns", "add", ns)
	ip("link", "add", hostIf, "type", "veth", "peer", "name", peerIf, "netns", ns)
	ip("addr", "add", v4net+".1/30", "dev", hostIf)
	ip("-6", "addr", "add", v6net+":1/64", "dev", hostIf, "nodad")
	ip("link", "set", hostIf, "up")
	ip("-n", ns, "addr", "add", v4net+".2/30", "dev", peerIf)
	ip("-n", ns, "-6", "addr", "add", v6net+":2/64", "dev", peerIf, "nodad")
	ip("-n", ns, "link", "set", peerIf, "up")
	ip("-n", ns, "link", "set", "lo", "up")

	const port = "18080"
	server := exec.Command("/usr/sbin/ip", "netns", "exec", ns, "/usr/bin/python3", "-m", "http.server", "--bind", "::", port)
	server.Dir = t.TempDir()
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })
	return &netnsPeer{v4: net.JoinHostPort(v4net+".2", port), v6: net.JoinHostPort(v6net+":2", port)}
}

// dialWithin dials addr from this process until it answers or the
// deadline passes (the listener is another process, starting).
func dialWithin(addr string, d time.Duration) error {
	var err error
	edgetest.Within(d, func() bool {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			err = c.Close()
			return true
		}
		return false
	})
	return err
}

// reachScript is a task's shell prompt that tries, from the task, a TCP
// connect and a datagram to each host:port, printing one line for each:
// "tcp ADDR connected", "tcp ADDR ERRNO fast|slow" (fast: under a
// second), "udp ADDR sent" or "udp ADDR ERRNO".
func reachScript(addrs ...string) string {
	quoted := make([]string, len(addrs))
	for i, a := range addrs {
		quoted[i] = strconv.Quote(a)
	}
	return `/usr/bin/python3 - <<'EOF'
import errno, socket, time
for addr in [` + strings.Join(quoted, ", ") + `]:
    host, port = addr.rsplit(':', 1)
    family = socket.AF_INET6 if host.startswith('[') else socket.AF_INET
    target = (host.strip('[]'), int(port))
    s = socket.socket(family)
    s.settimeout(10)
    began = time.monotonic()
    try:
        s.connect(target)
        print('tcp', addr, 'connected')
    except OSError as e:
        print('tcp', addr, errno.errorcode.get(e.errno, e.errno), 'fast' if time.monotonic() - began < 1 else 'slow')
    try:
        socket.socket(family, socket.SOCK_DGRAM).sendto(b'x', target)
        print('udp', addr, 'sent')
    except OSError as e:
        print('udp', addr, errno.errorcode.get(e.errno, e.errno))
EOF
`
}

// A task's sockets leave only through loopback: it reaches the secrets
// proxy there and its HTTPS call goes through, while an address behind
// another interface (where the metadata service would be) is refused at
// once, over IPv4 and IPv6: a TCP connect gets a reset (ECONNREFUSED, the
// listener is there), a datagram's send fails with EPERM. Edge's own
// process reaches it.
func TestTaskEgressLeavesOnlyThroughLoopback(t *testing.T) {
	f := newFixture(t)
	peer := newNetnsPeer(t)
	e := f.open(hostOptions{})
	for _, addr := range []string{peer.v4, peer.v6} {
		if err := dialWithin(addr, 20*time.Second); err != nil {
			t.Fatalf("edge's own process cannot reach %s: %v", addr, err)
		}
	}
	if h, err := e.client.Health(bg); err != nil || !h.EgressConfined {
		t.Fatalf("health %+v %v: want egressConfined", h, err)
	}
	prompt := reachScript(peer.v4, peer.v6) + fmt.Sprintf(`curl -sS --fail -H "Authorization: Bearer $API_TOKEN" https://%s/echo; echo`, f.upstreamHost)
	run := e.start(hostproto.StartRequest{Prompt: prompt, Secrets: apiToken})
	end := e.waitEnd(run.RunID)
	out := e.output(run.RunID)
	for _, addr := range []string{peer.v4, peer.v6} {
		if !strings.Contains(out, "tcp "+addr+" ECONNREFUSED fast") {
			t.Errorf("the task's direct connect to %s was not refused at once: %s", addr, out)
		}
		if !strings.Contains(out, "udp "+addr+" EPERM") {
			t.Errorf("the task's datagram to %s was not refused with EPERM: %s", addr, out)
		}
	}
	if !strings.Contains(out, "upstream-ok") || end.Status != hostproto.StatusSucceeded {
		t.Fatalf("the task's call through the proxy on loopback failed (run %+v): %s", end, out)
	}
	if saw := f.upstreamSaw(); len(saw) != 1 || saw[0] != "Bearer "+realSecret {
		t.Fatalf("the upstream saw %q", saw)
	}
}

// loopbackResolver listens on port 53 (TCP and UDP) of two loopback
// addresses (one IPv4, one IPv6), where a stub resolver would, and counts what reaches it.
type loopbackResolver struct {
	addrs []string // host:port, IPv4 then IPv6
	got   atomic.Int64
}

func newLoopbackResolver(t *testing.T) *loopbackResolver {
	t.Helper()
	// An IPv4 address of this process's own (all of 127/8 is loopback), so
	// test binaries running side by side do not contend for port 53.
	v4 := fmt.Sprintf("127.53.%d.%d:53", os.Getpid()>>8&0xff, os.Getpid()&0xff)
	r := &loopbackResolver{addrs: []string{v4, "[::1]:53"}}
	for _, addr := range r.addrs {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listening on %s (the tests run as root): %v", addr, err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				r.got.Add(1)
				c.Close()
			}
		}()
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Fatalf("listening on udp %s: %v", addr, err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 512)
			for {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					return
				}
				r.got.Add(1)
			}
		}()
	}
	return r
}

// A confined task cannot reach port 53 on loopback, where a stub resolver
// would forward its queries off the host: a TCP connect is reset at once,
// a datagram's send fails with EPERM, and nothing arrives, while edge's own
// process reaches the same listeners.
func TestTaskCannotQueryALoopbackResolver(t *testing.T) {
	f := newFixture(t)
	resolver := newLoopbackResolver(t)
	e := f.open(hostOptions{})
	for _, addr := range resolver.addrs {
		c, err := net.Dial("udp", addr)
		must(t, err)
		_, err = c.Write([]byte("edge"))
		c.Close()
		must(t, err)
		must(t, dialWithin(addr, 5*time.Second))
	}
	if !edgetest.Within(5*time.Second, func() bool { return resolver.got.Load() == 4 }) {
		t.Fatalf("the listeners got %d of edge's 2 connections and 2 datagrams", resolver.got.Load())
	}
	prompt := reachScript(resolver.addrs...)
	run := e.start(hostproto.StartRequest{Prompt: prompt})
	e.waitEnd(run.RunID)
	out := e.output(run.RunID)
	for _, addr := range resolver.addrs {
		if !strings.Contains(out, "tcp "+addr+" ECONNREFUSED fast") {
			t.Errorf("the task's connect to the resolver at %s was not refused at once: %s", addr, out)
		}
		if !strings.Contains(out, "udp "+addr+" EPERM") {
			t.Errorf("the task's query to the resolver at %s was not refused with EPERM: %s", addr, out)
		}
	}
	if n := resolver.got.Load(); n != 4 {
		t.Errorf("the resolver got %d connections and datagrams from the task", n-4)
	}
}
