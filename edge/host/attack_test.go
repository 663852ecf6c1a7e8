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

	"github.com/runfleet/runfleet/edge/proxy"
	"github.com/runfleet/runfleet/shared/hostproto"
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
	run := e.start(hostproto.StartRequest{Prompt: prompt, Secrets: apiToken})
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
// connect to, where hosts keep theirs (/run: systemd-resolved's varlink,
// D-Bus's system bus, journald's /dev/log, nscd, a database): it counts
// the connections it accepts, each sent tallyBanner.
type hostSocket struct {
	path  string
	conns atomic.Int64
}

func newHostSocket(t *testing.T) *hostSocket {
	t.Helper()
	dir, err := os.MkdirTemp("/run", "runfleet-test-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o755))
	s := &hostSocket{path: filepath.Join(dir, "service.sock")}
	l, err := net.Listen("unix", s.path)
	must(t, err)
	t.Cleanup(func() { l.Close() })
	must(t, os.Chmod(s.path, 0o777))
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
	return s
}

// A task's network is its own, and a Unix socket is no way around it: the
// host's services on Unix sockets under /run (a resolver that answers from
// the host's DNS and hosts file, the system bus, the journal, a database)
// are no more the task's than its loopback services are, for a task with
// secrets and one without.
func TestTaskCannotReachTheHostsUnixSockets(t *testing.T) {
	f := newFixture(t)
	sock := newHostSocket(t)
	e := f.open(hostOptions{})
	c, err := net.Dial("unix", sock.path)
	must(t, err)
	c.Close()
	prompt := fmt.Sprintf(`/usr/bin/python3 - <<'EOF'
import errno, socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(%q)
    print('unix connected, read', len(s.recv(64)))
except OSError as e:
    print('unix', errno.errorcode.get(e.errno, e))
EOF
`, sock.path)
	for _, secrets := range [][]hostproto.Secret{apiToken, nil} {
		run := e.start(hostproto.StartRequest{Prompt: prompt, Secrets: secrets})
		e.waitEnd(run.RunID)
		if out := e.output(run.RunID); !strings.Contains(out, "unix ENOENT") {
			t.Errorf("the task with %d secrets reached the host's Unix socket: %s", len(secrets), out)
		}
	}
	if n := sock.conns.Load() - 1; n != 0 {
		t.Errorf("the host's Unix socket accepted %d connections from the tasks", n)
	}
}
