package fakegithub

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
)

const (
	appID      = 1234
	otherAppID = 99
	installID  = 42
	otherInst  = 77
)

type fixture struct {
	srv      *Server
	clock    *clock.Fake
	key      *rsa.PrivateKey
	otherKey *rsa.PrivateKey
}

// newFixture: App 1234 (contents write, metadata read) installed as 42 on
// acme/app and acme/other; App 99 installed as 77 on globex/site; and
// initech/private, of no installation.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{clock: clock.NewFake(time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)), key: NewAppKey(t), otherKey: NewAppKey(t)}
	f.srv = New(t, Options{
		Clock: f.clock,
		Apps: []App{
			{ID: appID, Key: &f.key.PublicKey, Permissions: map[string]string{"contents": "write", "metadata": "read"},
				Installations: []Installation{{ID: installID, Repos: []string{"acme/app", "acme/other"}}}},
			{ID: otherAppID, Key: &f.otherKey.PublicKey, Permissions: map[string]string{"contents": "read"},
				Installations: []Installation{{ID: otherInst, Repos: []string{"globex/site"}}}},
		},
		Repos: []string{"initech/private"},
	})
	return f
}

// jwt is an App JWT as GitHub's docs describe it, independent of the
// broker's, so the fake is tested on its own.
func jwt(t *testing.T, key *rsa.PrivateKey, iss any, iat, exp time.Time) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signing := enc(map[string]string{"alg": "RS256", "typ": "JWT"}) + "." + enc(map[string]any{"iss": iss, "iat": iat.Unix(), "exp": exp.Unix()})
	digest := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func (f *fixture) appJWT(t *testing.T) string {
	now := f.clock.Now()
	return jwt(t, f.key, fmt.Sprint(appID), now.Add(-time.Minute), now.Add(9*time.Minute))
}

// call makes an API request at the server's APIURL and returns the
// status and the decoded body.
func (f *fixture) call(t *testing.T, method, path, auth string, body any) (int, map[string]any) {
	t.Helper()
	return callURL(t, f.srv.Client(), method, f.srv.APIURL()+path, auth, body)
}

func callURL(t *testing.T, c *http.Client, method, url, auth string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", "fakegithub-test")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	if len(b) > 0 {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%s %s: %d %q: %v", method, url, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode, out
}

func (f *fixture) mint(t *testing.T, repos []string, perms map[string]string) string {
	t.Helper()
	status, body := f.call(t, "POST", fmt.Sprintf("/app/installations/%d/access_tokens", installID), "Bearer "+f.appJWT(t),
		map[string]any{"repositories": repos, "permissions": perms})
	if status != http.StatusCreated {
		t.Fatalf("mint %v %v: %d %v", repos, perms, status, body)
	}
	tok, _ := body["token"].(string)
	if !strings.HasPrefix(tok, "ghs_") {
		t.Fatalf("mint: token %q", tok)
	}
	return tok
}

// git runs the real git client against the server; it returns its
// combined output and whether it succeeded.
func (f *fixture) git(t *testing.T, dir string, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = f.srv.GitEnv(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("git %v: %v", args, err)
		}
	}
	return string(out), err == nil
}

