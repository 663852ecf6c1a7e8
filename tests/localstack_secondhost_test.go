package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestLocalStackSecondHost runs the README's "register another host" as
// written, against the local stack: the second host's edge.json the stack
// keeps ready is served by edge as built from this tree, and the README's
// commands register it, probe it, mint a caller, dispatch a run to it,
// feed the run its line and follow it to its success.
//
// The stack and edge-1 run on addresses and a data dir of the test's own
// (the defaults may be taken on a shared machine): the commands are pasted
// with those put in for the defaults they name, nothing else changed.
func TestLocalStackSecondHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs edge as root (tasks as nobody), as in CI")
	}
	serve, register, follow := readmeSecondHostBlocks(t)
	if serve != "make build-edge && build/edge serve --config .dev/edge-1.json" {
		t.Fatalf("the README starts edge-1 with %q", serve)
	}
	dataDir := filepath.Join(t.TempDir(), "data")
	s := startDevStack(t, localStackBinary(t), "", devEnv(dataDir, ""), nil)
	second := s.ready.SecondEdge
	if second == nil || second.ID != "edge-1" || second.API != "http://127.0.0.1:7171" || second.CredentialRef != "edge-1" ||
		second.Config != filepath.Join(dataDir, "edge-1.json") {
		t.Fatalf("the ready record's second host: %+v", second)
	}

	// edge-1 as the README runs it, on an address of the test's.
	addr := freeAddr()
	raw, err := os.ReadFile(second.Config)
	must(t, err)
	var cfg map[string]any
	must(t, json.Unmarshal(raw, &cfg))
	if api := cfg["api"].(map[string]any); api["listen"] != "127.0.0.1:7171" {
		t.Fatalf("edge-1.json's api.listen is %v", api["listen"])
	} else {
		api["listen"] = addr
	}
	raw, err = json.Marshal(cfg)
	must(t, err)
	config := filepath.Join(t.TempDir(), "edge-1.json")
	must(t, os.WriteFile(config, raw, 0o600))
	edge := exec.Command(commandBinary(t, "./edge"), "serve", "--config", config)
	var edgeLog syncbuf.Buffer
	edge.Stdout, edge.Stderr = &edgeLog, &edgeLog
	must(t, edge.Start())
	edgeExited := make(chan error, 1)
	go func() { edgeExited <- edge.Wait() }()
	t.Cleanup(func() {
		if edge.ProcessState == nil {
			edge.Process.Kill()
			<-edgeExited
		}
	})
	await.Cond(t, 60*time.Second, "edge-1 serving", func() bool { return strings.Contains(edgeLog.String(), `"msg":"edge serving"`) })

	paste := strings.NewReplacer("http://127.0.0.1:8080", s.base(), "127.0.0.1:7171", addr, "$(cat .dev/", "$(cat "+dataDir+"/").Replace
	registered := runReadmeBlock(t, paste(register)+"\necho \"caller=$CALLER\"", nil)
	for _, want := range []string{`"host":{"id":"edge-1","baseUrl":"http://` + addr + `"`, `{"probe":{"status":"ok"`} {
		if !strings.Contains(registered, want) {
			t.Fatalf("the README's commands printed no %q:\n%s\nedge-1:\n%s", want, registered, edgeLog.String())
		}
	}
	run := regexp.MustCompile(`(?m)^fr-[a-z0-9]+$`).FindString(registered)
	caller := regexp.MustCompile(`(?m)^caller=(rft_\S+)$`).FindStringSubmatch(registered)
	if run == "" || caller == nil {
		t.Fatalf("echo \"$RUN\" printed no run id, or no caller was minted:\n%s", registered)
	}
	// As a person would, the line goes in once the task has started (the
	// run's record, read through from the host, says running).
	await.Cond(t, 60*time.Second, "the run on edge-1 running", func() bool {
		req, _ := http.NewRequest("GET", s.base()+"/fleet/runs/"+run, nil)
		req.Header.Set("Authorization", "Bearer "+caller[1])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var got struct {
			Run struct {
				Status string `json:"status"`
			} `json:"run"`
		}
		return json.NewDecoder(resp.Body).Decode(&got) == nil && got.Run.Status == "running"
	})
	followed := runReadmeBlock(t, paste(follow), []string{"FLEET=" + s.base(), "CALLER=" + caller[1], "RUN=" + run})
	for _, want := range []string{"got: yes", "event: done\ndata: {\"cursor\":", `"status":"succeeded"`} {
		if !strings.Contains(followed, want) {
			t.Errorf("the README's commands printed no %q:\n%s", want, followed)
		}
	}

	must(t, edge.Process.Signal(syscall.SIGTERM))
	if err := <-edgeExited; err != nil {
		t.Fatalf("edge-1 after SIGTERM: %v\n%s", err, edgeLog.String())
	}
	s.stop(t, syscall.SIGTERM)
}

// runReadmeBlock runs a block of the README's commands with sh in the
// repository's folder, with env added, stopping at the first that fails,
// and returns what they printed.
func runReadmeBlock(t *testing.T, block string, env []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := shellIn(ctx, "..", "set -e\n"+block)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = time.Second // the shell killed, its curl may hold the output open
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's commands: %v\n%s\n%s", err, block, out)
	}
	return string(out)
}

// readmeSecondHostBlocks are the README's three command blocks of
// "register another host": the one that starts edge-1, the one that
// registers it and dispatches, and the one that follows the run.
func readmeSecondHostBlocks(t *testing.T) (serve, register, follow string) {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	must(t, err)
	_, rest, ok := strings.Cut(string(b), "\nRegistering another host, ")
	if !ok {
		t.Fatal("README.md has no paragraph starting \"Registering another host, \"")
	}
	var blocks []string
	for len(blocks) < 3 {
		_, after, ok := strings.Cut(rest, "```sh\n")
		if !ok {
			t.Fatalf("README.md: %d command blocks after \"Registering another host\", want 3", len(blocks))
		}
		block, tail, _ := strings.Cut(after, "```\n")
		blocks = append(blocks, strings.TrimSpace(block))
		rest = tail
	}
	return blocks[0], blocks[1], blocks[2]
}
