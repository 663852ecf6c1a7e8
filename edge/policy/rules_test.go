package policy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/config"
	"github.com/runfleet/runfleet/shared/runspec"
)

// compileKeyJSON compiles one key, project "gh", key "TOKEN", written as
// edge.json writes it: decoded strictly as edge serve decodes it.
func compileKeyJSON(t *testing.T, keyJSON string) (*Policy, error) {
	t.Helper()
	cfg, err := config.Parse([]byte(`{"policy": {"projects": {"gh": {"keys": {"TOKEN": ` + keyJSON + `}}}}}`))
	if err != nil {
		return nil, err
	}
	return Compile(cfg.Policy)
}

// rulesOf compiles a key of domain github.test with the given rule
// fields (the JSON members after "domains") and returns its rules.
func rulesOf(t *testing.T, fields string) *Rules {
	t.Helper()
	p, err := compileKeyJSON(t, `{"domains": ["github.test"], `+fields+`}`)
	if err != nil {
		t.Fatalf("compile %s: %v", fields, err)
	}
	k, _ := p.Key(KeyRef{"gh", "TOKEN"})
	return k.Rules
}

// fetchOnly is the README's GitHub key that can fetch but never push over
// HTTPS.
const fetchOnly = `"rules": [{"deny": {"paths": ["/**/git-receive-pack"]}}]`

func TestDecideRequestFetchOnlyKey(t *testing.T) {
	rs := rulesOf(t, fetchOnly)
	const (
		deny    = "projects.gh.keys.TOKEN.rules[0]"
		dflt    = "projects.gh.keys.TOKEN.default"
		refused = "projects.gh.keys.TOKEN.rules"
	)
	for _, tc := range []struct {
		name      string
		method    string
		path      string
		overrides []string
		allow     bool
		rule      string
		reason    string // a part of the reason
	}{
		{"the ref advertisement", "GET", "/org/repo.git/info/refs", nil, true, dflt, ""},
		{"a fetch", "POST", "/org/repo.git/git-upload-pack", nil, true, dflt, ""},
		{"a push", "POST", "/org/repo.git/git-receive-pack", nil, false, deny, "(deny /**/git-receive-pack) matches the request"},
		{"** matches no segment", "POST", "/git-receive-pack", nil, false, deny, ""},
		{"** matches many segments", "POST", "/group/sub/sub/repo.git/git-receive-pack", nil, false, deny, ""},
		{"any method", "PUT", "/org/repo.git/git-receive-pack", nil, false, deny, ""},
		{"the root", "GET", "/", nil, true, dflt, ""},
		{"a longer last segment", "POST", "/org/repo.git/git-receive-pack2", nil, true, dflt, ""},

		// Writing the same path another way.
		{"upper case", "POST", "/org/repo.git/GIT-Receive-PACK", nil, false, deny, ""},
		{"a percent-encoded letter", "POST", "/org/repo.git/git-receive-%70ack", nil, false, deny, ""},
		{"a percent-encoded upper-case letter", "POST", "/org/repo.git/git-receive-%50ACK", nil, false, deny, ""},
		{"every letter encoded", "POST", "/org/repo.git/%67%69%74-receive-pack", nil, false, deny, ""},
		{"a trailing slash", "POST", "/org/repo.git/git-receive-pack/", nil, false, deny, ""},
		{"a dot-dot segment", "POST", "/org/repo.git/x/../git-receive-pack", nil, false, refused, pathDotSegment},
		{"a dot segment on a harmless path", "GET", "/org/./repo.git/info/refs", nil, false, refused, pathDotSegment},
		{"a trailing dot-dot", "POST", "/org/repo.git/git-receive-pack/x/..", nil, false, refused, pathDotSegment},
		{"an empty segment", "POST", "/org/repo.git//git-receive-pack", nil, false, refused, pathEmptySegment},
		{"a leading empty segment", "POST", "//org/repo.git/git-receive-pack", nil, false, refused, pathEmptySegment},
		{"two trailing slashes", "POST", "/org/repo.git/git-receive-pack//", nil, false, refused, pathEmptySegment},
		{"only slashes", "GET", "//", nil, false, refused, pathEmptySegment},
		{"an encoded slash", "POST", "/org/repo.git%2Fgit-receive-pack", nil, false, refused, pathEncodedSep},
		{"an encoded slash in lower case", "POST", "/org/repo.git%2fgit-receive-pack", nil, false, refused, pathEncodedSep},
		{"encoded dots", "POST", "/org/repo.git/x/%2e%2e/git-receive-pack", nil, false, refused, pathEncodedSep},
		{"an encoded dot inside a segment", "GET", "/org/repo%2Egit/info/refs", nil, false, refused, pathEncodedSep},
		{"an encoded backslash", "POST", "/org/repo.git%5Cgit-receive-pack", nil, false, refused, pathEncodedSep},
		{"a backslash", "POST", `/org/repo.git\git-receive-pack`, nil, false, refused, pathBackslash},
		{"a path parameter", "POST", "/org/repo.git/git-receive-pack;jsessionid=1", nil, false, refused, pathSemicolon},
		{"double encoding", "POST", "/org/repo.git/git-receive-%2570ack", nil, false, refused, pathDoubleEncoding},
		{"double encoding of every byte", "POST", "/org/repo.git/git-receive-%25%37%30ack", nil, false, refused, pathDoubleEncoding},
		{"a NUL", "POST", "/org/repo.git/git-receive-pack%00.txt", nil, false, refused, pathControl},
		{"a line feed", "POST", "/org/repo.git/git-receive-pack%0a", nil, false, refused, pathControl},
		{"an overlong dot", "POST", "/org/repo.git/%C0%AE%C0%AE/git-receive-pack", nil, false, refused, pathNotUTF8},
		{"a malformed escape", "POST", "/org/repo.git/git-receive-pack%zz", nil, false, refused, pathBadEscape},
		{"a cut escape", "POST", "/org/repo.git/git-receive-pack%7", nil, false, refused, pathBadEscape},
		{"the Kelvin sign", "POST", "/org/repo.git/git-receive-pac%E2%84%AA", nil, false, refused, pathFoldsToASCII},
		{"the long s", "GET", "/org/%C5%BFecret", nil, false, refused, pathFoldsToASCII},
		{"not a path", "OPTIONS", "*", nil, false, refused, pathNotAPath},
		{"no path", "GET", "", nil, false, refused, pathNotAPath},
		{"other UTF-8 is a segment like any", "GET", "/org/r%C3%A9po.git/info/refs", nil, true, dflt, ""},

		// The method.
		{"a method in lower case", "post", "/org/repo.git/git-receive-pack", nil, false, deny, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideRequest(rs, RequestInput{Method: tc.method, Path: tc.path, Overrides: tc.overrides})
			if d.Allow != tc.allow || d.Warn || d.Rule != tc.rule || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("%s %s: %+v, want allow %v by %s with a reason holding %q", tc.method, tc.path, d, tc.allow, tc.rule, tc.reason)
			}
		})
	}
}

