package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/net/websocket"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

const (
	realGH   = "real-GH-value-rules-do-not-leak-3333"
	realWarn = "real-WARN-value-rules-do-not-leak-4444"
	realURL  = "real-URL-value-rules-do-not-leak-5555"
)

// rulesFixture: one HTTPS upstream (HTTP/2 and HTTP/1.1) answering as
// api, other and third.example.test, and a task holding three keys with
// request rules:
//
//	GH    header, api: a GitHub-like key that can fetch but never push
//	      (POST to git-receive-pack), nor open the /ws/private socket;
//	      GET and POST otherwise, any other method refused by default.
//	WARN  header and body, other: the same denials in warn mode.
//	URLK  url and body, third: never under /admin, nor /ws/private.
type rulesFixture struct {
	*env
	up                *testUpstream
	proxyURL          *url.URL
	ph                map[string]string
	api, other, third string // host:port
}

func newRulesFixture(t *testing.T) *rulesFixture {
	t.Helper()
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, true, "api.example.test", "other.example.test", "third.example.test")
	e := newEnv(t, envOptions{
		uca:  uca,
		pins: map[string]string{"api.example.test": "127.0.0.1", "other.example.test": "127.0.0.1", "third.example.test": "127.0.0.1"},
		keys: fmt.Sprintf(`{"acme": {"keys": {
			"GH": {"domains": ["api.example.test:%[1]d"], "placeholder": {"prefix": "ghp_", "length": 40}, "rules": [
				{"deny": {"methods": ["POST"], "paths": ["/**/git-receive-pack"]}},
				{"deny": {"paths": ["/ws/private"]}},
				{"allow": {"methods": ["GET", "POST"]}}], "default": "deny"},
			"WARN": {"domains": ["other.example.test:%[1]d"], "in": ["header", "body"], "mode": "warn", "rules": [
				{"deny": {"paths": ["/**/git-receive-pack", "/ws/private"]}}]},
			"URLK": {"domains": ["third.example.test:%[1]d"], "in": ["url", "body"], "rules": [
				{"deny": {"paths": ["/admin/**", "/ws/private"]}}]}}}}`, up.port),
		secrets: map[string]string{"acme/GH": realGH, "acme/WARN": realWarn, "acme/URLK": realURL},
	})
	u, phs := e.task("run-r", runspec.Secret{ProjectID: "acme", Key: "GH"}, runspec.Secret{ProjectID: "acme", Key: "WARN"}, runspec.Secret{ProjectID: "acme", Key: "URLK"})
	f := &rulesFixture{env: e, up: up, proxyURL: u, ph: phs,
		api: "api.example.test:" + itoa(up.port), other: "other.example.test:" + itoa(up.port), third: "third.example.test:" + itoa(up.port)}
	t.Cleanup(func() { e.assertNoLeak(realGH, realWarn, realURL, phs["GH"], phs["WARN"], phs["URLK"]) })
	return f
}

// ruleCase is one request and what the rules make of it.
type ruleCase struct {
	name   string
	method string
	// target is the URL's path (and query) as the client sends it.
	target string
	header http.Header
	// key carries GH's placeholder in Authorization when set.
	key    bool
	status int
	// action and rule are the audit line's.
	action, rule string
}

const ghRule = "projects.acme.keys.GH."

