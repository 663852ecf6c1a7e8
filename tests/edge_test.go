package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/filewatch"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// edgeProc is `edge serve` as a real process, built from this tree, with
// its own data dir, host token (the stack's credential), secrets file and
// edge.json. Its API port stays the same across restarts.
type edgeProc struct {
	t       *testing.T
	bin     string
	dir     string
	cfgPath string
	apiAddr string
	policy  string // the JSON of policy.projects
	runner  string // the JSON of the runner section
	proxy   string // the JSON of the proxy section; "" listens on 127.0.0.1:0
	cmd     *exec.Cmd
	uid     int      // edge runs as root unless set
	wrap    []string // a command edge serve runs under (setpriv), if set
	done    chan struct{}
	logs    *syncbuf.Buffer
	client  *hostproto.Client

	// extraFiles are descriptors edge serve inherits from 3 on, without
	// close-on-exec, as from a parent that leaks them.
	extraFiles []*os.File
}

// buildEdge compiles the edge binary into dir (the build cache keeps this
// to a link after the first time).
func buildEdge(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "edge")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", bin, "./edge")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building edge: %v\n%s", err, out)
	}
	return bin
}

func newEdgeProc(t *testing.T) *edgeProc {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("edge runs tasks as nobody: these tests must run as root (as in CI)")
	}
	dir := t.TempDir()
	for p := dir; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := &edgeProc{t: t, dir: dir, bin: buildEdge(t, dir), cfgPath: filepath.Join(dir, "edge.json")}
	e.policy = `{"acme": {"keys": {"API_KEY": {"domains": ["api.example.com"]}}}}`
	e.runner = `{"user": "nobody"}`
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.apiAddr = l.Addr().String()
	l.Close()
	must(t, os.WriteFile(filepath.Join(dir, "host-token"), []byte(hostToken), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "secrets.json"), []byte(`{"acme/API_KEY": "real-api-key-value"}`), 0o600))
	e.writeConfig()
	e.client, err = hostproto.NewClient(hostproto.ClientConfig{BaseURL: "http://" + e.apiAddr, Token: hostToken})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e.cmd != nil {
			// SIGTERM first: an edge that stops cleanly lifts its egress
			// confinement (a killed one leaves its nftables table behind).
			e.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-e.done:
			case <-time.After(10 * time.Second):
				e.cmd.Process.Kill()
				<-e.done
			}
		}
	})
	return e
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (e *edgeProc) writeConfig() {
	proxy := e.proxy
	if proxy == "" {
		proxy = `{"listen": "127.0.0.1:0"}`
	}
	cfg := fmt.Sprintf(`{"dataDir": %q, "api": {"listen": %q, "tokenFile": %q},
	  "proxy": %s,
	  "policy": {"projects": %s},
	  "secrets": {"file": %q},
	  "agents": {"shell": {"argv": ["sh", "-c", "{prompt}"]}},
	  "runner": %s}`, filepath.Join(e.dir, "data"), e.apiAddr, filepath.Join(e.dir, "host-token"), proxy, e.policy,
		filepath.Join(e.dir, "secrets.json"), e.runner)
	must(e.t, os.WriteFile(e.cfgPath, []byte(cfg), 0o600))
}

