package credentials_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/credentials"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

var moto *motoserver.Server

func TestMain(m *testing.M) {
	os.Exit(motoserver.Run(m, func(s *motoserver.Server) { moto = s }))
}

func TestParseSpec(t *testing.T) {
	for in, want := range map[string]credentials.Spec{
		"":                         {},
		"file:/etc/creds.json":     {Kind: "file", Arg: "/etc/creds.json"},
		"secretsmanager:runfleet/": {Kind: "secretsmanager", Arg: "runfleet/"},
		"secretsmanager:":          {Kind: "secretsmanager"},
	} {
		got, err := credentials.ParseSpec(in)
		if err != nil || got != want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"file:", "vault:x", "/etc/creds.json", "file"} {
		if _, err := credentials.ParseSpec(bad); err == nil || !strings.Contains(err.Error(), "RUNFLEET_CREDENTIALS") {
			t.Errorf("ParseSpec(%q) = %v, want an error naming RUNFLEET_CREDENTIALS", bad, err)
		}
	}
}

func TestUnsetSourceKnowsNoRef(t *testing.T) {
	src, err := credentials.Spec{}.Open(credentials.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.Secret(context.Background(), "host-a")
	if !errors.Is(err, credentials.ErrUnknownRef) || !strings.Contains(err.Error(), "RUNFLEET_CREDENTIALS is not set") {
		t.Fatalf("unset source: %v", err)
	}
}

func TestFileSourceResolvesAndRereadsOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "creds.json")
	write := func(s string, mtime time.Time) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	write(`{"host-a": "secret-a"}`, t0)
	spec, _ := credentials.ParseSpec("file:" + path)
	src, err := spec.Open(credentials.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if got, err := src.Secret(ctx, "host-a"); err != nil || got != "secret-a" {
		t.Fatalf("host-a = %q, %v", got, err)
	}
	_, err = src.Secret(ctx, "host-b")
	if !errors.Is(err, credentials.ErrUnknownRef) || strings.Contains(err.Error(), "secret-a") {
		t.Fatalf("host-b: %v, want ErrUnknownRef without any value", err)
	}
	write(`{"host-a": "secret-a", "host-b": "secret-b"}`, t0.Add(time.Second))
	if got, err := src.Secret(ctx, "host-b"); err != nil || got != "secret-b" {
		t.Fatalf("after the file changed, host-b = %q, %v", got, err)
	}
	if _, err := src.Secret(ctx, "../etc/passwd\n"); !errors.Is(err, credentials.ErrUnknownRef) {
		t.Fatalf("a malformed ref: %v, want ErrUnknownRef", err)
	}
}

// A credentials file replaced by a rename with the same size and
// modification time (a deploy tool writing a rotated file within one
// timestamp tick) is another file: the next lookup reads the new one.
func TestFileSourceSeesAReplacementOfTheSameSizeAndTime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "creds.json")
	mtime := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	write(path, `{"host-a": "secret-1"}`)
	src, err := credentials.NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if got, err := src.Secret(ctx, "host-a"); err != nil || got != "secret-1" {
		t.Fatalf("host-a = %q, %v", got, err)
	}
	write(filepath.Join(dir, "creds.json.new"), `{"host-a": "secret-2"}`)
	if err := os.Rename(filepath.Join(dir, "creds.json.new"), path); err != nil {
		t.Fatal(err)
	}
	if got, err := src.Secret(ctx, "host-a"); err != nil || got != "secret-2" {
		t.Fatalf("after a same-size, same-time replacement host-a = %q, %v; want the new credential", got, err)
	}
}

func TestFileSourceRejectsAMalformedFileWithoutShowingIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "creds.json")
	if err := os.WriteFile(path, []byte(`{"host-a": "secret-a", "host-b": 7`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := credentials.NewFile(path)
	if err == nil || strings.Contains(err.Error(), "secret-a") {
		t.Fatalf("malformed file: %v", err)
	}
	if _, err := credentials.NewFile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Fatal("a missing file was accepted")
	}
}

func TestSecretsManagerSourceOnMoto(t *testing.T) {
	ctx := context.Background()
	client := secretsmanager.NewFromConfig(moto.AWSConfig())
	prefix := motoserver.Unique("runfleet-test-") + "/"
	if _, err := client.CreateSecret(ctx, &secretsmanager.CreateSecretInput{
		Name: aws.String(prefix + "host-a"), SecretString: aws.String("secret-a"),
	}); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	spec, err := credentials.ParseSpec("secretsmanager:" + prefix)
	if err != nil || !spec.NeedsAWS() {
		t.Fatalf("spec %+v %v", spec, err)
	}
	if _, err := spec.Open(credentials.Options{}); err == nil {
		t.Fatal("a secretsmanager source opened without a client")
	}
	src, err := spec.Open(credentials.Options{SecretsManager: client, Clock: clk, CacheTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := src.Secret(ctx, "host-a"); err != nil || got != "secret-a" {
		t.Fatalf("host-a = %q, %v", got, err)
	}
	_, err = src.Secret(ctx, "host-b")
	if !errors.Is(err, credentials.ErrUnknownRef) || !strings.Contains(err.Error(), prefix+"host-b") {
		t.Fatalf("host-b: %v, want ErrUnknownRef naming the secret id", err)
	}
	// The miss is kept for the TTL (shared/secretcache says why): host-b
	// created now is found once the TTL has passed.
	if _, err := client.CreateSecret(ctx, &secretsmanager.CreateSecretInput{
		Name: aws.String(prefix + "host-b"), SecretString: aws.String("secret-b"),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Secret(ctx, "host-b"); !errors.Is(err, credentials.ErrUnknownRef) {
		t.Fatalf("host-b within the TTL of its miss: %v, want ErrUnknownRef", err)
	}

	// A rotation reaches Fleet once the cache entry expires, not before.
	if _, err := client.PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{
		SecretId: aws.String(prefix + "host-a"), SecretString: aws.String("secret-a2"),
	}); err != nil {
		t.Fatal(err)
	}
	if got, _ := src.Secret(ctx, "host-a"); got != "secret-a" {
		t.Fatalf("within the TTL host-a = %q, want the cached value", got)
	}
	clk.Advance(time.Minute)
	if got, _ := src.Secret(ctx, "host-a"); got != "secret-a2" {
		t.Fatalf("after the TTL host-a = %q, want the rotated value", got)
	}
	if got, err := src.Secret(ctx, "host-b"); err != nil || got != "secret-b" {
		t.Fatalf("after the TTL host-b = %q, %v; want the secret created after the miss", got, err)
	}
}
