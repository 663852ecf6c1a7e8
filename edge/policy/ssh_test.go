package policy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/runspec"
)

// edHostKey is an ed25519 host key, the same for the same seed.
func edHostKey(t testing.TB, seed byte) ssh.PublicKey {
	t.Helper()
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
	k, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var (
	testECDSAKey = sync.OnceValues(func() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) })
	testRSAKey   = sync.OnceValues(func() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 2048) })
)

func ecdsaHostKey(t testing.TB) ssh.PublicKey {
	t.Helper()
	priv, err := testECDSAKey()
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func rsaHostKey(t testing.TB) ssh.PublicKey {
	t.Helper()
	priv, err := testRSAKey()
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// keyText is a key as known_hosts writes it after the hosts: "type base64".
func keyText(k ssh.PublicKey) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

// sshKey is a valid key of kind ssh, changed by edit: GitHub's SSH on
// port 22 and on ssh.github.com:443, one known_hosts line written by
// knownhosts.Line, the other by hand as ssh-keyscan prints it.
func sshKey(t testing.TB, edit func(k *config.KeyPolicy, s *config.SSHKey)) config.KeyPolicy {
	hk := edHostKey(t, 1)
	s := &config.SSHKey{
		KnownHosts: []string{
			knownhosts.Line([]string{"github.com:22"}, hk),
			"[ssh.github.com]:443 " + keyText(hk),
		},
		Allow: []string{GitUploadPack},
	}
	k := config.KeyPolicy{Kind: KindSSH, Domains: []string{"github.com:22", "ssh.github.com:443"}, SSH: s}
	if edit != nil {
		edit(&k, s)
	}
	return k
}

// What an operator writes in edge.json compiles to the bounds the SSH
// front enforces: the user defaults to git, allow is kept in order without
// repeats, the repositories are compiled, and each domain has host keys.
// An ssh key is never substituted: no location, no shape.
func TestCompileSSHKeyFromEdgeJSON(t *testing.T) {
	hk := edHostKey(t, 1)
	c, err := config.Parse([]byte(`{"dataDir": "/d", "api": {"tokenFile": "/t"},
	 "policy": {"projects": {"acme": {"keys": {
	  "GIT_SSH": {"kind": "ssh", "domains": ["GitHub.com.:22", "ssh.github.com:443"],
	    "ssh": {"knownHosts": [` + fmt.Sprintf("%q, %q", "github.com "+keyText(hk), "# from ssh-keyscan\n[ssh.github.com]:443 "+keyText(hk)+"\n") + `],
	      "allow": ["git-upload-pack", "git-lfs-authenticate", "git-upload-pack"],
	      "repositories": ["/acme/*.git", "acme-infra/**"]}},
	  "GL_SSH": {"kind": "ssh", "domains": ["gitlab.example.com:2222"],
	    "ssh": {"user": "gitlab-shell", "knownHosts": [` + fmt.Sprintf("%q", "[gitlab.example.com]:2222 "+keyText(hk)) + `],
	      "allow": ["git-receive-pack"]}}}}}}}`))
	if err != nil {
		t.Fatalf("edge.json with ssh keys does not parse: %v", err)
	}
	p, err := Compile(c.Policy)
	if err != nil {
		t.Fatal(err)
	}
	k, ok := p.Key(KeyRef{"acme", "GIT_SSH"})
	if !ok {
		t.Fatal("key missing")
	}
	if k.Kind != KindSSH || k.SSH == nil || k.AWS != nil {
		t.Fatalf("kind %q ssh %v aws %v", k.Kind, k.SSH, k.AWS)
	}
	if k.In != 0 || k.Placeholder != (Shape{}) {
		t.Errorf("an ssh key is never substituted: in %v, shape %+v", k.In, k.Placeholder)
	}
	if want := []Domain{{Name: "github.com", Port: 22}, {Name: "ssh.github.com", Port: 443}}; !slices.Equal(k.Domains, want) {
		t.Errorf("domains %v, want %v", k.Domains, want)
	}
	if k.SSH.User != DefaultSSHUser {
		t.Errorf("user %q, want the default %q", k.SSH.User, DefaultSSHUser)
	}
	if want := []string{GitUploadPack, GitLFSAuthenticate}; !slices.Equal(k.SSH.Allow, want) {
		t.Errorf("allow %v, want %v", k.SSH.Allow, want)
	}
	var texts []string
	for _, r := range k.SSH.Repositories {
		texts = append(texts, r.Text)
	}
	if want := []string{"/acme/*.git", "acme-infra/**"}; !slices.Equal(texts, want) {
		t.Errorf("repositories %v, want %v as written", texts, want)
	}
	for _, d := range k.Domains {
		if keys := k.SSH.HostKeys(d); len(keys) != 1 || !bytes.Equal(keys[0].Marshal(), hk.Marshal()) {
			t.Errorf("host keys for %v: %v", d, keys)
		}
	}
	if !p.AllowsName("github.com") || !p.AllowsName("ssh.github.com") {
		t.Error("AllowsName is false for an ssh key's names")
	}
	gl, _ := p.Key(KeyRef{"acme", "GL_SSH"})
	if gl == nil || gl.SSH == nil || gl.SSH.User != "gitlab-shell" || !slices.Equal(gl.Domains, []Domain{{Name: "gitlab.example.com", Port: 2222}}) {
		t.Fatalf("GL_SSH: %+v", gl)
	}
	if len(gl.SSH.Repositories) != 0 {
		t.Errorf("no repositories written, got %v", gl.SSH.Repositories)
	}
}

// Each form that could never be enforced is refused at load, the error
// naming the project, the key and the offending value.
func TestCompileSSHRefusesWithAClearMessage(t *testing.T) {
	hk := edHostKey(t, 1)
	other := edHostKey(t, 2)
	allowList := "git-upload-pack, git-receive-pack, git-upload-archive, git-lfs-authenticate"
	for name, tc := range map[string]struct {
		kp   config.KeyPolicy
		want []string
	}{
		"domain without a port": {sshKey(t, func(k *config.KeyPolicy, s *config.SSHKey) {
			k.Domains = []string{"github.com"}
			s.KnownHosts = []string{"github.com " + keyText(hk)}
		}), []string{`domains[0]: "github.com": an ssh key's domain names its port (github.com:22, or ssh.github.com:443): without one it means 443`,
			`ssh.knownHosts: lists no host key for github.com (as "[github.com]:443")`}},
		"no ssh block": {sshKey(t, func(k *config.KeyPolicy, _ *config.SSHKey) { k.SSH = nil }),
			[]string{`ssh: a key of kind "ssh" needs "ssh": {"knownHosts": [...], "allow": [...]}`}},
		"in on an ssh key": {sshKey(t, func(k *config.KeyPolicy, _ *config.SSHKey) { k.In = []string{"header"} }),
			[]string{`in: an ssh key is never put into a request (edge authenticates upstream with it); leave "in" out`}},
		"placeholder on an ssh key": {sshKey(t, func(k *config.KeyPolicy, _ *config.SSHKey) { k.Placeholder = config.PlaceholderShape{Prefix: "ssh-"} }),
			[]string{`placeholder: an ssh key has no placeholder`}},
		"placeholder length on an ssh key": {sshKey(t, func(k *config.KeyPolicy, _ *config.SSHKey) { k.Placeholder.Length = 64 }),
			[]string{`placeholder: an ssh key has no placeholder`}},
		"aws on an ssh key": {sshKey(t, func(k *config.KeyPolicy, _ *config.SSHKey) {
			k.AWS = &config.AWSKey{Regions: []string{"us-east-1"}, Services: []string{"s3"}}
		}), []string{`aws: only a key of "kind": "aws" takes it`}},
		"user with an @": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.User = "git@github.com" }),
			[]string{`ssh.user: "git@github.com": letters, digits, '_', '.' and '-', up to 64`}},
		"user like an option": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.User = "-oProxyCommand=x" }),
			[]string{`ssh.user: "-oProxyCommand=x"`}},
		"user of 65": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.User = strings.Repeat("g", 65) }),
			[]string{`ssh.user: "` + strings.Repeat("g", 65) + `": letters, digits`}},
		"no allow": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Allow = nil }),
			[]string{`ssh.allow: at least one of ` + allowList + ` is required`}},
		"empty allow": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Allow = []string{} }),
			[]string{`ssh.allow: at least one of`}},
		"allow sh": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Allow = []string{GitUploadPack, "sh"} }),
			[]string{`ssh.allow[1]: "sh" is not one of ` + allowList}},
		"allow git's other spelling": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Allow = []string{"git upload-pack"} }),
			[]string{`ssh.allow[0]: "git upload-pack" is not one of`}},
		"no knownHosts": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.KnownHosts = nil }),
			[]string{`ssh.knownHosts: at least one host key is required`}},
		"knownHosts of comments": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.KnownHosts = []string{"# github.com", "", "  "} }),
			[]string{`ssh.knownHosts: at least one host key is required`}},
		"knownHosts unparseable": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) {
			s.KnownHosts = []string{"# keyscan", "github.com " + keyText(hk), "ssh.github.com ssh-ed25519 AAAA%%%not-base64"}
		}), []string{`ssh.knownHosts: entry 2: `}},
		"knownHosts without a key": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.KnownHosts = []string{"github.com ssh-ed25519"} }),
			[]string{`ssh.knownHosts: entry 1: `}},
		"knownHosts of a wrapped line": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) {
			s.KnownHosts = []string{"github.com", keyText(hk), s.KnownHosts[1]}
		}), []string{`ssh.knownHosts: entry 1: `}},
		"cert-authority": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) {
			s.KnownHosts = append(s.KnownHosts, "@cert-authority *.github.com "+keyText(other))
		}), []string{`ssh.knownHosts: entry 3: @cert-authority lines are not supported: list the host keys themselves`}},
		"no line for one domain": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.KnownHosts = s.KnownHosts[:1] }),
			[]string{`ssh.knownHosts: lists no host key for ssh.github.com (as "[ssh.github.com]:443")`}},
		"a line for another port only": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) {
			s.KnownHosts = []string{"github.com " + keyText(hk), "ssh.github.com " + keyText(hk)}
		}), []string{`ssh.knownHosts: lists no host key for ssh.github.com (as "[ssh.github.com]:443")`}},
		"every key revoked": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) {
			s.KnownHosts = append(s.KnownHosts, "@revoked * "+keyText(hk))
		}), []string{`ssh.knownHosts: lists no host key for github.com:22 (as "github.com")`, `no host key for ssh.github.com`}},
		"hashed host, bad salt": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) {
			s.KnownHosts = append(s.KnownHosts, "|1|not*base64|"+strings.Repeat("A", 27)+"= "+keyText(hk))
		}), []string{`ssh.knownHosts: entry 3: host "|1|not*base64|` + strings.Repeat("A", 27) + `=": its salt is not base64`}},
		"hashed host, short hash": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) {
			s.KnownHosts = append(s.KnownHosts, "|1|c2FsdA==|c2hvcnQ= "+keyText(hk))
		}), []string{`entry 3: host "|1|c2FsdA==|c2hvcnQ=": its hash is not a base64 SHA-1`}},
		"hashed host, other version": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) {
			s.KnownHosts = append(s.KnownHosts, "|2|c2FsdA==|c2FsdA== "+keyText(hk))
		}), []string{`entry 3: host "|2|c2FsdA==|c2FsdA==": a hashed host is "|1|salt|hash"`}},
		"repository with ..": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Repositories = []string{"a/../b"} }),
			[]string{`ssh.repositories[0]: "a/../b": path has a "." or ".." segment`}},
		"repository **": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Repositories = []string{"**"} }),
			[]string{`ssh.repositories[0]: "**": "**" may only end a pattern, after at least one segment ("group/**")`}},
		"repository **/x": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Repositories = []string{"**/x"} }),
			[]string{`ssh.repositories[0]: "**/x": "**" may only end a pattern`}},
		"repository a/**/b": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Repositories = []string{"a/**/b"} }),
			[]string{`ssh.repositories[0]: "a/**/b": "**" may only end a pattern`}},
		"repository a//b": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Repositories = []string{"a//b"} }),
			[]string{`ssh.repositories[0]: "a//b": path has an empty segment`}},
		"repository -x": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Repositories = []string{"org/repo", "-x"} }),
			[]string{`ssh.repositories[1]: "-x": path has a segment starting with "-"`}},
		"repository empty": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Repositories = []string{""} }),
			[]string{`ssh.repositories[0]: "": path names no repository`}},
		"repository bad class": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Repositories = []string{"org/[a-"} }),
			[]string{`ssh.repositories[0]: "org/[a-": segment "[a-" is not a valid pattern`}},
		"repository ~ inside": {sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Repositories = []string{"org/~x"} }),
			[]string{`ssh.repositories[0]: "org/~x": path has "~" past its first segment`}},
		"ssh block on a plain key": {config.KeyPolicy{Domains: []string{"api.github.com"}, SSH: &config.SSHKey{Allow: []string{GitUploadPack}}},
			[]string{`ssh: only a key of "kind": "ssh" takes it`}},
		"ssh block on an aws key": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.SSH = &config.SSHKey{Allow: []string{GitUploadPack}} }),
			[]string{`ssh: only a key of "kind": "ssh" takes it`}},
		"kind in capitals": {sshKey(t, func(k *config.KeyPolicy, _ *config.SSHKey) { k.Kind = "SSH" }),
			[]string{`kind: "SSH" is not a kind`}},
		"wildcard domain": {sshKey(t, func(k *config.KeyPolicy, _ *config.SSHKey) { k.Domains = []string{"*.github.com:22"} }),
			[]string{`domains[0]: "*.github.com:22": a wildcard`}},
	} {
		p, err := Compile(one("acme", "GIT_SSH", tc.kp))
		if err == nil || p != nil {
			t.Errorf("%s: compiled (%v), want a refusal", name, err)
			continue
		}
		for _, want := range append([]string{`policy.projects.acme.keys.GIT_SSH.`}, tc.want...) {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q\nwant it to contain %q", name, err, want)
			}
		}
		// A host key is public, but an error names where the problem is,
		// never the key's bytes.
		if blob := strings.Fields(keyText(hk))[1]; strings.Contains(err.Error(), blob) {
			t.Errorf("%s: error %q holds a host key", name, err)
		}
	}
}

