package ca

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/runfleet/runfleet/edge/internal/atomicfile"
)

// Sealer protects the CA private keys at rest.
//
// Seal returns plaintext encrypted and authenticated together with aad
// (which is not stored in the result: Open needs the same aad). Open returns
// the plaintext, or an error when sealed was not made by this sealer's key,
// was altered, truncated, or is bound to another aad; it never returns
// corrupt plaintext. Both honour ctx and are safe for concurrent use.
type Sealer interface {
	Seal(ctx context.Context, plaintext, aad []byte) ([]byte, error)
	Open(ctx context.Context, sealed, aad []byte) ([]byte, error)
}

// sealKeySize is an AES-256 key.
const sealKeySize = 32

// fileSealMagic starts every FileSealer output; the version is in it.
var fileSealMagic = []byte("rfs1")

// sealKeyIDSize is how much of a seal key's fingerprint a sealed blob
// carries, so a wrong seal key is told apart from a tampered blob.
const sealKeyIDSize = 8

// FileSealer seals with AES-256-GCM under a key kept in a file (0600).
// The key file is created on the first Seal if it does not exist, and never
// replaced: losing it makes every sealed CA key unopenable.
type FileSealer struct {
	path   string
	random io.Reader

	mu   sync.Mutex
	aead cipher.AEAD // nil until the key file is read or created
	id   []byte
}

var _ Sealer = (*FileSealer)(nil)

// NewFileSealer returns a sealer whose key lives at path. An existing key
// file is read and checked now (exactly 32 bytes, not readable by group or
// others); a missing one is created, 0600, on the first Seal. random is the
// source of the key and of nonces; nil = crypto/rand.
func NewFileSealer(path string, random io.Reader) (*FileSealer, error) {
	if path == "" {
		return nil, errors.New("ca: seal key file: no path given")
	}
	if random == nil {
		random = rand.Reader
	}
	s := &FileSealer{path: path, random: random}
	if err := s.load(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return s, nil
}

// load reads the key file; the caller holds mu or has not shared s yet.
func (s *FileSealer) load() error {
	info, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("ca: seal key file %s: %w", s.path, err)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("ca: seal key file %s has mode %#o: it must not be readable by group or others (chmod 600)", s.path, perm)
	}
	key, err := os.ReadFile(s.path)
	if err != nil {
		return fmt.Errorf("ca: seal key file %s: %w", s.path, err)
	}
	defer clear(key)
	if len(key) != sealKeySize {
		return fmt.Errorf("ca: seal key file %s holds %d bytes; a seal key is exactly %d", s.path, len(key), sealKeySize)
	}
	return s.use(key)
}

func (s *FileSealer) use(key []byte) error {
	block, err := aes.NewCipher(key)
	if err != nil {
		return fmt.Errorf("ca: seal key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return fmt.Errorf("ca: seal key: %w", err)
	}
	s.aead, s.id = aead, sealKeyID(key)
	return nil
}

// sealKeyID names a seal key without revealing it.
func sealKeyID(key []byte) []byte {
	sum := sha256.Sum256(append([]byte("runfleet seal key id\x00"), key...))
	return sum[:sealKeyIDSize]
}

// ready returns the AEAD, creating the key file first when create is set.
func (s *FileSealer) ready(create bool) (cipher.AEAD, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aead != nil {
		return s.aead, s.id, nil
	}
	err := s.load()
	if errors.Is(err, fs.ErrNotExist) && create {
		err = s.create()
	}
	if err != nil {
		return nil, nil, err
	}
	return s.aead, s.id, nil
}

// create writes a new key file without ever replacing one: if another
// process made one meanwhile, that one is used.
func (s *FileSealer) create() error {
	key := make([]byte, sealKeySize)
	defer clear(key)
	if _, err := io.ReadFull(s.random, key); err != nil {
		return fmt.Errorf("ca: making a seal key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("ca: seal key file: %w", err)
	}
	if err := atomicfile.Create(s.path, key, 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("ca: seal key file: %w", err)
	}
	return s.load()
}

// Seal encrypts plaintext bound to aad: magic | key id | nonce | ciphertext.
func (s *FileSealer) Seal(_ context.Context, plaintext, aad []byte) ([]byte, error) {
	aead, id, err := s.ready(true)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(fileSealMagic)+len(id)+aead.NonceSize()+len(plaintext)+aead.Overhead())
	out = append(append(out, fileSealMagic...), id...)
	nonce := make([]byte, aead.NonceSize())
	if _, err := io.ReadFull(s.random, nonce); err != nil {
		return nil, fmt.Errorf("ca: sealing: reading a nonce: %w", err)
	}
	out = append(out, nonce...)
	return aead.Seal(out, nonce, plaintext, aad), nil
}

// Open reverses Seal, saying whether the blob is truncated, sealed under
// another key, or altered.
func (s *FileSealer) Open(_ context.Context, sealed, aad []byte) ([]byte, error) {
	aead, id, err := s.ready(false)
	if err != nil {
		return nil, err
	}
	head := len(fileSealMagic) + sealKeyIDSize + aead.NonceSize()
	if len(sealed) < head+aead.Overhead() {
		return nil, fmt.Errorf("sealed data is truncated (%d bytes)", len(sealed))
	}
	if !bytes.Equal(sealed[:len(fileSealMagic)], fileSealMagic) {
		return nil, errors.New("sealed data was not made by a seal key file (unknown format)")
	}
	if got := sealed[len(fileSealMagic) : len(fileSealMagic)+sealKeyIDSize]; !bytes.Equal(got, id) {
		return nil, fmt.Errorf("sealed under another seal key (key id %x; %s holds key id %x): was the seal key file replaced?", got, s.path, id)
	}
	nonce := sealed[len(fileSealMagic)+sealKeyIDSize : head]
	plain, err := aead.Open(nil, nonce, sealed[head:], aad)
	if err != nil {
		return nil, errors.New("sealed data fails authentication: it was altered or truncated")
	}
	return plain, nil
}
