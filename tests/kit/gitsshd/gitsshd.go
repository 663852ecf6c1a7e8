// Package gitsshd is a real OpenSSH server (Debian's sshd) serving bare git
// repositories through git-shell on loopback, for tests of edge's SSH
// front: the upstream a task's git reaches through edge, and directly for
// comparison.
//
// How it runs. The server owns its listener and starts, for each
// connection it accepts, one sshd in inetd mode (sshd -i) with the
// connection as its stdin and stdout: the port is bound before Start
// returns, so no other process can take it, and the server counts
// connections. That sshd needs its login user in /etc/passwd and its
// privilege separation directory /run/sshd, and the host is left as it is:
// each sshd starts in a mount namespace of its own, where the server's
// copies of passwd and group (the host's, with the login user added) are
// bound over /etc/passwd and /etc/group and a tmpfs holds /run. It is also
// the first process of a PID namespace of its own, so killing it ends
// every process the connection started, sessions included (sshd starts a
// session in a session of its own, out of its process group).
//
// The login user has the password field "*" (no password; "!" would be a
// locked account, which sshd refuses even with a valid key) and /bin/sh as
// its shell: sshd runs a ForceCommand through the login shell, and
// git-shell as the login shell would refuse the command. The forced
// command is the server's script: it records SSH_ORIGINAL_COMMAND
// (Commands) and runs git-shell on it, so a session runs exactly what
// git-shell allows, git-upload-pack, git-receive-pack and
// git-upload-archive on a repository, and refuses a shell or any other
// command as git-shell does. Repository paths are relative to the
// repositories root (the login user's home): git@host:org/repo.git, and, as
// on GitHub, ssh://git@host/org/repo.git, whose leading slash the script
// drops. GIT_PROTOCOL is accepted, so git speaks protocol v2 as it does
// with GitHub.
//
// The server needs root (as the tests of edge's SSH front run), and on the
// machine /usr/sbin/sshd with its privilege separation user (openssh-server
// makes both), git-shell and mount. It lives under tests/: nothing outside
// tests imports it.
package gitsshd

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	mathrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/runfleet/runfleet/tests/kit/await"
)

// SSHD is the server the harness runs.
const SSHD = "/usr/sbin/sshd"

// The login user's uid (its gid is the same number) is the first in this
// range that neither the host's passwd nor its group uses.
const (
	firstID = 60000
	lastID  = 64999
)

// addrTries bounds the random loopback addresses tried for port 22.
const addrTries = 8

// Options configure a server; the zero value is usable.
type Options struct {
	// Addr is where the server listens, "ip:port". "" means port 22 on a
	// random loopback address 127.a.b.c: edge dials the port the policy
	// domain names, and git's scp-like URLs (git@github.com:org/repo.git)
	// mean port 22.
	Addr string
	// User is the login user; "" means "git".
	User string
	// AuthorizedKeys may log in as User; Authorize adds keys later.
	AuthorizedKeys []ssh.PublicKey
	// HostKey is the server's host key: an ed25519.PrivateKey, an
	// *ecdsa.PrivateKey or an *rsa.PrivateKey. Nil means a new ed25519
	// key. It is not an ssh.Signer because sshd reads the private key from
	// a file and an ssh.Signer does not give its key up.
	HostKey crypto.Signer
}

