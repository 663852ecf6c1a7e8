package tests

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/api"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/scheduled"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/shared/stream"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// The five functions of template.yaml and the package each one builds.
var templateFunctions = map[string]string{
	"ApiFunction":        "functions/api",
	"StreamFunction":     "functions/stream",
	"SweepFunction":      "functions/sweep",
	"ProbeFunction":      "functions/probe",
	"DispatcherFunction": "functions/dispatcher",
}

// TestTemplateLints runs cfn-lint on template.yaml: no error and no warning.
func TestTemplateLints(t *testing.T) {
	out, err := exec.Command(pyTool(t, "cfn-lint", "cfn-lint"), "--", "../template.yaml").CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("cfn-lint template.yaml: %v\n%s", err, out)
	}
}

// apiRoutes is the api handler's route table as "METHOD /path" lines.
func apiRoutes() []string {
	var out []string
	for _, r := range api.Routes() {
		out = append(out, r.Method+" "+r.Pattern)
	}
	sort.Strings(out)
	return out
}

// diffRoutes names what one side has and the other lacks.
func diffRoutes(t *testing.T, what string, got, want []string) {
	t.Helper()
	for _, r := range got {
		if !containsValue(want, r) {
			t.Errorf("%s has %s, which the api handler does not serve", what, r)
		}
	}
	for _, r := range want {
		if !containsValue(got, r) {
			t.Errorf("%s lacks %s, which the api handler serves", what, r)
		}
	}
}

// TestTemplateRoutesAreTheAPIsRoutes: the HTTP API declares exactly the api
// handler's routes, each its own route to the api function, and nothing
// that would send any other request to a function.
func TestTemplateRoutesAreTheAPIsRoutes(t *testing.T) {
	raw, out := templates(t)
	want := apiRoutes()

	// As written: one HttpApi event per route, on the api function only.
	var declared []string
	for _, fn := range resourcesOfType(raw, "AWS::Serverless::Function") {
		for name, ev := range jsonObj(raw, "Resources", fn, "Properties", "Events") {
			if jsonObj(ev)["Type"] != "HttpApi" {
				continue
			}
			p := jsonObj(ev, "Properties")
			if fn != "ApiFunction" {
				t.Errorf("%s has an HTTP API event %s: only the api function serves the API", fn, name)
				continue
			}
			if jsonObj(p, "ApiId")["Ref"] != "HttpApi" {
				t.Errorf("event %s is not on the HttpApi: %v", name, p["ApiId"])
			}
			method, path := fmt.Sprint(p["Method"]), fmt.Sprint(p["Path"])
			if p["Method"] == nil || p["Path"] == nil || strings.Contains(path, "proxy+") || method == "ANY" {
				t.Errorf("event %s is a catch-all (%s %s): every route must be named", name, method, path)
			}
			declared = append(declared, strings.ToUpper(method)+" "+path)
		}
	}
	sort.Strings(declared)
	diffRoutes(t, "template.yaml", declared, want)

	// As deployed: the HTTP API's definition has those paths and methods,
	// each a payload 2.0 proxy to the api function, and no $default route.
	var deployed []string
	apiRes := jsonObj(out, "Resources", "HttpApi")
	if apiRes["Type"] != "AWS::ApiGatewayV2::Api" {
		t.Fatalf("HttpApi transforms to %v", apiRes["Type"])
	}
	body := jsonObj(apiRes, "Properties", "Body")
	for path, ops := range jsonObj(body, "paths") {
		for method, op := range jsonObj(ops) {
			integ := jsonObj(op, "x-amazon-apigateway-integration")
			if method == "x-amazon-apigateway-any-method" || path == "$default" || strings.Contains(path, "proxy+") {
				t.Errorf("the deployed API has a catch-all %s %s", method, path)
				continue
			}
			uri := fmt.Sprint(jsonObj(integ, "uri")["Fn::Sub"])
			if integ["type"] != "aws_proxy" || integ["payloadFormatVersion"] != "2.0" || !strings.Contains(uri, "${ApiFunction.Arn}") {
				t.Errorf("%s %s integrates as %v", method, path, integ)
			}
			deployed = append(deployed, strings.ToUpper(method)+" "+path)
		}
	}
	sort.Strings(deployed)
	diffRoutes(t, "the transformed HTTP API", deployed, want)
	for _, id := range resourcesOfType(out, "AWS::ApiGatewayV2::Route") {
		t.Errorf("route resource %s: routes come from the API definition, a separate one is a catch-all: %v", id, jsonObj(out, "Resources", id))
	}
	if body["x-amazon-apigateway-any-method"] != nil || jsonObj(body, "paths", "/{proxy+}") != nil {
		t.Error("the API definition has a catch-all")
	}
}