// An operator fixing edge.json sees every problem at once: within one ssh
// key, across keys and across projects.
func TestCompileSSHReportsEveryProblemAtOnce(t *testing.T) {
	_, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{
		"acme": {Keys: map[string]config.KeyPolicy{
			"GIT_SSH": sshKey(t, func(k *config.KeyPolicy, s *config.SSHKey) {
				k.Domains = append(k.Domains, "gitlab.com")
				k.In = []string{"url"}
				s.User = "git user"
				s.Allow = []string{GitUploadPack, "scp"}
				s.Repositories = []string{"org/*", "a//b", "**"}
			}),
			"GOOD": sshKey(t, nil),
		}},
		"beta": {Keys: map[string]config.KeyPolicy{
			"DEPLOY": sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) {
				s.KnownHosts = []string{"@cert-authority * " + keyText(edHostKey(t, 3))}
			}),
			"PLAIN": key([]string{"api.github.com"}, []string{"cookie"}, "", 0),
		}},
	}})
	if err == nil {
		t.Fatal("compiled")
	}
	for _, want := range []string{
		`policy.projects.acme.keys.GIT_SSH.domains[2]: "gitlab.com": an ssh key's domain names its port`,
		`policy.projects.acme.keys.GIT_SSH.ssh.knownHosts: lists no host key for gitlab.com (as "[gitlab.com]:443")`,
		`policy.projects.acme.keys.GIT_SSH.in: an ssh key is never put into a request`,
		`policy.projects.acme.keys.GIT_SSH.ssh.user: "git user"`,
		`policy.projects.acme.keys.GIT_SSH.ssh.allow[1]: "scp" is not one of`,
		`policy.projects.acme.keys.GIT_SSH.ssh.repositories[1]: "a//b": path has an empty segment`,
		`policy.projects.acme.keys.GIT_SSH.ssh.repositories[2]: "**": "**" may only end a pattern`,
		`policy.projects.beta.keys.DEPLOY.ssh.knownHosts: entry 1: @cert-authority lines are not supported`,
		`policy.projects.beta.keys.PLAIN.in[0]: "cookie" is not one of`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q\nwant it to contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), `keys.GOOD`) || strings.Contains(err.Error(), `"org/*"`) {
		t.Errorf("a valid key or pattern is reported: %v", err)
	}
}

// A domain is SSH for every key naming it or for none: a connection there
// is either terminated as SSH or intercepted as TLS, never one or the
// other by which keys a task holds. The refusal names both keys, with
// their projects, and the domain; the same name on another port is fine.
func TestCompileRefusesADomainSharedBySSHAndPlainKeys(t *testing.T) {
	for name, tc := range map[string]struct {
		other config.KeyPolicy
		want  string // "" compiles
	}{
		"plain key on the ssh port": {key([]string{"github.com:22"}, nil, "", 0),
			`policy.projects.beta.keys.TOKEN.domains: "github.com:22": ssh key acme/GIT_SSH names it too; a domain is SSH for every key or for none`},
		"plain key on 443 of an ssh domain": {key([]string{"api.github.com", "ssh.github.com"}, nil, "", 0),
			`policy.projects.beta.keys.TOKEN.domains: "ssh.github.com": ssh key acme/GIT_SSH names it too`},
		"aws key on an ssh domain": {awsKey(func(k *config.KeyPolicy, _ *config.AWSKey) { k.Domains = []string{"github.com:22"} }),
			`policy.projects.beta.keys.TOKEN.domains: "github.com:22": ssh key acme/GIT_SSH names it too`},
		"plain key on another port of the name": {key([]string{"github.com", "github.com:8443"}, nil, "", 0), ""},
		"another ssh key on the same domain":    {sshKey(t, func(k *config.KeyPolicy, _ *config.SSHKey) { k.Domains = []string{"github.com:22"} }), ""},
	} {
		p, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{
			"acme": {Keys: map[string]config.KeyPolicy{"GIT_SSH": sshKey(t, nil)}},
			"beta": {Keys: map[string]config.KeyPolicy{"TOKEN": tc.other}},
		}})
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if err == nil || p != nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", name, err, tc.want)
		}
	}
}

