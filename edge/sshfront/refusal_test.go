package sshfront

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/gitsshd"
)

// noUpstream checks that nothing the test did reached the upstream: no
// connection, so no command either.
func (e *env) noUpstream(t *testing.T) {
	t.Helper()
	if n := e.up.Connections(); n != 0 {
		t.Errorf("the upstream got %d connections, want none; sshd's log:\n%s", n, e.up.Log())
	}
	if n := e.dialer.dials.Load(); n != 0 {
		t.Errorf("the front dialled the upstream %d times, want never", n)
	}
	if c := e.up.Commands(); len(c) != 0 {
		t.Errorf("the upstream ran %q", c)
	}
}

// localRepo is a repository of one commit, with origin the URL, to push
// from.
func localRepo(t *testing.T, env []string, origin string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "local")
	mustRun(t, "", env, "git", "init", "-q", "-b", "main", dir)
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("local\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, dir, env, "git", "add", "f")
	mustRun(t, dir, env, "git", "commit", "-q", "-m", "local")
	mustRun(t, dir, env, "git", "remote", "add", "origin", origin)
	return dir
}

func TestPushIsRefusedWhereOnlyFetchIsAllowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{allow: []string{policy.GitUploadPack}})
	e.up.NewRepo(t, "org/repo.git")
	before := e.up.Head(t, "org/repo.git", "main")
	env := e.gitEnv()
	dir := localRepo(t, env, url("org/repo.git"))

	r := run(t, dir, env, "git", "push", "origin", "main:topic")
	const refusal = "runfleet: git-receive-pack is not allowed for key GIT_SSH on git.example"
	if r.code == 0 || !strings.Contains(r.stderr, refusal+"\n") {
		t.Fatalf("git push: %s; want a failure saying %q", r, refusal)
	}
	e.noUpstream(t)
	if got := e.up.Head(t, "org/repo.git", "topic"); got != "" {
		t.Errorf("topic upstream is %s after a refused push", got)
	}
	en := e.audit.await(t, "of the refused push", entryFor(audit.Blocked, policy.GitReceivePack, "org/repo"))
	if !slices.Equal(en.Keys, []string{keyRef.String()}) || en.Reason != strings.TrimPrefix(refusal, "runfleet: ") ||
		en.SSH.ExitStatus == nil || *en.SSH.ExitStatus != 1 || en.Status != 403 {
		t.Errorf("the refusal's audit line: %+v %+v", en, *en.SSH)
	}

	// Fetching is what the key allows.
	mustRun(t, "", env, "git", "clone", "-q", url("org/repo.git"), filepath.Join(t.TempDir(), "clone"))
	if e.up.Connections() != 1 {
		t.Errorf("the upstream got %d connections for one clone", e.up.Connections())
	}
	if got := e.up.Head(t, "org/repo.git", "main"); got != before {
		t.Errorf("main moved")
	}
}

func TestARepositoryOutsideRepositoriesIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{repositories: []string{"org/allowed", "team/*"}})
	e.up.NewRepo(t, "org/allowed.git")
	e.up.NewRepo(t, "org/other.git")
	env := e.gitEnv()

	for _, c := range []struct{ url, repo string }{
		{url("org/other.git"), "org/other"},
		{url("/org/other"), "org/other"},
		{"ssh://git@" + hostName + "/org/other.git", "org/other"},
		{url("org/allowed/sub.git"), "org/allowed/sub"},
		{url("team/a/b.git"), "team/a/b"},
	} {
		r := run(t, "", env, "git", "clone", "-q", c.url, filepath.Join(t.TempDir(), "clone"))
		want := "runfleet: repository " + c.repo + " is not one key GIT_SSH may reach on git.example\n"
		if r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("clone %s: %s; want %q", c.url, r, want)
		}
		e.audit.await(t, "of the refused clone of "+c.repo, entryFor(audit.Blocked, policy.GitUploadPack, c.repo))
	}
	// ssh:// URLs name the port; git names the host git.example there too.
	e.noUpstream(t)

	mustRun(t, "", env, "git", "clone", "-q", url("org/allowed.git"), filepath.Join(t.TempDir(), "allowed"))
	e.up.WaitIdle(t)
	if got := e.up.Commands(); !slices.Equal(got, []string{"git-upload-pack 'org/allowed.git'"}) {
		t.Errorf("upstream commands %q", got)
	}
}