// TestTemplateTransforms checks what SAM makes of template.yaml: the five
// functions, the stream's response-streaming URL (not an API route), the
// schedules, and the outputs.
func TestTemplateTransforms(t *testing.T) {
	_, out := templates(t)
	res := jsonObj(out, "Resources")
	fns := resourcesOfType(out, "AWS::Lambda::Function")
	if strings.Join(fns, " ") != "ApiFunction DispatcherFunction ProbeFunction StreamFunction SweepFunction" {
		t.Fatalf("functions %v", fns)
	}
	for _, id := range fns {
		p := jsonObj(res, id, "Properties")
		if p["Runtime"] != "provided.al2023" || p["Handler"] != "bootstrap" || fmt.Sprint(p["Architectures"]) != "[arm64]" {
			t.Errorf("%s: runtime %v, handler %v, architectures %v", id, p["Runtime"], p["Handler"], p["Architectures"])
		}
		if role := jsonList(jsonObj(p, "Role")["Fn::GetAtt"]); len(role) != 2 || role[0] != id+"Role" {
			t.Errorf("%s runs with role %v, want its own %sRole", id, p["Role"], id)
		}
		if lg := jsonObj(p, "LoggingConfig", "LogGroup")["Ref"]; lg != id+"LogGroup" {
			t.Errorf("%s logs to %v, want its own %sLogGroup", id, lg, id)
		}
		if jsonObj(res, id, "Metadata")["BuildMethod"] != "makefile" {
			t.Errorf("%s is not built by the Makefile", id)
		}
	}

	// The api routes on rawPath: only the $default stage leaves no stage
	// name in front of it.
	stages := resourcesOfType(out, "AWS::ApiGatewayV2::Stage")
	if len(stages) != 1 || jsonObj(res, stages[0], "Properties")["StageName"] != "$default" {
		t.Errorf("HTTP API stages %v: want the $default stage only", stages)
	}

	urls := resourcesOfType(out, "AWS::Lambda::Url")
	if len(urls) != 1 {
		t.Fatalf("function URLs %v, want the stream's only", urls)
	}
	u := jsonObj(res, urls[0], "Properties")
	if jsonObj(u, "TargetFunctionArn")["Ref"] != "StreamFunction" || u["InvokeMode"] != "RESPONSE_STREAM" || u["AuthType"] != "NONE" {
		t.Errorf("stream URL %v: want StreamFunction, RESPONSE_STREAM, AuthType NONE", u)
	}
	if h := jsonStrings(jsonObj(u, "Cors")["AllowHeaders"]); !containsValue(h, "authorization") || !containsValue(h, "last-event-id") {
		t.Errorf("the stream URL's CORS lets through headers %v, want authorization and last-event-id", h)
	}
	public := 0
	for _, id := range resourcesOfType(out, "AWS::Lambda::Permission") {
		p := jsonObj(res, id, "Properties")
		if p["Principal"] == "*" {
			public++
			if jsonObj(p, "FunctionName")["Ref"] != "StreamFunction" || (p["FunctionUrlAuthType"] != "NONE" && p["InvokedViaFunctionUrl"] != true) {
				t.Errorf("permission %s lets anyone invoke %v other than through the stream's URL", id, p)
			}
		}
	}
	if public == 0 {
		t.Error("no permission lets the stream's URL be called")
	}

	schedules := map[string]map[string]any{}
	for _, id := range resourcesOfType(out, "AWS::Scheduler::Schedule") {
		p := jsonObj(res, id, "Properties")
		target := jsonList(jsonObj(p, "Target", "Arn")["Fn::GetAtt"])
		if len(target) != 2 {
			t.Fatalf("schedule %s targets %v", id, p["Target"])
		}
		schedules[fmt.Sprint(target[0])] = p
		if p["Name"] != nil {
			t.Errorf("schedule %s has the fixed name %v: two stacks in one account would clash", id, p["Name"])
		}
		if jsonObj(p, "FlexibleTimeWindow")["Mode"] != "OFF" {
			t.Errorf("schedule %s may run late: %v", id, p["FlexibleTimeWindow"])
		}
	}
	if len(schedules) != 2 || schedules["ProbeFunction"] == nil || schedules["SweepFunction"] == nil {
		t.Fatalf("schedules target %v, want ProbeFunction and SweepFunction", schedules)
	}
	if got := schedules["SweepFunction"]["ScheduleExpression"]; got != "rate(1 minute)" {
		t.Errorf("sweep schedule %v, want rate(1 minute)", got)
	}
	probeRate := jsonObj(schedules["ProbeFunction"]["ScheduleExpression"])["Ref"]
	if probeRate != "ProbeSchedule" || jsonObj(out, "Parameters", "ProbeSchedule")["Default"] != "rate(1 minute)" {
		t.Errorf("probe schedule %v, want the ProbeSchedule parameter defaulting to rate(1 minute)", schedules["ProbeFunction"]["ScheduleExpression"])
	}

	outputs := jsonObj(out, "Outputs")
	if !strings.Contains(fmt.Sprint(outputs["ApiUrl"]), "execute-api") {
		t.Errorf("ApiUrl output %v", outputs["ApiUrl"])
	}
	if fmt.Sprint(jsonObj(outputs, "StreamUrl", "Value")["Fn::GetAtt"]) != "[StreamFunctionUrl FunctionUrl]" {
		t.Errorf("StreamUrl output %v", outputs["StreamUrl"])
	}
	for _, table := range stackTables {
		if jsonObj(outputs, table+"TableName", "Value")["Ref"] != table+"Table" {
			t.Errorf("no output names the %s table", table)
		}
	}
}

// stackTables are the stack's tables, each "<name>Table" in template.yaml
// and the field <name> of dynamostore.TableNames.
var stackTables = []string{"Hosts", "Runs", "Events", "Egress", "Callers", "Idempotency"}

// functionEnv resolves a transformed function's environment for the
// default parameters, with refs for the tables.
func functionEnv(t *testing.T, r *cfnResolver, tpl map[string]any, fn string) map[string]string {
	t.Helper()
	vars := r.mustResolve(t, jsonObj(tpl, "Resources", fn, "Properties", "Environment", "Variables"))
	env := map[string]string{}
	for k, v := range jsonObj(vars) {
		env[k] = fmt.Sprint(v)
	}
	return env
}

