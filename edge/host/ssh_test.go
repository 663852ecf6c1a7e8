package host

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/sshfront"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/gitsshd"
	"github.com/runfleet/runfleet/tests/kit/leakcheck"
)

// The Git over SSH tests run the system's git and ssh as the task user
// (nobody, egress confined: the default) with no key of their own and no
// setting at all: `git clone git@github.com:org/repo.git` as a user types
// it. Edge's proxy.upstream.resolve pins github.com (and gitlab.com, which
// no key names) to a gitsshd server, a real Debian sshd running git-shell
// on port 22 of a loopback address, which authorizes the client key the
// secrets file holds as acme/GIT_SSH (and as the other projects' keys).
// What reaches that sshd is what edge ran there with the real key: its
// Commands, Connections and Log say what and how often.

// sshTaskDomain is the domain the tasks declare their ssh key with.
const sshTaskDomain = "github.com:22"

// sshKeySpec is one project's GIT_SSH key in the policy.
type sshKeySpec struct {
	allow        []string
	repositories []string
	// knownHosts: nil is the server's host key for github.com:22.
	knownHosts []string
	// value is the key's value in the secrets file: "" is the client key
	// the server authorizes, sshNoValue none at all.
	value string
}

// sshNoValue is sshKeySpec.value for a key the secrets file lacks.
const sshNoValue = "\x00none"

// gitSSH is an edge host serving Git over SSH with its upstream, and every
// run it started, for the leak checks.
type gitSSH struct {
	f   *fixture
	e   *edgeHost
	srv *gitsshd.Server
	// upstreamIP is where github.com and gitlab.com resolve: srv's.
	upstreamIP string
	pem        []byte // the client key's private key file, GIT_SSH's real value
	keys       map[string]sshKeySpec
	reals      []leakcheck.Real

	mu   sync.Mutex
	runs []sshRun
}

// newGitSSH starts a gitsshd server authorizing a new client key and an
// edge host whose policy gives each project of keys a key GIT_SSH of kind
// ssh for github.com:22, its value that client key, with proxy.egress
// egress.
func newGitSSH(t *testing.T, egress string, keys map[string]sshKeySpec) *gitSSH {
	t.Helper()
	signer, pemKey := gitsshd.NewClientKey(t)
	srv := gitsshd.Start(t, gitsshd.Options{AuthorizedKeys: []ssh.PublicKey{signer.PublicKey()}})
	return openGitSSH(t, egress, keys, srv, srv.Addr().Addr().String(), pemKey)
}

// openGitSSH opens the edge host of newGitSSH with github.com and
// gitlab.com pinned to upstreamIP, GIT_SSH's value pemKey; srv may be nil
// when every key lists its knownHosts.
func openGitSSH(t *testing.T, egress string, keys map[string]sshKeySpec, srv *gitsshd.Server, upstreamIP string, pemKey []byte) *gitSSH {
	t.Helper()
	g := &gitSSH{f: newFixture(t), srv: srv, upstreamIP: upstreamIP, pem: pemKey, keys: keys}
	g.reals = privateKeyReals(t, pemKey)
	secrets := map[string]string{}
	for project, k := range keys {
		switch k.value {
		case "":
			secrets[project+"/GIT_SSH"] = string(pemKey)
		case sshNoValue:
		default:
			secrets[project+"/GIT_SSH"] = k.value
		}
	}
	b, err := json.Marshal(secrets)
	must(t, err)
	must(t, os.WriteFile(g.f.secretsPath, b, 0o600))
	g.writeConfig(egress)
	g.e = g.f.openWritten(hostOptions{})
	return g
}

// writeConfig writes edge.json: github.com and gitlab.com pinned to the
// server, which listens on loopback (allowPrivate), and the keys.
func (g *gitSSH) writeConfig(egress string) {
	t := g.f.t
	t.Helper()
	ip := g.upstreamIP
	projects := map[string]any{}
	for project, k := range g.keys {
		known := k.knownHosts
		if known == nil {
			known = []string{g.srv.KnownHostsLine("github.com", 22)}
		}
		sshCfg := map[string]any{"knownHosts": known, "allow": k.allow}
		if k.repositories != nil {
			sshCfg["repositories"] = k.repositories
		}
		projects[project] = map[string]any{"keys": map[string]any{
			"GIT_SSH": map[string]any{"kind": "ssh", "domains": []string{sshTaskDomain}, "ssh": sshCfg},
		}}
	}
	cfg := map[string]any{
		"dataDir": g.f.dataDir,
		"api":     map[string]any{"listen": "127.0.0.1:0", "tokenFile": g.f.tokenPath},
		"proxy": map[string]any{"listen": "127.0.0.1:0", "egress": egress, "upstream": map[string]any{
			"resolve":      map[string]string{"github.com": ip, "gitlab.com": ip},
			"allowPrivate": []string{"127.0.0.0/8"},
		}},
		"ca":      map[string]any{},
		"policy":  map[string]any{"projects": projects},
		"secrets": map[string]any{"file": g.f.secretsPath},
		"agents":  map[string]any{"shell": map[string]any{"argv": []string{"sh", "-c", "{prompt}"}}},
		"runner":  map[string]any{"user": "nobody", "cancelGrace": "10s"},
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	must(t, err)
	g.f.cfgPath = filepath.Join(g.f.dir, "edge.json")
	must(t, os.WriteFile(g.f.cfgPath, b, 0o600))
}

// privateKeyReals are what must never be read of the client key: its
// ed25519 seed (in every form leakcheck knows) and sshPEMNeedle's run of
// its file's base64 body.
func privateKeyReals(t *testing.T, pemKey []byte) []leakcheck.Real {
	t.Helper()
	return []leakcheck.Real{
		{Key: "GIT_SSH's private key (its seed)", Value: string(clientSeed(t, pemKey))},
		{Key: "GIT_SSH's private key file (a run of its base64)", Value: sshPEMNeedle(t, pemKey)},
	}
}

func clientSeed(t *testing.T, pemKey []byte) []byte {
	t.Helper()
	raw, err := ssh.ParseRawPrivateKey(pemKey)
	must(t, err)
	priv, ok := raw.(*ed25519.PrivateKey)
	if !ok {
		t.Fatalf("the client key is a %T, want an ed25519 key", raw)
	}
	return priv.Seed()
}

// sshPEMNeedle is a run of 20 characters of the private key file, on one
// of its lines, that spells bits of the key's seed alone: distinctive, and
// what a copy of the file anywhere would hold.
func sshPEMNeedle(t *testing.T, pemKey []byte) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(pemKey)), "\n")
	body := lines[1 : len(lines)-1]
	joined := strings.Join(body, "")
	decoded, err := base64.StdEncoding.DecodeString(joined)
	must(t, err)
	seed := clientSeed(t, pemKey)
	i := bytes.Index(decoded, seed)
	if i < 0 {
		t.Fatal("the key file does not hold its seed")
	}
	// Character p spells bits 6p..6p+5: bytes 6p/8 to (6p+5)/8.
	first, last := (8*i+5)/6, (8*(i+len(seed))-6)/6 // the characters within the seed
	const n = 20
	offset := 0
	for _, line := range body {
		if lo, hi := max(first, offset), min(last+1, offset+len(line)); hi-lo >= n {
			needle := joined[lo : lo+n]
			if !bytes.Contains(pemKey, []byte(needle)) {
				t.Fatal("the needle is not a run of the key file")
			}
			return needle
		}
		offset += len(line)
	}
	t.Fatal("no line of the key file holds 20 characters of its seed")
	return ""
}

