package secrets

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

func TestAWSSourceAgainstMoto(t *testing.T) {
	moto := motoserver.StartT(t)
	ctx := context.Background()
	client := secretsmanager.NewFromConfig(moto.AWSConfig())
	if _, err := client.CreateSecret(ctx, &secretsmanager.CreateSecretInput{
		Name: aws.String("runfleet/acme/OPENAI_API_KEY"), SecretString: aws.String("real-one"),
	}); err != nil {
		t.Fatal(err)
	}
	fake := clock.NewFake(time.Unix(1_800_000_000, 0))
	src, err := NewAWSSource(AWSConfig{Client: client, Prefix: "runfleet/", CacheTTL: 30 * time.Second, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := src.Value(ctx, "acme", "OPENAI_API_KEY"); err != nil || v.Reveal() != "real-one" {
		t.Fatalf("%q %v", v, err)
	}
	if _, err := src.Value(ctx, "acme", "MISSING"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing secret: %v", err)
	}
	// The miss is kept for the TTL (shared/secretcache says why): a secret
	// created now is seen once the TTL has passed.
	if _, err := client.CreateSecret(ctx, &secretsmanager.CreateSecretInput{
		Name: aws.String("runfleet/acme/MISSING"), SecretString: aws.String("created-late"),
	}); err != nil {
		t.Fatal(err)
	}
	// A rotation shows once the cache entry is older than its TTL, not before.
	if _, err := client.PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{
		SecretId: aws.String("runfleet/acme/OPENAI_API_KEY"), SecretString: aws.String("real-two"),
	}); err != nil {
		t.Fatal(err)
	}
	fake.Advance(29 * time.Second)
	if v, _ := src.Value(ctx, "acme", "OPENAI_API_KEY"); v.Reveal() != "real-one" {
		t.Fatalf("inside the TTL: %q", v)
	}
	if _, err := src.Value(ctx, "acme", "MISSING"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("inside the TTL of its miss: %v", err)
	}
	fake.Advance(time.Second)
	if v, _ := src.Value(ctx, "acme", "OPENAI_API_KEY"); v.Reveal() != "real-two" {
		t.Fatalf("after the TTL: %q", v)
	}
	if v, err := src.Value(ctx, "acme", "MISSING"); err != nil || v.Reveal() != "created-late" {
		t.Fatalf("after the TTL of its miss: %q %v", v, err)
	}
	// A failure that is not "absent" is an error, not a withhold.
	moto.Stop()
	fake.Advance(time.Minute)
	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := src.Value(ctx2, "acme", "OPENAI_API_KEY"); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("with moto down: %v", err)
	}
}
