package host

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// loopbackResolver is where a stub resolver of the host would listen:
// port 53 of an IPv4 loopback address (this process's own, as all of 127/8
// is loopback, so test binaries running side by side do not contend for
// it) and of ::1.
type loopbackResolver struct{ v4, v6 *tally }

func newLoopbackResolver(t *testing.T) *loopbackResolver {
	t.Helper()
	v4 := fmt.Sprintf("127.53.%d.%d:53", os.Getpid()>>8&0xff, os.Getpid()&0xff)
	return &loopbackResolver{v4: newTally(t, v4), v6: newTally(t, "[::1]:53")}
}

// A task's DNS is edge's, whatever server it asks: a query to the host's
// loopback resolver addresses is answered by edge and never arrives there.
// A name a key of the task may reach resolves to a pin; any other name
// resolves to a pin too where proxy.egress is open, and not at all where
// it is strict (NXDOMAIN), where a connection to an address no key names
// is refused by policy before edge dials anything. A task without secrets
// resolves nothing.
func TestTaskDNSIsEdgesAndFollowsTheEgressSetting(t *testing.T) {
	for _, egress := range []string{"open", "strict"} {
		t.Run(egress, func(t *testing.T) {
			f := newFixture(t)
			f.egress = egress
			resolver := newLoopbackResolver(t)
			e := f.open(hostOptions{})
			resolver.v4.reach(t, &net.Dialer{})
			resolver.v6.reach(t, &net.Dialer{})
			const granted, other = "api.example.test", "tunnel.example.test"
			spec := probes{
				TCP:   []probe{{Label: "metadata", Addr: "169.254.169.254:80"}},
				Names: []probe{{Label: "granted", Addr: granted}, {Label: "other", Addr: other}},
				DNS: []probe{
					{Label: "resolver4", Addr: resolver.v4.addr, Say: granted},
					{Label: "resolver6", Addr: resolver.v6.addr, Say: granted},
					{Label: "resolver4-other", Addr: resolver.v4.addr, Say: other},
				},
			}
			served := e.start(runspec.Request{Prompt: probeScript(spec), Secrets: e.apiToken()})
			bare := e.start(runspec.Request{Prompt: probeScript(spec)})
			e.waitEnd(served.RunID)
			e.waitEnd(bare.RunID)

			otherName, otherGetent, otherDNS := "PIN", "PIN", "A PIN"
			metadataReason := "upstream refused: a metadata address, not in upstream.allowPrivate"
			if egress == "strict" {
				otherName, otherGetent, otherDNS = "EAI_NONAME", "exit 2", "rcode 3"
				metadataReason = "no key of this task reaches 169.254.169.254:80; egress is strict"
			}
			checkProbes(t, "the task with secrets", e.output(served.RunID), map[string]string{
				"tcp metadata":            "connected, read 0",
				"name granted":            "PIN",
				"getent granted":          "PIN",
				"name other":              otherName,
				"getent other":            otherGetent,
				"dns-udp resolver4":       "A PIN",
				"dns-tcp resolver4":       "A PIN",
				"dns-udp resolver6":       "A PIN",
				"dns-tcp resolver6":       "A PIN",
				"dns-udp resolver4-other": otherDNS,
				"dns-tcp resolver4-other": otherDNS,
			})
			checkProbes(t, "the task without secrets", e.output(bare.RunID), map[string]string{
				"tcp metadata":            "ENETUNREACH",
				"name granted":            "NOTFOUND",
				"getent granted":          "exit 2",
				"name other":              "NOTFOUND",
				"getent other":            "exit 2",
				"dns-udp resolver4":       "ECONNREFUSED",
				"dns-tcp resolver4":       "ECONNREFUSED",
				"dns-udp resolver6":       "ECONNREFUSED",
				"dns-tcp resolver6":       "ECONNREFUSED",
				"dns-udp resolver4-other": "ECONNREFUSED",
				"dns-tcp resolver4-other": "ECONNREFUSED",
			})
			if l := f.waitAudit(served.RunID, "169.254.169.254:80")["169.254.169.254:80"]; l.Action != audit.Denied || l.Reason != metadataReason {
				t.Errorf("the audit of the metadata connection: %+v, want denied %q", l, metadataReason)
			}
			resolver.v4.reachedOnce(t, "the host's loopback resolver")
			resolver.v6.reachedOnce(t, "the host's loopback resolver")
		})
	}
}

