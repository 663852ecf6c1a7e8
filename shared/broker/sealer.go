package broker

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
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/kms/types"
)

// ErrUnopenable is an Open of a value this sealer cannot open, ever: made
// by another key or kind of sealer, for another binding, or altered. Any
// other Open error may pass (KMS unreachable, throttled).
var ErrUnopenable = errors.New("sealed by another key, for another binding, or altered")

// KeyEnvName is the variable naming the sealer.
const KeyEnvName = "RUNFLEET_BROKER_KEY"

// KMSAPI is the part of the KMS client the sealer calls;
// *kms.Client satisfies it.
type KMSAPI interface {
	Encrypt(ctx context.Context, in *kms.EncryptInput, opts ...func(*kms.Options)) (*kms.EncryptOutput, error)
	Decrypt(ctx context.Context, in *kms.DecryptInput, opts ...func(*kms.Options)) (*kms.DecryptOutput, error)
}

var _ KMSAPI = (*kms.Client)(nil)

// SealerOptions are what OpenSealer may need besides the spec.
type SealerOptions struct {
	// KMS is the client for a kms: spec.
	KMS KMSAPI
	// Random is read for the file sealer's nonces; nil is crypto/rand.
	Random io.Reader
}

// OpenSealer returns the sealer RUNFLEET_BROKER_KEY names: `kms:<key id,
// ARN or alias>` or `file:<path>` (32 random bytes, mode 0600).
func OpenSealer(spec string, o SealerOptions) (Sealer, error) {
	kind, arg, _ := strings.Cut(spec, ":")
	switch {
	case kind == "kms" && arg != "":
		if o.KMS == nil {
			return nil, fmt.Errorf("%s: kms: needs a KMS client", KeyEnvName)
		}
		return &KMSSealer{client: o.KMS, keyID: arg}, nil
	case kind == "file" && arg != "":
		return NewFileSealer(arg, o.Random)
	}
	return nil, fmt.Errorf("%s %q: want kms:<key id|arn|alias> or file:<path>", KeyEnvName, spec)
}

// The first bytes of each sealer's output: its format and version, so a
// value sealed by the other kind (RUNFLEET_BROKER_KEY changed) is told
// apart from a damaged one.
var (
	kmsMagic  = []byte("rbk1")
	fileMagic = []byte("rbf1")
)

// KMSSealer seals with KMS Encrypt under one key, the bound string as the
// encryption context {"runfleet": bindTo}: KMS refuses to decrypt under
// any other, and CloudTrail records which credential each call was for.
// KMS encrypts at most 4096 bytes, which bounds a value it seals.
type KMSSealer struct {
	client KMSAPI
	keyID  string
}

var _ Sealer = (*KMSSealer)(nil)

// encryptionContextKey is the encryption context's one key. A key policy
// may condition on kms:EncryptionContextKeys.
const encryptionContextKey = "runfleet"

// Seal encrypts plaintext under the key, bound to bindTo.
func (s *KMSSealer) Seal(ctx context.Context, plaintext []byte, bindTo string) ([]byte, error) {
	out, err := s.client.Encrypt(ctx, &kms.EncryptInput{
		KeyId:             &s.keyID,
		Plaintext:         plaintext,
		EncryptionContext: map[string]string{encryptionContextKey: bindTo},
	})
	if err != nil {
		return nil, fmt.Errorf("broker: sealing for %s with KMS key %s: %w", bindTo, s.keyID, err)
	}
	return append(bytes.Clone(kmsMagic), out.CiphertextBlob...), nil
}

