package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/broker"
	"github.com/runfleet/runfleet/shared/clock"
	fleetconfig "github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleetapi"
	"github.com/runfleet/runfleet/shared/hostproto"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakegithub"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/fakeoauth"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// Issue 33 end to end: credentials Fleet mints. Fleet as deployed
// (fleetapp, configured by RUNFLEET_BROKER and RUNFLEET_BROKER_KEY files)
// mints GitHub App installation tokens at a fake GitHub on loopback TLS
// (tests/kit/fakegithub: JWT-checked mints, git smart HTTP through the real
// git http-backend) for a real edge host whose policy takes the key from
// Fleet, and OAuth2 access tokens at a fake token endpoint that rotates
// refresh tokens (tests/kit/fakeoauth) for fake hosts, on both stores.
// Fleet and the providers share a fake clock, so a token's hour passes at
// once; edge runs on the wall clock (a value's expiry there is an hour
// away, which no test reaches). Tasks run as nobody: root only.

const (
	bkProject = "acme"
	// bkGitHubKey is the key whose value Fleet mints at GitHub.
	bkGitHubKey = "GITHUB_TOKEN"
	bkAppID     = 31337
	// bkInstallation holds bkRepo and bkOtherRepo.
	bkInstallation = 4711
	// bkRepo is the runs' repository.
	bkRepo = "acme/app"
	// bkOtherRepo is in the same installation: a run's token must not
	// reach it.
	bkOtherRepo = "acme/other"
	// bkOutsideRepo exists on GitHub but is not in the installation.
	bkOutsideRepo = "acme/private"
	// bkOAuthKey is the key whose value Fleet refreshes at the token
	// endpoint.
	bkOAuthKey = "SAAS_TOKEN"
)

// bkPermissions are what the recipe asks for each token: a token never
// has more.
var bkPermissions = map[string]string{"contents": "write", "metadata": "read"}

// brokerEnv writes RUNFLEET_BROKER's document (recipes) and the files its
// secret references name (relative to the document, as file:<name>) into
// a directory of their own, and RUNFLEET_BROKER_KEY's file (32 random
// bytes, 0600): the variables a Fleet is configured with. Fleets given the
// same variables share the key their sealed tokens open with.
func brokerEnv(t testing.TB, recipes map[string]any, files map[string][]byte) map[string]string {
	t.Helper()
	dir := t.TempDir()
	for name, b := range files {
		must(t, os.WriteFile(filepath.Join(dir, name), b, 0o600))
	}
	doc, err := json.Marshal(recipes)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, "broker.json"), doc, 0o600))
	key := make([]byte, 32)
	_, err = rand.Read(key)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, "broker.key"), key, 0o600))
	return map[string]string{
		fleetconfig.EnvBroker:    "file:" + filepath.Join(dir, "broker.json"),
		fleetconfig.EnvBrokerKey: "file:" + filepath.Join(dir, "broker.key"),
	}
}

// ghStory is a real edge host and a Fleet minting its runs' GitHub tokens
// at a fake GitHub, on one store kind.
type ghStory struct {
	t *testing.T
	// clk is Fleet's and the fake GitHub's clock.
	clk *clock.Fake
	gh  *fakegithub.Server
	// appKey is the App's private key (PEM), which only Fleet reads.
	appKey []byte
	e      *e2eEdge
	f      *e2eFleet
	caller string
	// metrics are Fleet's EMF lines.
	metrics *syncbuf.Buffer
	// roots is edge's upstream roots file: the demo upstream's CA and
	// the fake GitHub's.
	roots string
	// work is the runs' localPath on edge, where the git task clones
	// the repository itself with the placeholder in the URL (without a
	// localPath edge clones it first: TestBrokerGitHubEdgeClonesAPrivateRepository).
	work string
	// n numbers the steps a task is sent.
	n int
	// tags are the tag each run's task echoes first, by host run id: a
	// retried attempt runs the same prompt.
	tags map[string]string
	// ids are the runs Fleet created.
	ids []string
}

// newGHStory starts the fake GitHub (the App installed on bkRepo and
// bkOtherRepo; bkOutsideRepo outside the installation), the edge host (its
// policy taking acme/GITHUB_TOKEN from Fleet for the fake's git host) and
// a Fleet on kind configured with a githubApp recipe for that key (the
// installation named, or looked up byRepository), and registers the host
// with the runs' local path and a caller alice who may use project acme.
func newGHStory(t *testing.T, kind string, byRepository bool) *ghStory {
	t.Helper()
	s := &ghStory{t: t, clk: clock.NewFake(time.Now().UTC().Truncate(time.Second)), tags: map[string]string{}, metrics: &syncbuf.Buffer{}}
	key := fakegithub.NewAppKey(t)
	s.appKey = fakegithub.PKCS1PEM(key)
	s.gh = fakegithub.New(t, fakegithub.Options{Clock: s.clk, Repos: []string{bkOutsideRepo}, Apps: []fakegithub.App{{
		ID: bkAppID, Key: &key.PublicKey,
		Permissions:   map[string]string{"contents": "write", "metadata": "read", "issues": "write"},
		Installations: []fakegithub.Installation{{ID: bkInstallation, Repos: []string{bkRepo, bkOtherRepo}}},
	}}})

	s.e = newE2EEdge(t)
	s.roots = filepath.Join(s.e.dir, "etc", "upstream-roots.pem")
	must(t, os.WriteFile(s.roots, append(s.e.upstream.CAPEM(), s.gh.CA.PEM...), 0o600))
	s.work = filepath.Join(s.e.dir, "repos", "app")
	must(t, os.MkdirAll(s.work, 0o755))
	must(t, os.Chmod(filepath.Dir(s.work), 0o755))
	s.e.openWith(false, s.edgeConfig)

	var installation any = bkInstallation
	if byRepository {
		installation = broker.ByRepository
	}
	env := brokerEnv(t, map[string]any{bkProject + "/" + bkGitHubKey: map[string]any{"githubApp": map[string]any{
		"appId": bkAppID, "privateKeySecret": "file:app-key.pem", "installationId": installation,
		"permissions": bkPermissions, "apiUrl": s.gh.APIURL(),
	}}}, map[string][]byte{"app-key.pem": s.appKey})
	logs := &syncbuf.Buffer{}
	// A run without a localPath is cloned by edge from the URL Fleet's
	// repository map gives (TestBrokerGitHubEdgeClonesAPrivateRepository).
	st := newStack(t, kind, stackOptions{clock: s.clk, log: logs, metrics: s.metrics, env: env, brokerHTTP: s.gh.Client(),
		hostCredentials: map[string]string{e2eHostRef: e2eHostToken},
		repoURLs:        map[string]string{bkRepo: "https://" + s.gitDomain() + "/" + bkRepo + ".git"}})
	s.f = &e2eFleet{stack: st, logs: logs}
	s.f.call(t, http.StatusCreated, "POST", "/fleet/hosts", adminToken, jsonBody(map[string]any{
		"id": "edge-1", "baseUrl": s.e.baseURL(), "credentialRef": e2eHostRef, "localPaths": []string{s.work}}))
	s.f.probe(t, true)
	s.caller = s.f.call(t, http.StatusCreated, "POST", "/fleet/callers", adminToken,
		`{"ownerId":"alice","allowedHosts":["edge-1"],"allowedProjects":["acme"]}`).str("token")
	return s
}

