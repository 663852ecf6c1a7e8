package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/config"
)

// The README's request rules example compiles, and does what the README
// says: the GitHub key fetches, is refused its push by rules[0], and
// reads the REST API but writes no repository there.
func TestREADMERequestRulesExample(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Request rules\n")
	if !ok {
		t.Fatal("README has no Request rules section")
	}
	_, example, _ := strings.Cut(section, "```json\n")
	example, _, _ = strings.Cut(example, "```")
	cfg, err := config.Parse([]byte("{" + example + "}"))
	if err != nil {
		t.Fatalf("the README's example: %v", err)
	}
	p, err := Compile(cfg.Policy)
	if err != nil {
		t.Fatalf("the README's example: %v", err)
	}
	k, ok := p.Key(KeyRef{"acme", "GITHUB_TOKEN"})
	if !ok || k.Rules == nil {
		t.Fatal("the README's example has no GITHUB_TOKEN with rules")
	}
	for _, tc := range []struct {
		method, path string
		allow        bool
		rule         string
	}{
		{"GET", "/acme/app.git/info/refs", true, "default"},
		{"POST", "/acme/app.git/git-upload-pack", true, "default"},
		{"POST", "/acme/app.git/git-receive-pack", false, "rules[0]"},
		{"GET", "/repos/acme/app/pulls", true, "default"},
		{"POST", "/repos/acme/app/pulls", false, "rules[1]"},
		{"POST", "/graphql", true, "default"},
	} {
		d := DecideRequest(k.Rules, RequestInput{Method: tc.method, Path: tc.path})
		if d.Allow != tc.allow || d.Rule != "projects.acme.keys.GITHUB_TOKEN."+tc.rule {
			t.Errorf("%s %s: %+v, want allow %v by %s", tc.method, tc.path, d, tc.allow, tc.rule)
		}
	}
}
