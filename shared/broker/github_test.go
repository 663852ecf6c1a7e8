package broker

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakegithub"
	"github.com/runfleet/runfleet/tests/kit/leakcheck"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

const (
	ghAppID     = 314
	ghInstall   = 42 // acme/app, acme/other
	ghInstall2  = 43 // umbrella/web
	ghKeySecret = "file:keys/app.pem"
)

type ghFixture struct {
	gh      *fakegithub.Server
	clock   *clock.Fake
	key     *rsa.PrivateKey
	secrets *Secrets
	dir     string // the broker file's directory: file: references are relative to it
	log     *syncbuf.Buffer
}

// newGHFixture: App 314 (contents write, metadata read, pull_requests
// write) installed as 42 on acme/app and acme/other and as 43 on
// umbrella/web; initech/private is on no installation of it.
func newGHFixture(t *testing.T) *ghFixture {
	t.Helper()
	f := &ghFixture{
		clock: clock.NewFake(time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)),
		key:   fakegithub.NewAppKey(t),
		log:   &syncbuf.Buffer{},
	}
	f.dir = t.TempDir()
	f.secrets = NewSecrets(SecretsConfig{BaseDir: f.dir, Clock: f.clock})
	f.setKey(t, string(fakegithub.PKCS1PEM(f.key)))
	f.gh = fakegithub.New(t, fakegithub.Options{
		Clock: f.clock,
		Apps: []fakegithub.App{{
			ID: ghAppID, Key: &f.key.PublicKey,
			Permissions: map[string]string{"contents": "write", "metadata": "read", "pull_requests": "write"},
			Installations: []fakegithub.Installation{
				{ID: ghInstall, Repos: []string{"acme/app", "acme/other"}},
				{ID: ghInstall2, Repos: []string{"umbrella/web"}},
			},
		}},
		Repos: []string{"initech/private"},
	})
	return f
}

// setKey writes the App's private key where its recipe's reference
// points.
func (f *ghFixture) setKey(t *testing.T, pemText string) {
	t.Helper()
	path := filepath.Join(f.dir, strings.TrimPrefix(ghKeySecret, "file:"))
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(pemText), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *ghFixture) recipe(installation InstallationID, perms map[string]string) GitHubApp {
	return GitHubApp{AppID: ghAppID, PrivateKeySecret: ghKeySecret, InstallationID: installation, Permissions: perms, APIURL: f.gh.APIURL()}
}

