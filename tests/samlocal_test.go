package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/config"
	"github.com/runfleet/runfleet/tests/kit/lambdatest"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// SAM local (README): the env file, the sample events and the setup
// command. The SAM CLI needs a Docker daemon these machines lack, so these
// tests check what sam local relies on: the env file gives each function
// exactly the variables template.yaml declares for it (SAM overrides only
// those, samcli/local/lambdafn/env_vars.py), and each sample event gets
// the answer the README promises from its function, built as it ships and
// run under the runtime interface emulator with the env file's variables,
// on a moto prepared by the setup command.

const (
	// samEnvFile is what README's sam local commands pass to --env-vars.
	samEnvFile = "../infra/sam/env.json"
	// samAdminToken is the admin token the sample events carry and the
	// setup command stores by default.
	samAdminToken = "sam-local-admin-token-not-secret"
	// samRunID is the run the sample events for one run name: no such run
	// exists on a fresh local moto.
	samRunID = "fr-sampleruniddoesnotexist222"
)

// readSAMEnvFile reads the env file in the per-function form: every value a
// string, no "Parameters" object.
func readSAMEnvFile(t testing.TB) map[string]map[string]string {
	t.Helper()
	b, err := os.ReadFile(samEnvFile)
	must(t, err)
	var envs map[string]map[string]string
	if err := json.Unmarshal(b, &envs); err != nil {
		t.Fatalf("%s: want {\"<LogicalId>\": {\"<VARIABLE>\": \"<string>\"}}: %v", samEnvFile, err)
	}
	if _, ok := envs["Parameters"]; ok {
		t.Fatalf("%s has a Parameters object: older SAM CLIs then ignore every per-function object", samEnvFile)
	}
	return envs
}

// TestSAMLocalEnvFileMatchesTemplate: the env file names each function of
// template.yaml and, for each, exactly the variables the template declares
// for it (with the default parameters). Each value is the deployed one but
// for the table names (the same six for every function), the endpoint
// (a URL), the wake queue (one on that endpoint) and the stream's URL (none
// locally), and Fleet's configuration accepts each function's set.
func TestSAMLocalEnvFileMatchesTemplate(t *testing.T) {
	_, out := templates(t)
	file := readSAMEnvFile(t)
	fns := resourcesOfType(out, "AWS::Lambda::Function")
	for name := range file {
		if !containsValue(fns, name) {
			t.Errorf("%s names %s, which template.yaml does not define: sam local ignores it", samEnvFile, name)
		}
	}
	const tableRef = "{Ref table}"
	tables := map[string]config.Tables{}
	for _, fn := range fns {
		t.Run(fn, func(t *testing.T) {
			r := newResolver(out, nil)
			for _, table := range stackTables {
				r.refs[table+"Table"] = tableRef
			}
			want := functionEnv(t, r, out, fn)
			got, ok := file[fn]
			if !ok {
				t.Fatalf("%s has no %s object: sam local would run it with template.yaml's values (tables named by logical id, AWS's endpoints)", samEnvFile, fn)
			}
			for _, name := range slices.Sorted(maps.Keys(want)) {
				g, ok := got[name]
				switch {
				case !ok:
					t.Errorf("template.yaml declares %s for %s, the env file does not: sam local would give it %q", name, fn, want[name])
				case name == envAWSEndpoint:
					if u, err := url.Parse(g); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
						t.Errorf("%s=%q: want moto_server's URL as SAM's containers reach it", name, g)
					}
				case name == config.EnvStreamURL:
					// Deployed, the stream's Function URL; sam local has none
					// (start-api serves no Function URL): empty, a run's
					// stream link is on the API's own address.
					if g != "" {
						t.Errorf("%s=%q: want empty (sam local has no Function URL for the stream)", name, g)
					}
				case name == config.EnvWakeQueue:
					// Deployed, the DispatchWakes queue's URL; locally a
					// queue on the same moto as every other call.
					u, err := url.Parse(g)
					e, _ := url.Parse(got[envAWSEndpoint])
					if err != nil || e == nil || u.Host != e.Host || u.Path == "" {
						t.Errorf("%s=%q: want a queue on %s's moto (%s)", name, g, envAWSEndpoint, got[envAWSEndpoint])
					}
				case want[name] == tableRef:
					if g == "" {
						t.Errorf("%s is empty", name)
					}
				case g != want[name]:
					t.Errorf("%s=%q, template.yaml deploys %q: locally the functions run as deployed, but for the tables and the endpoint", name, g, want[name])
				}
			}
			for _, name := range slices.Sorted(maps.Keys(got)) {
				if _, ok := want[name]; !ok {
					t.Errorf("the env file sets %s for %s, which template.yaml does not declare for it: sam local ignores it", name, fn)
				}
			}
			cfg, err := config.FromEnv(func(k string) string { return got[k] })
			if err != nil {
				t.Fatalf("Fleet refuses the env file's variables for %s: %v", fn, err)
			}
			if cfg.Store != config.StoreDynamoDB || !cfg.Credentials.NeedsAWS() {
				t.Errorf("store %q, credentials %+v: want dynamodb and Secrets Manager, as deployed", cfg.Store, cfg.Credentials)
			}
			tables[fn] = cfg.Tables
		})
	}
	for fn, tb := range tables {
		if tb != tables[fns[0]] {
			t.Errorf("%s uses the tables %+v, %s uses %+v: the functions must share one store", fn, tb, fns[0], tables[fns[0]])
		}
	}
}