// TestTemplateFunctionEnvironments: each function's environment, as
// deployed with the default parameters, is one Fleet's config accepts,
// with DynamoDB, its tables and Secrets Manager, and names only variables
// Fleet reads, and the SDK's endpoint override, empty. Only the functions
// that authenticate callers read the admin token.
func TestTemplateFunctionEnvironments(t *testing.T) {
	_, out := templates(t)
	allowed := []string{config.EnvStore, config.EnvTableHosts, config.EnvTableRuns, config.EnvTableEvents, config.EnvTableEgress,
		config.EnvTableCallers, config.EnvTableIdempotency, config.EnvCredentials, config.EnvRetentionDays,
		config.EnvHostTimeout, config.EnvProbeMaxAge, config.EnvLogLevel, config.EnvAdminTokenSecret, config.EnvAdminTokenTTL,
		config.EnvRepoURLs, config.EnvStreamMaxDuration, config.EnvStreamURL, config.EnvStreamMaxPerCaller, envAWSEndpoint,
		config.EnvBroker, config.EnvBrokerKey, config.EnvWakeQueue, config.EnvQueueTimeout, config.EnvQueueMaxTimeout, config.EnvCapacityClasses}
	for fn := range templateFunctions {
		t.Run(fn, func(t *testing.T) {
			r := newResolver(out, nil)
			for _, table := range stackTables {
				r.refs[table+"Table"] = "runfleet-" + strings.ToLower(table) + "-generated"
			}
			env := functionEnv(t, r, out, fn)
			for name := range env {
				if !containsValue(allowed, name) {
					t.Errorf("%s is set, which Fleet does not read (or must not come from the template)", name)
				}
			}
			cfg, err := config.FromEnv(func(k string) string { return env[k] })
			if err != nil {
				t.Fatalf("Fleet refuses the environment %v: %v", env, err)
			}
			if cfg.Store != config.StoreDynamoDB || cfg.Tables.Runs != "runfleet-runs-generated" || cfg.Tables.Idempotency != "runfleet-idempotency-generated" ||
				cfg.Tables.Egress != "runfleet-egress-generated" {
				t.Errorf("store %q, tables %+v", cfg.Store, cfg.Tables)
			}
			if !cfg.Credentials.NeedsAWS() || env[config.EnvCredentials] != "secretsmanager:runfleet/hosts/" {
				t.Errorf("credentials %q, want secretsmanager:runfleet/hosts/", env[config.EnvCredentials])
			}
			if cfg.RetentionDays != 30 || cfg.HostTimeout != fleet.DefaultHostTimeout {
				t.Errorf("retention %d days, host timeout %v", cfg.RetentionDays, cfg.HostTimeout)
			}
			authenticates := fn == "ApiFunction" || fn == "StreamFunction"
			if got := env[config.EnvAdminTokenSecret]; authenticates != (got != "") || (authenticates && got != "runfleet/admin-token") {
				t.Errorf("admin token secret %q (the api and stream read runfleet/admin-token, the others nothing)", got)
			}
			// The api links a run's stream on the stream function's URL.
			if got, want := cfg.StreamURL, map[bool]string{true: testStreamURL}[fn == "ApiFunction"]; got != want {
				t.Errorf("%s = %q, want %q", config.EnvStreamURL, got, want)
			}
			// The stream's per-caller cap, from its parameter's default.
			if fn == "StreamFunction" && (env[config.EnvStreamMaxPerCaller] != "10" || cfg.StreamMaxPerCaller != 10) {
				t.Errorf("%s = %q, want the parameter's default 10", config.EnvStreamMaxPerCaller, env[config.EnvStreamMaxPerCaller])
			}
			if _, set := env[config.EnvRepoURLs]; set {
				t.Errorf("%s is set with RepoUrlsPath empty", config.EnvRepoURLs)
			}
			if v, set := env[envAWSEndpoint]; !set || v != "" {
				t.Errorf("%s is %q (declared: %v): want it declared and empty, so AWS's endpoints apply and sam local can override it", envAWSEndpoint, v, set)
			}
			// Every function may learn of room and wake the dispatcher
			// through the queue; with the default parameters nothing
			// waits unless it asks, for at most a day, and a quiet host's
			// probe is written every 15 minutes.
			if cfg.WakeQueue != testQueueURL("DispatchWakes") {
				t.Errorf("%s = %q, want the DispatchWakes queue's URL", config.EnvWakeQueue, cfg.WakeQueue)
			}
			if cfg.QueueTimeout != 0 || cfg.QueueMaxTimeout != fleet.DefaultQueueMaxTimeout || cfg.CapacityClasses != nil {
				t.Errorf("queue timeout %v, max %v, capacity classes %v: want none, 24h, none", cfg.QueueTimeout, cfg.QueueMaxTimeout, cfg.CapacityClasses)
			}
			if cfg.ProbeMaxAge != fleet.DefaultProbeMaxAge || cfg.ProbeRefresh != fleet.DefaultProbeMaxAge/2 {
				t.Errorf("probe max age %v, refresh %v: want the defaults, 30m and 15m", cfg.ProbeMaxAge, cfg.ProbeRefresh)
			}
		})
	}

	// The queue's parameters reach every function as written.
	qr := newResolver(out, map[string]any{"QueueTimeout": "15m", "QueueMaxTimeout": "2h", "CapacityClasses": "claude?pool=gpu,shell"})
	for _, table := range stackTables {
		qr.refs[table+"Table"] = table
	}
	for fn := range templateFunctions {
		env := functionEnv(t, qr, out, fn)
		cfg, err := config.FromEnv(func(k string) string { return env[k] })
		if err != nil || cfg.QueueTimeout != 15*time.Minute || cfg.QueueMaxTimeout != 2*time.Hour || strings.Join(cfg.CapacityClasses, ",") != "claude?pool=gpu,shell" {
			t.Errorf("%s with the queue's parameters set: %v %v %v, %v", fn, cfg.QueueTimeout, cfg.QueueMaxTimeout, cfg.CapacityClasses, err)
		}
	}

	// The optional repository map reaches the api, as a file.
	r := newResolver(out, map[string]any{"RepoUrlsPath": "/opt/repo-urls.json"})
	for _, table := range stackTables {
		r.refs[table+"Table"] = table
	}
	if got := functionEnv(t, r, out, "ApiFunction")[config.EnvRepoURLs]; got != "file:/opt/repo-urls.json" {
		t.Errorf("with RepoUrlsPath set, %s = %q", config.EnvRepoURLs, got)
	}
}

