package tests

import (
	"bytes"
	"fmt"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// TestDocsCiteWhatExists holds the documents to the repository: what a
// comment or a Markdown file cites is there, and README.md and DESIGN.md
// link to each other. Each failure names the citing file and line.
//
// What is read: every Go file's comments (not its strings: a string is
// the program's, and tests such as edge's help test check those), every
// Markdown file, and the # comments of YAML, shell, Makefile, systemd and
// CI files. Only files git knows (tracked, or new and not ignored) count,
// on both sides: a citation of a file only this checkout has fails too.
//
// What counts as a citation:
//
//   - A Markdown file's name: a word ending in ".md" (a path or a bare
//     name; URLs are left out), and the bare word DESIGN, which the code
//     uses for DESIGN.md. It resolves against the citing file's folder,
//     then the repository's root.
//   - A section of one: `README.md, section "Deploy"` or `README.md,
//     "Deploy"`. The quoted text must be a heading of that file exactly,
//     as written after its #s.
//   - A part of one: a possessive followed by a word, as in "DESIGN.md's
//     host protocol that Fleet calls" or "DESIGN's scoping". Some heading
//     of the file, less a leading "The", must begin what follows
//     (compared without case, word by word): here "The host protocol" and
//     "Scoping". A possessive followed by anything else ("DESIGN.md's 2xx
//     -> accepted") quotes the document rather than naming a part of it:
//     only the file counts.
//   - In Markdown, a link's target that is not a URL: its path must be a
//     repository file or folder, and a #fragment must be the anchor of a
//     heading of the Markdown file it names (the same file when the path
//     is empty), as GitHub makes anchors.
func TestDocsCiteWhatExists(t *testing.T) {
	repo := readRepo(t)
	for _, c := range repo.citations() {
		if msg := repo.check(c); msg != "" {
			if knownMissing[c.file+" "+c.target] {
				repo.knownSeen[c.file+" "+c.target] = true
				continue
			}
			t.Errorf("%s:%d: %s", c.file, c.line, msg)
		}
	}
	for k := range knownMissing {
		if !repo.knownSeen[k] {
			t.Errorf("knownMissing holds %q, which no longer fails: remove it", k)
		}
	}
}

// TestReadmeAndDesignLinkToEachOther: the operator's manual and the
// engineer's design each send the reader to the other.
func TestReadmeAndDesignLinkToEachOther(t *testing.T) {
	repo := readRepo(t)
	for _, pair := range [][2]string{{"README.md", "DESIGN.md"}, {"DESIGN.md", "README.md"}} {
		from, to := pair[0], pair[1]
		text, ok := repo.text[from]
		if !ok {
			t.Errorf("%s: the repository has no such file", from)
			continue
		}
		linked := false
		for _, l := range markdownLinks(text) {
			if p, _, _ := strings.Cut(l.target, "#"); path.Clean(p) == to {
				linked = true
				break
			}
		}
		if !linked {
			t.Errorf("%s: no Markdown link to %s (want one such as [%s](%s))", from, to, to, to)
		}
	}
}

// knownMissing are citations known to fail, as "file target", each to be
// fixed where it is (a comment of a package another change owns) and
// then removed here; an entry that no longer fails is itself a failure.
var knownMissing = map[string]bool{}

// citation is one reference found in a file.
type citation struct {
	file string // repository path of the citing file
	line int
	// target is the cited file as written (a path, a bare name, "" for a
	// link to the same Markdown file).
	target string
	// section is X of `target, section "X"`: an exact heading.
	section string
	// part is X of `target's X`: a heading, less "The", begins it.
	part string
	// anchor is a Markdown link's #fragment.
	anchor string
	// link: a Markdown link, whose target may be any file or folder.
	link bool
}

type repoDocs struct {
	files     map[string]bool   // every file git knows, by repository path
	dirs      map[string]bool   // every folder holding one
	text      map[string]string // the files whose citations are read
	knownSeen map[string]bool
}

func readRepo(t *testing.T) *repoDocs {
	t.Helper()
	out, err := exec.Command("git", "-C", "..", "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	r := &repoDocs{files: map[string]bool{}, dirs: map[string]bool{".": true}, text: map[string]string{}, knownSeen: map[string]bool{}}
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Stat("../" + f); err != nil {
			continue // deleted in this checkout
		}
		r.files[f] = true
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			r.dirs[d] = true
		}
		if docKind(f) != "" {
			b, err := os.ReadFile("../" + f)
			if err != nil {
				t.Fatal(err)
			}
			r.text[f] = string(b)
		}
	}
	return r
}

