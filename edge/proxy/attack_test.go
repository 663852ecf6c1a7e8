package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

const (
	realA = "real-A-value-do-not-leak-1111"
	realB = "real-B-value-do-not-leak-2222"
)

// fixture: one HTTPS upstream on loopback answering as api.example.test and
// other.example.test (both pinned to 127.0.0.1); key A may reach api in
// headers only, key B may reach other in headers, URL and body.
type fixture struct {
	*env
	up         *testUpstream
	proxyURL   *url.URL
	phA, phB   string
	api, other string // host:port
}

func newFixture(t *testing.T, egress string) *fixture {
	t.Helper()
	return newFixtureWith(t, envOptions{egress: egress})
}

// newFixtureWith is newFixture with more options (the fixture's own are
// set over o's).
func newFixtureWith(t *testing.T, o envOptions) *fixture {
	t.Helper()
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, true, "api.example.test", "other.example.test", "third.example.test")
	o.uca = uca
	o.pins = map[string]string{"api.example.test": "127.0.0.1", "other.example.test": "127.0.0.1", "third.example.test": "127.0.0.1"}
	o.keys = fmt.Sprintf(`{"acme": {"keys": {
			"A": {"domains": ["api.example.test:%d"], "in": ["header"]},
			"B": {"domains": ["other.example.test:%d"], "in": ["header", "url", "body"], "placeholder": {"prefix": "pb_", "length": 40}}}}}`, up.port, up.port)
	o.secrets = map[string]string{"acme/A": realA, "acme/B": realB}
	e := newEnv(t, o)
	u, phs := e.task("run-a", runspec.Secret{ProjectID: "acme", Key: "A"}, runspec.Secret{ProjectID: "acme", Key: "B"})
	f := &fixture{env: e, up: up, proxyURL: u, phA: phs["A"], phB: phs["B"],
		api: "api.example.test:" + itoa(up.port), other: "other.example.test:" + itoa(up.port)}
	t.Cleanup(func() { e.assertNoLeak(realA, realB, f.phA, f.phB) })
	return f
}

// headerOnlyTask registers run-h, holding key A alone (in: header), and
// returns its proxy URL and placeholder. Under open egress its connections
// to names no key of it reaches are tunnelled; run-a's are intercepted to
// scrub their answers instead, since run-a holds B, which may go in a url
// or body (a value an upstream may store: issue 27 item 4).
func (f *fixture) headerOnlyTask() (*url.URL, string) {
	u, phs := f.task("run-h", runspec.Secret{ProjectID: "acme", Key: "A"})
	return u, phs["A"]
}

// get sends one request through the proxy with a Go client.
func (f *fixture) get(t *testing.T, rawURL string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, rawURL, nil)
	for k, vs := range header {
		req.Header[k] = vs
	}
	res, err := f.goClient(f.proxyURL, false).Do(req)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

func (f *fixture) upstreamNeverSaw(t *testing.T, values ...string) {
	t.Helper()
	for _, r := range f.up.requests() {
		dump := fmt.Sprint(r.Header) + r.Path + r.RawQuery + string(r.Body)
		for _, v := range values {
			if strings.Contains(dump, v) {
				t.Errorf("the upstream received a value or placeholder (%d chars)", len(v))
			}
		}
	}
}

func TestAttackPlaceholderToAnotherKeysHost(t *testing.T) {
	f := newFixture(t, "open")
	// A's placeholder to B's host (intercepted for B): blocked.
	res, body := f.get(t, "https://"+f.other+"/v1", http.Header{"Authorization": {"Bearer " + f.phA}})
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "may not reach other.example.test") {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("a blocked request reached the upstream")
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["action"] == "blocked" })
	if fmt.Sprint(line["keys"]) != "[acme/A]" || line["status"] != float64(403) {
		t.Errorf("audit = %v", line)
	}
}