// sshStep is one command of a task, a shell script run with sh -e in
// $HOME/w, stdin /dev/null, bounded by timeout; its output and exit code
// print as a section (clientSections reads it).
type sshStep struct{ name, script string }

// sshPrompt is a task running steps in order, each printed between
// "== NAME exit CODE" and "== end NAME" once all have run.
func sshPrompt(steps ...sshStep) string {
	var b strings.Builder
	b.WriteString("out=$(mktemp -d)\nmkdir -p \"$HOME/w\"\n")
	for _, s := range steps {
		fmt.Fprintf(&b, "cat >\"$out/%[1]s.sh\" <<'STEP'\n%[2]s\nSTEP\n", s.name, s.script)
		fmt.Fprintf(&b, "(cd \"$HOME/w\" && timeout 90 sh -e \"$out/%[1]s.sh\") >\"$out/%[1]s\" 2>&1 </dev/null; echo $? >\"$out/%[1]s.rc\"\n", s.name)
	}
	for _, s := range steps {
		fmt.Fprintf(&b, "echo \"== %[1]s exit $(cat \"$out/%[1]s.rc\")\"; cat \"$out/%[1]s\"; echo; echo \"== end %[1]s\"\n", s.name)
	}
	return b.String()
}

// sshRun is a task's run, ended.
type sshRun struct {
	stepsRun
	g   *gitSSH
	end hostproto.Run
}

// run runs a task declaring project's GIT_SSH for github.com:22 to its end.
func (g *gitSSH) run(t *testing.T, project, prompt string) sshRun {
	t.Helper()
	run := g.e.start(runspec.Request{Prompt: prompt, Secrets: []runspec.Secret{{ProjectID: project, Key: "GIT_SSH", Domains: []string{sshTaskDomain}}}})
	var end hostproto.Run
	await.Cond(t, 2*time.Minute, "run "+run.RunID+" to end", func() bool {
		var err error
		end, err = g.e.client.Get(bg, run.RunID)
		must(t, err)
		return hostproto.TerminalStatus(end.Status)
	})
	out := strings.ReplaceAll(g.e.output(run.RunID), "\r\n", "\n")
	r := sshRun{stepsRun: newStepsRun(run.RunID, out), g: g, end: end}
	g.mu.Lock()
	g.runs = append(g.runs, r)
	g.mu.Unlock()
	if end.Status != hostproto.StatusSucceeded {
		t.Fatalf("run %s ended %+v:\n%s", r.id, end, out)
	}
	return r
}

// audit waits until the run's audit lines satisfy done, and returns them.
func (r sshRun) audit(t *testing.T, what string, done func([]audit.Entry) bool) []audit.Entry {
	t.Helper()
	var lines []audit.Entry
	if !await.Within(10*time.Second, func() bool { lines = auditLines(t, r.g.f, r.id); return done(lines) }) {
		var b strings.Builder
		for _, l := range lines {
			j, _ := json.Marshal(l)
			b.WriteString(string(j) + "\n")
		}
		t.Fatalf("run %s: the audit never held %s; it holds:\n%s", r.id, what, b.String())
	}
	return lines
}

// sshLines are the audit lines of SSH requests among lines.
func sshLines(lines []audit.Entry) []audit.Entry {
	return slices.DeleteFunc(slices.Clone(lines), func(l audit.Entry) bool { return l.SSH == nil })
}

// commandsOn are the server's commands on the repository at path.
func commandsOn(srv *gitsshd.Server, path string) []string {
	var out []string
	for _, c := range srv.Commands() {
		if strings.HasSuffix(c, " '"+path+"'") {
			out = append(out, c)
		}
	}
	return out
}

// edgeKnownHosts is the known_hosts text a task of the host's must read:
// edge's host key for github.com, and nothing else.
func edgeKnownHosts(e *edgeHost) string {
	return "github.com " + string(ssh.MarshalAuthorizedKey(e.sshHostKey.PublicKey()))
}

// noLeak checks that nothing any run of g's could read, nor edge's log or
// audit, holds the private key.
func (g *gitSSH) noLeak(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	runs := slices.Clone(g.runs)
	g.mu.Unlock()
	for _, r := range runs {
		events, err := json.Marshal(g.e.events(r.id))
		must(t, err)
		for _, real := range g.reals {
			leakcheck.AssertClean(t, "run "+r.id+"'s events", events, real)
		}
	}
	audited, err := os.ReadFile(filepath.Join(g.f.dataDir, "logs", audit.FileName))
	must(t, err)
	for what, b := range map[string][]byte{"edge's log": []byte(g.e.logs.String()), "edge's audit": audited} {
		for _, real := range g.reals {
			leakcheck.AssertClean(t, what, b, real)
		}
		if bytes.Contains(b, []byte("PRIVATE KEY")) {
			t.Errorf("%s holds a private key file's header", what)
		}
	}
}

// sshLeakScript looks, as the task user, for needle (given in pieces, so
// that the prompt does not hold it whole) everywhere the task can read
// that matters: its home, /tmp, /var/tmp, its work and run directories,
// /etc/ssh, the fixture's directory (edge's data dir, edge.json, the
// secrets file), its environment and its processes' environments,
// printing "found: WHERE" for each hit; then "files=N", how many files it
// could read there, and, as a control that the search works, where
// edge's host key (ssh-ed25519) is found under /etc/ssh.
func sshLeakScript(needle, fixtureDir string) string {
	var pieces []string
	for i := 0; i < len(needle); i += 5 {
		pieces = append(pieces, "'"+needle[i:min(i+5, len(needle))]+"'")
	}
	return fmt.Sprintf(`p=$(printf '%%s' %s)
run=$(dirname "$HOME")
echo "run=$run"
dirs="$HOME /tmp /var/tmp $(pwd -P) $run /etc/ssh %s"
for d in $dirs; do
	grep -rlsF -e "$p" "$d" | sed 's/^/found: /' || true
done
env | grep -qF -e "$p" && echo "found: env" || true
grep -lsF -e "$p" /proc/[0-9]*/environ | sed 's/^/found: /' || true
echo "files=$(find $dirs -type f -readable 2>/dev/null | wc -l)"
grep -rlsF -e ssh-ed25519 /etc/ssh | sed 's/^/control: /'
`, strings.Join(pieces, " "), fixtureDir)
}

