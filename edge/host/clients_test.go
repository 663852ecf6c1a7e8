package host

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// taskClient is one kind of client a task runs against the granted
// upstream, each as its own users run it: no flag and no variable of the
// test's, only the task's env.
type taskClient struct {
	name string
	// path is where on the upstream the client calls (clientOf maps it
	// back to name).
	path string
	// honoursProxyVars: with HTTPS_PROXY set the client goes through the
	// explicit proxy; without it (or set, for a client that ignores it)
	// its connection is redirected to the transparent one.
	honoursProxyVars bool
	// requests is how many requests one call makes.
	requests int
	// command is the shell command calling url with "Authorization:
	// Bearer $API_TOKEN"; it prints what the upstream answered, the echoed
	// header included.
	command func(url string) string
}

// gitTrace is where the git client's libcurl trace goes, in the task's
// TMPDIR: the only way git shows a response header.
const gitTrace = `"$TMPDIR/git-trace"`

// taskClients are the clients of issue 11: the usual CLI tools, the HTTP
// libraries of Python, Node's https (which ignores HTTPS_PROXY), a Go
// program on the default client, and git over smart HTTP. The interpreters
// are the system's, by absolute path: the task's PATH is fixed.
func taskClients(goClient string) []taskClient {
	return []taskClient{
		{name: "curl", path: "/client/curl", honoursProxyVars: true, requests: 1, command: func(url string) string {
			return `curl -sS --fail-with-body -H "Authorization: Bearer $API_TOKEN" ` + url
		}},
		{name: "wget", path: "/client/wget", honoursProxyVars: true, requests: 1, command: func(url string) string {
			return `wget -nv -O - --header "Authorization: Bearer $API_TOKEN" ` + url
		}},
		{name: "urllib", path: "/client/urllib", honoursProxyVars: true, requests: 1, command: func(url string) string {
			return `/usr/bin/python3 -c 'import os, sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + os.environ["API_TOKEN"]})
print(urllib.request.urlopen(req, timeout=15).read().decode(), end="")' ` + url
		}},
		{name: "requests", path: "/client/requests", honoursProxyVars: true, requests: 1, command: func(url string) string {
			return `/usr/bin/python3 -c 'import os, sys, requests
r = requests.get(sys.argv[1], headers={"Authorization": "Bearer " + os.environ["API_TOKEN"]}, timeout=15)
print(r.text, end="")
r.raise_for_status()' ` + url
		}},
		{name: "node", path: "/client/node", honoursProxyVars: false, requests: 1, command: func(url string) string {
			return `/usr/bin/node -e 'require("https").get(process.argv[1], {headers: {Authorization: "Bearer " + process.env.API_TOKEN}}, (res) => {
  res.setEncoding("utf8");
  res.on("data", (d) => process.stdout.write(d));
  res.on("end", () => process.exit(res.statusCode === 200 ? 0 : 1));
}).on("error", (e) => { console.error(e.message); process.exit(1); })' ` + url
		}},
		{name: "go", path: "/client/go", honoursProxyVars: true, requests: 1, command: func(url string) string {
			return goClient + " " + url
		}},
		// Protocol v2: the ref advertisement's GET, then ls-refs' POST. The
		// echoed header is in the trace; the refs are what ls-remote prints.
		{name: "git", path: "/repo.git", honoursProxyVars: true, requests: 2, command: func(url string) string {
			return `GIT_TERMINAL_PROMPT=0 GIT_TRACE_CURL=` + gitTrace + ` GIT_TRACE_CURL_NO_DATA=1 git -c protocol.version=2 -c http.extraHeader="Authorization: Bearer $API_TOKEN" ls-remote ` +
				url + ` && grep -io "x-echo-authorization: .*" ` + gitTrace
		}},
	}
}