// Server is a running server. Its methods are safe for concurrent use.
type Server struct {
	addr     netip.AddrPort
	user     string
	id       int // the login user's uid and gid
	hostKey  ssh.PublicKey
	dir      string // the server's files; every user can traverse it
	root     string // the repositories, the login user's home
	config   string
	passwd   string
	group    string
	keysFile string
	cmdLog   string
	log      *os.File // sshd's stderr, every connection's

	ln     net.Listener
	served chan struct{} // closed when the accept loop has returned

	accepted atomic.Int64
	ended    atomic.Int64 // connections whose sshd has exited or never started

	keysMu sync.Mutex // serialises appends to keysFile

	mu      sync.Mutex
	running map[*exec.Cmd]struct{}
	wg      sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// Start starts a server that Close stops when the test ends; a test that
// failed has sshd's log (Log) in its output.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := StartE(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gitsshd %s: sshd's log:\n%s", s.addr, s.Log())
		}
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// StartE starts a server for a caller without a test (TestMain, a
// benchmark's child), which must Close it.
func StartE(opts Options) (_ *Server, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("gitsshd: sshd runs as root, and so must the tests that start it")
	}
	gitShell, err := exec.LookPath("git-shell")
	if err != nil {
		return nil, fmt.Errorf("gitsshd: %w", err)
	}
	if opts.User == "" {
		opts.User = "git"
	}
	if opts.HostKey == nil {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		opts.HostKey = priv
	}
	hostPub, err := ssh.NewPublicKey(opts.HostKey.Public())
	if err != nil {
		return nil, fmt.Errorf("gitsshd: host key: %w", err)
	}
	hostPEM, err := ssh.MarshalPrivateKey(opts.HostKey, "")
	if err != nil {
		return nil, fmt.Errorf("gitsshd: host key: %w", err)
	}

	dir, err := os.MkdirTemp("", "gitsshd-")
	if err != nil {
		return nil, err
	}
	s := &Server{
		user:     opts.User,
		hostKey:  hostPub,
		dir:      dir,
		root:     filepath.Join(dir, "repos"),
		config:   filepath.Join(dir, "sshd_config"),
		passwd:   filepath.Join(dir, "passwd"),
		group:    filepath.Join(dir, "group"),
		keysFile: filepath.Join(dir, "authorized_keys"),
		cmdLog:   filepath.Join(dir, "commands.log"),
		served:   make(chan struct{}),
		running:  map[*exec.Cmd]struct{}{},
	}
	defer func() {
		if err != nil {
			if s.log != nil {
				s.log.Close()
			}
			os.RemoveAll(dir)
		}
	}()
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(s.root, 0o755); err != nil {
		return nil, err
	}
	if s.id, err = s.writeAccounts(); err != nil {
		return nil, err
	}
	hostKeyFile := filepath.Join(dir, "host_key")
	script := filepath.Join(dir, "session.sh")
	files := []struct {
		path string
		mode fs.FileMode
		data []byte
	}{
		{hostKeyFile, 0o600, pem.EncodeToMemory(hostPEM)},
		{s.keysFile, 0o644, authorizedKeys(opts.AuthorizedKeys)},
		{script, 0o755, []byte(sessionScript(s.cmdLog, gitShell))},
		{s.cmdLog, 0o644, nil},
		{s.config, 0o644, []byte(sshdConfig(hostKeyFile, s.keysFile, s.user, script))},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return nil, err
		}
	}
	if err := os.Chown(s.cmdLog, s.id, s.id); err != nil {
		return nil, err
	}
	if s.log, err = os.OpenFile(filepath.Join(dir, "sshd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
		return nil, err
	}

	check := s.sshd("-t", "-f", s.config)
	var out bytes.Buffer
	check.Stdout, check.Stderr = &out, &out
	if err := check.Run(); err != nil {
		return nil, fmt.Errorf("gitsshd: sshd -t: %v\n%s", err, out.Bytes())
	}

	if s.ln, err = listen(opts.Addr); err != nil {
		return nil, fmt.Errorf("gitsshd: %w", err)
	}
	s.addr = s.ln.Addr().(*net.TCPAddr).AddrPort()
	go s.serve()
	return s, nil
}

