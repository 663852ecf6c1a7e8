package policy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/config"
)

// KindSSH is the kind of a key that is an SSH private key: it never
// travels either. Edge terminates the task's SSH to the key's domains and
// runs there, with the real key, the git commands the key allows.
const KindSSH = "ssh"

// The commands an SSH key may allow: git's own over SSH, and git-lfs's
// token request. Nothing else ever runs upstream.
const (
	GitUploadPack      = "git-upload-pack"
	GitReceivePack     = "git-receive-pack"
	GitUploadArchive   = "git-upload-archive"
	GitLFSAuthenticate = "git-lfs-authenticate"
)

// GitCommands are the commands an SSH key's allow may list.
var GitCommands = []string{GitUploadPack, GitReceivePack, GitUploadArchive, GitLFSAuthenticate}

// DefaultSSHUser is the upstream login of GitHub, GitLab, Bitbucket and
// Gitea alike.
const DefaultSSHUser = "git"

// SSHPort is SSH's port, the one a known_hosts line names without
// brackets.
const SSHPort = 22

// Bounds of what a task sends as an exec request. A line holds at least
// twice the longest path, so what Line rebuilds (git's quoting turns a '
// or ! into four bytes) always parses back.
const (
	MaxGitCommandLine = 8192
	MaxRepositoryPath = 1024
)

// SSHKey is a compiled key of kind "ssh".
type SSHKey struct {
	User         string
	KnownHosts   []KnownHost
	Allow        []string
	Repositories []RepositoryPattern
}

// KnownHost is one known_hosts line: the host patterns it names and the
// key they present. A revoked key is refused wherever it is offered.
type KnownHost struct {
	Patterns []string
	Key      ssh.PublicKey
	Revoked  bool
}

// RepositoryPattern is one of an SSH key's repositories: segments matched
// as path.Match does, one per segment of the repository, except a final
// "**", which matches one or more segments.
type RepositoryPattern struct {
	Text     string
	segments []string
}

var sshUserPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

// compileSSH checks the parts of a key of kind ssh. Its domains must name
// their port: a name alone is 443, which an SSH key rarely means, and
// every domain needs a host key in knownHosts, so that the front never
// meets an upstream it must trust on first use.
func compileSSH(at config.Path, k *Key, kp config.KeyPolicy) config.Problems {
	var ps config.Problems
	k.Kind = KindSSH
	if len(kp.In) > 0 {
		ps = append(ps, at.Key("in").Problemf(`an ssh key is never put into a request (edge authenticates upstream with it); leave "in" out`))
	}
	if kp.Placeholder != (config.PlaceholderShape{}) {
		ps = append(ps, at.Key("placeholder").Problemf(`an ssh key has no placeholder (the task needs nothing to use it); leave "placeholder" out`))
	}
	if kp.AWS != nil {
		ps = append(ps, at.Key("aws").Problemf(`only a key of "kind": "aws" takes it`))
	}
	for i, raw := range kp.Domains {
		if !strings.Contains(raw, ":") || strings.HasSuffix(raw, "]") {
			ps = append(ps, at.Key("domains").Index(i).Problemf("%q: an ssh key's domain names its port (%s:22, or ssh.github.com:443): without one it means 443", raw, raw))
		}
	}
	if kp.SSH == nil {
		return append(ps, at.Key("ssh").Problemf(`a key of kind "ssh" needs "ssh": {"knownHosts": [...], "allow": [...]}`))
	}
	s := &SSHKey{User: kp.SSH.User}
	if s.User == "" {
		s.User = DefaultSSHUser
	}
	if !sshUserPattern.MatchString(s.User) {
		ps = append(ps, at.Key("ssh", "user").Problemf("%q: letters, digits, '_', '.' and '-', up to 64", s.User))
	}
	var err error
	if s.KnownHosts, err = ParseKnownHosts(strings.Join(kp.SSH.KnownHosts, "\n")); err != nil {
		ps = append(ps, at.Key("ssh", "knownHosts").Problemf("%v", err))
	}
	for _, d := range k.Domains {
		if err == nil && len(s.HostKeys(d)) == 0 {
			ps = append(ps, at.Key("ssh", "knownHosts").Problemf("lists no host key for %s (as %q): add the upstream's keys (ssh-keyscan, or its published list)", d, knownHostsName(d)))
		}
	}
	if len(kp.SSH.Allow) == 0 {
		ps = append(ps, at.Key("ssh", "allow").Problemf("at least one of %s is required", strings.Join(GitCommands, ", ")))
	}
	for i, c := range kp.SSH.Allow {
		if !slices.Contains(GitCommands, c) {
			ps = append(ps, at.Key("ssh", "allow").Index(i).Problemf("%q is not one of %s", c, strings.Join(GitCommands, ", ")))
			continue
		}
		if !slices.Contains(s.Allow, c) {
			s.Allow = append(s.Allow, c)
		}
	}
	for i, text := range kp.SSH.Repositories {
		p, err := CompileRepositoryPattern(text)
		if err != nil {
			ps = append(ps, at.Key("ssh", "repositories").Index(i).Problemf("%q: %v", text, err))
			continue
		}
		s.Repositories = append(s.Repositories, p)
	}
	k.SSH = s
	return ps
}

