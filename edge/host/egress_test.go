package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/sandbox"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// tally listens on one address over TCP and UDP and counts what arrives
// there: connections (each is sent tallyBanner and closed, so a client that
// got through reads bytes) and datagrams.
type tally struct {
	addr      string // host:port
	conns     atomic.Int64
	datagrams atomic.Int64
}

const tallyBanner = "tally\n"

// newTally listens on addr (port 0: a free one) in the test's own network.
func newTally(t *testing.T, addr string) *tally {
	t.Helper()
	tl, err := listenTally(t, addr)
	must(t, err)
	return tl
}

func listenTally(t *testing.T, addr string) (*tally, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s (the tests run as root): %w", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	tl := &tally{addr: l.Addr().String()}
	pc, err := net.ListenPacket("udp", tl.addr)
	if err != nil {
		return nil, fmt.Errorf("listening on udp %s: %w", tl.addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tl.conns.Add(1)
			io.WriteString(c, tallyBanner)
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			tl.datagrams.Add(1)
		}
	}()
	return tl, nil
}

// reach is the positive control: edge's own process sends the tally one connection
// and one datagram through d, and both arrive.
func (tl *tally) reach(t *testing.T, d *net.Dialer) {
	t.Helper()
	c, err := d.Dial("tcp", tl.addr)
	if err != nil {
		t.Fatalf("edge's own process cannot reach %s: %v", tl.addr, err)
	}
	c.Close()
	c, err = d.Dial("udp", tl.addr)
	must(t, err)
	_, err = c.Write([]byte("edge"))
	c.Close()
	must(t, err)
	if !await.Within(10*time.Second, func() bool { return tl.conns.Load() == 1 && tl.datagrams.Load() == 1 }) {
		t.Fatalf("%s got %d of edge's 1 connection and %d of its 1 datagram", tl.addr, tl.conns.Load(), tl.datagrams.Load())
	}
}

// reachedOnce checks that nothing but the control of reach arrived.
func (tl *tally) reachedOnce(t *testing.T, what string) {
	t.Helper()
	if n, m := tl.conns.Load()-1, tl.datagrams.Load()-1; n != 0 || m != 0 {
		t.Errorf("%s at %s got %d connections and %d datagrams from the tasks", what, tl.addr, n, m)
	}
}

// inNetns runs f on a thread inside the network namespace ns (one ip netns
// names), so the sockets f opens belong to that namespace's stack.
func inNetns(ns string, f func() error) error {
	there, err := os.Open(filepath.Join("/run/netns", ns))
	if err != nil {
		return err
	}
	defer there.Close()
	return sandbox.InNetwork(there, f)
}

// netnsPeer is another network stack: a network namespace joined to this
// one by a veth pair, so reaching it takes a route through a real
// interface that is not loopback, as another host would. It holds private
// addresses (IPv4 and unique-local IPv6) and the cloud metadata service's
// (169.254.169.254 and AWS's fd00:ec2::254, routed to the veth from here),
// each with a tally listening.
type netnsPeer struct {
	hostIf                           string
	private4, private6, meta4, meta6 *tally
}

func newNetnsPeer(t *testing.T) *netnsPeer {
	t.Helper()
	id := os.Getpid() % 50000
	ns := fmt.Sprintf("rfegress%d", id)
	hostIf, peerIf := fmt.Sprintf("rfe%dh", id), fmt.Sprintf("rfe%dp", id)
	v4net := fmt.Sprintf("10.%d.%d", 200+id/256%50, id%256)
	v6net := fmt.Sprintf("fd52:7266:%x:", id)
	const meta4, meta6 = "169.254.169.254", "fd00:ec2::254"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("/usr/sbin/ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Deleting the link deletes the routes through it.
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
	ip("-n", ns, "addr", "add", meta4+"/32", "dev", peerIf)
	ip("-n", ns, "-6", "addr", "add", meta6+"/128", "dev", peerIf, "nodad")
	ip("-n", ns, "link", "set", peerIf, "up")
	ip("-n", ns, "link", "set", "lo", "up")
	// The metadata addresses are one per machine: test binaries running
	// side by side each add a route of their own metric, and reach binds
	// its sockets to this peer's veth, so each reaches its own peer.
	metric := fmt.Sprint(1000 + id)
	ip("route", "add", meta4+"/32", "dev", hostIf, "metric", metric)
	ip("-6", "route", "add", meta6+"/128", "dev", hostIf, "metric", metric)

	p := &netnsPeer{hostIf: hostIf}
	must(t, inNetns(ns, func() error {
		var err error
		for _, l := range []struct {
			tl   **tally
			addr string
		}{
			{&p.private4, v4net + ".2:18080"},
			{&p.private6, "[" + v6net + ":2]:18080"},
			{&p.meta4, meta4 + ":80"},
			{&p.meta6, "[" + meta6 + "]:80"},
		} {
			if *l.tl, err = listenTally(t, l.addr); err != nil {
				return err
			}
		}
		return nil
	}))
	return p
}

func (p *netnsPeer) tallies() []*tally { return []*tally{p.private4, p.private6, p.meta4, p.meta6} }

// dialer reaches the peer through its veth alone (SO_BINDTODEVICE).
func (p *netnsPeer) dialer() *net.Dialer {
	return &net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.BindToDevice(int(fd), p.hostIf) }); cerr != nil {
			return cerr
		}
		return err
	}}
}

