package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/config"
)

// goodConfig is a config edge serve starts with once its host token and
// secrets file are beside it (checkTree); its paths are relative, so they
// resolve into the test's folder.
const goodConfig = `{"dataDir": "data", "api": {"tokenFile": "host-token"},
	"policy": {"projects": {"acme": {"keys": {
		"OPENAI_API_KEY": {"domains": ["API.openai.com."], "placeholder": {"prefix": "sk-"}},
		"DEPLOY": {"kind": "aws", "domains": ["s3.us-east-1.amazonaws.com"], "aws": {"regions": ["us-east-1"], "services": ["s3"],
			"assumeRole": {"roleArn": "arn:aws:iam::123456789012:role/deploy"}}},
		"GIT_SSH": {"kind": "ssh", "domains": ["github.com:22"], "ssh": {"allow": ["git-upload-pack"], "repositories": ["acme/*"],
			"knownHosts": ["github.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"]}}}}}},
	"secrets": {"file": "secrets.json"},
	"agents": {"shell": {"argv": ["sh", "-c", "{prompt}"]}},
	"runner": {"user": "nobody"}}`

// realValue is the secrets file's value: no output may quote it.
const realValue = "real-value-0123456789"

// checkTree makes a folder holding edge.json (text, with "<dir>" standing
// for the folder), a host token and a secrets file, each private; it
// returns the folder and the config's path.
func checkTree(t *testing.T, text string) (dir, path string) {
	t.Helper()
	dir = t.TempDir()
	writeFile(t, filepath.Join(dir, "host-token"), "token-0123456789", 0o600)
	writeFile(t, filepath.Join(dir, "secrets.json"), `{"acme/OPENAI_API_KEY": "`+realValue+`"}`, 0o600)
	path = filepath.Join(dir, "edge.json")
	writeFile(t, path, strings.ReplaceAll(text, "<dir>", dir), 0o600)
	return dir, path
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// snapshot is every entry under root: its mode, size, modification time
// and, for a file, a digest of its content.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	entries := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		entry := fmt.Sprintf("%v %d %d", fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			entry += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		entries[p] = entry
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// unchanged fails the test when root differs from before.
func unchanged(t *testing.T, what, root string, before map[string]string) {
	t.Helper()
	after := snapshot(t, root)
	for p, b := range before {
		if a, ok := after[p]; !ok {
			t.Errorf("%s removed %s", what, p)
		} else if a != b {
			t.Errorf("%s changed %s: %s, was %s", what, p, a, b)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s made %s", what, p)
		}
	}
}

func runEdge(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// A good config: what each key may reach, notes on what serve would make,
// "config ok"; nothing made, the data dir included. edge policy check, its
// alias, says the same.
func TestConfigCheckSaysOKAndWhatEachKeyReaches(t *testing.T) {
	t.Setenv("EDGE_SECRETS_PROXY", "")
	dir, path := checkTree(t, goodConfig)
	before := snapshot(t, dir)
	code, out, errOut := runEdge("config", "check", "--config", path)
	want := strings.ReplaceAll(`acme/DEPLOY: aws; domains s3.us-east-1.amazonaws.com; signs for regions us-east-1, services s3; task variables AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY[, AWS_SESSION_TOKEN]; credentials from a per-run session of arn:aws:iam::123456789012:role/deploy (1h0m0s)
acme/GIT_SSH: ssh; domains github.com:22; logs in as git; runs git-upload-pack on repositories acme/*; 1 known host key(s); no task variable
acme/OPENAI_API_KEY: domains api.openai.com; substituted in header; placeholder "sk-" + 45 letters and digits
note: dataDir: <dir>/data does not exist: edge serve makes it (mode 0711)
note: runner.workDir: <dir>/data/work does not exist: edge serve makes it (mode 0711)
note: ca.sealKeyFile: <dir>/data/seal.key does not exist: edge serve makes a new seal key there (mode 0600)
config ok: <path>: 3 key(s), 1 agent(s)
`, "<dir>", dir)
	want = strings.ReplaceAll(want, "<path>", path)
	if code != 0 || out != want || errOut != "" {
		t.Fatalf("edge config check: exit %d, stderr %q, stdout\n%s\nwant exit 0 and\n%s", code, errOut, out, want)
	}
	unchanged(t, "edge config check", dir, before)

	aliasCode, aliasOut, aliasErr := runEdge("policy", "check", "--config", path)
	if aliasCode != code || aliasOut != out || aliasErr != errOut {
		t.Errorf("edge policy check: exit %d, stdout\n%s\nstderr %q\nwant as edge config check", aliasCode, aliasOut, aliasErr)
	}
	unchanged(t, "edge policy check", dir, before)

	// A data dir serve would give another mode keeps its own.
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, dir)
	code, out, _ = runEdge("config", "check", "--config", path)
	if note := "note: dataDir: " + dir + "/data has mode 0755: edge serve sets it to 0711\n"; code != 0 || !strings.Contains(out, note) {
		t.Errorf("exit %d, stdout\n%s\nwant exit 0 and %q", code, out, note)
	}
	unchanged(t, "edge config check", dir, before)
}

// A key that takes its value from Fleet says so in the check's line for
// it (issue 33).
func TestConfigCheckSaysWhichKeysTakeTheirValueFromFleet(t *testing.T) {
	t.Setenv("EDGE_SECRETS_PROXY", "")
	_, path := checkTree(t, strings.Replace(goodConfig, `"placeholder": {"prefix": "sk-"}}`, `"placeholder": {"prefix": "sk-"}, "source": "fleet"}`, 1))
	code, out, errOut := runEdge("config", "check", "--config", path)
	want := `acme/OPENAI_API_KEY: domains api.openai.com; substituted in header; placeholder "sk-" + 45 letters and digits; value from Fleet, per run (never the secrets source)` + "\n"
	if code != 0 || !strings.Contains(out, want) || errOut != "" {
		t.Fatalf("edge config check: exit %d, stderr %q, stdout\n%s\nwant exit 0 and the line\n%s", code, errOut, out, want)
	}
}

// Each broken config is refused by edge config check with every problem
// listed, each at its JSON path, and by edge serve with the same list and
// nothing written: the folder holding the config and the data dir (when
// there is one) is as it was, byte for byte.
func TestBrokenConfigsAreRefusedByCheckAndServeAlike(t *testing.T) {
	certPEM, keyPEM := selfSigned(t)
	_, otherKeyPEM := selfSigned(t)
	for name, tc := range map[string]struct {
		config string
		setup  func(t *testing.T, dir string)
		env    string // EDGE_SECRETS_PROXY
		want   []string
	}{
		"one of each kind": {
			config: strings.NewReplacer(
				`"API.openai.com."`, `"*.openai.com", "10.0.0.1"`,
				`"github.com:22"], "ssh"`, `"github.com"], "ssh"`,
				`"runner": {"user": "nobody"}`, `"runner": {"user": "nobody", "maxConcurrent": -1, "maxOutputBytes": "64MiB", "maxDurationn": "1h", "egress": "open", "limits": "off"},
				"proxy": {"egress": "wide"}`,
			).Replace(goodConfig),
			setup: func(t *testing.T, dir string) {
				if err := os.Chmod(filepath.Join(dir, "host-token"), 0o644); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, "secrets.json"), `{"acme/K": "`+realValue+`", "acme/K": "`+realValue+`"}`, 0o600)
			},
			want: []string{
				"runner.maxOutputBytes: must be an integer",
				`runner.maxDurationn: unknown field; did you mean "maxDuration"?`,
				`runner.limits: must be "none" or an object with memory, pids and cpu, not "off"`,
				`proxy.egress: must be "open" or "strict", not "wide"`,
				`runner.egress: must be "confined" or "insecureOpen", not "open"`,
				"runner.maxConcurrent: must not be negative",
				`policy.projects.acme.keys.GIT_SSH.domains[0]: "github.com": an ssh key's domain names its port (github.com:22, or ssh.github.com:443): without one it means 443`,
				`policy.projects.acme.keys.GIT_SSH.ssh.knownHosts: lists no host key for github.com (as "[github.com]:443"): add the upstream's keys (ssh-keyscan, or its published list)`,
				`policy.projects.acme.keys.OPENAI_API_KEY.domains[0]: "*.openai.com": a wildcard is not allowed: list each name`,
				`policy.projects.acme.keys.OPENAI_API_KEY.domains[1]: "10.0.0.1": an IP address is not allowed: use a name`,
				"api.tokenFile: <dir>/host-token is readable by every user (mode 0644), tasks included; make it private (chmod o-rwx)",
				`secrets.file: secrets file <dir>/secrets.json: ["acme/K"]: the key is given more than once (JSON keys must be unique)`,
			},
		},
		"a key of kind aws taking its value from Fleet": {
			config: strings.Replace(goodConfig, `"DEPLOY": {"kind": "aws",`, `"DEPLOY": {"kind": "aws", "source": "fleet",`, 1),
			want:   []string{`policy.projects.acme.keys.DEPLOY.source: "fleet" is only for a key sent as its value, not one of "kind": "aws": its value never travels, so Fleet has none to give it`},
		},
		"a key given twice": {
			config: strings.Replace(goodConfig, `"runner": {"user": "nobody"}`, `"runner": {"user": "nobody", "user": "root"}`, 1),
			want:   []string{"runner.user: the key is given more than once (JSON keys must be unique)"},
		},
		"not JSON": {
			config: goodConfig + "}",
			want:   []string{"not valid JSON at line 10, column 31: invalid character '}' after top-level value"},
		},
		"files missing": {
			config: strings.NewReplacer(`"tokenFile": "host-token"`, `"tokenFile": "gone", "listen": "0.0.0.0:7070", "tls": {"certFile": "host.crt", "keyFile": "host.key"}`,
				`"file": "secrets.json"`, `"file": "nowhere.json"`).Replace(goodConfig),
			want: []string{
				"api.tokenFile: <dir>/gone does not exist",
				"api.tls.certFile: <dir>/host.crt does not exist",
				"api.tls.keyFile: <dir>/host.key does not exist",
				"secrets.file: <dir>/nowhere.json does not exist",
			},
		},
		"an empty host token": {
			config: goodConfig,
			setup:  func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "host-token"), " \n", 0o600) },
			want:   []string{"api.tokenFile: <dir>/host-token is empty"},
		},
		"a secrets file of numbers": {
			config: goodConfig,
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "secrets.json"), `{"acme/K": 7}`, 0o600)
			},
			want: []string{"secrets.file: secrets file <dir>/secrets.json: not a JSON object of strings"},
		},
		"no secrets source": {
			config: strings.Replace(goodConfig, `"secrets": {"file": "secrets.json"},`, "", 1),
			want:   []string{"secrets: set secrets.file or secrets.awsSecretsManager, or keep the secrets proxy down with EDGE_SECRETS_PROXY=off"},
		},
		"a kill switch misspelt": {
			config: goodConfig,
			env:    "of",
			want:   []string{`EDGE_SECRETS_PROXY="of": set it to "off" to keep the secrets proxy down, or leave it unset (or "on") to run it`},
		},
		"a data dir that is a file": {
			config: goodConfig,
			setup:  func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "data"), "", 0o600) },
			want:   []string{"dataDir: <dir>/data is not a directory"},
		},
		"a seal key others can read": {
			config: goodConfig,
			setup: func(t *testing.T, dir string) {
				if err := os.Mkdir(filepath.Join(dir, "data"), 0o711); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, "data", "seal.key"), strings.Repeat("k", 32), 0o644)
			},
			want: []string{"ca.sealKeyFile: ca: seal key file <dir>/data/seal.key has mode 0644: it must not be readable by group or others (chmod 600)"},
		},
		"a TLS key of another certificate": {
			config: strings.Replace(goodConfig, `"tokenFile": "host-token"`, `"tokenFile": "host-token", "tls": {"certFile": "host.crt", "keyFile": "host.key"}`, 1),
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "host.crt"), string(certPEM), 0o644)
				writeFile(t, filepath.Join(dir, "host.key"), string(otherKeyPEM), 0o600)
			},
			want: []string{"api.tls: the certificate and key do not load as a pair: tls: private key does not match public key"},
		},
		"upstream roots that are no PEM": {
			config: strings.Replace(goodConfig, `"runner":`, `"proxy": {"upstream": {"extraRootsFile": "roots.pem"}}, "runner":`, 1),
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "roots.pem"), string(keyPEM[:20]), 0o644)
			},
			want: []string{"proxy.upstream.extraRootsFile: upstream.extraRootsFile <dir>/roots.pem: no PEM certificate in it"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("EDGE_SECRETS_PROXY", tc.env)
			dir, path := checkTree(t, tc.config)
			if tc.setup != nil {
				tc.setup(t, dir)
			}
			noun := "problems"
			if len(tc.want) == 1 {
				noun = "problem"
			}
			list := fmt.Sprintf(": config %s has %d %s; edge serve refuses it until each is fixed:\n  %s\n", path, len(tc.want), noun,
				strings.ReplaceAll(strings.Join(tc.want, "\n  "), "<dir>", dir))
			before := snapshot(t, dir)

			code, _, errOut := runEdge("config", "check", "--config", path)
			if code != 1 || errOut != "edge config check"+list {
				t.Fatalf("edge config check: exit %d, stderr\n%s\nwant exit 1 and\n%s", code, errOut, "edge config check"+list)
			}
			unchanged(t, "edge config check", dir, before)

			code, out, errOut := runEdge("serve", "--config", path)
			if code != 1 || errOut != "edge serve"+list || out != "" {
				t.Errorf("edge serve: exit %d, stdout %q, stderr\n%s\nwant exit 1 and\n%s", code, out, errOut, "edge serve"+list)
			}
			unchanged(t, "edge serve", dir, before)
			if strings.Contains(errOut, realValue) {
				t.Errorf("edge serve quoted the secrets file's value: %s", errOut)
			}
		})
	}
}