// Open decrypts what Seal returned for the same bindTo.
func (s *KMSSealer) Open(ctx context.Context, sealed []byte, bindTo string) ([]byte, error) {
	blob, ok := bytes.CutPrefix(sealed, kmsMagic)
	if !ok {
		return nil, fmt.Errorf("broker: opening for %s: not sealed by KMS (was %s changed?): %w", bindTo, KeyEnvName, ErrUnopenable)
	}
	out, err := s.client.Decrypt(ctx, &kms.DecryptInput{
		KeyId:             &s.keyID,
		CiphertextBlob:    blob,
		EncryptionContext: map[string]string{encryptionContextKey: bindTo},
	})
	var invalid *types.InvalidCiphertextException
	var incorrect *types.IncorrectKeyException
	if errors.As(err, &invalid) || errors.As(err, &incorrect) {
		return nil, fmt.Errorf("broker: opening for %s with KMS key %s: %w: %w", bindTo, s.keyID, ErrUnopenable, err)
	}
	if err != nil {
		return nil, fmt.Errorf("broker: opening for %s with KMS key %s: %w", bindTo, s.keyID, err)
	}
	return out.Plaintext, nil
}

// fileKeySize is an AES-256 key; fileKeyIDSize how much of its digest a
// sealed value carries, so a replaced key file is told apart from damage.
const (
	fileKeySize   = 32
	fileKeyIDSize = 8
)

// FileSealer seals with AES-256-GCM under a key read from a file once, at
// start, the bound string as additional data: the local stack's KMS. The
// file must hold exactly 32 bytes and be readable by its owner alone; it
// is never created here (make one with `head -c 32 /dev/urandom`).
type FileSealer struct {
	path   string
	aead   cipher.AEAD
	id     []byte
	random io.Reader
}

var _ Sealer = (*FileSealer)(nil)

// NewFileSealer reads the key at path; random is read for nonces (nil is
// crypto/rand).
func NewFileSealer(path string, random io.Reader) (*FileSealer, error) {
	if random == nil {
		random = rand.Reader
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyEnvName, err)
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %s is not a regular file", KeyEnvName, path)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s: %s has mode %#o: it must be readable by its owner only (chmod 600)", KeyEnvName, path, perm)
	}
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyEnvName, err)
	}
	defer clear(key)
	if len(key) != fileKeySize {
		return nil, fmt.Errorf("%s: %s holds %d bytes; the key is exactly %d random bytes", KeyEnvName, path, len(key), fileKeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyEnvName, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyEnvName, err)
	}
	sum := sha256.Sum256(append([]byte("runfleet broker key id\x00"), key...))
	return &FileSealer{path: path, aead: aead, id: sum[:fileKeyIDSize], random: random}, nil
}

// Seal encrypts plaintext bound to bindTo: magic | key id | nonce |
// ciphertext.
func (s *FileSealer) Seal(_ context.Context, plaintext []byte, bindTo string) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := io.ReadFull(s.random, nonce); err != nil {
		return nil, fmt.Errorf("broker: sealing for %s: reading a nonce: %w", bindTo, err)
	}
	out := make([]byte, 0, len(fileMagic)+len(s.id)+len(nonce)+len(plaintext)+s.aead.Overhead())
	out = append(append(append(out, fileMagic...), s.id...), nonce...)
	return s.aead.Seal(out, nonce, plaintext, []byte(bindTo)), nil
}

// Open reverses Seal for the same bindTo.
func (s *FileSealer) Open(_ context.Context, sealed []byte, bindTo string) ([]byte, error) {
	rest, ok := bytes.CutPrefix(sealed, fileMagic)
	if !ok {
		return nil, fmt.Errorf("broker: opening for %s: not sealed by a key file (was %s changed?): %w", bindTo, KeyEnvName, ErrUnopenable)
	}
	head := fileKeyIDSize + s.aead.NonceSize()
	if len(rest) < head+s.aead.Overhead() {
		return nil, fmt.Errorf("broker: opening for %s: the sealed value is truncated: %w", bindTo, ErrUnopenable)
	}
	if !bytes.Equal(rest[:fileKeyIDSize], s.id) {
		return nil, fmt.Errorf("broker: opening for %s: sealed under another key than %s's (was it replaced?): %w", bindTo, s.path, ErrUnopenable)
	}
	plain, err := s.aead.Open(nil, rest[fileKeyIDSize:head], rest[head:], []byte(bindTo))
	if err != nil {
		return nil, fmt.Errorf("broker: opening for %s: the sealed value fails authentication: %w", bindTo, ErrUnopenable)
	}
	return plain, nil
}
