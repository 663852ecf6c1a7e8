package tests

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/infra/localstack/demo"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/cutproxy"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestCLIAgainstTheLocalStack runs the runfleet binary as a user runs it,
// a real process configured by RUNFLEET_API and RUNFLEET_TOKEN alone,
// against `make dev`'s program: the demo prints the upstream's verdict;
// a failing task's exit code is runfleet's; a refused dispatch exits 2
// with the reason; Ctrl-C (SIGINT to the process) detaches and says how to
// follow again, or cancels with --cancel-on-interrupt; --json parses; a
// stream cut in the middle resumes with no line lost or repeated. No
// token reaches anything runfleet prints (every run checks).
func TestCLIAgainstTheLocalStack(t *testing.T) {
	s := startDevStack(t, localStackBinary(t), "", devEnv(filepath.Join(t.TempDir(), "data"), ""), nil)
	c := newCLIUser(t, s, s.base(), s.callerToken())

	t.Run("the demo", func(t *testing.T) {
		r := c.run(t, "run", "--agent", demo.Agent, "--secret", demo.SecretsRef+"="+s.demoDomain(), "--", "hello")
		r.exits(t, 0)
		if !strings.Contains(r.stdout, `the upstream answered: {"authorized": true}`) {
			t.Fatalf("runfleet printed no authorized answer:\n%s", r)
		}
		// Progress is for a terminal: on success nothing else is said.
		if r.stderr != "" {
			t.Fatalf("runfleet wrote to a stderr that is no terminal:\n%s", r)
		}
		s.checkDemoRan(t, r.stdout, r.stderr)
	})

	t.Run("a failing task's exit code", func(t *testing.T) {
		r := c.run(t, "run", "--agent", "shell", "--", "echo bye; exit 7")
		r.exits(t, 7)
		if r.stdout != "bye\r\n" || r.stderr == "" {
			t.Fatalf("want the task's output alone on stdout and the run's end on stderr:\n%s", r)
		}
	})

	t.Run("refused dispatches", func(t *testing.T) {
		r := c.run(t, "run", "--agent", "nosuch", "--", "hello")
		r.exits(t, 2)
		if r.stdout != "" || !strings.Contains(r.stderr, "no_eligible_host") || !strings.Contains(r.stderr, localEdge) {
			t.Fatalf("an agent no host has: want no_eligible_host and why %s was excluded on stderr:\n%s", localEdge, r)
		}
		// The demo key declared for a port the edge's policy does not grant.
		r = c.run(t, "run", "--agent", demo.Agent, "--secret", demo.SecretsRef+"=api.demo.test:1", "--", "hello")
		r.exits(t, 2)
		if r.stdout != "" || !strings.Contains(r.stderr, "key_not_granted") {
			t.Fatalf("a secret the host refuses: want key_not_granted on stderr:\n%s", r)
		}
		// Not refusals: a token Fleet does not know, and no Fleet named.
		stranger := newCLIUser(t, s, s.base(), "rft_not-a-token")
		r = stranger.run(t, "run", "--agent", "shell", "--", "echo never")
		r.exits(t, 1)
		if r.stdout != "" || !strings.Contains(r.stderr, "token") {
			t.Fatalf("an unknown token: want exit 1 and a message about the token:\n%s", r)
		}
		nowhere := newCLIUser(t, s, "", c.token)
		r = nowhere.run(t, "runs", "list")
		r.exits(t, 1)
		if !strings.Contains(r.stderr, "RUNFLEET_API") {
			t.Fatalf("no Fleet configured: want a message naming RUNFLEET_API:\n%s", r)
		}
	})

	t.Run("Ctrl-C detaches", func(t *testing.T) {
		// The task waits for a line of input, which the test types once
		// runfleet has detached.
		p := c.start(t, "run", "--agent", "shell", "--", `stty -echo; echo started; read v; echo "got $v"`)
		await.Cond(t, 60*time.Second, "the task's first line", func() bool { return p.stdout.String() == "started\r\n" })
		must(t, p.cmd.Process.Signal(syscall.SIGINT))
		r := p.wait(t)
		r.exits(t, 130)
		m := regexp.MustCompile(`runfleet runs follow (fr-[a-z2-7]+)`).FindStringSubmatch(r.stderr)
		if m == nil || r.stdout != "started\r\n" {
			t.Fatalf("want the output so far and how to follow again (runfleet runs follow <id>) on stderr:\n%s", r)
		}
		follow := c.start(t, "runs", "follow", m[1])
		c.run(t, "runs", "input", "--newline", m[1], "go").exits(t, 0)
		r = follow.wait(t)
		r.exits(t, 0)
		if !strings.HasSuffix(r.stdout, "got go\r\n") {
			t.Fatalf("the follow did not get the rest of the run:\n%s", r)
		}
	})

	t.Run("Ctrl-C with --cancel-on-interrupt cancels", func(t *testing.T) {
		p := c.start(t, "run", "--json", "--cancel-on-interrupt", "--agent", "shell", "--", `echo started; read v; echo never`)
		await.Cond(t, 60*time.Second, "the task's first line", func() bool { return strings.Contains(p.stdout.String(), `"data":"started\r\n"`) })
		must(t, p.cmd.Process.Signal(syscall.SIGINT))
		r := p.wait(t)
		r.exits(t, 130)
		id := dispatchedID(t, r)
		await.Cond(t, 60*time.Second, "the run canceled", func() bool {
			var got fleetapi.RunAnswer
			g := c.run(t, "runs", "get", id, "--json")
			return g.code == 0 && json.Unmarshal([]byte(g.stdout), &got) == nil && got.Run.Status == fleetapi.StatusCanceled
		})
		if strings.Contains(r.stdout, "never") {
			t.Fatalf("the canceled task went on:\n%s", r)
		}
	})

	t.Run("--json parses", func(t *testing.T) {
		r := c.run(t, "run", "--json", "--agent", "shell", "--", "echo json")
		r.exits(t, 0)
		lines := jsonLines(t, r)
		id := dispatchedID(t, r)
		var output strings.Builder
		for _, l := range lines[1:] {
			if l.Type == "event" {
				var ev fleetapi.Event
				must(t, json.Unmarshal(l.Data, &ev))
				var text string
				if ev.Type == "output" && json.Unmarshal(ev.Data, &text) == nil {
					output.WriteString(text)
				}
			}
		}
		var done fleetapi.StreamDone
		last := lines[len(lines)-1]
		if last.Type != "done" || json.Unmarshal(last.Data, &done) != nil || done.Status != fleetapi.StatusSucceeded || output.String() != "json\r\n" {
			t.Fatalf("the JSON lines: want the output json and a last done line, succeeded:\n%s", r)
		}

		var page fleetapi.RunPage
		r = c.run(t, "runs", "list", "--json")
		r.exits(t, 0)
		if json.Unmarshal([]byte(r.stdout), &page) != nil || !hasRun(page, id) {
			t.Fatalf("runs list --json: want the API's page, with %s:\n%s", id, r)
		}
		var got fleetapi.RunAnswer
		r = c.run(t, "runs", "get", id, "--json")
		r.exits(t, 0)
		if json.Unmarshal([]byte(r.stdout), &got) != nil || got.Run.FleetRunID != id || got.Run.Status != fleetapi.StatusSucceeded {
			t.Fatalf("runs get --json: want the API's answer for %s:\n%s", id, r)
		}
		var hosts fleetapi.HostList
		r = c.run(t, "hosts", "list", "--json")
		r.exits(t, 0)
		if json.Unmarshal([]byte(r.stdout), &hosts) != nil || len(hosts.Hosts) != 1 || hosts.Hosts[0].ID != localEdge {
			t.Fatalf("hosts list --json: want the API's list, with %s alone:\n%s", localEdge, r)
		}
	})

	t.Run("a stream cut in the middle resumes", func(t *testing.T) {
		u, err := url.Parse(s.base())
		must(t, err)
		proxy, err := cutproxy.Start(u.Host)
		must(t, err)
		t.Cleanup(proxy.Close)
		// Through the proxy: the dispatch answer's links.stream names the
		// address the API was reached on, so the stream goes through it too.
		proxied := newCLIUser(t, s, "http://"+proxy.Addr(), c.token)
		const half = 20
		task := fmt.Sprintf(`stty -echo; for i in $(seq 1 %d); do echo "line $i"; done; read v; for i in $(seq %d %d); do echo "line $i"; done`, half, half+1, 2*half)
		p := proxied.start(t, "run", "--agent", "shell", "--", task)
		await.Cond(t, 60*time.Second, "the first half of the lines", func() bool { return strings.HasSuffix(p.stdout.String(), fmt.Sprintf("line %d\r\n", half)) })
		id := runningRun(t, c)
		before := proxy.Accepted()

		// The connections die; the second half is printed while runfleet
		// cannot reconnect (its new connections are held), then it can.
		proxy.Hold()
		proxy.Cut()
		c.run(t, "runs", "input", "--newline", id, "x").exits(t, 0)
		await.Cond(t, 60*time.Second, "the second half printed", func() bool {
			l := c.run(t, "runs", "logs", id)
			return l.code == 0 && strings.HasSuffix(l.stdout, fmt.Sprintf("line %d\r\n", 2*half))
		})
		proxy.Release()
		r := p.wait(t)
		r.exits(t, 0)
		var want strings.Builder
		for i := 1; i <= 2*half; i++ {
			fmt.Fprintf(&want, "line %d\r\n", i)
		}
		if r.stdout != want.String() {
			t.Fatalf("across the cut: want lines 1..%d once each, in order:\n%s", 2*half, r)
		}
		if proxy.Accepted() <= before {
			t.Fatal("runfleet did not reconnect after the cut")
		}
	})
}

