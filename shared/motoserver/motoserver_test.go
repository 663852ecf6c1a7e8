package motoserver

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

var shared *Server

func TestMain(m *testing.M) {
	os.Exit(Run(m, func(s *Server) { shared = s }))
}

func TestDynamoDBClientReachesTheServer(t *testing.T) {
	ctx := context.Background()
	db := shared.DynamoDB()
	name := "motoserver-test-table"
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

func TestAWSConfigServesOtherServices(t *testing.T) {
	ctx := context.Background()
	sm := secretsmanager.NewFromConfig(shared.AWSConfig())
	if _, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{
		Name: aws.String("motoserver/test"), SecretString: aws.String("v1"),
	}); err != nil {
		t.Fatalf("CreateSecret: %v", err)
	}
	got, err := sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String("motoserver/test")})
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
	if _, err := secretsmanager.NewFromConfig(cfg).GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String("motoserver/test")}); err != nil {
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
	if resp, err := client.Get(s.URL + "/moto-api/"); err == nil {
		resp.Body.Close()
		t.Fatalf("%s still answers after Stop", s.URL)
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