// edgeConfig is the demo's edge.json changed for the story: the fake's
// git host resolves to it and its CA is trusted; acme/GITHUB_TOKEN comes
// from Fleet and reaches that host alone; local paths under the story's;
// a restart's drain does not wait.
func (s *ghStory) edgeConfig(cfg *config.Config) {
	cfg.Proxy.Upstream.Resolve[fakegithub.DefaultGitHost] = "127.0.0.1"
	cfg.Proxy.Upstream.ExtraRootsFile = s.roots
	cfg.Policy.Projects[bkProject] = config.ProjectPolicy{Keys: map[string]config.KeyPolicy{
		bkGitHubKey: {Domains: []string{s.gitDomain()}, Source: "fleet"},
	}}
	cfg.Runner.Roots = []string{filepath.Dir(s.work)}
	cfg.Runner.DrainTimeout = config.Duration(time.Millisecond)
}

// gitDomain is the fake's git host as a policy and a run name it.
func (s *ghStory) gitDomain() string {
	_, port, err := net.SplitHostPort(s.gh.Addr)
	must(s.t, err)
	return fakegithub.DefaultGitHost + ":" + port
}

// repoURL is repo's clone URL as the README documents it for a task: the
// placeholder as the password of x-access-token.
func (s *ghStory) repoURL(repo string) string {
	return fmt.Sprintf("https://x-access-token:$%s@%s/%s.git", bkGitHubKey, s.gitDomain(), repo)
}

// dispatchBody is a run of repo, in the story's local path, declaring
// acme/GITHUB_TOKEN for the git host, whose shell task runs prompt.
func (s *ghStory) dispatchBody(repo, prompt string) string {
	return jsonBody(map[string]any{"agent": "shell", "prompt": prompt, "repository": repo, "localPath": s.work,
		"secrets": []map[string]any{{"projectId": bkProject, "key": bkGitHubKey, "domains": []string{s.gitDomain()}}}})
}

// gitTask is a task that does, step by step, what the test sends it
// (input "<step> <n>"), each step answered by a line "result <step> <n>
// <exit code>": clone and push bkRepo, fetch it again, list its refs,
// clone bkOtherRepo, call the git host with curl, or end. Its git is the
// system's, configured by edge's variables alone (HTTPS_PROXY,
// GIT_SSL_CAINFO) and the placeholder in the URL.
func (s *ghStory) gitTask(tag string) string {
	return fmt.Sprintf(`echo %[1]s
cd "$HOME"
export GIT_TERMINAL_PROMPT=0
git config --global user.name Task
git config --global user.email task@example.invalid
while read -r step n; do
  [ -n "$step" ] || continue
  case "$step" in
  clone) rm -rf app; git clone -q "%[2]s" app 2>&1 ;;
  push) (cd app && date +%%s%%N > change && git add change && git commit -q -m "a change of the task" && git push -q origin HEAD:main) 2>&1 ;;
  fetch) (cd app && git fetch -q origin && git merge -q --ff-only origin/main) 2>&1 ;;
  lsremote) git ls-remote "%[2]s" refs/heads/main 2>&1 ;;
  other) rm -rf other; git clone -q "%[3]s" other 2>&1 ;;
  curl) curl -sS -u "x-access-token:$%[4]s" "https://%[5]s/%[6]s.git/info/refs?service=git-upload-pack" -o curl.out -w 'http=%%{http_code}\n'; cat curl.out; echo ;;
  end) echo "result end $n 0"; exit 0 ;;
  esac
  echo "result $step $n $?"
done`, tag, s.repoURL(bkRepo), s.repoURL(bkOtherRepo), bkGitHubKey, s.gitDomain(), bkRepo)
}

var resultLine = regexp.MustCompile(`result (\w+) (\d+) (\d+)`)

// step sends a run's task one step (through Fleet, or with viaHost the
// host's own API) and waits for its result: its exit code and the output
// the step made.
func (s *ghStory) step(id, child, step string, viaHost bool) (int, string) {
	s.t.Helper()
	s.n++
	n := strconv.Itoa(s.n)
	before := len(outputOf(s.e.events(child)))
	input := step + " " + n + "\n"
	if viaHost {
		b, _ := json.Marshal(input)
		_, err := s.e.client.Input(context.Background(), child, b)
		must(s.t, err)
	} else if a := s.f.call(s.t, http.StatusOK, "POST", "/fleet/runs/"+id+"/input", s.caller, jsonBody(map[string]string{"input": input})); a.body["accepted"] != true {
		s.t.Fatalf("input %q: %s", input, a.raw)
	}
	var code int
	var out string
	await.Cond(s.t, time.Minute, "the task's result of "+step+" "+n, func() bool {
		all := outputOf(s.e.events(child))
		out = all[min(before, len(all)):]
		for _, m := range resultLine.FindAllStringSubmatch(out, -1) {
			if m[1] == step && m[2] == n {
				code, _ = strconv.Atoi(m[3])
				return true
			}
		}
		return false
	})
	return code, strings.ReplaceAll(out, "\r\n", "\n")
}

// dispatch starts the git task on bkRepo and returns Fleet's run id, the
// host's, and the task's placeholder (read from its process's env, which
// must not hold the value).
func (s *ghStory) dispatch() (id, child, placeholder string) {
	s.t.Helper()
	tag := fmt.Sprintf("broker-task-%d", time.Now().UnixNano())
	d := s.dispatchWith(http.StatusCreated, s.dispatchBody(bkRepo, s.gitTask(tag)))
	id, child = d.str("fleetRunId"), d.str("childRunId")
	s.tags[child] = tag
	return id, child, s.placeholderOf(tag)
}

// dispatchWith is alice's dispatch of body (with request headers), which
// Fleet must answer want. Fleet's clock catches up with the wall clock
// first: the start's deadline is set on it, and edge checks it on its own.
func (s *ghStory) dispatchWith(want int, body string, headers ...string) answer {
	s.t.Helper()
	s.clk.Set(time.Now())
	a := s.f.must(s.t, want, "POST", "/fleet/runs", s.caller, body, headers...)
	s.f.responses = append(s.f.responses, a.raw)
	if a.status == http.StatusCreated {
		s.ids = append(s.ids, a.str("fleetRunId"))
	}
	return a
}

// sweep runs the sweep handler once, as its schedule would, with the
// default budget on Fleet's clock (an invocation's deadline is on the wall
// clock, which Fleet's has left behind).
func (s *ghStory) sweep() {
	s.t.Helper()
	if _, err := s.f.app.Jobs.Sweep(context.Background(), events.EventBridgeEvent{Source: "aws.scheduler", DetailType: "Scheduled Event", Detail: json.RawMessage(`"{}"`)}); err != nil {
		s.t.Fatalf("sweep: %v", err)
	}
}