// selfSigned is a certificate for localhost and its key, in PEM.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// Every edge config shipped under infra/ (a JSON object with a dataDir)
// passes edge config check on a host that has the files it names: its
// absolute paths are moved under a folder of the test's, where the files
// are made (the token, the secrets file, the TLS pair, the upstream roots,
// each agent named by its path).
func TestShippedEdgeConfigsPassTheCheck(t *testing.T) {
	t.Setenv("EDGE_SECRETS_PROXY", "")
	var shipped []string
	err := filepath.WalkDir(filepath.Join("..", "infra"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".json" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var top map[string]json.RawMessage
		if json.Unmarshal(b, &top) == nil && top["dataDir"] != nil {
			shipped = append(shipped, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(shipped) == 0 {
		t.Fatal("no edge config under infra/: infra/edge.example.json should be one")
	}
	certPEM, keyPEM := selfSigned(t)
	for _, src := range shipped {
		t.Run(filepath.ToSlash(src), func(t *testing.T) {
			root := t.TempDir()
			path := filepath.Join(root, filepath.Base(src))
			writeFile(t, path, string(moveUnder(t, src, root)), 0o600)
			cfg, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, cfg.API.TokenFile, "token-0123456789", 0o600)
			if f := cfg.Secrets.File; f != "" {
				writeFile(t, f, "{}", 0o600)
			}
			if tls := cfg.API.TLS; tls.Enabled() {
				writeFile(t, tls.CertFile, string(certPEM), 0o644)
				writeFile(t, tls.KeyFile, string(keyPEM), 0o600)
			}
			if f := cfg.Proxy.Upstream.ExtraRootsFile; f != "" {
				writeFile(t, f, string(certPEM), 0o644)
			}
			for _, a := range cfg.Agents {
				if filepath.IsAbs(a.Argv[0]) {
					writeFile(t, a.Argv[0], "#!/bin/sh\n", 0o755)
				}
			}
			for _, r := range cfg.Runner.Roots {
				if err := os.MkdirAll(r, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			code, out, errOut := runEdge("config", "check", "--config", path)
			if code != 0 || !strings.HasSuffix(out, "config ok: "+path+fmt.Sprintf(": %d key(s), %d agent(s)\n", countKeys(cfg), len(cfg.Agents))) {
				t.Errorf("edge config check %s: exit %d, stdout\n%s\nstderr\n%s", src, code, out, errOut)
			}
		})
	}
}

// moveUnder is the config at src with each absolute path it names (files,
// directories, agents' binaries) moved under root.
func moveUnder(t *testing.T, src, root string) []byte {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	move := func(v any) any {
		if s, ok := v.(string); ok && filepath.IsAbs(s) {
			return filepath.Join(root, s)
		}
		return v
	}
	obj := func(m map[string]any, key string) map[string]any {
		o, _ := m[key].(map[string]any)
		if o == nil {
			o = map[string]any{}
		}
		return o
	}
	for _, f := range [][]string{{"dataDir"}, {"api", "tokenFile"}, {"api", "tls", "certFile"}, {"api", "tls", "keyFile"},
		{"proxy", "upstream", "extraRootsFile"}, {"ca", "sealKeyFile"}, {"secrets", "file"}, {"runner", "workDir"}} {
		m := c
		for _, k := range f[:len(f)-1] {
			m = obj(m, k)
		}
		if v, ok := m[f[len(f)-1]]; ok {
			m[f[len(f)-1]] = move(v)
		}
	}
	if roots, ok := obj(c, "runner")["roots"].([]any); ok {
		for i := range roots {
			roots[i] = move(roots[i])
		}
	}
	for _, a := range obj(c, "agents") {
		agent, _ := a.(map[string]any)
		if argv, ok := agent["argv"].([]any); ok && len(argv) > 0 {
			argv[0] = move(argv[0])
		}
	}
	out, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func countKeys(c *config.Config) int {
	n := 0
	for _, p := range c.Policy.Projects {
		n += len(p.Keys)
	}
	return n
}
