// Command setup prepares a local moto_server for `sam local` (README: SAM
// local): the DynamoDB tables, the admin token secret and the wake queue
// that infra/sam/env.json names. It assembles Fleet from each function's
// variables in that file as the function's cold start does (fleetapp.New,
// with Deps.CreateTables), so the tables come from the store's own
// definitions, and a run that succeeds means every function starts under
// sam local with that file, once its endpoint is reachable from SAM's
// containers. It is idempotent; moto keeps nothing across restarts, so run
// it after each start of moto_server.
//
//	go run ./infra/sam/setup [-endpoint http://127.0.0.1:4599] [-env-vars infra/sam/env.json]
//
// Every AWS call goes to -endpoint with dummy credentials: it never reaches
// an AWS account.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	awscreds "github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	smtypes "github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleetapp"
)

const (
	defaultEndpoint = "http://127.0.0.1:4599"
	defaultEnvFile  = "infra/sam/env.json"
	// defaultRegion is where the functions look: SAM gives them the region
	// of the shell that runs it (README: AWS_DEFAULT_REGION=us-east-1).
	defaultRegion = "us-east-1"
	// sampleAdminToken is the admin token infra/sam/events' authenticated
	// events carry. Not a secret: it lives only in a local moto.
	sampleAdminToken = "sam-local-admin-token-not-secret"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("setup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoint := fs.String("endpoint", defaultEndpoint, "moto_server's URL as this machine reaches it")
	envFile := fs.String("env-vars", defaultEnvFile, "the file sam local's --env-vars reads")
	region := fs.String("region", defaultRegion, "the region the functions run in under sam local")
	// Empty is the sample token, so that -h does not print a token.
	adminToken := fs.String("admin-token", "", "the admin token to store (default: the one the sample events carry)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: go run ./infra/sam/setup [flags]\n\n"+
			"Creates the tables, the admin token secret and the wake queue that the env file names, in a local\n"+
			"moto_server, for sam local (README: SAM local). Flags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return 2
	}
	if u, err := url.Parse(*endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "setup: -endpoint %q: want moto_server's URL, e.g. %s\n", *endpoint, defaultEndpoint)
		return 2
	}
	if *adminToken == "" {
		*adminToken = sampleAdminToken
	}
	if len(*adminToken) < config.MinAdminTokenLength {
		fmt.Fprintf(stderr, "setup: -admin-token is shorter than %d characters\n", config.MinAdminTokenLength)
		return 2
	}
	envs, err := readEnvFile(*envFile)
	if err != nil {
		fmt.Fprintln(stderr, "setup:", err)
		return 1
	}

	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(*region), awsconfig.WithBaseEndpoint(*endpoint),
		awsconfig.WithCredentialsProvider(awscreds.NewStaticCredentialsProvider("test", "test", "")))
	if err != nil {
		fmt.Fprintln(stderr, "setup: the AWS configuration:", err)
		return 1
	}
	sm := secretsmanager.NewFromConfig(awsCfg)
	// Errors only: a function without an admin token (the scheduled ones)
	// would otherwise warn about it.
	log := fleetapp.NewLogger(stderr, slog.LevelError)

	fmt.Fprintf(stdout, "moto_server at %s, region %s, for %s:\n", *endpoint, *region, *envFile)
	secretsSet, queuesReady := map[string]bool{}, map[string]bool{}
	tablesReady := map[config.Tables]bool{}
	for _, fn := range slices.Sorted(maps.Keys(envs)) {
		env := envs[fn]
		cfg, err := config.FromEnv(func(k string) string { return env[k] })
		if err != nil {
			fmt.Fprintf(stderr, "setup: %s: %s: %v\n", *envFile, fn, err)
			return 1
		}
		if cfg.Store != config.StoreDynamoDB {
			fmt.Fprintf(stderr, "setup: %s: %s: %s=%q: the functions run on dynamodb\n", *envFile, fn, config.EnvStore, cfg.Store)
			return 1
		}
		if id := cfg.AdminTokenSecret; id != "" && cfg.AdminToken == "" && !secretsSet[id] {
			if err := putSecret(ctx, sm, id, *adminToken); err != nil {
				fmt.Fprintln(stderr, "setup:", err, unreachable(err, *endpoint))
				return 1
			}
			secretsSet[id] = true
			whose := "the sample events' admin token"
			if *adminToken != sampleAdminToken {
				whose = "the token given with -admin-token"
			}
			fmt.Fprintf(stdout, "  secret %s: %s\n", id, whose)
		}
		if q := cfg.WakeQueue; q != "" && !queuesReady[q] {
			name, err := createQueue(ctx, sqs.NewFromConfig(awsCfg), q)
			if err != nil {
				fmt.Fprintln(stderr, "setup:", err, unreachable(err, *endpoint))
				return 1
			}
			queuesReady[q] = true
			fmt.Fprintf(stdout, "  queue %s: ready\n", name)
		}
		app, err := fleetapp.New(ctx, cfg, fleetapp.Deps{
			Logger: log, DefaultStore: config.StoreDynamoDB, CreateTables: true,
			LoadAWS: func(context.Context) (aws.Config, error) { return awsCfg, nil },
		})
		if err != nil {
			fmt.Fprintf(stderr, "setup: %s would not start: %v%s\n", fn, err, unreachable(err, *endpoint))
			return 1
		}
		app.Close()
		if !tablesReady[cfg.Tables] {
			tablesReady[cfg.Tables] = true
			fmt.Fprintf(stdout, "  tables %s: ready\n", strings.Join(cfg.Tables.Names(), ", "))
		}
		fmt.Fprintf(stdout, "  %s: starts\n", fn)
	}
	return 0
}

