package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/runfleet/runfleet/shared/clock"
	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/shared/fleetapp"
	"github.com/runfleet/runfleet/shared/store/dynamostore"
	"github.com/runfleet/runfleet/shared/wake"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/fakehost"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// The roles in template.yaml are derived from the code: which Store methods
// each function's handler calls and which DynamoDB API calls those make.
// This test keeps that derivation honest. It deploys each function's role
// as CloudFormation would (the SAM transform, then the intrinsics for a set
// of parameters), runs each function's handler, built from the environment
// the template gives it, against moto_server with every AWS request
// recorded, and checks both ways: every call is allowed by the function's
// role, and every permission the role grants was used.

// awsCall is one IAM authorization a request needs: an action on a resource.
type awsCall struct{ action, resource string }

func (c awsCall) String() string { return c.action + " on " + c.resource }

func tableARN(name string) string {
	return fmt.Sprintf("arn:aws:dynamodb:%s:%s:table/%s", testRegion, testAccount, name)
}

// secretARN is the ARN Secrets Manager gives a secret: its name, a hyphen
// and six random characters.
func secretARN(name string) string {
	return fmt.Sprintf("arn:aws:secretsmanager:%s:%s:secret:%s-Ab3dEf", testRegion, testAccount, name)
}

// callRecorder is the AWS SDK's HTTP client with a tap: it records the
// authorizations each request needs, by IAM's rules (a transaction needs
// the item actions of its parts; a batch needs the batch action on each
// table; a Query or Scan of an index needs it on the index's ARN).
type callRecorder struct {
	next aws.HTTPClient
	mu   sync.Mutex
	seen map[awsCall]bool
}

func newCallRecorder() *callRecorder {
	return &callRecorder{next: awshttp.NewBuildableClient(), seen: map[awsCall]bool{}}
}

func (r *callRecorder) Do(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	calls := authorizations(req.Header.Get("X-Amz-Target"), body)
	r.mu.Lock()
	for _, c := range calls {
		r.seen[c] = true
	}
	r.mu.Unlock()
	return r.next.Do(req)
}

