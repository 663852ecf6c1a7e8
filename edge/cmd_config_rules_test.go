package main

import (
	"fmt"
	"strings"
	"testing"
)

// rulesConfig is goodConfig with request rules on its two keys that take
// them: the README's fetch-only GitHub key shape on OPENAI_API_KEY, and a
// read-only aws key in warn mode.
var rulesConfig = strings.NewReplacer(
	`"placeholder": {"prefix": "sk-"}}`, `"placeholder": {"prefix": "sk-"},
		"rules": [{"deny": {"methods": ["post"], "paths": ["/**/git-receive-pack"]}}, {"allow": {"methods": ["GET", "POST"]}}], "default": "deny"}`,
	`"roleArn": "arn:aws:iam::123456789012:role/deploy"}}}`, `"roleArn": "arn:aws:iam::123456789012:role/deploy"}},
		"rules": [{"allow": {"methods": ["GET", "HEAD"], "paths": ["/reports/**"]}}], "default": "deny", "mode": "warn"}`,
).Replace(goodConfig)

// edge config check (and its alias) says each key's rules in order with
// its mode and default.
func TestConfigCheckSaysEachKeysRequestRules(t *testing.T) {
	t.Setenv("EDGE_SECRETS_PROXY", "")
	if rulesConfig == goodConfig {
		t.Fatal("the rules were not written into the config")
	}
	_, path := checkTree(t, rulesConfig)
	for _, cmd := range [][]string{{"config", "check"}, {"policy", "check"}} {
		code, out, errOut := runEdge(append(cmd, "--config", path)...)
		for _, want := range []string{
			`acme/OPENAI_API_KEY: domains api.openai.com; substituted in header; placeholder "sk-" + 45 letters and digits; request rules, enforce: deny POST /**/git-receive-pack; allow GET,POST; else deny` + "\n",
			"acme/DEPLOY: aws; domains s3.us-east-1.amazonaws.com; signs for regions us-east-1, services s3; task variables AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY[, AWS_SESSION_TOKEN]; credentials from a per-run session of arn:aws:iam::123456789012:role/deploy (1h0m0s); request rules, warn: allow GET,HEAD /reports/**; else deny\n",
			"config ok: ",
		} {
			if code != 0 || errOut != "" || !strings.Contains(out, want) {
				t.Errorf("edge %s: exit %d, stderr %q, stdout\n%s\nwant exit 0 and a line\n%s", strings.Join(cmd, " "), code, errOut, out, want)
			}
		}
	}
}

// Rules that can never match, and every other mistake in rules, are
// problems at their paths: edge policy check (the alias) lists them and
// edge serve refuses the config with the same list.
func TestConfigCheckReportsRulesThatCanNeverMatch(t *testing.T) {
	t.Setenv("EDGE_SECRETS_PROXY", "")
	const at = "policy.projects.acme.keys.OPENAI_API_KEY."
	for name, tc := range map[string]struct {
		rules string
		want  []string
	}{
		"a rule covered by an earlier one": {
			`"rules": [{"deny": {"paths": ["/**/git-receive-pack"]}}, {"allow": {"methods": ["POST"], "paths": ["/org/repo.git/git-receive-pack"]}}]`,
			[]string{at + "rules[1]: never matches: rules[0] (deny /**/git-receive-pack) comes first and matches every request this one would; reorder them or remove this one"},
		},
		"a rule after one matching every request, and a default never used": {
			`"rules": [{"allow": {}}, {"deny": {"methods": ["DELETE"]}}], "default": "deny"`,
			[]string{
				at + "rules[1]: never matches: rules[0] (allow every request) comes first and matches every request this one would; reorder them or remove this one",
				at + "default: never applies: rules[0] (allow every request) matches every request",
			},
		},
		"empty lists": {
			`"rules": [{"deny": {"methods": [], "paths": []}}]`,
			[]string{
				at + "rules[0].deny.methods: an empty list matches no request: leave it out to match any method",
				at + "rules[0].deny.paths: an empty list matches no request: leave it out to match any path",
			},
		},
		"a misspelt field and a bad pattern": {
			`"rules": [{"deny": {"pahts": ["/x"]}}, {"allow": {"paths": ["/a/../b"]}}], "mode": "warning"`,
			[]string{
				at + `rules[0].deny.pahts: unknown field; did you mean "paths"?`,
				at + `rules[1].allow.paths[0]: "/a/../b": it has a dot segment ("." or "..")`,
				at + `mode: must be "enforce" or "warn", not "warning"`,
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			config := strings.Replace(goodConfig, `"placeholder": {"prefix": "sk-"}}`, `"placeholder": {"prefix": "sk-"}, `+tc.rules+`}`, 1)
			dir, path := checkTree(t, config)
			noun := "problems"
			if len(tc.want) == 1 {
				noun = "problem"
			}
			list := fmt.Sprintf(": config %s has %d %s; edge serve refuses it until each is fixed:\n  %s\n", path, len(tc.want), noun, strings.Join(tc.want, "\n  "))
			before := snapshot(t, dir)
			code, _, errOut := runEdge("policy", "check", "--config", path)
			if code != 1 || errOut != "edge policy check"+list {
				t.Errorf("edge policy check: exit %d, stderr\n%s\nwant exit 1 and\n%s", code, errOut, "edge policy check"+list)
			}
			code, out, errOut := runEdge("serve", "--config", path)
			if code != 1 || out != "" || errOut != "edge serve"+list {
				t.Errorf("edge serve: exit %d, stdout %q, stderr\n%s\nwant exit 1 and\n%s", code, out, errOut, "edge serve"+list)
			}
			unchanged(t, "edge policy check and edge serve", dir, before)
		})
	}
}