// ParseKnownHosts reads known_hosts text: plain, bracketed ("[name]:port")
// and hashed ("|1|salt|hash") host patterns, wildcards and negations, and
// @revoked lines. A @cert-authority line is refused: the front checks the
// host keys themselves. Blank lines and comments are skipped.
func ParseKnownHosts(text string) ([]KnownHost, error) {
	var out []KnownHost
	in := []byte(text)
	for line := 1; len(bytes.TrimSpace(in)) > 0; line++ {
		// ParseKnownHosts skips comments and blank lines itself; a line
		// number is counted per entry, which is what an operator needs.
		marker, hosts, key, _, rest, err := ssh.ParseKnownHosts(in)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("entry %d: %v", line, err)
		}
		in = rest
		switch marker {
		case "":
		case "revoked":
		default:
			return nil, fmt.Errorf("entry %d: @%s lines are not supported: list the host keys themselves", line, marker)
		}
		for _, h := range hosts {
			if p := strings.TrimPrefix(h, "!"); strings.HasPrefix(p, "|") {
				if _, _, err := hashedHost(p); err != nil {
					return nil, fmt.Errorf("entry %d: host %q: %v", line, h, err)
				}
			}
		}
		out = append(out, KnownHost{Patterns: hosts, Key: key, Revoked: marker == "revoked"})
	}
	if len(out) == 0 {
		return nil, errors.New("at least one host key is required")
	}
	return out, nil
}

// knownHostsName is how known_hosts names d: the name for port 22,
// "[name]:port" for another.
func knownHostsName(d Domain) string {
	if d.Port == SSHPort {
		return d.Name
	}
	return "[" + d.Name + "]:" + strconv.Itoa(d.Port)
}

// HostKeys are the keys known_hosts accepts for d, revoked ones left out.
func (s *SSHKey) HostKeys(d Domain) []ssh.PublicKey {
	name := knownHostsName(d)
	var out []ssh.PublicKey
	for _, kh := range s.KnownHosts {
		if !kh.Revoked && kh.matches(name) && !s.revoked(kh.Key) {
			out = append(out, kh.Key)
		}
	}
	return out
}

func (s *SSHKey) revoked(key ssh.PublicKey) bool {
	return slices.ContainsFunc(s.KnownHosts, func(kh KnownHost) bool {
		return kh.Revoked && bytes.Equal(kh.Key.Marshal(), key.Marshal())
	})
}

// CheckHostKey is the front's host key decision for an upstream: nil when
// key is one knownHosts lists for d and not revoked; otherwise an error
// naming the upstream and the key's fingerprint, never trusting on first
// use.
func (s *SSHKey) CheckHostKey(d Domain, key ssh.PublicKey) error {
	for _, k := range s.HostKeys(d) {
		if bytes.Equal(k.Marshal(), key.Marshal()) {
			return nil
		}
	}
	return fmt.Errorf("%s presented host key %s %s, which knownHosts does not list for it", d, key.Type(), ssh.FingerprintSHA256(key))
}

