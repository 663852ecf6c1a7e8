package sshfront

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/crypto/ssh"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
)

// MinRSABits is the smallest RSA key the front signs with: GitHub and
// OpenSSH refuse smaller ones too.
const MinRSABits = 2048

// KeyError is why a key's value cannot be used; its text names the key
// and the problem, never the value.
type KeyError struct {
	Ref    policy.KeyRef
	Reason string
}

func (e *KeyError) Error() string { return fmt.Sprintf("ssh key %s: %s", e.Ref, e.Reason) }

// ParsePrivateKey reads an ssh key's real value: an unencrypted private
// key, OpenSSH or PEM (PKCS#1, PKCS#8, SEC 1), of type ed25519, ECDSA or
// RSA of at least MinRSABits. An encrypted key is refused: edge has no
// passphrase to give it, and would not keep one beside it.
func ParsePrivateKey(ref policy.KeyRef, v secrets.Value) (ssh.Signer, error) {
	raw, err := ssh.ParseRawPrivateKey([]byte(v.Reveal()))
	var missing *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &missing):
		return nil, &KeyError{ref, "the private key is encrypted; edge needs it without a passphrase (ssh-keygen -p -N '' -f FILE on a copy), sealed in the secrets source instead"}
	case err != nil:
		return nil, &KeyError{ref, "the value is not a private key in OpenSSH or PEM form"}
	}
	switch k := raw.(type) {
	case *ed25519.PrivateKey, ed25519.PrivateKey, *ecdsa.PrivateKey:
	case *rsa.PrivateKey:
		if k.N.BitLen() < MinRSABits {
			return nil, &KeyError{ref, fmt.Sprintf("the RSA key has %d bits; at least %d", k.N.BitLen(), MinRSABits)}
		}
	default:
		return nil, &KeyError{ref, fmt.Sprintf("a %T key is not one edge signs with (ed25519, ECDSA or RSA)", raw)}
	}
	signer, err := ssh.NewSignerFromKey(raw)
	if err != nil {
		return nil, &KeyError{ref, "the private key cannot sign"}
	}
	return signer, nil
}

// keyCache keeps each key's signer with the value it was parsed from: the
// value is read at every upstream connection (a rotation applies to the
// next one), parsed only when it changed.
type keyCache struct {
	mu    sync.Mutex
	byRef map[policy.KeyRef]parsedKey
}

type parsedKey struct {
	raw    string
	signer ssh.Signer
}

func (c *keyCache) signer(ctx context.Context, src secrets.Source, ref policy.KeyRef) (ssh.Signer, error) {
	v, err := src.Value(ctx, ref.Project, ref.Key)
	if errors.Is(err, secrets.ErrNotFound) {
		return nil, &KeyError{ref, "the secrets source holds no value for it"}
	}
	if err != nil {
		return nil, err
	}
	raw := v.Reveal()
	c.mu.Lock()
	p, ok := c.byRef[ref]
	c.mu.Unlock()
	if ok && p.raw == raw {
		return p.signer, nil
	}
	s, err := ParsePrivateKey(ref, v)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.byRef == nil {
		c.byRef = map[policy.KeyRef]parsedKey{}
	}
	c.byRef[ref] = parsedKey{raw: raw, signer: s}
	c.mu.Unlock()
	return s, nil
}
