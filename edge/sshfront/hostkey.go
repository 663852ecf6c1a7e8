package sshfront

import (
	"context"
	"crypto/ed25519"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/internal/atomicfile"
	"github.com/runfleet/runfleet/edge/policy"
)

// Sealer seals the host key at rest; edge's CA sealer (a key file or KMS)
// satisfies it.
type Sealer interface {
	Seal(ctx context.Context, plaintext, aad []byte) ([]byte, error)
	Open(ctx context.Context, sealed, aad []byte) ([]byte, error)
}

// HostKeyFile is the sealed host key under edge's data dir.
const HostKeyFile = "ssh/host_key.sealed"

// hostKeyAAD binds the sealed bytes to their use: a sealed CA key copied
// over the file does not open as a host key.
var hostKeyAAD = []byte("runfleet edge ssh host key v1")

// LoadHostKey returns edge's SSH host key, minting an ed25519 key and
// sealing it to <dataDir>/HostKeyFile the first time. The key is what
// tasks' known_hosts trust, so it never changes by itself: a file that
// exists but cannot be opened (another seal key, corruption) refuses the
// start rather than minting over it.
func LoadHostKey(ctx context.Context, dataDir string, sealer Sealer, random io.Reader) (ssh.Signer, error) {
	path := filepath.Join(dataDir, HostKeyFile)
	sealed, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return mintHostKey(ctx, path, sealer, random)
	}
	if err != nil {
		return nil, fmt.Errorf("sshfront: reading the host key: %w", err)
	}
	pemBytes, err := sealer.Open(ctx, sealed, hostKeyAAD)
	if err != nil {
		return nil, fmt.Errorf("sshfront: refusing to start: the sealed host key %s cannot be opened (%v); a new key is never minted over it, since every task trusts this one: restore the seal key, or move the file away to start with a new host key", path, err)
	}
	signer, err := ssh.ParsePrivateKey(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("sshfront: refusing to start: the host key %s opened but does not parse", path)
	}
	return signer, nil
}

func mintHostKey(ctx context.Context, path string, sealer Sealer, random io.Reader) (ssh.Signer, error) {
	_, priv, err := ed25519.GenerateKey(random)
	if err != nil {
		return nil, fmt.Errorf("sshfront: minting the host key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "runfleet edge")
	if err != nil {
		return nil, fmt.Errorf("sshfront: encoding the host key: %w", err)
	}
	pemBytes := pem.EncodeToMemory(block)
	sealed, err := sealer.Seal(ctx, pemBytes, hostKeyAAD)
	if err != nil {
		return nil, fmt.Errorf("sshfront: sealing the host key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sshfront: %w", err)
	}
	// Create, never replace: two edges starting on one data dir keep the
	// first key.
	if err := atomicfile.Create(path, sealed, 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return LoadHostKey(ctx, filepath.Dir(filepath.Dir(path)), sealer, random)
		}
		return nil, fmt.Errorf("sshfront: storing the host key: %w", err)
	}
	return ssh.NewSignerFromKey(priv)
}

// KnownHosts is the known_hosts text that makes a task's ssh trust key for
// exactly these domains: one line per domain, "[name]:port" for a port
// other than 22, as OpenSSH looks it up.
func KnownHosts(key ssh.PublicKey, domains []policy.Domain) []byte {
	var b strings.Builder
	keyText := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
	for _, d := range domains {
		name := d.Name
		if d.Port != policy.SSHPort {
			name = fmt.Sprintf("[%s]:%d", d.Name, d.Port)
		}
		b.WriteString(name + " " + keyText + "\n")
	}
	return []byte(b.String())
}