// listen binds addr, or with addr "" port 22 on a random loopback address
// (never 127.0.0.1, which other servers are likelier to hold).
func listen(addr string) (net.Listener, error) {
	if addr != "" {
		return net.Listen("tcp", addr)
	}
	var err error
	for range addrTries {
		ip := netip.AddrFrom4([4]byte{127, byte(1 + mathrand.IntN(254)), byte(1 + mathrand.IntN(254)), byte(1 + mathrand.IntN(254))})
		var ln net.Listener
		if ln, err = net.Listen("tcp", netip.AddrPortFrom(ip, 22).String()); err == nil {
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, err
		}
	}
	return nil, err
}

// writeAccounts writes the passwd and group sshd sees: the host's, without
// any entry of the login user's name, and the login user with a uid (and
// group of the same gid) the host does not use. It returns that id.
func (s *Server) writeAccounts() (int, error) {
	passwd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return 0, err
	}
	group, err := os.ReadFile("/etc/group")
	if err != nil {
		return 0, err
	}
	used := map[int]bool{}
	var keep [2][]string
	for i, file := range [][]byte{passwd, group} {
		for _, line := range strings.Split(strings.TrimRight(string(file), "\n"), "\n") {
			fields := strings.Split(line, ":")
			if len(fields) > 2 {
				if n, err := strconv.Atoi(fields[2]); err == nil {
					used[n] = true
				}
			}
			if i == 0 && len(fields) > 3 {
				if n, err := strconv.Atoi(fields[3]); err == nil {
					used[n] = true
				}
			}
			if fields[0] != s.user {
				keep[i] = append(keep[i], line)
			}
		}
	}
	id := firstID
	for used[id] {
		if id++; id > lastID {
			return 0, fmt.Errorf("gitsshd: every id in %d-%d is the host's", firstID, lastID)
		}
	}
	keep[0] = append(keep[0], fmt.Sprintf("%s:*:%d:%d:gitsshd:%s:/bin/sh", s.user, id, id, s.root))
	keep[1] = append(keep[1], fmt.Sprintf("%s:x:%d:", s.user, id))
	for i, path := range []string{s.passwd, s.group} {
		if err := os.WriteFile(path, []byte(strings.Join(keep[i], "\n")+"\n"), 0o644); err != nil {
			return 0, err
		}
	}
	return id, nil
}

// sshdConfig is the whole configuration: nothing of the host's
// /etc/ssh/sshd_config applies.
func sshdConfig(hostKey, keysFile, user, script string) string {
	return fmt.Sprintf(`HostKey %s
AuthorizedKeysFile %s
AuthorizedPrincipalsFile none
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
PermitRootLogin no
AllowUsers %s
LogLevel VERBOSE
UseDNS no
ForceCommand %s
AcceptEnv GIT_PROTOCOL
DisableForwarding yes
AllowTcpForwarding no
AllowAgentForwarding no
AllowStreamLocalForwarding no
X11Forwarding no
PermitTunnel no
PermitTTY no
PermitUserRC no
PermitUserEnvironment no
PrintMotd no
PrintLastLog no
`, hostKey, keysFile, user, script)
}

// sessionScript is every session's forced command. An empty command (a
// shell) goes to git-shell without -c, which refuses it as a login shell
// would; a path of a git command with a leading slash loses it.
func sessionScript(cmdLog, gitShell string) string {
	return `#!/bin/sh
printf '%s\n' "$SSH_ORIGINAL_COMMAND" >> ` + shellQuote(cmdLog) + `
cmd=$SSH_ORIGINAL_COMMAND
case $cmd in
"git-"*" '/"* | "git "*" '/"*) cmd="${cmd%%" '/"*} '${cmd#*" '/"}" ;;
esac
if [ -z "$cmd" ]; then
	exec ` + shellQuote(gitShell) + `
fi
exec ` + shellQuote(gitShell) + ` -c "$cmd"
`
}

// nsScript prepares the mount namespace sshd sees, then becomes sshd. Its
// arguments: passwd, group, then sshd's.
const nsScript = `set -e
passwd=$1 group=$2
shift 2
mount --bind "$passwd" /etc/passwd
mount --bind "$group" /etc/group
mount -t tmpfs -o mode=0755,size=1m gitsshd-run /run
mkdir -m 0755 /run/sshd
exec ` + SSHD + ` "$@"`

