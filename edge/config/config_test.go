package config

import (
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
	if c.Runner.CancelGrace.D() != 10*time.Second || c.Proxy.Audit.Keep != 5 || c.Runner.Egress != TaskEgressConfined || c.Runner.MinFreeBytes != 1<<30 {
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
		"proxy on all":                 {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"listen":":7071"}}`, `proxy.listen: ":7071" is not a loopback address`},
		"proxy on a LAN IP":            {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"listen":"192.168.1.5:7071"}}`, "proxy.listen"},
		"proxy on a name":              {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"listen":"edge.example.com:7071"}}`, "proxy.listen"},
		"proxy behind TLS":             {`{"dataDir":"/d","api":{"tokenFile":"/t","tls":{"certFile":"/c","keyFile":"/k"}},"proxy":{"listen":"[::]:7071"}}`, "proxy.listen"},
		"negative reserve":             {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"minFreeBytes":-1}}`, "runner.minFreeBytes: -1 is under the smallest reserve"},
		"reserve too small":            {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"minFreeBytes":4096}}`, "runner.minFreeBytes: 4096"},
		"reserve as a string":          {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"minFreeBytes":"1GiB"}}`, "runner.minFreeBytes"},
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