// start runs edge serve with extra environment variables and waits until
// its API answers.
func (e *edgeProc) start(env ...string) {
	e.t.Helper()
	e.logs = &syncbuf.Buffer{}
	argv := append(append([]string{}, e.wrap...), e.bin, "serve", "--config", e.cfgPath)
	e.cmd = exec.Command(argv[0], argv[1:]...)
	e.cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
	e.cmd.Stdout, e.cmd.Stderr = e.logs, e.logs
	e.cmd.ExtraFiles = e.extraFiles
	if e.uid != 0 {
		e.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(e.uid), Gid: uint32(e.uid)}}
	}
	must(e.t, e.cmd.Start())
	e.done = make(chan struct{})
	go func() { e.cmd.Wait(); close(e.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := e.client.Health(context.Background()); err == nil {
			return
		}
		select {
		case <-e.done:
			e.t.Fatalf("edge exited at start:\n%s", e.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("edge never answered:\n%s", e.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startFails runs edge serve expecting it to exit at start: its exit
// code and its log.
func (e *edgeProc) startFails() (int, string) {
	e.t.Helper()
	logs := &syncbuf.Buffer{}
	cmd := exec.Command(e.bin, "serve", "--config", e.cfgPath)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdout, cmd.Stderr = logs, logs
	if e.uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(e.uid), Gid: uint32(e.uid)}}
	}
	must(e.t, cmd.Start())
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
		e.t.Fatalf("edge kept running:\n%s", logs.String())
	}
	return cmd.ProcessState.ExitCode(), logs.String()
}

// signal sends sig and, for a stopping signal, waits for the exit code.
func (e *edgeProc) stop(sig syscall.Signal) int {
	e.t.Helper()
	must(e.t, e.cmd.Process.Signal(sig))
	select {
	case <-e.done:
	case <-time.After(60 * time.Second):
		e.t.Fatalf("edge did not exit on %v:\n%s", sig, e.logs.String())
	}
	code := e.cmd.ProcessState.ExitCode()
	e.cmd = nil
	return code
}

func (e *edgeProc) run(req hostproto.StartRequest) hostproto.Run {
	e.t.Helper()
	if req.ClientToken == "" {
		req.ClientToken = fmt.Sprintf("ct-%d", time.Now().UnixNano())
	}
	req.Agent = "shell"
	run, err := e.client.Start(context.Background(), req)
	must(e.t, err)
	return run
}

// waitFor polls edge (a real process) until the run satisfies done.
func (e *edgeProc) waitFor(runID string, done func(hostproto.Run) bool) hostproto.Run {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		run, err := e.client.Get(context.Background(), runID)
		if err == nil && done(run) {
			return run
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("run %s: %+v, %v", runID, run, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// events are all the run's events.
func (e *edgeProc) events(runID string) []hostproto.Event {
	e.t.Helper()
	var all []hostproto.Event
	for after := int64(0); ; {
		p, err := e.client.Events(context.Background(), runID, after, 0)
		must(e.t, err)
		all = append(all, p.Events...)
		after = *p.NextCursor
		if !p.HasMore {
			return all
		}
	}
}

// limitsReached are the data of the run's limit events, in order.
func (e *edgeProc) limitsReached(runID string) []hostproto.LimitReached {
	e.t.Helper()
	var out []hostproto.LimitReached
	for _, ev := range e.events(runID) {
		if ev.Type == hostproto.EventLimit {
			var l hostproto.LimitReached
			if err := json.Unmarshal(ev.Data, &l); err != nil {
				e.t.Fatalf("a limit event's data %s: %v", ev.Data, err)
			}
			out = append(out, l)
		}
	}
	return out
}

func (e *edgeProc) output(runID string, after int64) (string, int64) {
	e.t.Helper()
	var b strings.Builder
	for {
		p, err := e.client.Events(context.Background(), runID, after, 3)
		must(e.t, err)
		for i, ev := range p.Events {
			if ev.Sequence != after+int64(i)+1 {
				e.t.Fatalf("event sequence %d after cursor %d", ev.Sequence, after)
			}
			if ev.Type == hostproto.EventOutput {
				var s string
				json.Unmarshal(ev.Data, &s)
				b.WriteString(s)
			}
		}
		after = *p.NextCursor
		if !p.HasMore {
			return b.String(), after
		}
	}
}

func terminal(r hostproto.Run) bool { return hostproto.TerminalStatus(r.Status) }

// TestFleetRoutesSecretsRunsByEdgesRealFeatures: Fleet probes a real edge,
// routes a run that declares secrets to it while it reports secretsProxy and
// execRequire, and excludes it (secrets_unsupported) once a re-probe finds
// the kill switch on.
func TestFleetRoutesSecretsRunsByEdgesRealFeatures(t *testing.T) {
	e := newEdgeProc(t)
	e.start()
	s := newStack(t, "bolt", stackOptions{})
	s.must(t, http.StatusCreated, "POST", "/fleet/hosts", adminToken,
		fmt.Sprintf(`{"id": "edge-1", "baseUrl": "http://%s", "credentialRef": %q}`, e.apiAddr, hostCredRef))
	probe := s.probe(t, "edge-1")
	features, _ := probe.body["probe"].(map[string]any)["features"].(map[string]any)
	if features["secretsProxy"] != true || features["execRequire"] != true {
		t.Fatalf("Fleet's probe of edge: %s", probe.raw)
	}
	// What the edge says of its storage and limits reaches Fleet as is.
	storage, _ := probe.body["probe"].(map[string]any)["storage"].(map[string]any)
	limits, _ := probe.body["probe"].(map[string]any)["limits"].(map[string]any)
	if free, _ := storage["freeBytes"].(float64); free <= 0 || storage["low"] != false || storage["minFreeBytes"] != float64(1<<30) ||
		limits["enforced"] != hostproto.LimitsCgroup1 && limits["enforced"] != hostproto.LimitsCgroup2 || limits["pids"] != float64(4096) {
		t.Fatalf("Fleet's probe of edge's storage and limits: %s", probe.raw)
	}
	token := s.mint(t, "alice", "*", "*")
	body := `{"agent": "shell", "prompt": "printf 'len=%s' ${#API_KEY}; case $API_KEY in real*) echo LEAK;; esac",
	  "secrets": [{"projectId": "acme", "key": "API_KEY", "domains": ["api.example.com"]}]}`
	a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, body)
	if a.str("hostId") != "edge-1" || a.str("childRunId") == "" {
		t.Fatalf("dispatch: %s", a.raw)
	}
	run := e.waitFor(a.str("childRunId"), terminal)
	out, _ := e.output(run.RunID, 0)
	if run.Status != hostproto.StatusSucceeded || !strings.Contains(out, "len=48") || strings.Contains(out, "LEAK") {
		t.Fatalf("the routed run ended %+v with output %q", run, out)
	}
	state := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+a.str("fleetRunId"), token, "")
	if !strings.Contains(state.raw, `"succeeded"`) {
		t.Fatalf("Fleet's view of the run: %s", state.raw)
	}

	if code := e.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("edge exited %d on SIGTERM", code)
	}
	e.start("EDGE_SECRETS_PROXY=off")
	probe = s.probe(t, "edge-1")
	features, _ = probe.body["probe"].(map[string]any)["features"].(map[string]any)
	if features["secretsProxy"] != false || features["execRequire"] != true {
		t.Fatalf("Fleet's probe of edge with the kill switch on: %s", probe.raw)
	}
	refused := s.must(t, http.StatusConflict, "POST", "/fleet/runs", token, body)
	if !strings.Contains(refused.raw, `"hostId":"edge-1"`) || !strings.Contains(refused.raw, `"secrets_unsupported"`) {
		t.Fatalf("with the kill switch on, the run was not excluded secrets_unsupported: %s", refused.raw)
	}
	// A run without secrets still goes there and runs.
	plain := s.must(t, http.StatusCreated, "POST", "/fleet/runs", token, `{"agent": "shell", "prompt": "echo plain"}`)
	if plain.str("hostId") != "edge-1" {
		t.Fatalf("plain dispatch: %s", plain.raw)
	}
	if r := e.waitFor(plain.str("childRunId"), terminal); r.Status != hostproto.StatusSucceeded {
		t.Fatalf("plain run ended %+v", r)
	}
}

// TestEdgeServeDrainsOnSIGTERMAndKeepsEventsAcrossRestarts: SIGTERM admits
// nothing more, lets a run that ends within runner.drainTimeout end, cancels
// the rest (host_shutdown) and exits 0; after a restart, events page on from
// the cursor read before; after a crash (SIGKILL), a live run is failed
// host_restarted with its events kept.
func TestEdgeServeDrainsOnSIGTERMAndKeepsEventsAcrossRestarts(t *testing.T) {
	e := newEdgeProc(t)
	e.runner = `{"user": "nobody", "drainTimeout": "3s", "cancelGrace": "2s"}`
	e.writeConfig()
	e.start()
	quick := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo quick-start; read go; echo quick-done`}})
	slow := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `for i in 1 2 3 4 5; do echo slow-$i; done; sleep 1000`}})
	e.waitFor(quick.RunID, func(r hostproto.Run) bool { return r.Status == hostproto.StatusRunning })
	e.waitFor(slow.RunID, func(r hostproto.Run) bool { return r.Status == hostproto.StatusRunning })
	firstOut, cursor := "", int64(0)
	for !strings.Contains(firstOut, "slow-5") {
		var more string
		more, cursor = e.output(slow.RunID, cursor)
		firstOut += more
	}

	must(t, e.cmd.Process.Signal(syscall.SIGTERM))
	// Draining: a new start is refused while the API still answers.
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Each try is a new run: a known clientToken would answer its run.
		_, err := e.client.Start(context.Background(), hostproto.StartRequest{ClientToken: fmt.Sprintf("during-drain-%d", time.Now().UnixNano()), Request: runspec.Request{Agent: "shell", Prompt: "true"}})
		var he *hostproto.Error
		if asHostError(err, &he) && he.Code == hostproto.CodeDraining {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("edge kept admitting after SIGTERM: %v\n%s", err, e.logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := e.client.Input(context.Background(), quick.RunID, json.RawMessage(`"go"`)); err != nil {
		t.Fatalf("input during the drain: %v", err)
	}
	select {
	case <-e.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("edge did not exit after its drain:\n%s", e.logs.String())
	}
	if code := e.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("edge exited %d after SIGTERM:\n%s", code, e.logs.String())
	}
	e.cmd = nil

	e.start()
	if r, _ := e.client.Get(context.Background(), quick.RunID); r.Status != hostproto.StatusSucceeded {
		t.Fatalf("the run that ended within the drain is %+v", r)
	}
	r, _ := e.client.Get(context.Background(), slow.RunID)
	if r.Status != hostproto.StatusCanceled || r.Reason != hostproto.ReasonHostShutdown {
		t.Fatalf("the run still live after the drain is %+v, want canceled host_shutdown", r)
	}
	rest, _ := e.output(slow.RunID, cursor)
	if strings.Contains(rest, "slow-") {
		t.Fatalf("paging on from cursor %d repeated earlier output: %q", cursor, rest)
	}
	all, _ := e.output(slow.RunID, 0)
	if !strings.HasPrefix(all, firstOut) {
		t.Fatal("the events before the restart changed")
	}

	// A crash: the live run is failed host_restarted; its events stay.
	crashed := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo before-crash; sleep 1000`}})
	e.waitFor(crashed.RunID, func(r hostproto.Run) bool { return r.Status == hostproto.StatusRunning })
	for out, _ := e.output(crashed.RunID, 0); !strings.Contains(out, "before-crash"); out, _ = e.output(crashed.RunID, 0) {
		time.Sleep(5 * time.Millisecond)
	}
	e.stop(syscall.SIGKILL)
	e.start()
	r, _ = e.client.Get(context.Background(), crashed.RunID)
	if r.Status != hostproto.StatusFailed || r.Reason != hostproto.ReasonHostRestarted {
		t.Fatalf("after a crash the live run is %+v, want failed host_restarted", r)
	}
	if out, _ := e.output(crashed.RunID, 0); !strings.Contains(out, "before-crash") {
		t.Fatalf("the crashed run's events were lost: %q", out)
	}
	if code := e.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("edge exited %d", code)
	}
}

