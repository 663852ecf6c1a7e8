package tests

import (
	"context"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
)

const pyenvBin = "/root/.pyenv/shims/"

// pyenvTool finds a tool installed with the pyenv Python (cfn-lint), on
// PATH first; a missing one fails the test with how to install it.
func pyenvTool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat(pyenvBin + name); err == nil {
		return pyenvBin + name
	}
	t.Fatalf("%s not found on PATH nor in %s: install it with: pip install cfn-lint", name, pyenvBin)
	return ""
}

func TestTemplateLints(t *testing.T) {
	out, err := exec.Command(pyenvTool(t, "cfn-lint"), "../template.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("cfn-lint template.yaml: %v\n%s", err, out)
	}
}

// cfnTemplate is the part of template.yaml these tests read.
type cfnTemplate struct {
	Globals struct {
		Function struct {
			Runtime       string
			Architectures []string
			Handler       string
			Environment   struct{ Variables map[string]any }
		}
	}
	Resources map[string]struct {
		Type       string
		Metadata   map[string]any
		Properties json.RawMessage
	}
}

type cfnTable struct {
	AttributeDefinitions []struct{ AttributeName, AttributeType string }
	KeySchema            []struct{ AttributeName, KeyType string }
	// Index name -> keys and projection.
	GlobalSecondaryIndexes []struct {
		IndexName  string
		KeySchema  []struct{ AttributeName, KeyType string }
		Projection struct{ ProjectionType string }
	}
	TimeToLiveSpecification *struct {
		AttributeName string
		Enabled       bool
	}
}

// loadTemplate decodes template.yaml (CloudFormation YAML, short-form tags
// included) with cfn-lint's own decoder, into JSON.
func loadTemplate(t *testing.T) cfnTemplate {
	t.Helper()
	py := filepath.Join(filepath.Dir(pyenvTool(t, "cfn-lint")), "python3")
	script := `import json, sys
from cfnlint.decode import decode
tpl, matches = decode(sys.argv[1])
if matches: sys.exit("decode: %s" % matches)
print(json.dumps(tpl, default=str))`
	out, err := exec.Command(py, "-c", script, "../template.yaml").Output()
	if err != nil {
		t.Fatalf("decoding template.yaml: %v", err)
	}
	var tpl cfnTemplate
	if err := json.Unmarshal(out, &tpl); err != nil {
		t.Fatal(err)
	}
	return tpl
}

func TestTemplateApiFunction(t *testing.T) {
	tpl := loadTemplate(t)
	g := tpl.Globals.Function
	if g.Runtime != "provided.al2023" || !reflect.DeepEqual(g.Architectures, []string{"arm64"}) || g.Handler != "bootstrap" {
		t.Fatalf("function globals %+v", g)
	}
	fn := tpl.Resources["ApiFunction"]
	if fn.Type != "AWS::Serverless::Function" || fn.Metadata["BuildMethod"] != "makefile" {
		t.Fatalf("ApiFunction %+v", fn)
	}
	api := tpl.Resources["HttpApi"]
	if api.Type != "AWS::Serverless::HttpApi" {
		t.Fatalf("HttpApi %+v", api)
	}
	known := map[string]bool{}
	for _, n := range []string{config.EnvAdminTokenSecret, config.EnvStore, config.EnvTableHosts, config.EnvTableRuns,
		config.EnvTableEvents, config.EnvTableCallers, config.EnvTableIdempotency, config.EnvCredentials,
		config.EnvRetentionDays, config.EnvLogLevel} {
		known[n] = true
	}
	var props struct {
		Environment struct{ Variables map[string]any }
	}
	json.Unmarshal(fn.Properties, &props)
	vars := tpl.Globals.Function.Environment.Variables
	for k, v := range props.Environment.Variables {
		vars[k] = v
	}
	for name := range vars {
		if !known[name] {
			t.Errorf("template sets %s, which Fleet does not read", name)
		}
	}
	for _, need := range []string{config.EnvTableHosts, config.EnvTableRuns, config.EnvTableEvents, config.EnvTableCallers,
		config.EnvTableIdempotency, config.EnvAdminTokenSecret, config.EnvCredentials} {
		if vars[need] == nil {
			t.Errorf("template does not set %s", need)
		}
	}
}

