package sshfront

import (
	"context"
	"crypto/ed25519"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/internal/sealedfile"
	"github.com/runfleet/runfleet/edge/policy"
)

// Sealer seals the host key at rest: edge's CA sealer.
type Sealer = sealedfile.Sealer

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
	pemBytes, err := sealedfile.LoadOrMint(ctx, path, sealer, hostKeyAAD, func() ([]byte, error) {
		_, priv, err := ed25519.GenerateKey(random)
		if err != nil {
			return nil, err
		}
		block, err := ssh.MarshalPrivateKey(priv, "runfleet edge")
		if err != nil {
			return nil, err
		}
		return pem.EncodeToMemory(block), nil
	})
	if errors.Is(err, sealedfile.ErrUnopenable) {
		return nil, fmt.Errorf("sshfront: refusing to start: the sealed host key %s cannot be opened (%v); a new key is never minted over it, since every task trusts this one: restore the seal key, or move the file away to start with a new host key", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("sshfront: the host key %s: %w", path, err)
	}
	signer, err := ssh.ParsePrivateKey(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("sshfront: refusing to start: the host key %s opened but does not parse", path)
	}
	return signer, nil
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