func TestAttackPlaceholderToNonAllowedHostIsNeverSubstituted(t *testing.T) {
	f := newFixture(t, "open")
	// third.example.test: no key reaches it. For a run with header keys
	// alone it is tunnelled untouched: the placeholder travels as it is,
	// worthless, and the value never.
	proxyURL, phA := f.headerOnlyTask()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.uca.PEM)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}}}
	res, err := client.Get("https://third.example.test:" + itoa(f.up.port) + "/x?key=" + phA)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	got := f.up.requests()
	if res.StatusCode != 200 || len(got) != 1 || !strings.Contains(got[0].RawQuery, phA) {
		t.Fatalf("status %d, upstream got %v", res.StatusCode, got)
	}
	f.upstreamNeverSaw(t, realA, realB)
	f.waitAudit(func(m map[string]any) bool {
		return m["action"] == "tunnelled" && m["host"] == "third.example.test:"+itoa(f.up.port) && m["task"] == "run-h"
	})
	// For run-a, which holds a body key, it is intercepted to scrub its
	// answers: there the placeholder blocks the request, as anywhere its
	// key may not reach.
	res, body := f.get(t, "https://third.example.test:"+itoa(f.up.port)+"/y?key="+f.phA, nil)
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "key acme/A may not reach third.example.test") {
		t.Fatalf("run-a: %d %q", res.StatusCode, body)
	}
	if len(f.up.requests()) != 1 {
		t.Fatal("a blocked request reached the upstream")
	}
	f.waitAudit(func(m map[string]any) bool {
		return m["action"] == "blocked" && m["path"] == "/y" && m["task"] == "run-a"
	})
}

// A placeholder sent as the method (key B's, to a host B may not reach;
// over HTTP/1.1 and HTTP/2) is blocked, never forwarded.
func TestAttackPlaceholderAsTheMethod(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
	defer tc.Close()
	res, body := roundTrip(t, tc, br, f.phB+" /m1 HTTP/1.1\r\nHost: "+f.api+"\r\n\r\n")
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "a placeholder in the method") {
		t.Fatalf("HTTP/1.1: %d %q", res.StatusCode, body)
	}
	req := mustRequest(t, "https://"+f.api+"/m2", "")
	req.Method = f.phB
	res2, err := f.goClient(f.proxyURL, true).Do(req)
	must(t, err)
	res2.Body.Close()
	if res2.StatusCode != http.StatusForbidden || res2.ProtoMajor != 2 {
		t.Fatalf("HTTP/2: %d %s", res2.StatusCode, res2.Proto)
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("a placeholder method reached the upstream")
	}
	for _, path := range []string{"/m1", "/m2"} {
		line := f.waitAudit(func(m map[string]any) bool { return m["path"] == path })
		if line["action"] != "blocked" || fmt.Sprint(line["keys"]) != "[acme/B]" || line["method"] != "[placeholder]" {
			t.Errorf("audit %v", line)
		}
	}
}

func TestAttackSNIMismatch(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "other.example.test")
	defer tc.Close()
	res, _ := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: "+f.api+"\r\nAuthorization: Bearer "+f.phA+"\r\n\r\n")
	if res.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("status %d", res.StatusCode)
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
}

func TestAttackHostMismatch(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
	defer tc.Close()
	res, _ := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: "+f.other+"\r\nAuthorization: Bearer "+f.phB+"\r\n\r\n")
	if res.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("status %d", res.StatusCode)
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
}

func TestAttackAbsoluteURLMismatch(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
	defer tc.Close()
	res, _ := roundTrip(t, tc, br, "GET https://"+f.other+"/ HTTP/1.1\r\nHost: "+f.api+"\r\nAuthorization: Bearer "+f.phB+"\r\n\r\n")
	if res.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("status %d", res.StatusCode)
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
}

func TestAttackSecondRequestOnKeptAliveConnectionNamesAnotherHost(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
	defer tc.Close()
	res, _ := roundTrip(t, tc, br, "GET /first HTTP/1.1\r\nHost: "+f.api+"\r\nAuthorization: Bearer "+f.phA+"\r\n\r\n")
	if res.StatusCode != 200 {
		t.Fatalf("first: %d", res.StatusCode)
	}
	res, _ = roundTrip(t, tc, br, "GET /second HTTP/1.1\r\nHost: "+f.other+"\r\nAuthorization: Bearer "+f.phB+"\r\n\r\n")
	if res.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("second: %d", res.StatusCode)
	}
	if got := f.up.requests(); len(got) != 1 || got[0].Path != "/first" || got[0].Header.Get("Authorization") != "Bearer "+realA {
		t.Fatalf("upstream got %v", got)
	}
}