// sshd is a command running sshd with args in namespaces of its own (see
// the package's doc); stderr goes to the server's log.
func (s *Server) sshd(args ...string) *exec.Cmd {
	cmd := exec.Command("/bin/sh", append([]string{"-c", nsScript, "gitsshd", s.passwd, s.group}, args...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stderr = s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:   syscall.CLONE_NEWPID,
		Unshareflags: syscall.CLONE_NEWNS, // and so / made private, recursively
		// No Pdeathsig: it fires when the thread that started the process
		// exits, and edge's code ends threads it locked to enter
		// namespaces.
	}
	return cmd
}

func (s *Server) serve() {
	defer close(s.served)
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.logf("accept: %v", err)
			}
			return
		}
		s.accepted.Add(1)
		s.handle(c.(*net.TCPConn))
	}
}

// handle starts the connection's sshd, which holds the only copy of the
// connection once it runs.
func (s *Server) handle(c *net.TCPConn) {
	f, err := c.File()
	c.Close()
	if err != nil {
		s.logf("connection: %v", err)
		s.ended.Add(1)
		return
	}
	defer f.Close()
	cmd := s.sshd("-i", "-e", "-f", s.config)
	cmd.Stdin, cmd.Stdout = f, f
	if err := cmd.Start(); err != nil {
		s.logf("starting sshd: %v", err)
		s.ended.Add(1)
		return
	}
	s.mu.Lock()
	s.running[cmd] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		cmd.Wait() // its failures are in the log
		s.mu.Lock()
		delete(s.running, cmd)
		s.mu.Unlock()
		s.ended.Add(1)
	}()
}

// logf adds a line of the harness's own to the log.
func (s *Server) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "gitsshd: "+format+"\n", args...)
}

// Close stops listening, kills every connection's sshd with all it started
// and removes the server's files, repositories included. Once it returns
// no process of the server's is left.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.ln.Close()
		<-s.served
		s.mu.Lock()
		for cmd := range s.running {
			// The first process of its PID namespace: the kernel kills
			// the rest, and Wait returns once they are gone.
			cmd.Process.Kill()
		}
		s.mu.Unlock()
		s.wg.Wait()
		s.log.Close()
		s.closeErr = os.RemoveAll(s.dir)
	})
	return s.closeErr
}

// Addr is where the server listens.
func (s *Server) Addr() netip.AddrPort { return s.addr }

// User is the login user.
func (s *Server) User() string { return s.user }

// HostKey is the server's public host key.
func (s *Server) HostKey() ssh.PublicKey { return s.hostKey }

// KnownHostsLine is the known_hosts line for the server's host key under
// name at port: "name ssh-ed25519 AAAA..." for port 22, "[name]:port
// ssh-ed25519 AAAA..." otherwise.
func (s *Server) KnownHostsLine(name string, port int) string {
	return knownhosts.Line([]string{net.JoinHostPort(name, strconv.Itoa(port))}, s.hostKey)
}

// URL is the repository at path as a client reaching the server directly
// names it: git@ip:path when the server listens on port 22,
// ssh://git@ip:port/path otherwise.
func (s *Server) URL(path string) string {
	if s.addr.Port() == 22 {
		host := s.addr.Addr().String()
		if s.addr.Addr().Is6() {
			host = "[" + host + "]"
		}
		return s.user + "@" + host + ":" + path
	}
	return "ssh://" + s.user + "@" + s.addr.String() + "/" + path
}

