package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
)

// forkUntilRefused is a task that forks sleepers until the kernel refuses
// one, says how many it got, holds them until its input says go, and
// exits 0: a build whose fork fails is not killed for it.
const forkUntilRefused = `exec python3 -c '
import os, sys
kids = 0
try:
    for _ in range(500):
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        os.close(r)
        kids += 1
except BlockingIOError as e:
    print("refused after", kids, "forks:", e.strerror, flush=True)
sys.stdin.readline()
print("released", flush=True)
'`

// waitOutput polls the run's output until it holds want.
func (e *edgeProc) waitOutput(runID, want string) string {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := e.output(runID, 0)
		if strings.Contains(out, want) {
			return out
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("run %s never wrote %q; its output: %q\n%s", runID, want, out, e.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *edgeProc) input(runID, text string) {
	e.t.Helper()
	b, _ := json.Marshal(text)
	if _, err := e.client.Input(context.Background(), runID, b); err != nil {
		e.t.Fatalf("input to %s: %v", runID, err)
	}
}

// TestEdgeServeBoundsEachTask: a real edge serve with runner.limits puts
// each task in a control group of its own. A task that forks far past its
// pids limit gets at most the limit (the forks past it fail, as on any
// limited host), its events say so once, and the task beside it and
// edge's API go on; one that allocates past its memory limit ends
// oom_killed while the task beside it succeeds; one that spins on every
// core gets its CPU share and no more.
func TestEdgeServeBoundsEachTask(t *testing.T) {
	e := newEdgeProc(t)
	e.runner = `{"user": "nobody", "limits": {"memory": "96MiB", "pids": 64, "cpu": 0.5}}`
	e.writeConfig()
	e.start()
	ctx := context.Background()

	h, err := e.client.Health(ctx)
	must(t, err)
	if !h.OK || h.Limits == nil || (h.Limits.Enforced != hostproto.LimitsCgroup1 && h.Limits.Enforced != hostproto.LimitsCgroup2) ||
		h.Limits.MemoryBytes != 96<<20 || h.Limits.Pids != 64 || h.Limits.CPU != 0.5 {
		t.Fatalf("health: ok %v, limits %+v", h.OK, h.Limits)
	}

	t.Run("pids", func(t *testing.T) {
		bomb := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: forkUntilRefused}})
		out := e.waitOutput(bomb.RunID, "refused after")
		f := strings.Fields(out[strings.Index(out, "refused after"):])
		forks, err := strconv.Atoi(f[2])
		// The init, the interpreter and the init's threads count too.
		if err != nil || forks < 16 || forks >= 64 || !strings.Contains(out, "Resource temporarily unavailable") {
			t.Fatalf("the task's forks: %q (want fewer than its limit of 64, refused with EAGAIN)", out)
		}
		t.Logf("%s", out)
		// The host goes on while the bomb holds its processes.
		if h, err := e.client.Health(ctx); err != nil || !h.OK {
			t.Fatalf("health while the bomb holds its processes: %+v, %v", h, err)
		}
		beside := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo beside-the-bomb`}})
		if end := e.waitFor(beside.RunID, terminal); end.Status != hostproto.StatusSucceeded {
			t.Fatalf("the task beside the bomb: %+v", end)
		}
		e.input(bomb.RunID, "go")
		end := e.waitFor(bomb.RunID, terminal)
		if end.Status != hostproto.StatusSucceeded {
			t.Fatalf("the bomb ended %+v, want succeeded: a refused fork is the task's to handle", end)
		}
		said := e.limitsReached(bomb.RunID)
		if len(said) != 1 || said[0].Limit != hostproto.LimitPids || said[0].Value != 64 || !strings.Contains(said[0].Detail, "EAGAIN") {
			t.Fatalf("limit events %+v, want one saying the pids limit was reached", said)
		}
	})

	t.Run("memory", func(t *testing.T) {
		beside := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo waiting; read go; echo beside-the-hog`}})
		e.waitOutput(beside.RunID, "waiting")
		hog := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo allocating; exec python3 -c 'x = b"a" * (512 << 20); print("allocated")'`}})
		end := e.waitFor(hog.RunID, terminal)
		if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonOOMKilled || !strings.Contains(end.Detail, "96.0 MiB") {
			t.Fatalf("the hog ended %+v, want failed oom_killed", end)
		}
		if out, _ := e.output(hog.RunID, 0); strings.Contains(out, "allocated") {
			t.Fatalf("the hog got its memory: %q", out)
		}
		said := e.limitsReached(hog.RunID)
		if len(said) != 1 || said[0].Limit != hostproto.LimitMemory || said[0].Value != 96<<20 {
			t.Fatalf("limit events %+v, want one saying the memory limit was reached", said)
		}
		e.input(beside.RunID, "go")
		if end := e.waitFor(beside.RunID, terminal); end.Status != hostproto.StatusSucceeded {
			t.Fatalf("the task beside the hog: %+v", end)
		}
		if out, _ := e.output(beside.RunID, 0); !strings.Contains(out, "beside-the-hog") {
			t.Fatalf("the task beside the hog wrote %q", out)
		}
	})

	t.Run("cpu", func(t *testing.T) {
		// Two spinners for 1.5 s of the task's own clock; it prints
		// their CPU seconds and the wall seconds they took.
		spin := e.run(hostproto.StartRequest{
			Request: runspec.Request{
				Prompt: `exec python3 -c '