// placeholderOf is the placeholder in the env of the task tagged tag,
// once it runs.
func (s *ghStory) placeholderOf(tag string) string {
	s.t.Helper()
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", taskProcess(s.t, tag)))
	must(s.t, err)
	for _, tok := range s.gh.Tokens() {
		if bytes.Contains(environ, []byte(tok.Value)) {
			s.t.Fatal("a minted token is in the task's process environment")
		}
	}
	for _, kv := range strings.Split(string(environ), "\x00") {
		if v, ok := strings.CutPrefix(kv, bkGitHubKey+"="); ok {
			if len(v) < 32 {
				s.t.Fatalf("the task's %s is %d bytes long: not a placeholder", bkGitHubKey, len(v))
			}
			return v
		}
	}
	s.t.Fatalf("the task has no %s in its env", bkGitHubKey)
	return ""
}

// credentials is the run's brokered keys as alice reads them in GET
// /fleet/runs/{id}.
func (s *ghStory) credentials(id string) []fleetapi.BrokeredCredential {
	s.t.Helper()
	var a fleetapi.RunAnswer
	decodeAnswer(s.t, s.f.call(s.t, http.StatusOK, "GET", "/fleet/runs/"+id, s.caller, ""), &a)
	return a.Run.Credentials
}

// credential is the run's one brokered key, checked to be acme/
// GITHUB_TOKEN of kind githubApp.
func (s *ghStory) credential(id string) fleetapi.BrokeredCredential {
	s.t.Helper()
	creds := s.credentials(id)
	if len(creds) != 1 || creds[0].ProjectID != bkProject || creds[0].Key != bkGitHubKey || creds[0].Kind != broker.KindGitHubApp {
		s.t.Fatalf("the run's credentials: %+v; want acme/GITHUB_TOKEN of kind githubApp", creds)
	}
	return creds[0]
}

// token is the i-th token the fake GitHub minted, checked to be scoped
// as the recipe says: the installation, the run's repository alone, the
// recipe's permissions.
func (s *ghStory) token(i int) fakegithub.Token {
	s.t.Helper()
	toks := s.gh.Tokens()
	if len(toks) <= i {
		s.t.Fatalf("the fake GitHub minted %d tokens; want a %dth", len(toks), i+1)
	}
	tok := toks[i]
	if tok.AppID != bkAppID || tok.InstallationID != bkInstallation || !slices.Equal(tok.Repos, []string{bkRepo}) || !maps.Equal(tok.Permissions, bkPermissions) {
		s.t.Fatalf("token %d: app %d, installation %d, repos %v, permissions %v; want %d, %d, [%s], %v",
			i, tok.AppID, tok.InstallationID, tok.Repos, tok.Permissions, bkAppID, bkInstallation, bkRepo, bkPermissions)
	}
	return tok
}

// gitServed is the git requests the fake answered since the first
// `since` of them, for repo.
func (s *ghStory) gitServed(since int, repo string) []fakegithub.GitRequest {
	var out []fakegithub.GitRequest
	for _, r := range s.gh.GitRequests()[since:] {
		if r.Repo == repo {
			out = append(out, r)
		}
	}
	return out
}

// servedWith fails unless reqs hold a request of service, and every
// request of it carried token and was answered want.
func (s *ghStory) servedWith(what string, reqs []fakegithub.GitRequest, service, token string, want int) {
	s.t.Helper()
	n := 0
	for _, r := range reqs {
		if r.Service != service || r.Token == "" {
			continue
		}
		n++
		if r.Token != token || r.Status != want {
			s.t.Fatalf("%s: the fake GitHub answered a %s %d, with the token wanted %v; want %d with it", what, service, r.Status, r.Token == token, want)
		}
	}
	if n == 0 {
		s.t.Fatalf("%s: the fake GitHub saw no authenticated %s (requests %+v)", what, service, statusesOf(reqs))
	}
}

// statusesOf is what a message shows of git requests: never their token.
func statusesOf(reqs []fakegithub.GitRequest) []string {
	var out []string
	for _, r := range reqs {
		out = append(out, fmt.Sprintf("%s %s %d auth=%v", r.Repo, r.Service, r.Status, r.Token != ""))
	}
	return out
}

// refusedAtGitHub fails unless the fake GitHub refuses token: a clone
// with it, from the test's own git straight to the fake, fails 401.
func (s *ghStory) refusedAtGitHub(token string) {
	s.t.Helper()
	if s.gh.Live(token) {
		s.t.Fatal("the fake GitHub still honours the token")
	}
	since := len(s.gh.GitRequests())
	cmd := exec.Command("git", "ls-remote", s.gh.GitURL(bkRepo, token))
	cmd.Env = s.gh.GitEnv(s.t)
	if out, err := cmd.CombinedOutput(); err == nil {
		s.t.Fatalf("git ls-remote with the token succeeded: %s", out)
	}
	reqs := s.gitServed(since, bkRepo)
	if len(reqs) == 0 || reqs[len(reqs)-1].Status != http.StatusUnauthorized {
		s.t.Fatalf("the fake's answers to the token: %v; want 401", statusesOf(reqs))
	}
}

// end sends the task its end, waits for the run to succeed and sweeps
// until Fleet revoked its token; it returns the run's credential then.
func (s *ghStory) end(id, child string) fleetapi.BrokeredCredential {
	s.t.Helper()
	s.step(id, child, "end", false)
	return s.revoked(id)
}

// revoked waits for run id to succeed, then sweeps, as the schedule
// would, until Fleet has revoked its token, and returns the run's
// credential then.
func (s *ghStory) revoked(id string) fleetapi.BrokeredCredential {
	s.t.Helper()
	await.Cond(s.t, time.Minute, "the run to succeed", func() bool {
		return s.f.run(s.t, s.caller, id)["status"] == "succeeded"
	})
	var c fleetapi.BrokeredCredential
	await.Cond(s.t, time.Minute, "Fleet to revoke the ended run's token", func() bool {
		s.sweep()
		c = s.credential(id)
		return c.RevokedAt != nil
	})
	return c
}

// TestBrokerGitHubCloneAndPushWithOnlyThePlaceholder: a run of acme/app
// through a real edge whose policy takes acme/GITHUB_TOKEN from Fleet; its
// task, holding only the placeholder, clones acme/app with the URL the
// README documents and pushes a commit to it: the fake GitHub served both
// with the token Fleet minted for the run (installation, repository and
// permissions as the recipe says); the same task cannot clone acme/other,
// in the same installation. GET of the run lists the key with the token's
// expiry and never a value; once the run ended and a sweep passed, the run
// shows revokedAt and the fake GitHub refuses the token. On both stores:
// with the installation named on bbolt, looked up byRepository on DynamoDB.
func TestBrokerGitHubCloneAndPushWithOnlyThePlaceholder(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { brokerGitHubCloneAndPush(t, kind) })
	}
}

