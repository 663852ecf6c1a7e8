package sshfront

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
)

// session serves one session channel: requests before its command are
// refused one by one (a pty, the environment, agent or X11 forwarding),
// and its first shell, exec or subsystem request decides what it is. A
// refused command ends the channel with a reason and exit status 1.
func (cn *conn) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	relayed := false
	// Requests still coming on a channel ended here are answered no: left
	// unread, they would stall the connection's other channels.
	defer func() {
		if !relayed {
			go ssh.DiscardRequests(reqs)
		}
	}()
	for r := range reqs {
		start := cn.front.cfg.Clock.Now()
		switch r.Type {
		case "exec":
			line, ok := stringPayload(r.Payload)
			_ = r.Reply(true, nil)
			if !ok {
				cn.refuseCommand(ch, start, nil, "", "the exec request is malformed")
				return
			}
			relayed = cn.exec(ch, reqs, start, line)
			return
		case "shell":
			_ = r.Reply(true, nil)
			cn.refuseCommand(ch, start, &audit.SSHCommand{Request: "shell"}, "", "a shell is not allowed: only git commands run over SSH here")
			return
		case "subsystem":
			name, _ := stringPayload(r.Payload)
			_ = r.Reply(true, nil)
			cn.refuseCommand(ch, start, &audit.SSHCommand{Request: "subsystem " + cn.s.Redact(name)}, "",
				fmt.Sprintf("the %s subsystem is not allowed: only git commands run over SSH here", quoteShort(cn.s.Redact(name))))
			return
		case "pty-req":
			cn.blocked(start, r.Type, "a terminal is not allowed: only git commands run over SSH here")
		case "x11-req":
			cn.blocked(start, r.Type, "X11 forwarding is not allowed")
		case "auth-agent-req@openssh.com":
			cn.blocked(start, r.Type, "agent forwarding (ssh -A) is not allowed: the task never signs with a key")
		}
		// The environment (LANG, GIT_PROTOCOL), signals before a command,
		// window changes: refused without a line each.
		if r.WantReply {
			_ = r.Reply(false, nil)
		}
	}
}

// refuseCommand answers a refused command as git prints an upstream's
// refusal: the reason on stderr, exit status 1.
func (cn *conn) refuseCommand(ch ssh.Channel, start time.Time, cmd *audit.SSHCommand, key string, reason string) {
	_, _ = fmt.Fprintf(ch.Stderr(), "runfleet: %s\n", reason)
	sendExitStatus(ch, 1)
	if cmd == nil {
		cmd = &audit.SSHCommand{Request: "exec"}
	}
	one := 1
	cmd.ExitStatus = &one
	e := audit.Entry{Action: audit.Blocked, Status: 403, Reason: reason, SSH: cmd}
	if key != "" {
		e.Keys = []string{key}
	}
	cn.front.record(cn.s, start, e)
}

func sendExitStatus(ch ssh.Channel, code uint32) {
	_, _ = ch.SendRequest("exit-status", false, binary.BigEndian.AppendUint32(nil, code))
}

// exec decides a command line and, allowed, runs it upstream; true when
// the relay took the channel's requests.
func (cn *conn) exec(ch ssh.Channel, reqs <-chan *ssh.Request, start time.Time, line string) bool {
	d := policy.DecideSSHExec(policy.SSHExecInput{Authority: cn.s.Authority, Granted: cn.s.Granted(), Line: line})
	cmd := &audit.SSHCommand{Request: "exec", Command: d.Command.Name, Repository: cn.s.Redact(d.Command.Repository)}
	if d.Command.Name == "" {
		// Not a git command: its first word, redacted, says what it was.
		first, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		cmd.Command = quoteShort(cn.s.Redact(first))
	}
	key := ""
	if d.Ref != (policy.KeyRef{}) {
		key = d.Ref.String()
	}
	if !d.Allow {
		cn.refuseCommand(ch, start, cmd, key, cn.s.Redact(d.Reason))
		return false
	}
	client, done, err := cn.dial(d.Key)
	if err != nil {
		var ue *upstreamError
		reason := "the upstream could not be used"
		if errors.As(err, &ue) {
			reason = ue.reason
		}
		_, _ = fmt.Fprintf(ch.Stderr(), "runfleet: %s\n", reason)
		sendExitStatus(ch, 1)
		one := 1
		cmd.ExitStatus = &one
		cn.front.record(cn.s, start, audit.Entry{Action: audit.Denied, Status: 502, Reason: reason, Keys: []string{key}, SSH: cmd})
		return false
	}
	defer done()
	r := relay{task: ch, taskReqs: reqs}
	status, err := r.run(client, d.Command.Line())
	if err != nil {
		reason := "the upstream refused the command's session"
		cn.front.cfg.Logger.Warn("running a command upstream", slog.String("task", cn.s.Task), slog.String("upstream", cn.s.Authority.String()), slog.String("error", err.Error()))
		_, _ = fmt.Fprintf(ch.Stderr(), "runfleet: %s\n", reason)
		sendExitStatus(ch, 1)
		cn.front.record(cn.s, start, audit.Entry{Action: audit.Denied, Status: 502, Reason: reason, Keys: []string{key}, SSH: cmd})
		return false // run fails before it reads the channel's requests
	}
	cmd.ExitStatus = status
	cn.front.record(cn.s, start, audit.Entry{Action: audit.Substituted, Status: 200, Keys: []string{key}, SSH: cmd,
		BytesIn: r.in.Load(), BytesOut: r.out.Load()})
	return true
}

