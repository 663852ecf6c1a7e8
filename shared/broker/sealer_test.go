package broker_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"

	"github.com/runfleet/runfleet/shared/broker"
)

// keyFile writes a fresh 32-byte key, mode 0600, and returns its path.
func keyFile(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "broker.key")
	if err := os.WriteFile(path, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// kmsKey creates a symmetric key in moto and returns its id.
func kmsKey(t *testing.T) string {
	t.Helper()
	out, err := kms.NewFromConfig(moto.AWSConfig()).CreateKey(context.Background(), &kms.CreateKeyInput{Description: aws.String("broker test")})
	if err != nil {
		t.Fatal(err)
	}
	return *out.KeyMetadata.KeyId
}

func TestSealersBindToTheirContext(t *testing.T) {
	kmsClient := kms.NewFromConfig(moto.AWSConfig())
	fileSealer, err := broker.OpenSealer("file:"+keyFile(t), broker.SealerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kmsSealer, err := broker.OpenSealer("kms:"+kmsKey(t), broker.SealerOptions{KMS: kmsClient})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	secret := []byte("gho_TokenThatIsSealed")
	for name, s := range map[string]broker.Sealer{"file": fileSealer, "kms": kmsSealer} {
		t.Run(name, func(t *testing.T) {
			sealed, err := s.Seal(ctx, secret, "acme/GH#run-1")
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(sealed, secret) || bytes.Contains(sealed, []byte("Sealed")) {
				t.Fatal("the sealed form holds the plain text")
			}
			got, err := s.Open(ctx, sealed, "acme/GH#run-1")
			if err != nil || !bytes.Equal(got, secret) {
				t.Fatalf("Open = %q, %v", got, err)
			}
			if _, err := s.Open(ctx, sealed, "acme/GH#run-2"); !errors.Is(err, broker.ErrUnopenable) {
				t.Fatalf("a value sealed for one run, opened for another: %v", err)
			}
			damaged := bytes.Clone(sealed)
			damaged[len(damaged)-1] ^= 1
			if _, err := s.Open(ctx, damaged, "acme/GH#run-1"); !errors.Is(err, broker.ErrUnopenable) {
				t.Fatalf("a damaged sealed value: %v", err)
			}
			again, _ := s.Seal(ctx, secret, "acme/GH#run-1")
			if bytes.Equal(again, sealed) {
				t.Fatal("sealing twice gave the same bytes")
			}
		})
	}
	sealed, _ := fileSealer.Seal(ctx, secret, "x")
	if _, err := kmsSealer.Open(ctx, sealed, "x"); !errors.Is(err, broker.ErrUnopenable) || !strings.Contains(err.Error(), "not sealed by KMS") {
		t.Fatalf("a key file's value opened with KMS: %v", err)
	}
	otherKMS, err := broker.OpenSealer("kms:"+kmsKey(t), broker.SealerOptions{KMS: kmsClient})
	if err != nil {
		t.Fatal(err)
	}
	byKMS, err := kmsSealer.Seal(ctx, secret, "x")
	if err != nil {
		t.Fatal(err)
	}
	// KMS answers IncorrectKeyException (unopenable); moto answers
	// AccessDeniedException, which on AWS may be a passing IAM mistake
	// and so is not taken as unopenable: only the refusal is asserted.
	if _, err := otherKMS.Open(ctx, byKMS, "x"); err == nil {
		t.Fatal("a value opened with another KMS key")
	}
	other, err := broker.OpenSealer("file:"+keyFile(t), broker.SealerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Open(ctx, sealed, "x"); !errors.Is(err, broker.ErrUnopenable) || !strings.Contains(err.Error(), "another key") {
		t.Fatalf("a value opened under another key file: %v", err)
	}
}

func TestOpenSealerRefusesUnsafeKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, bytes.Repeat([]byte{7}, n), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for spec, want := range map[string]string{
		"file:" + write("open.key", 32, 0o644):  "must be readable by its owner only",
		"file:" + write("group.key", 32, 0o640): "must be readable by its owner only",
		"file:" + write("short.key", 16, 0o600): "holds 16 bytes",
		"file:" + filepath.Join(dir, "none"):    "no such file",
		"kms:alias/runfleet":                    "needs a KMS client",
		"aes:whatever":                          "want kms:<key id|arn|alias> or file:<path>",
		"":                                      "want kms:",
	} {
		if _, err := broker.OpenSealer(spec, broker.SealerOptions{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("OpenSealer(%q): %v; want an error saying %q", spec, err, want)
		}
	}
}
