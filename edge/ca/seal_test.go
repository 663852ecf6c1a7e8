package ca_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/tests/kit/await"
)

// sealerContract checks what every Sealer promises: a round trip, and a
// clear error (never plaintext) for a blob that is altered, truncated or
// bound to other aad.
func sealerContract(t *testing.T, s ca.Sealer) {
	t.Helper()
	ctx := context.Background()
	plain := []byte("a CA private key, PKCS #8")
	aad := []byte("certificate fingerprint")
	sealed, err := s.Seal(ctx, plain, aad)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, plain) {
		t.Fatal("the sealed blob contains the plaintext")
	}
	got, err := s.Open(ctx, sealed, aad)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("Open(Seal(x)) = %q, %v", got, err)
	}
	again, err := s.Seal(ctx, plain, aad)
	if err != nil || bytes.Equal(again, sealed) {
		t.Fatalf("two seals of one plaintext are identical (nonce reuse?), err %v", err)
	}

	flipped := bytes.Clone(sealed)
	flipped[len(flipped)-1] ^= 1
	for name, blob := range map[string][]byte{
		"altered":   flipped,
		"truncated": sealed[:len(sealed)-5],
		"cut short": sealed[:6],
		"empty":     nil,
	} {
		if got, err := s.Open(ctx, blob, aad); err == nil {
			t.Errorf("Open of an %s blob returned %q and no error", name, got)
		}
	}
	if _, err := s.Open(ctx, sealed, []byte("another certificate")); err == nil {
		t.Error("Open with other aad succeeded")
	}
}

func TestFileSealerContract(t *testing.T) {
	s, err := ca.NewFileSealer(filepath.Join(t.TempDir(), "keys", "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	sealerContract(t, s)
}

func TestFileSealerCreatesItsKeyOnFirstSealOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seal.key")
	s, err := ca.NewFileSealer(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("NewFileSealer made the key file before any Seal")
	}
	if _, err := s.Open(context.Background(), []byte("rfs1xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), nil); err == nil {
		t.Fatal("Open without a key file succeeded")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("Open made a key file: a lost key must not be replaced by a new one")
	}
	sealed, err := s.Seal(context.Background(), []byte("x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 || info.Size() != 32 {
		t.Fatalf("key file mode %v size %d, want 0600 and 32 bytes", info.Mode().Perm(), info.Size())
	}
	other, err := ca.NewFileSealer(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := other.Open(context.Background(), sealed, nil); err != nil || string(got) != "x" {
		t.Fatalf("another sealer on the same key file: %q, %v", got, err)
	}
}

func TestFileSealersRacingToCreateTheKeyAgreeOnOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seal.key")
	var wg sync.WaitGroup
	sealed := make([][]byte, 8)
	for i := range sealed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := ca.NewFileSealer(path, nil)
			if err == nil {
				sealed[i], err = s.Seal(context.Background(), []byte("x"), nil)
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	await.Group(t, "the concurrent sealers", &wg)
	s, err := ca.NewFileSealer(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range sealed {
		if _, err := s.Open(context.Background(), b, nil); err != nil {
			t.Errorf("sealer %d sealed under a key that is not the one on disk: %v", i, err)
		}
	}
}

func TestFileSealerRefusesABadKeyFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		data []byte
		mode os.FileMode
		says string
	}{
		{"readable by others", bytes.Repeat([]byte{1}, 32), 0o644, "must not be readable by group or others"},
		{"too short", []byte("short"), 0o600, "holds 5 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, tc.data, tc.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			_, err := ca.NewFileSealer(path, nil)
			if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), path) {
				t.Fatalf("NewFileSealer: %v; want an error naming %s and saying %q", err, path, tc.says)
			}
		})
	}
}
