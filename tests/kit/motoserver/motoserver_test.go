package motoserver

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/runfleet/runfleet/tests/kit/await"
)

var shared *Server

func TestMain(m *testing.M) {
	os.Exit(Run(m, func(s *Server) { shared = s }))
}

func TestDynamoDBClientReachesTheServer(t *testing.T) {
	ctx := context.Background()
	db := shared.DynamoDB()
	name := Unique("motoserver-table-")
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	out, err := db.ListTables(ctx, &dynamodb.ListTablesInput{})
	if err != nil {
		t.Fatalf("ListTables: %v", err)
	}
	found := false
	for _, n := range out.TableNames {
		found = found || n == name
	}
	if !found {
		t.Fatalf("table %q not listed: %v", name, out.TableNames)
	}
}

// TestConditionalUpdatesAreAtomic shows what the serialising front is for:
// concurrent conditional updates of one item, one winner each round, as on
// DynamoDB.
func TestConditionalUpdatesAreAtomic(t *testing.T) {
	ctx := context.Background()
	db := shared.DynamoDB()
	table := aws.String(Unique("motoserver-atomic-"))
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            table,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	key := map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "x"}}
	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: map[string]types.AttributeValue{
		"id": &types.AttributeValueMemberS{Value: "x"}, "n": &types.AttributeValueMemberN{Value: "0"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		cur := strconv.Itoa(round)
		var wins atomic.Int32
		var wg sync.WaitGroup
		for w := 0; w < 6; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
					TableName:           table,
					Key:                 key,
					UpdateExpression:    aws.String("SET n = :next, w = :w"),
					ConditionExpression: aws.String("n = :cur"),
					ExpressionAttributeValues: map[string]types.AttributeValue{
						":cur":  &types.AttributeValueMemberN{Value: cur},
						":next": &types.AttributeValueMemberN{Value: strconv.Itoa(round + 1)},
						":w":    &types.AttributeValueMemberN{Value: strconv.Itoa(w)},
					},
				})
				var ccf *types.ConditionalCheckFailedException
				switch {
				case err == nil:
					wins.Add(1)
				case !errors.As(err, &ccf):
					t.Errorf("UpdateItem: %v", err)
				}
			}()
		}
		await.Group(t, "the round's conditional updates", &wg)
		if got := wins.Load(); got != 1 {
			t.Fatalf("round %d: %d conditional updates from one state succeeded", round, got)
		}
	}
}

func TestAWSConfigServesOtherServices(t *testing.T) {
	ctx := context.Background()
	sm := secretsmanager.NewFromConfig(shared.AWSConfig())
	name := Unique("motoserver/secret-")
	if _, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{
		Name: aws.String(name), SecretString: aws.String("v1"),
	}); err != nil {
		t.Fatalf("CreateSecret: %v", err)
	}
	got, err := sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(name)})
	if err != nil {
		t.Fatalf("GetSecretValue: %v", err)
	}
	if aws.ToString(got.SecretString) != "v1" {
		t.Fatalf("secret = %q, want v1", aws.ToString(got.SecretString))
	}

	cfg, err := shared.LoadAWSConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := secretsmanager.NewFromConfig(cfg).GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(name)}); err != nil {
		t.Fatalf("GetSecretValue through LoadAWSConfig: %v", err)
	}
}

func TestResetEmptiesTheServer(t *testing.T) {
	s := StartT(t)
	ctx := context.Background()
	db := s.DynamoDB()
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String("reset-me"),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := db.ListTables(ctx, &dynamodb.ListTablesInput{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.TableNames) != 0 {
		t.Fatalf("tables after reset: %v", out.TableNames)
	}

	// Stop ends the whole process group and the port stops answering.
	pgid := s.cmd.Process.Pid
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-pgid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("process group %d still exists after Stop (kill -0: %v)", pgid, err)
	}
	client := &http.Client{Timeout: time.Second}
	for _, u := range []string{s.URL, s.MotoURL} {
		if resp, err := client.Get(u + "/moto-api/"); err == nil {
			resp.Body.Close()
			t.Fatalf("%s still answers after Stop", u)
		}
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestMissingMotoServerSaysHowToInstall(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := lookup("/nonexistent/moto_server")
	if err == nil {
		t.Fatal("lookup found a moto_server in an empty PATH")
	}
	if !strings.Contains(err.Error(), "pip install 'moto[server]'") {
		t.Fatalf("error does not say how to install: %v", err)
	}
}

// TestEnvReachesMoto: Options.Env is how a test turns on moto's signature
// checks; with no unauthenticated calls allowed, the harness's own
// credentials (no IAM user holds them) are refused.
func TestEnvReachesMoto(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	s, err := StartWith(ctx, Options{Env: []string{"INITIAL_NO_AUTH_ACTION_COUNT=0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	_, err = s.DynamoDB().ListTables(ctx, &dynamodb.ListTablesInput{})
	if err == nil {
		t.Fatal("ListTables with credentials no IAM user holds succeeded: the environment did not reach moto")
	}
	if !strings.Contains(err.Error(), "403") {
		t.Fatalf("ListTables: want a 403 refusal, got %v", err)
	}
}
