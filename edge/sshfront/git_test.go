package sshfront

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
)

// TestGitThroughTheFront: the task's own git and ssh, holding no key,
// clone, fetch, ls-remote and push through the front, which runs each
// command upstream with the real key and audits it.
func TestGitThroughTheFront(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	e.up.NewRepo(t, "org/repo.git")
	first := e.up.Head(t, "org/repo.git", "main")
	env := e.gitEnv()

	out := mustRun(t, "", env, "git", "ls-remote", url("org/repo.git"))
	if want := first + "\trefs/heads/main\n"; !strings.Contains(out, want) {
		t.Errorf("ls-remote gave %q, want a line %q", out, want)
	}

	work := filepath.Join(t.TempDir(), "repo")
	mustRun(t, "", env, "git", "clone", "-q", url("org/repo.git"), work)
	if b, err := os.ReadFile(filepath.Join(work, "README")); err != nil || !strings.Contains(string(b), "org/repo.git") {
		t.Fatalf("the clone's README: %q, %v", b, err)
	}

	if err := os.WriteFile(filepath.Join(work, "new"), []byte("pushed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, work, env, "git", "add", "new")
	mustRun(t, work, env, "git", "commit", "-q", "-m", "new")
	mustRun(t, work, env, "git", "push", "-q", "origin", "main")
	pushed := strings.TrimSpace(mustRun(t, work, env, "git", "rev-parse", "HEAD"))
	if got := e.up.Head(t, "org/repo.git", "main"); got != pushed {
		t.Errorf("after the push, upstream main is %s, want %s", got, pushed)
	}

	// A second clone, older, fetches what the push added.
	other := filepath.Join(t.TempDir(), "other")
	mustRun(t, "", env, "git", "clone", "-q", "--depth", "1", url("org/repo.git"), other)
	mustRun(t, other, env, "git", "fetch", "-q", "origin")
	if got := strings.TrimSpace(mustRun(t, other, env, "git", "rev-parse", "origin/main")); got != pushed {
		t.Errorf("after fetch, origin/main is %s, want %s", got, pushed)
	}

	e.up.WaitIdle(t)
	// The commands upstream are the front's rebuilt lines, each of one
	// git command on the repository.
	for _, c := range e.up.Commands() {
		if c != "git-upload-pack 'org/repo.git'" && c != "git-receive-pack 'org/repo.git'" {
			t.Errorf("upstream ran %q", c)
		}
	}
	if n := len(e.up.Commands()); n != 5 {
		t.Errorf("upstream ran %d commands, want 5 (ls-remote, clone, push, clone, fetch): %q", n, e.up.Commands())
	}
	// Each an audit line with the key, the command, the repository, bytes
	// both ways and exit status 0.
	var pushes, fetches int
	for _, en := range e.audit.all() {
		if en.SSH == nil || en.Action != audit.Substituted {
			t.Errorf("an audit line that is not an allowed command: %+v", en)
			continue
		}
		switch en.SSH.Command {
		case policy.GitReceivePack:
			pushes++
		case policy.GitUploadPack:
			fetches++
		}
		if en.Task != taskID || en.Host != "git.example:22" || !slices.Equal(en.Keys, []string{keyRef.String()}) ||
			en.SSH.Request != "exec" || en.SSH.Repository != "org/repo" || en.Status != 200 {
			t.Errorf("audit line %+v %+v", en, *en.SSH)
		}
		if en.SSH.ExitStatus == nil || *en.SSH.ExitStatus != 0 {
			t.Errorf("audit line of %s: exit status %v, want 0", en.SSH.Command, en.SSH.ExitStatus)
		}
		if en.BytesIn <= 0 || en.BytesOut <= 0 {
			t.Errorf("audit line of %s: bytesIn %d, bytesOut %d; want both > 0", en.SSH.Command, en.BytesIn, en.BytesOut)
		}
		if en.Duration <= 0 {
			t.Errorf("audit line of %s: duration %s", en.SSH.Command, en.Duration)
		}
	}
	if pushes != 1 || fetches != 4 {
		t.Errorf("audit: %d pushes and %d fetches, want 1 and 4:\n%s", pushes, fetches, e.audit.dump())
	}
}
