package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPolicyCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(good, []byte(`{"dataDir": "/d", "api": {"tokenFile": "/t"}, "policy": {"projects": {"acme": {"keys": {
		"OPENAI_API_KEY": {"domains": ["API.openai.com."], "placeholder": {"prefix": "sk-"}},
		"DEPLOY": {"kind": "aws", "domains": ["s3.us-east-1.amazonaws.com"], "aws": {"regions": ["us-east-1"], "services": ["s3"],
			"assumeRole": {"roleArn": "arn:aws:iam::123456789012:role/deploy"}}},
		"GIT_SSH": {"kind": "ssh", "domains": ["github.com:22"], "ssh": {"allow": ["git-upload-pack"], "repositories": ["acme/*"],
			"knownHosts": ["github.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"]}}}}}}}`), 0o600)
	os.WriteFile(bad, []byte(`{"dataDir": "/d", "api": {"tokenFile": "/t"}, "policy": {"projects": {"acme": {"keys": {
		"OPENAI_API_KEY": {"domains": ["*.openai.com", "10.0.0.1"]},
		"GIT_SSH": {"kind": "ssh", "domains": ["github.com"], "ssh": {"allow": ["git-upload-pack"], "knownHosts": ["github.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"]}}}}}}}`), 0o600)

	var out, errOut bytes.Buffer
	if code := run([]string{"policy", "check", good}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if want := "acme/OPENAI_API_KEY: domains api.openai.com; substituted in header; placeholder \"sk-\" + 45 letters and digits"; !strings.Contains(out.String(), want) {
		t.Errorf("output %q lacks %q", out.String(), want)
	}
	if want := "acme/DEPLOY: aws; domains s3.us-east-1.amazonaws.com; signs for regions us-east-1, services s3; task variables AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY[, AWS_SESSION_TOKEN]; credentials from a per-run session of arn:aws:iam::123456789012:role/deploy (1h0m0s)"; !strings.Contains(out.String(), want) {
		t.Errorf("output %q lacks %q", out.String(), want)
	}
	if want := "acme/GIT_SSH: ssh; domains github.com:22; logs in as git; runs git-upload-pack on repositories acme/*; 1 known host key(s); no task variable"; !strings.Contains(out.String(), want) {
		t.Errorf("output %q lacks %q", out.String(), want)
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"policy", "check", bad}, &out, &errOut); code != 1 {
		t.Fatalf("exit %d for a bad policy", code)
	}
	for _, want := range []string{`policy.projects.acme.keys.OPENAI_API_KEY.domains[0]: "*.openai.com": a wildcard is not allowed`,
		`policy.projects.acme.keys.OPENAI_API_KEY.domains[1]: "10.0.0.1": an IP address is not allowed`,
		`policy.projects.acme.keys.GIT_SSH.domains[0]: "github.com": an ssh key's domain names its port (github.com:22, or ssh.github.com:443): without one it means 443`,
		`policy.projects.acme.keys.GIT_SSH.ssh.knownHosts: lists no host key for github.com (as "[github.com]:443")`} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr %q lacks %q", errOut.String(), want)
		}
	}
}