// localEdge is the local stack's edge host.
const localEdge = "local-edge"

// demoDomain is the demo upstream's policy domain: its name and the port
// the stack serves it on.
func (s *devStack) demoDomain() string {
	_, port, _ := strings.Cut(s.ready.Demo.UpstreamAddr, ":")
	return demo.UpstreamName + ":" + port
}

// cliUser runs the runfleet binary as one caller: RUNFLEET_API and
// RUNFLEET_TOKEN set, nothing else of runfleet's (no config file: its
// config dir is empty).
type cliUser struct {
	bin, api, token string
	env             []string
	// never is what no output of runfleet may hold: every token of the
	// stack, the demo secret's real value, this user's token.
	never []string
}

func newCLIUser(t testing.TB, s *devStack, api, token string) *cliUser {
	t.Helper()
	home := t.TempDir()
	env := append(cleanEnv(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "RUNFLEET_TOKEN="+token)
	if api != "" {
		env = append(env, "RUNFLEET_API="+api)
	}
	u := &cliUser{bin: cliBinary(t), api: api, token: token, env: env, never: []string{token}}
	for _, name := range []string{"admin-token", "demo-caller-token"} {
		b, err := os.ReadFile(filepath.Join(s.dataDir, name))
		must(t, err)
		u.never = append(u.never, strings.TrimSpace(string(b)))
	}
	secret, err := demo.ReadSecretsFile(filepath.Join(s.dataDir, "edge-secrets.json"))
	must(t, err)
	u.never = append(u.never, secret)
	return u
}

// cliProc is a runfleet process.
type cliProc struct {
	u              *cliUser
	args           []string
	cmd            *exec.Cmd
	stdout, stderr syncbuf.Buffer
	exited         chan error
	waited         atomic.Bool // set before exited gets Wait's result
}

// start starts runfleet with args; it is killed at the test's end if it
// still runs.
func (u *cliUser) start(t testing.TB, args ...string) *cliProc {
	t.Helper()
	p := &cliProc{u: u, args: args, cmd: exec.Command(u.bin, args...), exited: make(chan error, 1)}
	p.cmd.Env = u.env
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	must(t, p.cmd.Start())
	go func() {
		err := p.cmd.Wait()
		p.waited.Store(true)
		p.exited <- err
	}()
	t.Cleanup(func() {
		// Not cmd.ProcessState: Wait writes it on its own goroutine.
		if !p.waited.Load() {
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// run runs runfleet with args to its end.
func (u *cliUser) run(t testing.TB, args ...string) cliResult {
	t.Helper()
	return u.start(t, args...).wait(t)
}

// cliResult is how a runfleet process ended and what it printed.
type cliResult struct {
	args           []string
	code           int
	stdout, stderr string
}

func (r cliResult) String() string {
	return fmt.Sprintf("runfleet %q exited %d\nstdout:\n%s\nstderr:\n%s", r.args, r.code, r.stdout, r.stderr)
}

// exits fails the test unless the process exited with code.
func (r cliResult) exits(t testing.TB, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d: %s", code, r)
	}
}

// wait waits for the process's end; nothing it printed may hold a token or
// the secret.
func (p *cliProc) wait(t testing.TB) cliResult {
	t.Helper()
	err := await.Recv(t, fmt.Sprintf("runfleet %q to exit", p.args), p.exited)
	r := cliResult{args: p.args, stdout: p.stdout.String(), stderr: p.stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("runfleet %q: %v", p.args, err)
	}
	for _, never := range p.u.never {
		if strings.Contains(r.stdout, never) || strings.Contains(r.stderr, never) {
			t.Fatalf("runfleet printed a token or the secret: %s", r)
		}
	}
	return r
}

// jsonLine is one line of run --json or runs follow --json.
type jsonLine struct {
	Type string          `json:"type"`
	ID   string          `json:"id"`
	Data json.RawMessage `json:"data"`
}

// jsonLines parses r's stdout as JSON lines, each a known type, the first
// the dispatch.
func jsonLines(t testing.TB, r cliResult) []jsonLine {
	t.Helper()
	var lines []jsonLine
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l jsonLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("a line is no JSON (%v): %q\n%s", err, sc.Text(), r)
		}
		switch l.Type {
		case "dispatched", "event", "snapshot", "egress", "idle", "done":
		default:
			t.Fatalf("a line of an unknown type %q:\n%s", l.Type, r)
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 || lines[0].Type != "dispatched" {
		t.Fatalf("the first line is not the dispatch:\n%s", r)
	}
	return lines
}

// dispatchedID is the run id of run --json's first line.
func dispatchedID(t testing.TB, r cliResult) string {
	t.Helper()
	var d fleetapi.DispatchAnswer
	if err := json.Unmarshal(jsonLines(t, r)[0].Data, &d); err != nil || d.FleetRunID == "" || d.HostID != localEdge {
		t.Fatalf("the dispatched line (%v):\n%s", err, r)
	}
	return d.FleetRunID
}

func hasRun(page fleetapi.RunPage, id string) bool {
	for _, r := range page.Runs {
		if r.FleetRunID == id {
			return true
		}
	}
	return false
}

// runningRun is the id of the one run of c's that is running, as runs
// list --json says (the subtests run one at a time).
func runningRun(t testing.TB, c *cliUser) string {
	t.Helper()
	r := c.run(t, "runs", "list", "--json")
	r.exits(t, 0)
	var page fleetapi.RunPage
	must(t, json.Unmarshal([]byte(r.stdout), &page))
	var running []string
	for _, run := range page.Runs {
		if run.Status == fleetapi.StatusRunning {
			running = append(running, run.FleetRunID)
		}
	}
	if len(running) != 1 {
		t.Fatalf("want one running run, have %q:\n%s", running, r)
	}
	return running[0]
}