// docKind says how a file's citations are read: "go" (its comments),
// "md" (all of it), "hash" (its # comments), or "" (not read).
func docKind(f string) string {
	base := path.Base(f)
	switch {
	case strings.HasSuffix(f, ".go"):
		return "go"
	case strings.HasSuffix(f, ".md"):
		return "md"
	case strings.HasSuffix(f, ".yaml"), strings.HasSuffix(f, ".yml"), strings.HasSuffix(f, ".sh"),
		strings.HasSuffix(f, ".service"), base == "Makefile", f == ".ci/run":
		return "hash"
	}
	return ""
}

// prose is text to search for citations, newlines kept where they were so
// offsets map to lines, and what it came from.
type prose struct {
	file  string
	text  string // the passage, lines joined by "\n"
	lines []int  // lines[i]: the file's line of the passage's i-th line
}

// lineAt is the file's line of offset off in the passage.
func (p prose) lineAt(off int) int { return p.lines[strings.Count(p.text[:off], "\n")] }

func (r *repoDocs) passages() []prose {
	var ps []prose
	names := make([]string, 0, len(r.text))
	for f := range r.text {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		text := r.text[f]
		switch docKind(f) {
		case "md":
			p := prose{file: f, text: text}
			for i := range strings.Count(text, "\n") + 1 {
				p.lines = append(p.lines, i+1)
			}
			ps = append(ps, p)
		case "hash":
			ps = append(ps, hashComments(f, text)...)
		case "go":
			ps = append(ps, goComments(f, text)...)
		}
	}
	return ps
}

// goComments are a Go file's comments, consecutive line comments joined
// into one passage (a citation may wrap).
func goComments(file, src string) []prose {
	fset := token.NewFileSet()
	tf := fset.AddFile(file, -1, len(src))
	var s scanner.Scanner
	s.Init(tf, []byte(src), nil, scanner.ScanComments)
	var ps []prose
	var cur *prose
	last := -1
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok != token.COMMENT {
			continue
		}
		line := fset.Position(pos).Line
		if strings.HasPrefix(lit, "/*") {
			body := strings.TrimSuffix(strings.TrimPrefix(lit, "/*"), "*/")
			p := prose{file: file, text: body}
			for i := range strings.Count(body, "\n") + 1 {
				p.lines = append(p.lines, line+i)
			}
			ps = append(ps, p)
			cur, last = nil, -1
			continue
		}
		body := strings.TrimPrefix(lit, "//")
		if cur != nil && line == last+1 {
			cur.text += "\n" + body
			cur.lines = append(cur.lines, line)
		} else {
			ps = append(ps, prose{file: file, text: body, lines: []int{line}})
			cur = &ps[len(ps)-1]
		}
		last = line
	}
	return ps
}

// hashComments are the # comments of a YAML, shell or Makefile-like file:
// what follows a # at a line's start or after a space.
func hashComments(file, text string) []prose {
	var ps []prose
	for i, line := range strings.Split(text, "\n") {
		if j := strings.Index(line, "#"); j == 0 || j > 0 && (line[j-1] == ' ' || line[j-1] == '\t') {
			ps = append(ps, prose{file: file, text: line[j+1:], lines: []int{i + 1}})
		}
	}
	return ps
}

var (
	urlPattern = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s)>\]]+`)
	// mdName is a Markdown file's name, as a path or alone.
	mdName = regexp.MustCompile(`(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.md\b`)
	// designWord is the bare DESIGN the code uses for DESIGN.md.
	designWord = regexp.MustCompile(`\bDESIGN\b(?:[^.A-Za-z0-9_]|\.[^m]|$)`)
	// after a cited name: `, section "X"`, `, "X"`, or `'s X`.
	sectionAfter = regexp.MustCompile(`^,\s+(?:section\s+)?"([^"]+)"`)
	partAfter    = regexp.MustCompile(`^['’]s\s+(\S[^.,;:()\n"]*)`)
)

func (r *repoDocs) citations() []citation {
	var cs []citation
	for _, p := range r.passages() {
		// URLs cite nothing here; blank them, keeping offsets.
		text := urlPattern.ReplaceAllStringFunc(p.text, func(u string) string { return strings.Repeat(" ", len(u)) })
		flat := strings.ReplaceAll(text, "\n", " ")
		add := func(target string, start, end int) {
			c := citation{file: p.file, line: p.lineAt(start), target: target}
			rest := flat[end:]
			if m := sectionAfter.FindStringSubmatch(rest); m != nil {
				c.section = strings.Join(strings.Fields(m[1]), " ")
			} else if m := partAfter.FindStringSubmatch(rest); m != nil {
				if first := []rune(m[1])[0]; unicode.IsLetter(first) {
					c.part = strings.Join(strings.Fields(m[1]), " ")
				}
			}
			cs = append(cs, c)
		}
		for _, m := range mdName.FindAllStringIndex(flat, -1) {
			if m[1] < len(flat) && (flat[m[1]] == '#' || isWordByte(flat[m[1]])) {
				continue // an anchor of a link, handled with the links
			}
			add(flat[m[0]:m[1]], m[0], m[1])
		}
		for _, m := range designWord.FindAllStringIndex(flat, -1) {
			add("DESIGN.md", m[0], m[0]+len("DESIGN"))
		}
		if docKind(p.file) == "md" {
			for _, l := range markdownLinks(text) {
				target, anchor, _ := strings.Cut(l.target, "#")
				cs = append(cs, citation{file: p.file, line: p.lineAt(l.offset), target: target, anchor: anchor, link: true})
			}
		}
	}
	return cs
}

func isWordByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// check returns why c does not resolve, or "".
func (r *repoDocs) check(c citation) string {
	target := c.target
	if c.link && target == "" {
		target = c.file
	} else {
		var ok bool
		if target, ok = r.resolve(c.file, c.target, c.link); !ok {
			return fmt.Sprintf("cites %s, which the repository does not have", c.target)
		}
	}
	needsHeadings := c.section != "" || c.part != "" || c.anchor != ""
	if !needsHeadings {
		return ""
	}
	text, ok := r.text[target]
	if !ok || !strings.HasSuffix(target, ".md") {
		return fmt.Sprintf("cites a section of %s, which is not a Markdown file", c.target)
	}
	heads := headings(text)
	switch {
	case c.section != "":
		for _, h := range heads {
			if h == c.section {
				return ""
			}
		}
		return fmt.Sprintf("cites %s, section %q: %s has no such heading (headings: %s)", c.target, c.section, target, quoteAll(heads))
	case c.part != "":
		want := strings.Fields(strings.ToLower(c.part))
		for _, h := range heads {
			words := strings.Fields(strings.ToLower(h))
			if len(words) > 1 && words[0] == "the" {
				words = words[1:]
			}
			if len(words) <= len(want) && slices.Equal(words, want[:len(words)]) {
				return ""
			}
		}
		return fmt.Sprintf("cites %s's %s: no heading of %s begins it (headings, less a leading \"The\": %s)", c.target, c.part, target, quoteAll(heads))
	}
	for _, a := range anchors(heads) {
		if a == c.anchor {
			return ""
		}
	}
	return fmt.Sprintf("links to %s#%s: %s has no heading with that anchor", c.target, c.anchor, target)
}

// resolve finds a cited file against the citing file's folder, then the
// root. A link may name a folder, and resolves against its file's folder
// only (as a Markdown viewer does).
func (r *repoDocs) resolve(from, target string, link bool) (string, bool) {
	candidates := []string{path.Join(path.Dir(from), target)}
	if !link {
		candidates = append(candidates, path.Clean(target))
	}
	for _, c := range candidates {
		if r.files[c] || link && r.dirs[strings.TrimSuffix(c, "/")] {
			return c, true
		}
	}
	return "", false
}

type mdLink struct {
	target string
	offset int
}

var linkPattern = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// markdownLinks are the inline links of a Markdown text whose target is
// not a URL, outside fenced code blocks.
func markdownLinks(text string) []mdLink {
	var links []mdLink
	off := 0
	fenced := false
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		} else if !fenced {
			for _, m := range linkPattern.FindAllStringSubmatchIndex(line, -1) {
				target := line[m[2]:m[3]]
				if strings.Contains(target, ":") && !strings.HasPrefix(target, "#") {
					continue // http:, mailto:
				}
				links = append(links, mdLink{target: target, offset: off + m[2]})
			}
		}
		off += len(line)
	}
	return links
}

// headings are a Markdown text's ATX headings, outside fenced code, as
// written after their #s.
func headings(text string) []string {
	var hs []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		if rest := strings.TrimLeft(line, "#"); len(rest) < len(line) && len(line)-len(rest) <= 6 && strings.HasPrefix(rest, " ") {
			hs = append(hs, strings.TrimSpace(rest))
		}
	}
	return hs
}

// anchors are the headings' anchors as GitHub makes them: lower case,
// every character but letters, digits, spaces, hyphens and underscores
// dropped, spaces made hyphens, a repeat numbered -1, -2...
func anchors(heads []string) []string {
	seen := map[string]int{}
	var out []string
	for _, h := range heads {
		var b bytes.Buffer
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

func quoteAll(hs []string) string {
	q := make([]string, len(hs))
	for i, h := range hs {
		q[i] = fmt.Sprintf("%q", h)
	}
	return strings.Join(q, ", ")
}
