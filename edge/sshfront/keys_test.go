package sshfront

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/tests/kit/gitsshd"
)

// keygen runs ssh-keygen for a new key file and returns its contents.
func keygen(t *testing.T, args ...string) []byte {
	t.Helper()
	file := filepath.Join(t.TempDir(), "id")
	cmd := exec.Command("ssh-keygen", append([]string{"-q", "-f", file, "-C", ""}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen %q: %v\n%s", args, err, out)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pemOf(t *testing.T, typ string, der []byte, err error) []byte {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// secretParts are the pieces of a private key's text that must never be
// shown: the whole, each base64 line of its body but the first (a header
// every key of its type shares), the body in one piece.
func secretParts(pemText []byte) []string {
	parts := []string{string(pemText)}
	block, _ := pem.Decode(pemText)
	body := base64.StdEncoding.EncodeToString(block.Bytes)
	parts = append(parts, body)
	lines := strings.Split(strings.TrimSpace(string(pemText)), "\n")
	for _, l := range lines[2 : len(lines)-1] {
		if len(l) >= 16 {
			parts = append(parts, l)
		}
	}
	return parts
}

func TestParsePrivateKey(t *testing.T) {
	t.Parallel()
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	edPEM, err := ssh.MarshalPrivateKey(ed, "")
	if err != nil {
		t.Fatal(err)
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, err := x509.MarshalECPrivateKey(ec)
	rsa2048, _ := rsa.GenerateKey(rand.Reader, 2048)
	rsa1024, _ := rsa.GenerateKey(rand.Reader, 1024)
	pkcs8, err8 := x509.MarshalPKCS8PrivateKey(ed)
	encrypted, err := ssh.MarshalPrivateKeyWithPassphrase(ed, "", []byte("sesame"))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := ssh.NewPublicKey(ed.Public())

	for _, c := range []struct {
		name   string
		value  []byte
		reason string // "" when it parses
	}{
		{"ed25519 OpenSSH", pem.EncodeToMemory(edPEM), ""},
		{"ed25519 from ssh-keygen", keygen(t, "-t", "ed25519", "-N", ""), ""},
		{"ECDSA SEC 1", pemOf(t, "EC PRIVATE KEY", ecDER, err), ""},
		{"RSA PKCS#1", pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsa2048), nil), ""},
		{"ed25519 PKCS#8", pemOf(t, "PRIVATE KEY", pkcs8, err8), ""},
		{"RSA of 1024 bits", pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsa1024), nil), "the RSA key has 1024 bits; at least 2048"},
		{"encrypted by x/crypto", pem.EncodeToMemory(encrypted), "the private key is encrypted"},
		{"encrypted by ssh-keygen", keygen(t, "-t", "ed25519", "-N", "sesame"), "the private key is encrypted"},
		{"encrypted PEM by ssh-keygen", keygen(t, "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "sesame"), "the private key is encrypted"},
		{"a public key", ssh.MarshalAuthorizedKey(pub), "the value is not a private key in OpenSSH or PEM form"},
		{"a token", []byte("ghp_0123456789abcdefghijklmnopqrstuvwxyz"), "the value is not a private key in OpenSSH or PEM form"},
		{"empty", nil, "the value is not a private key in OpenSSH or PEM form"},
	} {
		signer, err := ParsePrivateKey(keyRef, secrets.NewValue(string(c.value)))
		if c.reason == "" {
			if err != nil || signer == nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Ref != keyRef || !strings.HasPrefix(ke.Reason, c.reason) {
			t.Errorf("%s: %v; want a KeyError saying %q", c.name, err, c.reason)
			continue
		}
		if !strings.HasPrefix(err.Error(), "ssh key acme/GIT_SSH: ") {
			t.Errorf("%s: %q does not name the key", c.name, err)
		}
		text := err.Error()
		if strings.Contains(text, "sesame") || strings.Contains(text, "ghp_") {
			t.Errorf("%s: the error holds the value or its passphrase: %q", c.name, text)
		}
		if block, _ := pem.Decode(c.value); block != nil {
			for _, p := range secretParts(c.value) {
				if strings.Contains(text, p) {
					t.Errorf("%s: the error holds the value: %q", c.name, text)
				}
			}
		}
	}
}

// TestAKeyTheFrontCannotUseIsRefusedBeforeTheUpstream: a value that is
// missing, encrypted or not a key refuses the command with the reason,
// and the upstream is never dialled.
func TestAKeyTheFrontCannotUseIsRefusedBeforeTheUpstream(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		secret func(pem []byte) string
		want   string
	}{
		{"encrypted", func([]byte) string {
			return string(keygen(t, "-t", "ed25519", "-N", "sesame"))
		}, "runfleet: ssh key acme/GIT_SSH: the private key is encrypted; edge needs it without a passphrase"},
		{"not a key", func([]byte) string { return "hunter2" }, "runfleet: ssh key acme/GIT_SSH: the value is not a private key in OpenSSH or PEM form\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, options{secret: c.secret})
			e.up.NewRepo(t, "org/repo.git")
			r := run(t, "", e.gitEnv(), "git", "clone", "-q", url("org/repo.git"), filepath.Join(t.TempDir(), "clone"))
			if r.code == 0 || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr, "sesame") || strings.Contains(r.stderr, "hunter2") {
				t.Errorf("clone: %s; want %q", r, c.want)
			}
			e.audit.await(t, "of the refusal", entryFor(audit.Denied, policy.GitUploadPack, "org/repo"))
			e.noUpstream(t)
		})
	}
	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, options{})
		e.secrets.mu.Lock()
		delete(e.secrets.values, secrets.ID(project, keyName))
		e.secrets.mu.Unlock()
		r := execOn(t, e.dial(), "git-upload-pack 'org/repo.git'", flush)
		if want := "runfleet: ssh key acme/GIT_SSH: the secrets source holds no value for it\n"; r.code != 1 || r.stderr != want {
			t.Errorf("%s; want %q", r, want)
		}
		e.noUpstream(t)
	})
}