// Authorize lets keys log in too, from the next authentication on.
func (s *Server) Authorize(keys ...ssh.PublicKey) error {
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	f, err := os.OpenFile(s.keysFile, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(authorizedKeys(keys)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func authorizedKeys(keys []ssh.PublicKey) []byte {
	var b bytes.Buffer
	for _, k := range keys {
		b.Write(ssh.MarshalAuthorizedKey(k))
	}
	return b.Bytes()
}

// Connections is how many TCP connections the server has accepted.
func (s *Server) Connections() int { return int(s.accepted.Load()) }

// Commands are the commands sessions asked for (SSH_ORIGINAL_COMMAND), in
// the order they ran, refused ones included; a shell is "". A session's
// command is here before git-shell runs it. Each is one line of a log, so
// a command with a newline in it reads as two.
func (s *Server) Commands() []string {
	b, err := os.ReadFile(s.cmdLog)
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// Log is what sshd has written to stderr, of every connection so far, and
// the harness's own lines ("gitsshd: ..."). sshd logs a connection's end
// after its client may have gone: WaitIdle first to read all of it.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.log.Name())
	return string(b)
}

// WaitIdle waits until the sshd of every connection accepted so far has
// exited, so Log and Commands hold all they ever will of them.
func (s *Server) WaitIdle(t await.TB) {
	t.Helper()
	await.Cond(t, await.Limit, "the sshd of every connection to "+s.addr.String()+" to exit", func() bool {
		return s.ended.Load() == s.accepted.Load()
	})
}

// RepoDir is the host directory of the repository at path.
func (s *Server) RepoDir(path string) string { return filepath.Join(s.root, path) }

// NewRepo creates a bare repository at path ("org/repo.git"; directories
// are made as needed) with one commit on main, a README, and returns its
// host directory. The login user owns it, so pushes land.
func (s *Server) NewRepo(t testing.TB, path string) string {
	t.Helper()
	return s.newRepo(t, path, -1)
}

// NewRepoOfSize is NewRepo with a file "data" of size random
// (incompressible) bytes in the commit too. The repository holds it in a
// pack deflated at level 0, which git serves as it is: a clone costs the
// transfer and the client's work, not the server's zlib (50 MiB: about
// half a second).
func (s *Server) NewRepoOfSize(t testing.TB, path string, size int64) string {
	t.Helper()
	return s.newRepo(t, path, size)
}

func (s *Server) newRepo(t testing.TB, path string, size int64) string {
	t.Helper()
	if !filepath.IsLocal(path) {
		t.Fatalf("gitsshd: repository path %q is not below the repositories root", path)
	}
	dest := s.RepoDir(path)
	if _, err := os.Lstat(dest); err == nil {
		t.Fatalf("gitsshd: repository %s exists", path)
	}
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("A repository of gitsshd's: "+path+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if size >= 0 {
		writeRandom(t, filepath.Join(work, "data"), size)
	}
	runGit(t, work, "init", "-q", "-b", "main")
	runGit(t, work, "add", ".")
	runGit(t, work, "commit", "-q", "-m", "gitsshd: "+path)
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		t.Fatal(err)
	}
	runGit(t, work, "repack", "-a", "-d", "-q")
	runGit(t, s.root, "clone", "-q", "--bare", work, dest)
	runGit(t, dest, "remote", "remove", "origin")
	err := filepath.WalkDir(dest, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, s.id, s.id)
	})
	for p := filepath.Dir(dest); err == nil && p != s.root; p = filepath.Dir(p) {
		err = os.Chown(p, s.id, s.id)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dest
}

// writeRandom writes size bytes of a ChaCha8 stream, as incompressible as
// crypto/rand's and faster.
func writeRandom(t testing.TB, path string, size int64) {
	t.Helper()
	var seed [32]byte
	rand.Read(seed[:])
	src := mathrand.NewChaCha8(seed)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		buf = buf[:min(int64(len(buf)), left)]
		src.Read(buf)
		if _, err := f.Write(buf); err != nil {
			f.Close()
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// Head is the commit the branch points to in the repository at path, ""
// if there is no such branch: what a test reads to tell a push landed.
func (s *Server) Head(t testing.TB, path, branch string) string {
	t.Helper()
	cmd := gitCommand(s.RepoDir(path), "rev-parse", "-q", "--verify", "refs/heads/"+branch+"^{commit}")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if exit, ok := errors.AsType[*exec.ExitError](err); ok && exit.ExitCode() == 1 && stderr.Len() == 0 {
			return ""
		}
		t.Fatalf("gitsshd: git rev-parse %s in %s: %v\n%s", branch, path, err, stderr.Bytes())
	}
	return strings.TrimSpace(string(out))
}

// gitCommand is git run by the harness: as root on repositories the login
// user owns (safe.directory), with no configuration of the host's, and
// storing objects uncompressed (the random data would not compress).
func gitCommand(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", append([]string{"-c", "safe.directory=*", "-c", "core.compression=0"}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=/nonexistent",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=gitsshd",
		"GIT_AUTHOR_EMAIL=gitsshd@example.invalid",
		"GIT_COMMITTER_NAME=gitsshd",
		"GIT_COMMITTER_EMAIL=gitsshd@example.invalid",
	}
	return cmd
}

func runGit(t testing.TB, dir string, args ...string) {
	t.Helper()
	if out, err := gitCommand(dir, args...).CombinedOutput(); err != nil {
		t.Fatalf("gitsshd: git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// NewClientKey is a new ed25519 client key, as a signer and as an OpenSSH
// private key file's contents (what ssh -i reads, and edge's secrets hold).
func NewClientKey(t testing.TB) (signer ssh.Signer, privatePEM []byte) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if signer, err = ssh.NewSignerFromKey(priv); err != nil {
		t.Fatal(err)
	}
	return signer, pem.EncodeToMemory(block)
}

// SSHArgs is the command line of an OpenSSH client that reaches the server
// directly with the key privatePEM (OpenSSH format, as NewClientKey's) and
// nothing else (no agent, no configuration or known hosts of root's),
// trusting exactly the server's host key at its address; the destination
// (User()@Addr().Addr()) and command are the caller's to append.
func (s *Server) SSHArgs(t testing.TB, privatePEM []byte) []string {
	t.Helper()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id")
	knownHosts := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(keyFile, privatePEM, 0o600); err != nil {
		t.Fatal(err)
	}
	line := s.KnownHostsLine(s.addr.Addr().String(), int(s.addr.Port())) + "\n"
	if err := os.WriteFile(knownHosts, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{
		"ssh", "-F", "/dev/null",
		"-i", keyFile,
		"-o", "IdentitiesOnly=yes",
		"-o", "IdentityAgent=none",
		"-o", "BatchMode=yes",
		"-o", "UserKnownHostsFile=" + knownHosts,
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "UpdateHostKeys=no",
		"-p", strconv.Itoa(int(s.addr.Port())),
	}
}

// GitEnv is a git client's environment with nothing of the host's
// configuration (a fresh HOME, no system or global config, a fixed
// author), plus extra: what the tests' own git runs with, so a setting of
// the machine's never decides a result.
func GitEnv(t testing.TB, extra ...string) []string {
	return append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + t.TempDir(),
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=test",
		"GIT_AUTHOR_EMAIL=test@example.invalid",
		"GIT_COMMITTER_NAME=test",
		"GIT_COMMITTER_EMAIL=test@example.invalid",
	}, extra...)
}

// DirectGitEnv is the environment (GIT_SSH_COMMAND, SSHArgs quoted) to add
// to a git command that reaches the server directly, not through edge, at
// URL(path) or git@ip:path.
func (s *Server) DirectGitEnv(t testing.TB, privatePEM []byte) []string {
	t.Helper()
	args := s.SSHArgs(t, privatePEM)
	for i, a := range args {
		args[i] = shellQuote(a)
	}
	return []string{"GIT_SSH_COMMAND=" + strings.Join(args, " ")}
}

// shellQuote is s as one word for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