// relay joins a task's session channel to an upstream session running one
// command: stdin, stdout and stderr stream both ways under each side's
// window (x/crypto/ssh reads no more than the window it grants, so a
// large clone streams without being held), the task's signals go up, the
// upstream's exit status or signal comes down.
type relay struct {
	task     ssh.Channel
	taskReqs <-chan *ssh.Request
	in, out  atomic.Int64
}

// run runs line upstream and relays until the upstream's channel closes;
// the exit status is nil when the upstream sent none (a signal ended it,
// or the connection dropped).
func (r *relay) run(client ssh.Conn, line string) (*int, error) {
	up, upReqs, err := client.OpenChannel("session", nil)
	if err != nil {
		return nil, err
	}
	defer up.Close()
	ok, err := up.SendRequest("exec", true, ssh.Marshal(struct{ Command string }{line}))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("the upstream refused the exec request")
	}
	// A copy to the task fails when the task's channel or connection is
	// gone: the upstream's session is closed then, or the upstream, its
	// window full, would wait with its command for a reader forever, and
	// this relay, its session and its connection's Serve with it.
	var data sync.WaitGroup
	data.Add(2)
	go func() {
		defer data.Done()
		n, err := io.Copy(r.task, up)
		r.out.Add(n)
		if err != nil {
			_ = up.Close()
		}
	}()
	go func() {
		defer data.Done()
		n, err := io.Copy(r.task.Stderr(), up.Stderr())
		r.out.Add(n)
		if err != nil {
			_ = up.Close()
		}
	}()
	// The upstream's end (exit-status, exit-signal) is passed on after its
	// output but before the task's EOF: a client whose own input has
	// ended (an ssh ControlMaster's session) closes its channel once EOF
	// has gone both ways, and a status sent after that is lost. ended
	// closes at the first end request, or when the upstream's channel
	// closes without one.
	var endsMu sync.Mutex
	var ends []*ssh.Request
	ended := make(chan struct{})
	go func() {
		var once sync.Once
		end := func() { once.Do(func() { close(ended) }) }
		defer end()
		for req := range upReqs {
			if req.Type == "exit-status" || req.Type == "exit-signal" {
				endsMu.Lock()
				ends = append(ends, req)
				endsMu.Unlock()
				end()
			}
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
	}()
	go func() {
		// Counted as it goes, not when the copy ends: the task's stdin
		// often stays open past the command's end (git sends its wants,
		// then waits for the pack), and the audit line is written then.
		_, _ = io.Copy(countingWriter{up, &r.in}, r.task)
		_ = up.CloseWrite()
	}()
	go func() {
		for req := range r.taskReqs {
			if req.Type == "signal" {
				_, _ = up.SendRequest("signal", false, req.Payload)
			}
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
	}()
	data.Wait()
	<-ended
	var status *int
	endsMu.Lock()
	for _, req := range ends {
		if req.Type == "exit-status" && len(req.Payload) == 4 {
			code := int(binary.BigEndian.Uint32(req.Payload))
			status = &code
		}
		_, _ = r.task.SendRequest(req.Type, false, req.Payload)
	}
	endsMu.Unlock()
	_ = r.task.CloseWrite()
	// The task's side ends with its channel, closed by the caller: a task
	// still sending once the command ended is cut off there.
	return status, nil
}

// countingWriter adds what each Write passed on to n.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// stringPayload reads an SSH string (a uint32 length, then the bytes) that
// must be the whole payload.
func stringPayload(p []byte) (string, bool) {
	if len(p) < 4 {
		return "", false
	}
	n := binary.BigEndian.Uint32(p)
	if uint64(n) != uint64(len(p)-4) {
		return "", false
	}
	return string(p[4:]), true
}

// quoteShort quotes what a task chose for a reason or the audit, cut to
// 64 bytes.
func quoteShort(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("%q", s)
}
