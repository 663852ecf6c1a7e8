package config

import (
	"encoding/json"
	"os"
	"path/filepath"
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
		"unknown field":                {`{"dataDir":"/d","api":{"tokenFile":"/t"},"prxy":{}}`, `unknown field "prxy"`},
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
		{`{"memmory": "2GiB"}`, "memmory"},
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
