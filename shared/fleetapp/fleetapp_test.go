package fleetapp

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/motoserver"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
)

var moto *motoserver.Server

func TestMain(m *testing.M) {
	os.Exit(motoserver.Run(m, func(s *motoserver.Server) { moto = s }))
}

func discard() *slog.Logger { return slog.New(slog.NewJSONHandler(io.Discard, nil)) }

func fromEnv(t *testing.T, env map[string]string) config.Fleet {
	t.Helper()
	cfg, err := config.FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func get(t *testing.T, app *App, path, token string) events.APIGatewayV2HTTPResponse {
	t.Helper()
	ev := events.APIGatewayV2HTTPRequest{RawPath: path, Headers: map[string]string{"authorization": "Bearer " + token}}
	ev.RequestContext.HTTP.Method = http.MethodGet
	resp, err := app.API.Handle(context.Background(), ev)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestAWSWiring builds Fleet the way the api Lambda does, against
// moto_server: DynamoDB through RUNFLEET_DYNAMODB_ENDPOINT and the tables
// named by RUNFLEET_TABLE_*, the admin token and the host credentials from
// Secrets Manager.
func TestAWSWiring(t *testing.T) {
	ctx := context.Background()
	sm := secretsmanager.NewFromConfig(moto.AWSConfig())
	wiring := motoserver.Unique("wiring") + "/"
	for name, value := range map[string]string{
		wiring + "admin-token":  "admin-token-from-secrets-manager",
		wiring + "hosts/host-a": "host-a-credential",
	} {
		if _, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name), SecretString: aws.String(value)}); err != nil {
			t.Fatal(err)
		}
	}
	names := dynamostore.Prefixed(motoserver.Unique("wiring") + "-")
	cfg := fromEnv(t, map[string]string{
		config.EnvAdminTokenSecret: wiring + "admin-token",
		config.EnvCredentials:      "secretsmanager:" + wiring + "hosts/",
		config.EnvDynamoDBEndpoint: moto.URL,
		config.EnvTableHosts:       names.Hosts, config.EnvTableRuns: names.Runs, config.EnvTableEvents: names.Events,
		config.EnvTableCallers: names.Callers, config.EnvTableIdempotency: names.Idempotency,
	})
	app, err := New(ctx, cfg, Deps{
		Logger: discard(), DefaultStore: config.StoreDynamoDB, CreateTables: true,
		LoadAWS: func(context.Context) (aws.Config, error) { return moto.AWSConfig(), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, ok := app.Store.(*dynamostore.Store); !ok || !app.AdminConfigured {
		t.Fatalf("store %T, admin %v", app.Store, app.AdminConfigured)
	}
	if got, err := app.Credentials.Secret(ctx, "host-a"); err != nil || got != "host-a-credential" {
		t.Fatalf("credential = %q, %v", got, err)
	}
	if r := get(t, app, "/fleet/callers", "admin-token-from-secrets-manager"); r.StatusCode != 200 {
		t.Fatalf("admin with the secret's token: %d %s", r.StatusCode, r.Body)
	}
	if r := get(t, app, "/fleet/callers", "not-the-admin-token"); r.StatusCode != 401 {
		t.Fatalf("another token: %d", r.StatusCode)
	}

	// A missing admin secret fails the start, naming the secret.
	cfg.AdminTokenSecret = "wiring/missing"
	_, err = New(ctx, cfg, Deps{Logger: discard(), LoadAWS: func(context.Context) (aws.Config, error) { return moto.AWSConfig(), nil }})
	if err == nil || !strings.Contains(err.Error(), "wiring/missing") {
		t.Fatalf("missing admin secret: %v", err)
	}
}

// TestBoltWiring builds Fleet the way the local stack does.
func TestBoltWiring(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	os.WriteFile(creds, []byte(`{}`), 0o600)
	repos := filepath.Join(dir, "repos.json")
	os.WriteFile(repos, []byte(`{"acme/web":"https://git.example/acme/web.git"}`), 0o600)
	cfg := fromEnv(t, map[string]string{
		config.EnvAdminToken: "local-admin-token-0123", config.EnvCredentials: "file:" + creds,
		config.EnvRepoURLs: "file:" + repos,
	})
	ctx := context.Background()
	app, err := New(ctx, cfg, Deps{Logger: discard(), DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db")})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := app.Store.(*boltstore.Store); !ok {
		t.Fatalf("store %T", app.Store)
	}
	r := get(t, app, "/healthz", "")
	var health map[string]any
	json.Unmarshal([]byte(r.Body), &health)
	if r.StatusCode != 200 || health["ok"] != true {
		t.Fatalf("healthz %d %s", r.StatusCode, r.Body)
	}
	if err := app.Close(); err != nil {
		t.Fatal(err)
	}
	// Closed means the file lock is released: a second open works.
	again, err := New(ctx, cfg, Deps{Logger: discard(), DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db")})
	if err != nil {
		t.Fatal(err)
	}
	again.Close()

	// A malformed repository map fails the start.
	os.WriteFile(repos, []byte(`["not a map"]`), 0o600)
	if _, err := New(ctx, cfg, Deps{Logger: discard(), DefaultStore: "bolt:" + filepath.Join(dir, "fleet2.db")}); err == nil {
		t.Fatal("a malformed repository map was accepted")
	}
	if _, err := New(ctx, cfg, Deps{}); err == nil {
		t.Fatal("no logger accepted")
	}
}

// TestOnlyCallerFacingProcessesMissTheAdminToken: without an admin token,
// the api (and the stream, the local stack) log that Fleet cannot be
// administered; the scheduled probe and sweep authenticate no caller, so
// they neither read the token's secret nor warn on every cold start.
func TestOnlyCallerFacingProcessesMissTheAdminToken(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	os.WriteFile(creds, []byte(`{}`), 0o600)
	for _, scheduled := range []bool{false, true} {
		var logs strings.Builder
		// A secret that does not exist: reading it would fail the start.
		cfg := fromEnv(t, map[string]string{config.EnvCredentials: "file:" + creds})
		app, err := New(context.Background(), cfg, Deps{Logger: NewLogger(&logs, slog.LevelInfo), Scheduled: scheduled,
			DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db")})
		if err != nil {
			t.Fatal(err)
		}
		app.Close()
		if warned := strings.Contains(logs.String(), "no admin token"); warned == scheduled {
			t.Errorf("scheduled %v: warned %v: %s", scheduled, warned, logs.String())
		}
	}
	cfg := fromEnv(t, map[string]string{config.EnvCredentials: "file:" + creds, config.EnvAdminTokenSecret: "no/such/secret"})
	deps := Deps{Logger: discard(), DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db"), Scheduled: true,
		LoadAWS: func(context.Context) (aws.Config, error) { return moto.AWSConfig(), nil }}
	app, err := New(context.Background(), cfg, deps)
	if err != nil {
		t.Fatalf("a scheduled process read the admin token's secret: %v", err)
	}
	app.Close()
	deps.Scheduled = false
	if _, err := New(context.Background(), cfg, deps); err == nil {
		t.Fatal("the api started without its admin token's secret")
	}
}

func TestStartFunctionNamesTheFunctionInItsErrors(t *testing.T) {
	_, err := StartFunction(func(k string) string {
		return map[string]string{config.EnvRetentionDays: "soon"}[k]
	}, io.Discard, Function{Name: "sweep", Scheduled: true})
	if err == nil || !strings.HasPrefix(err.Error(), "sweep: configuration:") || !strings.Contains(err.Error(), config.EnvRetentionDays) {
		t.Fatalf("err = %v", err)
	}
}