// probe is one thing probeScript tries: a TCP connection or a datagram to
// Addr (host:port), the name Addr, or a DNS query to the server Addr for
// the name Say. Say is also what a TCP probe sends once connected.
type probe struct {
	Label string `json:"label"`
	Addr  string `json:"addr"`
	Say   string `json:"say,omitempty"`
}

// probes are what a task tries, in this order.
type probes struct {
	// Own are addresses the task serves itself (a thread of the script
	// answers "own-ok") and then connects to.
	Own   []string `json:"own"`
	TCP   []probe  `json:"tcp"`
	UDP   []probe  `json:"udp"`
	Names []probe  `json:"names"`
	DNS   []probe  `json:"dns"`
}

// probeScript is a task's shell prompt that tries each probe from inside
// the task and prints one line "KIND LABEL RESULT" for each, RESULT being
// an errno or EAI_ name, or:
//
//	own ADDR own-ok                    its own listener answered
//	tcp LABEL connected, read N        connected; the peer closed after N bytes
//	udp LABEL sent
//	name LABEL ADDR...                 getaddrinfo's answer
//	getent LABEL ADDR... | exit N      getent hosts's
//	dns-udp|dns-tcp LABEL A ADDR...    the server's answer, or rcode N
//
// Every wait is bounded by a socket timeout (a "timeout" result), never a
// sleep.
func probeScript(p probes) string {
	spec, _ := json.Marshal(p)
	return `/usr/bin/python3 - <<'EOF'
import errno, json, socket, struct, subprocess, threading
spec = json.loads(r'''` + string(spec) + `''')
EAI = {getattr(socket, n): n for n in dir(socket) if n.startswith('EAI_')}
def why(e):
    if isinstance(e, socket.timeout): return 'timeout'
    if isinstance(e, socket.gaierror): return EAI.get(e.errno, 'EAI %s' % e.errno)
    return errno.errorcode.get(e.errno, str(e))
def target(addr):
    host, port = addr.rsplit(':', 1)
    return (socket.AF_INET6 if host.startswith('[') else socket.AF_INET), (host.strip('[]'), int(port))
def serve(srv):
    while True:
        c, _ = srv.accept()
        c.sendall(b'own-ok')
        c.close()
for addr in spec['own'] or []:
    fam, t = target(addr)
    try:
        srv = socket.socket(fam)
        srv.bind(t)
        srv.listen()
        threading.Thread(target=serve, args=(srv,), daemon=True).start()
        c = socket.socket(fam)
        c.settimeout(10)
        c.connect(t)
        print('own', addr, c.recv(16).decode())
    except OSError as e:
        print('own', addr, why(e))
for p in spec['tcp'] or []:
    fam, t = target(p['addr'])
    s = socket.socket(fam)
    s.settimeout(10)
    try:
        s.connect(t)
    except OSError as e:
        print('tcp', p['label'], why(e))
        continue
    try:
        if p.get('say'): s.sendall(p['say'].encode())
        n = 0
        while True:
            b = s.recv(4096)
            if not b: break
            n += len(b)
        print('tcp', p['label'], 'connected, read', n)
    except OSError as e:
        print('tcp', p['label'], 'connected,', why(e))
for p in spec['udp'] or []:
    fam, t = target(p['addr'])
    try:
        socket.socket(fam, socket.SOCK_DGRAM).sendto(b'x', t)
        print('udp', p['label'], 'sent')
    except OSError as e:
        print('udp', p['label'], why(e))
for p in spec['names'] or []:
    try:
        print('name', p['label'], ' '.join(sorted({a[4][0] for a in socket.getaddrinfo(p['addr'], 443, proto=socket.IPPROTO_TCP)})))
    except OSError as e:
        print('name', p['label'], why(e))
    r = subprocess.run(['/usr/bin/getent', 'hosts', p['addr']], capture_output=True, text=True)
    print('getent', p['label'], ' '.join(sorted(l.split()[0] for l in r.stdout.splitlines())) if r.returncode == 0 else 'exit %d' % r.returncode)
def question(name):
    q = struct.pack('>HHHHHH', 0x5266, 0x0100, 1, 0, 0, 0)
    for label in name.split('.'):
        q += bytes([len(label)]) + label.encode()
    return q + b'\0' + struct.pack('>HH', 1, 1)
def skip_name(m, i):
    while m[i] != 0:
        if m[i] >= 0xc0: return i + 2
        i += 1 + m[i]
    return i + 1
def answer(m):
    if m[3] & 0xf: return 'rcode %d' % (m[3] & 0xf)
    qd, an = struct.unpack('>HH', m[4:8])
    i = 12
    for _ in range(qd): i = skip_name(m, i) + 4
    got = ['A']
    for _ in range(an):
        i = skip_name(m, i)
        typ, _, _, size = struct.unpack('>HHIH', m[i:i + 10])
        i += 10
        if typ == 1: got.append(socket.inet_ntoa(m[i:i + size]))
        i += size
    return ' '.join(got)
for p in spec['dns'] or []:
    fam, t = target(p['addr'])
    q = question(p['say'])
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.settimeout(10)
    try:
        s.connect(t)
        s.send(q)
        print('dns-udp', p['label'], answer(s.recv(512)))
    except OSError as e:
        print('dns-udp', p['label'], why(e))
    s = socket.socket(fam)
    s.settimeout(10)
    try:
        s.connect(t)
        s.sendall(struct.pack('>H', len(q)) + q)
        m = b''
        while len(m) < 2 or len(m) < 2 + struct.unpack('>H', m[:2])[0]:
            b = s.recv(4096)
            if not b: raise OSError(errno.ECONNRESET, 'closed mid-answer')
            m += b
        print('dns-tcp', p['label'], answer(m[2:]))
    except OSError as e:
        print('dns-tcp', p['label'], why(e))
EOF
`
}

