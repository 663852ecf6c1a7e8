package sshfront

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/gitsshd"
)

// TestExitStatusAndStreamsAreRelayed: stdout, stderr and the exit status
// come back apart as the upstream gave them; stdin goes up.
func TestExitStatusAndStreamsAreRelayed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	e.up.NewRepo(t, "org/repo.git")
	c := e.dial()

	// A repository the upstream does not have: git's own failure, on
	// stderr, with its status.
	r := execOn(t, c, "git-upload-pack 'org/missing.git'", "")
	if r.code != 128 || r.stdout != "" || !strings.Contains(r.stderr, "'org/missing.git' does not appear to be a git repository") ||
		strings.Contains(r.stderr, "runfleet") {
		t.Errorf("upload-pack of a missing repository: %s; want status 128 and git's message on stderr alone", r)
	}
	en := e.audit.await(t, "of the missing repository", entryFor(audit.Substituted, policy.GitUploadPack, "org/missing"))
	if en.SSH.ExitStatus == nil || *en.SSH.ExitStatus != 128 || en.BytesOut == 0 {
		t.Errorf("its audit line: %+v, exit status %v", en, en.SSH.ExitStatus)
	}

	// The advertisement on stdout alone; the flush on stdin ends it well.
	r = execOn(t, c, "git-upload-pack 'org/repo.git'", flush)
	head := e.up.Head(t, "org/repo.git", "main")
	if r.code != 0 || r.stderr != "" || !strings.HasSuffix(r.stdout, flush) || !strings.Contains(r.stdout, head+" refs/heads/main\n") {
		t.Errorf("upload-pack: %s", r)
	}
	// With stdin closed before the flush, upload-pack sees its client
	// hang up: what stdin carries matters upstream.
	r = execOn(t, c, "git-upload-pack 'org/repo.git'", "")
	if r.code == 0 {
		t.Errorf("upload-pack with no flush: %s; want a failure", r)
	}
	// A want of an object that is not there: git's ERR on stdout.
	r = execOn(t, c, "git-upload-pack 'org/repo.git'", pkt("want "+strings.Repeat("1", 40)+"\n")+flush)
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "not our ref") {
		t.Errorf("upload-pack with an unknown want: %s", r)
	}
}

// pkt is one git pkt-line.
func pkt(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

// TestASignalIsForwarded: the task's signal goes upstream. sshd refuses
// to signal a forced command (gitsshd's, as GitHub's), and says so in its
// log: that line is the signal's arrival.
func TestASignalIsForwarded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	e.up.NewRepo(t, "org/repo.git")
	c := e.dial()
	s, stdin, _, _ := startUploadPack(t, c, "org/repo.git")
	defer s.Close()
	if err := s.Signal(ssh.SIGTERM); err != nil {
		t.Fatal(err)
	}
	await.Cond(t, await.Limit, "sshd to log the signal", func() bool {
		return strings.Contains(e.up.Log(), "refusing to send signal TERM to forced-command session")
	})
	io.WriteString(stdin, flush)
	stdin.Close()
	if err := s.Wait(); err != nil {
		t.Errorf("the session after the signal: %v", err)
	}
}

// TestATaskThatLeavesMidCloneEndsItsUpstream: a task that goes while a
// pack streams to it (its connection dropped, or only the command's
// channel closed) must not leave the upstream's command, its connection
// or the front's Serve behind, whatever the upstream does with its
// stdin's end.
func TestATaskThatLeavesMidCloneEndsItsUpstream(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"connection", "channel"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, options{})
			e.up.NewRepoOfSize(t, "org/big.git", 16<<20)
			c := e.dial()
			s, stdin, br, refs := startUploadPack(t, c, "org/big.git")
			want := strings.Fields(refs[0])[0]
			io.WriteString(stdin, pkt("want "+want+"\n")+flush+pkt("done\n"))
			if _, err := io.ReadFull(br, make([]byte, 64<<10)); err != nil {
				t.Fatalf("the pack's start: %v", err)
			}
			// The task stops reading and goes.
			served := e.served.Load()
			if how == "connection" {
				c.Close()
				if !await.Within(20*time.Second, func() bool { return e.served.Load() == served+1 }) {
					buf := make([]byte, 1<<20)
					t.Fatalf("Serve did not return once the task's connection dropped mid-clone:\n%s", buf[:runtime.Stack(buf, true)])
				}
			} else {
				s.Close()
				if !await.Within(20*time.Second, func() bool {
					return slices.ContainsFunc(e.audit.all(), entryFor(audit.Substituted, policy.GitUploadPack, "org/big"))
				}) {
					buf := make([]byte, 1<<20)
					t.Fatalf("the clone whose channel the task closed did not end:\n%s", buf[:runtime.Stack(buf, true)])
				}
				// The connection serves its next command.
				if r := execOn(t, c, "git-upload-pack 'org/big.git'", flush); r.code != 0 {
					t.Errorf("the next command: %s", r)
				}
				c.Close()
			}
			e.up.WaitIdle(t)
			if n := e.up.Connections(); n != 1 {
				t.Errorf("%d upstream connections, want 1", n)
			}
		})
	}
}

