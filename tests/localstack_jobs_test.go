package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/ssetest"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestLocalStackRunsTheJobsAndServesTheStream runs `make dev`'s program with
// short timers: the probe and the sweep run on their own (a registered host
// gets probed, a run's events reach the mirror with nobody asking), the
// stream is served at its path on the same address, and SIGTERM ends an
// open stream with its retry hint.
func TestLocalStackRunsTheJobsAndServesTheStream(t *testing.T) {
	dir := t.TempDir()
	bin := localStackBinary(t)
	host := fakehost.New(fakehost.Config{})
	defer host.Close()
	creds := filepath.Join(dir, "credentials.json")
	os.WriteFile(creds, []byte(fmt.Sprintf(`{"edge-1": %q}`, host.Token())), 0o600)

	dataDir := filepath.Join(dir, "data")
	cmd := exec.Command(bin)
	// Fleet alone, with a fake host of the test's own.
	cmd.Env = append(cleanEnv(), "RUNFLEET_ADDR=127.0.0.1:0", "RUNFLEET_DATA_DIR="+dataDir, "RUNFLEET_CREDENTIALS=file:"+creds, "RUNFLEET_EDGE=off",
		"RUNFLEET_PROBE_INTERVAL=200ms", "RUNFLEET_SWEEP_INTERVAL=200ms", "RUNFLEET_STREAM_POLL_INTERVAL=100ms",
		// A probe pass that changes nothing logs at DEBUG; the test waits
		// for one.
		"RUNFLEET_LOG_LEVEL=debug")
	stdout, _ := cmd.StdoutPipe()
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	log := readStackLog(stdout)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	}()
	base := log.awaitReady(t, 30*time.Second, stderr.String).Fleet
	tokenBytes, _ := os.ReadFile(filepath.Join(dataDir, "admin-token"))
	admin := strings.TrimSpace(string(tokenBytes))
	call := func(method, path, token, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	// eventually waits for cond (the other process works on its own timers).
	eventually := func(what string, cond func() bool) {
		t.Helper()
		if !await.Within(20*time.Second, cond) {
			t.Fatalf("%s: not within 20s\nlog: %s", what, log.String())
		}
	}

	if st, out := call("POST", "/fleet/hosts", admin, `{"id":"edge-1","baseUrl":"`+host.URL+`","credentialRef":"edge-1"}`); st != 201 {
		t.Fatalf("register: %d %v", st, out)
	}
	eventually("the timed probe records the host", func() bool {
		_, out := call("GET", "/fleet/hosts", admin, "")
		hosts, _ := out["hosts"].([]any)
		if len(hosts) != 1 {
			return false
		}
		p, _ := hosts[0].(map[string]any)["probe"].(map[string]any)
		return p != nil && p["status"] == "ok"
	})
	// The pass records each probe before it writes the routing view
	// dispatch reads (README: the view is at most one probe interval old),
	// and logs its line after both: dispatch routes to the host once a
	// pass that found it ok has logged.
	eventually("a timed probe pass that found the host ok ends", func() bool {
		return probePassFoundOK(log.String(), 1)
	})

	st, out := call("POST", "/fleet/runs", admin, `{"agent":"shell"}`)
	id, okID := out["fleetRunId"].(string)
	child, okChild := out["childRunId"].(string)
	if st != 201 || !okID || !okChild {
		t.Fatalf("dispatch to the probed host: %d %v", st, out)
	}
	host.AppendOutput(child, "from the host\n")
	eventually("the timed sweep mirrors the run's events", func() bool {
		_, out := call("GET", "/fleet/runs/"+id+"/events", admin, "")
		evs, _ := out["events"].([]any)
		return len(evs) == 2
	})

	// The stream on the same address, as curl -N reads it.
	req, _ := http.NewRequest("GET", base+"/fleet/runs/"+id+"/stream?token="+admin, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	ch := ssetest.Read(resp.Body)
	nextMsg := func() ssetest.Message {
		t.Helper()
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatal("the stream ended")
			}
			return m
		case <-time.After(20 * time.Second):
			t.Fatal("no message in 20s")
		}
		return ssetest.Message{}
	}
	for m := nextMsg(); m.Event != "snapshot"; m = nextMsg() {
	}
	host.AppendOutput(child, "live\n")
	if m := nextMsg(); m.Event != "event" || m.ID != "3" {
		t.Fatalf("live event %+v", m)
	}

	// Stopping the stack ends the open stream with a retry hint.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var last ssetest.Message
	for m := range ch {
		last = m
	}
	if last.Retry == "" {
		t.Fatalf("the stream's last message %+v has no retry hint", last)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30s after SIGTERM")
	}
	log.wait(t)
	log.checkJSON(t)
	if _, _, ok := log.find("scheduled probe", 0); !ok {
		t.Fatalf("no probe log line:\n%s", log.String())
	}
	if _, _, ok := log.find("scheduled sweep", 0); !ok {
		t.Fatalf("no sweep log line:\n%s", log.String())
	}
	if text := log.String() + stderr.String(); strings.Contains(text, admin) || strings.Contains(text, host.Token()) {
		t.Fatal("a token reached the log")
	}
}

// probePassFoundOK reports whether log (the local stack's JSON lines) has
// a "scheduled probe" line that found n hosts ok.
func probePassFoundOK(log string, n int) bool {
	for _, line := range strings.Split(log, "\n") {
		var l struct {
			Msg    string
			Status map[string]int
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "scheduled probe" && l.Status["ok"] == n {
			return true
		}
	}
	return false
}
