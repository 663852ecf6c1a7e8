package tests

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// helpEntry is one line of `make help`'s target list: "  name  summary".
var helpEntry = regexp.MustCompile(`^  (\S+) +(\S.*)$`)

// makeIn runs make in the repository as a user's shell would: without the
// MAKEFLAGS and MAKELEVEL of a make this test may run under (`make test`),
// which would turn on "Entering directory" lines and pass flags on.
func makeIn(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("make", args...)
	cmd.Dir = ".."
	for _, kv := range os.Environ() {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "MAKEFLAGS", "MFLAGS", "GNUMAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MAKEFILES":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

// makeTargets are the targets the Makefile defines, as make itself reads
// them (its database, -p, with nothing run, -q): every rule, however it is
// written, but none of make's built-in ones (-r, -R) nor the special .X ones.
func makeTargets(t *testing.T) []string {
	t.Helper()
	var stderr strings.Builder
	cmd := makeIn(t, "-pqrR")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	// -q exits 1 when the default goal (help) would run: expected.
	if ee := (*exec.ExitError)(nil); err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) || stderr.Len() > 0 {
		t.Fatalf("make -pqrR: %v\n%s", err, stderr.String())
	}
	rule := regexp.MustCompile(`^([A-Za-z0-9][^$#/\t=: ]*):([^=]|$)`)
	var targets []string
	notTarget := false
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		if m := rule.FindStringSubmatch(line); m != nil && !notTarget {
			targets = append(targets, m[1])
		}
		notTarget = line == "# Not a target:"
	}
	if len(targets) == 0 {
		t.Fatalf("no target found in make's database:\n%s", out)
	}
	return targets
}

// nameMatcher matches the targets a help entry covers: its name, or for a
// family (build-<LogicalId>) every target the <...> part stands for.
func nameMatcher(name string) *regexp.Regexp {
	quoted := regexp.QuoteMeta(name)
	return regexp.MustCompile("^" + regexp.MustCompile(`<[^>]+>`).ReplaceAllString(quoted, `[A-Za-z0-9]+`) + "$")
}

// TestMakeHelpListsEveryTarget runs `make help` as a user would: one line
// per target with what it does, every target the Makefile defines among
// them (a target added without its `## name: summary` line fails here), no
// entry for a target that is gone; and a bare `make` prints the same.
func TestMakeHelpListsEveryTarget(t *testing.T) {
	var stderr strings.Builder
	cmd := makeIn(t, "help")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Fatalf("make help: %v\n%s%s", err, out, stderr.String())
	}
	help := string(out)
	bare, err := makeIn(t).CombinedOutput()
	if err != nil || string(bare) != help {
		t.Errorf("make with no target (%v) printed\n%s\nwant what make help prints\n%s", err, bare, help)
	}

	// The list: the block after the usage line, up to the next blank line.
	blocks := strings.Split(help, "\n\n")
	if len(blocks) < 2 || !strings.HasPrefix(blocks[0], "usage: make ") {
		t.Fatalf("make help printed\n%s\nwant a usage line, then the list of targets", help)
	}
	entries := map[string]string{}
	var order []string
	for _, line := range strings.Split(blocks[1], "\n") {
		m := helpEntry.FindStringSubmatch(line)
		switch {
		case m == nil:
			t.Errorf("make help: %q is not a target and its one-line summary", line)
			continue
		case len(line) > 100:
			t.Errorf("make help: %s's line is %d columns, over 100:\n%s", m[1], len(line), line)
		case entries[m[1]] != "":
			t.Errorf("make help lists %s twice", m[1])
		}
		entries[m[1]] = m[2]
		order = append(order, m[1])
	}

	targets := makeTargets(t)
	covered := map[string]bool{}
	for _, name := range order {
		matcher, n := nameMatcher(name), 0
		for _, target := range targets {
			if matcher.MatchString(target) {
				covered[target] = true
				n++
			}
		}
		if n == 0 {
			t.Errorf("make help lists %s, which the Makefile does not define", name)
		}
	}
	for _, target := range targets {
		if !covered[target] {
			t.Errorf("make help does not list %s: give it a `## %s: <what it does>` line above its rule", target, target)
		}
	}
	// What the README's table and the brief name, so a lost parse above
	// cannot pass by finding nothing.
	for _, name := range []string{"help", "dev", "test", "deps", "build", "build-edge", "build-<LogicalId>", "bench", "lint", "fuzz", "clean"} {
		if entries[name] == "" {
			t.Errorf("make help lacks %s:\n%s", name, help)
		}
	}
	for _, fn := range []string{"ApiFunction", "StreamFunction", "SweepFunction", "ProbeFunction"} {
		if !covered["build-"+fn] {
			t.Errorf("build-%s is not in the Makefile's targets %v", fn, targets)
		}
	}
	t.Logf("make help lists %d entries for %d targets", len(order), len(targets))
}

