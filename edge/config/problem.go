package config

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/runfleet/runfleet/shared/jsonstrict"
)

// Path is where a value sits in edge.json: its keys and array indexes,
// outermost first. Its String is jsonstrict.Path's form, the one every
// message about edge.json names a field in: runner.limits.memory,
// agents.claude.argv[0], proxy.upstream.resolve["api.example.test"].
type Path []string

// Key is the path of the member k of the object at p; several keys name
// members nested in turn.
func (p Path) Key(k ...string) Path { return append(p[:len(p):len(p)], k...) }

// Index is the path of element i of the array at p.
func (p Path) Index(i int) Path { return append(p[:len(p):len(p)], "["+strconv.Itoa(i)+"]") }

func (p Path) String() string { return jsonstrict.Path(p) }

// Problemf is a Problem at p.
func (p Path) Problemf(format string, args ...any) Problem {
	return Problem{Path: p.String(), Msg: fmt.Sprintf(format, args...)}
}

// Problem is one reason edge serve refuses a config, or one thing worth
// knowing about it. Path names the field at fault in Path's form, "" when
// the problem is the file's as a whole (it cannot be read, it is not
// JSON). Msg never quotes a secret value or a placeholder.
type Problem struct {
	Path string
	Msg  string
}

func (p Problem) Error() string {
	if p.Path == "" {
		return p.Msg
	}
	return p.Path + ": " + p.Msg
}

// Problems are every problem found, in the order found. As an error it is
// one problem per line; a function returning it as an error returns nil
// when there are none (Err).
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// Err is ps as an error: nil when ps is empty.
func (ps Problems) Err() error {
	if len(ps) == 0 {
		return nil
	}
	return ps
}

// add appends a problem at p.
func (ps *Problems) add(p Path, format string, args ...any) {
	*ps = append(*ps, p.Problemf(format, args...))
}