func TestAttackBracketedAndPortVariants(t *testing.T) {
	f := newFixture(t, "open")
	port := itoa(f.up.port)
	for _, host := range []string{
		"[::1]:" + port, "[127.0.0.1]:" + port, "127.0.0.1:" + port, "api.example.test", "api.example.test:443",
		"api.example.test:0" + port, "[api.example.test]:" + port, "api.example.test:" + port + ":" + port, "api.example.test.evil:" + port,
	} {
		tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
		res, _ := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: "+host+"\r\nAuthorization: Bearer "+f.phA+"\r\n\r\n")
		tc.Close()
		if res.StatusCode != http.StatusMisdirectedRequest && res.StatusCode != http.StatusBadRequest {
			t.Errorf("Host %q: status %d", host, res.StatusCode)
		}
	}
	// The same variants as CONNECT targets are never intercepted.
	for _, target := range []string{"[api.example.test]:" + port, "api.example.test", "api.example.test:0" + port} {
		c, _, status := f.connect(f.proxyURL, target)
		c.Close()
		if status != http.StatusBadRequest {
			t.Errorf("CONNECT %q: %d", target, status)
		}
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
}

func TestAttackHostMatcherEdgeCases(t *testing.T) {
	f := newFixture(t, "strict")
	port := itoa(f.up.port)
	// Case and a trailing dot name the same host: intercepted and substituted.
	for _, spelled := range []string{"API.Example.TEST:" + port, "api.example.test.:" + port} {
		tc, br := f.dialIntercepted(f.proxyURL, spelled, "api.example.test")
		res, _ := roundTrip(t, tc, br, "GET /case HTTP/1.1\r\nHost: "+spelled+"\r\nAuthorization: Bearer "+f.phA+"\r\n\r\n")
		tc.Close()
		if res.StatusCode != 200 {
			t.Errorf("%q: %d", spelled, res.StatusCode)
		}
	}
	for _, r := range f.up.requests() {
		if r.Header.Get("Authorization") != "Bearer "+realA || r.Host != f.api {
			t.Errorf("upstream got host %q auth ok=%v", r.Host, r.Header.Get("Authorization") == "Bearer "+realA)
		}
	}
	// Look-alikes are other hosts: not intercepted, and refused under strict egress.
	for _, target := range []string{"api.example.test.evil:" + port, "xapi.example.test:" + port, "аpi.example.test:" + port, "sub.api.example.test:" + port} {
		c, _, status := f.connect(f.proxyURL, target)
		c.Close()
		if status != http.StatusForbidden {
			t.Errorf("CONNECT %q: %d, want 403", target, status)
		}
	}
}

func TestAttackIDNDomains(t *testing.T) {
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, false, "xn--bcher-kva.example.test")
	e := newEnv(t, envOptions{
		uca: uca, egress: "strict",
		pins:    map[string]string{"xn--bcher-kva.example.test": "127.0.0.1"},
		keys:    fmt.Sprintf(`{"acme": {"keys": {"K": {"domains": ["Bücher.example.test:%d"]}}}}`, up.port),
		secrets: map[string]string{"acme/K": realA},
	})
	u, phs := e.task("run-idn", runspec.Secret{ProjectID: "acme", Key: "K"})
	res, err := e.goClient(u, false).Do(mustRequest(t, "https://xn--bcher-kva.example.test:"+itoa(up.port)+"/", "Bearer "+phs["K"]))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || len(up.requests()) != 1 || up.requests()[0].Header.Get("Authorization") != "Bearer "+realA {
		t.Fatalf("punycode form: %d", res.StatusCode)
	}
	// The Unicode spelling in a CONNECT canonicalises to the same name.
	c, _, status := e.connect(u, "bücher.example.test:"+itoa(up.port))
	c.Close()
	if status != 200 {
		t.Errorf("unicode CONNECT: %d", status)
	}
	// A homograph (Cyrillic с) is another name.
	c, _, status = e.connect(u, "büсher.example.test:"+itoa(up.port))
	c.Close()
	if status != http.StatusForbidden {
		t.Errorf("homograph CONNECT: %d", status)
	}
}