func (f *ghFixture) minter(t *testing.T, r GitHubApp) *githubMinter {
	t.Helper()
	m, err := newGitHubMinter("acme/GITHUB_TOKEN", r, Deps{
		Secrets:    f.secrets,
		Clock:      f.clock,
		HTTPClient: f.gh.Client(),
		Logger:     slog.New(slog.NewJSONHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mintReq(repo string) MintRequest {
	return MintRequest{FleetRunID: "run-1", ProjectID: "acme", Key: "GITHUB_TOKEN", Repository: repo}
}

var readContents = map[string]string{"contents": "read", "metadata": "read"}

func TestGitHubMintIsLimitedToTheRunsRepositoryAndPermissions(t *testing.T) {
	f := newGHFixture(t)
	m := f.minter(t, f.recipe(InstallationID{ID: ghInstall}, readContents))
	got, err := m.mint(context.Background(), mintReq("https://github.com/acme/app.git"))
	if err != nil {
		t.Fatal(err)
	}
	toks := f.gh.Tokens()
	if len(toks) != 1 {
		t.Fatalf("%d tokens minted, want 1", len(toks))
	}
	tok := toks[0]
	if got.Kind != KindGitHubApp || string(got.Value) != tok.Value || !got.ExpiresAt.Equal(tok.ExpiresAt) || got.Sealed != nil {
		t.Fatalf("minted %+v (expires %s), want the fake's token expiring %s, unsealed", got, got.ExpiresAt, tok.ExpiresAt)
	}
	if tok.InstallationID != ghInstall || len(tok.Repos) != 1 || tok.Repos[0] != "acme/app" || !maps.Equal(tok.Permissions, readContents) {
		t.Fatalf("token for %d %v %v, want installation %d, acme/app alone, %v", tok.InstallationID, tok.Repos, tok.Permissions, ghInstall, readContents)
	}
	for _, r := range f.gh.APIRequests() {
		if !strings.HasPrefix(r.UserAgent, "runfleet-fleet/") || r.Accept != "application/vnd.github+json" || r.APIVersion != "2022-11-28" {
			t.Errorf("%s %s: User-Agent %q, Accept %q, X-GitHub-Api-Version %q", r.Method, r.Path, r.UserAgent, r.Accept, r.APIVersion)
		}
	}

	// What the fake's git does with it, through the real git client: the
	// run's repository clones, another of the installation does not.
	clone := func(repo string) bool {
		cmd := exec.Command("git", "clone", "-q", f.gh.GitURL(repo, string(got.Value)), t.TempDir()+"/c")
		cmd.Env = f.gh.GitEnv(t)
		return cmd.Run() == nil
	}
	if !clone("acme/app") || clone("acme/other") {
		t.Fatalf("with the run's token: acme/app cloned %v, acme/other cloned %v; want true, false", clone("acme/app"), clone("acme/other"))
	}
}

func TestGitHubMintsConcurrently(t *testing.T) {
	f := newGHFixture(t)
	m := f.minter(t, f.recipe(InstallationID{ByRepository: true}, readContents))
	repos := []string{"acme/app", "acme/other", "umbrella/web"}
	var wg sync.WaitGroup
	errs := make(chan error, 3*len(repos))
	for i := range 3 * len(repos) {
		wg.Go(func() {
			got, err := m.mint(context.Background(), mintReq(repos[i%len(repos)]))
			if err == nil && !f.gh.Live(string(got.Value)) {
				err = fmt.Errorf("%s: the token minted is not live", repos[i%len(repos)])
			}
			errs <- err
		})
	}
	await.Group(t, "the concurrent mints", &wg)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for _, tok := range f.gh.Tokens() {
		if len(tok.Repos) != 1 {
			t.Errorf("a token for %v", tok.Repos)
		}
	}
}

func TestGitHubTakesTheRepositoryInEveryForm(t *testing.T) {
	for _, tc := range []struct {
		in          string
		owner, name string
	}{
		{"acme/app", "acme", "app"},
		{"acme/app.git", "acme", "app"},
		{"https://github.com/acme/app.git", "acme", "app"},
		{"https://github.com/acme/app", "acme", "app"},
		{"https://github.com/acme/app/", "acme", "app"},
		{"https://ghe.corp.example/scm/acme/my.repo_1.git", "acme", "my.repo_1"},
		{"ssh://git@github.com/acme/app.git", "acme", "app"},
		{"ssh://git@github.com:22/acme/app", "acme", "app"},
		{"git@github.com:acme/app.git", "acme", "app"},
		{"github.com:acme/app", "acme", "app"},
		{"", "", ""},
		{"app", "", ""},
		{"acme/app/extra", "", ""},
		{"https://github.com/app.git", "", ""},
		{"acme/..", "", ""},
		{"acme/a b", "", ""},
		{"-acme/app", "", ""},
		{"acme/app?x=1/y", "", ""},
		{"https://github.com/acme/..%2f..%2fapp", "", ""},
	} {
		owner, name, ok := parseRepository(tc.in)
		if owner != tc.owner || name != tc.name || ok != (tc.owner != "") {
			t.Errorf("parseRepository(%q) = %q, %q, %v; want %q, %q", tc.in, owner, name, ok, tc.owner, tc.name)
		}
	}
}

func TestGitHubByRepositoryLooksTheInstallationUp(t *testing.T) {
	f := newGHFixture(t)
	m := f.minter(t, f.recipe(InstallationID{ByRepository: true}, readContents))
	ctx := context.Background()
	lookups := func() (n int) {
		for _, r := range f.gh.APIRequests() {
			if strings.HasSuffix(r.Path, "/installation") {
				n++
			}
		}
		return n
	}
	for _, repo := range []string{"acme/app", "umbrella/web", "acme/app"} {
		if _, err := m.mint(ctx, mintReq(repo)); err != nil {
			t.Fatalf("%s: %v", repo, err)
		}
	}
	toks := f.gh.Tokens()
	if toks[0].InstallationID != ghInstall || toks[1].InstallationID != ghInstall2 || toks[1].Repos[0] != "umbrella/web" {
		t.Fatalf("tokens minted in %d (%v) and %d (%v)", toks[0].InstallationID, toks[0].Repos, toks[1].InstallationID, toks[1].Repos)
	}
	if n := lookups(); n != 2 {
		t.Fatalf("%d installation lookups for acme/app twice and umbrella/web, want 2 (acme/app's kept)", n)
	}
	f.clock.Advance(installationTTL)
	if _, err := m.mint(ctx, mintReq("acme/app")); err != nil {
		t.Fatal(err)
	}
	if n := lookups(); n != 3 {
		t.Fatalf("%d lookups after %s, want acme/app's looked up again", n, installationTTL)
	}

	// The App installed again: the cached id is refused 404, and the
	// minter looks the repository up again within the same mint.
	f.gh.Reinstall(t, ghInstall, 52)
	if _, err := m.mint(ctx, mintReq("acme/app")); err != nil {
		t.Fatalf("a mint after the App was installed again: %v", err)
	}
	if toks := f.gh.Tokens(); toks[len(toks)-1].InstallationID != 52 || lookups() != 4 {
		t.Fatalf("after the reinstall: minted in %d with %d lookups, want 52 after 4", toks[len(toks)-1].InstallationID, lookups())
	}

	_, err := m.mint(ctx, mintReq("initech/private"))
	e, ok := errors.AsType[*Error](err)
	if !ok || e.ProviderStatus != http.StatusNotFound || !strings.Contains(e.Detail, "not installed on initech/private") {
		t.Fatalf("a repository the App is not installed on: %v", err)
	}
}

func TestGitHubReusesItsJWTUntilAMinuteBeforeItsExpiry(t *testing.T) {
	f := newGHFixture(t)
	m := f.minter(t, f.recipe(InstallationID{ID: ghInstall}, readContents))
	ctx := context.Background()
	jwts := func() []string {
		var out []string
		for _, r := range f.gh.APIRequests() {
			if r.JWT != "" && (len(out) == 0 || out[len(out)-1] != r.JWT) {
				out = append(out, r.JWT)
			}
		}
		return out
	}
	start := f.clock.Now()
	for i, at := range []time.Duration{0, 4 * time.Minute, 7*time.Minute + 59*time.Second} {
		f.clock.Set(start.Add(at))
		if _, err := m.mint(ctx, mintReq("acme/app")); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			// Read once and kept: the file is not read again.
			f.setKey(t, "not a key any more")
		}
	}
	if got := jwts(); len(got) != 1 {
		t.Fatalf("%d JWTs over three mints within 8 minutes, want one reused", len(got))
	}
	f.clock.Set(start.Add(8 * time.Minute)) // a minute before its exp
	if _, err := m.mint(ctx, mintReq("acme/app")); err != nil {
		t.Fatal(err)
	}
	if got := jwts(); len(got) != 2 {
		t.Fatalf("%d JWTs at 8 minutes, want a new one", len(got))
	}
}

func TestGitHubRefusalsAreErrorsWithGitHubsStatus(t *testing.T) {
	f := newGHFixture(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		recipe  GitHubApp
		repo    string
		status  int
		message string
	}{
		{"a repository of another installation", f.recipe(InstallationID{ID: ghInstall}, readContents), "umbrella/web", 422, fakegithub.MsgRepoInaccessible},
		{"a permission beyond the App's", f.recipe(InstallationID{ID: ghInstall}, map[string]string{"issues": "write"}), "acme/app", 422, fakegithub.MsgPermsNotGranted},
		{"an installation of no App's", f.recipe(InstallationID{ID: 7}, readContents), "acme/app", 404, fakegithub.MsgNotFound},
		{"no repository", f.recipe(InstallationID{ID: ghInstall}, readContents), "", 0, "needs the run's repository"},
		{"a repository that is no repository", f.recipe(InstallationID{ID: ghInstall}, readContents), "https://github.com/", 0, "not owner/name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.minter(t, tc.recipe).mint(ctx, mintReq(tc.repo))
			e, ok := errors.AsType[*Error](err)
			if !ok || e.ProviderStatus != tc.status || !strings.Contains(e.Detail, tc.message) {
				t.Fatalf("got %v, want an *Error with status %d and %q", err, tc.status, tc.message)
			}
			if e.ProjectID != "acme" || e.Key != "GITHUB_TOKEN" || e.Kind != KindGitHubApp {
				t.Fatalf("the error names %s/%s (%s)", e.ProjectID, e.Key, e.Kind)
			}
		})
	}
	if n := f.gh.Mints(); n != 0 {
		t.Fatalf("%d tokens minted by refused mints", n)
	}
}

func TestGitHubKeyIsReadAsPKCS1OrPKCS8AndAgainWhenGitHubRefusesIt(t *testing.T) {
	f := newGHFixture(t)
	ctx := context.Background()
	f.setKey(t, string(fakegithub.PKCS8PEM(t, f.key)))
	if _, err := f.minter(t, f.recipe(InstallationID{ID: ghInstall}, readContents)).mint(ctx, mintReq("acme/app")); err != nil {
		t.Fatalf("a PKCS#8 key: %v", err)
	}

	const notAKey = "-----BEGIN RSA PRIVATE KEY-----\nc2VjcmV0LXZhbHVlLW5vdC1hLWtleQ==\n-----END RSA PRIVATE KEY-----\n"
	for _, bad := range []string{notAKey, "ghp_notapemkeyatall", string(fakegithub.PKCS1PEM(f.key))[:200]} {
		f.setKey(t, bad)
		_, err := f.minter(t, f.recipe(InstallationID{ID: ghInstall}, readContents)).mint(ctx, mintReq("acme/app"))
		e, ok := errors.AsType[*Error](err)
		if !ok || e.ProviderStatus != 0 || !strings.Contains(e.Detail, "githubApp.privateKeySecret") {
			t.Fatalf("a bad key: %v, want an *Error naming githubApp.privateKeySecret", err)
		}
		leakcheck.AssertClean(t, "the bad key's error", []byte(err.Error()), leakcheck.Real{Key: "the bad key", Value: pemBody(bad)})
	}

	// Another App's key (a rotation GitHub knows and the secret not yet):
	// GitHub refuses the JWT, and once the secret holds the right key the
	// next mint reads it again, with no restart.
	other := fakegithub.NewAppKey(t)
	f.setKey(t, string(fakegithub.PKCS1PEM(other)))
	m := f.minter(t, f.recipe(InstallationID{ID: ghInstall}, readContents))
	_, err := m.mint(ctx, mintReq("acme/app"))
	if e, ok := errors.AsType[*Error](err); !ok || e.ProviderStatus != http.StatusUnauthorized {
		t.Fatalf("a key GitHub does not know: %v, want GitHub's 401", err)
	}
	f.setKey(t, string(fakegithub.PKCS1PEM(f.key)))
	if _, err := m.mint(ctx, mintReq("acme/app")); err != nil {
		t.Fatalf("after the secret was fixed: %v", err)
	}
}

func TestGitHubRevokeEndsTheToken(t *testing.T) {
	f := newGHFixture(t)
	m := f.minter(t, f.recipe(InstallationID{ID: ghInstall}, map[string]string{"contents": "write"}))
	ctx := context.Background()
	got, err := m.mint(ctx, mintReq("acme/app"))
	if err != nil {
		t.Fatal(err)
	}
	token := string(got.Value)
	if !f.gh.Live(token) {
		t.Fatal("the minted token is not live at the fake")
	}
	if err := m.revoke(ctx, token); err != nil {
		t.Fatal(err)
	}
	if f.gh.Live(token) || f.gh.Revocations() != 1 {
		t.Fatalf("after revoke: live %v, %d revocations", f.gh.Live(token), f.gh.Revocations())
	}
	cmd := exec.Command("git", "clone", "-q", f.gh.GitURL("acme/app", token), t.TempDir()+"/c")
	cmd.Env = f.gh.GitEnv(t)
	if cmd.Run() == nil {
		t.Fatal("git cloned with the revoked token")
	}
	if reqs := f.gh.GitRequests(); reqs[len(reqs)-1].Status != http.StatusUnauthorized {
		t.Fatalf("the revoked token's clone was answered %d", reqs[len(reqs)-1].Status)
	}
	// Revoked already, or expired: GitHub answers 401, which is the end
	// sought.
	if err := m.revoke(ctx, token); err != nil {
		t.Fatalf("revoking a revoked token: %v", err)
	}
	got2, err := m.mint(ctx, mintReq("acme/app"))
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(fakegithub.TokenLifetime)
	if err := m.revoke(ctx, string(got2.Value)); err != nil {
		t.Fatalf("revoking an expired token: %v", err)
	}
}

func TestGitHubValuesReachNoErrorNorLog(t *testing.T) {
	f := newGHFixture(t)
	ctx := context.Background()
	var errs []string
	note := func(err error) {
		if err != nil {
			errs = append(errs, err.Error(), fmt.Sprintf("%+v %#v", err, err))
		}
	}
	good := f.minter(t, f.recipe(InstallationID{ByRepository: true}, readContents))
	var minted []Minted
	for _, repo := range []string{"acme/app", "umbrella/web", "initech/private", ""} {
		got, err := good.mint(ctx, mintReq(repo))
		note(err)
		if err == nil {
			minted = append(minted, got)
			errs = append(errs, fmt.Sprintf("%v %+v %#v", got, got, got))
		}
	}
	_, err := f.minter(t, f.recipe(InstallationID{ID: ghInstall}, map[string]string{"issues": "write"})).mint(ctx, mintReq("acme/app"))
	note(err)
	for _, got := range minted {
		note(good.revoke(ctx, string(got.Value)))
	}
	note(good.revoke(ctx, "ghs_neverminted0000000000000000000000"))
	wrongKey := string(fakegithub.PKCS1PEM(fakegithub.NewAppKey(t)))
	f.setKey(t, wrongKey)
	_, err = f.minter(t, f.recipe(InstallationID{ID: ghInstall}, readContents)).mint(ctx, mintReq("acme/app"))
	note(err)
	if len(minted) != 2 || len(errs) < 4 {
		t.Fatalf("%d minted, %d errors: the test did not exercise what it checks", len(minted), len(errs))
	}

	seenText := strings.Join(errs, "\n") + "\n" + f.log.String()
	seen := []byte(seenText)
	if !strings.Contains(f.log.String(), "github token not minted") {
		t.Fatalf("the log lacks the failures' lines:\n%s", f.log.String())
	}
	for i, tok := range f.gh.Tokens() {
		leakcheck.AssertClean(t, "errors and log", seen, leakcheck.Real{Key: fmt.Sprintf("token %d", i), Value: tok.Value, Public: len("ghs_")})
	}
	jwts := map[string]int{}
	for i, r := range f.gh.APIRequests() {
		if _, dup := jwts[r.JWT]; r.JWT != "" && !dup {
			jwts[r.JWT] = i
		}
	}
	for jwt, i := range jwts {
		// The header is every App JWT's; the claims and signature are
		// this one's.
		header := strings.Index(jwt, ".") + 1
		leakcheck.AssertClean(t, "errors and log", seen, leakcheck.Real{Key: fmt.Sprintf("the JWT of API request %d", i), Value: jwt, Public: header})
	}
	for name, pemText := range map[string]string{"the App's key": string(fakegithub.PKCS1PEM(f.key)), "the wrong key": wrongKey} {
		// Whole in every form leakcheck knows, and no 16 characters of
		// it as written (leakcheck's every-run search over a 1.6 KB key
		// takes seconds per key under -race).
		body := pemBody(pemText)
		leakcheck.AssertClean(t, "errors and log", seen, leakcheck.Real{Key: name, Value: body, Fragment: len(body)})
		flat := strings.ReplaceAll(body, "\n", "")
		for i := 0; i+16 <= len(flat); i++ {
			if strings.Contains(seenText, flat[i:i+16]) {
				t.Fatalf("errors and log hold 16 characters of %s", name)
			}
		}
	}
}

// pemBody is what is secret in a PEM text: all but its armour lines
// (BEGIN and END, which an error may well name).
func pemBody(s string) string {
	var body []string
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(line, "-----") {
			body = append(body, line)
		}
	}
	return strings.Join(body, "\n")
}