// envAWSEndpoint is the AWS SDKs' endpoint override (for every service),
// which template.yaml declares empty so that sam local can set it.
const envAWSEndpoint = "AWS_ENDPOINT_URL"

// TestEmptyAWSEndpointURLIsAWS: the SDK reads template.yaml's empty
// AWS_ENDPOINT_URL as unset, so deployed functions call AWS's endpoints;
// a value (sam local's) is every client's base endpoint.
func TestEmptyAWSEndpointURLIsAWS(t *testing.T) {
	for _, tc := range []struct{ value, want string }{{"", "<nil>"}, {"http://host.docker.internal:4599", "http://host.docker.internal:4599"}} {
		t.Setenv(envAWSEndpoint, tc.value)
		cfg, err := awsconfig.LoadDefaultConfig(context.Background(), awsconfig.WithRegion("us-east-1"))
		must(t, err)
		got := "<nil>"
		if cfg.BaseEndpoint != nil {
			got = *cfg.BaseEndpoint
		}
		if got != tc.want {
			t.Errorf("%s=%q: base endpoint %s, want %s", envAWSEndpoint, tc.value, got, tc.want)
		}
	}
}

// TestTemplateTimeoutsFitTheBudgets checks the timeouts against the budgets
// the handlers take from them: the api outlasts a host call and ends before
// API Gateway gives up; the scheduled jobs keep a real budget and end
// before the next minute's run; the dispatcher has room for a fallback;
// the stream ends itself before Lambda does.
func TestTemplateTimeoutsFitTheBudgets(t *testing.T) {
	_, out := templates(t)
	r := newResolver(out, nil)
	for _, table := range stackTables {
		r.refs[table+"Table"] = table
	}
	timeout := func(fn string) time.Duration {
		s := fmt.Sprint(jsonObj(out, "Resources", fn, "Properties")["Timeout"])
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%s timeout %q", fn, s)
		}
		return time.Duration(n) * time.Second
	}
	env := func(fn string) config.Fleet {
		e := functionEnv(t, r, out, fn)
		cfg, err := config.FromEnv(func(k string) string { return e[k] })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const gatewayLimit = 30 * time.Second // API Gateway HTTP API integration timeout
	if api, host := timeout("ApiFunction"), env("ApiFunction").HostTimeout; api < host+3*time.Second || api >= gatewayLimit {
		t.Errorf("api timeout %v: want above the host timeout %v with room for the writes, below API Gateway's %v", api, host, gatewayLimit)
	}
	sweep := timeout("SweepFunction")
	if budget := sweep - env("SweepFunction").HostTimeout - scheduled.DefaultSweepMargin; budget < 30*time.Second || sweep >= time.Minute {
		t.Errorf("sweep timeout %v leaves a budget of %v: want 30 s or more, ending within the minute", sweep, budget)
	}
	probe := timeout("ProbeFunction")
	if budget := probe - scheduled.DefaultProbeMargin; budget < 6*env("ProbeFunction").ProbeTimeout || probe >= time.Minute {
		t.Errorf("probe timeout %v leaves a budget of %v: want several probe timeouts, ending within the minute", probe, budget)
	}
	// The dispatcher: a start that needs a second host (a refusal, the
	// fallback's next) still ends within one invocation.
	if d, host := timeout("DispatcherFunction"), env("DispatcherFunction").HostTimeout; d < 2*host+5*time.Second {
		t.Errorf("dispatcher timeout %v: want room for two host calls of %v and the writes", d, host)
	}
	streamTimeout, maxDur := timeout("StreamFunction"), env("StreamFunction").StreamMaxDuration
	if streamTimeout != 15*time.Minute || maxDur > streamTimeout-stream.DefaultEndMargin {
		t.Errorf("stream timeout %v with RUNFLEET_STREAM_MAX_DURATION %v: want Lambda's 15 m and the stream ending %v before it",
			streamTimeout, maxDur, stream.DefaultEndMargin)
	}
	// The long-poll's wait, its margin and a cold start fit the api's timeout.
	if apiTimeout := timeout("ApiFunction"); apiTimeout < api.MaxEventsWait+3*time.Second {
		t.Errorf("api timeout %v: want room for the events route's %v long-poll", apiTimeout, api.MaxEventsWait)
	}
	// The streams have a ceiling of their own, below the account's pool
	// less the 100 Lambda keeps unreserved, and above one caller's cap.
	reserved, err := strconv.Atoi(fmt.Sprint(r.mustResolve(t, jsonObj(out, "Resources", "StreamFunction", "Properties")["ReservedConcurrentExecutions"])))
	if err != nil || reserved < 1 || reserved > 900 || reserved < 2*env("StreamFunction").StreamMaxPerCaller {
		t.Errorf("stream reserved concurrency %d (%v): want 1..900 and at least two callers' caps (%d each)", reserved, err, env("StreamFunction").StreamMaxPerCaller)
	}
}

type cfnTable struct {
	BillingMode          string
	AttributeDefinitions []struct{ AttributeName, AttributeType string }
	KeySchema            []struct{ AttributeName, KeyType string }
	// Index name -> keys and projection.
	GlobalSecondaryIndexes []struct {
		IndexName  string
		KeySchema  []struct{ AttributeName, KeyType string }
		Projection struct {
			ProjectionType   string
			NonKeyAttributes []string
		}
	}
	TimeToLiveSpecification *struct {
		AttributeName string
		Enabled       bool
	}
	PointInTimeRecoverySpecification *struct{ PointInTimeRecoveryEnabled bool }
}