// stallingUpstream is an SSH server that accepts the front's key and
// every exec, then neither reads, writes nor ends: an upstream stalled.
type stallingUpstream struct {
	ln     net.Listener
	key    ssh.Signer
	execs  chan string
	closed chan struct{} // its one connection has ended
}

func startStallingUpstream(t *testing.T, client ssh.PublicKey) *stallingUpstream {
	t.Helper()
	hostKey, _ := gitsshd.NewClientKey(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	u := &stallingUpstream{ln: ln, key: hostKey, execs: make(chan string, 8), closed: make(chan struct{})}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if string(k.Marshal()) != string(client.Marshal()) {
			return nil, errors.New("not the key")
		}
		return nil, nil
	}}
	cfg.AddHostKey(hostKey)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer close(u.closed)
		sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
		if err != nil {
			return
		}
		go ssh.DiscardRequests(reqs)
		go func() {
			for nc := range chans {
				_, creqs, err := nc.Accept()
				if err != nil {
					continue
				}
				go func() {
					for r := range creqs {
						if r.Type == "exec" {
							line, _ := stringPayload(r.Payload)
							u.execs <- line
						}
						r.Reply(r.Type == "exec", nil)
					}
				}()
			}
		}()
		sc.Wait()
	}()
	return u
}

func (u *stallingUpstream) knownHostsLine() string {
	return hostName + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(u.key.PublicKey())))
}

// TestATaskThatLeavesAStalledUpstreamEndsIt: a task whose command's
// upstream stalls, and which then goes, leaves nothing behind: the
// front's upstream connection closes with the task's.
func TestATaskThatLeavesAStalledUpstreamEndsIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	signer, err := ParsePrivateKey(keyRef, secretsValue(string(e.clientPEM)))
	if err != nil {
		t.Fatal(err)
	}
	up := startStallingUpstream(t, signer.PublicKey())
	e.dialer.set(hostName+":22", up.ln.Addr().String())
	e.setPolicy(options{knownHosts: []string{up.knownHostsLine()}})

	c := e.dial()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start("git-upload-pack 'org/repo.git'"); err != nil {
		t.Fatal(err)
	}
	if got := await.Recv(t, "the exec upstream", up.execs); got != "git-upload-pack 'org/repo.git'" {
		t.Errorf("upstream exec %q", got)
	}
	served := e.served.Load()
	c.Close()
	await.Recv(t, "the stalled upstream's connection to close", up.closed)
	await.Cond(t, await.Limit, "Serve to return", func() bool { return e.served.Load() == served+1 })
	e.audit.await(t, "of the command the task left", entryFor(audit.Substituted, policy.GitUploadPack, "org/repo"))
}

