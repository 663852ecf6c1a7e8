package gitsshd

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/tests/kit/await"
)

// run runs a command, returning its stdout and stderr and whether it
// succeeded.
func run(t *testing.T, dir string, env []string, argv ...string) (stdout, stderr string, ok bool) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if err != nil {
		if _, exited := errors.AsType[*exec.ExitError](err); !exited {
			t.Fatalf("%s: %v", strings.Join(argv, " "), err)
		}
	}
	return o.String(), e.String(), err == nil
}

// must runs a command that must succeed, returning its stdout.
func must(t *testing.T, dir string, env []string, argv ...string) string {
	t.Helper()
	out, errOut, ok := run(t, dir, env, argv...)
	if !ok {
		t.Fatalf("%s failed:\n%s%s", strings.Join(argv, " "), out, errOut)
	}
	return out
}

func TestCloneLsRemoteAndPushDirectly(t *testing.T) {
	t.Parallel()
	client, key := NewClientKey(t)
	s := Start(t, Options{AuthorizedKeys: []ssh.PublicKey{client.PublicKey()}})
	if s.Addr().Port() != 22 || !s.Addr().Addr().IsLoopback() || s.Addr().Addr().String() == "127.0.0.1" {
		t.Fatalf("Addr %s: want port 22 on a random loopback address", s.Addr())
	}
	s.NewRepo(t, "org/repo.git")
	first := s.Head(t, "org/repo.git", "main")
	if len(first) != 40 {
		t.Fatalf("Head of main: %q", first)
	}
	env := GitEnv(t, s.DirectGitEnv(t, key)...)
	url := s.URL("org/repo.git")
	if want := "git@" + s.Addr().Addr().String() + ":org/repo.git"; url != want {
		t.Fatalf("URL %q, want %q", url, want)
	}

	lsEnv := append(slices.Clone(env), "GIT_TRACE_PACKET=1")
	out, trace, ok := run(t, "", lsEnv, "git", "ls-remote", url)
	if !ok {
		t.Fatalf("ls-remote: %s", trace)
	}
	if want := first + "\trefs/heads/main\n"; !strings.Contains(out, want) {
		t.Errorf("ls-remote gave %q, want a line %q", out, want)
	}
	if !strings.Contains(trace, "< version 2") {
		t.Errorf("git did not speak protocol v2 (GIT_PROTOCOL not accepted?):\n%s", trace)
	}

	work := filepath.Join(t.TempDir(), "repo")
	must(t, "", env, "git", "clone", "-q", url, work)
	if b, err := os.ReadFile(filepath.Join(work, "README")); err != nil || !strings.Contains(string(b), "org/repo.git") {
		t.Fatalf("the clone's README: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(work, "new"), []byte("pushed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	must(t, work, env, "git", "add", "new")
	must(t, work, env, "git", "commit", "-q", "-m", "new")
	must(t, work, env, "git", "push", "-q", "origin", "main", "main:topic")
	pushed := strings.TrimSpace(must(t, work, env, "git", "rev-parse", "HEAD"))
	if got := s.Head(t, "org/repo.git", "main"); got != pushed {
		t.Errorf("after the push, main is %s, want %s", got, pushed)
	}
	if got := s.Head(t, "org/repo.git", "topic"); got != pushed {
		t.Errorf("after the push, topic is %q, want %s", got, pushed)
	}
	if got := s.Head(t, "org/repo.git", "nothing"); got != "" {
		t.Errorf("Head of a branch there is not: %q", got)
	}

	// As on GitHub, an ssh:// URL's absolute path names the same repository.
	sshURL := "ssh://git@" + s.Addr().Addr().String() + "/org/repo.git"
	if out := must(t, "", env, "git", "ls-remote", sshURL, "refs/heads/topic"); !strings.HasPrefix(out, pushed) {
		t.Errorf("ls-remote %s: %q", sshURL, out)
	}

	s.WaitIdle(t)
	want := []string{
		"git-upload-pack 'org/repo.git'",
		"git-upload-pack 'org/repo.git'",
		"git-receive-pack 'org/repo.git'",
		"git-upload-pack '/org/repo.git'",
	}
	if got := s.Commands(); !slices.Equal(got, want) {
		t.Errorf("Commands:\n%q\nwant\n%q", got, want)
	}
	if got := s.Connections(); got != 4 {
		t.Errorf("Connections: %d, want 4", got)
	}
	if log := s.Log(); strings.Count(log, "Accepted publickey for git from 127.") != 4 {
		t.Errorf("sshd's log does not show 4 logins:\n%s", log)
	}
}

func TestAKeyNotAuthorizedIsRefusedUntilAuthorized(t *testing.T) {
	t.Parallel()
	authorized, _ := NewClientKey(t)
	other, otherKey := NewClientKey(t)
	s := Start(t, Options{AuthorizedKeys: []ssh.PublicKey{authorized.PublicKey()}})
	s.NewRepo(t, "repo.git")
	env := GitEnv(t, s.DirectGitEnv(t, otherKey)...)

	dest := filepath.Join(t.TempDir(), "clone")
	_, errOut, ok := run(t, "", env, "git", "clone", "-q", s.URL("repo.git"), dest)
	if ok {
		t.Fatal("a clone with a key not authorized succeeded")
	}
	if !strings.Contains(errOut, "Permission denied (publickey)") {
		t.Errorf("the refused clone's stderr: %s", errOut)
	}
	s.WaitIdle(t)
	log := s.Log()
	if strings.Contains(log, "Accepted publickey") || strings.Contains(log, "Starting session") {
		t.Errorf("the refused key got a session:\n%s", log)
	}
	if !strings.Contains(log, "Connection closed by authenticating user git") {
		t.Errorf("sshd's log does not tell the refusal:\n%s", log)
	}
	if got := s.Commands(); len(got) != 0 {
		t.Errorf("Commands after a refused login: %q", got)
	}

	if err := s.Authorize(other.PublicKey()); err != nil {
		t.Fatal(err)
	}
	must(t, "", env, "git", "clone", "-q", s.URL("repo.git"), dest)
	if got := s.Connections(); got != 2 {
		t.Errorf("Connections: %d, want 2", got)
	}
}

func TestAShellAndOtherCommandsAreRefusedByGitShell(t *testing.T) {
	t.Parallel()
	client, key := NewClientKey(t)
	s := Start(t, Options{AuthorizedKeys: []ssh.PublicKey{client.PublicKey()}})
	s.NewRepo(t, "repo.git")
	dest := s.User() + "@" + s.Addr().Addr().String()
	ssh := append(s.SSHArgs(t, key), dest)

	for _, c := range []struct {
		command []string
		refusal string
	}{
		{nil, "Interactive git shell is not enabled"},
		{[]string{"id"}, "unrecognized command 'id'"},
		{[]string{"git-upload-pack 'repo.git'; id"}, "bad argument"},
		{[]string{"git-upload-pack 'missing.git'"}, "'missing.git' does not appear to be a git repository"},
	} {
		out, errOut, ok := run(t, "", GitEnv(t), append(slices.Clone(ssh), c.command...)...)
		if ok || out != "" || !strings.Contains(errOut, c.refusal) {
			t.Errorf("ssh %q: succeeded %v, stdout %q, stderr %q; want a failure saying %q", c.command, ok, out, errOut, c.refusal)
		}
	}
	s.WaitIdle(t)
	want := []string{"", "id", "git-upload-pack 'repo.git'; id", "git-upload-pack 'missing.git'"}
	if got := s.Commands(); !slices.Equal(got, want) {
		t.Errorf("Commands %q, want %q", got, want)
	}
}

func TestForwardingIsRefused(t *testing.T) {
	t.Parallel()
	client, key := NewClientKey(t)
	s := Start(t, Options{AuthorizedKeys: []ssh.PublicKey{client.PublicKey()}})
	args := append(s.SSHArgs(t, key), "-W", s.Addr().String(), s.User()+"@"+s.Addr().Addr().String())
	if _, errOut, ok := run(t, "", GitEnv(t), args...); ok || !strings.Contains(errOut, "administratively prohibited") {
		t.Errorf("ssh -W: succeeded %v, stderr %q", ok, errOut)
	}
	s.WaitIdle(t)
	if got := s.Commands(); len(got) != 0 {
		t.Errorf("Commands: %q", got)
	}
}

func TestAGivenAddressAndHostKey(t *testing.T) {
	t.Parallel()
	_, hostKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	client, key := NewClientKey(t)
	s := Start(t, Options{Addr: "127.0.0.1:0", User: "gituser", HostKey: hostKey, AuthorizedKeys: []ssh.PublicKey{client.PublicKey()}})
	want, err := ssh.NewPublicKey(hostKey.Public())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.HostKey().Marshal(), want.Marshal()) {
		t.Error("HostKey is not the key given")
	}
	port := int(s.Addr().Port())
	auth := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(want)))
	if got, want := s.KnownHostsLine("127.0.0.1", port), "[127.0.0.1]:"+strconv.Itoa(port)+" "+auth; got != want {
		t.Errorf("KnownHostsLine: %q, want %q", got, want)
	}
	if got, want := s.KnownHostsLine("github.com", 22), "github.com "+auth; got != want {
		t.Errorf("KnownHostsLine: %q, want %q", got, want)
	}
	s.NewRepo(t, "a/b/c.git")
	url := s.URL("a/b/c.git")
	if want := "ssh://gituser@127.0.0.1:" + strconv.Itoa(port) + "/a/b/c.git"; url != want {
		t.Errorf("URL %q, want %q", url, want)
	}
	must(t, "", GitEnv(t, s.DirectGitEnv(t, key)...), "git", "clone", "-q", url, filepath.Join(t.TempDir(), "c"))
}