// TestTemplateTablesMatchTheStore creates the tables with dynamostore on
// moto_server and checks that template.yaml declares the same keys, indexes,
// projections and TTLs, on demand, with point-in-time recovery on every
// table but the idempotency keys'.
func TestTemplateTablesMatchTheStore(t *testing.T) {
	raw, _ := templates(t)
	ctx := context.Background()
	client := moto.DynamoDB()
	names := dynamostore.Prefixed(motoserver.Unique("tpl") + "-")
	st, err := dynamostore.New(client, dynamostore.Config{Tables: names})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTables(ctx); err != nil {
		t.Fatal(err)
	}
	tables := map[string]string{
		"HostsTable": names.Hosts, "RunsTable": names.Runs, "EventsTable": names.Events, "EgressTable": names.Egress,
		"CallersTable": names.Callers, "IdempotencyTable": names.Idempotency,
	}
	if got := resourcesOfType(raw, "AWS::DynamoDB::Table"); len(got) != len(tables) {
		t.Errorf("template tables %v, want %d", got, len(tables))
	}
	for resource, table := range tables {
		b, _ := json.Marshal(jsonObj(raw, "Resources", resource, "Properties"))
		var declared cfnTable
		if err := json.Unmarshal(b, &declared); err != nil {
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
		if declared.BillingMode != "PAY_PER_REQUEST" {
			t.Errorf("%s billing %q, want PAY_PER_REQUEST", resource, declared.BillingMode)
		}
	}
	// What cannot be had again if lost: the runs, their events and egress
	// ledgers (the hosts may since have purged theirs), the hosts and the
	// callers.
	for _, resource := range []string{"HostsTable", "RunsTable", "EventsTable", "EgressTable", "CallersTable"} {
		b, _ := json.Marshal(jsonObj(raw, "Resources", resource, "Properties"))
		var declared cfnTable
		json.Unmarshal(b, &declared)
		if p := declared.PointInTimeRecoverySpecification; p == nil || !p.PointInTimeRecoveryEnabled {
			t.Errorf("%s has no point-in-time recovery", resource)
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
		gsis = append(gsis, aws.ToString(g.IndexName)+"["+strings.Join(gk, ",")+";"+string(g.Projection.ProjectionType)+
			projected(g.Projection.NonKeyAttributes)+"]")
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
		gsis = append(gsis, g.IndexName+"["+strings.Join(gk, ",")+";"+g.Projection.ProjectionType+
			projected(g.Projection.NonKeyAttributes)+"]")
	}
	ttlAttr := ""
	if d.TimeToLiveSpecification != nil && d.TimeToLiveSpecification.Enabled {
		ttlAttr = d.TimeToLiveSpecification.AttributeName
	}
	return shape(attrs, keys, gsis, ttlAttr)
}

// projected renders an INCLUDE projection's attributes, sorted.
func projected(attrs []string) string {
	if len(attrs) == 0 {
		return ""
	}
	sorted := append([]string(nil), attrs...)
	sort.Strings(sorted)
	return " " + strings.Join(sorted, ",")
}

func shape(attrs, keys, gsis []string, ttl string) string {
	sort.Strings(attrs)
	sort.Strings(gsis)
	return "attrs " + strings.Join(attrs, ",") + "; keys " + strings.Join(keys, ",") +
		"; indexes " + strings.Join(gsis, " ") + "; ttl " + ttl
}

// TestMakeBuildsEveryFunctionForSAM runs what `sam build` runs for each
// function of template.yaml (make build-<LogicalId> into ARTIFACTS_DIR) and
// checks the result: a static linux/arm64 executable named bootstrap,
// built from that function's package with -tags lambda.norpc.
func TestMakeBuildsEveryFunctionForSAM(t *testing.T) {
	raw, _ := templates(t)
	fns := resourcesOfType(raw, "AWS::Serverless::Function")
	if len(fns) != len(templateFunctions) {
		t.Fatalf("template functions %v", fns)
	}
	for _, fn := range fns {
		t.Run(fn, func(t *testing.T) {
			if jsonObj(raw, "Resources", fn, "Metadata")["BuildMethod"] != "makefile" {
				t.Fatalf("%s has no BuildMethod: makefile", fn)
			}
			dir := t.TempDir()
			cmd := exec.Command("make", "-s", "build-"+fn, "ARTIFACTS_DIR="+dir)
			cmd.Dir = ".."
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("make build-%s: %v\n%s", fn, err, out)
			}
			bin := filepath.Join(dir, "bootstrap")
			f, err := elf.Open(bin)
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
			info, err := exec.Command("go", "version", "-m", bin).Output()
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"path\tgithub.com/runfleet/runfleet/" + templateFunctions[fn] + "\n",
				"-tags=lambda.norpc", "CGO_ENABLED=0", "GOARCH=arm64", "GOOS=linux"} {
				if !strings.Contains(string(info), want) {
					t.Errorf("build info lacks %q:\n%s", want, info)
				}
			}
		})
	}
}

// routeCost is what one request of a route costs, which its throttle is
// sized for (template.yaml, HttpApi RouteSettings). Every api route has
// one, so a new route forces the choice.
var routeCost = map[string]string{
	"GET /healthz":                    "read",
	"GET /fleet/hosts":                "read",
	"GET /fleet/runs":                 "read",
	"GET /ui":                         "read", // the dashboard: no store call at all
	"GET /ui/{file}":                  "read",
	"GET /fleet/runs/{id}":            "hostCall", // refreshed from the host
	"POST /fleet/runs":                "hostCall",
	"POST /fleet/runs/{id}/input":     "hostCall",
	"POST /fleet/runs/{id}/cancel":    "hostCall",
	"POST /fleet/runs/{id}/retry":     "hostCall",
	"GET /fleet/runs/{id}/events":     "longPoll",
	"GET /fleet/runs/{id}/egress":     "hostCall", // verify=true reads all of the mirror and asks the host for its seal
	"POST /fleet/hosts":               "admin",
	"POST /fleet/hosts/{id}/enable":   "admin",
	"DELETE /fleet/hosts/{id}":        "admin",
	"POST /fleet/hosts/{id}/probe":    "admin",
	"POST /fleet/hosts/{id}/drain":    "admin",
	"POST /fleet/hosts/{id}/resume":   "admin",
	"GET /fleet/capacity":             "admin", // a scan of the hosts and the queue's classes: no host call
	"POST /fleet/callers":             "admin",
	"GET /fleet/callers":              "admin",
	"DELETE /fleet/callers/{ownerId}": "admin",
	"POST /fleet/probe":               "fanOut",
	"GET /metrics":                    "fanOut",
}