// probeResults reads probeScript's lines, keyed "KIND LABEL".
func probeResults(out string) map[string]string {
	got := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.SplitN(strings.TrimRight(line, "\r"), " ", 3)
		if len(f) == 3 {
			got[f[0]+" "+f[1]] = f[2]
		}
	}
	return got
}

// checkProbes compares the task's results with want, where PIN in a wanted
// result stands for any address of the task's pin range (198.18.0.0/15),
// and NOTFOUND for any failure of getaddrinfo (an EAI_ name).
func checkProbes(t *testing.T, who, out string, want map[string]string) {
	t.Helper()
	got := probeResults(out)
	wrong := false
	for key, w := range want {
		pattern := strings.NewReplacer("PIN", `198\.1[89]\.\d{1,3}\.\d{1,3}`, "NOTFOUND", `EAI_[A-Z]+`).Replace(regexp.QuoteMeta(w))
		re := regexp.MustCompile("^" + pattern + "$")
		if g, ok := got[key]; !ok || !re.MatchString(g) {
			t.Errorf("%s: %s gave %q, want %q", who, key, g, w)
			wrong = true
		}
	}
	if wrong {
		t.Logf("%s's output:\n%s", who, out)
	}
}

// auditEntries reads the audit file (lines written so far).
func (f *fixture) auditEntries() []audit.Entry {
	f.t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dataDir, "logs", audit.FileName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	must(f.t, err)
	var entries []audit.Entry
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e audit.Entry
		if line != "" {
			must(f.t, json.Unmarshal([]byte(line), &e))
			entries = append(entries, e)
		}
	}
	return entries
}

// waitAudit waits for the audit to hold a line of task's for each host in
// want, and returns them by host.
func (f *fixture) waitAudit(task string, want ...string) map[string]audit.Entry {
	f.t.Helper()
	var byHost map[string]audit.Entry
	if !await.Within(10*time.Second, func() bool {
		byHost = map[string]audit.Entry{}
		for _, e := range f.auditEntries() {
			if e.Task == task {
				byHost[e.Host] = e
			}
		}
		for _, h := range want {
			if _, ok := byHost[h]; !ok {
				return false
			}
		}
		return true
	}) {
		f.t.Fatalf("the audit lacks a line of %s for one of %q: it has %+v", task, want, byHost)
	}
	return byHost
}