// sshConnectScript is an ssh ProxyCommand (argv: host port) reaching
// host:port with a CONNECT through the task's HTTPS_PROXY.
const sshConnectScript = `import base64, os, socket, sys, threading, urllib.parse
u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
s = socket.create_connection((u.hostname, u.port))
target = "%s:%s" % (sys.argv[1], sys.argv[2])
head = "CONNECT %s HTTP/1.1\r\nHost: %s\r\n" % (target, target)
if u.username is not None:
    cred = "%s:%s" % (urllib.parse.unquote(u.username), urllib.parse.unquote(u.password or ""))
    head += "Proxy-Authorization: Basic %s\r\n" % base64.b64encode(cred.encode()).decode()
s.sendall((head + "\r\n").encode())
answer = b""
while b"\r\n\r\n" not in answer:
    b = s.recv(1)
    if not b:
        sys.exit("the proxy closed the connection")
    answer += b
status = answer.split(b"\r\n")[0].decode()
if " 200 " not in status:
    sys.exit("the proxy answered " + status)
def up():
    while True:
        b = os.read(0, 65536)
        if not b:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(b)
threading.Thread(target=up, daemon=True).start()
while True:
    b = s.recv(65536)
    if not b:
        break
    os.write(1, b)
`

// Git over SSH through edge, as a task runs it: clone, fetch, ls-remote
// and push with the system's git and no key, a 50 MiB clone streamed
// through, agent forwarding refused while the command runs; the task's
// known_hosts lists edge's host key for github.com alone, read-only; the
// private key is nowhere the task can read, nor in edge's log or audit;
// and edge's host key is the same after a restart, sealed at rest.
func TestGitOverSSH(t *testing.T) {
	g := newGitSSH(t, "open", map[string]sshKeySpec{
		"acme": {allow: []string{"git-upload-pack", "git-receive-pack"}, repositories: []string{"org/*"}},
	})
	wantKnownHosts := edgeKnownHosts(g.e)

	t.Run("Tasks", func(t *testing.T) {
		t.Run("CloneFetchLsRemotePush", func(t *testing.T) {
			t.Parallel()
			g.srv.NewRepo(t, "org/repo.git")
			initial := g.srv.Head(t, "org/repo.git", "main")
			r := g.run(t, "acme", sshPrompt(
				sshStep{"clone", "git clone -q git@github.com:org/repo.git a\necho \"head=$(git -C a rev-parse HEAD)\"\ncat a/README"},
				sshStep{"clone2", "git clone -q git@github.com:org/repo.git b"},
				sshStep{"ls-remote", "git ls-remote git@github.com:org/repo.git"},
				sshStep{"push", `cd a
echo 'written by the task' >TASK
git add TASK
git -c user.name=Task -c user.email=task@example.invalid commit -q -m 'a commit of the task'
git push -q origin HEAD:main
echo "pushed=$(git rev-parse HEAD)"`},
				sshStep{"fetch", `cd b
git fetch -q origin
echo "fetched=$(git rev-parse origin/main)"
git merge -q --ff-only origin/main
cat TASK`},
			))
			clone := r.step(t, "clone")
			if got := lineValue(t, clone, "head"); got != initial {
				t.Errorf("the clone is at %s, the server's main at %s", got, initial)
			}
			if !strings.Contains(clone, "A repository of gitsshd's: org/repo.git") {
				t.Errorf("the clone's README:\n%s", clone)
			}
			r.step(t, "clone2")
			if ls := r.step(t, "ls-remote"); !strings.Contains(ls, initial+"\trefs/heads/main\n") {
				t.Errorf("git ls-remote printed %q, want main at %s", ls, initial)
			}
			pushed := lineValue(t, r.step(t, "push"), "pushed")
			if head := g.srv.Head(t, "org/repo.git", "main"); pushed == "" || pushed == initial || head != pushed {
				t.Errorf("the server's main is %s after the task pushed %s (it was %s)", head, pushed, initial)
			}
			fetch := r.step(t, "fetch")
			if got := lineValue(t, fetch, "fetched"); got != pushed {
				t.Errorf("the task fetched %s, pushed %s", got, pushed)
			}
			if !strings.Contains(fetch, "written by the task") {
				t.Errorf("the fetched commit lacks the task's file:\n%s", fetch)
			}
			wantCmds := []string{"git-upload-pack", "git-upload-pack", "git-upload-pack", "git-receive-pack", "git-upload-pack"}
			var want []string
			for _, c := range wantCmds {
				want = append(want, c+" 'org/repo.git'")
			}
			if got := commandsOn(g.srv, "org/repo.git"); !slices.Equal(got, want) {
				t.Errorf("the server ran %q, want %q", got, want)
			}
			// One audit line per command, each substituted with the key.
			lines := r.audit(t, "5 commands substituted", func(ls []audit.Entry) bool { return len(sshLines(ls)) >= len(wantCmds) })
			var got []string
			for _, l := range sshLines(lines) {
				got = append(got, l.SSH.Command)
				if l.Action != audit.Substituted || l.Host != "github.com:22" || l.Via != audit.ViaTransparent ||
					!slices.Equal(l.Keys, []string{"acme/GIT_SSH"}) || l.SSH.Request != "exec" || l.SSH.Repository != "org/repo" ||
					l.SSH.ExitStatus == nil || *l.SSH.ExitStatus != 0 {
					j, _ := json.Marshal(l)
					t.Errorf("an audit line of the git commands: %s", j)
				}
			}
			if !slices.Equal(got, wantCmds) {
				t.Errorf("the audit's commands: %q, want %q", got, wantCmds)
			}
		})

		t.Run("LargeClone", func(t *testing.T) {
			if testing.Short() {
				t.Skip("a 50 MiB clone; skipped under -short")
			}
			t.Parallel()
			const size = 50 << 20
			g.srv.NewRepoOfSize(t, "org/big.git", size)
			head := g.srv.Head(t, "org/big.git", "main")
			start := time.Now()
			r := g.run(t, "acme", sshPrompt(
				sshStep{"clone", `git clone -q git@github.com:org/big.git big
echo "size=$(stat -c %s big/data)"
echo "head=$(git -C big rev-parse HEAD)"`},
				sshStep{"push", `cd big
head -c 20971520 /dev/urandom >up
git -c core.compression=0 add up
git -c user.name=Task -c user.email=task@example.invalid commit -q -m '20 MiB of the task'
git -c core.compression=0 -c pack.compression=0 push -q origin HEAD:main
echo "pushed=$(git rev-parse HEAD)"
cd ..
rm -rf big`},
			))
			t.Logf("the task cloned 50 MiB through edge in %v (its whole run)", time.Since(start).Round(time.Millisecond))
			text := r.step(t, "clone")
			if got := lineValue(t, text, "size"); got != fmt.Sprint(size) {
				t.Errorf("the cloned file has %s bytes, want %d", got, size)
			}
			// git checks every object's hash as it indexes the pack.
			if got := lineValue(t, text, "head"); got != head {
				t.Errorf("the clone is at %s, the server's main at %s", got, head)
			}
			pushed := lineValue(t, r.step(t, "push"), "pushed")
			if got := g.srv.Head(t, "org/big.git", "main"); got != pushed {
				t.Errorf("the server's main is %s after the task pushed %s", got, pushed)
			}
			lines := r.audit(t, "the clone's and the push's lines", func(ls []audit.Entry) bool { return len(sshLines(ls)) >= 2 })
			if l := sshLines(lines); len(l) != 2 || l[0].Action != audit.Substituted || l[0].BytesOut < size ||
				l[1].Action != audit.Substituted || l[1].SSH.Command != "git-receive-pack" || l[1].BytesIn < 20<<20 {
				t.Errorf("the audit: %+v, want the clone substituted with at least %d bytes to the task, the push with 20 MiB from it", l, size)
			}
		})

		// ssh -A asks for the task's agent: refused (OpenSSH asks without
		// wanting a reply, so the task is not told), audited, and the
		// command itself, allowed, runs.
		t.Run("AgentForwarding", func(t *testing.T) {
			t.Parallel()
			g.srv.NewRepo(t, "org/agent.git")
			r := g.run(t, "acme", sshPrompt(sshStep{"agent", `eval "$(ssh-agent -s)" >/dev/null
trap 'ssh-agent -k >/dev/null' EXIT
printf 0000 | ssh -A git@github.com git-upload-pack org/agent.git`}))
			if text := r.step(t, "agent"); !strings.Contains(text, " refs/heads/main\n") {
				t.Errorf("git-upload-pack under ssh -A did not advertise main:\n%s", text)
			}
			lines := r.audit(t, "the agent request and the command", func(ls []audit.Entry) bool { return len(sshLines(ls)) >= 2 })
			var agent, cmd int
			for _, l := range sshLines(lines) {
				switch {
				case l.SSH.Request == "auth-agent-req@openssh.com" && l.Action == audit.Blocked &&
					l.Reason == "agent forwarding (ssh -A) is not allowed: the task never signs with a key":
					agent++
				case l.SSH.Request == "exec" && l.Action == audit.Substituted && l.SSH.Command == "git-upload-pack" && l.SSH.Repository == "org/agent":
					cmd++
				default:
					t.Errorf("an unexpected audit line: %+v %+v", l, *l.SSH)
				}
			}
			if agent != 1 || cmd != 1 {
				t.Errorf("the audit has %d agent refusals and %d commands, want 1 each", agent, cmd)
			}
		})

		// A refused command leaves the connection usable: on one
		// connection (a ControlMaster's), a push to a repository outside
		// the key's is refused, then a fetch of one inside runs.
		t.Run("RefusedThenAllowedOnOneConnection", func(t *testing.T) {
			t.Parallel()
			g.srv.NewRepo(t, "org/mux.git")
			r := g.run(t, "acme", sshPrompt(sshStep{"mux", `ssh -fNM -S "$HOME/cm" git@github.com
ssh -S "$HOME/cm" git@github.com git-receive-pack evil/repo.git && exit 1
echo "refused=$?"
printf 0000 | ssh -S "$HOME/cm" git@github.com git-upload-pack org/mux.git
echo "fetched=$?"
ssh -S "$HOME/cm" -O exit git@github.com 2>/dev/null || true`}))
			text := r.step(t, "mux")
			for _, want := range []string{
				"runfleet: repository evil/repo is not one key GIT_SSH may reach on github.com\nrefused=1\n",
				" refs/heads/main\n",
				"fetched=0\n",
			} {
				if !strings.Contains(text, want) {
					t.Errorf("the task's sessions on one connection lack %q:\n%s", want, text)
				}
			}
			lines := r.audit(t, "the refusal and the command", func(ls []audit.Entry) bool { return len(sshLines(ls)) >= 2 })
			if l := sshLines(lines); len(l) != 2 || l[0].Action != audit.Blocked || l[0].SSH.Command != "git-receive-pack" ||
				l[1].Action != audit.Substituted || l[1].SSH.Repository != "org/mux" {
				t.Errorf("the audit of the two sessions: %+v, want the push blocked, then the fetch substituted", l)
			}
			if got, want := commandsOn(g.srv, "org/mux.git"), []string{"git-upload-pack 'org/mux.git'"}; !slices.Equal(got, want) {
				t.Errorf("the server ran %q on org/mux.git, want %q", got, want)
			}
		})

		// The repository as git servers read it (a leading "/", no
		// ".git"), the user the task names ignored (edge logs in as the
		// key's), eight commands at once, and an upstream's own failure
		// relayed with its exit status.
		t.Run("URLFormsAndUpstreamErrors", func(t *testing.T) {
			t.Parallel()
			g.srv.NewRepo(t, "org/forms.git")
			head := g.srv.Head(t, "org/forms.git", "main")
			forms := []string{"ssh://git@github.com/org/forms.git", "ssh://git@github.com:22/org/forms", "someone@github.com:org/forms.git", "github.com:org/forms.git"}
			var steps []sshStep
			for i, u := range forms {
				steps = append(steps, sshStep{fmt.Sprintf("form%d", i), "git ls-remote " + u})
			}
			steps = append(steps,
				sshStep{"parallel", `for i in 1 2 3 4 5 6 7 8; do
	(git ls-remote git@github.com:org/forms.git >"$i.out" 2>&1; echo $? >"$i.rc") &
done
wait
echo "exits=$(cat *.rc | tr -d '\n')"
cat *.out`},
				sshStep{"missing", "git ls-remote git@github.com:org/missing.git"},
			)
			r := g.run(t, "acme", sshPrompt(steps...))
			for i, u := range forms {
				if text := r.step(t, fmt.Sprintf("form%d", i)); !strings.Contains(text, head+"\trefs/heads/main\n") {
					t.Errorf("git ls-remote %s printed %q, want main at %s", u, text, head)
				}
			}
			text := r.step(t, "parallel")
			if got := lineValue(t, text, "exits"); got != "00000000" {
				t.Errorf("eight git ls-remote at once exited %s, want 0 each:\n%s", got, text)
			}
			if n := strings.Count(text, head+"\trefs/heads/main\n"); n != 8 {
				t.Errorf("eight git ls-remote at once listed main %d times:\n%s", n, text)
			}
			if text := r.failed(t, "missing"); !strings.Contains(text, "'org/missing.git' does not appear to be a git repository") {
				t.Errorf("the upstream's refusal of a missing repository did not reach the task:\n%s", text)
			}
			lines := r.audit(t, "every command", func(ls []audit.Entry) bool { return len(sshLines(ls)) >= len(forms)+8+1 })
			var missing int
			for _, l := range sshLines(lines) {
				switch {
				case l.Action == audit.Substituted && l.SSH.Repository == "org/forms" && l.SSH.ExitStatus != nil && *l.SSH.ExitStatus == 0:
				case l.Action == audit.Substituted && l.SSH.Repository == "org/missing" && l.SSH.ExitStatus != nil && *l.SSH.ExitStatus != 0:
					missing++
				default:
					j, _ := json.Marshal(l)
					t.Errorf("an unexpected audit line: %s", j)
				}
			}
			if missing != 1 {
				t.Errorf("the audit has %d lines of the missing repository with its exit status, want 1", missing)
			}
		})

		// An ssh ProxyCommand through the task's HTTPS_PROXY (a CONNECT to
		// github.com:22) meets the same front.
		t.Run("ThroughTheExplicitProxy", func(t *testing.T) {
			t.Parallel()
			g.srv.NewRepo(t, "org/proxied.git")
			head := g.srv.Head(t, "org/proxied.git", "main")
			r := g.run(t, "acme", sshPrompt(sshStep{"proxied", `cat >"$HOME/connect.py" <<'EOF'
` + sshConnectScript + `EOF
GIT_SSH_COMMAND="ssh -o ProxyCommand='/usr/bin/python3 $HOME/connect.py %h %p'" git ls-remote git@github.com:org/proxied.git`}))
			if text := r.step(t, "proxied"); !strings.Contains(text, head+"\trefs/heads/main\n") {
				t.Errorf("git ls-remote through the explicit proxy printed %q, want main at %s", text, head)
			}
			lines := r.audit(t, "the command", func(ls []audit.Entry) bool { return len(sshLines(ls)) >= 1 })
			if l := sshLines(lines); len(l) != 1 || l[0].Action != audit.Substituted || l[0].Via != "" || l[0].SSH.Repository != "org/proxied" {
				t.Errorf("the audit of the proxied command: %+v, want one substituted line through the explicit proxy (no via)", l)
			}
		})

		// Under open egress a name no key reaches resolves, and its
		// connection is tunnelled untouched (egress open's rule, unlike
		// strict's, TestGitOverSSHRefusals): edge's front is not there and
		// no key of edge's is used; the task's ssh, which trusts no host
		// key for that name, goes no further than the upstream's. (BatchMode:
		// the task has a terminal, where ssh would ask whether to trust it.)
		t.Run("UngrantedNameUnderOpenEgress", func(t *testing.T) {
			t.Parallel()
			r := g.run(t, "acme", sshPrompt(sshStep{"ls-remote", "GIT_SSH_COMMAND='ssh -o BatchMode=yes' git ls-remote git@gitlab.com:org/repo.git"}))
			if text := r.failed(t, "ls-remote"); !strings.Contains(text, "Host key verification failed.") {
				t.Errorf("git ls-remote git@gitlab.com: want the task's ssh to refuse an unknown host key:\n%s", text)
			}
			lines := r.audit(t, "the tunnel", func(ls []audit.Entry) bool { return len(ls) >= 1 })
			if len(lines) != 1 || lines[0].Action != audit.Tunnelled || lines[0].Host != "gitlab.com:22" || len(lines[0].Keys) != 0 || lines[0].SSH != nil {
				t.Errorf("the audit of gitlab.com:22: %+v, want one tunnel holding no key", lines)
			}
		})

		t.Run("KnownHosts", func(t *testing.T) {
			t.Parallel()
			r := g.run(t, "acme", sshPrompt(
				sshStep{"cat", "cat /etc/ssh/ssh_known_hosts"},
				sshStep{"write", "echo 'gitlab.com ssh-ed25519 AAAA' >>/etc/ssh/ssh_known_hosts"},
				sshStep{"mount", `grep ' /etc/ssh/ssh_known_hosts ' /proc/self/mountinfo | cut -d' ' -f6`},
			))
			if got := r.step(t, "cat"); got != wantKnownHosts+"\n" { // the section adds a newline
				t.Errorf("the task's /etc/ssh/ssh_known_hosts reads %q, want %q", got, wantKnownHosts)
			}
			if text := r.failed(t, "write"); !strings.Contains(text, "ssh_known_hosts") {
				t.Errorf("writing to the known_hosts file failed with %q", text)
			}
			if opts := strings.Split(strings.TrimSpace(r.step(t, "mount")), ","); !slices.Contains(opts, "ro") {
				t.Errorf("the task's /etc/ssh/ssh_known_hosts is mounted %q, want read-only", opts)
			}
		})

		t.Run("NoKeyInTheTask", func(t *testing.T) {
			t.Parallel()
			g.srv.NewRepo(t, "org/leak.git")
			r := g.run(t, "acme", sshPrompt(
				sshStep{"clone", "git clone -q git@github.com:org/leak.git leak"},
				sshStep{"search", sshLeakScript(sshPEMNeedle(t, g.pem), g.f.dir)},
			))
			r.step(t, "clone")
			text := r.step(t, "search")
			if strings.Contains(text, "found: ") {
				t.Errorf("the task read the private key:\n%s", text)
			}
			if want := filepath.Join(g.f.dataDir, "work", r.id); lineValue(t, text, "run") != want {
				t.Errorf("the task's run directory is %q, want %s searched", lineValue(t, text, "run"), want)
			}
			if n := lineValue(t, text, "files"); n == "" || n == "0" {
				t.Errorf("the task could read %q files, so searched nothing", n)
			}
			if !strings.Contains(text, "control: /etc/ssh/ssh_known_hosts\n") {
				t.Errorf("the search did not find edge's host key in /etc/ssh/ssh_known_hosts, so cannot be trusted:\n%s", text)
			}
		})
	})

	t.Run("NoLeak", func(t *testing.T) { g.noLeak(t) })

	// Edge logged in as the key's user alone, whatever the task named.
	g.srv.WaitIdle(t)
	if log := g.srv.Log(); strings.Contains(log, "Invalid user") || strings.Count(log, "Accepted publickey for git ") == 0 {
		t.Errorf("the server's log shows a login as another user than git, or none:\n%s", log)
	}

	// The host key is sealed under <dataDir>/ssh/ and the same after a
	// restart on the data dir: the tasks' known_hosts do not change.
	t.Run("HostKeyAcrossRestarts", func(t *testing.T) {
		path := filepath.Join(g.f.dataDir, sshfront.HostKeyFile)
		if filepath.Dir(path) != filepath.Join(g.f.dataDir, "ssh") {
			t.Errorf("the host key is sealed at %s, want it under <dataDir>/ssh/", path)
		}
		fi, err := os.Stat(path)
		must(t, err)
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("the sealed host key has mode %v, want 0600", fi.Mode().Perm())
		}
		if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm()&0o077 != 0 {
			t.Errorf("the sealed host key's directory: %v %v, want it edge's alone (0700)", di.Mode(), err)
		}
		sealed, err := os.ReadFile(path)
		must(t, err)
		if bytes.Contains(sealed, []byte("PRIVATE KEY")) || bytes.Contains(sealed, []byte("openssh-key-v1")) {
			t.Errorf("the sealed host key file holds a private key in the clear")
		}
		g.e.shutdown()
		g.e = g.f.openWritten(hostOptions{})
		if got := edgeKnownHosts(g.e); got != wantKnownHosts {
			t.Errorf("edge's host key changed across a restart: %q, was %q", got, wantKnownHosts)
		}
		r := g.run(t, "acme", sshPrompt(sshStep{"cat", "cat /etc/ssh/ssh_known_hosts"}, sshStep{"ls-remote", "git ls-remote git@github.com:org/repo.git"}))
		if got := r.step(t, "cat"); got != wantKnownHosts+"\n" {
			t.Errorf("after a restart the task's known_hosts reads %q, want %q as before", got, wantKnownHosts)
		}
		if !strings.Contains(r.step(t, "ls-remote"), "\trefs/heads/main\n") {
			t.Errorf("git ls-remote failed after the restart")
		}
		g.noLeak(t)
	})
}