// Known hosts are read as OpenSSH reads them: plain, "[name]:port",
// hashed names for both, wildcards, negations and @revoked lines; a key
// listed for a name is trusted on the port the line names, never another.
func TestSSHKnownHosts(t *testing.T) {
	a, b, c := edHostKey(t, 1), edHostKey(t, 2), ecdsaHostKey(t)
	line := func(hosts string, k ssh.PublicKey) string { return hosts + " " + keyText(k) }
	d := func(name string, port int) Domain { return Domain{Name: name, Port: port} }
	for name, tc := range map[string]struct {
		lines   []string
		trusted map[Domain][]ssh.PublicKey // every domain not listed: none
		asked   []Domain                   // domains checked besides trusted's
	}{
		"plain": {[]string{line("github.com", a)},
			map[Domain][]ssh.PublicKey{d("github.com", 22): {a}},
			[]Domain{d("github.com", 443), d("github.com", 2222), d("gist.github.com", 22), d("github.co", 22)}},
		"written by knownhosts.Line": {[]string{knownhosts.Line([]string{"github.com:22", "ssh.github.com:443"}, a)},
			map[Domain][]ssh.PublicKey{d("github.com", 22): {a}, d("ssh.github.com", 443): {a}},
			[]Domain{d("github.com", 443), d("ssh.github.com", 22)}},
		"bracketed port": {[]string{line("[ssh.github.com]:443", a)},
			map[Domain][]ssh.PublicKey{d("ssh.github.com", 443): {a}},
			[]Domain{d("ssh.github.com", 22), d("ssh.github.com", 4430), d("github.com", 443)}},
		"bracketed port 22 is not the name": {[]string{line("[git.example.com]:22", a)},
			nil, []Domain{d("git.example.com", 22)}},
		"hashed, port 22": {[]string{line(knownhosts.HashHostname("git.example.com"), a)},
			map[Domain][]ssh.PublicKey{d("git.example.com", 22): {a}},
			[]Domain{d("git.example.com", 2222), d("example.com", 22), d("git.example.co", 22)}},
		"hashed, other port": {[]string{line(knownhosts.HashHostname(knownhosts.Normalize("git.example.com:2222")), a)},
			map[Domain][]ssh.PublicKey{d("git.example.com", 2222): {a}},
			[]Domain{d("git.example.com", 22), d("git.example.com", 443)}},
		"hashed and plain on one line": {[]string{line(knownhosts.HashHostname("a.example.com")+",b.example.com", a)},
			map[Domain][]ssh.PublicKey{d("a.example.com", 22): {a}, d("b.example.com", 22): {a}},
			[]Domain{d("c.example.com", 22)}},
		"wildcard": {[]string{line("*.example.com", a)},
			map[Domain][]ssh.PublicKey{d("git.example.com", 22): {a}, d("a.b.example.com", 22): {a}},
			[]Domain{d("example.com", 22), d("git.example.com", 2222), d("git.example.com.evil", 22), d("gitexample.com", 22)}},
		"wildcard for a port": {[]string{line("[*.example.com]:2222", a)},
			map[Domain][]ssh.PublicKey{d("git.example.com", 2222): {a}},
			[]Domain{d("git.example.com", 22), d("git.example.com", 22220)}},
		"question mark": {[]string{line("git?.example.com", a)},
			map[Domain][]ssh.PublicKey{d("git1.example.com", 22): {a}},
			[]Domain{d("git.example.com", 22), d("git12.example.com", 22)}},
		"negation": {[]string{line("*.example.com,!bad.example.com", a)},
			map[Domain][]ssh.PublicKey{d("good.example.com", 22): {a}},
			[]Domain{d("bad.example.com", 22)}},
		"negation first": {[]string{line("!bad.example.com,*.example.com", a)},
			map[Domain][]ssh.PublicKey{d("good.example.com", 22): {a}},
			[]Domain{d("bad.example.com", 22)}},
		"negated hashed host": {[]string{line("*.example.com,!"+knownhosts.HashHostname("bad.example.com"), a)},
			map[Domain][]ssh.PublicKey{d("good.example.com", 22): {a}},
			[]Domain{d("bad.example.com", 22)}},
		"negation alone trusts nothing": {[]string{line("!bad.example.com", a)},
			nil, []Domain{d("good.example.com", 22), d("bad.example.com", 22)}},
		"a pattern in capitals": {[]string{line("GitHub.COM", a)},
			map[Domain][]ssh.PublicKey{d("github.com", 22): {a}}, nil},
		"several keys": {[]string{"# github.com's keys", "", line("github.com", a), line("github.com", c), line("gitlab.com", b)},
			map[Domain][]ssh.PublicKey{d("github.com", 22): {a, c}, d("gitlab.com", 22): {b}}, nil},
		"revoked elsewhere": {[]string{line("github.com", a), line("github.com", b), "@revoked old.example.com " + keyText(a)},
			map[Domain][]ssh.PublicKey{d("github.com", 22): {b}},
			[]Domain{d("old.example.com", 22)}},
		"revoked first": {[]string{"@revoked * " + keyText(a), line("github.com", a)},
			nil, []Domain{d("github.com", 22)}},
	} {
		hosts, err := ParseKnownHosts(strings.Join(tc.lines, "\n"))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		s := &SSHKey{KnownHosts: hosts}
		asked := tc.asked
		for dom := range tc.trusted {
			asked = append(asked, dom)
		}
		for _, dom := range asked {
			want := tc.trusted[dom]
			got := s.HostKeys(dom)
			if len(got) != len(want) {
				t.Errorf("%s: host keys for %v: %d, want %d", name, dom, len(got), len(want))
				continue
			}
			for i := range want {
				if !bytes.Equal(got[i].Marshal(), want[i].Marshal()) {
					t.Errorf("%s: host key %d for %v is another", name, i, dom)
				}
			}
			for _, k := range []ssh.PublicKey{a, b, c} {
				err := s.CheckHostKey(dom, k)
				listed := slices.ContainsFunc(want, func(w ssh.PublicKey) bool { return bytes.Equal(w.Marshal(), k.Marshal()) })
				if listed != (err == nil) {
					t.Errorf("%s: CheckHostKey(%v, %s) = %v, listed %v", name, dom, ssh.FingerprintSHA256(k), err, listed)
				}
			}
		}
	}
}

// The front refuses an upstream whose key is not listed, saying which key
// it presented by its fingerprint, as ssh(1) does, never the key itself.
func TestSSHCheckHostKeyNamesTheFingerprint(t *testing.T) {
	listed, presented := edHostKey(t, 1), edHostKey(t, 2)
	hosts, err := ParseKnownHosts("github.com " + keyText(listed) + "\n[ssh.github.com]:443 " + keyText(listed))
	if err != nil {
		t.Fatal(err)
	}
	s := &SSHKey{KnownHosts: hosts}
	for _, tc := range []struct {
		d    Domain
		key  ssh.PublicKey
		want string
	}{
		{Domain{Name: "github.com", Port: 22}, presented,
			"github.com:22 presented host key ssh-ed25519 " + ssh.FingerprintSHA256(presented) + ", which knownHosts does not list for it"},
		{Domain{Name: "github.com", Port: 2222}, listed,
			"github.com:2222 presented host key ssh-ed25519 " + ssh.FingerprintSHA256(listed) + ", which knownHosts does not list for it"},
		{Domain{Name: "ssh.github.com", Port: 22}, listed,
			"ssh.github.com:22 presented host key ssh-ed25519 " + ssh.FingerprintSHA256(listed)},
		{Domain{Name: "ssh.github.com", Port: 443}, rsaHostKey(t),
			"ssh.github.com presented host key ssh-rsa " + ssh.FingerprintSHA256(rsaHostKey(t))},
	} {
		err := s.CheckHostKey(tc.d, tc.key)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.d, err, tc.want)
			continue
		}
		if blob := strings.Fields(keyText(tc.key))[1]; strings.Contains(err.Error(), blob) {
			t.Errorf("%v: error %q holds the key", tc.d, err)
		}
	}
	if err := s.CheckHostKey(Domain{Name: "github.com", Port: 22}, listed); err != nil {
		t.Errorf("the listed key is refused: %v", err)
	}
}