// apiRefusals counts the host API's log lines for requests refused for
// want of the host credential: every request the API serves logs one.
func (e *edgeHost) apiRefusals() int {
	n := 0
	for _, line := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(line, `"msg":"host api"`) && strings.Contains(line, `"status":401`) {
			n++
		}
	}
	return n
}

// otherTask is a task serving 127.0.0.1:otherTaskPort on its own loopback:
// it prints "accepted" for each connection, the first its own.
const (
	otherTaskPort   = 4100
	otherTaskServer = `/usr/bin/python3 - <<'EOF'
import socket
srv = socket.socket()
srv.bind(('127.0.0.1', 4100))
srv.listen()
socket.create_connection(('127.0.0.1', 4100))
while True:
    c, _ = srv.accept()
    print('accepted', flush=True)
    c.close()
EOF
`
)

// A task's network is its own: it serves and reaches its own loopback,
// and off it nothing but edge. Edge's host API, the host's loopback
// listeners and another task's listener are not in its network at all (a
// connect is refused by its own loopback). A task with secrets has every
// other connection redirected to edge, which refuses the metadata service
// and private addresses in its upstream guard (the task sees its
// connection closed, the audit says why) and drops its datagrams (EPERM);
// a task without secrets has no route off its loopback. Nothing of either
// arrives anywhere, while edge's own process reaches every one of those
// listeners.
func TestTaskReachesOnlyItsOwnLoopbackAndEdge(t *testing.T) {
	f := newFixture(t)
	peer := newNetnsPeer(t)
	host4, host6 := newTally(t, "127.0.0.1:0"), newTally(t, "[::1]:0")
	e := f.open(hostOptions{})
	if h, err := e.client.Health(bg); err != nil || !h.EgressConfined {
		t.Fatalf("health %+v %v: want egressConfined", h, err)
	}
	host4.reach(t, &net.Dialer{})
	host6.reach(t, &net.Dialer{})
	for _, tl := range peer.tallies() {
		tl.reach(t, peer.dialer())
	}
	api := e.APIAddr().String()
	res, err := http.Get("http://" + api + "/healthz")
	must(t, err)
	res.Body.Close()
	await.Cond(t, 10*time.Second, "the host API's line for edge's own request", func() bool { return e.apiRefusals() == 1 })

	other := e.start(runspec.Request{Prompt: otherTaskServer, Secrets: e.apiToken()})
	// It runs until canceled: at the end, or sooner when the test stops
	// early, so that edge's shutdown need not wait it out.
	t.Cleanup(func() { e.client.Cancel(bg, other.RunID) })
	e.waitOutput(other.RunID, "accepted")

	spec := probes{
		Own: []string{"127.0.0.1:4200", "[::1]:4200"},
		TCP: []probe{
			{Label: "api", Addr: api, Say: "GET /healthz HTTP/1.0\r\n\r\n"},
			{Label: "host4", Addr: host4.addr}, {Label: "host6", Addr: host6.addr},
			{Label: "other-task", Addr: fmt.Sprintf("127.0.0.1:%d", otherTaskPort)},
			{Label: "metadata4", Addr: peer.meta4.addr}, {Label: "metadata6", Addr: peer.meta6.addr},
			{Label: "private4", Addr: peer.private4.addr}, {Label: "private6", Addr: peer.private6.addr},
		},
		UDP: []probe{
			{Label: "host4", Addr: host4.addr}, {Label: "host6", Addr: host6.addr},
			{Label: "metadata4", Addr: peer.meta4.addr}, {Label: "metadata6", Addr: peer.meta6.addr},
			{Label: "private4", Addr: peer.private4.addr}, {Label: "private6", Addr: peer.private6.addr},
		},
	}
	curl := fmt.Sprintf(`curl -sS --fail -H "Authorization: Bearer $API_TOKEN" https://%s/echo; echo`, f.upstreamHost)
	served := e.start(runspec.Request{Prompt: probeScript(spec) + curl, Secrets: e.apiToken()})
	bare := e.start(runspec.Request{Prompt: probeScript(spec)})
	servedEnd, bareEnd := e.waitEnd(served.RunID), e.waitEnd(bare.RunID)
	servedOut, bareOut := e.output(served.RunID), e.output(bare.RunID)

	common := map[string]string{
		"own 127.0.0.1:4200": "own-ok", "own [::1]:4200": "own-ok",
		"tcp api": "ECONNREFUSED", "tcp host4": "ECONNREFUSED", "tcp host6": "ECONNREFUSED", "tcp other-task": "ECONNREFUSED",
		// Sent to the task's own loopback, where nothing listens.
		"udp host4": "sent", "udp host6": "sent",
	}
	want := func(offLoopbackTCP, offLoopbackUDP string) map[string]string {
		w := map[string]string{}
		for k, v := range common {
			w[k] = v
		}
		for _, l := range []string{"metadata4", "metadata6", "private4", "private6"} {
			w["tcp "+l], w["udp "+l] = offLoopbackTCP, offLoopbackUDP
		}
		return w
	}
	checkProbes(t, "the task with secrets", servedOut, want("connected, read 0", "EPERM"))
	checkProbes(t, "the task without secrets", bareOut, want("ENETUNREACH", "ENETUNREACH"))
	if servedEnd.Status != hostproto.StatusSucceeded || !strings.Contains(servedOut, "upstream-ok") {
		t.Errorf("the task's call through edge failed (run %+v)", servedEnd)
	}
	if saw := f.upstreamSaw(); len(saw) != 1 || saw[0] != "Bearer "+realSecret {
		t.Errorf("the upstream saw %q", saw)
	}
	if bareEnd.Status != hostproto.StatusSucceeded {
		t.Errorf("the task without secrets ended %+v", bareEnd)
	}

	// The audit says why each redirected connection went nowhere.
	refused := map[string]string{
		peer.meta4.addr: "metadata", peer.meta6.addr: "metadata",
		peer.private4.addr: "private", peer.private6.addr: "unique-local",
	}
	var hosts []string
	for h := range refused {
		hosts = append(hosts, h)
	}
	lines := f.waitAudit(served.RunID, hosts...)
	for h, class := range refused {
		l := lines[h]
		if wantReason := "upstream refused: a " + class + " address, not in upstream.allowPrivate"; l.Action != audit.Denied || l.Reason != wantReason || l.Via != audit.ViaTransparent {
			t.Errorf("the audit of %s: %+v, want denied %q via transparent", h, l, wantReason)
		}
	}
	for _, l := range f.auditEntries() {
		if l.Task == bare.RunID {
			t.Errorf("the task without secrets reached the proxy: %+v", l)
		}
	}

	_, err = e.client.Cancel(bg, other.RunID)
	must(t, err)
	e.waitEnd(other.RunID)
	if n := strings.Count(e.output(other.RunID), "accepted"); n != 1 {
		t.Errorf("the other task's listener accepted %d connections, want its own alone", n)
	}
	if n := e.apiRefusals(); n != 1 {
		t.Errorf("the host API served %d requests from the tasks", n-1)
	}
	host4.reachedOnce(t, "the host's listener")
	host6.reachedOnce(t, "the host's listener")
	for _, tl := range peer.tallies() {
		tl.reachedOnce(t, "the peer's listener")
	}
}

// The clone runs in the task's network too (before the agent, as the
// task's user): a clone URL naming a listener on the host's loopback that
// is not edge's fails there, for a task with secrets and one without, and
// the listener sees nothing.
func TestTaskCloneRunsInTheTasksNetwork(t *testing.T) {
	f := newFixture(t)
	repo := newTally(t, "127.0.0.1:0")
	e := f.open(hostOptions{})
	repo.reach(t, &net.Dialer{})
	_, port, _ := net.SplitHostPort(repo.addr)
	for _, secrets := range [][]runspec.Secret{e.apiToken(), nil} {
		run := e.start(runspec.Request{Prompt: "echo agent-ran", CloneURL: "http://" + repo.addr + "/repo.git", Secrets: secrets})
		end := e.waitEnd(run.RunID)
		if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonCloneFailed ||
			!strings.Contains(end.Detail, "Failed to connect to 127.0.0.1 port "+port) {
			t.Errorf("the clone of a task with %d secrets ended %+v, want clone_failed for want of a connection", len(secrets), end)
		}
		if out := e.output(run.RunID); strings.Contains(out, "agent-ran") {
			t.Errorf("the agent ran after a failed clone: %s", out)
		}
	}
	repo.reachedOnce(t, "the host's listener")
}