// HostKeyAlgorithms are the host key algorithms to ask d for: those of the
// keys listed for it, so the upstream presents one that can be checked.
func (s *SSHKey) HostKeyAlgorithms(d Domain) []string {
	var out []string
	for _, k := range s.HostKeys(d) {
		algos := []string{k.Type()}
		if k.Type() == ssh.KeyAlgoRSA {
			algos = []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
		}
		for _, a := range algos {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// matches applies the line's patterns as OpenSSH does: some pattern
// matches and no negated one does.
func (kh KnownHost) matches(name string) bool {
	matched := false
	for _, p := range kh.Patterns {
		negated := strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(p, "!")
		var ok bool
		if strings.HasPrefix(p, "|") {
			salt, sum, _ := hashedHost(p)
			mac := hmac.New(sha1.New, salt)
			mac.Write([]byte(name))
			ok = hmac.Equal(mac.Sum(nil), sum)
		} else {
			ok = wildcardMatch(strings.ToLower(p), name)
		}
		if ok && negated {
			return false
		}
		matched = matched || ok
	}
	return matched
}

// hashedHost reads "|1|salt|hash" (HashKnownHosts' form).
func hashedHost(p string) (salt, sum []byte, err error) {
	parts := strings.Split(p, "|")
	if len(parts) != 4 || parts[0] != "" || parts[1] != "1" {
		return nil, nil, errors.New(`a hashed host is "|1|salt|hash"`)
	}
	if salt, err = base64.StdEncoding.DecodeString(parts[2]); err != nil {
		return nil, nil, errors.New("its salt is not base64")
	}
	if sum, err = base64.StdEncoding.DecodeString(parts[3]); err != nil || len(sum) != sha1.Size {
		return nil, nil, errors.New("its hash is not a base64 SHA-1")
	}
	return salt, sum, nil
}

// wildcardMatch is OpenSSH's match_pattern: '*' any run, '?' one
// character, nothing else special.
func wildcardMatch(pattern, s string) bool {
	for len(pattern) > 0 {
		switch pattern[0] {
		case '*':
			for i := len(s); i >= 0; i-- {
				if wildcardMatch(pattern[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if len(s) == 0 {
				return false
			}
		default:
			if len(s) == 0 || s[0] != pattern[0] {
				return false
			}
		}
		pattern, s = pattern[1:], s[1:]
	}
	return len(s) == 0
}

// CompileRepositoryPattern checks a repositories entry: normalised as a
// repository is (a leading "/", a trailing ".git"), each segment a valid
// path.Match pattern, "**" only as the last segment.
func CompileRepositoryPattern(text string) (RepositoryPattern, error) {
	norm, err := normalizeRepositoryPath(text)
	if err != nil {
		return RepositoryPattern{}, err
	}
	segs := strings.Split(norm, "/")
	for i, s := range segs {
		if s == "**" {
			if i != len(segs)-1 || i == 0 {
				return RepositoryPattern{}, errors.New(`"**" may only end a pattern, after at least one segment ("group/**")`)
			}
			continue
		}
		if _, err := path.Match(s, ""); err != nil {
			return RepositoryPattern{}, fmt.Errorf("segment %q is not a valid pattern", s)
		}
	}
	return RepositoryPattern{Text: text, segments: segs}, nil
}

// Match reports whether the normalised repository matches.
func (p RepositoryPattern) Match(repository string) bool {
	segs := strings.Split(repository, "/")
	pat := p.segments
	if pat[len(pat)-1] == "**" {
		pat = pat[:len(pat)-1]
		if len(segs) <= len(pat) {
			return false
		}
		segs = segs[:len(pat)]
	} else if len(segs) != len(pat) {
		return false
	}
	for i := range pat {
		if ok, _ := path.Match(pat[i], segs[i]); !ok {
			return false
		}
	}
	return true
}

// GitCommand is an exec request read as the git command it must be.
type GitCommand struct {
	// Name is the command, in its dashed form ("git upload-pack" is
	// GitUploadPack).
	Name string
	// Path is the repository argument as the task gave it, unquoted.
	Path string
	// Repository is Path normalised as git servers read it: no leading
	// "/", no trailing "/" or ".git"; what repositories patterns match.
	Repository string
	// Operation is git-lfs-authenticate's: "download" or "upload".
	Operation string
}

// Line is the command line sent upstream: rebuilt from what was decided,
// never the task's bytes, with the repository single-quoted as git quotes
// it, so no upstream shell reads more than one argument.
func (c GitCommand) Line() string {
	repo := c.Repository
	if strings.HasPrefix(c.Path, "/") && !strings.HasPrefix(repo, "~") {
		repo = "/" + repo
	}
	if strings.HasSuffix(strings.TrimSuffix(c.Path, "/"), ".git") {
		repo += ".git"
	}
	line := c.Name + " " + shellQuote(repo)
	if c.Operation != "" {
		line += " " + c.Operation
	}
	return line
}

// shellQuote is git's sq_quote: single quotes, with ' and ! escaped
// outside them.
func shellQuote(s string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '\'' || c == '!' {
			b.WriteString(`'\` + string(c) + `'`)
			continue
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('\'')
	return b.String()
}

// ParseGitCommand reads an exec request's command line as git sends it
// ("git-upload-pack 'org/repo.git'"; git-shell's "git upload-pack" too;
// git-lfs-authenticate with its operation). Words are split on blanks and
// may be single-quoted, with git's '\” and '\!' escapes; any other
// shell syntax, a command that is not one of GitCommands or arguments
// other than its own is an error saying what was wrong. The error quotes
// nothing of the line past the command's name.
func ParseGitCommand(line string) (GitCommand, error) {
	if len(line) > MaxGitCommandLine {
		return GitCommand{}, fmt.Errorf("the command line is %d bytes; at most %d", len(line), MaxGitCommandLine)
	}
	words, err := splitWords(line)
	if err != nil {
		return GitCommand{}, err
	}
	if len(words) == 0 {
		return GitCommand{}, errors.New("the command line is empty")
	}
	name := words[0]
	args := words[1:]
	if name == "git" && len(args) > 0 && slices.Contains(GitCommands, "git-"+args[0]) && args[0] != "lfs-authenticate" {
		name, args = "git-"+args[0], args[1:]
	}
	if !slices.Contains(GitCommands, name) {
		return GitCommand{}, &NotGitError{Name: name}
	}
	c := GitCommand{Name: name}
	want := 1
	if name == GitLFSAuthenticate {
		want = 2
	}
	if len(args) != want {
		return GitCommand{}, fmt.Errorf("%s takes %d argument(s) here, got %d", name, want, len(args))
	}
	c.Path = args[0]
	if c.Repository, err = normalizeRepositoryPath(c.Path); err != nil {
		return GitCommand{}, fmt.Errorf("%s: the repository %v", name, err)
	}
	if name == GitLFSAuthenticate {
		c.Operation = args[1]
		if c.Operation != "download" && c.Operation != "upload" {
			return GitCommand{}, fmt.Errorf("%s: the operation must be download or upload", name)
		}
	}
	return c, nil
}

// NotGitError is a command line whose command is not a git one.
type NotGitError struct{ Name string }

func (e *NotGitError) Error() string {
	return fmt.Sprintf("%q is not a git command (%s)", e.Name, strings.Join(GitCommands, ", "))
}

// unquotedWordChars are the characters git and git-lfs leave unquoted,
// and that no shell reads as syntax.
const unquotedWordChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/~@:+,=%-"

func splitWords(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(line); {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
			i++
		case c == '\'':
			end := strings.IndexByte(line[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("the command line has an unclosed quote")
			}
			w.WriteString(line[i+1 : i+1+end])
			inWord = true
			i += end + 2
		case c == '\\' && i+1 < len(line) && (line[i+1] == '\'' || line[i+1] == '!'):
			w.WriteByte(line[i+1])
			inWord = true
			i += 2
		case strings.IndexByte(unquotedWordChars, c) >= 0:
			w.WriteByte(c)
			inWord = true
			i++
		default:
			return nil, fmt.Errorf("the command line holds %q outside quotes, which no git command sends", c)
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// normalizeRepositoryPath reads a repository argument as git servers do:
// leading "/" dropped (GitHub, GitLab and Gitea read "/org/repo" as
// "org/repo"), one trailing "/" and then ".git" dropped, "~user" kept as
// its first segment. Empty, "." and ".." segments, a segment starting
// with "-" (an upstream git would read it as an option), control
// characters and paths past MaxRepositoryPath are errors.
func normalizeRepositoryPath(p string) (string, error) {
	if len(p) > MaxRepositoryPath {
		return "", fmt.Errorf("path is %d bytes; at most %d", len(p), MaxRepositoryPath)
	}
	if !utf8.ValidString(p) {
		return "", errors.New("path is not UTF-8")
	}
	for _, r := range p {
		// C0 and C1 controls, and format characters (bidi overrides):
		// the repository is written in reasons and the audit.
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return "", errors.New("path holds a control or format character")
		}
	}
	s := strings.TrimLeft(p, "/")
	s = strings.TrimSuffix(s, "/")
	s = strings.TrimSuffix(s, ".git")
	if s == "" {
		return "", errors.New("path names no repository")
	}
	for i, seg := range strings.Split(s, "/") {
		switch {
		case seg == "":
			return "", errors.New("path has an empty segment")
		case seg == "." || seg == "..":
			return "", errors.New(`path has a "." or ".." segment`)
		case strings.HasPrefix(seg, "-"):
			return "", errors.New(`path has a segment starting with "-"`)
		case strings.HasPrefix(seg, "~") && i > 0:
			return "", errors.New(`path has "~" past its first segment`)
		}
	}
	return s, nil
}

// SSHExecInput is what the decision about one exec request looks at: the
// task's keys now, where its connection goes, and the command line.
type SSHExecInput struct {
	Authority Authority
	Granted   []Granted
	Line      string
}

// SSHExecDecision allows a command with one key, or refuses it with a
// reason for the task and the audit ("git-receive-pack is not allowed for
// key GIT_SSH on github.com"). Command is set when the line parsed.
type SSHExecDecision struct {
	Allow   bool
	Reason  string
	Ref     KeyRef
	Key     *Granted
	Command GitCommand
}

// DecideSSHExec decides an exec request on a connection to an ssh key's
// domain: the line must be a git command; then the first of the task's
// ssh keys reaching the authority (in the order of their names) that
// allows the command and whose repositories match the repository runs it.
// Two keys on one host (a deploy key per repository) are both usable
// that way. An lfs upload needs git-receive-pack too: it is a push.
func DecideSSHExec(in SSHExecInput) SSHExecDecision {
	keys := SSHKeysReaching(in.Authority, in.Granted)
	if len(keys) == 0 {
		return SSHExecDecision{Reason: fmt.Sprintf("no ssh key of this task reaches %s any longer", in.Authority)}
	}
	c, err := ParseGitCommand(in.Line)
	if err != nil {
		return SSHExecDecision{Reason: fmt.Sprintf("only git commands run over SSH here: %v", err)}
	}
	on := sshHostLabel(in.Authority)
	var reasons []string
	for _, g := range keys {
		need := []string{c.Name}
		if c.Name == GitLFSAuthenticate && c.Operation == "upload" {
			need = append(need, GitReceivePack)
		}
		if i := slices.IndexFunc(need, func(n string) bool { return !slices.Contains(g.SSH.Allow, n) }); i >= 0 {
			reasons = append(reasons, fmt.Sprintf("%s is not allowed for key %s on %s", need[i], g.Ref.Key, on))
			continue
		}
		if len(g.SSH.Repositories) > 0 && !slices.ContainsFunc(g.SSH.Repositories, func(p RepositoryPattern) bool { return p.Match(c.Repository) }) {
			reasons = append(reasons, fmt.Sprintf("repository %s is not one key %s may reach on %s", c.Repository, g.Ref.Key, on))
			continue
		}
		return SSHExecDecision{Allow: true, Reason: "allowed", Ref: g.Ref, Key: g, Command: c}
	}
	return SSHExecDecision{Reason: strings.Join(reasons, "; "), Ref: keys[0].Ref, Command: c}
}

// SSHKeysReaching are the task's ssh keys whose domains hold a, sorted by
// name.
func SSHKeysReaching(a Authority, granted []Granted) []*Granted {
	d, ok := a.Domain()
	if !ok {
		return nil
	}
	var out []*Granted
	for i := range granted {
		if granted[i].SSH != nil && granted[i].Reaches(d) {
			out = append(out, &granted[i])
		}
	}
	slices.SortFunc(out, func(x, y *Granted) int { return strings.Compare(x.Ref.String(), y.Ref.String()) })
	return out
}

// sshHostLabel is how a reason names an SSH upstream: its name, with the
// port when it is not 22.
func sshHostLabel(a Authority) string {
	if a.Port == SSHPort {
		return a.Name
	}
	return a.String()
}