func brokerGitHubCloneAndPush(t *testing.T, kind string) {
	s := newGHStory(t, kind, kind == "dynamodb")
	initial := s.gh.Head(t, bkRepo, "main")
	id, child, placeholder := s.dispatch()
	tok := s.token(0)
	if s.gh.Mints() != 1 {
		t.Fatalf("the fake GitHub minted %d tokens for one run", s.gh.Mints())
	}
	if c := s.credential(id); !c.ExpiresAt.Equal(tok.ExpiresAt) || c.RevokedAt != nil {
		t.Fatalf("the run's credential: %+v; want the token's expiry %v, not revoked", c, tok.ExpiresAt)
	}

	since := len(s.gh.GitRequests())
	if code, out := s.step(id, child, "clone", false); code != 0 {
		t.Fatalf("the task's clone of %s: exit %d\n%s", bkRepo, code, out)
	}
	s.servedWith("the clone", s.gitServed(since, bkRepo), fakegithub.UploadPack, tok.Value, http.StatusOK)

	since = len(s.gh.GitRequests())
	if code, out := s.step(id, child, "push", false); code != 0 {
		t.Fatalf("the task's push to %s: exit %d\n%s", bkRepo, code, out)
	}
	s.servedWith("the push", s.gitServed(since, bkRepo), fakegithub.ReceivePack, tok.Value, http.StatusOK)
	if head := s.gh.Head(t, bkRepo, "main"); head == initial || head == "" {
		t.Fatalf("the push did not move %s's main (%q)", bkRepo, head)
	}

	since = len(s.gh.GitRequests())
	if code, out := s.step(id, child, "other", false); code == 0 {
		t.Fatalf("the task cloned %s, which its run's token must not reach:\n%s", bkOtherRepo, out)
	}
	s.servedWith("the clone of "+bkOtherRepo, s.gitServed(since, bkOtherRepo), fakegithub.UploadPack, tok.Value, http.StatusNotFound)

	if c := s.end(id, child); !c.ExpiresAt.Equal(tok.ExpiresAt) {
		t.Fatalf("the ended run's credential: %+v", c)
	}
	s.refusedAtGitHub(tok.Value)
	if s.gh.Mints() != 1 || s.gh.Revocations() != 1 {
		t.Fatalf("the fake GitHub minted %d tokens and revoked %d; want 1 and 1", s.gh.Mints(), s.gh.Revocations())
	}
	s.wantMetrics(map[string]float64{"BrokerMints/githubApp": 1, "BrokerRevocations/githubApp": 1})
	s.noValueAnywhere(placeholder)
}

// TestBrokerGitHubEdgeClonesAPrivateRepository: a run of acme/app with no
// localPath, so edge clones it before the task starts, from the URL
// Fleet's repository map gives (no credential in it): edge's clone and the
// task's plain `git push origin` are both served with the token Fleet
// minted for the run, through the credential helper edge configures for
// the repository's host with the key's placeholder. On both stores.
func TestBrokerGitHubEdgeClonesAPrivateRepository(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { brokerGitHubEdgeClones(t, kind) })
	}
}

func brokerGitHubEdgeClones(t *testing.T, kind string) {
	s := newGHStory(t, kind, kind == "bolt")
	initial := s.gh.Head(t, bkRepo, "main")
	since := len(s.gh.GitRequests())
	tag := fmt.Sprintf("broker-clone-%d", time.Now().UnixNano())
	prompt := fmt.Sprintf(`echo %s
echo "placeholder=$GITHUB_TOKEN."
export GIT_TERMINAL_PROMPT=0
git config --global user.name Task
git config --global user.email task@example.invalid
date +%%s%%N > change && git add change && git commit -q -m "a change of the task" && git push -q origin HEAD:main 2>&1
echo "pushed $?"`, tag)
	d := s.dispatchWith(http.StatusCreated, jsonBody(map[string]any{"agent": "shell", "prompt": prompt, "repository": bkRepo,
		"secrets": []map[string]any{{"projectId": bkProject, "key": bkGitHubKey, "domains": []string{s.gitDomain()}}}}))
	id, child := d.str("fleetRunId"), d.str("childRunId")
	c := s.revoked(id)
	out := outputOf(s.e.events(child))
	if !strings.Contains(out, "pushed 0") {
		t.Fatalf("the task's push: %q", out)
	}
	tok := s.token(0)
	if !c.ExpiresAt.Equal(tok.ExpiresAt) || s.gh.Mints() != 1 {
		t.Fatalf("the run's credential %+v, %d mints; want one token's", c, s.gh.Mints())
	}
	served := s.gitServed(since, bkRepo)
	s.servedWith("edge's clone", served, fakegithub.UploadPack, tok.Value, http.StatusOK)
	s.servedWith("the task's push", served, fakegithub.ReceivePack, tok.Value, http.StatusOK)
	if head := s.gh.Head(t, bkRepo, "main"); head == initial || head == "" {
		t.Fatalf("the push did not move %s's main (%q)", bkRepo, head)
	}
	s.refusedAtGitHub(tok.Value)
	m := regexp.MustCompile(`placeholder=(\S{32,})\.`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the task's env has no placeholder for %s: %q", bkGitHubKey, out)
	}
	s.noValueAnywhere(m[1])
}

// TestBrokerGitHubRefreshKeepsARunWorking: a run outlives its first token
// (Fleet's and GitHub's clock moved on to 9 minutes before its expiry, so
// within broker.RefreshMargin): one sweep mints a second token and pushes
// it to edge, which takes it for the same placeholder, and revokes the
// first; the task, unchanged (same process, same env), fetches and pushes
// again, served with the second token, while the first is refused. GET of
// the run shows the new expiry. On both stores (the installation looked up
// byRepository on bbolt).
func TestBrokerGitHubRefreshKeepsARunWorking(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { brokerGitHubRefresh(t, kind) })
	}
}

func brokerGitHubRefresh(t *testing.T, kind string) {
	s := newGHStory(t, kind, kind == "bolt")
	id, child, placeholder := s.dispatch()
	pid := taskProcess(t, s.tags[child])
	first := s.token(0)
	if code, out := s.step(id, child, "clone", false); code != 0 {
		t.Fatalf("the task's clone: exit %d\n%s", code, out)
	}

	// A sweep before the margin changes nothing.
	s.clk.Advance(first.ExpiresAt.Sub(s.clk.Now()) - broker.RefreshMargin - time.Minute)
	s.sweep()
	if s.gh.Mints() != 1 || s.gh.Revocations() != 0 {
		t.Fatalf("a sweep 11 minutes before the token's expiry: %d mints, %d revocations; want nothing new", s.gh.Mints(), s.gh.Revocations())
	}
	s.clk.Advance(2 * time.Minute)
	s.sweep()
	second := s.token(1)
	if s.gh.Mints() != 2 || second.Value == first.Value || !second.ExpiresAt.After(first.ExpiresAt) {
		t.Fatalf("the sweep within the margin: %d mints; want a second token living past the first", s.gh.Mints())
	}
	if s.gh.Live(first.Value) {
		t.Fatal("the first token is still live at GitHub after the host took the second")
	}
	if c := s.credential(id); !c.ExpiresAt.Equal(second.ExpiresAt) || c.RevokedAt != nil {
		t.Fatalf("the run's credential after the refresh: %+v; want the second token's expiry %v", c, second.ExpiresAt)
	}

	since := len(s.gh.GitRequests())
	if code, out := s.step(id, child, "fetch", false); code != 0 {
		t.Fatalf("the task's fetch after the refresh: exit %d\n%s", code, out)
	}
	if code, out := s.step(id, child, "push", false); code != 0 {
		t.Fatalf("the task's push after the refresh: exit %d\n%s", code, out)
	}
	reqs := s.gitServed(since, bkRepo)
	s.servedWith("the fetch and push after the refresh", reqs, fakegithub.UploadPack, second.Value, http.StatusOK)
	s.servedWith("the push after the refresh", reqs, fakegithub.ReceivePack, second.Value, http.StatusOK)
	s.refusedAtGitHub(first.Value)
	// The task went on in the same process, with the placeholder it
	// began with: edge swapped it for the second token.
	if now := taskProcess(t, s.tags[child]); now != pid || s.placeholderOf(s.tags[child]) != placeholder {
		t.Fatalf("the task is process %d, was %d, or its placeholder changed", now, pid)
	}

	s.end(id, child)
	s.refusedAtGitHub(second.Value)
	s.wantMetrics(map[string]float64{"BrokerMints/githubApp": 2, "BrokerRevocations/githubApp": 2})
	s.noValueAnywhere(placeholder)
}