// The GitHub-like key on both protocols: fetches go with the real value,
// a push is refused 403 with the rule named (in the answer and the audit
// line) and nothing reaches the upstream, whatever way the path is
// written; a request without the key is not the key's business.
func TestRequestRulesRefuseWhatTheKeysRulesDenyOnH1AndH2(t *testing.T) {
	cases := []ruleCase{
		{"the ref advertisement", "GET", "/org/repo.git/info/refs?service=git-upload-pack", nil, true, 200, "substituted", ghRule + "rules[2]"},
		{"a fetch", "POST", "/org/repo.git/git-upload-pack", nil, true, 200, "substituted", ghRule + "rules[2]"},
		{"a push", "POST", "/org/repo.git/git-receive-pack", nil, true, 403, "blocked", ghRule + "rules[0]"},
		{"a push to a subgroup's repository", "POST", "/group/sub/repo.git/git-receive-pack", nil, true, 403, "blocked", ghRule + "rules[0]"},
		{"a push to no repository", "POST", "/git-receive-pack", nil, true, 403, "blocked", ghRule + "rules[0]"},
		{"a push in other case", "POST", "/Org/Repo.git/GIT-Receive-Pack", nil, true, 403, "blocked", ghRule + "rules[0]"},
		{"a push percent-encoded", "POST", "/org/repo.git/git-receive-%70%61ck", nil, true, 403, "blocked", ghRule + "rules[0]"},
		{"a push with a trailing slash", "POST", "/org/repo.git/git-receive-pack/", nil, true, 403, "blocked", ghRule + "rules[0]"},
		{"a push through a dot-dot segment", "POST", "/org/x/../repo.git/git-receive-pack", nil, true, 403, "blocked", ghRule + "rules"},
		{"a push through an empty segment", "POST", "/org/repo.git//git-receive-pack", nil, true, 403, "blocked", ghRule + "rules"},
		{"a push through an encoded slash", "POST", "/org/repo.git%2Fgit-receive-pack", nil, true, 403, "blocked", ghRule + "rules"},
		{"a push with a path parameter", "POST", "/org/repo.git/git-receive-pack;x=1", nil, true, 403, "blocked", ghRule + "rules"},
		{"a push twice encoded", "POST", "/org/repo.git/git-receive-%2570ack", nil, true, 403, "blocked", ghRule + "rules"},
		{"a push as an override header", "GET", "/org/repo.git/git-receive-pack", http.Header{"X-Http-Method-Override": {"post"}}, true, 403, "blocked", ghRule + "rules[0]"},
		{"a push as a _method parameter", "GET", "/org/repo.git/git-receive-pack?a=1;_method=POST", nil, true, 403, "blocked", ghRule + "rules[0]"},
		{"another method", "DELETE", "/org/repo.git", nil, true, 403, "blocked", ghRule + "default"},
		{"a push without the key", "POST", "/org/repo.git/git-receive-pack", nil, false, 200, "forwarded", ""},
	}
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newRulesFixture(t)
			c := f.goClient(f.proxyURL, h2)
			for _, tc := range cases {
				before := len(f.up.requests())
				req, err := http.NewRequest(tc.method, "https://"+f.api+tc.target, strings.NewReader("0000"))
				must(t, err)
				for k, vs := range tc.header {
					req.Header[k] = vs
				}
				if tc.key {
					req.Header.Set("Authorization", "Bearer "+f.ph["GH"])
				}
				res, err := c.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if wantProto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]; res.Proto != wantProto {
					t.Fatalf("%s: answered over %s, want %s", tc.name, res.Proto, wantProto)
				}
				got := f.up.requests()[before:]
				switch {
				case res.StatusCode != tc.status:
					t.Errorf("%s: %d %q, want %d", tc.name, res.StatusCode, body, tc.status)
				case tc.status == 403 && (len(got) != 0 || !strings.HasPrefix(string(body), "runfleet edge: blocked: ") || !strings.Contains(string(body), tc.rule)):
					t.Errorf("%s: refused with %q, the upstream got %d requests; want nothing sent and the rule %s named", tc.name, body, len(got), tc.rule)
				case tc.status == 200 && tc.key && (len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+realGH):
					t.Errorf("%s: the upstream got %d requests, not with the real value", tc.name, len(got))
				}
			}
			lines := f.runLines(len(cases))
			for i, tc := range cases {
				l := lines[i]
				if l["action"] != tc.action || fmt.Sprint(l["rule"]) != fmt.Sprint(orNil(tc.rule)) || l["status"] != float64(tc.status) {
					t.Errorf("%s: audit %v, want action %s, rule %q, status %d", tc.name, l, tc.action, tc.rule, tc.status)
				}
				if tc.action == "blocked" && (fmt.Sprint(l["keys"]) != "[acme/GH]" || !strings.HasPrefix(fmt.Sprint(l["reason"]), "blocked: ") || !strings.Contains(fmt.Sprint(l["reason"]), tc.rule)) {
					t.Errorf("%s: audit %v, want the key and a reason naming the rule", tc.name, l)
				}
			}
		})
	}
}

