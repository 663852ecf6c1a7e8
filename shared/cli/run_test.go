package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
)

// startedRun starts `runfleet run ARGS` and waits until its stream is
// following the run (the session parked after its first poll): the run
// is then on its host. The session is let go to poll again; its next
// park waits for the test's pump.
func startedRun(t *testing.T, f *fleet, c *cli, args ...string) *result {
	t.Helper()
	r := c.start("", append([]string{"run", "--agent", "shell"}, args...)...)
	select {
	case <-f.parked:
		f.clk.Advance(time.Second)
	case <-r.done:
		t.Fatalf("runfleet run ended before following: %d\n%s", r.code, r.stderr)
	case <-time.After(await.Limit):
		t.Fatal("runfleet run never opened the stream")
	}
	return r
}

// TestRunFollowsToTheEnd: run dispatches, follows the stream at once, puts
// the task's output on stdout exactly, and exits with the run's exit code
// (its reason on stderr); a run that succeeds exits 0.
func TestRunFollowsToTheEnd(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{})
	c := f.asCaller(f.mint("alice"))

	r := startedRun(t, f, c, "--", "echo", "hello")
	h.AppendOutput("run-1", "hello\n")
	h.AppendOutput("run-1", "no newline <b>at the end")
	three := 3
	h.SetRun("run-1", "failed", &three, "exit_nonzero")
	stop := make(chan struct{})
	defer close(stop)
	f.pump(stop)
	r.wait(t).want(t, 3)
	if got := r.stdout.String(); got != "hello\nno newline <b>at the end" {
		t.Errorf("stdout %q, want the task's output exactly", got)
	}
	if s := r.stderr.String(); !strings.Contains(s, "failed with exit code 3 (exit_nonzero)") {
		t.Errorf("stderr lacks the failure and its reason:\n%s", s)
	}
	if starts := h.Starts(); len(starts) != 1 || starts[0].Prompt != "echo hello" {
		t.Errorf("the host got %+v, want one start with the prompt's words joined", starts)
	}
	// Not a terminal: no progress on stderr, only the end.
	if s := r.stderr.String(); strings.Contains(s, "dispatched") {
		t.Errorf("progress on a stderr that is no terminal:\n%s", s)
	}

	r = startedRun(t, f, c, "--", "true")
	h.SetRun("run-2", "succeeded", new(int), "")
	f.pump(stop)
	r.wait(t).want(t, 0)
	if r.stdout.String() != "" || r.stderr.String() != "" {
		t.Errorf("a succeeded run with no output printed %q / %q", r.stdout, r.stderr)
	}
}

// TestRunJSONLines: with --json every line of stdout is one JSON document,
// the dispatch answer first, the done message last, the output events in
// between as the API's events.
func TestRunJSONLines(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{})
	c := f.asCaller(f.mint("alice"))
	r := startedRun(t, f, c, "--json", "--", "echo", "hi")
	h.AppendOutput("run-1", "hi\n")
	h.SetRun("run-1", "succeeded", new(int), "")
	stop := make(chan struct{})
	defer close(stop)
	f.pump(stop)
	lines := r.wait(t).want(t, 0).jsonLines(t)
	if len(lines) < 3 || lines[0].Type != "dispatched" || lines[len(lines)-1].Type != "done" {
		t.Fatalf("lines %+v: want dispatched first, done last", lines)
	}
	var d fleetapi.DispatchAnswer
	if err := json.Unmarshal(lines[0].Data.(json.RawMessage), &d); err != nil || !strings.HasPrefix(d.FleetRunID, "fr-") || d.Links.Stream == "" {
		t.Errorf("dispatched data %s (%v): want the dispatch answer", lines[0].Data, err)
	}
	var output []string
	for _, l := range lines[1 : len(lines)-1] {
		if l.Type != "event" {
			continue
		}
		var e fleetapi.Event
		if err := json.Unmarshal(l.Data.(json.RawMessage), &e); err != nil || l.ID == "" {
			t.Fatalf("event line %+v: %v", l, err)
		}
		if e.Type == fleetapi.EventOutput {
			var s string
			json.Unmarshal(e.Data, &s)
			output = append(output, s)
		}
	}
	if strings.Join(output, "") != "hi\n" {
		t.Errorf("output events %q, want the task's output", output)
	}
	var done fleetapi.StreamDone
	if err := json.Unmarshal(lines[len(lines)-1].Data.(json.RawMessage), &done); err != nil || done.Status != "succeeded" {
		t.Errorf("done %s: %v", lines[len(lines)-1].Data, err)
	}
}