func mustRequest(t *testing.T, rawURL, auth string) *http.Request {
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	must(t, err)
	req.Header.Set("Authorization", auth)
	return req
}

func TestAttackUpstreamResolvingToInternalAddresses(t *testing.T) {
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, false, "loop.example.test", "ten.example.test", "meta.example.test", "mapped.example.test", "mapmeta.example.test", "self.example.test")
	names := []string{"loop", "ten", "meta", "mapped", "mapmeta"}
	pins := map[string]string{
		"loop.example.test": "127.0.0.1", "ten.example.test": "10.1.2.3", "meta.example.test": "169.254.169.254",
		"mapped.example.test": "::ffff:127.0.0.1", "mapmeta.example.test": "::ffff:169.254.169.254",
	}
	var keys []string
	var decl []runspec.Secret
	for _, n := range names {
		keys = append(keys, fmt.Sprintf(`"K_%s": {"domains": ["%s.example.test:%d"]}`, n, n, up.port))
		decl = append(decl, runspec.Secret{ProjectID: "acme", Key: "K_" + n})
	}
	sec := map[string]string{}
	for _, n := range names {
		sec["acme/K_"+n] = realA
	}
	e := newEnv(t, envOptions{uca: uca, egress: "open", noAllowPrivate: true, pins: pins,
		keys: `{"acme": {"keys": {` + strings.Join(keys, ",") + `}}}`, secrets: sec})
	u, phs := e.task("run-internal", decl...)
	for _, n := range names {
		res, err := e.goClient(u, false).Do(mustRequest(t, "https://"+n+".example.test:"+itoa(up.port)+"/", "Bearer "+phs["K_"+n]))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "upstream refused") {
			t.Errorf("%s (%s): %d %s", n, pins[n+".example.test"], res.StatusCode, body)
		}
	}
	// Tunnels are guarded too.
	for _, target := range []string{"ten.example.test:443", "meta.example.test:80", "10.0.0.1:443", "[::ffff:169.254.169.254]:80"} {
		c, _, status := e.connect(u, target)
		c.Close()
		if status != http.StatusForbidden {
			t.Errorf("tunnel to %s: %d", target, status)
		}
	}
	if len(up.requests()) != 0 {
		t.Fatal("an internal upstream was reached")
	}
	e.assertNoLeak(realA)
}

func TestAttackUpstreamIsTheProxyItself(t *testing.T) {
	uca := edgetest.NewCA(t)
	e := newEnv(t, envOptions{uca: uca, egress: "open", pins: map[string]string{"self.example.test": "127.0.0.1"},
		keys: `{"acme": {"keys": {"K": {"domains": ["self.example.test:1"]}}}}`, secrets: map[string]string{"acme/K": realA}})
	// The policy cannot know the port before the listener exists: rewrite it.
	port := e.listener.Addr().(*net.TCPAddr).Port
	e.writePolicy(`{"self.example.test": "127.0.0.1"}`, fmt.Sprintf(`{"acme": {"keys": {"K": {"domains": ["self.example.test:%d"]}}}}`, port))
	must(t, e.watcher.Reload())
	u, phs := e.task("run-self", runspec.Secret{ProjectID: "acme", Key: "K"})
	res, err := e.goClient(u, false).Do(mustRequest(t, "https://self.example.test:"+itoa(port)+"/", "Bearer "+phs["K"]))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "own address") {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	// Tunnelling to the proxy's own address, by IP, is refused as well,
	// although 127.0.0.0/8 is allowed.
	c, _, status := e.connect(u, "127.0.0.1:"+itoa(port))
	c.Close()
	if status != http.StatusForbidden {
		t.Errorf("tunnel to itself: %d", status)
	}
}