func (r *callRecorder) calls() []awsCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]awsCall, 0, len(r.seen))
	for c := range r.seen {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// authorizations maps one JSON-protocol request to what IAM checks.
func authorizations(target string, body []byte) []awsCall {
	var in struct {
		TableName, IndexName, SecretId, QueueUrl string
		RequestItems                             map[string]json.RawMessage
		TransactItems                            []map[string]struct{ TableName string }
	}
	json.Unmarshal(body, &in)
	service, op, _ := strings.Cut(target, ".")
	switch service {
	case "DynamoDB_20120810":
		switch op {
		case "BatchGetItem", "BatchWriteItem":
			var out []awsCall
			for table := range in.RequestItems {
				out = append(out, awsCall{"dynamodb:" + op, tableARN(table)})
			}
			return out
		case "TransactWriteItems", "TransactGetItems":
			var out []awsCall
			part := map[string]string{"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
				"ConditionCheck": "ConditionCheckItem", "Get": "GetItem"}
			for _, item := range in.TransactItems {
				for kind, p := range item {
					out = append(out, awsCall{"dynamodb:" + part[kind], tableARN(p.TableName)})
				}
			}
			return out
		}
		res := tableARN(in.TableName)
		if in.IndexName != "" {
			res += "/index/" + in.IndexName
		}
		return []awsCall{{"dynamodb:" + op, res}}
	case "AmazonSQS":
		// A batch is authorized as its single action; the queue by its
		// ARN, from its URL (.../<account>/<name>).
		action := strings.TrimSuffix(op, "Batch")
		parts := strings.Split(strings.TrimRight(in.QueueUrl, "/"), "/")
		if len(parts) < 2 {
			return []awsCall{{"sqs:" + action, "unknown queue " + in.QueueUrl}}
		}
		return []awsCall{{"sqs:" + action, fmt.Sprintf("arn:aws:sqs:%s:%s:%s", testRegion, parts[len(parts)-2], parts[len(parts)-1])}}
	case "secretsmanager":
		res := in.SecretId
		if !strings.HasPrefix(res, "arn:") {
			res = secretARN(res)
		}
		return []awsCall{{"secretsmanager:" + op, res}}
	}
	return []awsCall{{"unknown:" + target, "*"}}
}

// statement is one resolved IAM policy statement.
type statement struct {
	Sid       string
	Effect    string
	Action    []string
	Resource  []string
	Condition map[string]any
}

// iamMatch is IAM's wildcard match: * any run, ? one character.
func iamMatch(pattern, s string, foldCase bool) bool {
	re := "^" + strings.NewReplacer(`\*`, ".*", `\?`, ".").Replace(regexp.QuoteMeta(pattern)) + "$"
	if foldCase {
		re = "(?i)" + re
	}
	return regexp.MustCompile(re).MatchString(s)
}

func (s statement) allows(c awsCall) bool {
	if s.Effect != "Allow" {
		return false
	}
	action, resource := false, false
	for _, a := range s.Action {
		action = action || iamMatch(a, c.action, true)
	}
	for _, r := range s.Resource {
		resource = resource || iamMatch(r, c.resource, false)
	}
	return action && resource
}

// deployedRole resolves the role a transformed function runs with: its
// inline statements and managed policy ARNs.
func deployedRole(t *testing.T, tpl map[string]any, r *cfnResolver, fn string) (stmts []statement, managed []string) {
	t.Helper()
	role := jsonList(jsonObj(tpl, "Resources", fn, "Properties", "Role")["Fn::GetAtt"])
	if len(role) != 2 {
		t.Fatalf("%s has no role of its own: %v", fn, jsonObj(tpl, "Resources", fn, "Properties")["Role"])
	}
	props := jsonObj(r.mustResolve(t, jsonObj(tpl, "Resources", fmt.Sprint(role[0]), "Properties")))
	for _, p := range jsonList(props["Policies"]) {
		for _, s := range jsonList(jsonObj(p, "PolicyDocument")["Statement"]) {
			m := jsonObj(s)
			one := func(v any) []string {
				if s, ok := v.(string); ok {
					return []string{s}
				}
				return jsonStrings(v)
			}
			stmts = append(stmts, statement{Sid: fmt.Sprint(m["Sid"]), Effect: fmt.Sprint(m["Effect"]),
				Action: one(m["Action"]), Resource: one(m["Resource"]), Condition: jsonObj(m["Condition"])})
		}
	}
	return stmts, jsonStrings(props["ManagedPolicyArns"])
}

// iamStack is the deployed template's resolution for the test's tables,
// log groups and secrets.
type iamStack struct {
	tpl    map[string]any
	tables dynamostore.TableNames
	// wakes is the DispatchWakes queue, on moto: its URL and name.
	wakes, wakesName string
	prefix           string // SecretsPrefix
	hostRef          string
	resolver         func(overrides map[string]any) *cfnResolver
	// clk, when set, is the functions' clock.
	clk *clock.Fake
}

func newIAMStack(t *testing.T) *iamStack {
	_, tpl := templates(t)
	// Names of their own, so the tests also pass run again on one moto.
	id := motoserver.Unique("iam")
	s := &iamStack{tpl: tpl, tables: dynamostore.Prefixed(id + "-"), prefix: id + "test/runfleet/", hostRef: "edge-1"}
	st, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: s.tables})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.wakesName = id + "-wakes"
	q, err := sqs.NewFromConfig(moto.AWSConfig()).CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(s.wakesName)})
	if err != nil {
		t.Fatal(err)
	}
	s.wakes = aws.ToString(q.QueueUrl)
	s.resolver = func(overrides map[string]any) *cfnResolver {
		o := map[string]any{"SecretsPrefix": s.prefix}
		for k, v := range overrides {
			o[k] = v
		}
		r := newResolver(tpl, o)
		for id, name := range map[string]string{"HostsTable": s.tables.Hosts, "RunsTable": s.tables.Runs,
			"EventsTable": s.tables.Events, "EgressTable": s.tables.Egress, "CallersTable": s.tables.Callers,
			"IdempotencyTable": s.tables.Idempotency} {
			r.refs[id], r.attrs[id+".Arn"] = name, tableARN(name)
		}
		// The wake queue the functions send to is moto's, in the
		// account moto answers as.
		r.refs["DispatchWakes"] = s.wakes
		r.attrs["DispatchWakes.Arn"] = fmt.Sprintf("arn:aws:sqs:%s:%s:%s", testRegion, testAccount, s.wakesName)
		r.attrs["DispatchWakes.QueueName"] = s.wakesName
		for _, id := range resourcesOfType(tpl, "AWS::IAM::Role") {
			r.refs[id], r.attrs[id+".Arn"] = id, fmt.Sprintf("arn:aws:iam::%s:role/%s", testAccount, id)
		}
		for _, id := range resourcesOfType(tpl, "AWS::Logs::LogGroup") {
			name := "/runfleet/" + id
			r.refs[id] = name
			r.attrs[id+".Arn"] = fmt.Sprintf("arn:aws:logs:%s:%s:log-group:%s:*", testRegion, testAccount, name)
		}
		return r
	}
	return s
}