func TestGitHonoursTheTokensRepositoriesAndPermissions(t *testing.T) {
	f := newFixture(t)
	read := f.mint(t, []string{"app"}, map[string]string{"contents": "read"})
	work := t.TempDir()

	if out, ok := f.git(t, work, "clone", "-q", f.srv.GitURL("acme/app", read), "app"); !ok {
		t.Fatalf("clone of acme/app with its token: %s", out)
	}
	if b, err := os.ReadFile(filepath.Join(work, "app", "README")); err != nil || !strings.Contains(string(b), "acme/app") {
		t.Fatalf("the clone's README: %q, %v", b, err)
	}
	served := 0
	for _, r := range f.srv.GitRequests() {
		if r.Repo == "acme/app" && r.Status == http.StatusOK {
			served++
			if r.Token != read || r.Service != UploadPack {
				t.Errorf("acme/app served %+v, want %s with the minted token", r, UploadPack)
			}
		}
	}
	if served == 0 {
		t.Fatalf("no request of the clone was served: %+v", f.srv.GitRequests())
	}

	// Another repository of the same installation: the token does not
	// reach it, and GitHub hides a private repository (404).
	out, ok := f.git(t, work, "clone", "-q", f.srv.GitURL("acme/other", read), "other")
	if ok || !strings.Contains(out, "not found") {
		t.Fatalf("clone of acme/other with acme/app's token: ok=%v %s", ok, out)
	}
	if last := f.lastGit(t); last.Repo != "acme/other" || last.Status != http.StatusNotFound {
		t.Fatalf("the refused clone: %+v", last)
	}
	if _, ok := f.git(t, work, "clone", "-q", f.srv.GitURL("initech/private", read), "private"); ok {
		t.Fatal("clone of a repository of no installation succeeded")
	}
	if _, ok := f.git(t, work, "clone", "-q", f.srv.GitURL("acme/app", ""), "anon"); ok {
		t.Fatal("clone without a token succeeded")
	}

	// A push needs contents:write.
	app := filepath.Join(work, "app")
	before := f.srv.Head(t, "acme/app", "main")
	// Past git's http.postBuffer (1 MiB), so the push's body is chunked.
	change := make([]byte, 2<<20)
	rand.Read(change)
	if err := os.WriteFile(filepath.Join(app, "change"), change, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, ok := f.git(t, app, "add", "change"); !ok {
		t.Fatal(out)
	}
	if out, ok := f.git(t, app, "commit", "-q", "-m", "a change"); !ok {
		t.Fatal(out)
	}
	out, ok = f.git(t, app, "push", "-q", "origin", "main")
	if ok || f.srv.Head(t, "acme/app", "main") != before {
		t.Fatalf("push with a read token: ok=%v %s", ok, out)
	}
	if last := f.lastGit(t); last.Service != ReceivePack || last.Status != http.StatusForbidden {
		t.Fatalf("the refused push: %+v", last)
	}

	write := f.mint(t, []string{"app"}, map[string]string{"contents": "write"})
	if out, ok := f.git(t, app, "push", "-q", f.srv.GitURL("acme/app", write), "main"); !ok {
		t.Fatalf("push with a write token: %s", out)
	}
	local, _ := f.git(t, app, "rev-parse", "HEAD")
	if got := f.srv.Head(t, "acme/app", "main"); got != strings.TrimSpace(local) {
		t.Fatalf("acme/app main is %s after the push, want %s", got, local)
	}

	// Revoked: refused by the API and by git.
	if status, body := f.call(t, "DELETE", "/installation/token", "token "+write, nil); status != http.StatusNoContent {
		t.Fatalf("revoke: %d %v", status, body)
	}
	if f.srv.Live(write) || f.srv.Revocations() != 1 {
		t.Fatalf("after the revoke: live %v, revocations %d", f.srv.Live(write), f.srv.Revocations())
	}
	if _, ok := f.git(t, work, "clone", "-q", f.srv.GitURL("acme/app", write), "revoked"); ok {
		t.Fatal("clone with a revoked token succeeded")
	}
	if last := f.lastGit(t); last.Token != write || last.Status != http.StatusUnauthorized {
		t.Fatalf("the revoked token's clone: %+v", last)
	}
	if status, body := f.call(t, "DELETE", "/installation/token", "token "+write, nil); status != http.StatusUnauthorized || body["message"] != MsgBadCredentials {
		t.Fatalf("second revoke: %d %v", status, body)
	}

	// An App installed again has a new id; the old one and its tokens
	// are gone.
	again := f.mint(t, []string{"app"}, nil)
	f.srv.Reinstall(t, installID, installID+1)
	if f.srv.Live(again) {
		t.Fatal("a token of the old installation outlived the reinstall")
	}
	if status, body := f.call(t, "GET", "/repos/acme/app/installation", "Bearer "+f.appJWT(t), nil); status != http.StatusOK || body["id"] != float64(installID+1) {
		t.Fatalf("the reinstalled App's installation: %d %v", status, body)
	}
	if status, _ := f.call(t, "POST", fmt.Sprintf("/app/installations/%d/access_tokens", installID), "Bearer "+f.appJWT(t), nil); status != http.StatusNotFound {
		t.Fatalf("a mint in the old installation: %d", status)
	}

	// Expired, on the server's clock.
	f.clock.Advance(TokenLifetime)
	if _, ok := f.git(t, work, "clone", "-q", f.srv.GitURL("acme/app", read), "expired"); ok {
		t.Fatal("clone with an expired token succeeded")
	}
	if f.srv.Mints() != 3 {
		t.Fatalf("mints: %d, want 3", f.srv.Mints())
	}
}

func (f *fixture) lastGit(t *testing.T) GitRequest {
	t.Helper()
	reqs := f.srv.GitRequests()
	if len(reqs) == 0 {
		t.Fatal("no git request")
	}
	return reqs[len(reqs)-1]
}

func TestTheRealNamesRouteToTheAPIAndToGit(t *testing.T) {
	f := newFixture(t)
	_, port, _ := net.SplitHostPort(f.srv.Addr)
	dialer := &net.Dialer{}
	c := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: f.srv.CertPool()},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, f.srv.Addr)
		},
	}}
	status, body := callURL(t, c, "GET", "https://"+DefaultAPIHost+":"+port+"/repos/acme/other/installation", "Bearer "+f.appJWT(t), nil)
	if status != http.StatusOK || body["id"] != float64(installID) {
		t.Fatalf("GET /repos/acme/other/installation at %s: %d %v", DefaultAPIHost, status, body)
	}
	tok := f.mint(t, []string{"other"}, nil)
	url := "https://x-access-token:" + tok + "@" + DefaultGitHost + ":" + port + "/acme/other.git"
	host, _, _ := net.SplitHostPort(f.srv.Addr)
	resolve := DefaultGitHost + ":" + port + ":" + host
	if out, ok := f.git(t, t.TempDir(), "-c", "http.curloptResolve="+resolve, "clone", "-q", url, "other"); !ok {
		t.Fatalf("clone at %s: %s", DefaultGitHost, out)
	}
	// Without a list, a token gets every repository of the installation
	// and every permission of the App, as on GitHub.
	if got := f.srv.Tokens()[0]; len(got.Repos) != 1 || got.Repos[0] != "acme/other" || got.Permissions["contents"] != "write" {
		t.Fatalf("token: %+v", got)
	}
}