// A GET-only key (Codex cloud's shape): methods alone, default deny. Its
// rules name no path, so no path is refused as ambiguous.
func TestDecideRequestMethodsOnly(t *testing.T) {
	rs := rulesOf(t, `"rules": [{"allow": {"methods": ["GET", "head"]}}], "default": "deny"`)
	for _, tc := range []struct {
		method, path string
		overrides    []string
		allow        bool
		rule         string
	}{
		{"GET", "/v1/models", nil, true, "projects.gh.keys.TOKEN.rules[0]"},
		{"HEAD", "/v1/models", nil, true, "projects.gh.keys.TOKEN.rules[0]"},
		{"get", "/v1/models", nil, true, "projects.gh.keys.TOKEN.rules[0]"},
		{"POST", "/v1/models", nil, false, "projects.gh.keys.TOKEN.default"},
		{"DELETE", "/v1/models/x", nil, false, "projects.gh.keys.TOKEN.default"},
		{"GET", "/v1/../models", nil, true, "projects.gh.keys.TOKEN.rules[0]"},
		{"GET", "/v1/models", []string{" delete "}, false, "projects.gh.keys.TOKEN.default"},
		{"GET", "/v1/models", []string{"HEAD"}, true, "projects.gh.keys.TOKEN.rules[0]"},
	} {
		d := DecideRequest(rs, RequestInput{Method: tc.method, Path: tc.path, Overrides: tc.overrides})
		if d.Allow != tc.allow || d.Rule != tc.rule {
			t.Errorf("%s %s (overrides %q): %+v, want allow %v by %s", tc.method, tc.path, tc.overrides, d, tc.allow, tc.rule)
		}
	}
	if d := DecideRequest(rs, RequestInput{Method: "POST", Path: "/"}); d.Reason != "no rule of projects.gh.keys.TOKEN matches the request, and projects.gh.keys.TOKEN.default is deny" {
		t.Errorf("the default's reason: %q", d.Reason)
	}
	// What the task sent is never quoted: a method or an override may
	// hold anything (a placeholder among them).
	d := DecideRequest(rs, RequestInput{Method: "GET", Path: "/v1/models", Overrides: []string{"PURGE-marker"}})
	if d.Allow || !strings.Contains(d.Reason, "matches the method the request names for the upstream to take instead (X-HTTP-Method-Override") || strings.Contains(strings.ToLower(d.Reason), "marker") {
		t.Errorf("an override refused: %+v", d)
	}
}

