// Package browser drives a real headless browser (Debian's chromium) from
// Go tests over the Chrome DevTools protocol, so the dashboard's tests see
// what a user's browser does: its rendering, its requests, its dialogs and
// its console.
//
// How it runs. Launch starts chromium with --remote-debugging-pipe: the
// protocol travels over two pipes, fd 3 (our commands, chromium reads) and
// fd 4 (its replies and events), each message JSON ended by a NUL byte. One
// goroutine reads fd 4: a reply goes to the call waiting on its id, an
// event to the Page whose flat session (Target.attachToTarget with flatten)
// it names. Every wait is bounded by tests/kit/await's Limit and fails the
// test naming what it waited for.
//
// chromium is started so it never reaches the network on its own: no
// first run, sync, extensions, component updates, background networking,
// crash reporting or proxy from the environment, and a host resolver that
// answers only loopback names, so a page's request to any other host
// fails at once (Request.Failed) instead of leaving the machine.
//
// It lives under tests/: nothing outside tests imports it.
package browser

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runfleet/runfleet/tests/kit/await"
)

// Binary is the chromium the kit runs: Debian's browser itself, not
// /usr/bin/chromium, the package's launcher script, which sources
// /etc/chromium.d (exporting Google API keys and adding
// --enable-remote-extensions and --load-extension) and fails a shell test
// of its own on some machines. infra/scripts/test-deps.sh installs it.
const Binary = "/usr/lib/chromium/chromium"

// closeGrace is how long Close lets chromium end itself and its helper
// processes after Browser.close before killing them.
const closeGrace = 10 * time.Second

// stderrTail bounds how much of chromium's stderr a failure quotes.
const stderrTail = 4 << 10

// Browser is one running chromium with a profile of its own (an empty
// cache, no cookies). Its methods are safe for concurrent use.
type Browser struct {
	cmd        *exec.Cmd
	dir        string   // the profile's parent: stderr lives beside it
	toChrome   *os.File // our end of fd 3
	fromChrome *os.File // our end of fd 4

	writeMu sync.Mutex // one message on the pipe at a time

	mu      sync.Mutex
	nextID  int64
	pending map[int64]chan message // calls awaiting their reply, by id
	pages   map[string]*Page       // by session id

	readDone chan struct{} // closed when the reader has returned
	readErr  error         // why the reader returned; read after readDone

	async sync.WaitGroup // sends the reader started (dialog answers)
}

