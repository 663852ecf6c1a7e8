package ledger

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/runfleet/runfleet/edge/internal/sealedfile"
)

// Sealer seals the ledger key at rest: edge's CA sealer.
type Sealer = sealedfile.Sealer

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
	seed, err := sealedfile.LoadOrMint(ctx, path, sealer, keyAAD, func() ([]byte, error) {
		_, priv, err := ed25519.GenerateKey(random)
		if err != nil {
			return nil, err
		}
		return priv.Seed(), nil
	})
	if errors.Is(err, sealedfile.ErrUnopenable) {
		return nil, fmt.Errorf("ledger: refusing to start: the sealed ledger key %s cannot be opened (%v); a new key is never minted over it, since Fleet verifies this host's ledgers with this one: restore the seal key, or move the file away to start with a new ledger key", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: the ledger key %s: %w", path, err)
	}
	defer clear(seed)
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("ledger: refusing to start: the ledger key %s opened but holds %d bytes, not an Ed25519 seed", path, len(seed))
	}
	return ed25519.NewKeyFromSeed(seed), nil
}