// samEventCheck is what one sample event must get from its function on a
// freshly set up local moto: its HTTP status (the api and the stream), and
// a check of the JSON answer.
type samEventCheck struct {
	status int
	check  func(answer map[string]any) error
}

// samEventChecks names every sample event (its path under
// infra/sam/events: the folder is its function) and what it gets; README
// "SAM local" says the same.
var samEventChecks = map[string]samEventCheck{
	"api/healthz.json": {200, func(a map[string]any) error {
		return expect(a["ok"] == true && a["product"] == "runfleet", "ok and product runfleet")
	}},
	"api/list-hosts.json": {200, func(a map[string]any) error {
		hosts, ok := a["hosts"].([]any)
		return expect(ok && len(hosts) == 0, "an empty hosts list")
	}},
	"api/dispatch.json": {409, func(a map[string]any) error {
		return expect(a["code"] == "no_eligible_host", "no_eligible_host (no host is registered)")
	}},
	"api/get-run.json": {404, func(a map[string]any) error {
		return expect(a["code"] == "not_found" && strings.Contains(fmt.Sprint(a["error"]), samRunID), "not_found naming "+samRunID)
	}},
	"stream/stream.json": {404, func(a map[string]any) error {
		return expect(a["code"] == "not_found" && strings.Contains(fmt.Sprint(a["error"]), samRunID), "not_found naming "+samRunID)
	}},
	"probe/scheduled.json": {0, func(a map[string]any) error {
		return expect(a["probed"] == 0.0, "probed 0 (no host is registered)")
	}},
	"sweep/scheduled.json": {0, func(a map[string]any) error {
		return expect(a["pages"] == 1.0 && a["live"] == 0.0, "one page of the live index, no live run")
	}},
	"dispatcher/wakes.json": {0, func(a map[string]any) error {
		failures, ok := a["batchItemFailures"].([]any)
		return expect(ok && len(failures) == 0, "no failed wake (the host is not registered: nothing to fill)")
	}},
}

func expect(ok bool, what string) error {
	if !ok {
		return fmt.Errorf("want %s", what)
	}
	return nil
}