// message is one protocol message either way: a command (ID, Method,
// Params), its reply (ID, Result or Error) or an event (Method, Params).
// SessionID names the page's session; "" is the browser's own.
type message struct {
	ID        int64           `json:"id,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *protoError     `json:"error,omitempty"`
}

type protoError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    string `json:"data,omitempty"`
}

func (e *protoError) Error() string {
	if e.Data != "" {
		return fmt.Sprintf("%s (%d): %s", e.Message, e.Code, e.Data)
	}
	return fmt.Sprintf("%s (%d)", e.Message, e.Code)
}

// Launch starts chromium for the test and stops it when the test ends
// (the process and its helpers killed and waited on, its profile removed
// with the test's temp dir). A chromium that cannot start fails the test
// with its stderr.
func Launch(t testing.TB) *Browser {
	t.Helper()
	b, err := launch(t.TempDir())
	if b != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("chromium's stderr (its end):\n%s", b.stderr())
			}
			if err := b.close(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		msg := err.Error()
		if b != nil {
			msg += "; chromium's stderr:\n" + b.stderr()
		}
		t.Fatalf("browser: %s", msg)
	}
	return b
}

func launch(dir string) (*Browser, error) {
	if _, err := os.Stat(Binary); err != nil {
		return nil, fmt.Errorf("%w (infra/scripts/test-deps.sh installs Debian's chromium)", err)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		return nil, err
	}
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		return nil, err
	}
	defer stderr.Close() // chromium holds its own copy
	args := []string{
		"--headless=new",
		"--remote-debugging-pipe",
		"--user-data-dir=" + filepath.Join(dir, "profile"),
		"--no-first-run",
		"--no-default-browser-check",
		"--disable-extensions",
		"--disable-component-extensions-with-background-pages",
		"--disable-default-apps",
		"--disable-background-networking",
		"--disable-sync",
		"--disable-component-update",
		"--disable-domain-reliability",
		"--disable-client-side-phishing-detection",
		"--disable-breakpad",
		"--disable-crash-reporter",
		"--no-pings",
		"--metrics-recording-only",
		"--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,AutofillServerCommunication,CertificateTransparencyComponentUpdater",
		"--no-proxy-server",
		"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1, EXCLUDE [::1]",
		"--disable-gpu",
		// /dev/shm is small in most containers, and chromium crashes
		// when it fills; temp files cost little here.
		"--disable-dev-shm-usage",
		"--password-store=basic",
		"--mute-audio",
		"--hide-scrollbars",
		"--force-color-profile=srgb",
	}
	if os.Geteuid() == 0 {
		// chromium refuses to run as root with its sandbox.
		args = append(args, "--no-sandbox")
	}
	args = append(args, "about:blank")

	cmdR, toChrome, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	fromChrome, cmdW, err := os.Pipe()
	if err != nil {
		cmdR.Close()
		toChrome.Close()
		return nil, err
	}
	cmd := exec.Command(Binary, args...)
	cmd.ExtraFiles = []*os.File{cmdR, cmdW} // fd 3 and fd 4
	cmd.Stdout = stderr
	cmd.Stderr = stderr
	// Its own (and its helpers') HOME: chromium writes ~/.pki and caches
	// there regardless of --user-data-dir.
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "XDG_CACHE_HOME="+filepath.Join(home, ".cache"))
	// A process group of its own, so Close can end the helpers chromium
	// forks; Pdeathsig so a test binary killed mid-run takes it along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	cmdR.Close()
	cmdW.Close()
	if err != nil {
		toChrome.Close()
		fromChrome.Close()
		return nil, fmt.Errorf("starting %s: %w", Binary, err)
	}
	b := &Browser{
		cmd:        cmd,
		dir:        dir,
		toChrome:   toChrome,
		fromChrome: fromChrome,
		pending:    map[int64]chan message{},
		pages:      map[string]*Page{},
		readDone:   make(chan struct{}),
	}
	go b.read()
	var version struct {
		Product string `json:"product"`
	}
	if err := b.call("", "Browser.getVersion", nil, &version); err != nil {
		return b, fmt.Errorf("chromium did not answer: %w", err)
	}
	return b, nil
}

// read is the one reader of fd 4; it returns when the pipe ends.
func (b *Browser) read() {
	defer close(b.readDone)
	r := bufio.NewReaderSize(b.fromChrome, 64<<10)
	for {
		raw, err := r.ReadBytes(0)
		if err != nil {
			b.readErr = err
			return
		}
		var m message
		if err := json.Unmarshal(raw[:len(raw)-1], &m); err != nil {
			b.readErr = fmt.Errorf("decoding a message from chromium: %w", err)
			return
		}
		b.mu.Lock()
		if m.ID != 0 {
			ch := b.pending[m.ID]
			delete(b.pending, m.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- m // buffered: never blocks the reader
			}
			continue
		}
		p := b.pages[m.SessionID]
		b.mu.Unlock()
		if p != nil {
			p.event(m.Method, m.Params)
		}
	}
}

// send writes one command and returns its id.
func (b *Browser) send(sessionID, method string, params any, reply chan message) (int64, error) {
	var raw json.RawMessage
	if params != nil {
		var err error
		if raw, err = json.Marshal(params); err != nil {
			return 0, fmt.Errorf("%s: encoding its params: %w", method, err)
		}
	}
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	if reply != nil {
		b.pending[id] = reply
	}
	b.mu.Unlock()
	data, err := json.Marshal(message{ID: id, SessionID: sessionID, Method: method, Params: raw})
	if err != nil {
		return 0, err
	}
	b.writeMu.Lock()
	_, err = b.toChrome.Write(append(data, 0))
	b.writeMu.Unlock()
	if err != nil {
		b.forget(id)
		return 0, fmt.Errorf("%s: writing to chromium: %w", method, err)
	}
	return id, nil
}

func (b *Browser) forget(id int64) {
	b.mu.Lock()
	delete(b.pending, id)
	b.mu.Unlock()
}

// callWithin sends a command and decodes its result into result (nil:
// ignore it), waiting at most limit for the reply.
func (b *Browser) callWithin(limit time.Duration, sessionID, method string, params, result any) error {
	reply := make(chan message, 1)
	id, err := b.send(sessionID, method, params, reply)
	if err != nil {
		return err
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var m message
	select {
	case m = <-reply:
	case <-b.readDone:
		select {
		case m = <-reply:
		default:
			return fmt.Errorf("%s: chromium's pipe ended (%v)", method, b.readErr)
		}
	case <-timer.C:
		b.forget(id)
		return fmt.Errorf("%s: no reply in %s", method, limit)
	}
	if m.Error != nil {
		return fmt.Errorf("%s: %w", method, m.Error)
	}
	if result != nil && len(m.Result) > 0 {
		if err := json.Unmarshal(m.Result, result); err != nil {
			return fmt.Errorf("%s: decoding its result: %w", method, err)
		}
	}
	return nil
}

// call is callWithin bounded by await.Limit.
func (b *Browser) call(sessionID, method string, params, result any) error {
	return b.callWithin(await.Limit, sessionID, method, params, result)
}

// sendAsync sends a command whose reply nobody waits for, from a
// goroutine of its own: the reader uses it, and must never block on the
// pipe.
func (b *Browser) sendAsync(sessionID, method string, params any) {
	b.async.Add(1)
	go func() {
		defer b.async.Done()
		b.send(sessionID, method, params, nil) // a closed pipe: the browser is going away
	}()
}

// close ends chromium: Browser.close first, so it stops its helpers
// itself, then SIGKILL to the process group for whatever is left, before
// the leader is reaped (so the group's id cannot have been reused).
func (b *Browser) close() error {
	b.callWithin(closeGrace, "", "Browser.close", nil, nil) // the browser may be gone already
	timer := time.NewTimer(closeGrace)
	select {
	case <-b.readDone: // chromium closed fd 4: it is exiting
	case <-timer.C:
	}
	timer.Stop()
	pid := b.cmd.Process.Pid
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("browser: killing chromium's process group %d: %w", pid, err)
	}
	// chromium's crash handlers leave the group (sessions of their own).
	for _, pid := range b.processes() {
		syscall.Kill(pid, syscall.SIGKILL) // it may have ended meanwhile
	}
	b.cmd.Wait() // killed or closed: its exit status says nothing
	b.toChrome.Close()
	b.fromChrome.Close() // ends the reader if a helper still held fd 4
	<-b.readDone
	b.async.Wait()
	return nil
}

// processes is every process chromium started that is still running,
// found by its command line, which names a path under the browser's dir
// (the profile's or, for the crash handler, its database's). An ended
// process its new parent has not reaped yet (a zombie) has an empty
// command line, and is not one. (Its environment would not do: chromium
// writes its processes' titles over it.)
func (b *Browser) processes() []int {
	mark := []byte(b.dir + "/")
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, mark) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stderr is the end of what chromium wrote to stderr, without its
// complaints that the machine has no D-Bus (dozens a launch, on every
// machine without a desktop session), which would bury the rest.
func (b *Browser) stderr() string {
	f, err := os.Open(filepath.Join(b.dir, "stderr"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > stderrTail {
		f.Seek(st.Size()-stderrTail, io.SeekStart)
	}
	data, _ := io.ReadAll(f)
	var kept []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if !strings.Contains(line, ":ERROR:dbus/") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}
