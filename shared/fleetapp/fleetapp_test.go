package fleetapp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/store"
	"github.com/runfleet/runfleet/shared/store/boltstore"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/shared/wake"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
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

// openBolt is the local stack's bolt opener (Deps.OpenBolt).
func openBolt(path string, clk clock.Clock) (StoreCloser, error) {
	return boltstore.Open(path, boltstore.WithClock(clk))
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
		config.EnvTableEgress: names.Egress, config.EnvTableCallers: names.Callers, config.EnvTableIdempotency: names.Idempotency,
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
	// The egress ledger mirror goes to the table RUNFLEET_TABLE_EGRESS names.
	ledger := []store.EgressRecord{{Seq: 1, Data: json.RawMessage(`{"seq":1}`)}}
	if err := app.Store.PutEgress(ctx, "r-wiring", ledger, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	out, err := moto.DynamoDB().Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(names.Egress)})
	if err != nil || len(out.Items) != 1 {
		t.Fatalf("the egress table %s after a mirrored record: %v, %v", names.Egress, out, err)
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
	app, err := New(ctx, cfg, Deps{Logger: discard(), OpenBolt: openBolt, DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db")})
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
	again, err := New(ctx, cfg, Deps{Logger: discard(), OpenBolt: openBolt, DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db")})
	if err != nil {
		t.Fatal(err)
	}
	again.Close()

	// A malformed repository map fails the start.
	os.WriteFile(repos, []byte(`["not a map"]`), 0o600)
	if _, err := New(ctx, cfg, Deps{Logger: discard(), OpenBolt: openBolt, DefaultStore: "bolt:" + filepath.Join(dir, "fleet2.db")}); err == nil {
		t.Fatal("a malformed repository map was accepted")
	}
	if _, err := New(ctx, cfg, Deps{}); err == nil {
		t.Fatal("no logger accepted")
	}
}

// TestBoltOnlyWhereItIsLinked: a process given no bolt opener (a Lambda
// function: none links bbolt) refuses a bolt store at its start, naming
// the setting and what to set instead, and opens no file.
func TestBoltOnlyWhereItIsLinked(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	os.WriteFile(creds, []byte(`{}`), 0o600)
	db := filepath.Join(dir, "fleet.db")
	cfg := fromEnv(t, map[string]string{config.EnvStore: "bolt:" + db, config.EnvCredentials: "file:" + creds})
	_, err := New(context.Background(), cfg, Deps{Logger: discard()})
	want := config.EnvStore + `="bolt:` + db + `": this process opens no bolt store`
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), config.EnvStore+"="+config.StoreDynamoDB) {
		t.Fatalf("a bolt store without an opener: %v, want it to name %s and %s=%s", err, want, config.EnvStore, config.StoreDynamoDB)
	}

	_, err = StartFunction(func(k string) string {
		return map[string]string{config.EnvStore: "bolt:" + db, config.EnvCredentials: "file:" + creds}[k]
	}, io.Discard, Function{Name: "api"})
	if err == nil || !strings.HasPrefix(err.Error(), "api: start: ") || !strings.Contains(err.Error(), want) {
		t.Fatalf("a Lambda function on bolt: %v", err)
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Fatalf("the refused bolt store's file: %v, want none", err)
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
			OpenBolt: openBolt, DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db")})
		if err != nil {
			t.Fatal(err)
		}
		app.Close()
		if warned := strings.Contains(logs.String(), "no admin token"); warned == scheduled {
			t.Errorf("scheduled %v: warned %v: %s", scheduled, warned, logs.String())
		}
	}
	cfg := fromEnv(t, map[string]string{config.EnvCredentials: "file:" + creds, config.EnvAdminTokenSecret: "no/such/secret"})
	deps := Deps{Logger: discard(), OpenBolt: openBolt, DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db"), Scheduled: true,
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

// TestRotatedAdminTokenStopsWorkingWithinTheTTL is the admin token's rotation: a
// warm api re-reads the admin token's secret once RUNFLEET_ADMIN_TOKEN_TTL
// has passed, so the old token works until then and not after, and the new
// one works from then on. While the secret cannot be read the admin gets a
// fault (500), a minted caller still gets in, and no token is logged.
func TestRotatedAdminTokenStopsWorkingWithinTheTTL(t *testing.T) {
	ctx := context.Background()
	sm := secretsmanager.NewFromConfig(moto.AWSConfig())
	secret := motoserver.Unique("rotation") + "/admin-token"
	const oldTok, newTok = "admin-token-before-rotation", "admin-token-after-the-rotation"
	if _, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(secret), SecretString: aws.String(oldTok)}); err != nil {
		t.Fatal(err)
	}
	// The secret is named by its ARN here, as an operator may: the TTL
	// cache must take it as well as a name.
	desc, err := sm.DescribeSecret(ctx, &secretsmanager.DescribeSecretInput{SecretId: aws.String(secret)})
	if err != nil {
		t.Fatal(err)
	}
	names := dynamostore.Prefixed(motoserver.Unique("rotation") + "-")
	cfg := fromEnv(t, map[string]string{
		config.EnvAdminTokenSecret: aws.ToString(desc.ARN), config.EnvAdminTokenTTL: "60s",
		config.EnvDynamoDBEndpoint: moto.URL,
		config.EnvTableHosts:       names.Hosts, config.EnvTableRuns: names.Runs, config.EnvTableEvents: names.Events,
		config.EnvTableEgress: names.Egress, config.EnvTableCallers: names.Callers, config.EnvTableIdempotency: names.Idempotency,
	})
	clk := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	var logs syncbuf.Buffer
	app, err := New(ctx, cfg, Deps{
		Logger: NewLogger(&logs, slog.LevelDebug), Clock: clk, DefaultStore: config.StoreDynamoDB, CreateTables: true,
		LoadAWS: func(context.Context) (aws.Config, error) { return moto.AWSConfig(), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	status := func(tok string) int { return get(t, app, "/fleet/callers", tok).StatusCode }
	if got := status(oldTok); got != 200 {
		t.Fatalf("the admin token before rotation: %d", got)
	}
	minted := post(t, app, "/fleet/callers", oldTok, `{"ownerId":"ci","allowedHosts":"*","allowedProjects":"*"}`)
	callerTok, _ := minted["token"].(string)

	// Rotated in Secrets Manager; the warm api keeps the value it read
	// (at the start, 12:00:00) until the TTL has passed.
	if _, err := sm.PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{SecretId: aws.String(secret), SecretString: aws.String(newTok)}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(59 * time.Second)
	if got, gotNew := status(oldTok), status(newTok); got != 200 || gotNew != 401 {
		t.Fatalf("59 s after the read: old token %d, new token %d; want 200 and 401 (the cached value)", got, gotNew)
	}
	clk.Advance(time.Second)
	if got := status(oldTok); got != 401 {
		t.Fatalf("at the TTL the old token answers %d, want 401", got)
	}
	if got := status(newTok); got != 200 {
		t.Fatalf("at the TTL the new token answers %d, want 200", got)
	}

	// The secret gone: once the cached value expires, the admin is refused
	// as a fault (a client retries), a minted caller is not affected.
	if _, err := sm.DeleteSecret(ctx, &secretsmanager.DeleteSecretInput{SecretId: aws.String(secret), ForceDeleteWithoutRecovery: aws.Bool(true)}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	if got := status(newTok); got != 500 {
		t.Fatalf("with the secret unreadable the admin token answers %d, want 500", got)
	}
	if got := get(t, app, "/fleet/runs", callerTok).StatusCode; got != 200 {
		t.Fatalf("with the admin secret unreadable a minted caller answers %d, want 200", got)
	}
	for _, tok := range []string{oldTok, newTok, callerTok} {
		if tok == "" || strings.Contains(logs.String(), tok) {
			t.Fatalf("a token (%q) reached the logs:\n%s", tok, logs.String())
		}
	}
}

func post(t *testing.T, app *App, path, token, body string) map[string]any {
	t.Helper()
	ev := events.APIGatewayV2HTTPRequest{RawPath: path, Body: body,
		Headers: map[string]string{"authorization": "Bearer " + token, "content-type": "application/json"}}
	ev.RequestContext.HTTP.Method = http.MethodPost
	resp, err := app.API.Handle(context.Background(), ev)
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("POST %s: %d %s %v", path, resp.StatusCode, resp.Body, err)
	}
	var m map[string]any
	json.Unmarshal([]byte(resp.Body), &m)
	return m
}

func TestPlanAdminToken(t *testing.T) {
	const warning = "no admin token: set RUNFLEET_ADMIN_TOKEN or RUNFLEET_ADMIN_TOKEN_SECRET to administer Fleet"
	for _, tc := range []struct {
		name          string
		token, secret string
		scheduled     bool
		want          adminPlan
	}{
		{"a literal token", "tok", "", false, adminPlan{source: adminLiteral}},
		{"a literal token wins over a secret", "tok", "runfleet/admin-token", false, adminPlan{source: adminLiteral}},
		{"a secret", "", "runfleet/admin-token", false, adminPlan{source: adminSecretsManager}},
		{"none, in a process that authenticates callers", "", "", false, adminPlan{source: adminNone, warning: warning}},
		{"the scheduled jobs read none", "tok", "runfleet/admin-token", true, adminPlan{source: adminNone}},
		{"the scheduled jobs miss none", "", "", true, adminPlan{source: adminNone}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planAdminToken(config.Fleet{AdminToken: tc.token, AdminTokenSecret: tc.secret}, tc.scheduled)
			if got != tc.want {
				t.Errorf("planAdminToken = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestStoreSetting(t *testing.T) {
	for _, tc := range []struct{ configured, processDefault, want string }{
		{"bolt:/tmp/a.db", "bolt:/tmp/b.db", "bolt:/tmp/a.db"},
		{"", "bolt:/tmp/b.db", "bolt:/tmp/b.db"},
		{"", "", config.StoreDynamoDB},
	} {
		if got := storeSetting(tc.configured, tc.processDefault); got != tc.want {
			t.Errorf("storeSetting(%q, %q) = %q, want %q", tc.configured, tc.processDefault, got, tc.want)
		}
	}
}

// TestTheBrokerIsReadAtStart: RUNFLEET_BROKER's recipes are read when Fleet
// starts: a bad recipe fails the start naming the variable and the field,
// an empty document is no broker.
func TestTheBrokerIsReadAtStart(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	os.WriteFile(creds, []byte(`{}`), 0o600)
	recipes := filepath.Join(dir, "broker.json")
	start := func(doc string) error {
		t.Helper()
		os.WriteFile(recipes, []byte(doc), 0o600)
		cfg := fromEnv(t, map[string]string{config.EnvCredentials: "file:" + creds, config.EnvBroker: "file:" + recipes})
		app, err := New(context.Background(), cfg, Deps{Logger: discard(), OpenBolt: openBolt, DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db")})
		if err == nil {
			app.Close()
		}
		return err
	}
	err := start(`{"acme/GITHUB_TOKEN": {"githubApp": {"privateKeySecret": "file:app.pem", "installationId": 7, "permissions": {"contents": "write"}}}}`)
	if err == nil || !strings.Contains(err.Error(), `RUNFLEET_BROKER: "acme/GITHUB_TOKEN".githubApp.appId`) {
		t.Fatalf("a recipe without its appId: %v, want the start refused naming the field", err)
	}
	if err := start(`{}`); err != nil {
		t.Fatalf("no recipe: %v", err)
	}
	const recipe = `{"acme/SAAS_TOKEN": {"oauth2": {"tokenUrl": "https://auth.saas.example/token", "clientId": "c",
		"clientSecretSecret": "file:client-secret", "refreshTokenSecret": "file:refresh-token"}}}`
	if err := start(recipe); err == nil || !strings.Contains(err.Error(), config.EnvBrokerKey) {
		t.Fatalf("recipes without %s: %v, want the start refused naming it", config.EnvBrokerKey, err)
	}

	// With its key, the broker is built on the store and answers for its keys.
	key := filepath.Join(dir, "broker.key")
	os.WriteFile(key, bytes.Repeat([]byte{7}, 32), 0o600)
	os.WriteFile(recipes, []byte(recipe), 0o600)
	cfg := fromEnv(t, map[string]string{config.EnvCredentials: "file:" + creds, config.EnvBroker: "file:" + recipes,
		config.EnvBrokerKey: "file:" + key})
	app, err := New(context.Background(), cfg, Deps{Logger: discard(), OpenBolt: openBolt, DefaultStore: "bolt:" + filepath.Join(dir, "fleet.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	b, err := app.openBroker(context.Background(), cfg, Deps{Logger: discard()}, &awsClients{ctx: context.Background()}, nil)
	if err != nil || b == nil {
		t.Fatalf("broker %v, %v", b, err)
	}
	if kind, ok := b.Kind("acme", "SAAS_TOKEN"); !ok || kind != "oauth2" {
		t.Fatalf("Kind(acme, SAAS_TOKEN) = %q, %v", kind, ok)
	}
	if _, ok := b.Kind("acme", "OTHER"); ok {
		t.Fatal("a key without a recipe is brokered")
	}
}

// TestWakeQueueWiring: RUNFLEET_WAKE_QUEUE names the SQS queue Fleet wakes
// through (a message on moto's queue); a process's own waker (the local
// stack's) wins over it; with neither, Fleet wakes nothing and loads no
// AWS configuration for it. The dispatcher handler is built either way.
func TestWakeQueueWiring(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	os.WriteFile(creds, []byte(`{}`), 0o600)
	client := sqs.NewFromConfig(moto.AWSConfig())
	q, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(motoserver.Unique("wakes"))})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(q.QueueUrl)
	open := func(env map[string]string, deps Deps) *App {
		t.Helper()
		env[config.EnvCredentials] = "file:" + creds
		deps.Logger, deps.OpenBolt = discard(), openBolt
		deps.DefaultStore = "bolt:" + filepath.Join(t.TempDir(), "fleet.db")
		app, err := New(ctx, fromEnv(t, env), deps)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { app.Close() })
		return app
	}

	app := open(map[string]string{config.EnvWakeQueue: url},
		Deps{LoadAWS: func(context.Context) (aws.Config, error) { return moto.AWSConfig(), nil }})
	if _, ok := app.Waker.(*wake.SQS); !ok || app.Dispatcher == nil {
		t.Fatalf("waker %T, dispatcher %v: want SQS and a dispatcher", app.Waker, app.Dispatcher)
	}
	if err := app.Waker.Wake(ctx, []fleet.Wake{{HostID: "edge-1", Slots: 1, Reason: fleet.WakeRunEnded}}); err != nil {
		t.Fatal(err)
	}
	got, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10})
	if err != nil || len(got.Messages) != 1 || aws.ToString(got.Messages[0].Body) != `{"v":1,"hostId":"edge-1","slots":1,"reason":"run_ended"}` {
		t.Fatalf("the queue after a wake: %+v, %v", got, err)
	}

	local, err := wake.NewLocal(wake.LocalConfig{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	noAWS := func(context.Context) (aws.Config, error) {
		t.Error("the AWS configuration was loaded for a queue the process does not use")
		return aws.Config{}, errors.New("no AWS here")
	}
	if app := open(map[string]string{config.EnvWakeQueue: url}, Deps{Waker: local, LoadAWS: noAWS}); app.Waker != local {
		t.Fatalf("waker %T, want the process's own", app.Waker)
	}
	if app := open(map[string]string{}, Deps{LoadAWS: noAWS}); app.Waker != nil || app.Dispatcher == nil {
		t.Fatalf("without a queue: waker %v, dispatcher %v; want none and a dispatcher", app.Waker, app.Dispatcher)
	}
}