// TestTemplateThrottlesEveryRouteByItsCost: the HTTP API's stage throttles
// each of the api handler's routes on its own (route keys exactly the
// handler's), each with parameters for its rate and burst, and with the
// default parameters a costlier kind of route is held no looser than a
// cheaper one: fan-out <= admin <= host call <= DynamoDB-only read, and a
// long-poll <= a read.
func TestTemplateThrottlesEveryRouteByItsCost(t *testing.T) {
	raw, out := templates(t)
	routes := apiRoutes()
	var costed []string
	for r := range routeCost {
		costed = append(costed, r)
	}
	sort.Strings(costed)
	diffRoutes(t, "the test's cost table", costed, routes)

	settings := jsonObj(raw, "Resources", "HttpApi", "Properties", "RouteSettings")
	if d := jsonObj(raw, "Resources", "HttpApi", "Properties", "DefaultRouteSettings"); d != nil {
		t.Errorf("DefaultRouteSettings %v: every route has its own throttle, a default one would hide a route without", d)
	}
	var keys []string
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	diffRoutes(t, "HttpApi RouteSettings", keys, routes)

	// As deployed: the $default stage carries them.
	stages := resourcesOfType(out, "AWS::ApiGatewayV2::Stage")
	if len(stages) != 1 {
		t.Fatalf("stages %v", stages)
	}
	deployed := jsonObj(out, "Resources", stages[0], "Properties", "RouteSettings")
	r := newResolver(out, nil)
	rate := map[string]float64{}
	for _, route := range routes {
		s := jsonObj(deployed, route)
		var limits [2]float64
		for i, field := range []string{"ThrottlingRateLimit", "ThrottlingBurstLimit"} {
			param := fmt.Sprint(jsonObj(s[field])["Ref"])
			if jsonObj(out, "Parameters", param)["Type"] != "Number" {
				t.Errorf("%s %s is %v, want a Number parameter", route, field, s[field])
				continue
			}
			v, err := strconv.ParseFloat(fmt.Sprint(r.mustResolve(t, s[field])), 64)
			if err != nil || v < 1 {
				t.Errorf("%s %s defaults to %v", route, field, r.mustResolve(t, s[field]))
			}
			limits[i] = v
		}
		if limits[0] > limits[1] {
			t.Errorf("%s: rate %v above its burst %v", route, limits[0], limits[1])
		}
		rate[route] = limits[0]
	}
	// The loosest rate of each kind must not exceed the tightest of the kind
	// that costs less.
	byCost := map[string][2]float64{} // kind -> min, max rate
	for route, kind := range routeCost {
		mm, ok := byCost[kind]
		if !ok {
			mm = [2]float64{rate[route], rate[route]}
		}
		mm[0], mm[1] = min(mm[0], rate[route]), max(mm[1], rate[route])
		byCost[kind] = mm
	}
	for _, pair := range [][2]string{{"fanOut", "admin"}, {"admin", "hostCall"}, {"hostCall", "read"}, {"longPoll", "read"}} {
		dear, cheap := byCost[pair[0]], byCost[pair[1]]
		if dear[1] > cheap[0] {
			t.Errorf("%s routes may take %v/s, more than %s routes' %v/s: a dearer request is throttled looser than a cheaper one", pair[0], dear[1], pair[1], cheap[0])
		}
	}
	// Admin routes are among the admin or fan-out kinds, whatever the table says.
	for _, spec := range api.Routes() {
		if kind := routeCost[spec.Method+" "+spec.Pattern]; spec.Admin && kind != "admin" && kind != "fanOut" {
			t.Errorf("admin route %s %s is costed as %s", spec.Method, spec.Pattern, kind)
		}
	}
}

// TestTemplateTablesAreDeletionProtected: every table refuses DeleteTable
// until its protection is turned off, and is retained when the stack is
// deleted or a change would replace it.
func TestTemplateTablesAreDeletionProtected(t *testing.T) {
	_, out := templates(t)
	tables := resourcesOfType(out, "AWS::DynamoDB::Table")
	if len(tables) != len(stackTables) {
		t.Fatalf("tables %v", tables)
	}
	for _, id := range tables {
		res := jsonObj(out, "Resources", id)
		if p := jsonObj(res, "Properties"); p["DeletionProtectionEnabled"] != true {
			t.Errorf("%s: DeletionProtectionEnabled %v, want true", id, p["DeletionProtectionEnabled"])
		}
		if res["DeletionPolicy"] != "Retain" || res["UpdateReplacePolicy"] != "Retain" {
			t.Errorf("%s: DeletionPolicy %v, UpdateReplacePolicy %v, want Retain", id, res["DeletionPolicy"], res["UpdateReplacePolicy"])
		}
	}
}

// getAtt names the resource of a {"Fn::GetAtt": [id, attr]} and checks the attribute.
func getAtt(v any, attr string) string {
	ga := jsonList(jsonObj(v)["Fn::GetAtt"])
	if len(ga) != 2 || ga[1] != attr {
		return ""
	}
	return fmt.Sprint(ga[0])
}