func TestAttackDeniedNameNeverResolved(t *testing.T) {
	f := newFixture(t, "strict")
	before := len(f.resolver.lookups())
	// Strict egress: refused before any lookup.
	c, _, status := f.connect(f.proxyURL, "elsewhere.example.test:443")
	c.Close()
	// An intercepted name on a port no key names: refused before any lookup.
	c2, _, status2 := f.connect(f.proxyURL, "api.example.test:8443")
	c2.Close()
	// A blocked placeholder: refused before its host is resolved.
	res, _ := f.get(t, "https://"+f.other+"/", http.Header{"Authorization": {"Bearer " + f.phA}})
	if status != 403 || status2 != 403 || res.StatusCode != 403 {
		t.Fatalf("statuses %d %d %d", status, status2, res.StatusCode)
	}
	if got := f.resolver.lookups()[before:]; len(got) != 0 {
		t.Fatalf("denied names were resolved: %v", got)
	}
}

func TestAttackPlaceholderInADisallowedLocation(t *testing.T) {
	f := newFixture(t, "open")
	// Key A is header-only: in the query, in the path, in the body: blocked.
	for name, do := range map[string]func() *http.Response{
		"query": func() *http.Response { r, _ := f.get(t, "https://"+f.api+"/v1?key="+f.phA, nil); return r },
		"path":  func() *http.Response { r, _ := f.get(t, "https://"+f.api+"/v1/"+f.phA, nil); return r },
		"body": func() *http.Response {
			res, err := f.goClient(f.proxyURL, false).Post("https://"+f.api+"/v1", "application/json", strings.NewReader(`{"key":"`+f.phA+`"}`))
			must(t, err)
			res.Body.Close()
			return res
		},
	} {
		if res := do(); res.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d", name, res.StatusCode)
		}
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
	// Key B allows all three: substituted in each, the query escaped.
	res, err := f.goClient(f.proxyURL, false).Post("https://"+f.other+"/v1/"+f.phB+"?key="+f.phB, "application/json",
		strings.NewReader(`{"key":"`+f.phB+`"}`))
	must(t, err)
	res.Body.Close()
	got := f.up.requests()
	if res.StatusCode != 200 || len(got) != 1 || got[0].Path != "/v1/"+realB || got[0].RawQuery != "key="+realB || string(got[0].Body) != `{"key":"`+realB+`"}` {
		t.Fatalf("%d %+v", res.StatusCode, got)
	}
	if got[0].ContentLength != int64(len(got[0].Body)) {
		t.Errorf("Content-Length %d for a %d-byte body", got[0].ContentLength, len(got[0].Body))
	}
}

// A chunked body written in pieces, the placeholder split between them, with
// the connection flushed in between: found, substituted, nothing lost.
func TestAttackPlaceholderSplitAcrossBodyChunks(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.other, "other.example.test")
	defer tc.Close()
	body := strings.Repeat("x", 70000) + "token=" + f.phB + "&end"
	cut := 70000 + len("token=") + 11
	pieces := []string{body[:cut], body[cut : cut+9], body[cut+9:]}
	fmt.Fprintf(tc, "POST /upload HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", f.other)
	for _, p := range pieces {
		fmt.Fprintf(tc, "%x\r\n%s\r\n", len(p), p)
	}
	io.WriteString(tc, "0\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	must(t, err)
	io.Copy(io.Discard, res.Body)
	got := f.up.requests()
	want := strings.Repeat("x", 70000) + "token=" + realB + "&end"
	if res.StatusCode != 200 || len(got) != 1 || string(got[0].Body) != want {
		t.Fatalf("status %d, upstream got %d requests", res.StatusCode, len(got))
	}
	// The same split with key A's placeholder (not allowed in a body) stops
	// the request: the upstream never gets a complete one with it.
	tc2, br2 := f.dialIntercepted(f.proxyURL, f.other, "other.example.test")
	defer tc2.Close()
	body = strings.Repeat("y", 70000) + f.phA
	fmt.Fprintf(tc2, "POST /upload2 HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", f.other)
	for _, p := range []string{body[:70005], body[70005:]} {
		fmt.Fprintf(tc2, "%x\r\n%s\r\n", len(p), p)
	}
	io.WriteString(tc2, "0\r\n\r\n")
	res, err = http.ReadResponse(br2, nil)
	must(t, err)
	io.Copy(io.Discard, res.Body)
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("blocked split: %d; audit %v; upstream %d", res.StatusCode, f.auditLines(), len(f.up.requests()))
	}
	for _, r := range f.up.requests() {
		if r.Path == "/upload2" && strings.Contains(string(r.Body), f.phA[:10]) {
			t.Fatal("the blocked placeholder reached the upstream")
		}
	}
}

