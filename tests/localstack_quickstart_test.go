package tests

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// TestReadmeQuickStart runs the README's quick start as a newcomer does,
// with the output of `make dev` sent to a file (`make dev > log 2>&1`, or a
// terminal that is not there): make dev itself, from the repository's
// folder, its stdout and stderr one stream, which holds nothing but JSON log
// lines from make's start to the stack's stop; then the quick start's
// second command, pasted in the repository's folder, runs the demo to its
// success. That command is demo-run.sh's own usage example, word for word.
//
// The stack runs on addresses and a data dir of the test's own (the
// defaults may be taken on a shared machine): the command is pasted with
// those put in for the defaults it names, nothing else changed.
func TestReadmeQuickStart(t *testing.T) {
	second := quickStartCommand(t)
	if usage := demoRunUsageExample(t); usage != second {
		t.Fatalf("demo-run.sh's usage example\n%s\nis not the README quick start's command\n%s", usage, second)
	}

	dataDir := filepath.Join(t.TempDir(), "data")
	addr, edgeAddr, upstreamAddr := freeAddr(), freeAddr(), freeAddr()
	cmd := makeIn(t, "dev", "BUILD="+t.TempDir())
	env := []string{"RUNFLEET_DATA_DIR=" + dataDir, "RUNFLEET_ADDR=" + addr, "RUNFLEET_EDGE_ADDR=" + edgeAddr, "RUNFLEET_DEMO_UPSTREAM_ADDR=" + upstreamAddr}
	for _, kv := range cmd.Env {
		if !strings.HasPrefix(kv, "RUNFLEET_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	s := &devStack{cmd: cmd, dataDir: dataDir, stderr: &syncbuf.Buffer{}, exited: make(chan error, 1), group: true}
	r, w, err := os.Pipe()
	must(t, err)
	defer r.Close()
	s.cmd.Stdout, s.cmd.Stderr = w, w // > log 2>&1
	s.startLog(t, r, w)

	_, port, _ := net.SplitHostPort(upstreamAddr)
	pasted := strings.NewReplacer("http://127.0.0.1:8080", s.ready.Fleet, "api.demo.test:7443", "api.demo.test:"+port,
		`"$(cat .dev/`, `"$(cat `+dataDir+"/").Replace(second)
	if pasted == second || strings.Contains(pasted, ".dev/") || strings.Contains(pasted, ":8080") || strings.Contains(pasted, ":7443") {
		t.Fatalf("the command names other defaults than the test puts its own for: %s", pasted)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := shellIn(ctx, "..", pasted)
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s\nstderr: %s\nthe stack's log:\n%s", pasted, err, out, stderr.String(), s.log.String())
	}
	_, sse, _ := strings.Cut(string(out), "\n")
	s.checkDemoRan(t, sse)
	s.stop(t, syscall.SIGINT)
}

// quickStartCommand is the README quick start's one command that is not a
// make target: the demo run.
func quickStartCommand(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	must(t, err)
	_, rest, ok := strings.Cut(string(b), "\n## Quick start\n")
	if !ok {
		t.Fatal("README.md has no Quick start section")
	}
	section, _, _ := strings.Cut(rest, "\n## ")
	var cmds []string
	fenced := false
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			fenced = !fenced
		case fenced && line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, " "):
			if !strings.HasPrefix(line, "make ") {
				cmds = append(cmds, line)
			}
		}
	}
	if len(cmds) != 1 || !strings.HasPrefix(cmds[0], "infra/scripts/demo-run.sh ") {
		t.Fatalf("the README's quick start has %q besides make targets; want the one demo-run.sh command", cmds)
	}
	return cmds[0]
}

// demoRunUsageExample is the example demo-run.sh's usage gives (run
// without arguments: exit 2, usage on stderr).
func demoRunUsageExample(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("infra/scripts/demo-run.sh")
	cmd.Dir = ".."
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("demo-run.sh without arguments: %v\n%s", err, stderr.String())
	}
	m := regexp.MustCompile(`(?m)^  (infra/scripts/demo-run\.sh .*)$`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("demo-run.sh's usage has no example line:\n%s", stderr.String())
	}
	return m[1]
}