// TestReadmeListsEveryMakeTarget holds the README's make-target table to
// `make help`: a row for every entry it lists (a row's first cell names its
// targets as `make <name>`), and no row for a target help does not list.
func TestReadmeListsEveryMakeTarget(t *testing.T) {
	out, err := makeIn(t, "help").Output()
	if err != nil {
		t.Fatalf("make help: %v", err)
	}
	blocks := strings.Split(string(out), "\n\n")
	if len(blocks) < 2 {
		t.Fatalf("make help printed\n%s", out)
	}
	help := map[string]bool{}
	for _, line := range strings.Split(blocks[1], "\n") {
		if m := helpEntry.FindStringSubmatch(line); m != nil {
			help[m[1]] = true
		}
	}

	readme, err := os.ReadFile("../README.md")
	must(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Make targets\n")
	if !ok {
		t.Fatal("README.md has no Make targets section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	named := regexp.MustCompile("^`make ([^`\\s]+)`")
	rows := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		first, ok := strings.CutPrefix(line, "| ")
		if !ok || strings.HasPrefix(first, "target ") || strings.HasPrefix(first, "---") {
			continue
		}
		first, _, _ = strings.Cut(first, " | ")
		m := named.FindStringSubmatch(first)
		if m == nil {
			t.Errorf("README.md's make-target row %q does not start with `make <target>`", line)
			continue
		}
		rows[m[1]] = true
	}
	for name := range help {
		if !rows[name] {
			t.Errorf("make help lists %s; README.md's Make targets table has no `make %s` row", name, name)
		}
	}
	for name := range rows {
		if !help[name] {
			t.Errorf("README.md's Make targets table has a row for %s, which make help does not list", name)
		}
	}
	if len(rows) < 10 {
		t.Fatalf("README.md's Make targets table: %d rows found", len(rows))
	}
}

// TestMakefileSummariesSitOnTheirRules checks the source of make help: each
// `##` line is one `## name: summary` (more goes in plain # comments), and
// the first rule after it is the target it names, so a summary cannot drift
// away from its target.
func TestMakefileSummariesSitOnTheirRules(t *testing.T) {
	src, err := os.ReadFile("../Makefile")
	must(t, err)
	summary := regexp.MustCompile(`^## (\S+): \S`)
	rule := regexp.MustCompile(`^([A-Za-z0-9][^$#/\t=: ]*):([^=]|$)`)
	lines := strings.Split(string(src), "\n")
	n := 0
	for i, line := range lines {
		if !strings.HasPrefix(line, "##") {
			continue
		}
		m := summary.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("Makefile:%d: %q is not a `## target: summary` line", i+1, line)
			continue
		}
		n++
		next := ""
		for _, l := range lines[i+1:] {
			if r := rule.FindStringSubmatch(l); r != nil {
				next = r[1]
				break
			}
		}
		if !nameMatcher(m[1]).MatchString(next) {
			t.Errorf("Makefile:%d: the summary of %s is followed by the rule of %q", i+1, m[1], next)
		}
	}
	if n == 0 {
		t.Fatal("the Makefile has no `## target: summary` line")
	}
}
