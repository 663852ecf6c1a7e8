package ledger

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/runfleet/runfleet/edge/internal/atomicfile"
)

// Sealer seals the ledger key at rest; edge's CA sealer (a key file or
// KMS: ca.FileSealer, ca.KMSSealer) satisfies it. Open fails, and never
// returns corrupt plaintext, for what another key sealed, what was altered,
// or what is bound to another aad. Both honour ctx and are safe for
// concurrent use.
type Sealer interface {
	Seal(ctx context.Context, plaintext, aad []byte) ([]byte, error)
	Open(ctx context.Context, sealed, aad []byte) ([]byte, error)
}

// KeyFile is the sealed ledger key under edge's data dir.
const KeyFile = "ledger/key.sealed"

// keyAAD binds the sealed bytes to their use: a sealed CA key or SSH host
// key copied over the file does not open as a ledger key.
var keyAAD = []byte("runfleet edge ledger key v1")

// LoadKey returns the host's ledger key, minting an Ed25519 key and
// sealing its seed to <dataDir>/KeyFile the first time. Fleet verifies
// this host's seals with the public key its probe recorded, so the key
// never changes by itself: a file that exists but cannot be opened
// (another seal key, corruption) refuses the start rather than minting
// over it. random (nil: crypto/rand) mints the key.
func LoadKey(ctx context.Context, dataDir string, sealer Sealer, random io.Reader) (ed25519.PrivateKey, error) {
	path := filepath.Join(dataDir, KeyFile)
	sealed, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return mintKey(ctx, dataDir, path, sealer, random)
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: reading the ledger key: %w", err)
	}
	seed, err := sealer.Open(ctx, sealed, keyAAD)
	if err != nil {
		return nil, fmt.Errorf("ledger: refusing to start: the sealed ledger key %s cannot be opened (%v); a new key is never minted over it, since Fleet verifies this host's ledgers with this one: restore the seal key, or move the file away to start with a new ledger key", path, err)
	}
	defer clear(seed)
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("ledger: refusing to start: the ledger key %s opened but holds %d bytes, not an Ed25519 seed", path, len(seed))
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

func mintKey(ctx context.Context, dataDir, path string, sealer Sealer, random io.Reader) (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(random)
	if err != nil {
		return nil, fmt.Errorf("ledger: minting the ledger key: %w", err)
	}
	sealed, err := sealer.Seal(ctx, priv.Seed(), keyAAD)
	if err != nil {
		return nil, fmt.Errorf("ledger: sealing the ledger key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	// Create, never replace: two edges starting on one data dir keep the
	// first key.
	if err := atomicfile.Create(path, sealed, 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return LoadKey(ctx, dataDir, sealer, random)
		}
		return nil, fmt.Errorf("ledger: storing the ledger key: %w", err)
	}
	return priv, nil
}