// TestRunRefused: a refused dispatch exits 2 with the code, the reason and
// the detail on stderr, and a dispatch no host can take lists each host
// left out and why.
func TestRunRefused(t *testing.T) {
	f := newFleet(t)
	h1 := f.addHost("h1", fakehost.Config{})
	f.addHost("h2", fakehost.Config{Agents: []string{"claude"}})
	c := f.asCaller(f.mint("alice"))

	h1.RefuseStarts(http.StatusConflict, "host_busy")
	r := c.run(t, "run", "--agent", "shell", "--host", "h1", "--", "true").want(t, ExitRefused)
	for _, want := range []string{"refused (host_busy)", "reason:  host_busy", "detail:", "fr-"} {
		if !strings.Contains(r.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if r.stdout.String() != "" {
		t.Errorf("a refused dispatch printed on stdout: %s", r.stdout)
	}

	f.api("POST", "/fleet/hosts/h1/enable", adminToken, `{"enabled":false}`, http.StatusOK)
	r = c.run(t, "run", "--agent", "codex", "--", "hi").want(t, ExitRefused)
	for _, want := range []string{"(no_eligible_host)", "h1: disabled", "h2: agent_unsupported (it offers claude)"} {
		if !strings.Contains(r.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
}

// TestRunChecksItsFlagsFirst: a malformed --label, --env or --secret is a
// usage error (64) naming the flag and its shape, before any call.
func TestRunChecksItsFlagsFirst(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{})
	c := f.asCaller(f.mint("alice"))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--label", "gpu"}, `--label "gpu": want KEY=VALUE`},
		{[]string{"--env", "DEBUG"}, `--env "DEBUG": want NAME=VALUE`},
		{[]string{"--env", "A=1", "--env", "A=2"}, `--env "A" is given twice`},
		{[]string{"--secret", "demo/KEY"}, "name the domains the key may reach"},
		{[]string{"--secret", "KEY=api.example.com"}, "want PROJECT/KEY=DOMAIN"},
		{[]string{"--secret", "demo/KEY=a.example,,b.example"}, "an empty domain"},
		{[]string{"--queue", "half an hour"}, `--queue "half an hour": want how long to wait, e.g. --queue 30m`},
		{[]string{"--queue", "-5m"}, `--queue "-5m": want how long to wait`},
		{[]string{"--priority", "5"}, "--priority orders the runs that wait for a host: give --queue too"},
		{[]string{"--queue", "30m", "--priority", "101"}, `--priority "101": want a whole number from -100 to 100`},
		{[]string{"--queue", "30m", "--priority", "high"}, `--priority "high": want a whole number from -100 to 100`},
		{[]string{"--queue", "0s", "--host", "h1"}, "--queue with --host: a run that names its host does not wait"},
	} {
		r := c.run(t, append([]string{"run", "--agent", "shell"}, append(tc.args, "--", "hi")...)...).want(t, ExitUsage)
		if !strings.Contains(r.stderr.String(), tc.want) || !strings.Contains(r.stderr.String(), "runfleet run --help") {
			t.Errorf("%v: stderr\n%s\nwant %q and the hint to --help", tc.args, r.stderr, tc.want)
		}
	}
	r := c.run(t, "run", "--", "hi").want(t, ExitUsage)
	if !strings.Contains(r.stderr.String(), "--agent is required") {
		t.Errorf("no --agent: %s", r.stderr)
	}
	if n := h.StartCalls(); n != 0 {
		t.Errorf("the host got %d starts from refused command lines", n)
	}

	// Repeated flags, after the positionals too, and a secret's domains.
	r = c.run(t, "run", "--agent", "shell", "--label", "a=1", "--env", "X=1", "--env", "EMPTY=", "--detach",
		"--secret", "demo/KEY=a.example,b.example:8443", "--label", "b=2").want(t, ExitRefused)
	if !strings.Contains(r.stderr.String(), "label_missing") {
		t.Errorf("labels a=1 b=2 on a host without them: %s", r.stderr)
	}
}

// TestRunSendsTheRequestAsGiven: every flag reaches the host's start
// request as the API takes it (the secret as runspec.Secret).
func TestRunSendsTheRequestAsGiven(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{Features: hostproto.Features{SecretsProxy: true, ExecRequire: true}})
	c := f.asCaller(f.mint("alice"))
	c.run(t, "run", "--detach", "--agent", "shell", "--repo", "acme/app", "--env", "X=1", "--env", "EMPTY=",
		"--secret", "demo/KEY=a.example,b.example:8443", "--idempotency-key", "k1", "--", "a", "b").want(t, 0)
	starts := h.Starts()
	if len(starts) != 1 {
		t.Fatalf("starts %+v", starts)
	}
	s := starts[0]
	if s.Agent != "shell" || s.Prompt != "a b" || s.Repository != "acme/app" || s.Env["X"] != "1" || s.Env["EMPTY"] != "" || len(s.Env) != 2 {
		t.Errorf("start %+v", s)
	}
	if len(s.Secrets) != 1 || s.Secrets[0].ProjectID != "demo" || s.Secrets[0].Key != "KEY" ||
		strings.Join(s.Secrets[0].Domains, " ") != "a.example b.example:8443" {
		t.Errorf("secrets %+v", s.Secrets)
	}
}

// TestRunDetach: --detach prints the dispatched run and exits 0 at once;
// with --json, the dispatch answer as one document.
func TestRunDetach(t *testing.T) {
	f := newFleet(t)
	f.addHost("h1", fakehost.Config{})
	c := f.asCaller(f.mint("alice"))
	r := c.run(t, "run", "--agent", "shell", "--detach", "--", "sleep", "60").want(t, 0)
	out := r.stdout.String()
	if !strings.Contains(out, "fr-") || !strings.Contains(out, "h1") || !strings.Contains(out, "runfleet runs follow fr-") {
		t.Errorf("detach printed\n%s\nwant the run, its host and how to follow it", out)
	}
	r = c.run(t, "run", "--agent", "shell", "--detach", "--json", "--", "true").want(t, 0)
	var d fleetapi.DispatchAnswer
	if err := json.Unmarshal([]byte(r.stdout.String()), &d); err != nil || d.HostID != "h1" || d.Status != "pending" {
		t.Errorf("--detach --json printed %s (%v)", r.stdout, err)
	}
}

// TestRunInterruptDetaches: the first Ctrl-C stops following, exits 130
// and says how to follow again; the run goes on (no cancel reached the
// host).
func TestRunInterruptDetaches(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{})
	c := f.asCaller(f.mint("alice"))
	r := startedRun(t, f, c, "--", "sleep", "60")
	h.AppendOutput("run-1", "working\n")
	stop := make(chan struct{})
	defer close(stop)
	f.pump(stop)
	await.Cond(t, await.Limit, "the output on stdout", func() bool { return r.stdout.String() == "working\n" })
	r.interrupt <- os.Interrupt
	r.wait(t).want(t, ExitInterrupted)
	id := runIDOf(t, r.stderr.String())
	if !strings.Contains(r.stderr.String(), "runfleet runs follow "+id) {
		t.Errorf("stderr\n%s\nwant how to follow again: runfleet runs follow %s", r.stderr, id)
	}
	if n := h.Requests()["POST /runs/{id}/cancel"]; n != 0 {
		t.Errorf("detaching sent %d cancels", n)
	}
	if run, _ := h.Run("run-1"); run.Status != "pending" {
		t.Errorf("the run is %s after a detach", run.Status)
	}

	// runs follow picks it up again, from its first event.
	fr := c.start("", "runs", "follow", id)
	await.Cond(t, await.Limit, "the output again", func() bool { return fr.stdout.String() == "working\n" })
	h.AppendOutput("run-1", "done\n")
	h.SetRun("run-1", "succeeded", new(int), "")
	fr.wait(t).want(t, 0)
	if fr.stdout.String() != "working\ndone\n" {
		t.Errorf("runs follow printed %q", fr.stdout)
	}
}