func TestAttackSmugglingTEAndCL(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
	defer tc.Close()
	smuggled := "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: " + f.api + "\r\nAuthorization: Bearer " + f.phA + "\r\n\r\n"
	res, _ := roundTrip(t, tc, br, "POST /a HTTP/1.1\r\nHost: "+f.api+"\r\nContent-Length: "+itoa(len(smuggled))+"\r\nTransfer-Encoding: chunked\r\n\r\n"+smuggled)
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("TE+CL: %d", res.StatusCode)
	}
	if _, err := http.ReadResponse(br, nil); err == nil {
		t.Fatal("the connection stayed open after a smuggling attempt")
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
}

func TestAttackSmugglingDoubleContentLength(t *testing.T) {
	f := newFixture(t, "open")
	for _, lengths := range [][2]string{{"5", "40"}, {"5", "5"}} {
		tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
		res, _ := roundTrip(t, tc, br, "POST /a HTTP/1.1\r\nHost: "+f.api+"\r\nContent-Length: "+lengths[0]+"\r\nContent-Length: "+lengths[1]+"\r\n\r\nhello")
		tc.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("Content-Length %v: %d", lengths, res.StatusCode)
		}
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
}

func TestAttackHTTP2AuthorityMismatch(t *testing.T) {
	f := newFixture(t, "open")
	tc, _ := f.dialIntercepted(f.proxyURL, f.api, "api.example.test", "h2")
	defer tc.Close()
	if tc.ConnectionState().NegotiatedProtocol != "h2" {
		t.Fatal("h2 not negotiated")
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc)
	must(t, err)
	do := func(host, auth string) int {
		req, _ := http.NewRequest(http.MethodGet, "https://"+f.api+"/h2", nil)
		req.Host = host
		req.Header.Set("Authorization", auth)
		res, err := cc.RoundTrip(req)
		must(t, err)
		res.Body.Close()
		return res.StatusCode
	}
	if s := do(f.api, "Bearer "+f.phA); s != 200 {
		t.Fatalf("matching :authority: %d", s)
	}
	if s := do(f.other, "Bearer "+f.phB); s != http.StatusMisdirectedRequest {
		t.Fatalf("mismatched :authority: %d", s)
	}
	got := f.up.requests()
	if len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+realA {
		t.Fatalf("upstream got %d", len(got))
	}
}

func TestAttackAnotherTasksPlaceholder(t *testing.T) {
	f := newFixture(t, "open")
	_, other := f.task("run-b", runspec.Secret{ProjectID: "acme", Key: "A"})
	res, body := f.get(t, "https://"+f.api+"/", http.Header{"Authorization": {"Bearer " + other["A"]}})
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "another task") {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
	f.assertNoLeak(other["A"])
}

func TestAttackRequestAfterStopAndWithAnOldPassword(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
	defer tc.Close()
	if res, _ := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: "+f.api+"\r\nAuthorization: Bearer "+f.phA+"\r\n\r\n"); res.StatusCode != 200 {
		t.Fatalf("before stop: %d", res.StatusCode)
	}
	f.proxy.Stop("run-a")
	// The kept-alive connection is closed at once.
	fmt.Fprintf(tc, "GET /after HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", f.api, f.phA)
	if _, err := http.ReadResponse(br, nil); err == nil {
		t.Fatal("a request was served after stop")
	}
	c, _, status := f.connect(f.proxyURL, f.api)
	c.Close()
	if status != http.StatusProxyAuthRequired {
		t.Fatalf("CONNECT after stop: %d", status)
	}
	// A new attempt serves again, with its own password only.
	fresh, err := f.proxy.StartAttempt("run-a")
	must(t, err)
	c, _, status = f.connect(f.proxyURL, f.api)
	c.Close()
	if status != http.StatusProxyAuthRequired {
		t.Fatalf("old attempt's password: %d", status)
	}
	c, _, status = f.connect(fresh, f.api)
	c.Close()
	if status != http.StatusOK {
		t.Fatalf("new attempt: %d", status)
	}
	if got := f.up.requests(); len(got) != 1 {
		t.Fatalf("upstream got %d requests", len(got))
	}
	f.waitAudit(func(m map[string]any) bool { return m["action"] == "denied" && m["status"] == float64(407) })
}

