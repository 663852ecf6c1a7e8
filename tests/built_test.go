package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/runfleet/runfleet/tests/kit/lambdatest"
)

// built holds what the tests build (the functions' bootstraps, the local
// stack), each once per test binary: Go caches the compile, but every link
// costs seconds of a CPU the whole team shares. TestMain removes it all.
var built = &buildCache{paths: map[string]string{}}

type buildCache struct {
	mu    sync.Mutex
	dir   string
	paths map[string]string
}

// get returns key's build, running build into a fresh directory the first
// time. The directories are 0755 (and so are the files go build writes):
// tests run some builds as an unprivileged user.
func (c *buildCache) get(tb testing.TB, key string, build func(dir string) (string, error)) string {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.paths[key]; ok {
		return p
	}
	if c.dir == "" {
		dir, err := os.MkdirTemp("", "runfleet-tests-built-")
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		c.dir = dir
	}
	dir := filepath.Join(c.dir, key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	p, err := build(dir)
	if err != nil {
		tb.Fatal(err)
	}
	c.paths[key] = p
	return p
}

func (c *buildCache) remove() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
}

// functionBootstrap is functions/<fn> built as it ships, for this machine
// (lambdatest.BuildInto), in a directory named after the function.
func functionBootstrap(tb testing.TB, fn string) string {
	tb.Helper()
	return built.get(tb, fn, func(dir string) (string, error) {
		return lambdatest.BuildInto(dir, "./functions/"+fn)
	})
}

// localStackBinary is `make dev`'s program, built as make dev builds it:
// with the runfleet CLI beside it (cliBinary), whose absolute path its
// commands name.
func localStackBinary(tb testing.TB) string {
	tb.Helper()
	return built.get(tb, "dev", func(dir string) (string, error) {
		for _, pkg := range []string{"./shared/cli/runfleet", "./infra/localstack"} {
			cmd := exec.Command("go", "build", "-o", dir, pkg)
			cmd.Dir = ".."
			if out, err := cmd.CombinedOutput(); err != nil {
				return "", &buildError{what: "go build " + pkg, err: err, out: out}
			}
		}
		return filepath.Join(dir, "localstack"), nil
	})
}

// cliBinary is the runfleet CLI, built beside the local stack.
func cliBinary(tb testing.TB) string {
	return filepath.Join(filepath.Dir(localStackBinary(tb)), "runfleet")
}

// commandBinary is the main package pkg (relative to the repository),
// built once per test binary.
func commandBinary(tb testing.TB, pkg string) string {
	tb.Helper()
	return built.get(tb, pkg, func(dir string) (string, error) {
		bin := filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", &buildError{what: "go build " + pkg, err: err, out: out}
		}
		return bin, nil
	})
}

type buildError struct {
	what string
	err  error
	out  []byte
}

func (e *buildError) Error() string { return e.what + ": " + e.err.Error() + "\n" + string(e.out) }
