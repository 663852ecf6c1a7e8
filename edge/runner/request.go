package runner

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/runfleet/runfleet/shared/runspec"
)

// promptMarker in an agent's argv is replaced by the prompt, inside that one
// argument: the prompt never passes through a shell of ours.
const promptMarker = "{prompt}"

// validateStart checks a start request before anything is stored, naming the
// field at fault: the run request as every side checks it (runspec), then
// what is this host's (the token, its agent table, its roots). It returns
// the run's secrets as declared.
func (r *Runner) validateStart(req Spec) ([]runspec.Declared, error) {
	if req.ClientToken == "" {
		return nil, badRequest("clientToken", "is required")
	}
	if len(req.ClientToken) > 256 {
		return nil, badRequest("clientToken", "is longer than 256 bytes")
	}
	declared, err := req.Declare()
	if err != nil {
		return nil, err
	}
	if err := checkCredentials(req.Credentials, declared); err != nil {
		return nil, err
	}
	if _, ok := r.cfg.Agents[req.Agent]; !ok {
		return nil, badRequest("agent", "%q is not in this host's agent table", req.Agent)
	}
	if req.LocalPath != "" {
		if _, err := r.resolveLocalPath(req.LocalPath); err != nil {
			return nil, err
		}
	}
	return declared, nil
}

// cloneURL is what a run clones: nothing when it works in a local path,
// else cloneUrl, else repository, else nothing.
func cloneURL(req Spec) string {
	if req.LocalPath != "" {
		return ""
	}
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