// app builds fn's Fleet as its Lambda would: from the environment the
// template gives it (plus moto's endpoint), every AWS request through rec.
func (s *iamStack) app(t *testing.T, fn string, rec *callRecorder) *fleetapp.App {
	t.Helper()
	env := functionEnv(t, s.resolver(nil), s.tpl, fn)
	env[config.EnvDynamoDBEndpoint] = moto.URL
	cfg, err := config.FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	cfg.StreamPollInterval = 10 * time.Millisecond
	var clk clock.Clock
	if s.clk != nil {
		clk = s.clk
	}
	app, err := fleetapp.New(context.Background(), cfg, fleetapp.Deps{
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), DefaultStore: config.StoreDynamoDB, DialContext: dialLoopbackOnly,
		Clock: clk,
		LoadAWS: func(context.Context) (aws.Config, error) {
			c := moto.AWSConfig()
			c.HTTPClient = rec
			return c, nil
		},
	})
	if err != nil {
		t.Fatalf("%s does not start: %v", fn, err)
	}
	t.Cleanup(func() { app.Close() })
	return app
}

// apiCall sends one API Gateway v2 request to the api handler.
func apiCall(t *testing.T, app *fleetapp.App, want int, method, path, token, body string) map[string]any {
	t.Helper()
	rawPath, rawQuery, _ := strings.Cut(path, "?")
	ev := events.APIGatewayV2HTTPRequest{RawPath: rawPath, RawQueryString: rawQuery, Body: body,
		Headers: map[string]string{"content-type": "application/json"}}
	if token != "" {
		ev.Headers["authorization"] = "Bearer " + token
	}
	ev.RequestContext.HTTP.Method = method
	resp, err := app.API.Handle(context.Background(), ev)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, resp.Body, want)
	}
	var m map[string]any
	json.Unmarshal([]byte(resp.Body), &m)
	return m
}