// TestRunCancelOnInterrupt: with --cancel-on-interrupt the first Ctrl-C
// cancels the run (its host sees the cancel), prints the outcome and
// exits 130.
func TestRunCancelOnInterrupt(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{})
	c := f.asCaller(f.mint("alice"))
	r := startedRun(t, f, c, "--cancel-on-interrupt", "--", "sleep", "60")
	r.interrupt <- os.Interrupt
	stop := make(chan struct{})
	defer close(stop)
	f.pump(stop)
	r.wait(t).want(t, ExitInterrupted)
	if n := h.Requests()["POST /runs/{id}/cancel"]; n != 1 {
		t.Errorf("the host saw %d cancels, want 1", n)
	}
	if run, _ := h.Run("run-1"); run.Status != "canceled" {
		t.Errorf("the run is %s", run.Status)
	}
	if !strings.Contains(r.stderr.String(), "Canceled run fr-") {
		t.Errorf("stderr lacks the cancel's outcome:\n%s", r.stderr)
	}
}

// runIDOf is the first run id in s.
func runIDOf(t *testing.T, s string) string {
	t.Helper()
	i := strings.Index(s, "fr-")
	if i < 0 || len(s) < i+29 {
		t.Fatalf("no run id in %q", s)
	}
	return s[i : i+29]
}