// TestEdgeServeReloadsThePolicyOnSIGHUP: a key added to edge.json is granted
// after SIGHUP, and only because of it. edge also polls edge.json and
// re-reads it when its stamp (shared/filewatch: inode, size, modification
// time) changes, so the new policy is written in place, of the same size,
// with the old modification time put back, while edge is stopped
// (SIGSTOP): its stamp is the one edge read at start, and no poll can see
// the change. Were SIGHUP not handled, the key would never be granted.
func TestEdgeServeReloadsThePolicyOnSIGHUP(t *testing.T) {
	e := newEdgeProc(t)
	const oldKey, newKey = `"OLD_KEY": {"domains": ["api.old.example"]}`, `"NEW_KEY": {"domains": ["api.new.example"]}`
	e.policy = `{"acme": {"keys": {"API_KEY": {"domains": ["api.example.com"]}, ` + oldKey + `}}}`
	e.writeConfig()
	e.start()
	declared := []runspec.Secret{{ProjectID: "acme", Key: "NEW_KEY", Domains: []string{"api.new.example"}}}
	if r := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: "true", Secrets: declared}}); r.Reason != hostproto.ReasonKeyNotGranted {
		t.Fatalf("a key outside the policy: %+v", r)
	}

	stamp, err := filewatch.Of(e.cfgPath)
	must(t, err)
	fi, err := os.Stat(e.cfgPath)
	must(t, err)
	must(t, e.cmd.Process.Signal(syscall.SIGSTOP))
	waitStopped(t, e.cmd.Process.Pid)
	e.policy = strings.Replace(e.policy, oldKey, newKey, 1)
	e.writeConfig()
	must(t, os.Chtimes(e.cfgPath, fi.ModTime(), fi.ModTime()))
	must(t, e.cmd.Process.Signal(syscall.SIGCONT))
	if now, err := filewatch.Of(e.cfgPath); err != nil || now != stamp {
		t.Fatalf("rewriting edge.json changed its stamp (%v): a poll could reload it, so this test would not prove SIGHUP", err)
	}

	must(t, e.cmd.Process.Signal(syscall.SIGHUP))
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: "true", Secrets: declared}})
		if r.Reason != hostproto.ReasonKeyNotGranted {
			if r = e.waitFor(r.RunID, terminal); r.Status != hostproto.StatusSucceeded {
				t.Fatalf("after the reload the run ended %+v", r)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy was not reloaded on SIGHUP:\n%s", e.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := strings.Count(e.logs.String(), "policy reloaded"); n != 1 {
		t.Fatalf("edge reloaded its policy %d times, want once (on SIGHUP):\n%s", n, e.logs.String())
	}
	if code := e.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("edge exited %d", code)
	}
}