// The front asks each upstream for the algorithms of the keys listed for
// it, so the key presented is one it can check; an RSA key is asked for
// with SHA-2 signatures first, as servers refuse ssh-rsa's SHA-1.
func TestSSHHostKeyAlgorithms(t *testing.T) {
	ed, ec, rs := edHostKey(t, 1), ecdsaHostKey(t), rsaHostKey(t)
	hosts, err := ParseKnownHosts(strings.Join([]string{
		"rsa.example.com " + keyText(rs),
		"mixed.example.com " + keyText(ed),
		"mixed.example.com " + keyText(rs),
		"mixed.example.com " + keyText(ec),
		"*.example.com " + keyText(ed),
	}, "\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := &SSHKey{KnownHosts: hosts}
	for _, tc := range []struct {
		d    Domain
		want []string
	}{
		{Domain{Name: "rsa.example.com", Port: 22}, []string{"rsa-sha2-512", "rsa-sha2-256", "ssh-rsa", "ssh-ed25519"}},
		{Domain{Name: "mixed.example.com", Port: 22}, []string{ssh.KeyAlgoED25519, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA, ssh.KeyAlgoECDSA256}},
		{Domain{Name: "other.example.com", Port: 22}, []string{ssh.KeyAlgoED25519}},
		{Domain{Name: "other.example.org", Port: 22}, nil},
	} {
		if got := s.HostKeyAlgorithms(tc.d); !slices.Equal(got, tc.want) {
			t.Errorf("%v: %v, want %v", tc.d, got, tc.want)
		}
	}
}

// ParseKnownHosts counts entries, skipping comments and blank lines, so an
// operator finds the line at fault.
func TestParseKnownHostsErrors(t *testing.T) {
	k := keyText(edHostKey(t, 1))
	for _, tc := range []struct {
		text, want string
	}{
		{"", "at least one host key is required"},
		{"# nothing\n\n", "at least one host key is required"},
		{"# a\n\ngithub.com " + k + "\n# b\n@cert-authority * " + k, "entry 2: @cert-authority lines are not supported: list the host keys themselves"},
		{"@revoked * " + k + "\n@cert-authority * " + k, "entry 2: @cert-authority"},
		{"github.com " + k + "\ngitlab.com ssh-ed25519", "entry 2: "},
		{"|1|YQ==|YQ== " + k, `entry 1: host "|1|YQ==|YQ==": its hash is not a base64 SHA-1`},
		{"a.example.com,|1|!!|" + strings.Repeat("A", 27) + "= " + k, `entry 1: host "|1|!!|` + strings.Repeat("A", 27) + `=": its salt is not base64`},
	} {
		hosts, err := ParseKnownHosts(tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) || hosts != nil {
			t.Errorf("%q: %v, %v; want an error containing %q", tc.text, hosts, err, tc.want)
		}
	}
}

// A negated hashed host ("!|1|salt|hash") that is not one is refused at
// load like any bad hashed host: accepted, it would silently exclude
// nothing, and the key would be trusted for the very host the operator
// meant to exclude.
func TestParseKnownHostsRefusesABadNegatedHashedHost(t *testing.T) {
	k := keyText(edHostKey(t, 1))
	_, err := ParseKnownHosts("*.example.com,!|1|not*base64|c2FsdA== " + k)
	if err == nil {
		t.Fatal(`a malformed negated hashed host ("!|1|…") was accepted`)
	}
}

// gitCase is a command line a task sends and what it is read as.
type gitCase struct {
	line                       string
	name, path, repository, op string
	lineOut                    string
}

// The forms git, git-shell's clients and git-lfs send.
var acceptedGitCommands = []gitCase{
	{"git-upload-pack 'org/repo.git'", GitUploadPack, "org/repo.git", "org/repo", "", "git-upload-pack 'org/repo.git'"},
	{"git-receive-pack '/org/repo.git'", GitReceivePack, "/org/repo.git", "org/repo", "", "git-receive-pack '/org/repo.git'"},
	{"git upload-pack 'org/repo'", GitUploadPack, "org/repo", "org/repo", "", "git-upload-pack 'org/repo'"},
	{"git receive-pack '/org/repo'", GitReceivePack, "/org/repo", "org/repo", "", "git-receive-pack '/org/repo'"},
	{"git upload-archive 'org/repo.git'", GitUploadArchive, "org/repo.git", "org/repo", "", "git-upload-archive 'org/repo.git'"},
	{"git-upload-archive 'org/repo.git'", GitUploadArchive, "org/repo.git", "org/repo", "", "git-upload-archive 'org/repo.git'"},
	{"git-lfs-authenticate org/repo.git download", GitLFSAuthenticate, "org/repo.git", "org/repo", "download", "git-lfs-authenticate 'org/repo.git' download"},
	{"git-lfs-authenticate 'org/repo.git' upload", GitLFSAuthenticate, "org/repo.git", "org/repo", "upload", "git-lfs-authenticate 'org/repo.git' upload"},
	{"git-lfs-authenticate '/org/repo' upload", GitLFSAuthenticate, "/org/repo", "org/repo", "upload", "git-lfs-authenticate '/org/repo' upload"},
	{"git-upload-pack org/repo", GitUploadPack, "org/repo", "org/repo", "", "git-upload-pack 'org/repo'"},
	{"git-upload-pack\t 'org/repo.git'  ", GitUploadPack, "org/repo.git", "org/repo", "", "git-upload-pack 'org/repo.git'"},
	{"'git-upload-pack' 'org/repo'", GitUploadPack, "org/repo", "org/repo", "", "git-upload-pack 'org/repo'"},
	{"git-upload-pack org/'repo'.git", GitUploadPack, "org/repo.git", "org/repo", "", "git-upload-pack 'org/repo.git'"},
	{"git-upload-pack 'org/repo.git/'", GitUploadPack, "org/repo.git/", "org/repo", "", "git-upload-pack 'org/repo.git'"},
	{"git-upload-pack 'org/repo/'", GitUploadPack, "org/repo/", "org/repo", "", "git-upload-pack 'org/repo'"},
	{"git-upload-pack 'group/sub/repo.git'", GitUploadPack, "group/sub/repo.git", "group/sub/repo", "", "git-upload-pack 'group/sub/repo.git'"},
	{"git-upload-pack 'org/repo.git.git'", GitUploadPack, "org/repo.git.git", "org/repo.git", "", "git-upload-pack 'org/repo.git.git'"},
	// git's sq_quote escapes: ' and ! outside the quotes.
	{`git-upload-pack 'org/it'\''s.git'`, GitUploadPack, "org/it's.git", "org/it's", "", `git-upload-pack 'org/it'\''s.git'`},
	{`git-upload-pack 'org/wow'\!'.git'`, GitUploadPack, "org/wow!.git", "org/wow!", "", `git-upload-pack 'org/wow'\!'.git'`},
	{`git-upload-pack org/\'\!`, GitUploadPack, "org/'!", "org/'!", "", `git-upload-pack 'org/'\'''\!''`},
	// A home directory, as git-shell and gitolite read it.
	{"git-upload-pack '~user/repo.git'", GitUploadPack, "~user/repo.git", "~user/repo", "", "git-upload-pack '~user/repo.git'"},
	{"git-upload-pack ~user/repo", GitUploadPack, "~user/repo", "~user/repo", "", "git-upload-pack '~user/repo'"},
	{"git-upload-pack '/~user/repo'", GitUploadPack, "/~user/repo", "~user/repo", "", "git-upload-pack '~user/repo'"},
	// Quoted, shell syntax is one argument's text; Line quotes it again.
	{"git-upload-pack 'a;rm'", GitUploadPack, "a;rm", "a;rm", "", "git-upload-pack 'a;rm'"},
	{"git-upload-pack 'org/$(x)`y`\"z\"'", GitUploadPack, "org/$(x)`y`\"z\"", "org/$(x)`y`\"z\"", "", "git-upload-pack 'org/$(x)`y`\"z\"'"},
	{"git-upload-pack 'org/my repo'", GitUploadPack, "org/my repo", "org/my repo", "", "git-upload-pack 'org/my repo'"},
	{"git-upload-pack 'org/dépôt'", GitUploadPack, "org/dépôt", "org/dépôt", "", "git-upload-pack 'org/dépôt'"},
	{"git-upload-pack 'org/x-y_z.1@2:3+4,5=6%7'", GitUploadPack, "org/x-y_z.1@2:3+4,5=6%7", "org/x-y_z.1@2:3+4,5=6%7", "", "git-upload-pack 'org/x-y_z.1@2:3+4,5=6%7'"},
}

func TestParseGitCommand(t *testing.T) {
	longest := strings.Repeat("r", MaxRepositoryPath)
	cases := append(slices.Clone(acceptedGitCommands),
		gitCase{"git-upload-pack '" + longest + "'", GitUploadPack, longest, longest, "", "git-upload-pack '" + longest + "'"})
	for _, tc := range cases {
		c, err := ParseGitCommand(tc.line)
		if err != nil {
			t.Errorf("%q: %v", tc.line, err)
			continue
		}
		if want := (GitCommand{Name: tc.name, Path: tc.path, Repository: tc.repository, Operation: tc.op}); c != want {
			t.Errorf("%q: %+v, want %+v", tc.line, c, want)
		}
		if got := c.Line(); got != tc.lineOut {
			t.Errorf("%q: Line() = %q, want %q", tc.line, got, tc.lineOut)
		}
		checkLine(t, c)
	}
}

// checkLine asserts what the front sends upstream: a shell reads exactly
// the command's words from it, and it parses back to the same command.
func checkLine(t testing.TB, c GitCommand) {
	t.Helper()
	line := c.Line()
	words, err := shellWords(line)
	if err != nil {
		t.Fatalf("%+v: Line() %q: %v", c, line, err)
	}
	want := 2
	if c.Operation != "" {
		want = 3
	}
	if len(words) != want || words[0] != c.Name || (want == 3 && words[2] != c.Operation) {
		t.Fatalf("%+v: a shell reads Line() %q as %q", c, line, words)
	}
	if repo, err := normalizeRepositoryPath(words[1]); err != nil || repo != c.Repository {
		t.Fatalf("%+v: a shell reads the repository of Line() %q as %q (%q, %v)", c, line, words[1], repo, err)
	}
	if strings.HasPrefix(words[1], "-") {
		t.Fatalf("%+v: Line() %q gives an argument starting with -", c, line)
	}
	again, err := ParseGitCommand(line)
	if err != nil {
		t.Fatalf("%+v: Line() %q does not parse: %v", c, line, err)
	}
	if again.Name != c.Name || again.Repository != c.Repository || again.Operation != c.Operation {
		t.Fatalf("%+v: Line() %q parses to %+v", c, line, again)
	}
	if again.Line() != line {
		t.Fatalf("%+v: Line() %q, then %q", c, line, again.Line())
	}
}

// shellWords splits a line as a POSIX shell would, for the few forms a
// safe command line may use: blanks between words, single quotes, a
// backslash before one character, and outside quotes only characters no
// shell reads as syntax or expands. Anything else is an error: a line
// that needs it is not one the front may send.
func shellWords(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	in := false
	for i := 0; i < len(line); i++ {
		switch ch := line[i]; {
		case ch == ' ':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		case ch == '\'':
			end := strings.IndexByte(line[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("unclosed quote")
			}
			w.WriteString(line[i+1 : i+1+end])
			in = true
			i += end + 1
		case ch == '\\':
			if i+1 == len(line) || line[i+1] == '\n' {
				return nil, errors.New("a backslash at the end of a line")
			}
			w.WriteByte(line[i+1])
			in = true
			i++
		case 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || strings.IndexByte("._/-", ch) >= 0:
			w.WriteByte(ch)
			in = true
		default:
			return nil, fmt.Errorf("%q outside quotes", ch)
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words, nil
}

// Anything but a git command, its own arguments and git's quoting is
// refused, saying what was wrong without quoting the line past the
// command's name (the words "SECRET" stands in for).
func TestParseGitCommandRefuses(t *testing.T) {
	allowList := "git-upload-pack, git-receive-pack, git-upload-archive, git-lfs-authenticate"
	for _, tc := range []struct {
		line, want string
		notGit     string // the NotGitError's Name, when it is one
	}{
		{"sh -c SECRET", `"sh" is not a git command (` + allowList + `)`, "sh"},
		{"git-upload-pack 'a' 'SECRET'", "git-upload-pack takes 1 argument(s) here, got 2", ""},
		{"git-upload-pack", "git-upload-pack takes 1 argument(s) here, got 0", ""},
		{"git upload-pack", "git-upload-pack takes 1 argument(s) here, got 0", ""},
		{"git-upload-pack a;rm SECRET", `the command line holds ';' outside quotes, which no git command sends`, ""},
		{"git-upload-pack a&&SECRET", `holds '&' outside quotes`, ""},
		{"git-upload-pack a|SECRET", `holds '|' outside quotes`, ""},
		{"git-upload-pack 'a' >SECRET", `holds '>' outside quotes`, ""},
		{"git-upload-pack $(SECRET)", `holds '$' outside quotes`, ""},
		{"git-upload-pack $SECRET", `holds '$' outside quotes`, ""},
		{"git-upload-pack `SECRET`", "holds '`' outside quotes", ""},
		{`git-upload-pack "SECRET"`, `holds '"' outside quotes`, ""},
		{"git-upload-pack 'org/repo'\nSECRET", `holds '\n' outside quotes`, ""},
		{"git-upload-pack 'org/repo'\rSECRET", `holds '\r' outside quotes`, ""},
		{"git-upload-pack org/*", `holds '*' outside quotes`, ""},
		{"git-upload-pack org/repo #SECRET", `holds '#' outside quotes`, ""},
		{`git-upload-pack org\SECRET`, `holds '\\' outside quotes`, ""},
		{`git-upload-pack org/repo\`, `holds '\\' outside quotes`, ""},
		{"git-upload-pack !SECRET", `holds '!' outside quotes`, ""},
		{"git-upload-pack 'SECRET", "the command line has an unclosed quote", ""},
		{"git-upload-pack '-uSECRET'", `git-upload-pack: the repository path has a segment starting with "-"`, ""},
		{"git-upload-pack --upload-pack=SECRET", `git-upload-pack: the repository path has a segment starting with "-"`, ""},
		{"git-upload-pack 'org/-SECRET'", `path has a segment starting with "-"`, ""},
		{"git-upload-pack '../SECRET'", `git-upload-pack: the repository path has a "." or ".." segment`, ""},
		{"git-upload-pack 'org/./SECRET'", `path has a "." or ".." segment`, ""},
		{"git-upload-pack 'org/..'", `path has a "." or ".." segment`, ""},
		{"git-upload-pack 'org//SECRET'", "git-upload-pack: the repository path has an empty segment", ""},
		{"git-upload-pack '/'", "git-upload-pack: the repository path names no repository", ""},
		{"git-upload-pack '.git'", "path names no repository", ""},
		{"git-upload-pack ''", "path names no repository", ""},
		{"git-upload-pack 'org/~SECRET'", `path has "~" past its first segment`, ""},
		{"git-upload-pack 'org/re\x00SECRET'", "git-upload-pack: the repository path holds a control or format character", ""},
		{"git-upload-pack 'org/re\x1bSECRET'", "path holds a control or format character", ""},
		{"git-upload-pack 'org/re\x7fSECRET'", "path holds a control or format character", ""},
		{"git-upload-pack 'org/re\tSECRET'", "path holds a control or format character", ""},
		{"git-upload-pack 'org/re\nSECRET'", "path holds a control or format character", ""},
		{"git-upload-pack org/re\x00SECRET", `holds '\x00' outside quotes`, ""},
		{"git-lfs-authenticate org/repo SECRET", "git-lfs-authenticate: the operation must be download or upload", ""},
		{"git-lfs-authenticate org/repo Upload", "the operation must be download or upload", ""},
		{"git-lfs-authenticate org/repo", "git-lfs-authenticate takes 2 argument(s) here, got 1", ""},
		{"git-lfs-authenticate org/repo download SECRET", "git-lfs-authenticate takes 2 argument(s) here, got 3", ""},
		{"git lfs-authenticate org/repo download", `"git" is not a git command`, "git"},
		{"git SECRET org/repo", `"git" is not a git command`, "git"},
		{"git git-upload-pack org/repo", `"git" is not a git command`, "git"},
		{"GIT-UPLOAD-PACK 'org/repo'", `"GIT-UPLOAD-PACK" is not a git command`, "GIT-UPLOAD-PACK"},
		{"/usr/bin/git-upload-pack 'org/repo'", `"/usr/bin/git-upload-pack" is not a git command`, "/usr/bin/git-upload-pack"},
		{"", "the command line is empty", ""},
		{" \t ", "the command line is empty", ""},
		{"git-upload-pack '" + strings.Repeat("S", MaxGitCommandLine) + "'",
			fmt.Sprintf("the command line is %d bytes; at most %d", MaxGitCommandLine+len("git-upload-pack ''"), MaxGitCommandLine), ""},
		{"git-upload-pack '" + strings.Repeat("S", MaxRepositoryPath+1) + "'",
			fmt.Sprintf("git-upload-pack: the repository path is %d bytes; at most %d", MaxRepositoryPath+1, MaxRepositoryPath), ""},
	} {
		c, err := ParseGitCommand(tc.line)
		if err == nil {
			t.Errorf("%q: accepted as %+v", tc.line, c)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.line, err, tc.want)
		}
		if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "SSSS") {
			t.Errorf("%q: error %q quotes the line past the command's name", tc.line, err)
		}
		var ng *NotGitError
		if errors.As(err, &ng) != (tc.notGit != "") || (ng != nil && ng.Name != tc.notGit) {
			t.Errorf("%q: %T %v, want a NotGitError naming %q: %v", tc.line, err, err, tc.notGit, ng)
		}
	}
}

// A control character is refused in a repository path wherever it comes
// from: C1 controls (U+0080 to U+009F; U+009B is a terminal's CSI) are
// control characters too, as is a lone byte 0x9B to a terminal that is
// not UTF-8, and the repository is written in reasons and the audit.
func TestParseGitCommandRefusesC1Controls(t *testing.T) {
	var accepted []string
	for _, c := range []string{"\u0080", "\u0085", "\u009b", "\u009f", "\x9b", "\u202e", "\u200b"} {
		line := "git-upload-pack 'org/re" + c + "po'"
		if c, err := ParseGitCommand(line); err == nil {
			accepted = append(accepted, fmt.Sprintf("%q as %q", line, c.Repository))
		}
	}
	if len(accepted) > 0 {
		t.Errorf("control characters accepted into Repository: %s", strings.Join(accepted, ", "))
	}
}

// What Line() sends must parse back to the same command: it quotes ' and
// ! as git does, four bytes for one, so a path within MaxRepositoryPath
// can give a line over MaxGitCommandLine, which ParseGitCommand refuses.
func TestGitCommandLineRoundTripsAtTheBounds(t *testing.T) {
	for _, ch := range []string{`'`, `!`} {
		path := strings.Repeat(ch, MaxRepositoryPath)
		line := "git-upload-pack " + strings.Repeat(`\`+ch, MaxRepositoryPath)
		c, err := ParseGitCommand(line)
		if err != nil {
			t.Fatalf("a path of %d %s: %v", MaxRepositoryPath, ch, err)
		}
		if c.Path != path {
			t.Fatalf("path %q", c.Path)
		}
		if _, err := ParseGitCommand(c.Line()); err != nil {
			t.Fatalf("Line() of a %d-byte path of %s is %d bytes and does not parse back: %v",
				MaxRepositoryPath, ch, len(c.Line()), err)
		}
		checkLine(t, c)
	}
}

// Repository patterns match segment by segment, case-sensitively (a
// repository written otherwise is refused, never let through); "*" is one
// segment, a final "**" one or more; a pattern is normalised as a
// repository is, so "org/repo.git" and "/org/repo" are "org/repo".
func TestRepositoryPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		match   []string
		miss    []string
	}{
		{"org/repo", []string{"org/repo"}, []string{"org/repo2", "org/rep", "org/repo/x", "Org/repo", "org/Repo", "ORG/REPO", "org", "other/repo", "x/org/repo", "org/repo.git"}},
		{"org/repo.git", []string{"org/repo"}, []string{"org/repo.git", "org/repo.git.git"}},
		{"/org/repo/", []string{"org/repo"}, []string{"org/repo2"}},
		{"org/*", []string{"org/repo", "org/x", "org/.hidden", "org/*"}, []string{"org", "org/repo/x", "other/repo", "Org/repo"}},
		{"org/repo-*", []string{"org/repo-a", "org/repo-"}, []string{"org/repo", "org/repo-a/b"}},
		{"org/?", []string{"org/a"}, []string{"org/ab"}},
		{"org/[ab]", []string{"org/a", "org/b"}, []string{"org/c"}},
		{"*/repo", []string{"org/repo", "x/repo"}, []string{"repo", "a/b/repo"}},
		{"group/**", []string{"group/a", "group/a/b", "group/a/b/c"}, []string{"group", "groupx/a", "other/a", "Group/a"}},
		{"group/sub/**", []string{"group/sub/a", "group/sub/a/b"}, []string{"group/sub", "group/a", "group/subx/a"}},
		{"group/*/**", []string{"group/a/b", "group/a/b/c"}, []string{"group/a", "group"}},
		{"~user/*", []string{"~user/repo", "~user/x"}, []string{"~user", "~user/a/b", "~other/repo", "user/repo"}},
		{"~user/repo", []string{"~user/repo"}, []string{"user/repo", "~user/repo2"}},
		{`org/re\*po`, []string{"org/re*po"}, []string{"org/rexpo"}},
	} {
		p, err := CompileRepositoryPattern(tc.pattern)
		if err != nil {
			t.Errorf("%q: %v", tc.pattern, err)
			continue
		}
		if p.Text != tc.pattern {
			t.Errorf("%q: Text %q, want the pattern as written", tc.pattern, p.Text)
		}
		for _, r := range tc.match {
			if !p.Match(r) {
				t.Errorf("%q does not match %q", tc.pattern, r)
			}
		}
		for _, r := range tc.miss {
			if p.Match(r) {
				t.Errorf("%q matches %q", tc.pattern, r)
			}
		}
	}
}

// sshPolicy is a host policy with ssh keys as an operator writes them:
// GIT_SSH fetches anything on GitHub, on port 22 or 443, and runs lfs; two
// deploy keys on one GitLab, one per repository, may push; ORG fetches an
// organisation's repositories; TOKEN is a plain key.
func sshPolicy(t *testing.T, drop ...string) *Policy {
	t.Helper()
	hk := edHostKey(t, 1)
	deploy := func(repo string, allow ...string) config.KeyPolicy {
		return config.KeyPolicy{Kind: KindSSH, Domains: []string{"gitlab.example.com:22"}, SSH: &config.SSHKey{
			KnownHosts: []string{"gitlab.example.com " + keyText(hk)}, Allow: allow, Repositories: []string{repo}}}
	}
	keys := map[string]config.KeyPolicy{
		"GIT_SSH":  sshKey(t, func(_ *config.KeyPolicy, s *config.SSHKey) { s.Allow = []string{GitUploadPack, GitLFSAuthenticate} }),
		"DEPLOY_A": deploy("org/a", GitUploadPack, GitReceivePack),
		"DEPLOY_B": deploy("org/b.git", GitUploadPack, GitReceivePack, GitLFSAuthenticate),
		"ORG": {Kind: KindSSH, Domains: []string{"code.example.com:2222"}, SSH: &config.SSHKey{
			KnownHosts: []string{"[code.example.com]:2222 " + keyText(hk)}, Allow: []string{GitUploadPack, GitUploadArchive},
			Repositories: []string{"org/*", "group/**"}}},
		"TOKEN": key([]string{"api.github.com"}, nil, "", 0),
	}
	for _, k := range drop {
		delete(keys, k)
	}
	p, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{"acme": {Keys: keys}}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var sshDeclared = []runspec.Declared{
	{ProjectID: "acme", Key: "GIT_SSH", Domains: []Domain{{Name: "github.com", Port: 22}, {Name: "ssh.github.com", Port: 443}}},
	{ProjectID: "acme", Key: "DEPLOY_B", Domains: []Domain{{Name: "gitlab.example.com", Port: 22}}},
	{ProjectID: "acme", Key: "DEPLOY_A", Domains: []Domain{{Name: "gitlab.example.com", Port: 22}}},
	{ProjectID: "acme", Key: "ORG", Domains: []Domain{{Name: "code.example.com", Port: 2222}}},
	{ProjectID: "acme", Key: "TOKEN", Domains: []Domain{{Name: "api.github.com", Port: 443}}},
}

// Each command a task runs over SSH is decided on its own: the first of
// the task's ssh keys reaching the host (by name) that allows the command
// on the repository runs it, and a refusal says which command, key and
// host, as the task and the audit see it.
func TestDecideSSHExec(t *testing.T) {
	p := sshPolicy(t)
	granted, refused := p.Grant(sshDeclared)
	if len(granted) != 5 || len(refused) != 0 {
		t.Fatalf("granted %v refused %v", granted, refused)
	}
	notGit := `only git commands run over SSH here: "sh" is not a git command (git-upload-pack, git-receive-pack, git-upload-archive, git-lfs-authenticate)`
	for _, tc := range []struct {
		at, line string
		key      string // the decision's Ref.Key
		repo     string // the decision's Command.Repository
		why      string // "" for allowed; else the exact reason
	}{
		{"github.com:22", "git-upload-pack 'org/repo.git'", "GIT_SSH", "org/repo", ""},
		{"github.com:22", "git upload-pack '/org/repo'", "GIT_SSH", "org/repo", ""},
		{"ssh.github.com:443", "git-upload-pack 'org/repo.git'", "GIT_SSH", "org/repo", ""},
		{"github.com:22", "git-receive-pack 'org/repo.git'", "GIT_SSH", "org/repo", "git-receive-pack is not allowed for key GIT_SSH on github.com"},
		{"ssh.github.com:443", "git-receive-pack 'org/repo.git'", "GIT_SSH", "org/repo", "git-receive-pack is not allowed for key GIT_SSH on ssh.github.com:443"},
		{"github.com:22", "git-upload-archive 'org/repo.git'", "GIT_SSH", "org/repo", "git-upload-archive is not allowed for key GIT_SSH on github.com"},
		{"github.com:22", "git-lfs-authenticate org/repo.git download", "GIT_SSH", "org/repo", ""},
		// An lfs upload is a push.
		{"github.com:22", "git-lfs-authenticate org/repo.git upload", "GIT_SSH", "org/repo", "git-receive-pack is not allowed for key GIT_SSH on github.com"},
		// Two deploy keys on one host: each repository's command finds
		// its own key, whatever order the task declared them in.
		{"gitlab.example.com:22", "git-upload-pack 'org/a.git'", "DEPLOY_A", "org/a", ""},
		{"gitlab.example.com:22", "git-receive-pack 'org/a.git'", "DEPLOY_A", "org/a", ""},
		{"gitlab.example.com:22", "git-receive-pack '/org/b.git'", "DEPLOY_B", "org/b", ""},
		{"gitlab.example.com:22", "git-lfs-authenticate 'org/b.git' upload", "DEPLOY_B", "org/b", ""},
		{"gitlab.example.com:22", "git-lfs-authenticate 'org/a.git' download", "DEPLOY_A", "org/a",
			"git-lfs-authenticate is not allowed for key DEPLOY_A on gitlab.example.com; repository org/a is not one key DEPLOY_B may reach on gitlab.example.com"},
		{"gitlab.example.com:22", "git-upload-pack 'org/c.git'", "DEPLOY_A", "org/c",
			"repository org/c is not one key DEPLOY_A may reach on gitlab.example.com; repository org/c is not one key DEPLOY_B may reach on gitlab.example.com"},
		{"gitlab.example.com:22", "git-upload-pack 'Org/a.git'", "DEPLOY_A", "Org/a",
			"repository Org/a is not one key DEPLOY_A may reach on gitlab.example.com; repository Org/a is not one key DEPLOY_B may reach on gitlab.example.com"},
		// Patterns, on another port.
		{"code.example.com:2222", "git-upload-pack 'org/anything.git'", "ORG", "org/anything", ""},
		{"code.example.com:2222", "git-upload-archive 'group/sub/deep'", "ORG", "group/sub/deep", ""},
		{"code.example.com:2222", "git-upload-pack 'other/repo'", "ORG", "other/repo", "repository other/repo is not one key ORG may reach on code.example.com:2222"},
		{"code.example.com:2222", "git-upload-pack 'org/a/b'", "ORG", "org/a/b", "repository org/a/b is not one key ORG may reach on code.example.com:2222"},
		{"code.example.com:2222", "git-receive-pack 'org/a'", "ORG", "org/a", "git-receive-pack is not allowed for key ORG on code.example.com:2222"},
		// Not git.
		{"github.com:22", "sh -c id", "", "", notGit},
		{"gitlab.example.com:22", "sh", "", "", notGit},
		{"github.com:22", "git-upload-pack 'a';id", "", "", `only git commands run over SSH here: the command line holds ';' outside quotes, which no git command sends`},
		{"github.com:22", "git-upload-pack '-uevil'", "", "", `only git commands run over SSH here: git-upload-pack: the repository path has a segment starting with "-"`},
		// No ssh key there: a plain key's domain, another port, an IP.
		{"api.github.com:443", "git-upload-pack 'org/repo'", "", "", "no ssh key of this task reaches api.github.com:443 any longer"},
		{"github.com:443", "git-upload-pack 'org/repo'", "", "", "no ssh key of this task reaches github.com:443 any longer"},
		{"140.82.112.3:22", "git-upload-pack 'org/repo'", "", "", "no ssh key of this task reaches 140.82.112.3:22 any longer"},
	} {
		d := DecideSSHExec(SSHExecInput{Authority: authority(t, tc.at), Granted: granted, Line: tc.line})
		name := tc.line + " on " + tc.at
		if tc.why == "" {
			if !d.Allow || d.Reason != "allowed" {
				t.Errorf("%s: %+v, want allowed", name, d)
				continue
			}
			if d.Key == nil || d.Key.Ref != d.Ref || d.Key.SSH == nil {
				t.Errorf("%s: allowed with key %+v, ref %v", name, d.Key, d.Ref)
			}
		} else if d.Allow || d.Reason != tc.why || d.Key != nil {
			t.Errorf("%s: %v %q (key %v)\nwant refused: %q", name, d.Allow, d.Reason, d.Key, tc.why)
		}
		if tc.key != "" && d.Ref != (KeyRef{"acme", tc.key}) || tc.key == "" && d.Ref != (KeyRef{}) {
			t.Errorf("%s: ref %v, want key %q", name, d.Ref, tc.key)
		}
		if d.Command.Repository != tc.repo {
			t.Errorf("%s: command %+v, want repository %q", name, d.Command, tc.repo)
		}
	}
}

// A key the task no longer holds runs nothing: after a reload that drops
// it (or drops its domain), the task's next command is refused, even on a
// connection the front accepted before.
func TestDecideSSHExecAfterAReload(t *testing.T) {
	at := authority(t, "github.com:22")
	line := "git-upload-pack 'org/repo.git'"
	before, _ := sshPolicy(t).Grant(sshDeclared)
	if d := DecideSSHExec(SSHExecInput{Authority: at, Granted: before, Line: line}); !d.Allow {
		t.Fatalf("before the reload: %+v", d)
	}
	after, refused := sshPolicy(t, "GIT_SSH").Grant(sshDeclared)
	if len(refused) != 1 || refused[0].Ref.Key != "GIT_SSH" {
		t.Fatalf("refused %v", refused)
	}
	d := DecideSSHExec(SSHExecInput{Authority: at, Granted: after, Line: line})
	if d.Allow || d.Reason != "no ssh key of this task reaches github.com:22 any longer" || d.Key != nil {
		t.Errorf("after the reload: %+v", d)
	}
	if d := DecideSSHExec(SSHExecInput{Authority: at, Line: line}); d.Allow {
		t.Errorf("no keys at all: %+v", d)
	}
}

// The keys reaching a host are the task's ssh keys whose granted domains
// hold it, by name: a plain key never is one, nor a domain the task did
// not declare.
func TestSSHKeysReaching(t *testing.T) {
	granted, _ := sshPolicy(t).Grant([]runspec.Declared{
		sshDeclared[0],
		{ProjectID: "acme", Key: "DEPLOY_B", Domains: []Domain{{Name: "gitlab.example.com", Port: 22}}},
		{ProjectID: "acme", Key: "DEPLOY_A", Domains: []Domain{{Name: "gitlab.example.com", Port: 22}}},
		{ProjectID: "acme", Key: "TOKEN", Domains: []Domain{{Name: "api.github.com", Port: 443}}},
	})
	for _, tc := range []struct {
		at   string
		want []string
	}{
		{"gitlab.example.com:22", []string{"acme/DEPLOY_A", "acme/DEPLOY_B"}},
		{"github.com:22", []string{"acme/GIT_SSH"}},
		{"ssh.github.com:443", []string{"acme/GIT_SSH"}},
		{"api.github.com:443", nil},
		{"code.example.com:2222", nil},
		{"gitlab.example.com:2222", nil},
	} {
		var got []string
		for _, g := range SSHKeysReaching(authority(t, tc.at), granted) {
			got = append(got, g.Ref.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.at, got, tc.want)
		}
	}
	// Narrowed at grant: GIT_SSH declared for port 22 alone does not
	// reach port 443.
	narrow, _ := sshPolicy(t).Grant([]runspec.Declared{{ProjectID: "acme", Key: "GIT_SSH", Domains: []Domain{{Name: "github.com", Port: 22}}}})
	if got := SSHKeysReaching(authority(t, "ssh.github.com:443"), narrow); len(got) != 0 {
		t.Errorf("a domain not declared is reached: %v", got)
	}
}

// A CONNECT to an ssh key's domain goes to the SSH front; one to a plain
// key's is intercepted as before; the name of an ssh key on a port no key
// names is refused, whatever the egress.
func TestDecideConnectTerminatesSSH(t *testing.T) {
	granted, _ := sshPolicy(t).Grant(sshDeclared)
	for _, tc := range []struct {
		at     string
		egress string
		want   ConnectAction
		why    string
	}{
		{"github.com:22", EgressStrict, TerminateSSH, "an ssh key of this task may reach github.com:22"},
		{"ssh.github.com:443", EgressStrict, TerminateSSH, "an ssh key of this task may reach ssh.github.com"},
		{"gitlab.example.com:22", EgressOpen, TerminateSSH, "an ssh key of this task may reach gitlab.example.com:22"},
		{"code.example.com:2222", EgressOpen, TerminateSSH, "may reach code.example.com:2222"},
		{"api.github.com:443", EgressStrict, Intercept, "a key of this task may reach api.github.com"},
		{"github.com:443", EgressOpen, Refuse, "no key of this task names port 443 of github.com"},
		{"ssh.github.com:22", EgressOpen, Refuse, "no key of this task names port 22 of ssh.github.com"},
		{"gitlab.example.com:2222", EgressStrict, Refuse, "no key of this task names port 2222 of gitlab.example.com"},
		{"gitlab.com:22", EgressStrict, Refuse, "egress is strict"},
		{"gitlab.com:22", EgressOpen, Tunnel, "egress is open"},
	} {
		got := DecideConnect(ConnectInput{Target: authority(t, tc.at), Granted: granted, Egress: tc.egress})
		if got.Action != tc.want || !strings.Contains(got.Reason, tc.why) {
			t.Errorf("%s (%s): %v (%s), want %v (%s)", tc.at, tc.egress, got.Action, got.Reason, tc.want, tc.why)
		}
	}
	if TerminateSSH.String() != "terminate ssh" {
		t.Errorf("TerminateSSH is %q", TerminateSSH)
	}
}

// An ssh key gives the task no variable: it is used without holding
// anything. So it never clashes with an aws key's variables, even named
// like one, and a grant carries the key's ssh bounds.
func TestGrantSSHKeySetsNoVariable(t *testing.T) {
	s3 := []string{"s3.us-east-1.amazonaws.com"}
	hk := edHostKey(t, 1)
	p, err := Compile(config.Policy{Projects: map[string]config.ProjectPolicy{"acme": {Keys: map[string]config.KeyPolicy{
		"DEPLOY": {Kind: KindAWS, Domains: s3, AWS: &config.AWSKey{Regions: []string{"us-east-1"}, Services: []string{"s3"}}},
		"AWS_ACCESS_KEY_ID": {Kind: KindSSH, Domains: []string{"github.com:22"}, SSH: &config.SSHKey{
			KnownHosts: []string{"github.com " + keyText(hk)}, Allow: []string{GitUploadPack}}},
		"GIT_SSH": sshKey(t, nil),
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	sshNamedLikeAWS := runspec.Declared{ProjectID: "acme", Key: "AWS_ACCESS_KEY_ID", Domains: []Domain{{Name: "github.com", Port: 22}}}
	aws := runspec.Declared{ProjectID: "acme", Key: "DEPLOY", Domains: []Domain{{Name: "s3.us-east-1.amazonaws.com", Port: 443}}}
	git := runspec.Declared{ProjectID: "acme", Key: "GIT_SSH", Domains: []Domain{{Name: "github.com", Port: 22}}}
	for name, declared := range map[string][]runspec.Declared{
		"aws key first": {aws, sshNamedLikeAWS, git},
		"ssh key first": {sshNamedLikeAWS, git, aws},
	} {
		granted, refused := p.Grant(declared)
		if len(granted) != 3 || len(refused) != 0 {
			t.Errorf("%s: granted %v refused %v", name, granted, refused)
			continue
		}
		for _, g := range granted {
			k, _ := p.Key(g.Ref)
			if g.SSH != k.SSH || (g.SSH != nil) != (k.Kind == KindSSH) {
				t.Errorf("%s: %s granted with ssh %v, the key's is %v", name, g.Ref, g.SSH, k.SSH)
			}
			if g.SSH != nil && (len(g.envNames()) != 0 || g.In != 0 || g.Placeholder != (Shape{})) {
				t.Errorf("%s: %s gives the task %v (in %v, shape %+v)", name, g.Ref, g.envNames(), g.In, g.Placeholder)
			}
		}
	}
	if HoldsStorable([]Granted{{SSH: &SSHKey{}}}) {
		t.Error("an ssh key holds nothing an upstream may store")
	}
}

func FuzzParseGitCommand(f *testing.F) {
	for _, tc := range acceptedGitCommands {
		f.Add(tc.line)
	}
	for _, s := range []string{"sh -c x", "git-upload-pack 'a' 'b'", "git-upload-pack a;rm", "git-upload-pack '-x'",
		"git-upload-pack '../x'", "git lfs-authenticate a download", `git-upload-pack 'a'\''b'\!`, "git-upload-pack '/~u/x.git/'",
		"git-upload-pack 'a\x00b'", "git-upload-pack '\u0085'", "git-upload-pack \\'\\'\\'"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		c, err := ParseGitCommand(line)
		if err != nil {
			if c != (GitCommand{}) {
				t.Fatalf("%q: refused (%v) with %+v", line, err, c)
			}
			return
		}
		if !slices.Contains(GitCommands, c.Name) {
			t.Fatalf("%q: command %q", line, c.Name)
		}
		if (c.Name == GitLFSAuthenticate) != (c.Operation == "download" || c.Operation == "upload") || (c.Name != GitLFSAuthenticate && c.Operation != "") {
			t.Fatalf("%q: %s with operation %q", line, c.Name, c.Operation)
		}
		if c.Repository == "" || len(c.Path) > MaxRepositoryPath || strings.HasPrefix(c.Repository, "-") {
			t.Fatalf("%q: repository %q of path %q", line, c.Repository, c.Path)
		}
		for i, seg := range strings.Split(c.Repository, "/") {
			if seg == "" || seg == "." || seg == ".." || strings.HasPrefix(seg, "-") || (i > 0 && strings.HasPrefix(seg, "~")) {
				t.Fatalf("%q: repository %q has segment %q", line, c.Repository, seg)
			}
		}
		for _, r := range c.Repository {
			// C0 and DEL; C1 is TestParseGitCommandRefusesC1Controls'.
			if r < 0x20 || r == 0x7f {
				t.Fatalf("%q: repository %q holds %U", line, c.Repository, r)
			}
		}
		if len(c.Line()) > MaxGitCommandLine {
			// TestGitCommandLineRoundTripsAtTheBounds: quoting can
			// lengthen a line past what ParseGitCommand reads.
			if _, err := shellWords(c.Line()); err != nil {
				t.Fatalf("%q: Line() %q: %v", line, c.Line(), err)
			}
			return
		}
		checkLine(t, c)
	})
}

func FuzzRepositoryPattern(f *testing.F) {
	for _, s := range [][2]string{
		{"org/repo", "org/repo"}, {"org/repo.git", "/org/repo.git/"}, {"org/*", "org/x"}, {"group/**", "group/a/b"},
		{"~user/*", "~user/r"}, {"Org/Repo", "org/repo"}, {`a/\*`, "a/*"}, {"a/[b-", "a/b"}, {"**", "x"}, {"a/../b", "b"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, repository string) {
		p, err := CompileRepositoryPattern(pattern)
		if err != nil {
			return
		}
		matched := p.Match(repository)
		norm, err := normalizeRepositoryPath(pattern)
		if err != nil {
			t.Fatalf("%q compiles but does not normalise: %v", pattern, err)
		}
		if strings.ContainsAny(pattern, `*?[\`) {
			return
		}
		// Without wildcards, a pattern is its normalised text and
		// matches that alone.
		if !p.Match(norm) {
			t.Fatalf("%q does not match its own %q", pattern, norm)
		}
		if matched != (repository == norm) {
			t.Fatalf("%q (%q) matches %q: %v", pattern, norm, repository, matched)
		}
	})
}

func FuzzParseKnownHosts(f *testing.F) {
	k := keyText(edHostKey(f, 1))
	for _, s := range []string{
		"github.com " + k,
		"[ssh.github.com]:443 " + k,
		knownhosts.HashHostname("github.com") + " " + k,
		"*.example.com,!bad.example.com " + k,
		"@revoked * " + k,
		"@cert-authority * " + k,
		"# c\n\ngithub.com " + k + "\n|1|YQ==|YQ== " + k,
		"github.com ssh-ed25519 AAAA",
		"|1|" + strings.Repeat("A", 28) + "|" + strings.Repeat("A", 28) + " " + k,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		hosts, err := ParseKnownHosts(text)
		if err != nil {
			if hosts != nil {
				t.Fatalf("%q: refused (%v) with %v", text, err, hosts)
			}
			return
		}
		if len(hosts) == 0 {
			t.Fatalf("%q: accepted with no host", text)
		}
		stars := 0
		for _, h := range hosts {
			if h.Key == nil || len(h.Patterns) == 0 {
				t.Fatalf("%q: entry %+v", text, h)
			}
			for _, p := range h.Patterns {
				stars += strings.Count(p, "*")
			}
		}
		if stars > 6 {
			// wildcardMatch backtracks as OpenSSH's match_pattern does.
			return
		}
		s := &SSHKey{KnownHosts: hosts}
		for _, d := range []Domain{{Name: "github.com", Port: 22}, {Name: "ssh.github.com", Port: 443}} {
			for _, key := range s.HostKeys(d) {
				if err := s.CheckHostKey(d, key); err != nil {
					t.Fatalf("%q: %v: a key HostKeys gives is refused: %v", text, d, err)
				}
			}
			_ = s.HostKeyAlgorithms(d)
		}
	})
}
