package sshfront

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/policy"
)

func TestLoadHostKeyMintsOnceAndKeepsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	sealer := newSealer(t)
	first, err := LoadHostKey(ctx, dir, sealer, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if first.PublicKey().Type() != ssh.KeyAlgoED25519 {
		t.Errorf("host key type %s", first.PublicKey().Type())
	}
	path := filepath.Join(dir, HostKeyFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || filepath.Base(filepath.Dir(path)) != "ssh" {
		t.Errorf("%s: mode %v", path, fi.Mode())
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm()&0o077 != 0 {
		t.Errorf("ssh/: %v, %v", di.Mode(), err)
	}
	sealed, _ := os.ReadFile(path)
	if bytes.Contains(sealed, []byte("PRIVATE KEY")) || bytes.Contains(sealed, []byte("openssh-key-v1")) {
		t.Error("the host key file is not sealed")
	}

	again, err := LoadHostKey(ctx, dir, sealer, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.PublicKey().Marshal(), again.PublicKey().Marshal()) {
		t.Error("the second load gave another key")
	}
	// The key signs as the same key.
	sig, err := again.Sign(rand.Reader, []byte("data"))
	if err != nil || first.PublicKey().Verify([]byte("data"), sig) != nil {
		t.Errorf("the loaded key does not sign as the minted one: %v", err)
	}
}

func TestLoadHostKeyWithAnotherSealerRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := LoadHostKey(ctx, dir, newSealer(t), rand.Reader); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, HostKeyFile)
	before, _ := os.ReadFile(path)
	_, err := LoadHostKey(ctx, dir, newSealer(t), rand.Reader)
	if err == nil {
		t.Fatal("a key sealed with another seal key loaded")
	}
	for _, want := range []string{"refusing to start", path, "cannot be opened", "never minted over it"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not say %q", err, want)
		}
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("the host key file was changed")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("ssh/ holds %d entries", len(entries))
	}

	// Bytes sealed for something else (the right seal key, another aad)
	// do not open as the host key either.
	sealer := newSealer(t)
	other := t.TempDir()
	sealed, _ := sealer.Seal(ctx, []byte("not a host key"), []byte("runfleet edge ca key"))
	os.MkdirAll(filepath.Join(other, "ssh"), 0o700)
	os.WriteFile(filepath.Join(other, HostKeyFile), sealed, 0o600)
	if _, err := LoadHostKey(ctx, other, sealer, rand.Reader); err == nil || !strings.Contains(err.Error(), "cannot be opened") {
		t.Errorf("bytes sealed under another aad: %v", err)
	}
	// Sealed with the host key's aad but not a key: refused, not minted
	// over.
	sealed, _ = sealer.Seal(ctx, []byte("garbage"), hostKeyAAD)
	os.WriteFile(filepath.Join(other, HostKeyFile), sealed, 0o600)
	if _, err := LoadHostKey(ctx, other, sealer, rand.Reader); err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Errorf("a sealed non-key: %v", err)
	}
}

func TestLoadHostKeyRacingOnAnEmptyDirEndsWithOneKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	sealer := newSealer(t)
	const n = 8
	keys := make([]ssh.Signer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			keys[i], errs[i] = LoadHostKey(ctx, dir, sealer, rand.Reader)
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("load %d: %v", i, errs[i])
		}
		if !bytes.Equal(keys[i].PublicKey().Marshal(), keys[0].PublicKey().Marshal()) {
			t.Errorf("load %d got another key than load 0", i)
		}
	}
	stored, err := LoadHostKey(ctx, dir, sealer, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored.PublicKey().Marshal(), keys[0].PublicKey().Marshal()) {
		t.Error("the stored key is not the one the racing loads returned")
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "ssh"))
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("ssh/ holds %q; want the key file alone", names)
	}
}

func TestKnownHosts(t *testing.T) {
	t.Parallel()
	signer, err := LoadHostKey(context.Background(), t.TempDir(), newSealer(t), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	got := string(KnownHosts(signer.PublicKey(), []policy.Domain{{Name: "github.com", Port: 22}, {Name: "ssh.github.com", Port: 443}}))
	want := "github.com " + key + "\n[ssh.github.com]:443 " + key + "\n"
	if got != want {
		t.Errorf("KnownHosts:\n%s\nwant\n%s", got, want)
	}
	// What it writes is what policy reads back, for the same names.
	parsed, err := policy.ParseKnownHosts(got)
	if err != nil {
		t.Fatal(err)
	}
	s := &policy.SSHKey{KnownHosts: parsed}
	for _, d := range []policy.Domain{{Name: "github.com", Port: 22}, {Name: "ssh.github.com", Port: 443}} {
		if err := s.CheckHostKey(d, signer.PublicKey()); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	if err := s.CheckHostKey(policy.Domain{Name: "github.com", Port: 443}, signer.PublicKey()); err == nil {
		t.Error("github.com:443 matched a line for port 22")
	}
	if len(KnownHosts(signer.PublicKey(), nil)) != 0 {
		t.Error("KnownHosts of no domain holds a line")
	}
}
