package host

import (
	"fmt"
	"os"
	"strings"
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