// clientsPrompt is a task's prompt running every client at once, each
// command a script of its own (bounded by a timeout, so one hanging is
// named rather than stalling the run), then printing "placeholder=",
// "proxy variables=" (how many *_proxy variables the clients see) and each
// client's output between "== NAME exit CODE" and "== end NAME".
func clientsPrompt(clients []taskClient, base string, proxyVars bool) string {
	var b strings.Builder
	if !proxyVars {
		b.WriteString("unset HTTPS_PROXY https_proxy\n")
	}
	b.WriteString(`echo "placeholder=$API_TOKEN"
echo "proxy variables=$(env | grep -ci '^[^=]*_proxy=')"
out=$(mktemp -d)
`)
	for _, c := range clients {
		fmt.Fprintf(&b, "cat >\"$out/%[1]s.sh\" <<'CLIENT'\n%[2]s\nCLIENT\n", c.name, c.command(base+c.path))
		fmt.Fprintf(&b, "(timeout 20 sh \"$out/%[1]s.sh\" >\"$out/%[1]s\" 2>&1; echo $? >\"$out/%[1]s.rc\") &\n", c.name)
	}
	b.WriteString("wait\n")
	for _, c := range clients {
		fmt.Fprintf(&b, "echo \"== %[1]s exit $(cat \"$out/%[1]s.rc\")\"; cat \"$out/%[1]s\"; echo; echo \"== end %[1]s\"\n", c.name)
	}
	return b.String()
}

// clientSection is what one client printed in a clientsPrompt run.
type clientSection struct {
	exit string
	text string
}

// stepsRun is an ended run whose output is clientsPrompt's sections, read
// step by step.
type stepsRun struct {
	id       string
	out      string
	sections map[string]clientSection
}

func newStepsRun(id, out string) stepsRun {
	return stepsRun{id: id, out: out, sections: clientSections(out)}
}

// step is the output of a step that must have succeeded.
func (r stepsRun) step(t *testing.T, name string) string {
	t.Helper()
	s, ok := r.sections[name]
	switch {
	case !ok:
		t.Fatalf("run %s printed no section %s:\n%s", r.id, name, r.out)
	case s.exit != "0":
		t.Fatalf("run %s: %s exited %s:\n%s", r.id, name, s.exit, s.text)
	}
	return s.text
}

// failed is the output of a step that must have failed, by itself: not
// ended by a timeout (124).
func (r stepsRun) failed(t *testing.T, name string) string {
	t.Helper()
	s, ok := r.sections[name]
	switch {
	case !ok:
		t.Errorf("run %s printed no section %s:\n%s", r.id, name, r.out)
	case s.exit == "0":
		t.Errorf("run %s: %s succeeded, want it refused:\n%s", r.id, name, s.text)
	case s.exit == "124":
		t.Errorf("run %s: %s hung until its timeout:\n%s", r.id, name, s.text)
	}
	return s.text
}

// ended is the output of a step that must have ended by itself (whatever
// its status), not by a timeout.
func (r stepsRun) ended(t *testing.T, name string) string {
	t.Helper()
	s, ok := r.sections[name]
	switch {
	case !ok:
		t.Errorf("run %s printed no section %s:\n%s", r.id, name, r.out)
	case s.exit == "124":
		t.Errorf("run %s: %s hung until its timeout:\n%s", r.id, name, s.text)
	}
	return s.text
}

// clientSections splits a clientsPrompt run's output by client.
func clientSections(out string) map[string]clientSection {
	sections := map[string]clientSection{}
	var name string
	var cur clientSection
	var text strings.Builder
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimRight(line, "\r")
		if rest, ok := strings.CutPrefix(line, "== "); ok {
			if n, exit, ok := strings.Cut(rest, " exit "); ok && name == "" {
				name, cur = n, clientSection{exit: exit}
				text.Reset()
				continue
			}
			if rest == "end "+name && name != "" {
				cur.text = text.String()
				sections[name] = cur
				name = ""
				continue
			}
		}
		if name != "" {
			text.WriteString(line + "\n")
		}
	}
	return sections
}

// clientUpstream is the clients' granted upstream: it records which
// client sent which Authorization, echoes that header back (in a header
// and in the body, as APIs quoting a key do), and serves a bare git
// repository over smart HTTP (git http-backend) at /repo.git.
type clientUpstream struct {
	head string // the repository's refs/heads/main

	mu   sync.Mutex
	seen []upstreamRequest
}