// "*" is exactly one whole segment, "**" any number of them (none
// included), wherever they stand; the first rule that matches decides.
func TestDecideRequestPatterns(t *testing.T) {
	rs := rulesOf(t, `"rules": [
		{"deny": {"methods": ["DELETE"]}},
		{"allow": {"methods": ["GET"], "paths": ["/repos/*/issues", "/a/**/z"]}},
		{"allow": {"methods": ["POST"], "paths": ["/repos/*/issues/*/comments"]}}
	], "default": "deny"`)
	for _, tc := range []struct {
		method, path string
		rule         int // -1: the default
	}{
		{"GET", "/repos/acme/issues", 1},
		{"GET", "/REPOS/Acme/Issues", 1},
		{"GET", "/repos/acme/issues/", 1},
		{"GET", "/repos/issues", -1},
		{"GET", "/repos/acme/x/issues", -1},
		{"GET", "/a/z", 1},
		{"GET", "/a/b/z", 1},
		{"GET", "/a/b/c/d/z", 1},
		{"GET", "/a/z/z", 1},
		{"GET", "/a/b", -1},
		{"GET", "/a", -1},
		{"GET", "/z", -1},
		{"POST", "/repos/acme/issues/7/comments", 2},
		{"POST", "/repos/acme/issues", -1},
		{"DELETE", "/repos/acme/issues", 0},
	} {
		d := DecideRequest(rs, RequestInput{Method: tc.method, Path: tc.path})
		want := "projects.gh.keys.TOKEN.default"
		if tc.rule >= 0 {
			want = fmt.Sprintf("projects.gh.keys.TOKEN.rules[%d]", tc.rule)
		}
		if d.Rule != want || d.Allow != (tc.rule == 1 || tc.rule == 2) {
			t.Errorf("%s %s: %+v, want %s", tc.method, tc.path, d, want)
		}
	}
}

// Warn mode lets through what enforce mode refuses, naming the rule that
// would have refused it; what the rules allow is not a warning.
func TestDecideRequestWarnMode(t *testing.T) {
	rs := rulesOf(t, fetchOnly+`, "mode": "warn"`)
	d := DecideRequest(rs, RequestInput{Method: "POST", Path: "/org/repo.git/git-receive-pack"})
	if !d.Allow || !d.Warn || d.Rule != "projects.gh.keys.TOKEN.rules[0]" || !strings.Contains(d.Reason, "deny /**/git-receive-pack") {
		t.Errorf("a push in warn mode: %+v", d)
	}
	d = DecideRequest(rs, RequestInput{Method: "POST", Path: "/marker/../git-receive-pack"})
	if !d.Allow || !d.Warn || d.Rule != "projects.gh.keys.TOKEN.rules" || strings.Contains(d.Reason, "marker") {
		t.Errorf("an ambiguous path in warn mode: %+v", d)
	}
	d = DecideRequest(rs, RequestInput{Method: "POST", Path: "/org/repo.git/git-upload-pack"})
	if !d.Allow || d.Warn || d.Rule != "projects.gh.keys.TOKEN.default" {
		t.Errorf("a fetch in warn mode: %+v", d)
	}
}

