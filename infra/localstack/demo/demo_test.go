package demo

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/shared/runspec"
)

func TestUpstreamAnswersWhetherTheCredentialWasRightNeverWhatItWas(t *testing.T) {
	u, err := StartUpstream(UpstreamConfig{Secret: "the-real-value"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close(context.Background())
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(u.CAPEM()) {
		t.Fatal("CAPEM holds no certificate")
	}
	// The name verifies against the upstream's own CA; the address is its listener's.
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, u.Addr())
		},
	}}
	for _, tc := range []struct {
		auth   string
		status int
		body   string
	}{
		{"Bearer the-real-value", 200, `{"authorized": true}`},
		{"Bearer demo-placeholder-0123456789", 401, `{"authorized": false}`},
		{"", 401, `{"authorized": false}`},
	} {
		req, _ := http.NewRequest("GET", u.URL(), nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || strings.TrimSpace(string(b)) != tc.body {
			t.Errorf("%q: %d %s, want %d %s", tc.auth, resp.StatusCode, b, tc.status, tc.body)
		}
	}
	if u.Authorized() != 1 || u.Refused() != 2 {
		t.Fatalf("counted %d authorized, %d refused", u.Authorized(), u.Refused())
	}
	if !strings.HasPrefix(u.URL(), "https://"+UpstreamName+":") || u.Domain() != UpstreamName+":"+strings.Split(u.Addr(), ":")[1] {
		t.Fatalf("URL %s, domain %s, addr %s", u.URL(), u.Domain(), u.Addr())
	}
}

func TestEdgeConfigLoadsAndGrantsTheDemoKeyForTheUpstreamOnly(t *testing.T) {
	u, err := StartUpstream(UpstreamConfig{Secret: "v"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close(context.Background())
	dir := t.TempDir()
	e := Edge{DataDir: filepath.Join(dir, "data"), WorkDir: filepath.Join(dir, "work"), TokenFile: filepath.Join(dir, "token"),
		SecretsFile: filepath.Join(dir, "secrets.json"), UpstreamCAFile: filepath.Join(dir, "ca.pem"), Upstream: u}
	path := filepath.Join(dir, "edge.json")
	if err := e.Write(path, e.Config()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, e.UpstreamCAFile} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", p, st, err)
		}
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Compile(cfg.Policy)
	if err != nil {
		t.Fatal(err)
	}
	for domain, want := range map[string]bool{u.Domain(): true, UpstreamName: false, "api.example.com": false} {
		declared, err := runspec.Request{Agent: Agent, Secrets: []runspec.Secret{{ProjectID: Project, Key: Key, Domains: []string{domain}}}}.Declare()
		if err != nil {
			t.Fatal(err)
		}
		granted, _ := pol.Grant(declared)
		if got := len(granted) == 1; got != want {
			t.Errorf("the demo key declared for %s: granted %v, want %v", domain, got, want)
		}
	}
	if cfg.Proxy.Upstream.Resolve[UpstreamName] != "127.0.0.1" || cfg.Proxy.Upstream.ExtraRootsFile != e.UpstreamCAFile ||
		cfg.Runner.WorkDir != e.WorkDir || cfg.Secrets.File != e.SecretsFile || len(cfg.Agents[Agent].Argv) != 5 {
		t.Fatalf("config %+v", cfg)
	}
	// On another loopback IP, the proxy pins the name to that one.
	u2, err := StartUpstream(UpstreamConfig{Secret: "v", Listen: "127.0.0.2:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer u2.Close(context.Background())
	e.Upstream = u2
	if got := e.Config().Proxy.Upstream.Resolve[UpstreamName]; got != "127.0.0.2" {
		t.Fatalf("%s pinned to %s, want 127.0.0.2", UpstreamName, got)
	}
	if err := (Edge{}).Validate(); err == nil {
		t.Fatal("an empty Edge validated")
	}
	if err := WriteSecretsFile(e.SecretsFile, "real"); err != nil {
		t.Fatal(err)
	}
	if v, err := ReadSecretsFile(e.SecretsFile); err != nil || v != "real" {
		t.Fatalf("read back %q %v", v, err)
	}
}