// encryptedSSHKey is a private key file encrypted with a passphrase.
func encryptedSSHKey(t *testing.T) []byte {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	must(t, err)
	block, err := ssh.MarshalPrivateKeyWithPassphrase(priv, "", []byte("a passphrase"))
	must(t, err)
	return pem.EncodeToMemory(block)
}

// What a task may not do over SSH, each refused with its reason shown to
// the task and audited, none reaching the upstream: the server accepts
// one connection (the dial whose host key edge refused), authenticates
// nobody and runs nothing. Egress is strict, so a name no key reaches has
// no DNS answer.
func TestGitOverSSHRefusals(t *testing.T) {
	other, _ := gitsshd.NewClientKey(t)
	encrypted := encryptedSSHKey(t)
	g := newGitSSH(t, "strict", map[string]sshKeySpec{
		"missing":   {allow: []string{"git-upload-pack"}, value: sshNoValue},
		"notakey":   {allow: []string{"git-upload-pack"}, value: "not a private key"},
		"encrypted": {allow: []string{"git-upload-pack"}, value: string(encrypted)},
		"acme":      {allow: []string{"git-upload-pack", "git-receive-pack"}, repositories: []string{"org/*"}},
		"ro":        {allow: []string{"git-upload-pack"}},
		// Lists another key for github.com than the server's.
		"badhost": {allow: []string{"git-upload-pack"}, knownHosts: []string{knownhosts.Line([]string{"github.com"}, other.PublicKey())}},
	})
	g.srv.NewRepo(t, "org/repo.git")
	initial := g.srv.Head(t, "org/repo.git", "main")

	// blockedLine is a refusal the audit must hold: the request, and the
	// reason's start.
	type blockedLine struct{ request, reason string }
	wantBlocked := func(t *testing.T, r sshRun, key string, wants ...blockedLine) {
		t.Helper()
		match := func(l audit.Entry) (matched bool) {
			for _, w := range wants {
				matched = matched || l.SSH.Request == w.request && strings.HasPrefix(l.Reason, w.reason)
			}
			return matched
		}
		lines := r.audit(t, fmt.Sprintf("%d refusals", len(wants)), func(ls []audit.Entry) bool {
			return !slices.ContainsFunc(wants, func(w blockedLine) bool {
				return !slices.ContainsFunc(sshLines(ls), func(l audit.Entry) bool {
					return l.SSH.Request == w.request && strings.HasPrefix(l.Reason, w.reason)
				})
			})
		})
		for _, l := range sshLines(lines) {
			if !match(l) || l.Action != audit.Blocked || l.Status != 403 || l.Host != "github.com:22" || l.Via != audit.ViaTransparent {
				j, _ := json.Marshal(l)
				t.Errorf("an unexpected audit line: %s", j)
			}
			if l.SSH.Request == "exec" && !slices.Equal(l.Keys, []string{key}) && l.SSH.Command != "" && !strings.HasPrefix(l.SSH.Command, `"`) {
				t.Errorf("a refused git command's audit names keys %q, want %s", l.Keys, key)
			}
		}
	}

	t.Run("Tasks", func(t *testing.T) {
		t.Run("PushWhereOnlyFetchIsAllowed", func(t *testing.T) {
			t.Parallel()
			r := g.run(t, "ro", sshPrompt(sshStep{"push", `git init -q -b main local
cd local
git -c user.name=Task -c user.email=task@example.invalid commit -q --allow-empty -m 'a commit of the task'
git push git@github.com:org/repo.git HEAD:refs/heads/main`}))
			const reason = "git-receive-pack is not allowed for key GIT_SSH on github.com"
			if text := r.failed(t, "push"); !strings.Contains(text, "runfleet: "+reason+"\n") {
				t.Errorf("git push does not show the refusal:\n%s", text)
			}
			wantBlocked(t, r, "ro/GIT_SSH", blockedLine{"exec", reason})
			lines := sshLines(auditLines(t, g.f, r.id))
			if len(lines) != 1 || lines[0].SSH.Command != "git-receive-pack" || lines[0].SSH.Repository != "org/repo" ||
				lines[0].SSH.ExitStatus == nil || *lines[0].SSH.ExitStatus != 1 {
				t.Errorf("the push's audit: %+v, want one line naming git-receive-pack on org/repo, exit status 1", lines)
			}
		})

		t.Run("NotGitCommands", func(t *testing.T) {
			t.Parallel()
			const notGit = "only git commands run over SSH here"
			forward := func(name, flag, client string) string {
				// With ExitOnForwardFailure, -f backgrounds ssh only once
				// its forwarding listens: the client goes through it then,
				// and the master's control socket ends it, with no race.
				// A backgrounded ssh writes its messages to -E's file, not
				// stderr.
				cm, log := `"$HOME/`+name+`.cm"`, `"$HOME/`+name+`.log"`
				return `ssh -f -N -M -S ` + cm + ` -E ` + log + ` -o ExitOnForwardFailure=yes ` + flag + ` git@github.com
` + client + ` || true
ssh -S ` + cm + ` -O exit git@github.com
cat ` + log
			}
			r := g.run(t, "acme", sshPrompt(
				sshStep{"outside-repositories", "git ls-remote git@github.com:evil/repo.git"},
				sshStep{"dotdot", "git ls-remote git@github.com:org/../evil/repo.git"},
				sshStep{"shell", "ssh git@github.com"},
				sshStep{"tty", "ssh -tt git@github.com"},
				sshStep{"other-command", "ssh git@github.com id"},
				sshStep{"shell-syntax", `ssh git@github.com "git-upload-pack 'org/repo.git'; id"`},
				sshStep{"sftp", "sftp -b /dev/null git@github.com"},
				sshStep{"subsystem", "ssh -s git@github.com sftp"},
				sshStep{"local-forward", forward("lf", "-L 127.0.0.1:2222:127.0.0.1:80", "curl -sS http://127.0.0.1:2222/")},
				sshStep{"dynamic-forward", forward("df", "-D 127.0.0.1:2223", "curl -sS --socks5-hostname 127.0.0.1:2223 http://example.test/")},
				sshStep{"stdio-forward", "ssh -W 127.0.0.1:80 git@github.com"},
				sshStep{"remote-forward", "ssh -N -o ExitOnForwardFailure=yes -R 127.0.0.1:2224:127.0.0.1:80 git@github.com"},
				sshStep{"ungranted-name", "git ls-remote git@gitlab.com:x/y.git"},
				sshStep{"archive", "git archive --remote=git@github.com:org/repo.git HEAD README"},
				sshStep{"other-port", "ssh -p 2222 git@github.com git-upload-pack org/repo.git"},
			))
			for step, want := range map[string]string{
				"outside-repositories": "runfleet: repository evil/repo is not one key GIT_SSH may reach on github.com\n",
				"dotdot":               `runfleet: ` + notGit + `: git-upload-pack: the repository path has a "." or ".." segment` + "\n",
				"shell":                "runfleet: a shell is not allowed: " + notGit + "\n",
				"tty":                  "PTY allocation request failed",
				"other-command":        `runfleet: ` + notGit + `: "id" is not a git command`,
				"shell-syntax":         `runfleet: ` + notGit + `: the command line holds ';' outside quotes`,
				"sftp":                 `runfleet: the "sftp" subsystem is not allowed: ` + notGit + "\n",
				"subsystem":            `runfleet: the "sftp" subsystem is not allowed: ` + notGit + "\n",
				"stdio-forward":        "administratively prohibited: runfleet: port forwarding (ssh -L, -D) is not allowed: " + notGit,
				"remote-forward":       "Error: remote port forwarding failed for listen port 2224",
				"ungranted-name":       "ssh: Could not resolve hostname gitlab.com",
				"archive":              "runfleet: git-upload-archive is not allowed for key GIT_SSH on github.com\n",
			} {
				if text := r.failed(t, step); !strings.Contains(text, want) {
					t.Errorf("%s: the task does not show %q:\n%s", step, want, text)
				}
			}
			for _, step := range []string{"local-forward", "dynamic-forward"} {
				if text := r.ended(t, step); !strings.Contains(text, "open failed: administratively prohibited: runfleet: port forwarding (ssh -L, -D) is not allowed: "+notGit) {
					t.Errorf("%s: the task does not show the refusal:\n%s", step, text)
				}
			}
			wantBlocked(t, r, "acme/GIT_SSH",
				blockedLine{"exec", "repository evil/repo is not one key GIT_SSH may reach on github.com"},
				blockedLine{"exec", notGit + `: git-upload-pack: the repository path has a "." or ".." segment`},
				blockedLine{"shell", "a shell is not allowed"},
				blockedLine{"pty-req", "a terminal is not allowed"},
				blockedLine{"exec", notGit + `: "id" is not a git command`},
				blockedLine{"exec", notGit + ": the command line holds ';' outside quotes"},
				blockedLine{"subsystem sftp", `the "sftp" subsystem is not allowed`},
				blockedLine{"channel direct-tcpip", "port forwarding (ssh -L, -D) is not allowed"},
				blockedLine{"request tcpip-forward", "remote port forwarding (ssh -R) is not allowed"},
				blockedLine{"exec", "git-upload-archive is not allowed for key GIT_SSH on github.com"},
			)
			r.failed(t, "other-port")
			// gitlab.com had no DNS answer, so no connection to audit;
			// github.com:2222 is a port no key names. The proxy writes that
			// refusal as it closes the connection, which the task may see
			// first: wait for the line.
			isOtherPort := func(l audit.Entry) bool {
				return l.Host == "github.com:2222" && l.Reason == "no key of this task names port 2222 of github.com"
			}
			lines := r.audit(t, "the refusal of github.com:2222", func(ls []audit.Entry) bool {
				return slices.ContainsFunc(ls, isOtherPort)
			})
			otherPort := 0
			for _, l := range lines {
				switch {
				case l.SSH != nil:
				case isOtherPort(l):
					otherPort++
				default:
					t.Errorf("an unexpected audit line: %+v", l)
				}
			}
			if otherPort != 1 {
				t.Errorf("the audit has %d refusals of github.com:2222, want 1", otherPort)
			}
		})

		// A run declaring a key whose value edge cannot sign with is
		// refused before its task starts, saying why, never quoting it.
		t.Run("KeyValueUnusable", func(t *testing.T) {
			t.Parallel()
			for project, want := range map[string]string{
				"missing":   "ssh key missing/GIT_SSH: the secrets source holds no value for it",
				"notakey":   "ssh key notakey/GIT_SSH: the value is not a private key in OpenSSH or PEM form",
				"encrypted": "ssh key encrypted/GIT_SSH: the private key is encrypted",
			} {
				run := g.e.start(runspec.Request{Prompt: "echo started", Secrets: []runspec.Secret{{ProjectID: project, Key: "GIT_SSH", Domains: []string{sshTaskDomain}}}})
				end := g.e.waitEnd(run.RunID)
				g.mu.Lock()
				g.runs = append(g.runs, sshRun{stepsRun: stepsRun{id: run.RunID}, g: g, end: end})
				g.mu.Unlock()
				if end.Status != hostproto.StatusFailed || end.Reason != hostproto.ReasonBrokerNotReady || !strings.Contains(end.Detail, want) {
					t.Errorf("a run declaring %s/GIT_SSH ended %+v, want failed %s saying %q", project, end, hostproto.ReasonBrokerNotReady, want)
				}
				if strings.Contains(g.e.output(run.RunID), "started") {
					t.Errorf("the task of a run declaring %s/GIT_SSH started", project)
				}
				if strings.Contains(end.Detail, "not a private key\"") || strings.Contains(end.Detail, "PRIVATE KEY") {
					t.Errorf("the refusal quotes the value: %q", end.Detail)
				}
			}
		})

		t.Run("HostKeyNotListed", func(t *testing.T) {
			t.Parallel()
			r := g.run(t, "badhost", sshPrompt(sshStep{"ls-remote", "git ls-remote git@github.com:org/repo.git"}))
			reason := "github.com:22 presented host key ssh-ed25519 " + ssh.FingerprintSHA256(g.srv.HostKey()) + ", which knownHosts does not list for it"
			if text := r.failed(t, "ls-remote"); !strings.Contains(text, "runfleet: "+reason+"\n") {
				t.Errorf("git ls-remote does not show the refused host key:\n%s", text)
			}
			lines := r.audit(t, "the denied command", func(ls []audit.Entry) bool { return len(sshLines(ls)) >= 1 })
			if l := sshLines(lines); len(l) != 1 || l[0].Action != audit.Denied || l[0].Reason != reason ||
				!slices.Equal(l[0].Keys, []string{"badhost/GIT_SSH"}) || l[0].SSH.Command != "git-upload-pack" {
				t.Errorf("the audit of the refused host key: %+v, want one denied line with the reason %q", l, reason)
			}
		})
	})

	g.srv.WaitIdle(t)
	if cmds := g.srv.Commands(); len(cmds) != 0 {
		t.Errorf("the server ran %q, want nothing", cmds)
	}
	// The one connection is the dial of the host key edge refused: it
	// ended before authentication.
	if n := g.srv.Connections(); n != 1 {
		t.Errorf("the server accepted %d connections, want 1 (the refused host key's)", n)
	}
	if log := g.srv.Log(); strings.Contains(log, "Accepted") {
		t.Errorf("the server authenticated a client:\n%s", log)
	}
	if head := g.srv.Head(t, "org/repo.git", "main"); head != initial {
		t.Errorf("the server's main moved from %s to %s", initial, head)
	}
	g.noLeak(t)
}