// TestTemplateTablesMatchTheStore creates the tables with dynamostore on
// moto_server and checks that template.yaml declares the same keys, indexes,
// projections and TTLs.
func TestTemplateTablesMatchTheStore(t *testing.T) {
	tpl := loadTemplate(t)
	ctx := context.Background()
	client := moto.DynamoDB()
	names := dynamostore.Prefixed("tpl-")
	st, err := dynamostore.New(client, dynamostore.Config{Tables: names})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTables(ctx); err != nil {
		t.Fatal(err)
	}
	for resource, table := range map[string]string{
		"HostsTable": names.Hosts, "RunsTable": names.Runs, "EventsTable": names.Events,
		"CallersTable": names.Callers, "IdempotencyTable": names.Idempotency,
	} {
		var declared cfnTable
		if err := json.Unmarshal(tpl.Resources[resource].Properties, &declared); err != nil {
			t.Fatalf("%s: %v", resource, err)
		}
		desc, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := client.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)})
		if err != nil {
			t.Fatal(err)
		}
		want := describeFromStore(desc.Table, ttl)
		got := describeFromTemplate(declared)
		if got != want {
			t.Errorf("%s:\ntemplate %s\nstore    %s", resource, got, want)
		}
	}
}

// describeFromStore and describeFromTemplate render a table's shape as one
// comparable line: attributes, keys, indexes (sorted by name), TTL.
func describeFromStore(d *types.TableDescription, ttl *dynamodb.DescribeTimeToLiveOutput) string {
	var attrs, keys, gsis []string
	for _, a := range d.AttributeDefinitions {
		attrs = append(attrs, aws.ToString(a.AttributeName)+":"+string(a.AttributeType))
	}
	for _, k := range d.KeySchema {
		keys = append(keys, aws.ToString(k.AttributeName)+":"+string(k.KeyType))
	}
	for _, g := range d.GlobalSecondaryIndexes {
		var gk []string
		for _, k := range g.KeySchema {
			gk = append(gk, aws.ToString(k.AttributeName)+":"+string(k.KeyType))
		}
		gsis = append(gsis, aws.ToString(g.IndexName)+"["+strings.Join(gk, ",")+";"+string(g.Projection.ProjectionType)+"]")
	}
	ttlAttr := ""
	if t := ttl.TimeToLiveDescription; t != nil && t.TimeToLiveStatus == types.TimeToLiveStatusEnabled {
		ttlAttr = aws.ToString(t.AttributeName)
	}
	return shape(attrs, keys, gsis, ttlAttr)
}

func describeFromTemplate(d cfnTable) string {
	var attrs, keys, gsis []string
	for _, a := range d.AttributeDefinitions {
		attrs = append(attrs, a.AttributeName+":"+a.AttributeType)
	}
	for _, k := range d.KeySchema {
		keys = append(keys, k.AttributeName+":"+k.KeyType)
	}
	for _, g := range d.GlobalSecondaryIndexes {
		var gk []string
		for _, k := range g.KeySchema {
			gk = append(gk, k.AttributeName+":"+k.KeyType)
		}
		gsis = append(gsis, g.IndexName+"["+strings.Join(gk, ",")+";"+g.Projection.ProjectionType+"]")
	}
	ttlAttr := ""
	if d.TimeToLiveSpecification != nil && d.TimeToLiveSpecification.Enabled {
		ttlAttr = d.TimeToLiveSpecification.AttributeName
	}
	return shape(attrs, keys, gsis, ttlAttr)
}

func shape(attrs, keys, gsis []string, ttl string) string {
	sort.Strings(attrs)
	sort.Strings(gsis)
	return "attrs " + strings.Join(attrs, ",") + "; keys " + strings.Join(keys, ",") +
		"; indexes " + strings.Join(gsis, " ") + "; ttl " + ttl
}

// TestMakeBuildsTheApiFunctionForSAM runs what `sam build` runs and checks
// the result is a static linux/arm64 executable named bootstrap.
func TestMakeBuildsTheApiFunctionForSAM(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("make", "-s", "build-ApiFunction", "ARTIFACTS_DIR="+dir)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build-ApiFunction: %v\n%s", err, out)
	}
	f, err := elf.Open(filepath.Join(dir, "bootstrap"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Machine != elf.EM_AARCH64 || f.Type != elf.ET_EXEC {
		t.Fatalf("bootstrap is %v %v, want an aarch64 executable", f.Machine, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("bootstrap is dynamically linked; CGO_ENABLED=0 should make it static")
		}
	}
}