import os, time
begun = time.monotonic()
end = begun + 1.5
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() < end: pass
        os._exit(0)
    kids.append(pid)
for pid in kids: os.waitpid(pid, 0)
t = os.times()
print("cpu", t.children_user + t.children_system, "wall", time.monotonic() - begun)
'`,
			},
		})
		if end := e.waitFor(spin.RunID, terminal); end.Status != hostproto.StatusSucceeded {
			t.Fatalf("the spinner: %+v", end)
		}
		out, _ := e.output(spin.RunID, 0)
		var cpu, wall float64
		if _, err := fmt.Sscanf(out[strings.Index(out, "cpu"):], "cpu %g wall %g", &cpu, &wall); err != nil || wall < 1.5 {
			t.Fatalf("the spinner wrote %q: %v", out, err)
		}
		// Half a core per wall second, however many it spins on (CPU
		// time, which load on the machine can only lower).
		t.Logf("cpu %.2f wall %.2f", cpu, wall)
		if ratio := cpu / wall; ratio > 0.7 {
			t.Fatalf("the spinner used %.2f s of CPU in %.2f s: %.2f cores, over its limit of 0.5", cpu, wall, ratio)
		}
	})

	// An operator sees the same in the metrics.
	m, err := e.client.Metrics(ctx)
	must(t, err)
	for _, want := range []string{`edge_limits_reached_total{limit="memory"} 1`, `edge_limits_reached_total{limit="pids"} 1`, "edge_storage_free_bytes "} {
		if !strings.Contains(string(m), want) {
			t.Errorf("the metrics lack %q", want)
		}
	}
}

// TestEdgeServeWithoutCgroups: on a host where edge can make no control
// group, it refuses every run, and /healthz says why, unless
// runner.limits is "none", which /healthz reports too.
func TestEdgeServeWithoutCgroups(t *testing.T) {
	e := newEdgeProc(t)
	// A mount namespace of its own with no cgroup file system mounted.
	e.wrap = []string{"unshare", "--mount", "--propagation", "private", "sh", "-c", `umount -R /sys/fs/cgroup && exec "$@"`, "sh"}
	e.start()
	h, err := e.client.Health(context.Background())
	must(t, err)
	if h.OK || h.Limits == nil || h.Limits.Enforced != hostproto.LimitsUnavailable || !strings.Contains(h.Limits.Detail, `set runner.limits to "none"`) {
		t.Fatalf("health without cgroups: ok %v, limits %+v", h.OK, h.Limits)
	}
	refused := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo unbounded`}})
	if refused.Status != hostproto.StatusFailed || refused.Reason != hostproto.ReasonHostUnavailable || !strings.Contains(refused.Detail, "cannot enforce runner.limits") {
		t.Fatalf("a start without cgroups: %+v, want refused", refused)
	}
	e.stop(syscall.SIGTERM)

	e.runner = `{"user": "nobody", "limits": "none"}`
	e.writeConfig()
	e.start()
	h, err = e.client.Health(context.Background())
	must(t, err)
	if !h.OK || h.Limits == nil || h.Limits.Enforced != hostproto.LimitsNone {
		t.Fatalf("health with limits none: ok %v, limits %+v", h.OK, h.Limits)
	}
	run := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo unbounded`}})
	if end := e.waitFor(run.RunID, terminal); end.Status != hostproto.StatusSucceeded {
		t.Fatalf("a run with limits none: %+v", end)
	}
}

