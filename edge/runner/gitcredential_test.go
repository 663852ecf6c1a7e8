package runner

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/shared/netname"
	"github.com/runfleet/runfleet/shared/runspec"
)

// The clone URL's host gets the placeholder of the key the run declares
// for it, through a credential helper real git runs: `git credential fill`
// answers x-access-token and the placeholder for that origin, and nothing
// for another.
func TestGitCredentialEnvGivesTheHostItsKeysPlaceholder(t *testing.T) {
	gh, _ := netname.ParseDomain("github.com")
	other, _ := netname.ParseDomain("api.other.example")
	declared := []runspec.Declared{
		{ProjectID: "acme", Key: "OTHER_TOKEN", Domains: []netname.Domain{other}},
		{ProjectID: "acme", Key: "GITHUB_TOKEN", Domains: []netname.Domain{gh}},
	}
	placeholders := map[string]string{"OTHER_TOKEN": "ph-other-0123456789", "GITHUB_TOKEN": "ph-gh-0123456789abcdef"}
	env := gitCredentialEnv("https://github.com/acme/app.git", declared, placeholders, nil)
	if len(env) != 3 || strings.Contains(strings.Join(env, "\n"), "ph-gh-") {
		t.Fatalf("env = %q; want git's configuration naming the variable, not its value", env)
	}

	git, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	fill := func(host string) string {
		cmd := exec.Command(git, "credential", "fill")
		cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "GIT_TERMINAL_PROMPT=0", "GITHUB_TOKEN=" + placeholders["GITHUB_TOKEN"]}, env...)
		cmd.Stdin = strings.NewReader("protocol=https\nhost=" + host + "\n\n")
		out, _ := cmd.Output()
		return string(out)
	}
	if out := fill("github.com"); !strings.Contains(out, "username=x-access-token\n") || !strings.Contains(out, "password=ph-gh-0123456789abcdef\n") {
		t.Fatalf("git credential fill for github.com:\n%s", out)
	}
	if out := fill("gitlab.example"); strings.Contains(out, "ph-gh-") {
		t.Fatalf("another host got the key's placeholder:\n%s", out)
	}

	for name, tc := range map[string]struct {
		url          string
		placeholders map[string]string
		env          []string
	}{
		"no key for the host":      {"https://gitlab.example/acme/app.git", placeholders, nil},
		"key not granted":          {"https://github.com/acme/app.git", map[string]string{"OTHER_TOKEN": "x"}, nil},
		"credentials in the URL":   {"https://me:pw@github.com/acme/app.git", placeholders, nil},
		"not https":                {"http://github.com/acme/app.git", placeholders, nil},
		"ssh":                      {"git@github.com:acme/app.git", placeholders, nil},
		"the run's own git config": {"https://github.com/acme/app.git", placeholders, []string{"GIT_CONFIG_COUNT=2"}},
	} {
		if got := gitCredentialEnv(tc.url, declared, tc.placeholders, tc.env); got != nil {
			t.Errorf("%s: env = %q; want none", name, got)
		}
	}
}
