package sshfront

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/gitsshd"
)

// BenchmarkClone50MiB: a clone of a repository of 50 MiB (incompressible,
// stored uncompressed) by Debian's git and ssh, straight to the upstream
// with the real key ("direct") and through the front with none ("edge"),
// in one run, each iteration a fresh clone. "ratio" clones both ways in
// each iteration, the order alternating so that load from elsewhere on
// the machine lands on both, and reports edge's throughput over direct's
// (target: at least 0.8).
func BenchmarkClone50MiB(b *testing.B) {
	const size = 50 << 20
	e := newEnv(b, options{})
	e.up.NewRepoOfSize(b, "org/big.git", size)
	root := b.TempDir()
	directEnv := gitsshd.GitEnv(b, e.up.DirectGitEnv(b, e.clientPEM)...)
	edgeEnv := e.gitEnv()
	n := 0
	clone := func(b *testing.B, edge bool) time.Duration {
		n++
		dest := filepath.Join(root, fmt.Sprint(n))
		env, src := directEnv, e.up.URL("org/big.git")
		if edge {
			env, src = edgeEnv, url("org/big.git")
		}
		began := time.Now()
		mustRun(b, "", env, "git", "clone", "-q", src, dest)
		took := time.Since(began)
		b.StopTimer()
		if fi, err := os.Stat(filepath.Join(dest, "data")); err != nil || fi.Size() != size {
			b.Fatalf("the clone's data: %v, %v", fi, err)
		}
		if err := os.RemoveAll(dest); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		return took
	}
	for _, side := range []string{"direct", "edge"} {
		b.Run(side, func(b *testing.B) {
			b.SetBytes(size)
			for range b.N {
				clone(b, side == "edge")
			}
		})
	}
	b.Run("ratio", func(b *testing.B) {
		b.SetBytes(2 * size)
		var direct, edge time.Duration
		for i := range b.N {
			if i%2 == 0 {
				direct += clone(b, false)
				edge += clone(b, true)
			} else {
				edge += clone(b, true)
				direct += clone(b, false)
			}
		}
		mbs := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / 1e6 }
		b.ReportMetric(mbs(direct), "direct_MB/s")
		b.ReportMetric(mbs(edge), "edge_MB/s")
		b.ReportMetric(direct.Seconds()/edge.Seconds(), "edge/direct")
	})
}

// The idle clients' child: this test binary, run with idleChildEnv set
// to an idleChild spec, opens the connections and holds them, so that
// their memory is not the front's.
const idleChildEnv = "RUNFLEET_SSHFRONT_IDLE_CHILD"

type idleChild struct {
	Addr    string
	HostKey string // authorized_keys form
	Key     string // the client's private key; "" authenticates with none
	N       int
	Command string // run once on each connection first; "" for none
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(idleChildEnv); spec != "" {
		os.Exit(runIdleChild(spec))
	}
	os.Exit(m.Run())
}

// runIdleChild opens the connections, runs the command on each, says
// "ready" and holds them until its stdin closes.
func runIdleChild(spec string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
		return 1
	}
	var c idleChild
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		return fail("%v", err)
	}
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte(c.HostKey))
	if err != nil {
		return fail("%v", err)
	}
	cfg := &ssh.ClientConfig{User: "git", HostKeyCallback: ssh.FixedHostKey(hostKey), Timeout: time.Minute}
	if c.Key != "" {
		signer, err := ssh.ParsePrivateKey([]byte(c.Key))
		if err != nil {
			return fail("%v", err)
		}
		cfg.Auth = []ssh.AuthMethod{ssh.PublicKeys(signer)}
	}
	var clients []*ssh.Client
	for range c.N {
		client, err := ssh.Dial("tcp", c.Addr, cfg)
		if err != nil {
			return fail("%v", err)
		}
		clients = append(clients, client)
		if c.Command == "" {
			continue
		}
		s, err := client.NewSession()
		if err != nil {
			return fail("%v", err)
		}
		s.Stdin = strings.NewReader(flush)
		if out, err := s.Output(c.Command); err != nil || !bytes.HasSuffix(out, []byte(flush)) {
			return fail("%s: %v, %q", c.Command, err, out)
		}
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	for _, client := range clients {
		client.Close()
	}
	return 0
}

