// Package fakegithub is a GitHub on loopback over TLS, for the tests of
// Fleet's GitHub App broker: the REST API an App mints installation
// tokens with, and git smart HTTP honouring those tokens, on one listener
// with a certificate of its own test CA.
//
// What it checks, as GitHub does. An App request's bearer JWT must be RS256
// signed by a key of a configured App (its public key), name that App in
// iss (a number or a string), be unexpired and expire at most 10 minutes
// after it was issued, on the server's clock. A token is minted for the
// repositories and permissions asked for, never more than the installation
// holds or the App was granted (422 otherwise, as GitHub answers); it
// lives an hour on the server's clock and DELETE /installation/token ends
// it. git reaches a repository through the real git http-backend (net/http/
// cgi) only with Basic auth x-access-token:<token> of a live token that
// covers the repository: contents read to fetch, write to push; no or a
// dead token is 401, a repository the token does not cover 404 (GitHub
// hides private repositories), a push without write 403. Any request
// without a User-Agent is refused 403, as GitHub does.
//
// Routing. Requests for APIHost (api.github.com) are the API; on any other
// name (GitHost, or the listener's IP) /api/v3/... is the API, as GitHub
// Enterprise serves it, and every other path is git. A client reaching the
// server directly uses APIURL and GitURL (the IP); edge reaches it under
// the real names through proxy.upstream.resolve, listening on <ip>:443
// (Options.Addr).
//
// It records what it served (APIRequests, GitRequests, Tokens): tests
// assert which token served which git request and that a revoked one is
// refused. It holds tokens and JWTs in memory and in its records: it is a
// test kit, and lives under tests/; nothing outside tests imports it.
package fakegithub