// readEnvFile reads a sam local env file in its per-function form:
// {"<LogicalId>": {"<VARIABLE>": "<value>"}}. The "Parameters" form is
// refused: older SAM CLIs then ignore the per-function objects.
func readEnvFile(path string) (map[string]map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var envs map[string]map[string]string
	if err := json.Unmarshal(b, &envs); err != nil {
		return nil, fmt.Errorf("%s: want {\"<LogicalId>\": {\"<VARIABLE>\": \"<value>\"}}: %w", path, err)
	}
	if _, ok := envs["Parameters"]; ok {
		return nil, fmt.Errorf("%s: give each function its own object, not \"Parameters\"", path)
	}
	if len(envs) == 0 {
		return nil, fmt.Errorf("%s names no function", path)
	}
	return envs, nil
}

// putSecret creates the secret id with value, or gives an existing one that
// value.
func putSecret(ctx context.Context, sm *secretsmanager.Client, id, value string) error {
	_, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(id), SecretString: aws.String(value)})
	var exists *smtypes.ResourceExistsException
	if errors.As(err, &exists) {
		_, err = sm.PutSecretValue(ctx, &secretsmanager.PutSecretValueInput{SecretId: aws.String(id), SecretString: aws.String(value)})
	}
	if err != nil {
		return fmt.Errorf("storing the secret %s: %w", id, err)
	}
	return nil
}

// createQueue creates the queue a wake queue URL names (by its name, the
// URL's last segment: SAM's containers reach moto at another address than
// this machine does), or finds it there.
func createQueue(ctx context.Context, client *sqs.Client, queueURL string) (string, error) {
	u, err := url.Parse(queueURL)
	name := ""
	if err == nil {
		name = u.Path[strings.LastIndex(u.Path, "/")+1:]
	}
	if name == "" {
		return "", fmt.Errorf("%s=%q names no queue", config.EnvWakeQueue, queueURL)
	}
	if _, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)}); err != nil {
		return "", fmt.Errorf("creating the queue %s: %w", name, err)
	}
	return name, nil
}

// unreachable is a hint for an error that says nothing answered.
func unreachable(err error, endpoint string) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return "\n  is moto_server listening at " + endpoint + "? (README: SAM local)"
	}
	return ""
}