// A key without rules decides nothing: every request goes, no rule named.
func TestDecideRequestWithoutRules(t *testing.T) {
	if rs := rulesOf(t, `"default": "allow", "mode": "warn"`); rs != nil {
		t.Fatalf("a key whose rules cannot refuse anything compiles to %+v, want none", rs)
	}
	if d := DecideRequest(nil, RequestInput{Method: "POST", Path: "/a/../b"}); d != (RequestDecision{Allow: true}) {
		t.Errorf("no rules: %+v", d)
	}
	rs := rulesOf(t, `"default": "deny"`)
	if d := DecideRequest(rs, RequestInput{Method: "GET", Path: "/"}); d.Allow || d.Rule != "projects.gh.keys.TOKEN.default" {
		t.Errorf("default deny alone: %+v", d)
	}
}

// The matcher backtracks only to the last "**": a pattern of many "**"
// against a long path that almost matches ends at once (a naive
// backtracking matcher takes exponential time here, and this test its
// whole timeout).
func TestPathPatternMatchIsLinearish(t *testing.T) {
	p, err := CompilePathPattern("/**/a/**/a/**/a/**/a/**/a/**/a/**/b")
	if err != nil {
		t.Fatal(err)
	}
	path := strings.Repeat("/a", 20000)
	segs, why := splitPath(path)
	if why != "" {
		t.Fatal(why)
	}
	if p.match(segs) {
		t.Error("matched a path without b")
	}
	if !p.match(append(segs, "b")) {
		t.Error("did not match the path ending in b")
	}
}