// TestTheUpstreamRefusingTheKey: a key the upstream does not authorize is
// refused there; the task is told, the log says why, neither shows the
// key.
func TestTheUpstreamRefusingTheKey(t *testing.T) {
	t.Parallel()
	_, other := gitsshd.NewClientKey(t)
	e := newEnv(t, options{secret: func([]byte) string { return string(other) }})
	e.up.NewRepo(t, "org/repo.git")
	r := execOn(t, e.dial(), "git-upload-pack 'org/repo.git'", flush)
	if want := "runfleet: git.example:22 refused key GIT_SSH, or its SSH handshake failed\n"; r.code != 1 || r.stderr != want {
		t.Errorf("%s; want %q", r, want)
	}
	if log := e.logs.String(); !strings.Contains(log, "unable to authenticate") {
		t.Errorf("the front's log does not say why:\n%s", log)
	}
	e.assertNoSecret(t, other, r.stderr)
}

// TestAKeyRotatedAppliesToTheNextConnection: the value is read at every
// upstream connection.
func TestAKeyRotatedAppliesToTheNextConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	e.up.NewRepo(t, "org/repo.git")
	first := e.dial()
	if r := execOn(t, first, "git-upload-pack 'org/repo.git'", flush); r.code != 0 {
		t.Fatal(r)
	}
	first.Close()
	next, nextPEM := gitsshd.NewClientKey(t)
	if err := e.up.Authorize(next.PublicKey()); err != nil {
		t.Fatal(err)
	}
	e.secrets.set(project, keyName, string(nextPEM))
	second := e.dial()
	if r := execOn(t, second, "git-upload-pack 'org/repo.git'", flush); r.code != 0 {
		t.Fatal(r)
	}
	second.Close()
	e.up.WaitIdle(t)
	if log := e.up.Log(); !strings.Contains(log, "Accepted publickey for git from 127.0.0.1 port") ||
		!strings.Contains(log, ssh.FingerprintSHA256(next.PublicKey())) {
		t.Errorf("sshd did not see the new key:\n%s", log)
	}
}

// TestTheRealKeyIsShownNowhere: through clones, refusals and failures,
// the real private key is in no audit line, log line or message the task
// gets.
func TestTheRealKeyIsShownNowhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{allow: []string{policy.GitUploadPack}})
	e.up.NewRepo(t, "org/repo.git")
	env := e.gitEnv()
	var told []string
	r := run(t, "", env, "git", "clone", url("org/repo.git"), filepath.Join(t.TempDir(), "clone"))
	if r.code != 0 {
		t.Fatal(r)
	}
	told = append(told, r.stdout, r.stderr)
	dir := localRepo(t, env, url("org/repo.git"))
	r = run(t, dir, env, "git", "push", "origin", "main")
	told = append(told, r.stdout, r.stderr)
	r = run(t, "", env, "git", "clone", url("org/missing.git"), filepath.Join(t.TempDir(), "missing"))
	told = append(told, r.stdout, r.stderr)
	r = run(t, "", gitsshd.GitEnv(t), append(e.sshArgs(), "git@"+hostName)...)
	told = append(told, r.stdout, r.stderr)
	c := e.dial()
	for _, line := range []string{"id", "git-upload-pack 'org/repo.git'", "git-receive-pack 'org/repo.git'"} {
		r := execOn(t, c, line, flush)
		told = append(told, r.stdout, r.stderr)
	}
	c.Close()
	// A value the front cannot use, then one the upstream refuses.
	e.secrets.set(project, keyName, strings.Replace(string(e.clientPEM), "A", "B", 1))
	r = execOn(t, e.dial(), "git-upload-pack 'org/repo.git'", flush)
	told = append(told, r.stdout, r.stderr)
	e.assertNoSecret(t, e.clientPEM, told...)
}

// assertNoSecret checks that no part of the private key pemText, nor its
// raw key, is in the audit, the front's log or texts.
func (e *env) assertNoSecret(t *testing.T, pemText []byte, texts ...string) {
	t.Helper()
	parts := secretParts(pemText)
	if raw, err := ssh.ParseRawPrivateKey(pemText); err == nil {
		if k, ok := raw.(*ed25519.PrivateKey); ok {
			seed := k.Seed()
			parts = append(parts, base64.StdEncoding.EncodeToString(seed), base64.RawStdEncoding.EncodeToString(seed), hex.EncodeToString(seed))
		}
	}
	where := map[string]string{"the audit": e.audit.dump(), "the front's log": e.logs.String()}
	for i, s := range texts {
		where["text "+string(rune('a'+i))] = s
	}
	for name, s := range where {
		for _, p := range parts {
			if strings.Contains(s, p) {
				t.Errorf("%s holds part of the private key (%.12q...):\n%s", name, p, s)
			}
		}
	}
}