// BenchmarkIdleConnection: the front's memory per idle task connection,
// heap in use plus goroutine stacks after a GC, with the connections'
// clients in a child process (target: under 64 KiB).
//
//   - handshake: the connection has completed its handshake alone;
//   - after-command: it has run one allowed command, and its upstream
//     connection is still open (within UpstreamIdle of the command);
//   - after-command-idle: the same, once UpstreamIdle has passed and the
//     upstream connection is closed (a front whose UpstreamIdle is a
//     nanosecond): what a connection left idle holds.
//
// The upstream, gitsshd, runs in this process too and keeps a little per
// connection (its sshd's exec.Cmd and the goroutine waiting for it):
// upstream-alone, the child's connections made straight to it, measures
// that, and after-command's front_B/conn is its B/conn less that. A first
// run, not measured, makes the threads those goroutines block in.
//
// With RUNFLEET_SSHFRONT_PROFILE=DIR, every allocation is sampled and each
// run's heap and goroutine profiles are written to DIR, at the moment it
// is measured.
func BenchmarkIdleConnection(b *testing.B) {
	const n = 200
	const command = "git-upload-pack 'org/repo.git'"
	// Two fronts: one keeps its upstreams for the whole run, one closes
	// them as soon as they are idle.
	newFront := func(upstreamIdle time.Duration) (*env, idleChild) {
		e := newEnv(b, options{config: func(c *Config) { c.MaxConns, c.UpstreamIdle = 2*n, upstreamIdle }})
		e.up.NewRepo(b, "org/repo.git")
		warm := e.dial()
		if r := execOn(b, warm, "git-upload-pack 'org/repo.git'", flush); r.code != 0 {
			b.Fatal(r)
		}
		warm.Close()
		await.Cond(b, await.Limit, "the warm connection's Serve to return", func() bool { return e.served.Load() == 1 })
		e.audit.discard.Store(true)
		return e, idleChild{Addr: e.ln.Addr().String(), HostKey: string(ssh.MarshalAuthorizedKey(e.front.HostKey())), N: n, Command: command}
	}
	e, front := newFront(time.Hour)
	eIdle, frontIdle := newFront(time.Nanosecond)
	direct := idleChild{Addr: e.up.Addr().String(), HostKey: string(ssh.MarshalAuthorizedKey(e.up.HostKey())), Key: string(e.clientPEM), N: n, Command: command}
	handshake := front
	handshake.Command = ""
	e.idleRun(b, direct, n, nil)

	var upstreamAlone float64
	for _, mode := range []struct {
		name string
		e    *env
		spec idleChild
	}{
		{"upstream-alone", e, direct},
		{"handshake", e, handshake},
		{"after-command", e, front},
		{"after-command-idle", eIdle, frontIdle},
	} {
		b.Run(mode.name, func(b *testing.B) {
			if dir := os.Getenv("RUNFLEET_SSHFRONT_PROFILE"); dir != "" {
				defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
				runtime.MemProfileRate = 1
			}
			var sum idleFigures
			for range b.N {
				var idle func()
				if mode.e == eIdle {
					idle = func() { mode.e.up.WaitIdle(b) }
				}
				f := mode.e.idleRun(b, mode.spec, n, idle)
				sum.heap += f.heap
				sum.live += f.live
				sum.stack += f.stack
				sum.goroutines += f.goroutines
			}
			perConn := (sum.heap + sum.stack) / float64(b.N)
			b.ReportMetric(perConn, "B/conn")
			b.ReportMetric(sum.heap/float64(b.N), "heap_B/conn")
			b.ReportMetric(sum.live/float64(b.N), "live_heap_B/conn")
			b.ReportMetric(sum.stack/float64(b.N), "stack_B/conn")
			b.ReportMetric(sum.goroutines/float64(b.N), "goroutines/conn")
			switch mode.name {
			case "upstream-alone":
				upstreamAlone = perConn
			case "after-command":
				b.ReportMetric(perConn-upstreamAlone, "front_B/conn")
			}
		})
	}
}

// idleFigures are one run's memory per connection.
type idleFigures struct{ heap, live, stack, goroutines float64 }

// idleRun runs a child holding n connections as spec says, and measures
// this process's memory per connection before the child starts and once
// it holds them (after idle, when given, has run).
func (e *env) idleRun(b *testing.B, spec idleChild, n int, idle func()) idleFigures {
	throughFront := spec.Key == ""
	served, ups, lines := e.served.Load(), e.up.Connections(), e.audit.count.Load()
	specJSON, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), idleChildEnv+"="+string(specJSON))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	before := memInUse()
	g0 := runtime.NumGoroutine()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Wait()
		b.Fatalf("the child: %q, %v\n%s", line, err, stderr.Bytes())
	}
	if spec.Command != "" && throughFront {
		// Each command's audit line written, the front is idle.
		await.Cond(b, await.Limit, "the commands' audit lines", func() bool { return e.audit.count.Load() == lines+int64(n) })
		if e.up.Connections() != ups+n {
			b.Fatalf("%d upstream connections for %d connections", e.up.Connections()-ups, n)
		}
	}
	if idle != nil {
		idle()
	}
	after := memInUse()
	f := idleFigures{
		heap:       float64(after.heap-before.heap) / float64(n),
		live:       float64(after.live-before.live) / float64(n),
		stack:      float64(after.stack-before.stack) / float64(n),
		goroutines: float64(runtime.NumGoroutine()-g0) / float64(n),
	}
	if dir := os.Getenv("RUNFLEET_SSHFRONT_PROFILE"); dir != "" {
		name := "direct"
		if throughFront {
			name = fmt.Sprintf("front-command=%t-idle=%t", spec.Command != "", idle != nil)
		}
		writeProfiles(b, dir, name)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("the child: %v\n%s", err, stderr.Bytes())
	}
	if throughFront {
		await.Cond(b, await.Limit, "every connection's Serve to return", func() bool { return e.served.Load() == served+int64(n) })
	}
	e.up.WaitIdle(b)
	return f
}

// memUse is the heap in use (spans holding any object), the heap's live
// objects alone, and the goroutine stacks.
type memUse struct{ heap, live, stack int64 }

// memInUse is the heap in use and the goroutine stacks, after a GC.
func memInUse() memUse {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memUse{int64(m.HeapInuse), int64(m.HeapAlloc), int64(m.StackInuse)}
}

// writeProfiles writes the heap (every allocation sampled) and goroutine
// profiles under dir, for a look at where an idle connection's memory
// goes.
func writeProfiles(b *testing.B, dir, name string) {
	for _, p := range []string{"heap", "goroutine"} {
		f, err := os.Create(filepath.Join(dir, name+"."+p))
		if err != nil {
			b.Fatal(err)
		}
		pprof.Lookup(p).WriteTo(f, 0)
		f.Close()
	}
}