// TestTemplateSchedulesHaveADeadLetterQueue: each schedule's failure
// lands in an encrypted queue, either way it fails: an invocation
// Scheduler cannot deliver (its DeadLetterConfig, its role allowed to
// send there) and one the function fails (its on-failure destination);
// neither is retried, since the next run comes a minute later.
func TestTemplateSchedulesHaveADeadLetterQueue(t *testing.T) {
	_, out := templates(t)
	res := jsonObj(out, "Resources")
	schedules := resourcesOfType(out, "AWS::Scheduler::Schedule")
	if len(schedules) != 2 {
		t.Fatalf("schedules %v", schedules)
	}
	for _, id := range schedules {
		target := jsonObj(res, id, "Properties", "Target")
		fn := getAtt(target["Arn"], "Arn")
		queue := getAtt(jsonObj(target, "DeadLetterConfig")["Arn"], "Arn")
		q := jsonObj(res, queue)
		if queue == "" || q["Type"] != "AWS::SQS::Queue" {
			t.Errorf("schedule %s has no dead-letter queue: %v", id, target["DeadLetterConfig"])
			continue
		}
		if p := jsonObj(q, "Properties"); p["SqsManagedSseEnabled"] != true && p["KmsMasterKeyId"] == nil {
			t.Errorf("queue %s is not encrypted: %v", queue, p)
		}
		if rp := jsonObj(target, "RetryPolicy"); fmt.Sprint(rp["MaximumRetryAttempts"]) != "0" || rp["MaximumEventAgeInSeconds"] == nil {
			t.Errorf("schedule %s retry policy %v: want no retry and a bounded event age", id, rp)
		}
		role := getAtt(target["RoleArn"], "Arn")
		sends := false
		for _, p := range jsonList(jsonObj(res, role, "Properties")["Policies"]) {
			for _, st := range jsonList(jsonObj(p, "PolicyDocument")["Statement"]) {
				s := jsonObj(st)
				if s["Effect"] == "Allow" && s["Action"] == "sqs:SendMessage" && getAtt(s["Resource"], "Arn") == queue {
					sends = true
				}
			}
		}
		if !sends {
			t.Errorf("schedule %s's role %s may not send to %s", id, role, queue)
		}

		// The function's own failures: no Lambda retry, the record to the same queue.
		var eic map[string]any
		for _, e := range resourcesOfType(out, "AWS::Lambda::EventInvokeConfig") {
			if p := jsonObj(res, e, "Properties"); jsonObj(p, "FunctionName")["Ref"] == fn {
				eic = p
			}
		}
		if eic == nil {
			t.Errorf("%s has no EventInvokeConfig: Lambda would retry a failed run twice and then drop it", fn)
			continue
		}
		if fmt.Sprint(eic["MaximumRetryAttempts"]) != "0" {
			t.Errorf("%s: MaximumRetryAttempts %v, want 0 (a retry overlaps the next run)", fn, eic["MaximumRetryAttempts"])
		}
		if dest := getAtt(jsonObj(eic, "DestinationConfig", "OnFailure")["Destination"], "Arn"); dest != queue {
			t.Errorf("%s's on-failure destination is %v, want %s", fn, jsonObj(eic, "DestinationConfig"), queue)
		}
	}
}

// alarmMetric is one metric an alarm reads.
type alarmMetric struct {
	namespace, name string
	dims            map[string]any // dimension name -> its value as written
}

// alarmMetrics lists the metrics of an alarm, whether on one metric or a
// metric math expression, and checks that the expression names only
// metrics of the alarm.
func alarmMetrics(t *testing.T, id string, p map[string]any) []alarmMetric {
	t.Helper()
	dims := func(v any) map[string]any {
		m := map[string]any{}
		for _, d := range jsonList(v) {
			m[fmt.Sprint(jsonObj(d)["Name"])] = jsonObj(d)["Value"]
		}
		return m
	}
	if p["MetricName"] != nil {
		return []alarmMetric{{fmt.Sprint(p["Namespace"]), fmt.Sprint(p["MetricName"]), dims(p["Dimensions"])}}
	}
	var out []alarmMetric
	ids := map[string]bool{}
	var exprs []string
	returned := 0
	for _, q := range jsonList(p["Metrics"]) {
		qm := jsonObj(q)
		if qm["ReturnData"] == true {
			returned++
		}
		if e, ok := qm["Expression"].(string); ok {
			exprs = append(exprs, e)
			continue
		}
		ids[fmt.Sprint(qm["Id"])] = true
		m := jsonObj(qm, "MetricStat", "Metric")
		out = append(out, alarmMetric{fmt.Sprint(m["Namespace"]), fmt.Sprint(m["MetricName"]), dims(m["Dimensions"])})
	}
	if returned != 1 || len(exprs) != 1 {
		t.Errorf("alarm %s: %d expressions, %d returned: want one expression, the one returned", id, len(exprs), returned)
	}
	for _, e := range exprs {
		for _, ref := range regexp.MustCompile(`\b[a-z][A-Za-z0-9_]*\b`).FindAllString(e, -1) {
			if !ids[ref] {
				t.Errorf("alarm %s: expression %q names %s, which is none of its metrics", id, e, ref)
			}
		}
		used := 0
		for mid := range ids {
			if regexp.MustCompile(`\b` + mid + `\b`).MatchString(e) {
				used++
			}
		}
		if used != len(ids) {
			t.Errorf("alarm %s: expression %q leaves out some of its metrics %v", id, e, ids)
		}
	}
	return out
}