// TestBrokerGitHubEdgeRestartWithholdsUntilFleetsNextPass: edge restarts
// under a live run (its task dies with it); the run's next attempt (retried
// with the host's own API, so that Fleet learns of it only by its sweep)
// holds no value for acme/GITHUB_TOKEN: edge names it in the run's
// missingCredentials, and the task's git and curl with the same
// placeholder as before are answered 503 withheld, the fake GitHub seeing
// nothing. One sweep later the value is back (a fresh token, the old one
// revoked) and the same git succeeds. Restarted again and retried through
// Fleet, the run's attempt has a fresh value at once. On both stores.
func TestBrokerGitHubEdgeRestartWithholdsUntilFleetsNextPass(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { brokerGitHubEdgeRestart(t, kind) })
	}
}

func brokerGitHubEdgeRestart(t *testing.T, kind string) {
	s := newGHStory(t, kind, false)
	id, child, placeholder := s.dispatch()
	first := s.token(0)
	if code, out := s.step(id, child, "lsremote", false); code != 0 {
		t.Fatalf("the task's ls-remote: exit %d\n%s", code, out)
	}

	s.e.shutdown()
	s.e.openWith(false, s.edgeConfig)
	ctx := context.Background()
	if r, err := s.e.client.Get(ctx, child); err != nil || !hostproto.TerminalStatus(r.Status) || len(r.MissingCredentials) != 0 {
		t.Fatalf("the run on the restarted edge: %+v, %v; want its attempt ended, nothing missing", r, err)
	}
	r, err := s.e.client.Retry(ctx, child)
	must(t, err)
	r = s.hostRun(child, func(r hostproto.Run) bool { return r.Status == hostproto.StatusRunning })
	if r.Attempt != 2 || !slices.Equal(r.MissingCredentials, []string{bkProject + "/" + bkGitHubKey}) {
		t.Fatalf("the retried run on edge: %+v; want attempt 2 missing acme/GITHUB_TOKEN", r)
	}
	if again := s.placeholderOf(s.tags[child]); again != placeholder {
		t.Fatal("the retried attempt's placeholder differs from the first's")
	}

	since := len(s.gh.GitRequests())
	code, out := s.step(id, child, "lsremote", true)
	if code == 0 || !strings.Contains(out, "503") {
		t.Fatalf("the task's ls-remote before Fleet's pass: exit %d; want a 503\n%s", code, out)
	}
	if _, out := s.step(id, child, "curl", true); !strings.Contains(out, "http=503") || !strings.Contains(out, "withheld") {
		t.Fatalf("the task's curl before Fleet's pass; want 503 withheld:\n%s", out)
	}
	// git's first request of each exchange carries no credential, which
	// edge passes on; none carrying one (the value, or the placeholder in
	// its place) reached the fake.
	if reqs := s.gh.GitRequests()[since:]; slices.ContainsFunc(reqs, func(r fakegithub.GitRequest) bool { return r.Token != "" }) {
		t.Fatalf("the fake GitHub saw a request with a credential while edge had no value: %v", statusesOf(reqs))
	}
	if s.gh.Mints() != 1 {
		t.Fatalf("%d mints before Fleet's pass", s.gh.Mints())
	}

	s.sweep()
	second := s.token(1)
	if r := s.hostRun(child, func(hostproto.Run) bool { return true }); len(r.MissingCredentials) != 0 {
		t.Fatalf("after one sweep edge still misses %v", r.MissingCredentials)
	}
	if c := s.credential(id); !c.ExpiresAt.Equal(second.ExpiresAt) {
		t.Fatalf("the run's credential after the sweep: %+v; want the second token's expiry", c)
	}
	since = len(s.gh.GitRequests())
	if code, out := s.step(id, child, "lsremote", true); code != 0 {
		t.Fatalf("the task's ls-remote after Fleet's pass: exit %d\n%s", code, out)
	}
	s.servedWith("the ls-remote after Fleet's pass", s.gitServed(since, bkRepo), fakegithub.UploadPack, second.Value, http.StatusOK)
	s.refusedAtGitHub(first.Value)

	// Restarted again, the run retried through Fleet: the retry itself
	// gives the new attempt a fresh value, before any sweep.
	s.e.shutdown()
	s.e.openWith(false, s.edgeConfig)
	s.hostRun(child, func(r hostproto.Run) bool { return hostproto.TerminalStatus(r.Status) })
	if a := s.f.call(t, http.StatusOK, "POST", "/fleet/runs/"+id+"/retry", s.caller, ""); a.body["accepted"] != true {
		t.Fatalf("the retry through Fleet: %s", a.raw)
	}
	third := s.token(2)
	if r := s.hostRun(child, func(r hostproto.Run) bool { return r.Status == hostproto.StatusRunning }); r.Attempt != 3 || len(r.MissingCredentials) != 0 {
		t.Fatalf("the run retried through Fleet: %+v; want attempt 3 missing nothing", r)
	}
	since = len(s.gh.GitRequests())
	if code, out := s.step(id, child, "lsremote", false); code != 0 {
		t.Fatalf("the task's ls-remote after the retry through Fleet: exit %d\n%s", code, out)
	}
	s.servedWith("the ls-remote after the retry through Fleet", s.gitServed(since, bkRepo), fakegithub.UploadPack, third.Value, http.StatusOK)
	s.refusedAtGitHub(second.Value)

	s.end(id, child)
	s.refusedAtGitHub(third.Value)
	s.wantMetrics(map[string]float64{"BrokerMints/githubApp": 3, "BrokerRevocations/githubApp": 3})
	s.noValueAnywhere(placeholder)
}