// waitStopped waits until every thread of process pid is stopped (a
// SIGSTOP is delivered asynchronously).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		must(t, err)
		stopped := len(stats) > 0
		for _, path := range stats {
			b, err := os.ReadFile(path)
			// The state follows the command name, which ends with ") ".
			if i := strings.LastIndex(string(b), ") "); err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				stopped = false
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d did not stop after SIGSTOP", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func asHostError(err error, target **hostproto.Error) bool {
	he, ok := err.(*hostproto.Error)
	if ok {
		*target = he
	}
	return ok
}

// asUser makes edge run as uid, owning its files, and returns how to set
// its runner section (which writes edge.json, uid's too).
func (e *edgeProc) asUser(uid int) (configure func(runner string)) {
	e.t.Helper()
	e.uid = uid
	data := filepath.Join(e.dir, "data")
	must(e.t, os.Mkdir(data, 0o700))
	for _, p := range []string{data, filepath.Join(e.dir, "host-token"), filepath.Join(e.dir, "secrets.json")} {
		must(e.t, os.Chown(p, uid, uid))
	}
	return func(runner string) {
		e.runner = runner
		e.writeConfig()
		must(e.t, os.Chown(e.cfgPath, uid, uid))
	}
}

// TestEdgeThatCannotSwitchUsers: an edge that is not root can neither give
// tasks groups of their own nor confine their egress, so it refuses to
// start, saying why, unless runner.egress is insecureOpen; it then refuses
// every run (host_unavailable, reported unhealthy) unless
// runner.insecureSameUser is set too, and runner.limits is "none" (it can
// make no control group), and then runs tasks as itself and says so on
// /healthz, egress unconfined and limits none. insecureSameUser alone does
// not start it either.
func TestEdgeThatCannotSwitchUsers(t *testing.T) {
	const nobody = 65534
	e := newEdgeProc(t)
	configure := e.asUser(nobody)
	// Tasks as edge itself cannot be confined: that takes a second,
	// explicit insecure choice.
	configure(`{"user": "nobody", "insecureSameUser": true}`)
	if code, logs := e.startFails(); code != 1 || !strings.Contains(logs, "runner.egress") || !strings.Contains(logs, "insecureOpen") {
		t.Fatalf("with insecureSameUser alone, edge as uid %d exited %d: want it to refuse to start, naming runner.egress and insecureOpen:\n%s", nobody, code, logs)
	}

	// As DESIGN.md has it, an edge that cannot switch users starts and
	// refuses runs; with no task to run there is nothing to confine.
	configure(`{"user": "nobody"}`)
	e.start()
	h, err := e.client.Health(context.Background())
	if err != nil || h.OK || h.InsecureSameUser || h.EgressConfined {
		t.Fatalf("health of an edge that cannot switch users: %+v %v", h, err)
	}
	r := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: "echo ran"}})
	if r.Status != hostproto.StatusFailed || r.Reason != hostproto.ReasonHostUnavailable {
		t.Fatalf("a run on an edge that cannot switch users: %+v", r)
	}
	if code := e.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("edge exited %d", code)
	}

	// Nor can it make control groups: bounded only by the host is a
	// third explicit choice (runner.limits "none").
	configure(`{"user": "nobody", "insecureSameUser": true, "egress": "insecureOpen"}`)
	e.start()
	if h, err = e.client.Health(context.Background()); err != nil || h.OK || h.Limits == nil || h.Limits.Enforced != hostproto.LimitsUnavailable {
		t.Fatalf("health with insecureSameUser and limits: %+v %v", h, err)
	}
	if r = e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: "echo ran"}}); r.Status != hostproto.StatusFailed || r.Reason != hostproto.ReasonHostUnavailable || !strings.Contains(r.Detail, "runner.limits") {
		t.Fatalf("a run on an edge that cannot make control groups: %+v", r)
	}
	if code := e.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("edge exited %d", code)
	}

	configure(`{"user": "nobody", "insecureSameUser": true, "egress": "insecureOpen", "limits": "none"}`)
	e.start()
	if h, err = e.client.Health(context.Background()); err != nil || !h.OK || !h.InsecureSameUser || h.EgressConfined || h.Limits.Enforced != hostproto.LimitsNone {
		t.Fatalf("health with insecureSameUser: %+v %v", h, err)
	}
	r = e.waitFor(e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: "echo uid=$(id -u)"}}).RunID, terminal)
	if out, _ := e.output(r.RunID, 0); r.Status != hostproto.StatusSucceeded || !strings.Contains(out, fmt.Sprintf("uid=%d", nobody)) {
		t.Fatalf("the run ended %+v with %q", r, out)
	}
	if code := e.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("edge exited %d", code)
	}
}