// TestTemplateAlarmsWatchWhatExists: every alarm reads a metric that the
// stack's resources publish (each dimension naming a resource of the right
// kind, or an index its table has) or the sweep's lag, and notifies the
// alarm topic; and every function's errors and throttles, the API's 5xx,
// every table's and index's throttling, the sweep's lag, the schedules'
// and the wakes' dead letters and the oldest wake's age have an alarm.
func TestTemplateAlarmsWatchWhatExists(t *testing.T) {
	_, out := templates(t)
	res := jsonObj(out, "Resources")
	refTo := func(v any, typ string) (string, bool) {
		id := fmt.Sprint(jsonObj(v)["Ref"])
		return id, jsonObj(res, id)["Type"] == typ
	}
	indexes := func(table string) []string {
		var names []string
		for _, g := range jsonList(jsonObj(res, table, "Properties")["GlobalSecondaryIndexes"]) {
			names = append(names, fmt.Sprint(jsonObj(g)["IndexName"]))
		}
		return names
	}
	covered := map[string]bool{}
	alarms := resourcesOfType(out, "AWS::CloudWatch::Alarm")
	for _, id := range alarms {
		p := jsonObj(res, id, "Properties")
		for _, field := range []string{"AlarmActions", "OKActions"} {
			if acts := jsonList(p[field]); len(acts) != 1 || jsonObj(acts[0])["Ref"] != "AlarmTopic" {
				t.Errorf("alarm %s %s %v, want the alarm topic", id, field, p[field])
			}
		}
		if p["TreatMissingData"] == nil {
			t.Errorf("alarm %s does not say what missing data means", id)
		}
		for _, m := range alarmMetrics(t, id, p) {
			key := m.namespace + "/" + m.name
			switch key {
			case "AWS/Lambda/Errors", "AWS/Lambda/Throttles", "AWS/Lambda/Invocations":
				fn, ok := refTo(m.dims["FunctionName"], "AWS::Lambda::Function")
				if !ok || len(m.dims) != 1 {
					t.Errorf("alarm %s: %s of %v, not one of the stack's functions", id, key, m.dims)
				}
				covered[key+" "+fn] = true
			case "AWS/ApiGateway/5xx":
				api, ok := refTo(m.dims["ApiId"], "AWS::ApiGatewayV2::Api")
				if !ok || len(m.dims) != 1 {
					t.Errorf("alarm %s: %s of %v, not the stack's HTTP API", id, key, m.dims)
				}
				covered[key+" "+api] = true
			case "AWS/DynamoDB/ReadThrottleEvents", "AWS/DynamoDB/WriteThrottleEvents":
				table, ok := refTo(m.dims["TableName"], "AWS::DynamoDB::Table")
				target := table
				if gsi, set := m.dims["GlobalSecondaryIndexName"]; set {
					if !containsValue(indexes(table), fmt.Sprint(gsi)) {
						t.Errorf("alarm %s: %s of an index %v the table %s does not have", id, key, gsi, table)
					}
					target += "/" + fmt.Sprint(gsi)
				}
				if !ok || len(m.dims) > 2 {
					t.Errorf("alarm %s: %s of %v, not one of the stack's tables", id, key, m.dims)
				}
				covered[key+" "+target] = true
			case "AWS/SQS/ApproximateNumberOfMessagesVisible", "AWS/SQS/ApproximateAgeOfOldestMessage":
				queue := getAtt(m.dims["QueueName"], "QueueName")
				if jsonObj(res, queue)["Type"] != "AWS::SQS::Queue" || len(m.dims) != 1 {
					t.Errorf("alarm %s: %s of %v, not one of the stack's queues", id, key, m.dims)
				}
				covered[key+" "+queue] = true
			case "Runfleet/SweepLagSeconds":
				// The sweep's EMF line has no dimensions:
				// an alarm with any would watch a metric nobody publishes.
				if len(m.dims) != 0 || jsonObj(p["Threshold"])["Ref"] != "SweepLagAlarmSeconds" || p["Statistic"] != "Maximum" {
					t.Errorf("alarm %s: sweep lag with dimensions %v, threshold %v, statistic %v; want none, SweepLagAlarmSeconds, Maximum",
						id, m.dims, p["Threshold"], p["Statistic"])
				}
				covered[key] = true
			default:
				t.Errorf("alarm %s reads %s, which no resource of the stack publishes", id, key)
			}
		}
	}
	var want []string
	for _, fn := range resourcesOfType(out, "AWS::Lambda::Function") {
		want = append(want, "AWS/Lambda/Errors "+fn, "AWS/Lambda/Throttles "+fn)
	}
	want = append(want, "AWS/Lambda/Invocations SweepFunction", "AWS/ApiGateway/5xx HttpApi", "Runfleet/SweepLagSeconds",
		"AWS/SQS/ApproximateNumberOfMessagesVisible ScheduleDeadLetterQueue",
		"AWS/SQS/ApproximateNumberOfMessagesVisible DispatchWakesDeadLetterQueue", "AWS/SQS/ApproximateAgeOfOldestMessage DispatchWakes")
	for _, table := range resourcesOfType(out, "AWS::DynamoDB::Table") {
		for _, target := range append([]string{table}, indexes(table)...) {
			if target != table {
				target = table + "/" + target
			}
			want = append(want, "AWS/DynamoDB/ReadThrottleEvents "+target, "AWS/DynamoDB/WriteThrottleEvents "+target)
		}
	}
	for _, w := range want {
		if !covered[w] {
			t.Errorf("no alarm watches %s", w)
		}
	}
	if p := jsonObj(res, "AlarmEmailSubscription"); p["Condition"] != "HasAlarmEmail" || jsonObj(p, "Properties")["Protocol"] != "email" {
		t.Errorf("the alarm email subscription %v: want one only when AlarmEmail is set", p)
	}
	if jsonObj(out, "Parameters", "AlarmEmail")["Default"] != "" {
		t.Error("AlarmEmail must be optional (empty by default)")
	}
}
