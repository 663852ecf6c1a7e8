package runner

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// promptMarker in an agent's argv is replaced by the prompt, inside that one
// argument: the prompt never passes through a shell of ours.
const promptMarker = "{prompt}"

// Variables the runner sets itself, which a run's env may not name.
var reservedEnv = []string{
	"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS",
}

// reservedPrefix: runfleet's own variables.
const reservedPrefix = "RUNFLEET_"

// validateStart checks a start request before anything is stored, naming the
// field at fault.
func (r *Runner) validateStart(req Spec) error {
	if req.ClientToken == "" {
		return badRequest("clientToken", "is required")
	}
	if len(req.ClientToken) > 256 {
		return badRequest("clientToken", "is longer than 256 bytes")
	}
	if req.Agent == "" {
		return badRequest("agent", "is required")
	}
	if _, ok := r.cfg.Agents[req.Agent]; !ok {
		return badRequest("agent", "%q is not in this host's agent table", req.Agent)
	}
	if strings.IndexByte(req.Prompt, 0) >= 0 {
		return badRequest("prompt", "contains a NUL byte")
	}
	for i, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return badRequest("argv", "argument %d contains a NUL byte", i)
		}
	}
	keys := map[string]bool{}
	for i, s := range req.Secrets {
		switch {
		case s.ProjectID == "":
			return badRequest("secrets", "secret %d has no projectId", i)
		case !validEnvName(s.Key):
			return badRequest("secrets", "secret %d: key %q is not a valid environment variable name", i, s.Key)
		case keys[s.Key]:
			return badRequest("secrets", "key %s is declared twice; each key becomes one variable", s.Key)
		case slices.Contains(reservedEnv, s.Key) || strings.HasPrefix(s.Key, reservedPrefix):
			return badRequest("secrets", "key %s names a variable the runner sets itself", s.Key)
		}
		keys[s.Key] = true
	}
	for name, value := range req.Env {
		switch {
		case !validEnvName(name):
			return badRequest("env", "%q is not a valid environment variable name", name)
		case strings.IndexByte(value, 0) >= 0:
			return badRequest("env", "%s contains a NUL byte", name)
		case keys[name]:
			return badRequest("env", "%s is a declared secret's key; its variable holds the placeholder", name)
		case slices.Contains(reservedEnv, name):
			return badRequest("env", "%s is a proxy or trust variable the runner sets itself", name)
		case strings.HasPrefix(name, reservedPrefix):
			return badRequest("env", "%s: RUNFLEET_* variables are the runner's own", name)
		}
	}
	sources := 0
	for _, s := range []string{req.Repository, req.CloneURL, req.LocalPath} {
		if s != "" {
			sources++
		}
	}
	if req.Repository != "" && req.CloneURL != "" {
		sources-- // a repository with the URL to clone it from is one source
	}
	if sources > 1 {
		return badRequest("localPath", "give a repository (or cloneUrl) or a localPath, not both")
	}
	if u := cloneURL(req); u != "" && strings.HasPrefix(u, "-") {
		return badRequest("cloneUrl", "must not begin with '-'")
	}
	if req.LocalPath != "" {
		if _, err := r.resolveLocalPath(req.LocalPath); err != nil {
			return err
		}
	}
	return nil
}

// cloneURL is what a run clones: cloneUrl, else repository, else nothing.
func cloneURL(req Spec) string {
	if req.CloneURL != "" {
		return req.CloneURL
	}
	return req.Repository
}

// resolveLocalPath returns path with symlinks resolved when it is a directory
// under one of runner.roots (also resolved), so a link cannot lead a task out.
func (r *Runner) resolveLocalPath(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", badRequest("localPath", "%q is not absolute", path)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", badRequest("localPath", "%q does not exist on this host", path)
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return "", badRequest("localPath", "%q is not a directory", path)
	}
	for _, root := range r.cfg.Roots {
		rootReal, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(rootReal, real); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return real, nil
		}
	}
	return "", badRequest("localPath", "%q is not under runner.roots", path)
}

// buildArgv is the agent's argv with the prompt put in place (inside its
// argument, never split) and the run's extra argv after it.
func buildArgv(agentArgv []string, prompt string, extra []string) []string {
	argv := make([]string, 0, len(agentArgv)+len(extra))
	for _, a := range agentArgv {
		argv = append(argv, strings.ReplaceAll(a, promptMarker, prompt))
	}
	return append(argv, extra...)
}

func validEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i, c := range name {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// lookPath finds name the way the task's own shell would, on the task's
// PATH rather than edge's.
func lookPath(name, pathEnv string) (string, error) {
	if strings.Contains(name, "/") {
		if isExecutable(name) {
			return name, nil
		}
		return "", errors.New(name + " is not an executable file")
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, nil
		}
	}
	return "", errors.New(name + " is not on the task's PATH")
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
