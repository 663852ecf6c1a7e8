package host

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// gitHTTPBackend is Debian's git smart HTTP server (package git), run as
// CGI behind the fixture's TLS upstream.
const gitHTTPBackend = "/usr/lib/git-core/git-http-backend"

// gitUpstream is a GitHub-like upstream: a bare repository served over
// smart HTTP at /org/repo.git, pushes accepted (http.receivepack), that
// records the Authorization each request brought.
type gitUpstream struct {
	repo string // the bare repository's directory

	mu   sync.Mutex
	seen map[string]string // "METHOD path": its Authorization
}

// newGitUpstream makes the fixture's granted upstream a gitUpstream, before
// the host is opened.
func newGitUpstream(t *testing.T, f *fixture) *gitUpstream {
	t.Helper()
	if _, err := os.Stat(gitHTTPBackend); err != nil {
		t.Fatalf("git's smart HTTP server is missing (apt-get install git): %v", err)
	}
	root := t.TempDir()
	u := &gitUpstream{repo: filepath.Join(root, "org", "repo.git"), seen: map[string]string{}}
	must(t, os.MkdirAll(u.repo, 0o755))
	u.git(t, "init", "--bare", "--initial-branch", "main")
	u.git(t, "config", "http.receivepack", "true")
	tree := u.git(t, "hash-object", "-t", "tree", "-w", "/dev/null")
	u.git(t, "update-ref", "refs/heads/main", u.git(t, "commit-tree", tree, "-m", "the first commit"))
	backend := &cgi.Handler{Path: gitHTTPBackend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	f.upstream = f.ca.TLSServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen[r.Method+" "+r.URL.Path] = r.Header.Get("Authorization")
		u.mu.Unlock()
		backend.ServeHTTP(w, r)
	}), "api.example.test")
	f.upstreamHost = "api.example.test:" + port(f.upstream)
	return u
}

func (u *gitUpstream) git(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"--git-dir", u.repo}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.test", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.test")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func (u *gitUpstream) head(t *testing.T) string { return u.git(t, "rev-parse", "refs/heads/main") }

func (u *gitUpstream) auth(request string) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	a, ok := u.seen[request]
	return a, ok
}

// setKeyRules adds request rules (JSON members) to API_TOKEN in the
// fixture's written edge.json.
func (f *fixture) setKeyRules(members map[string]any) {
	f.t.Helper()
	b, err := os.ReadFile(f.cfgPath)
	must(f.t, err)
	var cfg map[string]any
	must(f.t, json.Unmarshal(b, &cfg))
	key := cfg["policy"].(map[string]any)["projects"].(map[string]any)["acme"].(map[string]any)["keys"].(map[string]any)["API_TOKEN"].(map[string]any)
	for k, v := range members {
		key[k] = v
	}
	b, err = json.MarshalIndent(cfg, "", "  ")
	must(f.t, err)
	must(f.t, os.WriteFile(f.cfgPath, b, 0o600))
}

// The README's GitHub key that can fetch but never push over HTTPS: the
// task's own git, configured by nothing but edge's variables (HTTPS_PROXY,
// GIT_SSL_CAINFO) and its placeholder in an http.extraHeader, clones
// through edge with the real value and is refused its push, the rule named
// in the audit line, the upstream's branch untouched. In warn mode the same
// push goes through, audited warned with the rule that would have refused
// it.
func TestRequestRulesLetGitFetchButNotPushOverHTTPS(t *testing.T) {
	for _, mode := range []string{"enforce", "warn"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t)
			up := newGitUpstream(t, f)
			f.writeConfig()
			f.setKeyRules(map[string]any{
				"rules": []any{map[string]any{"deny": map[string]any{"paths": []string{"/**/git-receive-pack"}}}},
				"mode":  mode,
			})
			e := f.openWritten(hostOptions{})
			initial := up.head(t)
			url := "https://" + f.upstreamHost + "/org/repo.git"
			prompt := fmt.Sprintf(`export GIT_TERMINAL_PROMPT=0
git config --global http.extraHeader "Authorization: Bearer $API_TOKEN"
git config --global user.name Task
git config --global user.email task@example.invalid
git clone -q %s repo 2>&1; echo "clone exit=$?"
cd repo && echo "cloned=$(git rev-parse HEAD)"
echo change > CHANGE && git add CHANGE && git commit -q -m 'a commit of the task'
echo "committed=$(git rev-parse HEAD)"
git push -q origin HEAD:main 2>&1; echo "push exit=$?"
`, url)
			run := e.start(runspec.Request{Prompt: prompt, Secrets: e.apiToken()})
			e.waitEnd(run.RunID)
			out := strings.ReplaceAll(e.output(run.RunID), "\r\n", "\n")
			if strings.Contains(out, realSecret) {
				t.Fatal("the task saw the real value")
			}
			if envLine(out, "clone exit") != "0" || envLine(out, "cloned") != initial {
				t.Fatalf("the clone through edge failed or got another head (want %s):\n%s", initial, out)
			}
			committed := envLine(out, "committed")
			if len(committed) != 40 || committed == initial {
				t.Fatalf("the task made no commit:\n%s", out)
			}
			for _, req := range []string{"GET /org/repo.git/info/refs", "POST /org/repo.git/git-upload-pack"} {
				if a, ok := up.auth(req); !ok || a != "Bearer "+realSecret {
					t.Errorf("%s reached the upstream %v, with the real value %v", req, ok, a == "Bearer "+realSecret)
				}
			}

			pushAuth, pushed := up.auth("POST /org/repo.git/git-receive-pack")
			wantAction := audit.Blocked
			if mode == "enforce" {
				if envLine(out, "push exit") == "0" || !strings.Contains(out, "403") {
					t.Errorf("the push was not refused 403:\n%s", out)
				}
				if pushed || up.head(t) != initial {
					t.Errorf("the refused push reached the upstream (%v) or moved its branch", pushed)
				}
			} else {
				wantAction = audit.Warned
				if envLine(out, "push exit") != "0" || !pushed || pushAuth != "Bearer "+realSecret || up.head(t) != committed {
					t.Errorf("warn mode did not let the push through with the real value (upstream head %s, want %s):\n%s", up.head(t), committed, out)
				}
			}

			var lines []audit.Entry
			var push *audit.Entry
			await.Within(10*time.Second, func() bool {
				lines = auditLines(t, f, run.RunID)
				for i := range lines {
					if lines[i].Method == "POST" && lines[i].Path == "/org/repo.git/git-receive-pack" {
						push = &lines[i]
					}
				}
				return push != nil
			})
			if push == nil {
				t.Fatalf("no audit line of the push among %d", len(lines))
			}
			const rule = "projects.acme.keys.API_TOKEN.rules[0]"
			if push.Action != wantAction || push.Rule != rule || strings.Join(push.Keys, ",") != "acme/API_TOKEN" || !strings.Contains(push.Reason, rule+" (deny /**/git-receive-pack)") {
				t.Errorf("the push's audit line: %s by %q, keys %v, reason %q; want %s by %s", push.Action, push.Rule, push.Keys, push.Reason, wantAction, rule)
			}
			if mode == "enforce" && push.Status != http.StatusForbidden {
				t.Errorf("the refused push's audit status %d", push.Status)
			}
			for _, l := range lines {
				if strings.HasSuffix(l.Path, "/git-upload-pack") && (l.Action != audit.Substituted || l.Rule != "projects.acme.keys.API_TOKEN.default") {
					t.Errorf("the fetch's audit line: %s by %q", l.Action, l.Rule)
				}
			}
		})
	}
}