// TestAShellAndOtherCommandsAreRefused: ssh to the host with no command
// (a shell), with a command that is not git's, with shell syntax after a
// git command, and sftp: each refused on its channel with the reason, and
// none reaches the upstream.
func TestAShellAndOtherCommandsAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	e.up.NewRepo(t, "org/repo.git")
	dest := "git@" + hostName
	for _, c := range []struct {
		argv    []string
		refusal string
		match   func(audit.Entry) bool
	}{
		{append(e.sshArgs(), dest), "runfleet: a shell is not allowed: only git commands run over SSH here\n", entryRequest("shell")},
		{append(e.sshArgs(), "-T", dest), "runfleet: a shell is not allowed: only git commands run over SSH here\n", entryRequest("shell")},
		{append(e.sshArgs(), dest, "id"),
			`runfleet: only git commands run over SSH here: "id" is not a git command (git-upload-pack, git-receive-pack, git-upload-archive, git-lfs-authenticate)` + "\n",
			func(en audit.Entry) bool { return en.SSH != nil && en.SSH.Command == `"id"` }},
		{append(e.sshArgs(), dest, "git-upload-pack 'org/repo.git'; id"),
			`runfleet: only git commands run over SSH here: the command line holds ';' outside quotes, which no git command sends` + "\n",
			func(en audit.Entry) bool { return en.SSH != nil && en.SSH.Command == `"git-upload-pack"` }},
		{append(e.sshArgs(), "-s", dest, "sftp"),
			`runfleet: the "sftp" subsystem is not allowed: only git commands run over SSH here` + "\n", entryRequest(`subsystem sftp`)},
	} {
		r := run(t, "", gitsshd.GitEnv(t), c.argv...)
		if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, c.refusal) {
			t.Errorf("%q: %s; want exit 1 and %q", c.argv[len(c.argv)-2:], r, c.refusal)
		}
		en := e.audit.await(t, "of "+strings.Join(c.argv[len(c.argv)-2:], " "), c.match)
		if en.Action != audit.Blocked || en.SSH.ExitStatus == nil || *en.SSH.ExitStatus != 1 {
			t.Errorf("audit line %+v %+v", en, *en.SSH)
		}
	}

	// sftp itself (it runs ssh -s ... sftp) fails the same way.
	sftp := []string{"sftp", "-F", "/dev/null", "-P", e.port(), "-b", "/dev/null"}
	for i := 3; i < len(e.sshArgs()); i += 2 {
		if e.sshArgs()[i] == "-o" {
			sftp = append(sftp, "-o", e.sshArgs()[i+1])
		}
	}
	r := run(t, "", gitsshd.GitEnv(t), append(sftp, dest)...)
	if want := `runfleet: the "sftp" subsystem is not allowed`; r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Errorf("sftp: %s; want a failure saying %q", r, want)
	}
	e.noUpstream(t)
}