import (
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/gitsshd"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// Default names the certificate covers and the routing knows.
const (
	DefaultAPIHost = "api.github.com"
	DefaultGitHost = "github.com"
)

// TokenLifetime is how long a minted token lives, as on GitHub.
const TokenLifetime = time.Hour

// Options configure a server. Apps is required; the rest may be zero.
type Options struct {
	// Clock decides JWT validity and token expiry; nil is the wall clock.
	// (TLS certificates are valid on the wall clock regardless.)
	Clock clock.Clock
	// Apps are the GitHub Apps the server knows, with their installations.
	// Every repository of an installation exists on the server as a bare
	// repository with one commit on main.
	Apps []App
	// Repos are more repositories that exist but belong to no
	// installation ("owner/name").
	Repos []string
	// Addr is where the server listens; "" is 127.0.0.1:0. A server edge
	// reaches under the real names listens on "<loopback IP>:443".
	Addr string
	// APIHost and GitHost are the names of the API and of git; "" are
	// DefaultAPIHost and DefaultGitHost.
	APIHost string
	GitHost string
	// Names are more names the certificate covers.
	Names []string
}

// App is a GitHub App.
type App struct {
	ID int64
	// Key verifies the App's JWTs.
	Key *rsa.PublicKey
	// Permissions are what the App was granted (name -> read|write): a
	// token never has more.
	Permissions map[string]string
	// Installations are where the App is installed.
	Installations []Installation
}

// Installation is an App installed on one account's repositories.
type Installation struct {
	ID int64
	// Repos are "owner/name", all of one owner (the account).
	Repos []string
}

// Token is a minted installation token.
type Token struct {
	Value          string
	AppID          int64
	InstallationID int64
	// Repos are "owner/name".
	Repos       []string
	Permissions map[string]string
	IssuedAt    time.Time
	ExpiresAt   time.Time
	// RevokedAt is zero while the token was not revoked.
	RevokedAt time.Time
}

// APIRequest is one API request the server answered.
type APIRequest struct {
	Method string
	// Path is the API path, without /api/v3.
	Path      string
	UserAgent string
	// Accept and APIVersion are the Accept and X-GitHub-Api-Version
	// headers (GitHub answers without them too).
	Accept     string
	APIVersion string
	// JWT is the bearer JWT the request carried ("" if none).
	JWT    string
	Status int
	// Message is the message of a refusal ("" on success).
	Message string
}

// GitRequest is one git smart HTTP request the server answered.
type GitRequest struct {
	// Repo is "owner/name" as the path named it (without .git).
	Repo string
	// Service is "git-upload-pack" (fetch, clone) or "git-receive-pack"
	// (push); "" for a path that is neither.
	Service string
	// Token is the Basic auth password ("" without auth).
	Token  string
	Status int
}

// Server is a running fake GitHub. Its methods are safe for concurrent
// use.
type Server struct {
	// CA issued the server's certificate.
	CA *edgetest.CA
	// CAFile is CA's PEM in a file (git's GIT_SSL_CAINFO, edge's
	// proxy.upstream.extraRootsFile); 0644, it holds only a certificate.
	CAFile string
	// Addr is the server's "ip:port".
	Addr string

	clock   clock.Clock
	apiHost string
	gitHost string
	apps    map[int64]*App    // by id
	repos   map[string]string // lowercase "owner/name" -> canonical
	root    string            // GIT_PROJECT_ROOT
	gitPath string            // git, run as http-backend
	stderr  syncbuf.Buffer    // git http-backend's stderr

	mu          sync.Mutex
	installs    map[int64]*installation // by id; Reinstall changes it
	tokens      map[string]*Token
	minted      []*Token
	revocations int
	apiReqs     []APIRequest
	gitReqs     []GitRequest
}

type installation struct {
	Installation
	app   *App
	owner string
}

// New starts a server that stops when the test ends; a failed test has
// git http-backend's stderr in its output.
func New(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.APIHost == "" {
		opts.APIHost = DefaultAPIHost
	}
	if opts.GitHost == "" {
		opts.GitHost = DefaultGitHost
	}
	dir := t.TempDir()
	s := &Server{
		clock:    opts.Clock,
		apiHost:  strings.ToLower(opts.APIHost),
		gitHost:  strings.ToLower(opts.GitHost),
		apps:     map[int64]*App{},
		installs: map[int64]*installation{},
		repos:    map[string]string{},
		root:     filepath.Join(dir, "repos"),
		tokens:   map[string]*Token{},
	}
	var all []string
	for i := range opts.Apps {
		app := &opts.Apps[i]
		if app.Key == nil {
			t.Fatalf("fakegithub: app %d has no key", app.ID)
		}
		if _, dup := s.apps[app.ID]; dup {
			t.Fatalf("fakegithub: app %d twice", app.ID)
		}
		s.apps[app.ID] = app
		for _, in := range app.Installations {
			if _, dup := s.installs[in.ID]; dup {
				t.Fatalf("fakegithub: installation %d twice", in.ID)
			}
			ins := &installation{Installation: in, app: app}
			for _, r := range in.Repos {
				owner, _, ok := splitRepo(r)
				if !ok {
					t.Fatalf("fakegithub: installation %d: repository %q is not owner/name", in.ID, r)
				}
				if ins.owner == "" {
					ins.owner = owner
				} else if !strings.EqualFold(owner, ins.owner) {
					t.Fatalf("fakegithub: installation %d holds repositories of %s and %s: one account only", in.ID, ins.owner, owner)
				}
			}
			s.installs[in.ID] = ins
			all = append(all, in.Repos...)
		}
	}
	all = append(all, opts.Repos...)
	for _, r := range all {
		if _, _, ok := splitRepo(r); !ok {
			t.Fatalf("fakegithub: repository %q is not owner/name", r)
		}
		if _, done := s.repos[strings.ToLower(r)]; done {
			continue
		}
		s.repos[strings.ToLower(r)] = r
		s.newRepo(t, r)
	}
	var err error
	if s.gitPath, err = exec.LookPath("git"); err != nil {
		t.Fatalf("fakegithub: %v", err)
	}

	if s.CA, err = edgetest.MakeCA(); err != nil {
		t.Fatal(err)
	}
	s.CAFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(s.CAFile, s.CA.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(s.route))
	if opts.Addr != "" {
		srv.Listener.Close()
		if srv.Listener, err = net.Listen("tcp", opts.Addr); err != nil {
			t.Fatalf("fakegithub: %v", err)
		}
	}
	host, _, _ := net.SplitHostPort(srv.Listener.Addr().String())
	names := append([]string{s.apiHost, s.gitHost, host}, opts.Names...)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{s.CA.Certificate(t, names...)}}
	// A client that gives up mid-handshake is no failure of the server's.
	srv.Config.ErrorLog = log.New(&s.stderr, "fakegithub: ", 0)
	srv.StartTLS()
	s.Addr = srv.Listener.Addr().String()
	t.Cleanup(func() {
		srv.Close()
		if t.Failed() && s.stderr.String() != "" {
			t.Logf("fakegithub %s: git http-backend's and the server's log:\n%s", s.Addr, s.stderr.String())
		}
	})
	return s
}

