package ca

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/kms/types"
)

// KMSAPI is the part of the AWS KMS client the KMSSealer calls;
// *kms.Client implements it.
type KMSAPI interface {
	GenerateDataKey(ctx context.Context, in *kms.GenerateDataKeyInput, opts ...func(*kms.Options)) (*kms.GenerateDataKeyOutput, error)
	Decrypt(ctx context.Context, in *kms.DecryptInput, opts ...func(*kms.Options)) (*kms.DecryptOutput, error)
}

var _ KMSAPI = (*kms.Client)(nil)

// kmsSealMagic starts every KMSSealer output; the version is in it.
var kmsSealMagic = []byte("rfk1")

// kmsEncryptionContext binds the data keys to their use: KMS refuses to
// decrypt one without it, and logs it in CloudTrail.
var kmsEncryptionContext = map[string]string{"runfleet": "edge-ca-key"}

// KMSSealer seals by envelope encryption: each Seal asks KMS for a fresh
// AES-256 data key, encrypts locally with AES-256-GCM, and keeps only the
// data key as KMS encrypted it. Open has KMS decrypt that data key. The
// plaintext data key never leaves memory.
type KMSSealer struct {
	client KMSAPI
	keyID  string
}

var _ Sealer = (*KMSSealer)(nil)

// NewKMSSealer seals under the KMS key keyID (an id, ARN or alias).
func NewKMSSealer(client KMSAPI, keyID string) *KMSSealer {
	return &KMSSealer{client: client, keyID: keyID}
}

// Seal returns magic | data key length (2 bytes) | KMS-encrypted data key |
// nonce | ciphertext.
func (s *KMSSealer) Seal(ctx context.Context, plaintext, aad []byte) ([]byte, error) {
	out, err := s.client.GenerateDataKey(ctx, &kms.GenerateDataKeyInput{
		KeyId:             aws.String(s.keyID),
		KeySpec:           types.DataKeySpecAes256,
		EncryptionContext: kmsEncryptionContext,
	})
	if err != nil {
		return nil, fmt.Errorf("ca: KMS GenerateDataKey with key %s: %w", s.keyID, err)
	}
	defer clear(out.Plaintext)
	if len(out.CiphertextBlob) == 0 || len(out.CiphertextBlob) > 0xffff {
		return nil, fmt.Errorf("ca: KMS returned an encrypted data key of %d bytes", len(out.CiphertextBlob))
	}
	aead, err := dataKeyAEAD(out.Plaintext)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return nil, fmt.Errorf("ca: sealing: reading a nonce: %w", err)
	}
	sealed := append([]byte(nil), kmsSealMagic...)
	sealed = binary.BigEndian.AppendUint16(sealed, uint16(len(out.CiphertextBlob)))
	sealed = append(sealed, out.CiphertextBlob...)
	sealed = append(sealed, nonce...)
	return aead.Seal(sealed, nonce, plaintext, aad), nil
}

// Open reverses Seal.
func (s *KMSSealer) Open(ctx context.Context, sealed, aad []byte) ([]byte, error) {
	rest, ok := bytes.CutPrefix(sealed, kmsSealMagic)
	if !ok {
		return nil, errors.New("sealed data was not made by the KMS sealer (unknown format)")
	}
	if len(rest) < 2 {
		return nil, errors.New("sealed data is truncated")
	}
	n := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	const nonceSize, tagSize = 12, 16
	if len(rest) < n+nonceSize+tagSize {
		return nil, fmt.Errorf("sealed data is truncated (%d bytes)", len(sealed))
	}
	out, err := s.client.Decrypt(ctx, &kms.DecryptInput{
		CiphertextBlob:    rest[:n],
		KeyId:             aws.String(s.keyID),
		EncryptionContext: kmsEncryptionContext,
	})
	if err != nil {
		return nil, fmt.Errorf("KMS cannot decrypt its data key with key %s (wrong key, no access, or altered): %w", s.keyID, err)
	}
	defer clear(out.Plaintext)
	aead, err := dataKeyAEAD(out.Plaintext)
	if err != nil {
		return nil, err
	}
	plain, err := aead.Open(nil, rest[n:n+nonceSize], rest[n+nonceSize:], aad)
	if err != nil {
		return nil, errors.New("sealed data fails authentication: it was altered or truncated")
	}
	return plain, nil
}

func dataKeyAEAD(key []byte) (cipher.AEAD, error) {
	if len(key) != sealKeySize {
		return nil, fmt.Errorf("ca: KMS returned a data key of %d bytes, not %d", len(key), sealKeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("ca: data key: %w", err)
	}
	return cipher.NewGCM(block)
}