// TestForwardingIsRefused: -L, -D and -W (direct-tcpip channels), unix
// socket forwarding, -R (tcpip-forward) and other channel types are all
// refused with their reason, and audited.
func TestForwardingIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	c := e.dial()

	const reason = "runfleet: port forwarding (ssh -L, -D) is not allowed: only git commands run over SSH here"
	_, err := c.Dial("tcp", e.up.Addr().String())
	var oce *ssh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != ssh.Prohibited || oce.Message != reason {
		t.Errorf("a direct-tcpip channel (-L, -D): %v; want it prohibited with %q", err, reason)
	}
	_, err = c.Dial("unix", "/run/some.sock")
	if !errors.As(err, &oce) || oce.Reason != ssh.Prohibited || oce.Message != reason {
		t.Errorf("a direct-streamlocal channel: %v; want it prohibited with %q", err, reason)
	}
	if l, err := c.Listen("tcp", "127.0.0.1:0"); err == nil {
		l.Close()
		t.Error("a remote forward (-R) was granted")
	}
	if l, err := c.ListenUnix("/tmp/runfleet-never.sock"); err == nil {
		l.Close()
		t.Error("a remote unix socket forward was granted")
	}
	if _, _, err := c.OpenChannel("x11", nil); !errors.As(err, &oce) || oce.Reason != ssh.UnknownChannelType {
		t.Errorf("an x11 channel: %v", err)
	}
	e.audit.await(t, "of -L", entryRequest("channel direct-tcpip"))
	e.audit.await(t, "of a unix forward", entryRequest("channel direct-streamlocal@openssh.com"))
	e.audit.await(t, "of -R", entryRequest("request tcpip-forward"))
	e.audit.await(t, "of a remote unix forward", entryRequest("request streamlocal-forward@openssh.com"))
	e.audit.await(t, "of an x11 channel", entryRequest(`channel x11`))

	// The connection is still usable: keep-alives are answered (no).
	if ok, _, err := c.SendRequest("keepalive@openssh.com", true, nil); err != nil || ok {
		t.Errorf("a keep-alive: %v, %v", ok, err)
	}

	// OpenSSH's -W: the channel fails with the reason.
	r := run(t, "", gitsshd.GitEnv(t), append(e.sshArgs(), "-W", "127.0.0.1:9", "git@"+hostName)...)
	if r.code == 0 || !strings.Contains(r.stderr, "administratively prohibited: "+reason) {
		t.Errorf("ssh -W: %s", r)
	}
	// OpenSSH's -R, made to fail when refused.
	r = run(t, "", gitsshd.GitEnv(t), append(e.sshArgs(), "-N", "-o", "ExitOnForwardFailure=yes", "-R", "0:127.0.0.1:9", "git@"+hostName)...)
	if r.code == 0 || !strings.Contains(r.stderr, "remote port forwarding failed") {
		t.Errorf("ssh -R: %s", r)
	}

	// OpenSSH's -L: the local port listens; a connection through it is
	// closed at once, its channel refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	argv := append(e.sshArgs(), "-N", "-o", "ExitOnForwardFailure=yes", "-L", "127.0.0.1:"+port+":"+e.up.Addr().String(), "git@"+hostName)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = gitsshd.GitEnv(t)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	var local net.Conn
	await.Cond(t, await.Limit, "ssh -L to listen on "+port, func() bool {
		local, err = net.Dial("tcp", "127.0.0.1:"+port)
		return err == nil
	})
	defer local.Close()
	local.SetReadDeadline(time.Now().Add(await.Limit))
	if n, err := local.Read(make([]byte, 64)); err == nil {
		t.Errorf("a connection through ssh -L read %d bytes", n)
	}
	await.Cond(t, await.Limit, "ssh -L to say the channel failed", func() bool {
		return strings.Contains(stderr.String(), "administratively prohibited: "+reason)
	})
	e.noUpstream(t)
}