// TestSAMLocalREADMEListsEverySampleEvent: README "SAM local" has one row
// per sample event, naming its function and the status samEventChecks
// holds it to, and its commands name files that exist.
func TestSAMLocalREADMEListsEverySampleEvent(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	must(t, err)
	_, section, ok := strings.Cut(string(b), "\n## SAM local\n")
	if !ok {
		t.Fatal("README.md has no \"## SAM local\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string][]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) == 4 && strings.HasSuffix(cells[0], ".json`") {
			rows[strings.Trim(cells[0], "`")] = cells
		}
	}
	for rel, exp := range samEventChecks {
		cells, ok := rows[rel]
		if !ok {
			t.Errorf("README's sample events table has no row for %s", rel)
			continue
		}
		folder, _, _ := strings.Cut(rel, "/")
		if fn := cells[1]; templateFunctions[fn] != "functions/"+folder {
			t.Errorf("README: %s is for %s, want the function of functions/%s", rel, fn, folder)
		}
		if exp.status != 0 && !strings.HasPrefix(cells[3], strconv.Itoa(exp.status)+" ") {
			t.Errorf("README: %s answers %q, the test holds it to %d", rel, cells[3], exp.status)
		}
	}
	for rel := range rows {
		if _, ok := samEventChecks[rel]; !ok {
			t.Errorf("README lists %s, which is not a sample event", rel)
		}
	}
	for _, path := range regexp.MustCompile(`infra/sam/[a-z/.-]+\.json`).FindAllString(section, -1) {
		if _, err := os.Stat("../" + path); err != nil {
			t.Errorf("README names %s: %v", path, err)
		}
	}
}

// samSetupBinary is `go run ./infra/sam/setup`'s program, built.
func samSetupBinary(tb testing.TB) string { return commandBinary(tb, "./infra/sam/setup") }

// TestSAMLocalSampleEventsUnderTheEmulator follows README "SAM local" on a
// moto of its own (the env file's fixed names, as a user has them): the
// setup command, twice (it is rerun after every moto start), then every
// sample event through its function, built as it ships and run under the
// runtime interface emulator with the env file's variables and what SAM
// adds (region, dummy credentials), the endpoint being this moto: SAM's
// containers reach the same moto_server at host.docker.internal. Each
// event gets its expected answer, not a function error; an event carrying
// the admin token gets 401 without it; no log line shows the token.
func TestSAMLocalSampleEventsUnderTheEmulator(t *testing.T) {
	local := motoserver.StartT(t)
	setup := samSetupBinary(t)
	for range 2 {
		cmd := exec.Command(setup, "-endpoint", local.URL, "-env-vars", filepath.Base(samEnvFile))
		cmd.Dir = filepath.Dir(samEnvFile)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("setup: %v\n%s", err, out)
		}
		if bytes.Contains(out, []byte(samAdminToken)) {
			t.Fatalf("setup printed the admin token:\n%s", out)
		}
		for _, fn := range slices.Sorted(maps.Keys(templateFunctions)) {
			if !bytes.Contains(out, []byte(fn+": starts")) {
				t.Errorf("setup does not say %s starts:\n%s", fn, out)
			}
		}
	}

	file := readSAMEnvFile(t)
	fns := map[string]*lambdatest.Function{}
	for id, pkg := range templateFunctions {
		env := maps.Clone(file[id])
		env[envAWSEndpoint] = local.URL
		// What SAM gives every function besides (env_vars.py): the
		// region, and credentials, dummy ones when the shell has none.
		env["AWS_REGION"], env["AWS_DEFAULT_REGION"] = "us-east-1", "us-east-1"
		env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = "defaultkey", "defaultsecret"
		name := filepath.Base(pkg)
		fns[name] = lambdatest.Start(t, functionBootstrap(t, name), env, functionTimeout(t, name))
	}

	var found []string
	err := filepath.WalkDir(samEvents, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(samEvents, path)
		found = append(found, filepath.ToSlash(rel))
		return nil
	})
	must(t, err)
	sort.Strings(found)
	for _, rel := range found {
		if _, ok := samEventChecks[rel]; !ok {
			t.Errorf("%s%s: no expectation in samEventChecks (and none in the README)", samEvents, rel)
		}
	}
	for _, rel := range slices.Sorted(maps.Keys(samEventChecks)) {
		t.Run(rel, func(t *testing.T) {
			exp := samEventChecks[rel]
			fn := fns[strings.Split(rel, "/")[0]]
			if fn == nil || !containsValue(found, rel) {
				t.Fatalf("no sample event %s%s for a function (api, stream, probe, sweep, dispatcher)", samEvents, rel)
			}
			ev := fixture(t, samEvents+rel)
			var event map[string]any
			must(t, json.Unmarshal(ev, &event))
			if strings.HasPrefix(rel, "api/") {
				checkRouteOf(t, event)
			}
			status, answer := invokeSample(t, fn, rel, ev)
			if status != exp.status {
				t.Fatalf("%s answered %d %v, want %d", rel, status, answer, exp.status)
			}
			if err := exp.check(answer); err != nil {
				t.Fatalf("%s answered %v: %v", rel, answer, err)
			}
			headers := jsonObj(event, "headers")
			if headers["authorization"] == nil {
				return
			}
			if headers["authorization"] != "Bearer "+samAdminToken {
				t.Fatalf("%s carries authorization %v, want the sample admin token", rel, headers["authorization"])
			}
			delete(headers, "authorization")
			noAuth, err := json.Marshal(event)
			must(t, err)
			if status, answer := invokeSample(t, fn, rel+" without its token", noAuth); status != 401 || answer["code"] != "unauthenticated" {
				t.Fatalf("%s without its token answered %d %v, want 401 unauthenticated", rel, status, answer)
			}
		})
	}
	for name, fn := range fns {
		if strings.Contains(fn.Output(), samAdminToken) {
			t.Errorf("the admin token reached the %s function's log", name)
		}
	}
}

