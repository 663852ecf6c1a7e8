package ledger

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/ca"
)

// The ledger key is minted once, sealed as the CA's key is (the same
// sealer, its own binding), and read back the same on every start; a
// sealed file another seal key made, or another sealed key copied in its
// place, refuses the start instead of a new key being minted over it.
func TestLedgerKeyIsSealedAndKept(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sealer, err := ca.NewFileSealer(filepath.Join(dir, "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := LoadKey(ctx, dir, sealer, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, KeyFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the sealed key file: %v %v", fi, err)
	}
	raw, _ := os.ReadFile(path)
	if bytes.Contains(raw, key.Seed()) {
		t.Fatal("the key file holds the seed in the clear")
	}
	again, err := LoadKey(ctx, dir, sealer, nil)
	if err != nil || !again.Equal(key) {
		t.Fatalf("read back: %v, same key %v", err, again.Equal(key))
	}

	other, err := ca.NewFileSealer(filepath.Join(t.TempDir(), "seal.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(ctx, dir, other, nil); err == nil || !strings.Contains(err.Error(), "refusing to start") {
		t.Fatalf("opened under another seal key: %v", err)
	}
	// Another sealed secret, made by the same sealer for another use, does
	// not open as the ledger key.
	foreign, err := sealer.Seal(ctx, bytes.Repeat([]byte{7}, 32), []byte("runfleet edge ssh host key v1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, foreign, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(ctx, dir, sealer, nil); err == nil {
		t.Fatal("a key sealed for another use opened as the ledger key")
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, foreign) {
		t.Fatal("a new key was minted over the file")
	}
}