// hostRun polls edge's view of a run until cond holds.
func (s *ghStory) hostRun(child string, cond func(hostproto.Run) bool) hostproto.Run {
	s.t.Helper()
	var r hostproto.Run
	await.Cond(s.t, time.Minute, "edge's run "+child, func() bool {
		var err error
		r, err = s.e.client.Get(context.Background(), child)
		return err == nil && cond(r)
	})
	return r
}

// TestBrokerGitHubRefusalStartsNothing: a dispatch whose token GitHub
// will not mint (the run's repository is outside the App's installation)
// is refused 409 credential_unavailable naming the key, its kind and
// GitHub's status; no run is created nor started, the idempotency key is
// left unclaimed (the same key with a mintable repository starts a run),
// and nothing of the refusal carries a value. On both stores, with the
// installation named (GitHub answers the mint 422) and looked up by
// repository (it answers the lookup 404).
func TestBrokerGitHubRefusalStartsNothing(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			byRepository := kind == "dynamodb"
			s := newGHStory(t, kind, byRepository)
			want := http.StatusUnprocessableEntity
			if byRepository {
				want = http.StatusNotFound
			}
			starts := s.e.starts()
			a := s.dispatchWith(http.StatusConflict, s.dispatchBody(bkOutsideRepo, "echo never"), "Idempotency-Key", "refused-once")
			var body fleetapi.Error
			decodeAnswer(t, a, &body)
			var d fleetapi.CredentialUnavailable
			must(t, json.Unmarshal(body.Details, &d))
			if body.Code != fleetapi.CodeCredentialUnavailable || d != (fleetapi.CredentialUnavailable{ProjectID: bkProject, Key: bkGitHubKey, Kind: broker.KindGitHubApp, ProviderStatus: want}) ||
				!strings.Contains(body.Error, bkProject+"/"+bkGitHubKey) || a.str("fleetRunId") != "" {
				t.Fatalf("the refused dispatch: %s; want 409 %s naming the key with providerStatus %d", a.raw, fleetapi.CodeCredentialUnavailable, want)
			}
			if runs := s.f.call(t, http.StatusOK, "GET", "/fleet/runs", s.caller, "").body["runs"].([]any); len(runs) != 0 {
				t.Fatalf("the refused dispatch left runs: %v", runs)
			}
			if s.e.starts() != starts || s.gh.Mints() != 0 {
				t.Fatalf("the refused dispatch reached edge (%d starts) or got a token (%d mints)", s.e.starts()-starts, s.gh.Mints())
			}
			ok := s.dispatchWith(http.StatusCreated, s.dispatchBody(bkRepo, "echo started"), "Idempotency-Key", "refused-once")
			s.revoked(ok.str("fleetRunId"))
			s.wantMetrics(map[string]float64{"BrokerFailures/githubApp": 1, "BrokerMints/githubApp": 1, "BrokerRevocations/githubApp": 1})
			s.noValueAnywhere("")
		})
	}
}

// noValueAnywhere fails if a token the fake GitHub minted, a JWT Fleet
// signed as the App or the App's private key is in any item of Fleet's
// store, any answer Fleet gave (every run and its mirrored events read
// once more here), its log and metrics, edge's log or any file of edge's
// data dir (its run log, audit log, ledgers), or if the placeholder (when
// given) is in a log.
func (s *ghStory) noValueAnywhere(placeholder string) {
	s.t.Helper()
	for _, id := range s.ids {
		s.f.run(s.t, s.caller, id)
		if evs := s.f.call(s.t, http.StatusOK, "GET", "/fleet/runs/"+id+"/events?after=0&limit=1000", s.caller, ""); len(evs.body["events"].([]any)) == 0 {
			s.t.Fatalf("run %s has no events mirrored", id)
		}
	}
	var values []secretValue
	for i, tok := range s.gh.Tokens() {
		values = append(values, secretValue{fmt.Sprintf("GitHub token %d", i+1), tok.Value})
	}
	for i, r := range s.gh.APIRequests() {
		values = append(values, secretValue{fmt.Sprintf("the App's JWT of API request %d", i+1), r.JWT})
	}
	values = append(values, secretValue{"the App's private key", string(s.appKey)})
	values = append(values, pemLines("the App's private key", s.appKey)...)
	places := map[string]string{
		"Fleet's store":   storeDump(s.t, s.f.stack),
		"Fleet's answers": strings.Join(s.f.responses, "\n"),
		"Fleet's log":     s.f.logs.String(),
		"Fleet's metrics": s.metrics.String(),
		"edge's log":      s.e.logs.String(),
		"edge's data dir": dirDump(s.t, s.e.spec.DataDir),
	}
	assertNoValue(s.t, places, values)
	if placeholder != "" {
		for _, where := range []string{"Fleet's log", "edge's log"} {
			if strings.Contains(places[where], placeholder) {
				s.t.Errorf("the placeholder is in %s", where)
			}
		}
	}
	if !strings.Contains(places["Fleet's log"], `"msg":"request"`) || !strings.Contains(places["edge's log"], `"msg":"host api"`) {
		s.t.Fatal("the logs searched are empty: Fleet's and edge's logs were not captured")
	}
}

// brokerMetrics sums Fleet's EMF lines of the broker's metrics by
// "<metric>/<kind>" (BrokerMints/githubApp...).
func brokerMetrics(t *testing.T, lines ...string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, text := range lines {
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			var doc map[string]any
			if line == "" || json.Unmarshal([]byte(line), &doc) != nil {
				continue
			}
			for _, m := range []string{"BrokerMints", "BrokerRefreshes", "BrokerFailures", "BrokerRevocations"} {
				if v, ok := doc[m].(float64); ok {
					out[m+"/"+fmt.Sprint(doc["Kind"])] += v
				}
			}
		}
	}
	return out
}

// wantMetrics fails unless Fleet's broker metrics are want, exactly.
func (s *ghStory) wantMetrics(want map[string]float64) {
	s.t.Helper()
	if got := brokerMetrics(s.t, s.metrics.String()); !reflect.DeepEqual(got, want) {
		s.t.Fatalf("Fleet's broker metrics %v; want %v", got, want)
	}
}

// secretValue is a value no place may hold, named for messages.
type secretValue struct{ name, value string }

// pemLines are the base64 lines of a PEM block's body, each as secret as
// the key: a log that quoted the file in part would hold one.
func pemLines(name string, pemText []byte) []secretValue {
	var out []secretValue
	for i, line := range strings.Split(string(pemText), "\n") {
		if len(line) >= 32 && !strings.HasPrefix(line, "-----") {
			out = append(out, secretValue{fmt.Sprintf("%s (line %d)", name, i+1), line})
		}
	}
	return out
}

// assertNoValue fails naming each value found in each place, never the
// value.
func assertNoValue(t *testing.T, places map[string]string, values []secretValue) {
	t.Helper()
	for where, text := range places {
		if text == "" && where != "Fleet's answers" {
			t.Errorf("%s is empty: nothing was searched there", where)
		}
		for _, v := range values {
			if v.value != "" && strings.Contains(text, v.value) {
				t.Errorf("%s is in %s", v.name, where)
			}
		}
	}
}