// checkRouteOf: an api sample event is what API Gateway sends for one of
// template.yaml's routes: its routeKey and pathParameters are the route's.
func checkRouteOf(t *testing.T, ev map[string]any) {
	t.Helper()
	method := fmt.Sprint(jsonObj(ev, "requestContext", "http")["method"])
	path := fmt.Sprint(ev["rawPath"])
	if p := jsonObj(ev, "requestContext", "http")["path"]; p != path {
		t.Errorf("rawPath %s, requestContext.http.path %v", path, p)
	}
	route, params := matchRoute(method, path)
	if ev["routeKey"] != route || jsonObj(ev, "requestContext")["routeKey"] != route {
		t.Errorf("routeKey %v (requestContext %v): API Gateway sets %s for %s %s", ev["routeKey"], jsonObj(ev, "requestContext")["routeKey"], route, method, path)
	}
	got := map[string]string{}
	for k, v := range jsonObj(ev, "pathParameters") {
		got[k] = fmt.Sprint(v)
	}
	if len(params) == 0 {
		params = map[string]string{}
	}
	if !maps.Equal(got, params) {
		t.Errorf("pathParameters %v, want %v", got, params)
	}
}

// invokeSample invokes fn with one event and decodes its answer: the HTTP
// status and JSON body for the api and the stream (a streamed answer's
// prelude and body), status 0 and the JSON result for a scheduled job. A
// function error fails the test.
func invokeSample(t *testing.T, fn *lambdatest.Function, what string, ev []byte) (int, map[string]any) {
	t.Helper()
	raw := fn.Invoke(t, ev)
	var answer map[string]any
	switch {
	case strings.HasPrefix(what, "api/"):
		status, out, _ := apiAnswer(t, what, raw)
		return status, out
	case strings.HasPrefix(what, "stream/"):
		prelude, body, err := lambdatest.StreamedResponse(raw)
		if err != nil {
			t.Fatalf("%s: %v (answer %q)", what, err, raw)
		}
		if err := json.Unmarshal(body, &answer); err != nil {
			t.Fatalf("%s: body %q: %v", what, body, err)
		}
		return prelude.StatusCode, answer
	}
	if err := json.Unmarshal(raw, &answer); err != nil || answer["errorType"] != nil {
		t.Fatalf("%s: the function answered %s (%v)", what, raw, err)
	}
	return 0, answer
}