type upstreamRequest struct {
	client string // clientOf the path
	auth   string
}

// clientOf names the client a request's path came from.
func clientOf(path string) string {
	if name, ok := strings.CutPrefix(path, "/client/"); ok {
		return name
	}
	if strings.HasPrefix(path, "/repo.git/") {
		return "git"
	}
	return "unknown (" + path + ")"
}

// newClientUpstream makes the fixture's granted upstream a clientUpstream,
// before the host is opened (the policy grants f.upstreamHost).
func newClientUpstream(t *testing.T, f *fixture) *clientUpstream {
	t.Helper()
	root := t.TempDir()
	repo := filepath.Join(root, "repo.git")
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"--git-dir", repo}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.test", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.test")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "--bare", "--initial-branch", "main")
	tree := git("hash-object", "-t", "tree", "-w", "/dev/null")
	u := &clientUpstream{head: git("commit-tree", tree, "-m", "the one commit")}
	git("update-ref", "refs/heads/main", u.head)
	backend := &cgi.Handler{
		Path: "/usr/lib/git-core/git-http-backend",
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
	}
	f.upstream = f.ca.TLSServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		client := clientOf(r.URL.Path)
		u.mu.Lock()
		u.seen = append(u.seen, upstreamRequest{client: client, auth: auth})
		u.mu.Unlock()
		w.Header().Set("X-Echo-Authorization", auth)
		if client == "git" {
			backend.ServeHTTP(w, r)
			return
		}
		fmt.Fprintf(w, "auth=%s\n", auth)
	}), "api.example.test")
	f.upstreamHost = "api.example.test:" + port(f.upstream)
	return u
}

// take returns the requests recorded since the last take.
func (u *clientUpstream) take() []upstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	seen := u.seen
	u.seen = nil
	return seen
}

// goClient is testdata/goclient, built once per test binary (linking costs
// seconds of a CPU the team shares) into a directory a task can read:
// outside /tmp, which a task has its own of. TestMain removes it.
var goClient struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

func goClientBinary(t *testing.T) string {
	t.Helper()
	goClient.once.Do(func() {
		dir, err := os.MkdirTemp("/var/lib", "runfleet-test-goclient-")
		if err == nil {
			goClient.dir = dir
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			goClient.err = err
			return
		}
		goClient.bin = filepath.Join(dir, "goclient")
		if out, err := exec.Command("go", "build", "-o", goClient.bin, "./testdata/goclient").CombinedOutput(); err != nil {
			goClient.err = fmt.Errorf("go build ./testdata/goclient: %v\n%s", err, out)
		}
	})
	if goClient.err != nil {
		t.Fatal(goClient.err)
	}
	return goClient.bin
}

func removeGoClient() {
	if goClient.dir != "" {
		os.RemoveAll(goClient.dir)
	}
}

// auditLines are the audit file's lines for one run.
func auditLines(t *testing.T, f *fixture, runID string) []audit.Entry {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dataDir, "logs", audit.FileName))
	if os.IsNotExist(err) {
		return nil
	}
	must(t, err)
	var lines []audit.Entry
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var e audit.Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("an audit line does not parse: %v", err)
		}
		if e.Task == runID {
			lines = append(lines, e)
		}
	}
	return lines
}