// TestAgentForwardingAPtyAndTheEnvironmentAreRefused: what a session asks
// before its command is refused one by one, audited where it matters; the
// session's command then runs.
func TestAgentForwardingAPtyAndTheEnvironmentAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	e.up.NewRepo(t, "org/repo.git")
	c := e.dial()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := agent.RequestAgentForwarding(s); err == nil {
		t.Error("agent forwarding was granted")
	}
	if err := s.RequestPty("xterm", 40, 80, ssh.TerminalModes{}); err == nil {
		t.Error("a pty was granted")
	}
	if ok, err := s.SendRequest("x11-req", true, ssh.Marshal(struct {
		Single           bool
		Protocol, Cookie string
		Screen           uint32
	}{false, "MIT-MAGIC-COOKIE-1", "00", 0})); err != nil || ok {
		t.Errorf("x11 forwarding: %v, %v", ok, err)
	}
	if err := s.Setenv("LD_PRELOAD", "/tmp/x.so"); err == nil {
		t.Error("an environment variable was accepted")
	}
	var out strings.Builder
	s.Stdout = &out
	s.Stdin = strings.NewReader(flush)
	if err := s.Run("git-upload-pack 'org/repo.git'"); err != nil {
		t.Fatalf("the command after the refused requests: %v", err)
	}
	if !strings.Contains(out.String(), "refs/heads/main") {
		t.Errorf("upload-pack's advertisement: %q", out.String())
	}
	en := e.audit.await(t, "of -A", entryRequest("auth-agent-req@openssh.com"))
	if !strings.Contains(en.Reason, "agent forwarding") {
		t.Errorf("the -A line's reason: %q", en.Reason)
	}
	en = e.audit.await(t, "of the pty", entryRequest("pty-req"))
	if !strings.Contains(en.Reason, "terminal is not allowed") {
		t.Errorf("the pty line's reason: %q", en.Reason)
	}
	e.audit.await(t, "of x11", entryRequest("x11-req"))
	for _, en := range e.audit.all() {
		if en.SSH != nil && (strings.Contains(en.SSH.Request, "env") || strings.Contains(en.Reason, "LD_PRELOAD")) {
			t.Errorf("an audit line of the environment: %+v", en)
		}
	}

	// OpenSSH's -A, with an agent to forward: refused, the command runs.
	sock := filepath.Join(t.TempDir(), "agent.sock")
	agentCmd := exec.Command("ssh-agent", "-D", "-a", sock)
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		agentCmd.Process.Kill()
		agentCmd.Wait()
	}()
	await.Cond(t, await.Limit, "ssh-agent to listen", func() bool {
		_, err := os.Stat(sock)
		return err == nil
	})
	before := len(e.audit.all())
	// IdentityAgent=none would keep ssh from forwarding any agent.
	argv := []string{"ssh", "-A"}
	for i := 1; i < len(e.sshArgs()); i++ {
		if a := e.sshArgs()[i]; a == "-o" && e.sshArgs()[i+1] == "IdentityAgent=none" {
			i++
			continue
		}
		argv = append(argv, e.sshArgs()[i])
	}
	argv = append(argv, "git@"+hostName, "git-upload-pack 'org/repo.git'")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdin = append(gitsshd.GitEnv(t), "SSH_AUTH_SOCK="+sock), strings.NewReader(flush)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "refs/heads/main") {
		t.Errorf("ssh -A: %v\n%s", err, out)
	}
	await.Cond(t, await.Limit, "an audit line of ssh -A", func() bool {
		return slices.ContainsFunc(e.audit.all()[before:], entryRequest("auth-agent-req@openssh.com"))
	})

	// OpenSSH's -t: a terminal it asked for and did not get ends its
	// session (OpenSSH's own rule); a refusal all the same.
	r := run(t, "", gitsshd.GitEnv(t), append(e.sshArgs(), "-t", "-t", "git@"+hostName, "git-upload-pack 'org/repo.git'")...)
	if r.code == 0 || !strings.Contains(r.stderr, "PTY allocation request failed") {
		t.Errorf("ssh -tt: %s", r)
	}
}

// TestOneConnectionOutlivesItsRefusals: a refused command ends its own
// channel; the connection's next command, allowed, runs, on one upstream
// connection however many commands the key runs.
func TestOneConnectionOutlivesItsRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{allow: []string{policy.GitUploadPack}})
	e.up.NewRepo(t, "org/repo.git")
	c := e.dial()

	r := execOn(t, c, "git-receive-pack 'org/repo.git'", "")
	if r.code != 1 || r.stdout != "" || r.stderr != "runfleet: git-receive-pack is not allowed for key GIT_SSH on git.example\n" {
		t.Errorf("the refused push: %s", r)
	}
	e.noUpstream(t)
	for i := range 2 {
		r = execOn(t, c, "git-upload-pack 'org/repo.git'", flush)
		if r.code != 0 || !strings.Contains(r.stdout, "refs/heads/main") || r.stderr != "" {
			t.Errorf("fetch %d after the refusal: %s", i, r)
		}
		r = execOn(t, c, "id", "")
		if r.code != 1 || !strings.HasPrefix(r.stderr, "runfleet: only git commands run over SSH here") {
			t.Errorf("id: %s", r)
		}
	}
	if n := e.up.Connections(); n != 1 {
		t.Errorf("the upstream got %d connections for one task connection", n)
	}
}

