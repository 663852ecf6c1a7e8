// Package sealedfile keeps a secret edge mints once (the SSH front's host
// key, the egress ledger's key) sealed at rest in one file of its data
// dir, under the CA's sealer. Such a secret is trusted by others from its
// first use (tasks' known_hosts, Fleet's record of the ledger key), so it
// never changes by itself: a file that exists but cannot be opened is an
// error (ErrUnopenable), never a reason to mint over it, and two edges
// starting on one data dir keep the first one's.
package sealedfile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/runfleet/runfleet/edge/internal/atomicfile"
)

// Sealer seals at rest; edge's CA sealer (a key file or KMS: ca.FileSealer,
// ca.KMSSealer) satisfies it. Open fails, and never returns corrupt
// plaintext, for what another key sealed, what was altered, or what is
// bound to another aad. Both honour ctx and are safe for concurrent use.
type Sealer interface {
	Seal(ctx context.Context, plaintext, aad []byte) ([]byte, error)
	Open(ctx context.Context, sealed, aad []byte) ([]byte, error)
}

// ErrUnopenable: the file exists but does not open under the sealer and
// aad given (another seal key, corruption, another secret's file).
var ErrUnopenable = errors.New("sealedfile: the sealed file cannot be opened")

// LoadOrMint returns the plaintext sealed at path under aad, or, when
// there is no file, the plaintext mint returns, sealed to path first (made
// 0600 in a 0700 directory; created, never replaced). aad binds the sealed
// bytes to their use: one secret's file copied over another's does not
// open.
func LoadOrMint(ctx context.Context, path string, sealer Sealer, aad []byte, mint func() ([]byte, error)) ([]byte, error) {
	sealed, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return mintAt(ctx, path, sealer, aad, mint)
	}
	if err != nil {
		return nil, err
	}
	plain, err := sealer.Open(ctx, sealed, aad)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnopenable, err)
	}
	return plain, nil
}

func mintAt(ctx context.Context, path string, sealer Sealer, aad []byte, mint func() ([]byte, error)) ([]byte, error) {
	plain, err := mint()
	if err != nil {
		return nil, fmt.Errorf("minting: %w", err)
	}
	sealed, err := sealer.Seal(ctx, plain, aad)
	if err != nil {
		return nil, fmt.Errorf("sealing: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := atomicfile.Create(path, sealed, 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			clear(plain)
			return LoadOrMint(ctx, path, sealer, aad, mint) // another edge minted first
		}
		return nil, fmt.Errorf("storing: %w", err)
	}
	return plain, nil
}