// TestRunFollowsPastAGatewayError: a stream answered 503 by a gateway in
// front of Fleet is reconnected to, not the end of the follow (Fleet's
// links follow the address the caller reached, here the gateway's).
func TestRunFollowsPastAGatewayError(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{})
	target, _ := url.Parse(f.srv.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var refused atomic.Int32
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/stream") && refused.Add(1) == 1 {
			http.Error(w, "upstream busy", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	defer gw.Close()
	c := f.asCaller(f.mint("alice"))
	c.env[EnvAPI] = gw.URL
	r := c.start("", "run", "--agent", "shell", "--", "true")
	await.Cond(t, await.Limit, "the host's run", func() bool { _, ok := h.Run("run-1"); return ok })
	h.AppendOutput("run-1", "through\n")
	h.SetRun("run-1", "succeeded", new(int), "")
	stop := make(chan struct{})
	defer close(stop)
	f.pump(stop)
	r.wait(t).want(t, 0)
	if r.stdout.String() != "through\n" || refused.Load() < 2 {
		t.Errorf("stdout %q after %d stream requests", r.stdout, refused.Load())
	}
}

// TestRunSendsTheTokenOnlyToAKnownStreamOrigin: a run's links.stream on
// an origin that is neither the API's nor the configured stream's is not
// sent the token; RUNFLEET_STREAM_URL, or a profile saved with
// login --stream-url, names the stream's origin as Fleet's own.
func TestRunSendsTheTokenOnlyToAKnownStreamOrigin(t *testing.T) {
	f := newFleetStreamingAs(t, "localhost")
	h := f.addHost("h1", fakehost.Config{})
	alice := f.mint("alice")
	stream := strings.Replace(f.srv.URL, "127.0.0.1", "localhost", 1)

	c := f.asCaller(alice)
	r := c.run(t, "run", "--agent", "shell", "--", "true").want(t, ExitError)
	if s := r.stderr.String(); !strings.Contains(s, EnvStream+"="+stream) || !strings.Contains(s, "runfleet runs follow fr-") {
		t.Errorf("stderr does not name the stream's origin and how to trust it:\n%s", s)
	}

	followed := func(c *cli, child string) *result {
		r := startedRun(t, f, c, "--", "true")
		h.AppendOutput(child, "through the stream's origin\n")
		h.SetRun(child, "succeeded", new(int), "")
		stop := make(chan struct{})
		defer close(stop)
		f.pump(stop)
		return r.wait(t).want(t, 0)
	}
	c.env[EnvStream] = stream
	if r := followed(c, "run-2"); r.stdout.String() != "through the stream's origin\n" {
		t.Errorf("stdout %q", r.stdout)
	}

	// Saved with the profile, for that API only.
	l := f.newCLI(nil)
	l.start(alice+"\n", "login", "--api", f.srv.URL, "--stream-url", stream).wait(t).want(t, 0)
	followed(l, "run-3")
}

// TestTerminalEscapesFromATaskAreDefused: on a terminal, what a task
// prints keeps its colours (SGR) and loses the sequences that act on the
// operator's terminal: OSC (52 writes the clipboard, 8 makes links, 0
// sets the title), DCS/APC/PM/SOS, CSI queries whose answers are typed
// into the shell (6n), and their 8-bit C1 forms, even split across two
// output events. What a host sends for the stderr lines (the reason, the
// detail) carries none either. Piped, the output is exactly the task's.
func TestTerminalEscapesFromATaskAreDefused(t *testing.T) {
	f := newFleet(t)
	h := f.addHost("h1", fakehost.Config{})
	tok := f.mint("alice")
	parts := []string{
		"a\x1b]52;c;cHduZWQ=\x07b\x1b[1;31mred\x1b[0m\x1b]0;ti",
		"tle\x1b\\c\x1bP+q544e\x1b\\d\u009d8;;http://evil.example\u009ce\x1b[6n\x1b_apc\x1b\\\x1b[2Kf\r\n",
	}
	hostile := "exit\u009b2J\x1b]52;c;cHduZWQ=\x07\x1b[6n"
	stop := make(chan struct{})
	defer close(stop)
	for i, tty := range []bool{true, false} {
		c := f.asCaller(tok)
		c.tty = tty
		r := startedRun(t, f, c, "--", "true")
		child := "run-" + string(rune('1'+i))
		for _, p := range parts {
			h.AppendOutput(child, p)
		}
		h.SetRunDetail(child, "failed", new(int), hostile, hostile)
		if i == 0 {
			f.pump(stop)
		}
		r.wait(t)
		want := strings.Join(parts, "")
		if tty {
			want = "ab\x1b[1;31mred\x1b[0mcde\x1b[2Kf\r\n"
		}
		if got := r.stdout.String(); got != want {
			t.Errorf("tty %v: stdout %q, want %q", tty, got, want)
		}
		for _, bad := range []string{"\x1b]", "\u009b", "\u009d", "\x07", "\x1b[6n", "\x1b[2J"} {
			if strings.Contains(r.stderr.String(), bad) {
				t.Errorf("tty %v: stderr holds %q from the host: %q", tty, bad, r.stderr)
			}
		}
	}
}