func TestPathPatternCovers(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"/**", "/", true},
		{"/**", "/a/*/**", true},
		{"/a/**", "/a", true},
		{"/a/**", "/a/b/c", true},
		{"/a/*", "/a/b", true},
		{"/a/*", "/a/*", true},
		{"/a/*", "/a/**", false},
		{"/a/*", "/a", false},
		{"/a/b", "/a/*", false},
		{"/*/**", "/**", false},
		{"/**/x", "/a/**/x", true},
		{"/**/x", "/a/**/y", false},
		{"/**/**", "/**", true},
		{"/A/b", "/a/B", true},
		{"/a/%62", "/a/b", true},
	} {
		a, err := CompilePathPattern(tc.a)
		if err != nil {
			t.Fatal(err)
		}
		b, err := CompilePathPattern(tc.b)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.covers(b); got != tc.want {
			t.Errorf("%s covers %s: %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestCompileRules(t *testing.T) {
	rs := rulesOf(t, `"rules": [{"deny": {"methods": ["post", "PUT", "POST"], "paths": ["/**/git-receive-pack", "/x/*"]}}, {"allow": {}}], "mode": "warn"`)
	if rs == nil || len(rs.List) != 2 || !rs.Warn || !rs.DefaultAllow || rs.Name != "projects.gh.keys.TOKEN" {
		t.Fatalf("rules %+v", rs)
	}
	r := rs.List[0]
	if r.Allow || r.Name != "projects.gh.keys.TOKEN.rules[0]" || r.Text != "deny POST,PUT /**/git-receive-pack /x/*" || len(r.Methods) != 2 || len(r.Paths) != 2 {
		t.Errorf("rule 0: %+v", r)
	}
	if r := rs.List[1]; !r.Allow || r.Text != "allow every request" || r.Methods != nil || r.Paths != nil {
		t.Errorf("rule 1: %+v", r)
	}
	// A project whose id needs quoting in a path is named as edge.json's
	// paths name it.
	p, err := Compile(one("my.org", "K", config.KeyPolicy{Domains: []string{"a.example"}, Rules: []config.Rule{{Deny: &config.RuleMatch{}}}}))
	if err != nil {
		t.Fatal(err)
	}
	k, _ := p.Key(KeyRef{"my.org", "K"})
	if got := k.Rules.List[0].Name; got != `projects["my.org"].keys.K.rules[0]` {
		t.Errorf("rule name %s", got)
	}
	// An aws key takes rules; its grant carries them.
	p, err = compileKeyJSON(t, `{"kind": "aws", "domains": ["s3.us-east-1.amazonaws.com"], "aws": {"regions": ["us-east-1"], "services": ["s3"]},
		"rules": [{"allow": {"methods": ["GET"]}}], "default": "deny"}`)
	if err != nil {
		t.Fatal(err)
	}
	declared, err := runspec.Request{Agent: "shell", Secrets: []runspec.Secret{{ProjectID: "gh", Key: "TOKEN", Domains: []string{"s3.us-east-1.amazonaws.com"}}}}.Declare()
	if err != nil {
		t.Fatal(err)
	}
	g, _ := p.Grant(declared)
	if len(g) != 1 || g[0].Rules == nil || g[0].Rules.DefaultAllow {
		t.Errorf("an aws key's grant: %+v", g)
	}
}

// Each problem with rules is named at its field, every one at once, with
// what to do; a misspelt field gets edge.json's "did you mean".
func TestCompileRulesRefusesWithAClearMessage(t *testing.T) {
	const at = "policy.projects.gh.keys.TOKEN."
	for name, tc := range map[string]struct {
		fields string
		want   []string
	}{
		"a misspelt action": {`"rules": [{"dney": {"paths": ["/x"]}}]`, []string{at + `rules[0].dney: unknown field; did you mean "deny"?`}},
		"a misspelt match":  {`"rules": [{"deny": {"path": ["/x"]}}]`, []string{at + `rules[0].deny.path: unknown field; did you mean "paths"?`}},
		"a misspelt key":    {`"rule": []`, []string{at + `rule: unknown field; did you mean "rules"?`}},
		"paths not a list":  {`"rules": [{"deny": {"paths": "/x"}}]`, []string{at + `rules[0].deny.paths: must be an array`}},
		"both":              {`"rules": [{"allow": {}, "deny": {}}]`, []string{at + `rules[0]: a rule is {"allow": {...}} or {"deny": {...}}, exactly one of them`}},
		"neither":           {`"rules": [{"deny": {"methods": ["GET"]}}, {}]`, []string{at + `rules[1]: a rule is`}},
		"empty methods":     {`"rules": [{"deny": {"methods": []}}]`, []string{at + `rules[0].deny.methods: an empty list matches no request: leave it out to match any method`}},
		"empty paths":       {`"rules": [{"allow": {"paths": []}}]`, []string{at + `rules[0].allow.paths: an empty list matches no request: leave it out to match any path`}},
		"a bad method": {`"rules": [{"deny": {"methods": ["GE T", "*", ""]}}]`, []string{
			at + `rules[0].deny.methods[0]: "GE T" is not an HTTP method`,
			at + `rules[0].deny.methods[1]: "*" is not an HTTP method (leave "methods" out to match any)`,
			at + `rules[0].deny.methods[2]: "" is not an HTTP method`,
		}},
		"bad paths": {`"rules": [{"deny": {"methods": ["GET"]}}, {"deny": {"paths": ["repo/x", "/a*/b", "/a/", "/a/../b", "/a%2Fb", "/a//b", "/a?x=1", "/a;b", "/%zz"]}}]`, []string{
			at + `rules[1].deny.paths[0]: "repo/x": a path pattern starts with "/"`,
			at + `rules[1].deny.paths[1]: "/a*/b": "*" and "**" stand only for whole segments, not "a*"`,
			at + `rules[1].deny.paths[2]: "/a/": a path pattern does not end in "/": a request's trailing "/" is ignored, so write "/a"`,
			at + `rules[1].deny.paths[3]: "/a/../b": ` + pathDotSegment,
			at + `rules[1].deny.paths[4]: "/a%2Fb": ` + pathEncodedSep,
			at + `rules[1].deny.paths[5]: "/a//b": ` + pathEmptySegment,
			at + `rules[1].deny.paths[6]: "/a?x=1": a path pattern has no query or fragment`,
			at + `rules[1].deny.paths[7]: "/a;b": ` + pathSemicolon,
			at + `rules[1].deny.paths[8]: "/%zz": ` + pathBadEscape,
		}},
		"a bad default and mode": {`"rules": [{"deny": {"methods": ["POST"]}}], "default": "block", "mode": "audit"`, []string{
			at + `default: must be "allow" or "deny", not "block"`,
			at + `mode: must be "enforce" or "warn", not "audit"`,
		}},
		"a rule after one matching every request": {`"rules": [{"deny": {}}, {"allow": {"methods": ["GET"]}}]`, []string{
			at + `rules[1]: never matches: rules[0] (deny every request) comes first and matches every request this one would; reorder them or remove this one`,
		}},
		"a rule covered by the paths of an earlier one": {`"rules": [{"deny": {"paths": ["/**/git-receive-pack", "/admin/**"]}}, {"allow": {"methods": ["GET"], "paths": ["/admin/users", "/org/repo.git/git-receive-pack"]}}]`, []string{
			at + `rules[1]: never matches: rules[0] (deny /**/git-receive-pack /admin/**) comes first`,
		}},
		"a rule covered by the methods of an earlier one": {`"rules": [{"allow": {"methods": ["GET", "HEAD"], "paths": ["/**"]}}, {"deny": {"methods": ["get"], "paths": ["/secret"]}}]`, []string{
			at + `rules[1]: never matches: rules[0] (allow GET,HEAD /**) comes first`,
		}},
		"a default that never applies": {`"rules": [{"deny": {"methods": ["DELETE"]}}, {"allow": {"paths": ["/**"]}}], "default": "deny"`, []string{
			at + `default: never applies: rules[1] (allow /**) matches every request`,
		}},
		"an ssh key with rules":  {`"rules": [{"deny": {}}]`, []string{at + `rules: an ssh key makes no HTTPS request for rules to decide: its commands are ruled by "ssh": {"allow": [...], "repositories": [...]}`}},
		"an ssh key with a mode": {`"mode": "warn"`, []string{at + `mode: an ssh key makes no HTTPS request`}},
	} {
		t.Run(name, func(t *testing.T) {
			key := `{"domains": ["github.test"], ` + tc.fields + `}`
			if strings.HasPrefix(name, "an ssh key") {
				key = `{"kind": "ssh", "domains": ["github.test:22"], "ssh": {"allow": ["git-upload-pack"],
					"knownHosts": ["github.test ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"]}, ` + tc.fields + `}`
			}
			_, err := compileKeyJSON(t, key)
			if err == nil {
				t.Fatal("compiled")
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tc.want) {
				t.Errorf("%d problems, want %d:\n%s", len(lines), len(tc.want), err)
			}
			for i, want := range tc.want {
				if i < len(lines) && !strings.HasPrefix(lines[i], want) {
					t.Errorf("problem %d:\n%s\nwant it to start with\n%s", i, lines[i], want)
				}
			}
		})
	}
}

// Rules that do not cover each other compile: a narrower rule after a
// broader one of other methods, an allow-list of paths after a deny of
// one of them, a "**" pattern that the token check cannot prove equal.
func TestCompileRulesKeepsRulesThatCanMatch(t *testing.T) {
	for _, fields := range []string{
		`"rules": [{"allow": {"methods": ["GET"], "paths": ["/a/**"]}}, {"deny": {"paths": ["/a/b"]}}]`,
		`"rules": [{"deny": {"methods": ["POST"], "paths": ["/**/git-receive-pack"]}}, {"allow": {"paths": ["/org/**"]}}], "default": "deny"`,
		`"rules": [{"deny": {"paths": ["/a/*"]}}, {"deny": {"paths": ["/a/**"]}}]`,
		`"rules": [{"deny": {"paths": ["/*/**"]}}, {"allow": {"paths": ["/**/*"]}}]`,
		`"rules": [{"allow": {"methods": ["GET"]}}], "default": "deny"`,
	} {
		if rs := rulesOf(t, fields); rs == nil {
			t.Errorf("%s: no rules", fields)
		}
	}
}

// The cost of the rules on a request that carries a key with them: the
// path read once per key, no allocation beyond its segments.
func BenchmarkDecideRequest(b *testing.B) {
	cfg, err := config.Parse([]byte(`{"policy": {"projects": {"gh": {"keys": {"TOKEN": {"domains": ["github.test"], ` + fetchOnly + `}}}}}}`))
	if err != nil {
		b.Fatal(err)
	}
	p, err := Compile(cfg.Policy)
	if err != nil {
		b.Fatal(err)
	}
	k, _ := p.Key(KeyRef{"gh", "TOKEN"})
	in := RequestInput{Method: "POST", Path: "/acme/app.git/git-upload-pack"}
	b.ReportAllocs()
	for b.Loop() {
		if d := DecideRequest(k.Rules, in); !d.Allow {
			b.Fatal(d)
		}
	}
}