func TestEachFunctionsRoleAllowsExactlyTheCallsItMakes(t *testing.T) {
	s := newIAMStack(t)
	ctx := context.Background()
	const adminTok = "iam-admin-token-0123456789"
	host := fakehost.New(fakehost.Config{})
	t.Cleanup(host.Close)
	sm := secretsmanager.NewFromConfig(moto.AWSConfig())
	for name, value := range map[string]string{
		s.prefix + "admin-token":        adminTok,
		s.prefix + "hosts/" + s.hostRef: host.Token(),
	} {
		if _, err := sm.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name), SecretString: aws.String(value)}); err != nil {
			t.Fatal(err)
		}
	}

	recs := map[string]*callRecorder{}
	for fn := range templateFunctions {
		recs[fn] = newCallRecorder()
	}
	// One clock for every function, moved days ahead below, as the sweep
	// extends the events of a run live for over a week (the calls of that
	// path are in its role too).
	clk := clock.NewFake(time.Now().UTC())
	s.clk = clk
	apiApp := s.app(t, "ApiFunction", recs["ApiFunction"])

	// The admin sets up a host and a caller; the caller dispatches runs and
	// acts on them; everyone lists what they may.
	apiCall(t, apiApp, 200, "GET", "/healthz", "", "")
	apiCall(t, apiApp, 201, "POST", "/fleet/hosts", adminTok,
		fmt.Sprintf(`{"id":"edge-1","baseUrl":%q,"credentialRef":%q,"enabled":false}`, host.URL, s.hostRef))
	apiCall(t, apiApp, 200, "POST", "/fleet/hosts/edge-1/enable", adminTok, `{"enabled":true}`)
	if p := apiCall(t, apiApp, 200, "POST", "/fleet/hosts/edge-1/probe", adminTok, ""); jsonObj(p, "probe")["status"] != "ok" {
		t.Fatalf("probe %v", p)
	}
	apiCall(t, apiApp, 200, "POST", "/fleet/probe", adminTok, "")
	apiCall(t, apiApp, 200, "GET", "/fleet/hosts", adminTok, "")
	caller := apiCall(t, apiApp, 201, "POST", "/fleet/callers", adminTok, `{"ownerId":"ci","allowedHosts":"*","allowedProjects":"*"}`)
	tok := fmt.Sprint(caller["token"])
	apiCall(t, apiApp, 200, "GET", "/fleet/callers", adminTok, "")
	run1 := apiCall(t, apiApp, 201, "POST", "/fleet/runs", tok, `{"agent":"shell","prompt":"echo one","idempotency":"k1"}`)
	apiCall(t, apiApp, 200, "POST", "/fleet/runs", tok, `{"agent":"shell","prompt":"echo one","idempotency":"k1"}`)
	id1, child1 := fmt.Sprint(run1["fleetRunId"]), fmt.Sprint(run1["childRunId"])
	apiCall(t, apiApp, 200, "GET", "/fleet/runs", tok, "")
	apiCall(t, apiApp, 200, "GET", "/fleet/runs?limit=5", adminTok, "")
	apiCall(t, apiApp, 200, "GET", "/fleet/runs/"+id1, tok, "")
	apiCall(t, apiApp, 200, "POST", "/fleet/runs/"+id1+"/input", tok, `{"input":"y"}`)
	host.AppendOutput(child1, "one\n")
	apiCall(t, apiApp, 200, "POST", "/fleet/runs/"+id1+"/cancel", tok, "")
	apiCall(t, apiApp, 200, "POST", "/fleet/runs/"+id1+"/retry", tok, "")
	apiCall(t, apiApp, 200, "POST", "/fleet/runs/"+id1+"/cancel", tok, "")
	apiCall(t, apiApp, 200, "GET", "/metrics", tok, "")
	// Run 1's egress ledger, which its host seals late: the stream below
	// mirrors its records (puts them and the head), then the seal (updates
	// the head).
	host.HoldSeals(true)
	host.AddEgress(child1, iamLedger(3)...)
	run2 := apiCall(t, apiApp, 201, "POST", "/fleet/runs", tok, `{"agent":"shell","prompt":"echo two"}`)
	id2, child2 := fmt.Sprint(run2["fleetRunId"]), fmt.Sprint(run2["childRunId"])

	// The stream follows run 1 (canceled) to its end, mirroring its
	// events on the way, as its Function URL would serve it.
	streamApp := s.app(t, "StreamFunction", recs["StreamFunction"])
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	fev := events.LambdaFunctionURLRequest{RawPath: "/fleet/runs/" + id1 + "/stream", RawQueryString: "egress=true",
		Headers: map[string]string{"authorization": "Bearer " + tok}}
	fev.RequestContext.HTTP.Method = "GET"
	resp, err := streamApp.Stream.HandleLambda(sctx, fev)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %+v", err, resp)
	}
	body := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(resp.Body)
		body <- b
	}()
	mirror, err := dynamostore.New(moto.DynamoDB(), dynamostore.Config{Tables: s.tables, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	await.Cond(t, await.Limit, "the stream's mirror of run 1's ledger", func() bool {
		_, err := mirror.GetEgressHead(ctx, id1)
		return err == nil
	})
	host.SealEgress(child1)
	host.HoldSeals(false)
	// The stream's next polls, on the functions' clock, until it ends.
	var sse []byte
	await.Cond(t, await.Limit, "the stream's end after the seal", func() bool {
		select {
		case sse = <-body:
			return true
		default:
			clk.Advance(100 * time.Millisecond)
			return false
		}
	})
	if !strings.Contains(string(sse), "event: done") || !strings.Contains(string(sse), `one\n`) || !strings.Contains(string(sse), "event: egress") {
		t.Fatalf("stream of a canceled run:\n%s", sse)
	}

	// The sweep mirrors run 2's first events; eight days later (its host
	// out of reach, say) it extends their expiry and brings the run up to
	// date (its output, its end).
	host.AddEgress(child2, iamLedger(fleet.DefaultEgressBatch)...) // a batch: the sweep mirrors it while the run is live
	sweepApp := s.app(t, "SweepFunction", recs["SweepFunction"])
	jctx, cancelJob := context.WithTimeout(ctx, 55*time.Second)
	defer cancelJob()
	if rep, err := sweepApp.Jobs.Sweep(jctx, events.EventBridgeEvent{}); err != nil || rep.Events < 1 {
		t.Fatalf("first sweep %+v, %v", rep, err)
	}
	clk.Advance(8 * 24 * time.Hour)
	// A run waits for an agent no host offers yet, so the ends the sweep
	// and the stream record from here on wake their hosts.
	apiCall(t, apiApp, 202, "POST", "/fleet/runs", tok, `{"agent":"later","queue":{"timeout":"24h"}}`)
	host.AppendOutput(child2, "two\n")
	host.AddEgress(child2, iamLedger(2)...)
	host.SetRun(child2, "succeeded", new(int), "")
	rep, err := sweepApp.Jobs.Sweep(jctx, events.EventBridgeEvent{})
	if err != nil || rep.Drained < 1 || rep.Events < 1 || rep.Extended != 1 {
		t.Fatalf("sweep %+v, %v", rep, err)
	}

	probeApp := s.app(t, "ProbeFunction", recs["ProbeFunction"])
	sum, err := probeApp.Jobs.Probe(jctx, events.EventBridgeEvent{})
	if err != nil || sum.Probed != 1 || sum.Status["ok"] != 1 {
		t.Fatalf("probe %+v, %v", sum, err)
	}

	// The api reads the mirror, then the admin tears everything down.
	if ev := apiCall(t, apiApp, 200, "GET", "/fleet/runs/"+id2+"/events", tok, ""); len(jsonList(ev["events"])) == 0 {
		t.Fatalf("no mirrored events: %v", ev)
	}
	if eg := apiCall(t, apiApp, 200, "GET", "/fleet/runs/"+id2+"/egress?verify=true", tok, ""); len(jsonList(eg["records"])) != fleet.DefaultEgressBatch+2 {
		t.Fatalf("the mirrored egress ledger: %v", eg)
	}
	if l := apiCall(t, apiApp, 200, "GET", "/fleet/runs?alerts=true", adminTok, ""); len(jsonList(l["runs"])) != 2 {
		t.Fatalf("runs with egress alerts: %v", l)
	}
	// A fourth run's ledger, sealed late, mirrored by two pulls of its
	// events: the api puts the head, then updates it with the seal.
	run4 := apiCall(t, apiApp, 201, "POST", "/fleet/runs", tok, `{"agent":"shell","prompt":"echo four"}`)
	id4, child4 := fmt.Sprint(run4["fleetRunId"]), fmt.Sprint(run4["childRunId"])
	host.HoldSeals(true)
	host.AddEgress(child4, iamLedger(2)...)
	host.SetRun(child4, "succeeded", new(int), "")
	apiCall(t, apiApp, 200, "GET", "/fleet/runs/"+id4+"/events?wait=1", tok, "")
	host.SealEgress(child4)
	host.HoldSeals(false)
	apiCall(t, apiApp, 200, "GET", "/fleet/runs/"+id4+"/events?wait=1", tok, "")
	// A long-poll of a third run mirrors its new output itself.
	run3 := apiCall(t, apiApp, 201, "POST", "/fleet/runs", tok, `{"agent":"shell","prompt":"echo three"}`)
	host.AppendOutput(fmt.Sprint(run3["childRunId"]), "three\n")
	if ev := apiCall(t, apiApp, 200, "GET", "/fleet/runs/"+fmt.Sprint(run3["fleetRunId"])+"/events?wait=5", tok, ""); len(jsonList(ev["events"])) == 0 {
		t.Fatalf("the long-poll mirrored nothing: %v", ev)
	}
	// The stream records the end of a fifth run, which it finds on the
	// host, and wakes the host.
	run5 := apiCall(t, apiApp, 201, "POST", "/fleet/runs", tok, `{"agent":"shell","prompt":"echo five"}`)
	host.SetRun(fmt.Sprint(run5["childRunId"]), "succeeded", new(int), "")
	fev5 := fev
	fev5.RawPath, fev5.RawQueryString = "/fleet/runs/"+fmt.Sprint(run5["fleetRunId"])+"/stream", ""
	resp5, err := streamApp.Stream.HandleLambda(sctx, fev5)
	if err != nil || resp5.StatusCode != 200 {
		t.Fatalf("stream of run 5: %v %+v", err, resp5)
	}
	if b, _ := io.ReadAll(resp5.Body); !strings.Contains(string(b), "event: done") {
		t.Fatalf("stream of run 5, ended on its host:\n%s", b)
	}

	iamQueuedRuns(t, s, apiApp, probeApp, s.app(t, "DispatcherFunction", recs["DispatcherFunction"]), adminTok, tok)

	apiCall(t, apiApp, 409, "DELETE", "/fleet/hosts/edge-1", adminTok, "")
	apiCall(t, apiApp, 200, "DELETE", "/fleet/hosts/edge-1?force=1", adminTok, "")
	apiCall(t, apiApp, 200, "DELETE", "/fleet/callers/ci", adminTok, "")

	for _, fn := range []string{"ApiFunction", "StreamFunction", "SweepFunction", "ProbeFunction", "DispatcherFunction"} {
		t.Run(fn, func(t *testing.T) {
			r := s.resolver(nil)
			stmts, managed := deployedRole(t, s.tpl, r, fn)
			calls := recs[fn].calls()
			t.Logf("%s made: %v", fn, calls)
			for _, c := range calls {
				allowed := false
				for _, st := range stmts {
					allowed = allowed || st.allows(c)
				}
				if !allowed {
					t.Errorf("%s's role does not allow %s, which it makes", fn, c)
				}
			}
			logGroup := r.attrs[fn+"LogGroup.Arn"]
			for _, st := range stmts {
				if st.Sid == "Logs" {
					if fmt.Sprint(st.Resource) != "["+logGroup+"]" || fmt.Sprint(st.Action) != "[logs:CreateLogStream logs:PutLogEvents]" {
						t.Errorf("logs statement %+v: want streams and events in %s only", st, logGroup)
					}
					continue // the runtime writes logs, not the SDK
				}
				if st.Sid == "FailedInvocations" {
					// Lambda, not the code, sends a failed asynchronous
					// invocation's record, with the function's role, to
					// the function's on-failure destination: exactly that.
					dest := r.mustResolve(t, jsonObj(s.tpl, "Resources", fn+"EventInvokeConfig", "Properties",
						"DestinationConfig", "OnFailure")["Destination"])
					if fmt.Sprint(st.Action) != "[sqs:SendMessage]" || fmt.Sprint(st.Resource) != fmt.Sprintf("[%v]", dest) {
						t.Errorf("failed invocations statement %+v: want sqs:SendMessage on the on-failure destination %v only", st, dest)
					}
					continue
				}
				if st.Sid == "WakeQueue" {
					// Lambda's poller, not the code, makes these calls for
					// the event source mapping, with the function's role:
					// exactly those, on the mapping's queue alone.
					queue := r.attrs["DispatchWakes.Arn"]
					if fmt.Sprint(st.Action) != "[sqs:ReceiveMessage sqs:DeleteMessage sqs:ChangeMessageVisibility sqs:GetQueueAttributes]" ||
						fmt.Sprint(st.Resource) != "["+queue+"]" {
						t.Errorf("wake queue statement %+v: want the poller's four calls on %s only", st, queue)
					}
					continue
				}
				if st.Condition != nil {
					t.Errorf("statement %s has a condition %v with the default parameters", st.Sid, st.Condition)
				}
				for _, a := range st.Action {
					for _, res := range st.Resource {
						used := false
						for _, c := range calls {
							used = used || (iamMatch(a, c.action, true) && iamMatch(res, c.resource, false))
						}
						if !used {
							t.Errorf("%s's role grants %s on %s (statement %s), which it never used", fn, a, res, st.Sid)
						}
					}
				}
			}
			if len(managed) != 0 {
				t.Errorf("managed policies %v without a VPC", managed)
			}
		})
	}
}

// TestRolesWithTheOptionalParameters: a VPC adds network interface
// management (and only then); a customer managed key for the secrets adds
// kms:Decrypt on that key, through Secrets Manager only.
func TestRolesWithTheOptionalParameters(t *testing.T) {
	s := newIAMStack(t)
	const key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	r := s.resolver(map[string]any{"SubnetIds": []string{"subnet-1", "subnet-2"}, "SecurityGroupIds": []string{"sg-1"},
		"SecretsKmsKeyArn": key})
	for fn := range templateFunctions {
		stmts, managed := deployedRole(t, s.tpl, r, fn)
		if fmt.Sprint(managed) != "[arn:aws:iam::aws:policy/service-role/AWSLambdaENIManagementAccess]" {
			t.Errorf("%s in a VPC: managed policies %v", fn, managed)
		}
		vpc := jsonObj(r.mustResolve(t, jsonObj(s.tpl, "Resources", fn, "Properties", "VpcConfig")))
		if fmt.Sprint(vpc["SubnetIds"]) != "[subnet-1 subnet-2]" || fmt.Sprint(vpc["SecurityGroupIds"]) != "[sg-1]" {
			t.Errorf("%s VpcConfig %v", fn, vpc)
		}
		decrypt := awsCall{"kms:Decrypt", key}
		var kms *statement
		for i := range stmts {
			if stmts[i].allows(decrypt) {
				kms = &stmts[i]
			}
		}
		via := fmt.Sprint(jsonObj(kms.conditionOrNil(), "StringEquals")["kms:ViaService"])
		if kms == nil || via != "secretsmanager.us-east-1.amazonaws.com" {
			t.Errorf("%s: kms:Decrypt on the key %v, through %q; want it, through Secrets Manager only", fn, kms, via)
		}
	}
	noVPC := s.resolver(nil)
	if vpc := noVPC.mustResolve(t, jsonObj(s.tpl, "Resources", "ApiFunction", "Properties")["VpcConfig"]); vpc != noValue {
		t.Errorf("VpcConfig without subnets: %v", vpc)
	}
}

// iamLedger is n egress ledger records of a run's traffic, the first an
// alert.
func iamLedger(n int) []egress.Record {
	recs := make([]egress.Record, n)
	for i := range recs {
		recs[i] = egress.Record{Via: egress.ViaProxy, Authority: "api.github.com:443", Method: "GET", Path: "/repos/acme/widgets",
			Status: 200, BytesUp: 120, BytesDown: 4096, DurationUs: 5300, Keys: []string{"acme/GITHUB_TOKEN"}, Action: egress.Substituted}
	}
	if n > 0 {
		recs[0].Action, recs[0].Status, recs[0].Reason, recs[0].Alert = egress.Blocked, 403, egress.AlertForeignPlaceholder, egress.AlertForeignPlaceholder
	}
	return recs
}

func (s *statement) conditionOrNil() map[string]any {
	if s == nil {
		return nil
	}
	return s.Condition
}

// iamQueuedRuns is the part of the roles' test for runs that wait: the api
// queues a run behind a busy host; the probe finds the host free once its
// run ended, and wakes it, as the api does when it records the end; the
// dispatcher, handed the queue's wakes as the event source mapping hands
// them, offers the run and starts it. A second waiting run's start
// is cut (the dispatcher's context ends while the host holds its answer),
// and the host finishes the run; the next delivery resumes the offer,
// finds the run ended on the host, records that and wakes the host.
func iamQueuedRuns(t *testing.T, s *iamStack, apiApp, probeApp, dispatcherApp *fleetapp.App, adminTok, tok string) {
	t.Helper()
	ctx := context.Background()
	started := make(chan struct{}, 4)
	host := fakehost.New(fakehost.Config{MaxConcurrent: 1, OnRequest: func(r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/runs" {
			started <- struct{}{}
		}
	}})
	t.Cleanup(host.Close)
	apiCall(t, apiApp, 201, "POST", "/fleet/hosts", adminTok,
		fmt.Sprintf(`{"id":"edge-q","baseUrl":%q,"credentialRef":%q,"labels":{"pool":"q"}}`, host.URL, s.hostRef))
	apiCall(t, apiApp, 200, "POST", "/fleet/hosts/edge-q/probe", adminTok, "")
	const labelled = `{"agent":"shell","labels":{"pool":"q"},"prompt":"echo q"`
	busy := apiCall(t, apiApp, 201, "POST", "/fleet/runs", tok, labelled+`}`)
	var waiting []map[string]any
	for range 2 {
		// A second apart: first in, first out (on one clock tick the
		// run ids would decide).
		s.clk.Advance(time.Second)
		waiting = append(waiting, apiCall(t, apiApp, 202, "POST", "/fleet/runs", tok, labelled+`,"queue":{"timeout":"1h"}}`))
	}
	for len(started) > 0 {
		<-started
	}
	ends := func(child string) {
		host.SetRun(child, "succeeded", new(int), "")
	}
	ends(fmt.Sprint(busy["childRunId"]))
	jctx, cancelJob := context.WithTimeout(ctx, 50*time.Second)
	defer cancelJob()
	if _, err := probeApp.Jobs.Probe(jctx, events.EventBridgeEvent{}); err != nil {
		t.Fatal(err)
	}
	apiCall(t, apiApp, 200, "GET", "/fleet/runs/"+fmt.Sprint(busy["fleetRunId"]), tok, "")

	// What the mapping delivers: every wake sent so far (the host's run
	// end among them), and later one wake of edge-q.
	client := sqs.NewFromConfig(moto.AWSConfig())
	var batch events.SQSEvent
	for {
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(s.wakes), MaxNumberOfMessages: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			break
		}
		for _, m := range out.Messages {
			batch.Records = append(batch.Records, events.SQSMessage{MessageId: aws.ToString(m.MessageId), Body: aws.ToString(m.Body), EventSource: "aws:sqs"})
		}
	}
	if !slices.ContainsFunc(batch.Records, func(m events.SQSMessage) bool { return strings.Contains(m.Body, `"hostId":"edge-q"`) }) {
		t.Fatalf("no wake of edge-q after its run ended: %+v", batch.Records)
	}
	edgeQ := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "edge-q", EventSource: "aws:sqs",
		Body: `{"v":1,"hostId":"edge-q","slots":1,"reason":"run_ended"}`}}}

	if resp, err := dispatcherApp.Dispatcher.Handle(ctx, batch); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the dispatcher on %d wakes: %+v, %v", len(batch.Records), resp, err)
	}
	first := apiCall(t, apiApp, 200, "GET", "/fleet/runs/"+fmt.Sprint(waiting[0]["fleetRunId"]), tok, "")
	if q := jsonObj(first, "run", "queue"); q["startedOn"] != "edge-q" {
		t.Fatalf("the first waiting run after the wakes: %v", first)
	}

	// The second: its start cut short, the run ending on the host before
	// the next delivery.
	ends(fmt.Sprint(jsonObj(first, "run")["childRunId"]))
	host.FaultStarts(fakehost.HangAfterAccept, 1)
	cut, cancel := context.WithCancel(ctx)
	handled := make(chan struct{})
	go func() {
		defer close(handled)
		dispatcherApp.Dispatcher.Handle(cut, edgeQ)
	}()
	<-started
	await.Cond(t, await.Limit, "edge-q to record the held start", func() bool { return host.Created() == 3 })
	cancel()
	await.Recv(t, "the cut dispatcher to return", handled)
	ends("run-3")
	// The mapping delivers the wake again once its visibility timeout
	// passed, long after the cut offer's deadline: only then may another
	// dispatcher take the offer over.
	s.clk.Advance(wake.VisibilityTimeout)
	if resp, err := dispatcherApp.Dispatcher.Handle(ctx, edgeQ); err != nil || len(resp.BatchItemFailures) != 0 {
		t.Fatalf("the dispatcher resuming the cut start: %+v, %v", resp, err)
	}
	second := apiCall(t, apiApp, 200, "GET", "/fleet/runs/"+fmt.Sprint(waiting[1]["fleetRunId"]), tok, "")
	if r := jsonObj(second, "run"); r["status"] != "succeeded" || jsonObj(r, "queue")["startedOn"] != "edge-q" {
		t.Fatalf("the second waiting run after the resumed offer: %v", second)
	}
	apiCall(t, apiApp, 200, "DELETE", "/fleet/hosts/edge-q?force=1", adminTok, "")
}