// What a Go client would not send, written on the wire: each is refused
// by GH's rules, nothing reaching the upstream.
func TestRequestRulesRawHTTP1Attacks(t *testing.T) {
	f := newRulesFixture(t)
	auth := "Authorization: Bearer " + f.ph["GH"] + "\r\n"
	for _, tc := range []struct{ name, head, rule string }{
		{"a backslash", "POST /org/repo.git\\git-receive-pack HTTP/1.1\r\n", "rules"},
		{"an override field in lower case", "GET /org/repo.git/git-receive-pack HTTP/1.1\r\nx-http-method-override: post\r\n", "rules[0]"},
		{"X-HTTP-Method", "GET /org/repo.git/git-receive-pack HTTP/1.1\r\nX-HTTP-Method: GET, POST\r\n", "rules[0]"},
		{"the absolute form", "POST https://" + f.api + "/org/repo.git/git-receive-pack HTTP/1.1\r\n", "rules[0]"},
		{"the asterisk form", "OPTIONS * HTTP/1.1\r\n", "rules"},
		{"a method in lower case", "post /org/repo.git/git-receive-pack HTTP/1.1\r\n", "rules[0]"},
	} {
		tc2, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
		res, body := roundTrip(t, tc2, br, tc.head+"Host: "+f.api+"\r\n"+auth+"Content-Length: 0\r\n\r\n")
		tc2.Close()
		if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "blocked: ") || !strings.Contains(body, ghRule+tc.rule) {
			t.Errorf("%s: %d %q, want 403 naming %s", tc.name, res.StatusCode, body, ghRule+tc.rule)
		}
	}
	if got := f.up.requests(); len(got) != 0 {
		t.Errorf("the upstream got %d requests", len(got))
	}
}

// A transparent connection (a client that ignores HTTPS_PROXY) is decided
// by the same rules in the same pipeline, on both protocols.
func TestRequestRulesHoldOnTransparentConnections(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newRulesFixture(t)
			tn := f.network("run-r")
			tn.pin("api.example.test")
			c := tn.client(f.authority.Bundle(), h2)
			for _, tc := range []struct {
				path   string
				status int
				rule   string
			}{
				{"/org/repo.git/git-upload-pack", 200, ghRule + "rules[2]"},
				{"/org/repo.git/git-receive-pack", 403, ghRule + "rules[0]"},
			} {
				req, _ := http.NewRequest(http.MethodPost, "https://"+f.api+tc.path, strings.NewReader("0000"))
				req.Header.Set("Authorization", "Bearer "+f.ph["GH"])
				res, err := c.Do(req)
				must(t, err)
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != tc.status {
					t.Errorf("%s: %d, want %d", tc.path, res.StatusCode, tc.status)
				}
				l := f.waitAudit(func(m map[string]any) bool { return m["path"] == tc.path })
				if l["via"] != "transparent" || l["rule"] != tc.rule || l["status"] != float64(tc.status) {
					t.Errorf("%s: audit %v, want via transparent, rule %s", tc.path, l, tc.rule)
				}
			}
			if got := f.up.requests(); len(got) != 1 || got[0].Path != "/org/repo.git/git-upload-pack" {
				t.Errorf("the upstream got %d requests, want the fetch alone", len(got))
			}
		})
	}
}

// Warn mode on both protocols: the push goes with the real value, and
// its audit line says warned, with the rule that would have refused it;
// a request the rules allow is not a warning.
func TestRequestRulesWarnModeLetsThroughAndNamesTheRule(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newRulesFixture(t)
			c := f.goClient(f.proxyURL, h2)
			for _, path := range []string{"/org/repo.git/git-receive-pack", "/org/repo.git/git-upload-pack", "/org/x/../repo.git/git-receive-pack"} {
				req, _ := http.NewRequest(http.MethodPost, "https://"+f.other+path, strings.NewReader("0000"))
				req.Header.Set("Authorization", "Bearer "+f.ph["WARN"])
				res, err := c.Do(req)
				must(t, err)
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != 200 {
					t.Fatalf("%s in warn mode: %d", path, res.StatusCode)
				}
			}
			got := f.up.requests()
			if len(got) != 3 || got[0].Header.Get("Authorization") != "Bearer "+realWarn || got[0].Path != "/org/repo.git/git-receive-pack" {
				t.Fatalf("the upstream got %d requests; want the push with the real value first", len(got))
			}
			lines := f.runLines(3)
			for i, want := range []struct{ action, rule, reason string }{
				{"warned", "projects.acme.keys.WARN.rules[0]", "warned: projects.acme.keys.WARN.rules[0] (deny /**/git-receive-pack /ws/private) matches the request; warn mode let it through"},
				{"substituted", "projects.acme.keys.WARN.default", ""},
				{"warned", "projects.acme.keys.WARN.rules", "warned: projects.acme.keys.WARN.rules name paths, and the request's path is ambiguous: " + `it has a dot segment ("." or "..")`},
			} {
				l := lines[i]
				if l["action"] != want.action || l["rule"] != want.rule || !strings.HasPrefix(fmt.Sprint(orEmpty(l["reason"])), want.reason) || fmt.Sprint(l["keys"]) != "[acme/WARN]" {
					t.Errorf("request %d: audit %v, want %s by %s, reason %q", i, l, want.action, want.rule, want.reason)
				}
			}
		})
	}
}