// TestAnUpstreamWhoseHostKeyIsNotKnownIsRefused: the front never trusts
// on first use: an upstream presenting a key knownHosts does not list is
// left before authentication, the task told which key it presented.
func TestAnUpstreamWhoseHostKeyIsNotKnownIsRefused(t *testing.T) {
	t.Parallel()
	other, _ := gitsshd.NewClientKey(t)
	e := newEnv(t, options{knownHosts: []string{hostName + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(other.PublicKey())))}})
	e.up.NewRepo(t, "org/repo.git")

	r := run(t, "", e.gitEnv(), "git", "clone", "-q", url("org/repo.git"), filepath.Join(t.TempDir(), "clone"))
	want := "runfleet: git.example:22 presented host key ssh-ed25519 " + ssh.FingerprintSHA256(e.up.HostKey()) + ", which knownHosts does not list for it\n"
	if r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Errorf("clone: %s; want %q", r, want)
	}
	en := e.audit.await(t, "of the refused upstream", entryFor(audit.Denied, policy.GitUploadPack, "org/repo"))
	if en.Reason != strings.TrimSuffix(strings.TrimPrefix(want, "runfleet: "), "\n") || en.Status != 502 || !slices.Equal(en.Keys, []string{keyRef.String()}) {
		t.Errorf("audit line %+v", en)
	}
	e.up.WaitIdle(t)
	log := e.up.Log()
	if n := e.up.Connections(); n != 1 {
		t.Errorf("the upstream got %d connections, want the one refused", n)
	}
	if strings.Contains(log, "Accepted publickey") || strings.Contains(log, "Postponed publickey") || strings.Contains(log, "Starting session") {
		t.Errorf("the front went past the host key:\n%s", log)
	}
	if !strings.Contains(log, "[preauth]") {
		t.Errorf("sshd's log does not show the connection ending before authentication:\n%s", log)
	}
	if c := e.up.Commands(); len(c) != 0 {
		t.Errorf("upstream commands %q", c)
	}

	// On one connection, every command of the key is refused the same
	// way, without dialling again.
	c := e.dial()
	for range 2 {
		if r := execOn(t, c, "git-upload-pack 'org/repo.git'", flush); r.code != 1 || r.stderr != want {
			t.Errorf("on one connection: %s", r)
		}
	}
	if n := e.dialer.dials.Load(); n != 2 {
		t.Errorf("the front dialled %d times for two connections", n)
	}
}

// TestARevokedKeyRefusesTheNextCommand: the task's keys are asked at each
// command, so a reload that takes the key away refuses the next one on a
// connection already open.
func TestARevokedKeyRefusesTheNextCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	e.up.NewRepo(t, "org/repo.git")
	c := e.dial()
	if r := execOn(t, c, "git-upload-pack 'org/repo.git'", flush); r.code != 0 {
		t.Fatalf("before: %s", r)
	}
	e.setGranted(nil)
	r := execOn(t, c, "git-upload-pack 'org/repo.git'", flush)
	if want := "runfleet: no ssh key of this task reaches git.example:22 any longer\n"; r.code != 1 || r.stderr != want {
		t.Errorf("after the key was revoked: %s; want %q", r, want)
	}
	e.setPolicy(options{allow: []string{policy.GitReceivePack}})
	r = execOn(t, c, "git-upload-pack 'org/repo.git'", flush)
	if want := "runfleet: git-upload-pack is not allowed for key GIT_SSH on git.example\n"; r.code != 1 || r.stderr != want {
		t.Errorf("after upload-pack was taken out of allow: %s; want %q", r, want)
	}
	if got := e.up.Commands(); len(got) != 1 {
		t.Errorf("upstream commands %q", got)
	}
}

// startUploadPack starts git-upload-pack of repo on a session of c and
// reads its ref advertisement: the session, its stdin, its stdout as read
// so far, and the advertised refs.
func startUploadPack(t *testing.T, c *ssh.Client, repo string) (*ssh.Session, io.WriteCloser, *bufio.Reader, []string) {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := s.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := s.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start("git-upload-pack '" + repo + "'"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(stdout)
	return s, stdin, br, readPktLines(t, br)
}

// readPktLines reads git pkt-lines up to and including a flush.
func readPktLines(t *testing.T, r *bufio.Reader) []string {
	t.Helper()
	var lines []string
	for {
		head := make([]byte, 4)
		if _, err := io.ReadFull(r, head); err != nil {
			t.Fatalf("reading a pkt-line: %v (after %q)", err, lines)
		}
		n, err := strconv.ParseUint(string(head), 16, 16)
		if err != nil {
			t.Fatalf("pkt-line length %q", head)
		}
		if n == 0 {
			return lines
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(r, body); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(body))
	}
}