// storeDump is every item of a stack's store as text, values raw (a
// binary attribute's bytes as they are, not base64): on DynamoDB every
// item of its six tables, on bbolt the store's file.
func storeDump(t *testing.T, st *stack) string {
	t.Helper()
	if path, ok := strings.CutPrefix(st.app.Config.Store, "bolt:"); ok {
		b, err := os.ReadFile(path)
		must(t, err)
		return string(b)
	}
	var b strings.Builder
	n := st.app.Config.Tables
	for _, table := range []string{n.Hosts, n.Runs, n.Events, n.Egress, n.Callers, n.Idempotency} {
		p := dynamodb.NewScanPaginator(moto.DynamoDB(), &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
		for p.HasMorePages() {
			page, err := p.NextPage(context.Background())
			must(t, err)
			for _, item := range page.Items {
				b.WriteString(table + ": ")
				attrText(&b, &types.AttributeValueMemberM{Value: item})
				b.WriteString("\n")
			}
		}
	}
	if b.Len() == 0 {
		t.Fatal("Fleet's tables are empty")
	}
	return b.String()
}

// attrText writes an attribute value with every string and binary as it
// is.
func attrText(b *strings.Builder, av types.AttributeValue) {
	switch v := av.(type) {
	case *types.AttributeValueMemberS:
		b.WriteString(strconv.Quote(v.Value))
	case *types.AttributeValueMemberB:
		b.Write(v.Value)
	case *types.AttributeValueMemberN:
		b.WriteString(v.Value)
	case *types.AttributeValueMemberSS:
		b.WriteString(strings.Join(v.Value, " "))
	case *types.AttributeValueMemberBS:
		for _, x := range v.Value {
			b.Write(x)
			b.WriteString(" ")
		}
	case *types.AttributeValueMemberL:
		for _, x := range v.Value {
			attrText(b, x)
			b.WriteString(" ")
		}
	case *types.AttributeValueMemberM:
		for k, x := range v.Value {
			b.WriteString(k + "=")
			attrText(b, x)
			b.WriteString(" ")
		}
	default:
		fmt.Fprint(b, v)
	}
}

// dirDump is the bytes of every regular file under dir.
func dirDump(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	must(t, filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		b.Write(data)
		return nil
	}))
	return b.String()
}

// oauthFleet is Fleet minting OAuth2 access tokens for acme/SAAS_TOKEN
// from a fake token endpoint's rotating refresh tokens: one or more Fleet
// processes (stacks) on one store, with one fake host they dispatch to.
type oauthFleet struct {
	clk    *clock.Fake
	oauth  *fakeoauth.Server
	seed   string
	secret string
	stacks []*stack
	// logs and metrics are each stack's log and EMF lines.
	logs    []*syncbuf.Buffer
	metrics []*syncbuf.Buffer
	host    *fakehost.Host
	caller  string
	// answers are every dispatch's answer.
	answers []string
}

// newOAuthFleet starts the token endpoint (access tokens living an hour
// on the shared clock) and n Fleets on kind (n > 1: on the same DynamoDB
// tables, with the same broker configuration and key), a fake host
// registered and probed, and a caller alice.
func newOAuthFleet(t *testing.T, kind string, n int) *oauthFleet {
	t.Helper()
	o := &oauthFleet{clk: clock.NewFake(time.Now().UTC().Truncate(time.Second)), secret: "client-secret-" + motoserver.Unique("s")}
	o.oauth = fakeoauth.Start(t, fakeoauth.Config{ClientID: "runfleet", ClientSecret: o.secret, ExpiresIn: time.Hour, Clock: o.clk,
		Scopes: []string{"read", "write"}})
	o.seed = o.oauth.Seed()
	env := brokerEnv(t, map[string]any{bkProject + "/" + bkOAuthKey: map[string]any{"oauth2": map[string]any{
		"tokenUrl": o.oauth.URL, "clientId": "runfleet", "clientSecretSecret": "file:client-secret",
		"refreshTokenSecret": "file:refresh-token", "scopes": []string{"read"},
	}}}, map[string][]byte{"client-secret": []byte(o.secret), "refresh-token": []byte(o.seed)})
	prefix := ""
	if n > 1 {
		prefix = motoserver.Unique("bk") + "-"
	}
	for range n {
		logs, metrics := &syncbuf.Buffer{}, &syncbuf.Buffer{}
		o.stacks = append(o.stacks, newStack(t, kind, stackOptions{clock: o.clk, log: logs, metrics: metrics, env: env, brokerHTTP: o.oauth.Client, tablePrefix: prefix}))
		o.logs = append(o.logs, logs)
		o.metrics = append(o.metrics, metrics)
	}
	o.host = o.stacks[0].addHost(t, "h1", fakehost.Config{Features: fakeFeatures}, nil)
	o.stacks[0].probe(t, "h1")
	o.caller = o.stacks[0].mint(t, "alice", "*", []string{bkProject})
	return o
}

// dispatchAll sends n dispatches at once, alternating between the stacks,
// each of a run declaring acme/SAAS_TOKEN, and fails unless each answered
// 201. With more than one stack it makes the race the lease decides
// certain: the token endpoint holds the first refresh (the first
// dispatch's, on the first stack) until another stack's dispatches are
// found waiting for that stack's lease (polling the store on the clock,
// which stands still meanwhile: a timer within a second is pending, which
// no other wait of a dispatch sets).
func (o *oauthFleet) dispatchAll(t *testing.T, n int) (children []string) {
	t.Helper()
	body := jsonBody(map[string]any{"agent": "shell", "host": "h1",
		"secrets": []map[string]any{{"projectId": bkProject, "key": bkOAuthKey, "domains": []string{"api.saas.example"}}}})
	answers := make([]answer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	send := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = o.stacks[i%len(o.stacks)].send("POST", "/fleet/runs", o.caller, body)
		}()
	}
	if len(o.stacks) > 1 {
		release := o.oauth.Hold()
		defer release() // before the stacks' cleanup, which waits for every request
		send(0)
		await.Recv(t, "the first refresh to reach the token endpoint", o.oauth.Arrived())
		for i := 1; i < n; i++ {
			send(i)
		}
		await.Cond(t, time.Minute, "another Fleet to wait for the refresh lease", func() bool {
			next, ok := o.clk.Next()
			return ok && next.Sub(o.clk.Now()) <= time.Second || len(o.oauth.Arrived()) > 0
		})
		if len(o.oauth.Arrived()) > 0 {
			t.Fatal("a second refresh reached the token endpoint while the first was in flight")
		}
		release()
	} else {
		for i := range n {
			send(i)
		}
	}
	stop := o.runClock()
	await.Group(t, "the dispatches", &wg)
	stop()
	if extra := len(o.oauth.Arrived()); extra > 0 {
		t.Fatalf("%d more refreshes reached the token endpoint while the first was held", extra)
	}
	for i, a := range answers {
		must(t, errs[i])
		o.answers = append(o.answers, a.raw)
		if a.status != http.StatusCreated {
			t.Fatalf("dispatch %d of %d: %d %s", i+1, n, a.status, a.raw)
		}
		children = append(children, a.str("childRunId"))
	}
	return children
}

