package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Tools from the pyenv Python (cfn-lint, aws-sam-translator,
// openapi-spec-validator): looked up on PATH first, then in pyenvBin. A
// missing one fails the test saying how to install it, never skips it.

const pyenvBin = "/root/.pyenv/shims/"

// pyTool finds an executable installed with pip.
func pyTool(t testing.TB, name, pipPackage string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat(pyenvBin + name); err == nil {
		return pyenvBin + name
	}
	t.Fatalf("%s not found on PATH nor in %s: install it with: pip install %s", name, pyenvBin, pipPackage)
	return ""
}

var pythons sync.Map // modules -> python path

// pythonWith finds a Python that imports every module: the one beside
// cfn-lint, the pyenv one, or python3 on PATH, in that order.
func pythonWith(t testing.TB, pipPackages string, modules ...string) string {
	t.Helper()
	key := strings.Join(modules, ",")
	if p, ok := pythons.Load(key); ok {
		return p.(string)
	}
	var candidates []string
	if p, err := exec.LookPath("cfn-lint"); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(p), "python3"))
	}
	candidates = append(candidates, pyenvBin+"python3")
	if p, err := exec.LookPath("python3"); err == nil {
		candidates = append(candidates, p)
	}
	for _, py := range candidates {
		if exec.Command(py, "-c", "import "+key).Run() == nil {
			pythons.Store(key, py)
			return py
		}
	}
	t.Fatalf("no Python here imports %s (tried %s): install it with: pip install %s", key, strings.Join(candidates, ", "), pipPackages)
	return ""
}

// decodeScript prints template.yaml as JSON, short-form tags included, with
// cfn-lint's own decoder.
const decodeScript = `import json, sys
from cfnlint.decode import decode
tpl, matches = decode(sys.argv[1])
if matches: sys.exit("decode: %s" % matches)
print(json.dumps(tpl, default=str))`

// transformScript is what `sam package` and CloudFormation's transform do to
// template.yaml: every function's CodeUri becomes an s3:// URI, then the
// SAM translator expands the AWS::Serverless resources. Managed policies
// are never looked up by name (that would ask IAM): the template names them
// by ARN.
const transformScript = `import json, sys
from cfnlint.decode import decode
from samtranslator.translator.transform import transform
class NoLookups:
    def load(self):
        sys.exit("the translator asked IAM for a managed policy by name")
tpl, matches = decode(sys.argv[1])
if matches: sys.exit("decode: %s" % matches)
for name, r in tpl["Resources"].items():
    if r.get("Type") == "AWS::Serverless::Function":
        r["Properties"]["CodeUri"] = "s3://runfleet-artifacts/%s.zip" % name
print(json.dumps(transform(tpl, {}, NoLookups()), default=str))`

var (
	templateOnce                  sync.Once
	rawTemplate, transformedTempl map[string]any
	templateErr                   error
)

// templates returns template.yaml as written and as transformed, once per
// test binary (the translator takes a second or two).
func templates(t testing.TB) (raw, transformed map[string]any) {
	t.Helper()
	py := pythonWith(t, "cfn-lint aws-sam-translator", "cfnlint", "samtranslator")
	templateOnce.Do(func() {
		run := func(script string) (map[string]any, error) {
			cmd := exec.Command(py, "-c", script, "../template.yaml")
			// The translator reads the region for AWS::Region's default.
			cmd.Env = append(os.Environ(), "AWS_DEFAULT_REGION=us-east-1")
			out, err := cmd.Output()
			if err != nil {
				stderr := ""
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = string(ee.Stderr)
				}
				return nil, fmt.Errorf("%v\n%s", err, stderr)
			}
			var m map[string]any
			return m, json.Unmarshal(out, &m)
		}
		if rawTemplate, templateErr = run(decodeScript); templateErr != nil {
			templateErr = fmt.Errorf("decoding template.yaml: %w", templateErr)
			return
		}
		if transformedTempl, templateErr = run(transformScript); templateErr != nil {
			templateErr = fmt.Errorf("transforming template.yaml with aws-sam-translator: %w", templateErr)
		}
	})
	if templateErr != nil {
		t.Fatal(templateErr)
	}
	return rawTemplate, transformedTempl
}