// TestEdgeServeCrashLeavesNoControlGroup: an edge killed while a task
// runs leaves the task's control group behind (nothing of edge runs to
// remove it); the edge that starts next on the same data dir ends the
// group with whatever is left in it, and on a clean stop removes its own
// directories too, so crashes do not pile groups up on a host.
func TestEdgeServeCrashLeavesNoControlGroup(t *testing.T) {
	e := newEdgeProc(t)
	e.runner = `{"user": "nobody", "limits": {"memory": "96MiB", "pids": 64, "cpu": 0.5}}`
	e.writeConfig()
	e.start()
	run := e.run(hostproto.StartRequest{Request: runspec.Request{Prompt: `echo up; exec sleep 1000`}})
	e.waitOutput(run.RunID, "up")
	// Where the task's group is, as the task itself sees it.
	self, err := os.ReadFile("/proc/self/cgroup")
	must(t, err)
	var parent string
	for _, l := range strings.Split(string(self), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && f[1] == "pids" {
			parent = filepath.Join("/sys/fs/cgroup/pids", f[2])
		}
	}
	sum := sha256.Sum256([]byte(filepath.Join(e.dir, "data", "work")))
	edgeDir := filepath.Join(parent, "runfleet-edge-"+hex.EncodeToString(sum[:6]))
	group := filepath.Join(edgeDir, run.RunID+"-1")
	if _, err := os.Stat(group); err != nil {
		t.Fatalf("the running task's group: %v", err)
	}

	e.stop(syscall.SIGKILL)
	e.start()
	if end := e.waitFor(run.RunID, terminal); end.Reason != hostproto.ReasonHostRestarted {
		t.Fatalf("the run a crash left: %+v", end)
	}
	if _, err := os.Stat(group); !os.IsNotExist(err) {
		t.Fatalf("the group a crash left is still there after a restart: %v", err)
	}
	e.stop(syscall.SIGTERM)
	if _, err := os.Stat(edgeDir); !os.IsNotExist(err) {
		t.Fatalf("edge's own group directory is still there after a clean stop: %v", err)
	}
}

// TestFleetSeesATaskEndOOMKilled: a run dispatched through Fleet to a real
// edge whose task goes past its memory limit ends, in Fleet's view too,
// failed with the typed reason oom_killed, and the mirror of its events
// holds the limit event that says why.
func TestFleetSeesATaskEndOOMKilled(t *testing.T) {
	e := newEdgeProc(t)
	e.runner = `{"user": "nobody", "limits": {"memory": "64MiB"}}`
	e.writeConfig()
	e.start()
	s := newStack(t, "bolt", stackOptions{})
	s.must(t, http.StatusCreated, "POST", "/fleet/hosts", adminToken,
		fmt.Sprintf(`{"id": "edge-1", "baseUrl": "http://%s", "credentialRef": %q}`, e.apiAddr, hostCredRef))
	s.probe(t, "edge-1")
	token := s.mint(t, "alice", "*", "*")
	a := s.must(t, http.StatusCreated, "POST", "/fleet/runs", token,
		`{"agent": "shell", "prompt": "exec python3 -c 'x = b\"a\" * (512 << 20)'"}`)
	e.waitFor(a.str("childRunId"), terminal)

	run := s.must(t, http.StatusOK, "GET", "/fleet/runs/"+a.str("fleetRunId"), token, "")
	if !strings.Contains(run.raw, `"status":"failed"`) || !strings.Contains(run.raw, `"reason":"oom_killed"`) || !strings.Contains(run.raw, "64.0 MiB") {
		t.Fatalf("Fleet's view of the run: %s", run.raw)
	}
	// The sweep mirrors an ended run's events, as its schedule would.
	s.sweep(t)
	var limits []hostproto.LimitReached
	for _, ev := range s.allEvents(t, token, a.str("fleetRunId")) {
		if ev.Type == hostproto.EventLimit {
			var l hostproto.LimitReached
			must(t, json.Unmarshal(ev.Data, &l))
			limits = append(limits, l)
		}
	}
	if len(limits) != 1 || limits[0].Limit != hostproto.LimitMemory || limits[0].Value != 64<<20 {
		t.Fatalf("the limit events in Fleet's mirror: %+v, want one for memory", limits)
	}
}
