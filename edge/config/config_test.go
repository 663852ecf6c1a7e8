package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const designExample = `{
  "dataDir": "/var/lib/runfleet-edge",
  "api":    {"listen": "127.0.0.1:7070", "tokenFile": "/etc/runfleet/host-token",
             "tls": {"certFile": "", "keyFile": ""}},
  "proxy":  {"listen": "127.0.0.1:7071", "egress": "open",
             "upstream": {"resolver": "uplink", "resolve": {"api.example.test": "127.0.0.1"},
                          "allowPrivate": ["127.0.0.0/8"], "extraRootsFile": "upstream-ca.pem"}},
  "ca":     {"lifetime": "8760h", "successorWindow": "2160h", "switchBefore": "24h",
             "leafLifetime": "168h", "sealKeyFile": "/var/lib/runfleet-edge/seal.key"},
  "policy": {"projects": {"acme": {"keys": {"OPENAI_API_KEY": {
               "domains": ["api.openai.com"], "in": ["header"],
               "placeholder": {"prefix": "sk-", "length": 48}}}}}},
  "secrets": {"file": "/etc/runfleet/secrets.json"},
  "agents": {"shell": {"argv": ["sh", "-c", "{prompt}"]}},
  "runner": {"user": "nobody", "roots": ["/srv/work"], "maxConcurrent": 8,
             "maxDuration": "2h", "maxOutputBytes": 67108864, "drainTimeout": "5m",
             "retention": "168h"}
}`

func TestLoadDesignExample(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.json")
	if err := os.WriteFile(path, []byte(designExample), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatalf("the design's example config does not load: %v", err)
	}
	if c.CA.SuccessorWindow.D() != 90*24*time.Hour || c.Runner.DrainTimeout.D() != 5*time.Minute {
		t.Fatalf("durations parsed wrong: %+v %+v", c.CA, c.Runner)
	}
	if got, want := c.Proxy.Upstream.ExtraRootsFile, filepath.Join(dir, "upstream-ca.pem"); got != want {
		t.Fatalf("relative extraRootsFile resolved to %q, want %q", got, want)
	}
	if c.Runner.CancelGrace.D() != 10*time.Second || c.Proxy.Audit.Keep != 5 || c.Runner.Egress != "confined" || c.Runner.MinFreeBytes != 1<<30 {
		t.Fatalf("defaults not applied: %+v %+v", c.Runner, c.Proxy.Audit)
	}
	if got := c.Policy.Projects["acme"].Keys["OPENAI_API_KEY"].Placeholder; got.Prefix != "sk-" || got.Length != 48 {
		t.Fatalf("placeholder shape = %+v", got)
	}
}

