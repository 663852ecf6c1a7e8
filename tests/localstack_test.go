package tests

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLocalStackStartsServesAndStopsOnSIGTERM builds `make dev`'s program,
// runs it on a free port with its own data dir, reads /healthz and an admin
// route with the token its ready record names, and stops it with SIGTERM.
// Its stdout is JSON lines throughout.
func TestLocalStackStartsServesAndStopsOnSIGTERM(t *testing.T) {
	dir := t.TempDir()
	bin := localStackBinary(t)
	dataDir := filepath.Join(dir, "data")
	cmd := exec.Command(bin)
	// Fleet alone: TestLocalStackRunsTheWholeSystem covers the local edge.
	cmd.Env = append(cleanEnv(), "RUNFLEET_ADDR=127.0.0.1:0", "RUNFLEET_DATA_DIR="+dataDir, "RUNFLEET_EDGE=off")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
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
	ready := log.awaitReady(t, 30*time.Second, stderr.String)
	base := ready.Fleet
	if ready.Edge != nil || ready.Demo != nil || ready.AdminTokenFile != filepath.Join(dataDir, "admin-token") {
		t.Fatalf("the ready record of Fleet alone: %+v", ready)
	}

	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var health map[string]any
	json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if resp.StatusCode != 200 || health["ok"] != true || health["product"] != "runfleet" {
		t.Fatalf("healthz: %d %v", resp.StatusCode, health)
	}

	token, err := os.ReadFile(filepath.Join(dataDir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", base+"/fleet/hosts", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"hosts":[]`) {
		t.Fatalf("GET /fleet/hosts with the printed token: %d %s", resp.StatusCode, body)
	}
	if st, err := os.Stat(filepath.Join(dataDir, "admin-token")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("admin token file: %v %v", st, err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\nstderr: %s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30s after SIGTERM")
	}
	log.wait(t)
	log.checkJSON(t)
	if _, _, ok := log.find("stopped", 0); !ok {
		t.Fatalf("no clean stop:\n%s", log.String())
	}
	if strings.Contains(log.String(), strings.TrimSpace(string(token))) {
		t.Fatal("the admin token reached the log")
	}
	if stderr.Len() > 0 {
		t.Fatalf("the stack wrote to its stderr, which is no terminal:\n%s", stderr.String())
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("still answering after it stopped")
	}
}

// cleanEnv is the test's environment without RUNFLEET_* settings, so the
// stack runs with its own defaults.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RUNFLEET_") {
			env = append(env, kv)
		}
	}
	return env
}