// earlyEOFUpstream is an SSH server on port 22 of a free 127.a.b.c
// answering every exec as sshd answers a command that closes its output
// before it ends: a line, EOF, and its exit status 0 a second later.
type earlyEOFUpstream struct {
	ip      string
	hostKey ssh.PublicKey
}

func startEarlyEOFUpstream(t *testing.T, client ssh.PublicKey) *earlyEOFUpstream {
	t.Helper()
	hostSigner, _ := gitsshd.NewClientKey(t)
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if !bytes.Equal(k.Marshal(), client.Marshal()) {
			return nil, fmt.Errorf("unknown key")
		}
		return nil, nil
	}}
	cfg.AddHostKey(hostSigner)
	var l net.Listener
	for i := 0; l == nil && i < 16; i++ {
		addr := fmt.Sprintf("127.%d.%d.%d:22", 1+mathrand.IntN(254), 1+mathrand.IntN(254), 1+mathrand.IntN(254))
		l, _ = net.Listen("tcp", addr)
	}
	if l == nil {
		t.Fatal("no free port 22 on loopback")
	}
	t.Cleanup(func() { l.Close() })
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				for nc := range chans {
					ch, chReqs, err := nc.Accept()
					if err != nil {
						continue
					}
					go func() {
						defer ch.Close()
						for r := range chReqs {
							if r.Type != "exec" {
								r.Reply(false, nil)
								continue
							}
							r.Reply(true, nil)
							io.WriteString(ch, "early-eof-upstream\n")
							ch.CloseWrite()
							select {
							case <-time.After(time.Second):
							case <-done:
							}
							ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
							return
						}
					}()
				}
			}()
		}
	}()
	return &earlyEOFUpstream{ip: l.Addr().(*net.TCPAddr).IP.String(), hostKey: hostSigner.PublicKey()}
}

