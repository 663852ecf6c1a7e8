package fakegithub

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Services of git smart HTTP.
const (
	UploadPack  = "git-upload-pack"  // clone, fetch
	ReceivePack = "git-receive-pack" // push
)

// git answers git smart HTTP for /{owner}/{name}[.git]/{info/refs,
// git-upload-pack, git-receive-pack}, after the checks of the package's
// doc, through git http-backend.
func (s *Server) git(w http.ResponseWriter, r *http.Request) {
	rec := GitRequest{}
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		rec.Status = sw.status
		s.mu.Lock()
		s.gitReqs = append(s.gitReqs, rec)
		s.mu.Unlock()
	}()
	if r.UserAgent() == "" {
		http.Error(sw, MsgNoUserAgent, http.StatusForbidden)
		return
	}

	parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 3)
	if len(parts) < 3 {
		http.Error(sw, "Not Found", http.StatusNotFound)
		return
	}
	rec.Repo = parts[0] + "/" + strings.TrimSuffix(parts[1], ".git")
	switch rest := parts[2]; {
	case rest == "info/refs" && r.Method == http.MethodGet:
		rec.Service = r.URL.Query().Get("service")
	case (rest == UploadPack || rest == ReceivePack) && r.Method == http.MethodPost:
		rec.Service = rest
	}
	if rec.Service != UploadPack && rec.Service != ReceivePack {
		// GitHub serves no dumb HTTP.
		rec.Service = ""
		http.Error(sw, "Not Found", http.StatusNotFound)
		return
	}

	user, token, ok := r.BasicAuth()
	if ok {
		rec.Token = token
	}
	s.mu.Lock()
	tok := s.liveLocked(token)
	var cover *Token
	if tok != nil {
		copied := *tok
		cover = &copied
	}
	s.mu.Unlock()
	if !ok || user != "x-access-token" || cover == nil {
		sw.Header().Set("WWW-Authenticate", `Basic realm="GitHub"`)
		http.Error(sw, "Invalid username or token. Password authentication is not supported for Git operations.", http.StatusUnauthorized)
		return
	}
	canonical, exists := s.repos[strings.ToLower(rec.Repo)]
	if !exists || !containsFold(cover.Repos, canonical) {
		http.Error(sw, "Repository not found.", http.StatusNotFound)
		return
	}
	want := "read"
	if rec.Service == ReceivePack {
		want = "write"
	}
	if !covers(cover.Permissions["contents"], want) {
		http.Error(sw, "Permission to "+canonical+".git denied to x-access-token.", http.StatusForbidden)
		return
	}

	r2 := r.Clone(r.Context())
	r2.URL.Path = "/" + canonical + ".git/" + parts[2]
	r2.URL.RawPath = ""
	// net/http/cgi refuses a chunked body (git sends one past
	// http.postBuffer, 1 MiB); git http-backend reads a body without
	// CONTENT_LENGTH to its end, so the body goes on as a stream.
	r2.TransferEncoding = nil
	s.backend(user).ServeHTTP(sw, r2)
}

// backend is git http-backend over GIT_PROJECT_ROOT, pushes allowed,
// with nothing of the machine's git configuration; remoteUser is who
// pushes (git names it in the reflog).
func (s *Server) backend(remoteUser string) http.Handler {
	return &cgi.Handler{
		Path: s.gitPath,
		Args: []string{"http-backend"},
		Dir:  s.root,
		Env: []string{
			"GIT_PROJECT_ROOT=" + s.root,
			"GIT_HTTP_EXPORT_ALL=1",
			"REMOTE_USER=" + remoteUser,
			"HOME=/nonexistent",
			"GIT_CONFIG_NOSYSTEM=1",
			"GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_CONFIG_COUNT=2",
			"GIT_CONFIG_KEY_0=http.receivepack",
			"GIT_CONFIG_VALUE_0=true",
			"GIT_CONFIG_KEY_1=safe.directory",
			"GIT_CONFIG_VALUE_1=*",
		},
		InheritEnv: []string{"PATH"},
		Stderr:     &s.stderr,
	}
}

// statusWriter keeps the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

// RepoDir is the bare repository of repo ("owner/name") on disk.
func (s *Server) RepoDir(repo string) string {
	return filepath.Join(s.root, filepath.FromSlash(s.repos[strings.ToLower(repo)])+".git")
}

// newRepo creates repo's bare repository with one commit on main, a
// README.
func (s *Server) newRepo(t testing.TB, repo string) {
	t.Helper()
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("A repository of fakegithub's: "+repo+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runGit(t, work, "init", "-q", "-b", "main")
	runGit(t, work, "add", ".")
	runGit(t, work, "commit", "-q", "-m", "fakegithub: "+repo)
	dest := filepath.Join(s.root, filepath.FromSlash(repo)+".git")
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		t.Fatal(err)
	}
	runGit(t, s.root, "clone", "-q", "--bare", work, dest)
	runGit(t, dest, "remote", "remove", "origin")
}

// Head is the commit branch points to in repo, "" if there is no such
// branch: what a test reads to tell a push landed.
func (s *Server) Head(t testing.TB, repo, branch string) string {
	t.Helper()
	cmd := gitCommand(s.RepoDir(repo), "rev-parse", "-q", "--verify", "refs/heads/"+branch+"^{commit}")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if exit, ok := errors.AsType[*exec.ExitError](err); ok && exit.ExitCode() == 1 && stderr.Len() == 0 {
			return ""
		}
		t.Fatalf("fakegithub: git rev-parse %s in %s: %v\n%s", branch, repo, err, stderr.Bytes())
	}
	return strings.TrimSpace(string(out))
}

// gitCommand is git run by the server itself, with no configuration of
// the machine's.
func gitCommand(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", append([]string{"-c", "safe.directory=*"}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=/nonexistent",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=fakegithub",
		"GIT_AUTHOR_EMAIL=fakegithub@example.invalid",
		"GIT_COMMITTER_NAME=fakegithub",
		"GIT_COMMITTER_EMAIL=fakegithub@example.invalid",
	}
	return cmd
}

func runGit(t testing.TB, dir string, args ...string) {
	t.Helper()
	if out, err := gitCommand(dir, args...).CombinedOutput(); err != nil {
		t.Fatalf("fakegithub: git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
