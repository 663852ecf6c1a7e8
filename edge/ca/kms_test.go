package ca_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/runfleet/runfleet/edge/ca"
	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

func createKMSKey(t *testing.T, client *kms.Client) string {
	t.Helper()
	out, err := client.CreateKey(context.Background(), &kms.CreateKeyInput{Description: aws.String("runfleet edge CA test")})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.KeyMetadata.KeyId)
}

// TestKMSSealer runs against a real moto_server: envelope sealing with
// GenerateDataKey and Decrypt, and a whole CA sealed by it.
func TestKMSSealer(t *testing.T) {
	server := motoserver.StartT(t)
	client := kms.NewFromConfig(server.AWSConfig())
	keyID := createKMSKey(t, client)

	t.Run("contract", func(t *testing.T) {
		sealerContract(t, ca.NewKMSSealer(client, keyID))
	})

	t.Run("another KMS key cannot open it", func(t *testing.T) {
		ctx := context.Background()
		sealed, err := ca.NewKMSSealer(client, keyID).Seal(ctx, []byte("key"), nil)
		if err != nil {
			t.Fatal(err)
		}
		other := ca.NewKMSSealer(client, createKMSKey(t, client))
		if got, err := other.Open(ctx, sealed, nil); err == nil {
			t.Fatalf("a sealer on another KMS key opened it: %q", got)
		} else if !strings.Contains(err.Error(), "KMS cannot decrypt") {
			t.Fatalf("error %q does not say KMS refused", err)
		}
	})

	t.Run("a CA sealed by KMS restarts, and refuses another KMS key", func(t *testing.T) {
		dir := t.TempDir()
		cfg := shortConfig(t, dir, clock.NewFake(epoch))
		cfg.Sealer = ca.NewKMSSealer(client, keyID)
		a := mustOpen(t, cfg)
		bundle := a.Bundle()
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		for path, b := range dirFiles(t, dir) {
			if bytes.Contains(b, []byte("PRIVATE KEY")) {
				t.Errorf("%s holds a PRIVATE KEY block", path)
			}
		}
		a = mustOpen(t, cfg)
		if !bytes.Equal(a.Bundle(), bundle) {
			t.Fatal("a KMS-sealed CA came back different after a restart")
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}

		// ca.kmsKeyId changed to another key: the stored keys cannot be
		// opened, so the start is refused. (moto does not enforce a
		// disabled key on Decrypt, so that case cannot be shown here.)
		cfg.Sealer = ca.NewKMSSealer(client, createKMSKey(t, client))
		b, err := ca.Open(context.Background(), cfg)
		if err == nil {
			b.Close()
			t.Fatal("Open succeeded with another KMS key")
		}
		if !errors.Is(err, ca.ErrSealedKey) || !strings.Contains(err.Error(), "refusing to start") {
			t.Fatalf("Open with another KMS key: %v; want a refusal (ErrSealedKey)", err)
		}
	})
}