// Every kind of client a task runs reaches the granted upstream with its
// placeholder, with no proxy variable at all (each connection redirected
// to the proxy) and with the task's HTTPS_PROXY (through the explicit
// proxy, but for Node, which ignores it): the upstream receives the real
// value from each, the task sees only its placeholder (the upstream's echo
// is scrubbed back), and the audit has a line for each request, marked
// transparent exactly for the connections that did not ask the proxy.
func TestClientsReachTheGrantedUpstreamWithAndWithoutProxyVariables(t *testing.T) {
	f := newFixture(t)
	up := newClientUpstream(t, f)
	clients := taskClients(goClientBinary(t))
	e := f.open(hostOptions{})
	base := "https://" + f.upstreamHost
	for _, mode := range []struct {
		name      string
		proxyVars bool
	}{{"WithoutProxyVariables", false}, {"WithProxyVariables", true}} {
		t.Run(mode.name, func(t *testing.T) {
			run := e.start(runspec.Request{Prompt: clientsPrompt(clients, base, mode.proxyVars), Secrets: e.apiToken()})
			e.waitEnd(run.RunID)
			out := e.output(run.RunID)
			saw := up.take()
			raw, _ := json.Marshal(e.events(run.RunID))
			if strings.Contains(string(raw), realSecret) {
				t.Fatal("the task saw the real value") // its output is not shown: it holds the secret
			}
			placeholder := envLine(out, "placeholder")
			if !strings.HasPrefix(placeholder, "ph-") {
				t.Fatalf("the task's API_TOKEN is %q, want a placeholder; output:\n%s", placeholder, out)
			}
			wantVars := 0
			if mode.proxyVars {
				wantVars = 2 // HTTPS_PROXY, https_proxy
			}
			if got := envLine(out, "proxy variables"); got != strconv.Itoa(wantVars) {
				t.Fatalf("the clients saw %s proxy variables, want %d", got, wantVars)
			}

			sections := clientSections(out)
			for _, c := range clients {
				s, ok := sections[c.name]
				switch {
				case !ok:
					t.Errorf("%s: printed no section; output:\n%s", c.name, out)
				case s.exit != "0":
					t.Errorf("%s: exited %s:\n%s", c.name, s.exit, s.text)
				case !strings.Contains(s.text, "Bearer "+placeholder):
					t.Errorf("%s: the upstream's echo is not the placeholder:\n%s", c.name, s.text)
				case c.name == "git" && !strings.Contains(s.text, up.head+"\trefs/heads/main"):
					t.Errorf("git: ls-remote did not list refs/heads/main at %s:\n%s", up.head, s.text)
				}
			}

			perClient := map[string]int{}
			for _, r := range saw {
				perClient[r.client]++
				if r.auth != "Bearer "+realSecret {
					t.Errorf("%s: the upstream got an Authorization that is not the real value (%d bytes)", r.client, len(r.auth))
				}
			}
			total := 0
			for _, c := range clients {
				if perClient[c.name] != c.requests {
					t.Errorf("%s: the upstream got %d requests, want %d", c.name, perClient[c.name], c.requests)
				}
				total += perClient[c.name]
				delete(perClient, c.name)
			}
			for client, n := range perClient {
				t.Errorf("the upstream got %d requests from %s", n, client)
			}

			// The audit writes its lines within audit.FlushEvery.
			var lines []audit.Entry
			await.Within(10*time.Second, func() bool {
				lines = auditLines(t, f, run.RunID)
				return len(lines) >= len(saw)
			})
			audited := map[string][]audit.Entry{}
			for _, l := range lines {
				audited[clientOf(l.Path)] = append(audited[clientOf(l.Path)], l)
			}
			for _, c := range clients {
				wantVia := audit.ViaTransparent
				if mode.proxyVars && c.honoursProxyVars {
					wantVia = ""
				}
				ls := audited[c.name]
				if len(ls) != c.requests {
					t.Errorf("%s: the audit has %d lines, want %d", c.name, len(ls), c.requests)
				}
				for _, l := range ls {
					if l.Action != audit.Substituted || l.Host != f.upstreamHost || l.Via != wantVia {
						t.Errorf("%s: audit line %s %s %s via %q, want %s %s via %q", c.name, l.Action, l.Host, l.Path, l.Via, audit.Substituted, f.upstreamHost, wantVia)
					}
				}
				delete(audited, c.name)
			}
			for client, ls := range audited {
				t.Errorf("the audit has %d lines for %s", len(ls), client)
			}
			t.Logf("%d clients, %d upstream requests, %d audit lines", len(clients), total, len(lines))
		})
	}
}