// TestAtMostMaxChannelsSessionsAtOnce: one connection holds MaxChannels
// sessions at once; the next is refused as a resource shortage, and a
// session closed makes room.
func TestAtMostMaxChannelsSessionsAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{config: func(c *Config) { c.MaxChannels = 3 }})
	c := e.dial()
	var open []*ssh.Session
	for range 3 {
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, s)
	}
	_, err := c.NewSession()
	var oce *ssh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != ssh.ResourceShortage || oce.Message != "runfleet: at most 3 sessions at once on one connection" {
		t.Fatalf("the 4th session: %v; want a resource shortage", err)
	}
	e.audit.await(t, "of the 4th session", func(en audit.Entry) bool {
		return entryRequest("channel session")(en) && en.Reason == "the connection has 3 sessions open, its bound"
	})
	open[0].Close()
	await.Cond(t, await.Limit, "a closed session to make room", func() bool {
		s, err := c.NewSession()
		if err == nil {
			s.Close()
		}
		return err == nil
	})
	// Other connections have bounds of their own.
	for range 3 {
		if _, err := e.dial().NewSession(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAtMostMaxConnsConnectionsPerTask: a task holds MaxConns connections
// at once; the next is closed unanswered, and audited.
func TestAtMostMaxConnsConnectionsPerTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{config: func(c *Config) { c.MaxConns = 2 }})
	a := e.dial()
	e.dial()
	if c, err := e.dialE(); err == nil {
		c.Close()
		t.Fatal("a third connection was served")
	}
	en := e.audit.await(t, "of the third connection", func(en audit.Entry) bool { return en.Status == 429 })
	if en.Action != audit.Denied || en.Task != taskID || !strings.Contains(en.Reason, "holds 2 SSH connections") {
		t.Errorf("its audit line: %+v", en)
	}
	await.Cond(t, await.Limit, "the refused connection's Serve to return", func() bool { return e.served.Load() == 1 })
	a.Close()
	await.Cond(t, await.Limit, "the first connection's end", func() bool { return e.served.Load() == 2 })
	e.dial()
	// Another task has a bound of its own.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	other := e.session()
	other.Task = "run-2"
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err == nil {
			e.front.Serve(c, other)
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, chans, reqs, err := ssh.NewClientConn(raw, hostName+":22", &ssh.ClientConfig{User: "git", HostKeyCallback: ssh.FixedHostKey(e.front.HostKey())})
	if err != nil {
		t.Fatalf("another task's connection: %v", err)
	}
	ssh.NewClient(sc, chans, reqs).Close()
	await.Recv(t, "the other task's Serve to return", done)
}

// TestAHandshakeThatNeverStartsIsClosed: a connection that sends nothing
// is closed after HandshakeTimeout, and frees its place.
func TestAHandshakeThatNeverStartsIsClosed(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	e := newEnv(t, options{config: func(c *Config) { c.HandshakeTimeout = timeout; c.MaxConns = 1 }})
	for i, what := range []string{"nothing", "a version line alone"} {
		// x/crypto closes the connection as the handshake fails, a moment
		// before Serve gives the task's place back.
		await.Cond(t, await.Limit, "the last connection's Serve to return", func() bool { return e.served.Load() == int64(i) })
		raw, err := net.Dial("tcp", e.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		if what != "nothing" {
			io.WriteString(raw, "SSH-2.0-stalling\r\n")
		}
		got, err := io.ReadAll(raw) // to the front's close; no deadline of ours
		took := time.Since(began)
		raw.Close()
		if err != nil {
			t.Fatalf("%s: %v after %s, having read %q", what, err, took, got)
		}
		if !strings.HasPrefix(string(got), "SSH-2.0-runfleet\r\n") {
			t.Errorf("%s: the front sent %q", what, got)
		}
		// The front's clock starts as it accepts, which may be before
		// the dial returns here.
		if took < timeout*3/4 {
			t.Errorf("%s: closed after %s, before the timeout", what, took)
		}
	}
	e.audit.await(t, "of the timed-out handshake", func(en audit.Entry) bool {
		return en.Action == audit.Denied && en.Status == 400 && strings.Contains(en.Reason, "timed out")
	})
	// Its place is free again (MaxConns is 1), and a handshake that
	// completes is not cut at the timeout.
	await.Cond(t, await.Limit, "the last connection's Serve to return", func() bool { return e.served.Load() == 2 })
	c := e.dial()
	if _, _, err := c.SendRequest("keepalive@openssh.com", true, nil); err != nil {
		t.Fatal(err)
	}
}

// TestAnIdleUpstreamIsClosedAndDialledAgain: an upstream connection is
// kept for the task connection's next commands while they come, never
// closed under a command, and closed once none has used it for
// UpstreamIdle; the next command dials again.
func TestAnIdleUpstreamIsClosedAndDialledAgain(t *testing.T) {
	t.Parallel()
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, options{config: func(c *Config) { c.Clock, c.UpstreamIdle = fake, time.Minute }})
	e.up.NewRepo(t, "org/repo.git")
	c := e.dial()

	// A command under way keeps its upstream however long it takes.
	s, stdin, _, _ := startUploadPack(t, c, "org/repo.git")
	fake.Advance(time.Hour)
	if n := fake.Timers(); n != 0 {
		t.Errorf("%d timers pending while a command runs", n)
	}
	io.WriteString(stdin, flush)
	stdin.Close()
	if err := s.Wait(); err != nil {
		t.Fatalf("the command: %v", err)
	}

	// Idle, its timer runs; a command before it fires uses it again.
	await.Recv(t, "the idle upstream's timer", fake.WaitForTimers(1))
	if r := execOn(t, c, "git-upload-pack 'org/repo.git'", flush); r.code != 0 {
		t.Fatal(r)
	}
	await.Recv(t, "the idle upstream's timer", fake.WaitForTimers(1))
	fake.Advance(time.Minute - time.Second)
	if n := e.up.Connections(); n != 1 {
		t.Errorf("%d upstream connections for two commands in a row", n)
	}
	// UpstreamIdle passed: the upstream connection ends, the task's stays.
	fake.Advance(time.Second)
	e.up.WaitIdle(t)
	if r := execOn(t, c, "git-upload-pack 'org/repo.git'", flush); r.code != 0 || !strings.Contains(r.stdout, "refs/heads/main") {
		t.Fatalf("the command after the upstream closed: %s", r)
	}
	if n := e.up.Connections(); n != 2 {
		t.Errorf("%d upstream connections, want 2: the second dialled once the first was closed", n)
	}
}

// droppingUpstream is an SSH server that runs each exec as "ok" with exit
// status 0, then ends the whole connection, as an upstream restarting or
// timing idle connections out does.
type droppingUpstream struct {
	ln       net.Listener
	key      ssh.Signer
	accepted atomic.Int64
	dropped  atomic.Int64
}

func startDroppingUpstream(t *testing.T, client ssh.PublicKey) *droppingUpstream {
	t.Helper()
	hostKey, _ := gitsshd.NewClientKey(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &droppingUpstream{ln: ln, key: hostKey}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if string(k.Marshal()) != string(client.Marshal()) {
			return nil, errors.New("not the key")
		}
		return nil, nil
	}}
	cfg.AddHostKey(hostKey)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.accepted.Add(1)
			wg.Go(func() {
				defer c.Close()
				sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				for nc := range chans {
					ch, creqs, err := nc.Accept()
					if err != nil {
						continue
					}
					for r := range creqs {
						r.Reply(r.Type == "exec", nil)
						if r.Type == "exec" {
							io.WriteString(ch, "ok\n")
							ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
							ch.Close()
							break
						}
					}
					sc.Close()
					u.dropped.Add(1)
				}
			})
		}
	})
	return u
}