func TestBadConfigsNameTheField(t *testing.T) {
	for name, tc := range map[string]struct{ json, want string }{
		"unknown field":                {`{"dataDir":"/d","api":{"tokenFile":"/t"},"prxy":{}}`, `prxy: unknown field; did you mean "proxy"?`},
		"wrong type":                   {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"maxConcurrent":"8"}}`, "runner.maxConcurrent"},
		"bad duration":                 {`{"dataDir":"/d","api":{"tokenFile":"/t"},"ca":{"lifetime":"a year"}}`, `invalid duration "a year"`},
		"missing data dir":             {`{"api":{"tokenFile":"/t"}}`, "dataDir: is required"},
		"bad egress":                   {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"egress":"wide"}}`, "proxy.egress"},
		"bad task egress":              {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"egress":"open"}}`, "runner.egress"},
		"bad cidr":                     {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"upstream":{"allowPrivate":["10/8"]}}}`, "allowPrivate"},
		"window past life":             {`{"dataDir":"/d","api":{"tokenFile":"/t"},"ca":{"lifetime":"48h","successorWindow":"72h"}}`, "ca.successorWindow"},
		"agent without argv":           {`{"dataDir":"/d","api":{"tokenFile":"/t"},"agents":{"x":{}}}`, "agents.x.argv"},
		"proxy off loopback":           {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"listen":"0.0.0.0:7071"}}`, `proxy.listen: "0.0.0.0:7071" is not a loopback address`},
		"pprof off loopback":           {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"pprof":"0.0.0.0:6060"}}`, `proxy.pprof: "0.0.0.0:6060" is not a loopback address`},
		"pprof not an address":         {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"pprof":"6060"}}`, `proxy.pprof: "6060" is not a loopback address`},
		"proxy on all":                 {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"listen":":7071"}}`, `proxy.listen: ":7071" is not a loopback address`},
		"proxy on a LAN IP":            {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"listen":"192.168.1.5:7071"}}`, "proxy.listen"},
		"proxy on a name":              {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"listen":"edge.example.com:7071"}}`, "proxy.listen"},
		"proxy behind TLS":             {`{"dataDir":"/d","api":{"tokenFile":"/t","tls":{"certFile":"/c","keyFile":"/k"}},"proxy":{"listen":"[::]:7071"}}`, "proxy.listen"},
		"negative reserve":             {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"minFreeBytes":-1}}`, "runner.minFreeBytes: -1 is under the smallest reserve"},
		"reserve too small":            {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"minFreeBytes":4096}}`, "runner.minFreeBytes: 4096"},
		"reserve not a size":           {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"minFreeBytes":"a lot"}}`, `invalid size "a lot"`},
		"ledger bound negative":        {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"ledger":{"maxRecords":-1}}}`, "proxy.ledger.maxRecords: must be from 1 to 1000000, not -1"},
		"ledger bound too large":       {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"ledger":{"maxRecords":1000001}}}`, "proxy.ledger.maxRecords: must be from 1 to 1000000"},
		"ledger bound not a number":    {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"ledger":{"maxRecords":"10k"}}}`, "proxy.ledger.maxRecords: must be an integer"},
		"ledger key misspelt":          {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"ledger":{"maxRecord":10}}}`, `proxy.ledger.maxRecord: unknown field; did you mean "maxRecords"?`},
		"api off loopback without tls": {`{"dataDir":"/d","api":{"listen":"0.0.0.0:7070","tokenFile":"/t"}}`, `api.listen: "0.0.0.0:7070" is not a loopback address and api.tls is not set`},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "edge.json")
			if err := os.WriteFile(path, []byte(tc.json), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load error = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// Loopback listeners, and a host API off loopback with TLS, are accepted.
func TestListenAddressesOnLoopbackOrBehindTLS(t *testing.T) {
	for _, api := range []string{
		`{"listen":"127.0.0.1:7070","tokenFile":"/t"}`,
		`{"listen":"[::1]:7070","tokenFile":"/t"}`,
		`{"listen":"localhost:7070","tokenFile":"/t"}`,
		`{"listen":"127.0.0.2:7070","tokenFile":"/t"}`,
		`{"listen":"0.0.0.0:7070","tokenFile":"/t","tls":{"certFile":"/c","keyFile":"/k"}}`,
	} {
		for _, proxy := range []string{"127.0.0.1:7071", "[::1]:7071", "localhost:0", "[::ffff:127.0.0.1]:7071"} {
			c, err := Parse([]byte(`{"dataDir":"/d","api":` + api + `,"proxy":{"listen":"` + proxy + `"}}`))
			if err != nil {
				t.Fatal(err)
			}
			c.Defaults()
			if err := c.Validate(); err != nil {
				t.Errorf("api %s, proxy %s: %v", api, proxy, err)
			}
		}
	}
}

// The example deployment config (api.listen on every interface, with TLS)
// passes.
func TestExampleDeploymentConfigLoads(t *testing.T) {
	if _, err := Load(filepath.Join("..", "..", "infra", "edge.example.json")); err != nil {
		t.Fatal(err)
	}
}

func TestRunnerLimits(t *testing.T) {
	load := func(limits string) (*Config, error) {
		c, err := Parse([]byte(`{"dataDir": "/var/lib/edge", "api": {"tokenFile": "/etc/edge/token"}, "runner": {"limits": ` + limits + `}}`))
		if err != nil {
			return nil, err
		}
		c.Defaults()
		return c, c.Validate()
	}
	c, err := load(`{}`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Runner.Limits, (Limits{Memory: 4 << 30, Pids: 4096, CPU: 4}); got != want {
		t.Errorf("defaults: got %+v, want %+v", got, want)
	}
	c, err = load(`{"memory": "1.5GiB", "pids": 256, "cpu": 0.5}`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Runner.Limits, (Limits{Memory: 3 << 29, Pids: 256, CPU: 0.5}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	c, err = load(`"none"`)
	if err != nil || !c.Runner.Limits.None || c.Runner.Limits.Memory != 0 {
		t.Errorf(`"none": got %+v, %v; want limits off, no defaults`, c.Runner.Limits, err)
	}
	for _, tc := range []struct{ limits, want string }{
		{`"off"`, `not "off"`},
		{`{"memmory": "2GiB"}`, `runner.limits.memmory: unknown field; did you mean "memory"?`},
		{`{"memory": "2 gigs"}`, `invalid size "2 gigs"`},
		{`{"memory": "1MiB"}`, "runner.limits.memory"},
		{`{"pids": -1}`, "runner.limits.pids"},
		{`{"pids": 2}`, "runner.limits.pids"},
		{`{"cpu": 0.001}`, "runner.limits.cpu"},
		{`{"cpu": -2}`, "runner.limits.cpu"},
	} {
		if _, err := load(tc.limits); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("limits %s: got %v, want an error naming %q", tc.limits, err, tc.want)
		}
	}
}

func TestBytes(t *testing.T) {
	for in, want := range map[string]Bytes{
		`1024`: 1024, `"512MiB"`: 512 << 20, `"2GiB"`: 2 << 30, `"1.5 GiB"`: 3 << 29, `"500MB"`: 500e6, `"64kB"`: 64000, `"7B"`: 7, `"12"`: 12,
	} {
		var b Bytes
		if err := json.Unmarshal([]byte(in), &b); err != nil || b != want {
			t.Errorf("%s: got %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{`"-1GiB"`, `"GiB"`, `"2 GB of memory"`, `true`, `"1e30TiB"`} {
		var b Bytes
		if err := json.Unmarshal([]byte(in), &b); err == nil {
			t.Errorf("%s: got %d, want an error", in, b)
		}
	}
}

// Read lists every problem of a config at once, each at its JSON path, in
// the order written: what cannot be decoded, then what is refused.
func TestReadListsEveryProblemAtItsPath(t *testing.T) {
	for name, tc := range map[string]struct {
		json string
		want []string
	}{
		"schema and values": {`{
			"dataDir": 7,
			"api": {"tokenFile": "/t", "tls": {"certFile": "/c"}},
			"proxy": {"egress": "wide", "upstream": {"allowPrivate": ["10.0.0.0/8", "10/8"], "resolve": {"api.example.test": "nowhere"}}},
			"agents": {"shell": {"argv": ["sh"], "envv": {}}, "empty": {"argv": []}},
			"runner": {"maxConcurrent": -1, "maxOutputBytes": "64MiB", "maxDurationn": "1h", "limits": {"cpu": 0.001, "memmory": "1GiB"}}
		}`, []string{
			"dataDir: must be a string",
			`agents.shell.envv: unknown field; did you mean "env"?`,
			"runner.maxOutputBytes: must be an integer",
			`runner.maxDurationn: unknown field; did you mean "maxDuration"?`,
			`runner.limits.memmory: unknown field; did you mean "memory"?`,
			"api.tls.keyFile: is required with api.tls.certFile",
			`proxy.egress: must be "open" or "strict", not "wide"`,
			`proxy.upstream.resolve["api.example.test"]: "nowhere" is not an IP address`,
			`proxy.upstream.allowPrivate[1]: "10/8" is not a CIDR such as 10.0.0.0/8`,
			"agents.empty.argv: is required",
			"runner.maxConcurrent: must not be negative",
			"runner.limits.cpu: 0.001 cores is under the kernel's minimum; give at least 0.01",
		}},
		"keys given twice": {`{"dataDir": "/d", "api": {"tokenFile": "/t"},
			"agents": {"shell": {"argv": ["sh"]}, "shell": {"argv": ["bash"]}}}`, []string{
			"agents.shell: the key is given more than once (JSON keys must be unique)",
		}},
		"a key twice in the policy": {`{"dataDir": "/d", "api": {"tokenFile": "/t"},
			"policy": {"projects": {"acme": {"keys": {"K": {"domains": ["a.example"], "domains": ["b.example"]}}}}}}`, []string{
			"policy.projects.acme.keys.K.domains: the key is given more than once (JSON keys must be unique)",
		}},
		"a field in other case": {`{"DataDir": "/d", "api": {"tokenFile": "/t"}}`, []string{
			`DataDir: unknown field; did you mean "dataDir"?`,
			"dataDir: is required",
		}},
		"not JSON": {"{\"dataDir\": \"/d\",\n  \"api\": {\"tokenFile\": \"/t\"}}}", []string{
			"not valid JSON at line 2, column 30: invalid character '}' after top-level value",
		}},
		"not an object": {`["dataDir", "/d"]`, []string{"not a JSON object"}},
		"trailing data": {`{"dataDir": "/d", "api": {"tokenFile": "/t"}} {}`, []string{
			"not valid JSON at line 1, column 47: invalid character '{' after top-level value",
		}},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "edge.json")
			if err := os.WriteFile(path, []byte(tc.json), 0o600); err != nil {
				t.Fatal(err)
			}
			_, ps := Read(path)
			got := make([]string, len(ps))
			for i, p := range ps {
				got[i] = p.Error()
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// The strict decoder decodes what encoding/json decodes, for every example
// config: it is stricter, never different.
func TestStrictDecodingMatchesEncodingJSON(t *testing.T) {
	examples := map[string][]byte{"design": []byte(designExample)}
	b, err := os.ReadFile(filepath.Join("..", "..", "infra", "edge.example.json"))
	if err != nil {
		t.Fatal(err)
	}
	examples["infra/edge.example.json"] = b
	examples["limits none, nulls"] = []byte(`{"dataDir": "/d", "api": {"tokenFile": "/t", "tls": null}, "secrets": {"awsSecretsManager": {"prefix": "p/"}},
		"agents": null, "runner": {"limits": "none", "roots": null}}`)
	for name, b := range examples {
		strict, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var plain Config
		if err := json.Unmarshal(b, &plain); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(*strict, plain) {
			t.Errorf("%s: the strict decoder read\n%+v\nencoding/json\n%+v", name, *strict, plain)
		}
	}
}