// hostsFileName is a name the host's /etc/hosts lists (not a localhost
// name, which edge's DNS answers itself) and the addresses it gives it
// there; false when it lists none. The machine's hostname comes last: a
// task shares it, and its own hosts file may well list it.
func hostsFileName(t *testing.T) (string, []string, bool) {
	t.Helper()
	b, err := os.ReadFile("/etc/hosts")
	must(t, err)
	hostname, _ := os.Hostname()
	addrs := map[string][]string{}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		for _, name := range fields[1:] {
			name = strings.ToLower(strings.TrimSuffix(name, "."))
			if name == "localhost" || strings.HasSuffix(name, ".localhost") || strings.HasPrefix(name, "localhost.") || strings.HasPrefix(name, "ip6-") {
				continue
			}
			if addrs[name] == nil {
				names = append(names, name)
			}
			addrs[name] = append(addrs[name], fields[0])
		}
	}
	for _, name := range names {
		if name != hostname {
			return name, addrs[name], true
		}
	}
	if addrs[hostname] != nil {
		return hostname, addrs[hostname], true
	}
	return "", nil, false
}

// answeredByEdge is a probe's answer for a name that edge's DNS gave, or
// that no server gave: a pin, or a failure to resolve.
var answeredByEdge = regexp.MustCompile(`^((A )?198\.1[89]\.\d{1,3}\.\d{1,3}|EAI_[A-Z]+|exit 2|rcode 3|ECONNREFUSED)$`)

// The host's hosts file never answers a task: a name only it lists does
// not resolve to its address there, through the task's C library
// (getaddrinfo, getent) or a query to a stub resolver's address (which
// edge's DNS answers), for a task with secrets (a pin where egress is
// open, or nothing) or without (nothing). Nor does it answer the task's
// clone, which runs before the agent: a task without secrets has no DNS,
// so its clone of a URL naming that host cannot resolve the name.
func TestTaskDNSNeverAnswersFromTheHostsHostsFile(t *testing.T) {
	f := newFixture(t)
	e := f.open(hostOptions{})
	// Whatever the host's file lists, the task reads edge's, which knows
	// the loopback alone.
	for _, secrets := range [][]runspec.Secret{e.apiToken(), nil} {
		run := e.start(runspec.Request{Prompt: "cat /etc/hosts", Secrets: secrets})
		e.waitEnd(run.RunID)
		if got, want := strings.ReplaceAll(e.output(run.RunID), "\r\n", "\n"), "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"; got != want {
			t.Errorf("the task with %d secrets reads /etc/hosts as %q, want %q", len(secrets), got, want)
		}
	}
	name, hostAddrs, ok := hostsFileName(t)
	if !ok {
		// Nothing but localhost's names to look up, which the task's own
		// file answers alike: the file's content above is the check.
		t.Log("/etc/hosts lists no name but localhost's; the task's file was checked, no name was looked up")
		return
	}
	spec := probes{
		Names: []probe{{Label: "hosts-file", Addr: name}},
		DNS:   []probe{{Label: "hosts-file", Addr: "127.0.0.53:53", Say: name}},
	}
	for _, secrets := range [][]runspec.Secret{e.apiToken(), nil} {
		run := e.start(runspec.Request{Prompt: probeScript(spec), Secrets: secrets})
		e.waitEnd(run.RunID)
		out := e.output(run.RunID)
		got := probeResults(out)
		for _, kind := range []string{"name", "getent", "dns-udp", "dns-tcp"} {
			answer, ok := got[kind+" hosts-file"]
			switch {
			case !ok:
				t.Errorf("the task with %d secrets did not look %s up (%s): %s", len(secrets), name, kind, out)
			case slices.ContainsFunc(strings.Fields(answer), func(a string) bool { return slices.Contains(hostAddrs, a) }):
				t.Errorf("the task with %d secrets resolved %s (%s) to %q, its address in the host's /etc/hosts", len(secrets), name, kind, answer)
			case !answeredByEdge.MatchString(answer):
				t.Errorf("the task with %d secrets resolved %s (%s) to %q, neither a pin of edge's nor a failure", len(secrets), name, kind, answer)
			}
		}
	}
	run := e.start(runspec.Request{Prompt: "echo agent-ran", CloneURL: "http://" + name + ":1/repo.git"})
	if end := e.waitEnd(run.RunID); end.Reason != hostproto.ReasonCloneFailed || !strings.Contains(end.Detail, "Could not resolve host: "+name) {
		t.Errorf("the clone of http://%s:1/ by a task without DNS ended %+v, want clone_failed for want of the name", name, end)
	}
}