// A key's rules decide wherever its placeholder is: in the path itself
// (matched as the task sent it, the placeholder in it), in a body read
// whole or streamed; a request that does not carry the key goes.
func TestRequestRulesGovernEveryLocationOfTheKey(t *testing.T) {
	f := newRulesFixture(t)
	c := f.goClient(f.proxyURL, true)
	ph := f.ph["URLK"]
	send := func(method, path, body string, length bool) (int, string) {
		t.Helper()
		var rd io.Reader = strings.NewReader(body)
		if !length {
			rd = io.MultiReader(rd) // no length known: streamed
		}
		req, err := http.NewRequest(method, "https://"+f.third+path, rd)
		must(t, err)
		res, err := c.Do(req)
		must(t, err)
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	if status, body := send("GET", "/admin/"+ph+"/x", "", true); status != 403 || !strings.Contains(body, "projects.acme.keys.URLK.rules[0]") {
		t.Errorf("the key in a denied path: %d %q", status, body)
	}
	if status, _ := send("GET", "/repos/"+ph, "", true); status != 200 {
		t.Errorf("the key in an allowed path: %d", status)
	}
	if status, _ := send("POST", "/admin/users", "key="+ph, true); status != 403 {
		t.Errorf("the key in a body read whole, to a denied path: %d", status)
	}
	big := strings.Repeat("x", 200<<10) + ph
	if status, _ := send("POST", "/admin/upload", big, false); status != 403 {
		t.Errorf("the key in a streamed body, to a denied path: %d", status)
	}
	if status, _ := send("POST", "/admin/users", "no key here", true); status != 200 {
		t.Errorf("a request without the key to a denied path: %d", status)
	}
	// The streamed body's head left before its end was read: the
	// upstream may have seen the request begin, never the value.
	paths := map[string]bool{}
	for _, r := range f.up.requests() {
		paths[r.Path] = true
		if strings.Contains(string(r.Body)+r.Path, realURL) && strings.HasPrefix(r.Path, "/admin") {
			t.Errorf("the upstream got the real value at %s", r.Path)
		}
	}
	if !paths["/repos/"+realURL] || !paths["/admin/users"] || paths["/admin/"+realURL+"/x"] || paths["/admin/"+ph+"/x"] {
		t.Errorf("the upstream got %v; want the allowed path with the real value and the request without the key, nothing else of /admin but the streamed upload", paths)
	}
	for _, l := range f.auditLines() {
		if l["action"] == "blocked" && l["rule"] != "projects.acme.keys.URLK.rules[0]" {
			t.Errorf("a refusal whose line does not name the rule: %v", l)
		}
	}
}

// A WebSocket's handshake is a request like any: refused before anything
// reaches the upstream when the rules deny it, relayed when they allow
// it, relayed and audited warned in warn mode.
func TestRequestRulesDecideAWebSocketHandshake(t *testing.T) {
	f := newRulesFixture(t)
	var opened atomic.Int32
	ws := websocket.Server{Handler: func(c *websocket.Conn) {
		opened.Add(1)
		var msg string
		for websocket.Message.Receive(c, &msg) == nil {
			websocket.Message.Send(c, "echo: "+msg)
		}
	}}
	f.up.handler = ws.ServeHTTP
	dial := func(hostport, sni, path, key string) (*websocket.Conn, error) {
		tc, _ := f.dialIntercepted(f.proxyURL, hostport, sni, "http/1.1")
		t.Cleanup(func() { tc.Close() })
		cfg, err := websocket.NewConfig("wss://"+hostport+path, "https://"+hostport)
		must(t, err)
		cfg.Header = http.Header{"Authorization": {"Bearer " + f.ph[key]}}
		return websocket.NewClient(cfg, tc)
	}
	if _, err := dial(f.api, "api.example.test", "/ws/private", "GH"); err == nil {
		t.Fatal("the denied handshake opened a socket")
	}
	if opened.Load() != 0 || len(f.up.requests()) != 0 {
		t.Fatalf("the denied handshake reached the upstream")
	}
	refused := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/ws/private" })
	if refused["action"] != "blocked" || refused["rule"] != ghRule+"rules[1]" || refused["status"] != float64(403) {
		t.Errorf("the denied handshake's audit: %v", refused)
	}
	for _, tc := range []struct{ hostport, sni, path, key, action, rule string }{
		{f.api, "api.example.test", "/ws/public", "GH", "substituted", ghRule + "rules[2]"},
		{f.other, "other.example.test", "/ws/private", "WARN", "warned", "projects.acme.keys.WARN.rules[0]"},
	} {
		conn, err := dial(tc.hostport, tc.sni, tc.path, tc.key)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.key, tc.path, err)
		}
		must(t, websocket.Message.Send(conn, "hello"))
		var got string
		must(t, websocket.Message.Receive(conn, &got))
		if got != "echo: hello" {
			t.Fatalf("%s %s: got %q", tc.key, tc.path, got)
		}
		conn.Close()
		l := f.waitAudit(func(m map[string]any) bool { return m["host"] == tc.hostport && m["path"] == tc.path })
		if l["action"] != tc.action || l["rule"] != tc.rule || l["status"] != float64(http.StatusSwitchingProtocols) {
			t.Errorf("%s %s: audit %v, want %s by %s", tc.key, tc.path, l, tc.action, tc.rule)
		}
	}
}