func TestKillSwitch(t *testing.T) {
	for value, on := range map[string]bool{"off": true, "": false, "on": false} {
		if got, err := KillSwitch(func(k string) string {
			if k == KillSwitchEnv {
				return value
			}
			return ""
		}); got != on || err != nil {
			t.Errorf("%s=%q: %v %v", KillSwitchEnv, value, got, err)
		}
	}
	// Anything else refuses the start, naming the variable: never a proxy
	// left up by a typo.
	for _, value := range []string{"0", "false", "OFF", " off", "Off", "no", "disabled", "1"} {
		got, err := KillSwitch(func(string) string { return value })
		if err == nil || got || !strings.Contains(err.Error(), KillSwitchEnv) {
			t.Errorf("%s=%q: %v %v", KillSwitchEnv, value, got, err)
		}
	}
	p, err := New(Config{Disabled: true})
	must(t, err)
	if err := p.Ready(); err != ErrDisabled {
		t.Fatalf("Ready = %v", err)
	}
	if err := p.Serve(); err != ErrDisabled {
		t.Fatalf("Serve = %v", err)
	}
	if err := p.Register("run-x", nil); err != ErrDisabled {
		t.Fatalf("Register = %v", err)
	}
	if _, err := p.StartAttempt("run-x"); err != ErrDisabled {
		t.Fatalf("StartAttempt = %v", err)
	}
	if p.Addr() != nil {
		t.Fatal("a disabled proxy listens")
	}
}

func TestWithheldValueIsRefusedNeverSentAsThePlaceholder(t *testing.T) {
	f := newFixture(t, "open")
	delete(f.secrets, "acme/A")
	f.writeSecrets()
	res, body := f.get(t, "https://"+f.api+"/", http.Header{"Authorization": {"Bearer " + f.phA}})
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "withheld") {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
	f.waitAudit(func(m map[string]any) bool { return m["action"] == "withheld" })
}

func TestPolicyChangeAppliesToTheNextRequest(t *testing.T) {
	f := newFixture(t, "open")
	// A kept-alive intercepted connection to api, where A is substituted.
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
	defer tc.Close()
	if res, _ := roundTrip(t, tc, br, "GET /before HTTP/1.1\r\nHost: "+f.api+"\r\nAuthorization: Bearer "+f.phA+"\r\n\r\n"); res.StatusCode != 200 {
		t.Fatalf("before: %d", res.StatusCode)
	}
	// Key A now reaches only other.example.test, where the task never
	// declared it: it is granted nowhere any more (a task gets a key only
	// for every domain it declared). B is as it was.
	f.writePolicy(`{"api.example.test": "127.0.0.1", "other.example.test": "127.0.0.1"}`, fmt.Sprintf(`{"acme": {"keys": {
		"A": {"domains": ["other.example.test:%d"]}, "B": {"domains": ["other.example.test:%d"], "in": ["header", "url", "body"], "placeholder": {"prefix": "pb_", "length": 40}}}}}`, f.up.port, f.up.port))
	must(t, f.watcher.Reload())
	// The next request on the very same connection is decided by the new
	// policy: A is not granted any more, so its placeholder blocks.
	res, body := roundTrip(t, tc, br, "GET /after HTTP/1.1\r\nHost: "+f.api+"\r\nAuthorization: Bearer "+f.phA+"\r\n\r\n")
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "key acme/A is not granted to this task") {
		t.Fatalf("A on api on the kept-alive connection after the change: %d %q", res.StatusCode, body)
	}
	// A new connection to api is no longer one a key of the task reaches.
	// The task still holds B, which may go in a url or body, so under open
	// egress api is intercepted to scrub its answers rather than tunnelled
	// (issue 27 item 4), and A's placeholder blocks there too: the
	// upstream gets neither it nor the value.
	res, err := f.goClient(f.proxyURL, false).Do(mustRequest(t, "https://"+f.api+"/after-new", "Bearer "+f.phA))
	must(t, err)
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("A on api through a new connection: %d, want it blocked", res.StatusCode)
	}
	f.waitAudit(func(m map[string]any) bool { return m["action"] == "blocked" && m["path"] == "/after-new" })
	// A is not substituted where the policy moved it: the task did not
	// declare that domain.
	res, err = f.goClient(f.proxyURL, false).Do(mustRequest(t, "https://"+f.other+"/", "Bearer "+f.phA))
	must(t, err)
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("A on other after the change: %d, want it blocked", res.StatusCode)
	}
	// B, which the change left alone, still is.
	res, err = f.goClient(f.proxyURL, false).Do(mustRequest(t, "https://"+f.other+"/b", "Bearer "+f.phB))
	must(t, err)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("B on other after the change: %d", res.StatusCode)
	}
	got := f.up.requests()
	if len(got) != 2 {
		t.Fatalf("upstream got %d requests, want 2", len(got))
	}
	if got[0].Path != "/before" || got[0].Header.Get("Authorization") != "Bearer "+realA {
		t.Error("A not substituted on api before the change")
	}
	if got[1].Path != "/b" || got[1].Header.Get("Authorization") != "Bearer "+realB {
		t.Error("B not substituted on other after the change")
	}
}