func TestTheAPIRefusesAsGitHubDoes(t *testing.T) {
	f := newFixture(t)
	now := f.clock.Now()
	mintPath := fmt.Sprintf("/app/installations/%d/access_tokens", installID)
	good := "Bearer " + f.appJWT(t)
	for _, tc := range []struct {
		name         string
		method, path string
		auth         string
		body         any
		status       int
		message      string
	}{
		{"a repository the installation lacks", "POST", mintPath, good, map[string]any{"repositories": []string{"site"}}, 422, MsgRepoInaccessible},
		{"owner/name instead of a name", "POST", mintPath, good, map[string]any{"repositories": []string{"acme/app"}}, 422, MsgRepoInaccessible},
		{"a permission the App lacks", "POST", mintPath, good, map[string]any{"permissions": map[string]string{"issues": "read"}}, 422, MsgPermsNotGranted},
		{"more than the App's level", "POST", mintPath, good, map[string]any{"permissions": map[string]string{"metadata": "write"}}, 422, MsgPermsNotGranted},
		{"a field GitHub does not define", "POST", mintPath, good, map[string]any{"repository": "app"}, 422, ""},
		{"another App's installation", "POST", fmt.Sprintf("/app/installations/%d/access_tokens", otherInst), good, nil, 404, MsgNotFound},
		{"no JWT", "POST", mintPath, "", nil, 401, ""},
		{"a JWT of another key", "POST", mintPath, "Bearer " + jwt(t, f.otherKey, appID, now.Add(-time.Minute), now.Add(5*time.Minute)), nil, 401, ""},
		{"an expired JWT", "POST", mintPath, "Bearer " + jwt(t, f.key, appID, now.Add(-11*time.Minute), now.Add(-time.Second)), nil, 401, MsgJWTExpired},
		{"a JWT living over 10 minutes", "POST", mintPath, "Bearer " + jwt(t, f.key, appID, now.Add(-time.Minute), now.Add(10*time.Minute)), nil, 401, MsgJWTTooLong},
		{"a JWT issued later", "POST", mintPath, "Bearer " + jwt(t, f.key, appID, now.Add(time.Minute), now.Add(5*time.Minute)), nil, 401, MsgJWTIssuedLater},
		{"an unknown App", "GET", "/repos/acme/app/installation", "Bearer " + jwt(t, f.key, 5, now, now.Add(time.Minute)), nil, 401, ""},
		{"a repository the App is not installed on", "GET", "/repos/globex/site/installation", good, nil, 404, MsgNotFound},
		{"a revoke with a token never minted", "DELETE", "/installation/token", "token ghs_nothing", nil, 401, MsgBadCredentials},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := f.call(t, tc.method, tc.path, tc.auth, tc.body)
			if status != tc.status || (tc.message != "" && body["message"] != tc.message) {
				t.Fatalf("%d %v, want %d %q", status, body, tc.status, tc.message)
			}
		})
	}
	if f.srv.Mints() != 0 {
		t.Fatalf("%d tokens minted by refused requests", f.srv.Mints())
	}

	// GitHub refuses a request without a User-Agent.
	req, _ := http.NewRequest("GET", f.srv.APIURL()+"/repos/acme/app/installation", nil)
	req.Header.Set("Authorization", good)
	req.Header.Set("User-Agent", "")
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("no User-Agent: %d", resp.StatusCode)
	}

	// The JWT is checked on the server's clock.
	f.clock.Advance(9 * time.Minute)
	if status, _ := f.call(t, "GET", "/repos/acme/app/installation", good, nil); status != http.StatusUnauthorized {
		t.Fatalf("a JWT past its exp on the server's clock: %d", status)
	}
}