// TestAnUpstreamThatDropsItsConnectionIsDialledAgain: once an upstream
// has ended its connection, the key's next command on the same task
// connection dials again instead of failing on the connection gone.
func TestAnUpstreamThatDropsItsConnectionIsDialledAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	signer, err := ParsePrivateKey(keyRef, secretsValue(string(e.clientPEM)))
	if err != nil {
		t.Fatal(err)
	}
	up := startDroppingUpstream(t, signer.PublicKey())
	e.dialer.set(hostName+":22", up.ln.Addr().String())
	e.setPolicy(options{knownHosts: []string{hostName + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(up.key.PublicKey())))}})

	c := e.dial()
	if r := execOn(t, c, "git-upload-pack 'org/repo.git'", ""); r.code != 0 || r.stdout != "ok\n" {
		t.Fatalf("the first command: %s", r)
	}
	await.Cond(t, await.Limit, "the upstream to drop its connection", func() bool { return up.dropped.Load() == 1 })
	// The front learns of the drop as its read of the connection ends: a
	// command sent in that moment may still fail, never one after it.
	var failed int
	await.Cond(t, await.Limit, "a command after the drop to run", func() bool {
		r := execOn(t, c, "git-upload-pack 'org/repo.git'", "")
		if r.code != 0 {
			failed++
		}
		return r.code == 0 && r.stdout == "ok\n"
	})
	if failed > 1 {
		t.Errorf("%d commands failed after the drop", failed)
	}
	if n := up.accepted.Load(); n != 2 {
		t.Errorf("%d upstream connections, want 2", n)
	}
}