// An upstream may end a command's output (EOF) before the command ends
// (sshd sends EOF when the output closes, the exit status once the process
// is reaped): edge must still relay the exit status. A plain ssh waits for
// the other side's close; a ControlMaster's session (ssh -S), its stdin
// ended, closes the channel as soon as it has EOF both ways, counting on
// the other side to send the exit status before its own close, as sshd
// does. Edge's SSH library answers that close at once, so an exit status
// edge relays after the EOF is never sent, and the task's ssh exits 255
// although the command succeeded (audited exit status 0): edge must pass
// the status on before its EOF. With sshd upstream the window was short
// but real: about one ControlMaster session in twenty exited 255.
func TestGitOverSSHRelaysTheExitStatusAfterTheUpstreamsEOF(t *testing.T) {
	signer, pemKey := gitsshd.NewClientKey(t)
	up := startEarlyEOFUpstream(t, signer.PublicKey())
	g := openGitSSH(t, "strict", map[string]sshKeySpec{
		"acme": {allow: []string{"git-upload-pack"}, knownHosts: []string{knownhosts.Line([]string{"github.com"}, up.hostKey)}},
	}, nil, up.ip, pemKey)
	r := g.run(t, "acme", sshPrompt(
		sshStep{"plain", "ssh git@github.com git-upload-pack org/repo.git"},
		sshStep{"multiplexed", `ssh -fNM -S "$HOME/cm" git@github.com
ssh -S "$HOME/cm" git@github.com git-upload-pack org/repo.git || rc=$?
ssh -S "$HOME/cm" -O exit git@github.com 2>/dev/null
exit $rc`},
	))
	for _, step := range []string{"plain", "multiplexed"} {
		if text := r.step(t, step); !strings.Contains(text, "early-eof-upstream\n") {
			t.Errorf("%s: the command's output did not reach the task:\n%s", step, text)
		}
	}
	lines := r.audit(t, "the commands", func(ls []audit.Entry) bool { return len(sshLines(ls)) >= 2 })
	for _, l := range sshLines(lines) {
		if l.Action != audit.Substituted || l.SSH.ExitStatus == nil || *l.SSH.ExitStatus != 0 {
			t.Errorf("the audit of a command: %+v %+v, want it substituted with exit status 0", l, *l.SSH)
		}
	}
}
