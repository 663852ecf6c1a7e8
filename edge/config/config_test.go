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
	if c.Runner.CancelGrace.D() != 10*time.Second || c.Proxy.Audit.Keep != 5 || c.Runner.Egress != TaskEgressConfined {
		t.Fatalf("defaults not applied: %+v %+v", c.Runner, c.Proxy.Audit)
	}
	if got := c.Policy.Projects["acme"].Keys["OPENAI_API_KEY"].Placeholder; got.Prefix != "sk-" || got.Length != 48 {
		t.Fatalf("placeholder shape = %+v", got)
	}
}

func TestBadConfigsNameTheField(t *testing.T) {
	for name, tc := range map[string]struct{ json, want string }{
		"unknown field":      {`{"dataDir":"/d","api":{"tokenFile":"/t"},"prxy":{}}`, `unknown field "prxy"`},
		"wrong type":         {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"maxConcurrent":"8"}}`, "runner.maxConcurrent"},
		"bad duration":       {`{"dataDir":"/d","api":{"tokenFile":"/t"},"ca":{"lifetime":"a year"}}`, `invalid duration "a year"`},
		"missing data dir":   {`{"api":{"tokenFile":"/t"}}`, "dataDir: is required"},
		"bad egress":         {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"egress":"wide"}}`, "proxy.egress"},
		"bad task egress":    {`{"dataDir":"/d","api":{"tokenFile":"/t"},"runner":{"egress":"open"}}`, "runner.egress"},
		"bad cidr":           {`{"dataDir":"/d","api":{"tokenFile":"/t"},"proxy":{"upstream":{"allowPrivate":["10/8"]}}}`, "allowPrivate"},
		"window past life":   {`{"dataDir":"/d","api":{"tokenFile":"/t"},"ca":{"lifetime":"48h","successorWindow":"72h"}}`, "ca.successorWindow"},
		"agent without argv": {`{"dataDir":"/d","api":{"tokenFile":"/t"},"agents":{"x":{}}}`, "agents.x.argv"},
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
