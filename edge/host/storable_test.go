package host

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/shared/runspec"
)

// storableEgress is a task's Python that reaches a name no key of it
// reaches ($TUNNEL) as clients do, and an IP address, printing one line
// "LABEL RESULT" for each: a status line and the leaf's issuer, an SSL
// failure's reason, or 0 when the connection closed with nothing said.
const storableEgress = `/usr/bin/python3 - <<'EOF'
import os, socket, ssl
host, port = os.environ['TUNNEL'].split(':'); port = int(port)
def get(label, ctx):
    try:
        t = ctx.wrap_socket(socket.create_connection((host, port), timeout=10), server_hostname=host)
        issuer = dict(x[0] for x in t.getpeercert()['issuer'])
        t.sendall(('GET /%s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n' % (label, host, port)).encode())
        print(label, t.recv(4096).split(b'\r\n')[0].decode(), issuer.get('organizationName', issuer.get('commonName')), flush=True)
    except ssl.SSLError as e:
        print(label, e.reason, flush=True)
def sent(label, addr, data):
    s = socket.create_connection(addr, timeout=10)
    s.sendall(data)
    got = s.recv(4096)
    print(label, got.split(b'\r\n')[0].decode() if got else 0, flush=True)
get('system-trust', ssl.create_default_context())
get('pinned', ssl.create_default_context(cafile=os.environ['PINNED']))
sent('plain', (host, port), ('GET /plain HTTP/1.1\r\nHost: %s:%d\r\n\r\n' % (host, port)).encode())
sent('ssh', (host, port), b'SSH-2.0-OpenSSH_9.6\r\n')
sent('ip', ('203.0.113.7', 443), b'')
EOF
`

// A run holding a key that may go in the body, under open egress, in its
// sandbox (issue 27 item 4): a real client reaching a name no key of it
// reaches, through the task's network redirect, gets edge's leaf (its
// system trust store holds edge's CA) and the request goes through the
// pipeline; one that pins the site's own CA fails; plain HTTP is answered
// 403, an SSH banner and an IP address are closed; each refusal is audited
// with its reason.
func TestOpenEgressInterceptsOrRefusesWhatABodyKeyRunOpensElsewhere(t *testing.T) {
	f := newFixture(t)
	f.keyIn = []string{"header", "body"}
	e := f.open(hostOptions{})
	pinned := filepath.Join(f.dir, "etc", "upstream-ca.pem")
	run := e.start(runspec.Request{Prompt: "export TUNNEL=" + f.tunnelHost + " PINNED=" + pinned + "\n" + storableEgress, Secrets: e.apiToken()})
	e.waitEnd(run.RunID)
	e.wantOutput(run.RunID,
		"system-trust HTTP/1.1 200 OK runfleet\n", // edge's CA's organization
		"pinned CERTIFICATE_VERIFY_FAILED\n",
		"plain HTTP/1.1 403 Forbidden\n",
		"ssh 0\n",
		"ip 0\n",
	)
	f.waitAudit(run.RunID, f.tunnelHost, "203.0.113.7:443")
	want := map[string]string{
		"system-trust": "",
		"pinned":       "its client may pin its certificate or not trust edge's CA; " + policy.StorableEgressRule,
		"plain":        "plain HTTP to " + f.tunnelHost + "; " + policy.StorableEgressRule,
		"ssh":          "neither TLS nor HTTP to " + f.tunnelHost + "; " + policy.StorableEgressRule,
		"ip":           "no key of this task reaches 203.0.113.7:443 and an IP address cannot be intercepted; " + policy.StorableEgressRule,
	}
	found := map[string]audit.Entry{}
	for _, l := range f.auditEntries() {
		if l.Task != run.RunID || l.Via != audit.ViaTransparent {
			continue
		}
		switch {
		case l.Path == "/system-trust":
			found["system-trust"] = l
		case strings.HasPrefix(l.Reason, "the TLS handshake with the task for "+f.tunnelHost+" failed"):
			found["pinned"] = l
		case l.Path == "/plain":
			found["plain"] = l
		case strings.HasPrefix(l.Reason, "neither TLS nor HTTP"):
			found["ssh"] = l
		case l.Host == "203.0.113.7:443":
			found["ip"] = l
		}
	}
	for label, reason := range want {
		l, ok := found[label]
		switch {
		case !ok:
			t.Errorf("%s: no audit line", label)
		case label == "system-trust" && (l.Action != audit.Forwarded || l.Status != 200):
			t.Errorf("%s: audit %+v", label, l)
		case label != "system-trust" && (l.Action != audit.Denied || !strings.HasSuffix(l.Reason, reason)):
			t.Errorf("%s: audit %+v", label, l)
		}
	}
}
