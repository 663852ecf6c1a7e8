package tests

import (
	"context"
	"net"
	"os"
	"path/filepath"
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
// runfleet lines, pasted in the repository's folder, run the demo to its
// success. They are the stack's own one-go command, the same words.
//
// The stack runs on addresses, a data dir and a build dir of the test's
// own (the defaults may be taken on a shared machine): the lines are
// pasted with those put in for the defaults they name, nothing else
// changed.
func TestReadmeQuickStart(t *testing.T) {
	export, runLine := quickStartCommands(t)

	dataDir := filepath.Join(t.TempDir(), "data")
	buildDir := t.TempDir()
	addr, edgeAddr, upstreamAddr := freeAddr(), freeAddr(), freeAddr()
	cmd := makeIn(t, "dev", "BUILD="+buildDir)
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
	cli := filepath.Join(buildDir, "runfleet")
	paste := strings.NewReplacer("http://127.0.0.1:8080", s.ready.Fleet, "api.demo.test:7443", "api.demo.test:"+port,
		`"$(cat .dev/`, `"$(cat `+dataDir+"/", "build/runfleet ", cli+" ").Replace
	pasted := paste(export) + "\n" + paste(runLine)
	if strings.Contains(pasted, ".dev/") || strings.Contains(pasted, ":8080") || strings.Contains(pasted, ":7443") || strings.Contains(pasted, "build/") {
		t.Fatalf("the lines name other defaults than the test puts its own for:\n%s", pasted)
	}
	// The README's lines say what the stack's one-go command says.
	if want := strings.TrimPrefix(paste(export), "export ") + " " + paste(runLine); s.ready.Demo == nil || s.ready.Demo.DemoRun != want {
		t.Fatalf("the README's quick start, pasted, is\n%s\nthe stack's one-go command is\n%+v", want, s.ready.Demo)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := shellIn(ctx, "..", "set -e\n"+pasted)
	run.Env = cleanEnv()
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s\nstderr: %s\nthe stack's log:\n%s", pasted, err, out, stderr.String(), s.log.String())
	}
	s.checkDemoRan(t, string(out), stderr.String())
	s.stop(t, syscall.SIGINT)
}

// quickStartCommands are the README quick start's lines that are not make
// targets: the export of runfleet's settings and the demo run.
func quickStartCommands(t *testing.T) (export, run string) {
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
	if len(cmds) != 2 || !strings.HasPrefix(cmds[0], "export RUNFLEET_API=http://127.0.0.1:8080 RUNFLEET_TOKEN=") || !strings.HasPrefix(cmds[1], "build/runfleet run ") {
		t.Fatalf("the README's quick start has %q besides make targets; want the export of RUNFLEET_API and RUNFLEET_TOKEN, then build/runfleet run", cmds)
	}
	return cmds[0], cmds[1]
}