// Trailers after a chunked body are consumed, not forwarded, and the next
// request on the connection is read from the right place.
func TestChunkedTrailersAreDroppedAndFramingKept(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.other, "other.example.test")
	defer tc.Close()
	res, _ := roundTrip(t, tc, br, "POST /t HTTP/1.1\r\nHost: "+f.other+"\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Key: "+f.phB+"\r\n\r\n")
	if res.StatusCode != 200 {
		t.Fatalf("first: %d", res.StatusCode)
	}
	res, _ = roundTrip(t, tc, br, "GET /next HTTP/1.1\r\nHost: "+f.other+"\r\n\r\n")
	if res.StatusCode != 200 {
		t.Fatalf("second: %d", res.StatusCode)
	}
	got := f.up.requests()
	if len(got) != 2 || string(got[0].Body) != "abc" || got[1].Path != "/next" || got[0].Header.Get("X-Key") != "" {
		t.Fatalf("upstream got %+v", got)
	}
}

// A refused request ends its HTTP/1.1 connection: a request pipelined
// behind a 421, a 403 or a 405 on the same connection is never served.
func TestARefusalClosesTheConnection(t *testing.T) {
	f := newFixture(t, "open")
	next := "GET /next HTTP/1.1\r\nHost: " + f.api + "\r\nAuthorization: Bearer " + f.phA + "\r\n\r\n"
	for name, first := range map[string]string{
		"421": "GET /first HTTP/1.1\r\nHost: " + f.other + "\r\n\r\n",
		"403": "GET /first HTTP/1.1\r\nHost: " + f.api + "\r\nX-Key: " + f.phB + "\r\n\r\n",
		"405": "CONNECT /first HTTP/1.1\r\nHost: " + f.api + "\r\n\r\n",
	} {
		tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
		io.WriteString(tc, first+next)
		res, err := http.ReadResponse(br, nil)
		must(t, err)
		io.Copy(io.Discard, res.Body)
		if res.StatusCode < 400 || !res.Close {
			t.Errorf("%s: %d, Connection: close %v", name, res.StatusCode, res.Close)
		}
		if _, err := http.ReadResponse(br, nil); err == nil {
			t.Errorf("%s: the request behind it was served", name)
		}
		tc.Close()
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("forwarded")
	}
}

// A client that asked for 100 Continue and got a final answer instead may
// never send its body: the connection closes at once instead of waiting
// for it (and reading whatever comes next as the body).
func TestAnAnswerBeforeContinueClosesTheConnection(t *testing.T) {
	f := newFixture(t, "open")
	f.up.srv.Close() // the upstream is gone: a 502 before the body is asked for
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
	defer tc.Close()
	io.WriteString(tc, "POST /upload HTTP/1.1\r\nHost: "+f.api+"\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	must(t, err)
	io.Copy(io.Discard, res.Body)
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", res.StatusCode)
	}
	_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = br.ReadByte()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the proxy kept the connection, waiting for a body the client was never asked for")
	}
	if err == nil {
		t.Fatal("the proxy sent more after its answer")
	}
}