// An aws key's rules decide its SigV4 requests, which are re-signed, not
// substituted: an S3 PutObject the rules deny is refused as AWS refuses
// (AccessDenied, the rule named) and never signed with the real key; a
// GetObject they allow is. A reload applies to the next request.
func TestRequestRulesDecideAnAWSKeysSignedRequests(t *testing.T) {
	g := newSigRig(t)
	p := g.up.port
	g.writePolicy(fmt.Sprintf(`{%q: "127.0.0.1", %q: "127.0.0.1", %q: "127.0.0.1", %q: "127.0.0.1"}`, stsHost, s3Host, ddbHost, apiHost), fmt.Sprintf(`{"acme": {"keys": {
		"DEPLOY": {"kind": "aws", "domains": ["%s:%d", "%s:%d", "%s:%d"], "aws": {"regions": ["us-east-1"], "services": ["sts", "s3", "dynamodb"]}},
		"TEMP": {"kind": "aws", "domains": ["%s:%d"], "aws": {"regions": ["us-east-1"], "services": ["s3"], "envPrefix": "TEMP_AWS_"},
			"rules": [{"allow": {"methods": ["GET", "HEAD"], "paths": ["/reports/**"]}}], "default": "deny"},
		"A": {"domains": ["%s:%d"], "in": ["header"]}}}}`, stsHost, p, s3Host, p, ddbHost, p, s3Host, p, apiHost, p))
	must(t, g.watcher.Reload())
	if k, _ := g.watcher.Current().Key(policy.KeyRef{Project: "acme", Key: "TEMP"}); k.Rules == nil {
		t.Fatal("the reloaded policy has no rules for TEMP")
	}
	k := g.newTask(t, "run-aws-rules", false)
	s3c := g.s3Client(k, k.temp)
	ctx := context.Background()
	_, err := s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("reports"), Key: aws.String("q1.csv"), Body: strings.NewReader("a,b\n")})
	if err == nil || !strings.Contains(err.Error(), "AccessDenied") || !strings.Contains(err.Error(), "projects.acme.keys.TEMP.default") {
		t.Fatalf("PutObject the rules deny: %v", err)
	}
	if n := len(g.reached("/reports/q1.csv")); n != 0 {
		t.Fatalf("the denied PutObject reached the upstream %d times", n)
	}
	line := g.auditOf(s3Host, "/reports/q1.csv")
	if line["action"] != "blocked" || line["rule"] != "projects.acme.keys.TEMP.default" || fmt.Sprint(line["keys"]) != "[acme/TEMP]" {
		t.Errorf("the denied PutObject's audit: %v", line)
	}
	out, err := s3c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("reports"), Key: aws.String("q2.csv")})
	if err != nil {
		t.Fatalf("GetObject the rules allow: %v", err)
	}
	out.Body.Close()
	g.assertResigned(t, "/reports/q2.csv", realASIAID)
	if line := g.auditOf(s3Host, "/reports/q2.csv"); line["action"] != "substituted" || line["rule"] != "projects.acme.keys.TEMP.rules[0]" {
		t.Errorf("the allowed GetObject's audit: %v", line)
	}
}

// runLines waits for the fixture's run to have n audit lines of requests
// (its CONNECTs' lines left out) and returns them, oldest first.
func (f *rulesFixture) runLines(n int) []map[string]any {
	f.t.Helper()
	var lines []map[string]any
	await.Within(5*time.Second, func() bool {
		lines = lines[:0]
		for _, l := range f.auditLines() {
			if l["task"] == "run-r" && l["method"] != "CONNECT" {
				lines = append(lines, l)
			}
		}
		return len(lines) >= n
	})
	if len(lines) != n {
		f.t.Fatalf("%d audit lines, want %d: %v", len(lines), n, lines)
	}
	return lines
}

// orNil is a JSON field's value as decoded: absent for "".
func orNil(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func orEmpty(v any) any {
	if v == nil {
		return ""
	}
	return v
}