func TestCloseEndsEverySession(t *testing.T) {
	t.Parallel()
	client, key := NewClientKey(t)
	s, err := StartE(Options{AuthorizedKeys: []ssh.PublicKey{client.PublicKey()}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.NewRepo(t, "repo.git")
	dir := s.dir

	// git-upload-pack advertises and then waits for the client's wants,
	// which never come: a session that stays.
	cmd := exec.Command(s.SSHArgs(t, key)[0], append(s.SSHArgs(t, key)[1:], s.User()+"@"+s.Addr().Addr().String(), "git-upload-pack 'repo.git'")...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	advertised := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(stdout, make([]byte, 4))
		advertised <- err
	}()
	if err := await.Recv(t, "git-upload-pack's advertisement", advertised); err != nil {
		t.Fatal(err)
	}
	if len(serverProcesses(t, dir)) == 0 {
		t.Fatal("no process of the server's while a session is open")
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if left := serverProcesses(t, dir); len(left) != 0 {
		t.Errorf("processes left after Close: %q", left)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := await.Recv(t, "the client to see its connection end", exited); err == nil {
		t.Error("the client's session ended well")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the server's files are left: %v", err)
	}
}

// serverProcesses are the processes whose command line or working
// directory is in dir: sshd (its configuration is there) and its sessions
// (git-upload-pack runs in the repository).
func serverProcesses(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if strings.Contains(string(cmdline), dir) || strings.HasPrefix(cwd, dir) {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return found
}

func TestCloneOf50MiB(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a 50 MiB clone")
	}
	const size = 50 << 20
	client, key := NewClientKey(t)
	s := Start(t, Options{AuthorizedKeys: []ssh.PublicKey{client.PublicKey()}})
	began := time.Now()
	s.NewRepoOfSize(t, "big.git", size)
	made := time.Since(began)
	dest := filepath.Join(t.TempDir(), "big")
	must(t, "", GitEnv(t, s.DirectGitEnv(t, key)...), "git", "clone", "-q", s.URL("big.git"), dest)
	t.Logf("made the repository in %s, cloned it in %s", made, time.Since(began)-made)
	fi, err := os.Stat(filepath.Join(dest, "data"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Errorf("the clone's data: %d bytes, want %d", fi.Size(), size)
	}
}