// runClock makes the fake clock follow the wall clock, from where it is,
// until the returned stop is called: a Fleet process that finds another's
// refresh lease held polls the store on Fleet's clock (100 ms, doubling
// to 1 s) until the new token is committed, which takes real time. Moved
// at the wall clock's pace, the clock lets those polls go on as they would
// in Lambda, and moves by the burst's few seconds, nothing like the hour
// a token lives or the minute a lease is held.
func (o *oauthFleet) runClock() (stop func()) {
	base, start := o.clk.Now(), time.Now()
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				o.clk.Set(base.Add(time.Since(start)))
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// TestBrokerOAuth2OneRefreshPerExpiryFleetWide: two Fleet processes on the
// same DynamoDB tables (the second found waiting on the first's refresh
// lease each time), and on bbolt one Fleet, take 50 concurrent
// dispatches of runs declaring an OAuth2 key, first with no access token
// yet and then after each of three expiries (the clock moved an hour): the
// token endpoint, which rotates refresh tokens and revokes the family of a
// reused one, sees exactly one refresh each time and never an
// invalid_grant; every start carried the access token of its time, which
// the provider honours, with its expiry. Then the 200 live runs outlive
// that token: one sweep refreshes once more and gives each run's host the
// new token. The broker's metrics count every value handed out and each
// refresh. No token, refresh token or the client secret is in the store,
// an answer, a log or a metric line.
func TestBrokerOAuth2OneRefreshPerExpiryFleetWide(t *testing.T) {
	for _, c := range []struct {
		kind   string
		fleets int
	}{{"dynamodb", 2}, {"bolt", 1}} {
		t.Run(c.kind, func(t *testing.T) { brokerOAuth2OneRefreshPerExpiry(t, c.kind, c.fleets) })
	}
}

func brokerOAuth2OneRefreshPerExpiry(t *testing.T, kind string, fleets int) {
	const dispatches, expiries = 50, 3
	o := newOAuthFleet(t, kind, fleets)
	seen := map[string]bool{}
	var children []string
	for round := 0; round <= expiries; round++ {
		if round > 0 {
			o.clk.Advance(time.Hour)
			o.stacks[0].probe(t, "h1")
		}
		before := len(o.host.Starts())
		children = append(children, o.dispatchAll(t, dispatches)...)
		if got := o.oauth.Refreshes(); got != round+1 || o.oauth.InvalidGrants() != 0 || o.oauth.BadClients() != 0 {
			t.Fatalf("after round %d (%d expiries): %d refreshes, %d invalid_grant, %d bad clients; want %d, 0, 0",
				round, round, got, o.oauth.InvalidGrants(), o.oauth.BadClients(), round+1)
		}
		starts := o.host.Starts()[before:]
		if len(starts) != dispatches {
			t.Fatalf("round %d: the host took %d starts; want %d", round, len(starts), dispatches)
		}
		var value string
		for i, st := range starts {
			if len(st.Credentials) != 1 || st.Credentials[0].ProjectID != bkProject || st.Credentials[0].Key != bkOAuthKey {
				t.Fatalf("round %d: start %d's credentials name %d keys; want acme/SAAS_TOKEN", round, i, len(st.Credentials))
			}
			c := st.Credentials[0]
			v := string(c.Value)
			if now := o.clk.Now(); !o.oauth.Honoured(v) || !c.ExpiresAt.After(now.Add(broker.RefreshMargin)) || c.ExpiresAt.After(now.Add(time.Hour)) {
				t.Fatalf("round %d: start %d carried an access token the provider honours %v, expiring %v (now %v)", round, i, o.oauth.Honoured(v), c.ExpiresAt, o.clk.Now())
			}
			if value == "" {
				value = v
			} else if v != value {
				t.Fatalf("round %d: the starts carried different access tokens: one refresh hands out one", round)
			}
		}
		if seen[value] {
			t.Fatalf("round %d handed out an earlier round's access token", round)
		}
		seen[value] = true
	}
	if o.oauth.Refreshes() != expiries+1 || o.oauth.InvalidGrants() != 0 {
		t.Fatalf("%d refreshes, %d invalid_grant; want %d and 0", o.oauth.Refreshes(), o.oauth.InvalidGrants(), expiries+1)
	}

	// The runs outlive the last token: the sweep (of the last Fleet)
	// refreshes once and gives every live run's host the new token.
	o.clk.Advance(time.Hour - broker.RefreshMargin + time.Minute)
	last := o.stacks[len(o.stacks)-1]
	await.Cond(t, time.Minute, "the sweep to give every live run the new token", func() bool {
		if _, err := last.app.Jobs.Sweep(context.Background(), events.EventBridgeEvent{}); err != nil {
			t.Fatalf("sweep: %v", err)
		}
		for _, child := range children {
			if len(o.host.CredentialPuts(child)) == 0 {
				return false
			}
		}
		return true
	})
	if o.oauth.Refreshes() != expiries+2 || o.oauth.InvalidGrants() != 0 {
		t.Fatalf("after the sweep: %d refreshes, %d invalid_grant; want %d and 0", o.oauth.Refreshes(), o.oauth.InvalidGrants(), expiries+2)
	}
	var swept string
	for _, child := range children {
		puts := o.host.CredentialPuts(child)
		if len(puts) != 1 || len(puts[0].Credentials) != 1 || puts[0].Credentials[0].ID() != bkProject+"/"+bkOAuthKey {
			t.Fatalf("run %s took %d PUTs of credentials; want one of acme/SAAS_TOKEN", child, len(puts))
		}
		v := string(puts[0].Credentials[0].Value)
		if swept == "" {
			swept = v
		}
		if v != swept || seen[v] || !o.oauth.Honoured(v) {
			t.Fatalf("run %s was given an access token the provider honours %v, new %v, the one the others got %v", child, o.oauth.Honoured(v), !seen[v], v == swept)
		}
	}
	seen[swept] = true

	var metrics []string
	for _, m := range o.metrics {
		metrics = append(metrics, m.String())
	}
	want := map[string]float64{"BrokerMints/oauth2": dispatches*(expiries+1) + float64(len(children)), "BrokerRefreshes/oauth2": expiries + 2}
	if got := brokerMetrics(t, metrics...); !reflect.DeepEqual(got, want) {
		t.Fatalf("the Fleets' broker metrics %v; want %v", got, want)
	}

	places := map[string]string{"Fleet's answers": strings.Join(o.answers, "\n")}
	for i, st := range o.stacks {
		places[fmt.Sprintf("Fleet %d's log", i+1)] = o.logs[i].String()
		places[fmt.Sprintf("Fleet %d's metrics", i+1)] = o.metrics[i].String()
		if i == 0 || kind == "bolt" {
			places["Fleet's store"] = storeDump(t, st)
		}
	}
	values := []secretValue{{"a refresh token", fakeoauth.RefreshPrefix}, {"an access token", fakeoauth.AccessPrefix},
		{"the client secret", o.secret}, {"the seed refresh token", o.seed}}
	for v := range seen {
		values = append(values, secretValue{"an access token handed out", v})
	}
	assertNoValue(t, places, values)
}