// obj and list read decoded JSON without a type switch at every step.
func jsonObj(v any, path ...string) map[string]any {
	for _, p := range path {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	m, _ := v.(map[string]any)
	return m
}

func jsonList(v any) []any {
	l, _ := v.([]any)
	return l
}

// resources returns the logical ids of the template's resources of type typ, sorted.
func resourcesOfType(tpl map[string]any, typ string) []string {
	var ids []string
	for id, r := range jsonObj(tpl, "Resources") {
		if jsonObj(r)["Type"] == typ {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// cfnResolver evaluates CloudFormation's intrinsic functions in a template
// for one set of parameter values, as CloudFormation would at deploy time:
// enough of them (Ref, Fn::GetAtt, Fn::Sub, Fn::If, Fn::Join, Fn::Equals,
// Fn::Not, Fn::And, Fn::Or, Condition) for template.yaml. Anything else is
// an error, so a template using more fails the tests loudly.
type cfnResolver struct {
	tpl    map[string]any
	params map[string]any    // parameter or pseudo parameter -> string or []string
	refs   map[string]string // resource logical id -> what Ref gives
	attrs  map[string]string // "LogicalId.Attr" -> what Fn::GetAtt gives
	conds  map[string]bool
}

// noValue is AWS::NoValue: the element or key it is in disappears.
var noValue = &struct{ noValue bool }{}

// Pseudo parameters as the tests deploy, and the stream function's URL
// (the one attribute the environments take from a resource that is not a
// table).
const (
	testRegion    = "us-east-1"
	testAccount   = "123456789012"
	testStreamURL = "https://runfleet-stream-0123456789.lambda-url.us-east-1.on.aws/"
)

func newResolver(tpl map[string]any, overrides map[string]any) *cfnResolver {
	r := &cfnResolver{tpl: tpl, params: map[string]any{
		"AWS::Region": testRegion, "AWS::AccountId": testAccount, "AWS::Partition": "aws",
		"AWS::URLSuffix": "amazonaws.com", "AWS::StackName": "runfleet",
	}, refs: map[string]string{}, attrs: map[string]string{"StreamFunctionUrl.FunctionUrl": testStreamURL}, conds: map[string]bool{}}
	for name, p := range jsonObj(tpl, "Parameters") {
		def := jsonObj(p)["Default"]
		if jsonObj(p)["Type"] == "CommaDelimitedList" {
			r.params[name] = strings.Split(fmt.Sprint(def), ",")
		} else if def != nil {
			r.params[name] = fmt.Sprint(def)
		}
	}
	for k, v := range overrides {
		r.params[k] = v
	}
	// The stack's queues, as SQS names them (the wake queue is in every
	// function's environment).
	for _, id := range resourcesOfType(tpl, "AWS::SQS::Queue") {
		r.refs[id], r.attrs[id+".Arn"], r.attrs[id+".QueueName"] = testQueueURL(id), testQueueARN(id), testQueueName(id)
	}
	return r
}

// testQueueName, testQueueURL and testQueueARN are a queue's as the tests
// deploy it.
func testQueueName(id string) string { return "runfleet-" + id }
func testQueueURL(id string) string {
	return fmt.Sprintf("https://sqs.%s.amazonaws.com/%s/%s", testRegion, testAccount, testQueueName(id))
}
func testQueueARN(id string) string {
	return fmt.Sprintf("arn:aws:sqs:%s:%s:%s", testRegion, testAccount, testQueueName(id))
}

// resolve evaluates v; a map or list containing AWS::NoValue loses that key
// or element.
func (r *cfnResolver) resolve(v any) (any, error) {
	switch x := v.(type) {
	case []any:
		out := []any{}
		for _, e := range x {
			ev, err := r.resolve(e)
			if err != nil {
				return nil, err
			}
			if ev != noValue {
				out = append(out, ev)
			}
		}
		return out, nil
	case map[string]any:
		if len(x) == 1 {
			for fn, arg := range x {
				if fn == "Ref" || fn == "Condition" || strings.HasPrefix(fn, "Fn::") {
					return r.intrinsic(fn, arg)
				}
			}
		}
		out := map[string]any{}
		for k, e := range x {
			ev, err := r.resolve(e)
			if err != nil {
				return nil, err
			}
			if ev != noValue {
				out[k] = ev
			}
		}
		return out, nil
	}
	return v, nil
}

func (r *cfnResolver) intrinsic(fn string, arg any) (any, error) {
	args := jsonList(arg)
	switch fn {
	case "Ref":
		name := fmt.Sprint(arg)
		if name == "AWS::NoValue" {
			return noValue, nil
		}
		if v, ok := r.params[name]; ok {
			return v, nil
		}
		if v, ok := r.refs[name]; ok {
			return v, nil
		}
		return nil, fmt.Errorf("Ref %s: no value given", name)
	case "Fn::GetAtt":
		key := ""
		if s, ok := arg.(string); ok {
			key = s
		} else if len(args) == 2 {
			key = fmt.Sprint(args[0]) + "." + fmt.Sprint(args[1])
		}
		if v, ok := r.attrs[key]; ok {
			return v, nil
		}
		return nil, fmt.Errorf("Fn::GetAtt %s: no value given", key)
	case "Fn::Sub":
		text, vars := "", map[string]any{}
		if s, ok := arg.(string); ok {
			text = s
		} else if len(args) == 2 {
			text, _ = args[0].(string)
			vars = jsonObj(args[1])
		}
		return r.sub(text, vars)
	case "Fn::If":
		if len(args) != 3 {
			return nil, fmt.Errorf("Fn::If takes 3 arguments: %v", arg)
		}
		ok, err := r.condition(fmt.Sprint(args[0]))
		if err != nil {
			return nil, err
		}
		if ok {
			return r.resolve(args[1])
		}
		return r.resolve(args[2])
	case "Fn::Join":
		if len(args) != 2 {
			return nil, fmt.Errorf("Fn::Join takes 2 arguments: %v", arg)
		}
		items, err := r.resolve(args[1])
		if err != nil {
			return nil, err
		}
		return strings.Join(jsonStrings(items), fmt.Sprint(args[0])), nil
	case "Fn::Equals":
		a, err := r.resolve(args[0])
		if err != nil {
			return nil, err
		}
		b, err := r.resolve(args[1])
		if err != nil {
			return nil, err
		}
		return fmt.Sprint(a) == fmt.Sprint(b), nil
	case "Fn::Not", "Fn::And", "Fn::Or":
		var vals []bool
		for _, a := range args {
			v, err := r.resolve(a)
			if err != nil {
				return nil, err
			}
			b, ok := v.(bool)
			if !ok {
				return nil, fmt.Errorf("%s of a non-condition %v", fn, a)
			}
			vals = append(vals, b)
		}
		switch fn {
		case "Fn::Not":
			return !vals[0], nil
		case "Fn::And":
			return !containsValue(vals, false), nil
		}
		return containsValue(vals, true), nil
	case "Condition":
		return r.condition(fmt.Sprint(arg))
	}
	return nil, fmt.Errorf("%s is not supported by the tests' resolver", fn)
}

func containsValue[T comparable](xs []T, v T) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
}

func jsonStrings(v any) []string {
	if s, ok := v.([]string); ok {
		return s
	}
	var out []string
	for _, e := range jsonList(v) {
		out = append(out, fmt.Sprint(e))
	}
	return out
}

func (r *cfnResolver) condition(name string) (bool, error) {
	if v, ok := r.conds[name]; ok {
		return v, nil
	}
	expr, ok := jsonObj(r.tpl, "Conditions")[name]
	if !ok {
		return false, fmt.Errorf("condition %s is not defined", name)
	}
	v, err := r.resolve(expr)
	if err != nil {
		return false, fmt.Errorf("condition %s: %w", name, err)
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("condition %s is not a boolean: %v", name, v)
	}
	r.conds[name] = b
	return b, nil
}

var subVar = regexp.MustCompile(`\$\{([^}!][^}]*)\}`)

func (r *cfnResolver) sub(text string, vars map[string]any) (string, error) {
	var firstErr error
	out := subVar.ReplaceAllStringFunc(text, func(m string) string {
		name := m[2 : len(m)-1]
		var v any
		var err error
		switch {
		case vars[name] != nil:
			v, err = r.resolve(vars[name])
		case strings.Contains(name, ".") && !strings.HasPrefix(name, "AWS::"):
			v, err = r.intrinsic("Fn::GetAtt", name)
		default:
			v, err = r.intrinsic("Ref", name)
		}
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("Fn::Sub %q: %w", text, err)
		}
		return fmt.Sprint(v)
	})
	return strings.ReplaceAll(out, "${!", "${"), firstErr
}

// mustResolve resolves v or fails the test.
func (r *cfnResolver) mustResolve(t testing.TB, v any) any {
	t.Helper()
	out, err := r.resolve(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