// route sends a request to the API or to git (the package's doc).
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	host := strings.ToLower(r.Host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	switch {
	case host == s.apiHost:
		s.api(w, r, r.URL.Path)
	case strings.HasPrefix(r.URL.Path, "/api/v3/"):
		s.api(w, r, strings.TrimPrefix(r.URL.Path, "/api/v3"))
	default:
		s.git(w, r)
	}
}

// APIURL is the API as a client reaching the server directly names it
// (GitHub Enterprise's form): a githubApp recipe's apiUrl.
func (s *Server) APIURL() string { return "https://" + s.Addr + "/api/v3" }

// GitURL is the clone URL of repo ("owner/name") at the server's address,
// with Basic auth x-access-token:token unless token is "".
func (s *Server) GitURL(repo, token string) string {
	u := url.URL{Scheme: "https", Host: s.Addr, Path: "/" + repo + ".git"}
	if token != "" {
		u.User = url.UserPassword("x-access-token", token)
	}
	return u.String()
}

// CertPool trusts the server's CA.
func (s *Server) CertPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(s.CA.Cert)
	return p
}

// Client is an HTTP client that trusts the server's CA (and nothing
// else) and reaches it directly.
func (s *Server) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.CertPool()}}}
}

// GitEnv is the environment of a git client reaching the server directly:
// gitsshd.GitEnv (nothing of the host's configuration) trusting the
// server's CA, never prompting for credentials, plus extra.
func (s *Server) GitEnv(t testing.TB, extra ...string) []string {
	return gitsshd.GitEnv(t, append([]string{"GIT_SSL_CAINFO=" + s.CAFile, "GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=", "SSH_ASKPASS="}, extra...)...)
}

// Mints is how many tokens the server has minted.
func (s *Server) Mints() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.minted)
}

// Revocations is how many tokens DELETE /installation/token revoked.
func (s *Server) Revocations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.revocations
}

// Tokens are the tokens minted so far, in order, as they are now.
func (s *Server) Tokens() []Token {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Token, len(s.minted))
	for i, tok := range s.minted {
		out[i] = *tok
		out[i].Repos = slices.Clone(tok.Repos)
		out[i].Permissions = clonePerms(tok.Permissions)
	}
	return out
}

// Live reports whether token was minted here, is unrevoked and unexpired
// on the server's clock: what git and the API would honour.
func (s *Server) Live(token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.liveLocked(token) != nil
}

// APIRequests are the API requests answered so far, in order.
func (s *Server) APIRequests() []APIRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.apiReqs)
}

// GitRequests are the git requests answered so far, in order.
func (s *Server) GitRequests() []GitRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.gitReqs)
}

// Reinstall installs the App of installation id again, on the same
// repositories, as newID (GitHub gives a reinstalled App a new id): id
// is gone, and so is every token minted in it, as when an App is
// uninstalled (Revocations counts only DELETE /installation/token).
func (s *Server) Reinstall(t testing.TB, id, newID int64) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.installs[id]
	if in == nil || s.installs[newID] != nil {
		t.Fatalf("fakegithub: reinstall %d as %d: no installation %d, or %d exists", id, newID, id, newID)
	}
	moved := *in
	moved.ID = newID
	delete(s.installs, id)
	s.installs[newID] = &moved
	now := s.clock.Now()
	for _, tok := range s.minted {
		if tok.InstallationID == id && tok.RevokedAt.IsZero() {
			tok.RevokedAt = now
		}
	}
}

func (s *Server) liveLocked(token string) *Token {
	tok := s.tokens[token]
	if tok == nil || !tok.RevokedAt.IsZero() || !s.clock.Now().Before(tok.ExpiresAt) {
		return nil
	}
	return tok
}

// splitRepo splits "owner/name" (a trailing .git dropped).
func splitRepo(r string) (owner, name string, ok bool) {
	owner, name, ok = strings.Cut(strings.TrimSuffix(r, ".git"), "/")
	if !ok || owner == "" || name == "" || strings.Contains(name, "/") || owner == "." || owner == ".." || name == "." || name == ".." {
		return "", "", false
	}
	return owner, name, true
}

func clonePerms(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
