package tests

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// The dashboard's serving, through the api handler as the local stack
// serves it (shared/lambdahttp) and as Lambda answers API Gateway. What a
// browser sees of it (signing in, the pages, run output) is the browser
// tests'.

// dashboardBudget is the bound on a first load, every file included.
const dashboardBudget = 150 << 10

// wantDashboardHeaders are the headers every dashboard answer carries, as a
// browser reads them.
func wantDashboardHeaders(connectSrc string) map[string]string {
	return map[string]string{
		"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src " + connectSrc +
			"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'",
		"X-Content-Type-Options": "nosniff",
		"Referrer-Policy":        "no-referrer",
		"X-Frame-Options":        "DENY",
	}
}

// fetched is one answer from the stack, read whole.
type fetched struct {
	status int
	header http.Header
	body   string
}

func fetchUI(t *testing.T, method, url string, headers ...string) fetched {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	must(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	return fetched{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func checkDashboardHeaders(t *testing.T, what string, f fetched, connectSrc string) {
	t.Helper()
	for name, want := range wantDashboardHeaders(connectSrc) {
		if got := f.header.Get(name); got != want {
			t.Errorf("%s: %s %q\nwant %q", what, name, got, want)
		}
	}
	csp := f.header.Get("Content-Security-Policy")
	if strings.Contains(csp, "unsafe-") || strings.Contains(csp, "*") {
		t.Errorf("%s: the policy allows %q", what, csp)
	}
}

// assetRef is how the page names an asset: an absolute path under /ui/.
var assetRef = regexp.MustCompile(`(?:src|href)="(/ui/[^"]+)"`)

// TestDashboardIsServed: GET /ui answers the page and every asset it names,
// each with its type, caching and every security header, the whole first
// load under the budget and naming no other origin; anything else under
// /ui is the API's 404 or 405.
func TestDashboardIsServed(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{})
	base := s.srv.URL

	page := fetchUI(t, "GET", base+"/ui")
	if page.status != http.StatusOK || page.header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /ui: %d %q", page.status, page.header.Get("Content-Type"))
	}
	checkDashboardHeaders(t, "GET /ui", page, "'self'")
	if cc := page.header.Get("Cache-Control"); cc != "no-cache" || page.header.Get("ETag") == "" {
		t.Errorf("GET /ui: Cache-Control %q, ETag %q: want the page revalidated at each load", cc, page.header.Get("ETag"))
	}
	if slash := fetchUI(t, "GET", base+"/ui/"); slash.status != http.StatusOK || slash.body != page.body {
		t.Errorf("GET /ui/: %d, not the page", slash.status)
	}
	// Nothing inline: the policy would block it, so it would be a bug.
	for _, bad := range []string{"<script>", "style=", " on", "<style", "javascript:"} {
		if strings.Contains(strings.ToLower(page.body), bad) {
			t.Errorf("the page holds %q: inline code or style", bad)
		}
	}

	refs := assetRef.FindAllStringSubmatch(page.body, -1)
	types := map[string]string{}
	total := len(page.body)
	files := map[string]string{"/ui": page.body}
	for _, m := range refs {
		a := fetchUI(t, "GET", base+m[1])
		if a.status != http.StatusOK {
			t.Errorf("GET %s (named by the page): %d %s", m[1], a.status, a.body)
			continue
		}
		checkDashboardHeaders(t, "GET "+m[1], a, "'self'")
		if cc := a.header.Get("Cache-Control"); cc != "public, max-age=31536000, immutable" {
			t.Errorf("GET %s: Cache-Control %q: a name by content is immutable", m[1], cc)
		}
		types[m[1][strings.LastIndex(m[1], ".")+1:]] = a.header.Get("Content-Type")
		total += len(a.body)
		files[m[1]] = a.body

		// Revalidation: the tag answers 304 without a body, headers kept.
		nm := fetchUI(t, "GET", base+m[1], "If-None-Match", a.header.Get("ETag"))
		if nm.status != http.StatusNotModified || nm.body != "" {
			t.Errorf("GET %s with its ETag: %d %q, want 304 without a body", m[1], nm.status, nm.body)
		}
		checkDashboardHeaders(t, "GET "+m[1]+" (304)", nm, "'self'")
	}
	if types["js"] != "text/javascript; charset=utf-8" || types["css"] != "text/css; charset=utf-8" {
		t.Errorf("asset types %v: want the page's script and style sheet, typed", types)
	}
	t.Logf("first load: %d files, %d bytes (%.1f KiB; budget %d KiB)", len(files), total, float64(total)/1024, dashboardBudget>>10)
	if total >= dashboardBudget {
		t.Errorf("the first load is %d bytes, over the budget of %d", total, dashboardBudget)
	}

	// No request to any other origin: no file names one (a scheme-relative
	// //host included), and the script writes no HTML.
	otherOrigin := regexp.MustCompile(`(?i)(?:[a-z][a-z0-9+.-]*:)?//[a-z0-9\[]`)
	htmlSinks := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|srcdoc`)
	for name, body := range files {
		if m := otherOrigin.FindString(body); m != "" {
			t.Errorf("%s names another origin: %q", name, m)
		}
		if m := htmlSinks.FindString(body); m != "" && strings.HasSuffix(name, ".js") {
			t.Errorf("%s uses %s: output must reach the page as text only", name, m)
		}
	}

	// Anything else under /ui is the API's: 404 as JSON, 405 with Allow.
	for _, path := range []string{"/ui/app.js", "/ui/app.000000000000.js", "/ui/../healthz", "/ui/a/b"} {
		f := fetchUI(t, "GET", base+path)
		var e struct{ Error, Code string }
		if f.status != http.StatusNotFound || json.Unmarshal([]byte(f.body), &e) != nil || e.Code != "route_not_found" || e.Error == "" {
			t.Errorf("GET %s: %d %s, want 404 route_not_found", path, f.status, f.body)
		}
	}
	for _, method := range []string{"HEAD", "POST", "DELETE"} {
		f := fetchUI(t, method, base+"/ui")
		if f.status != http.StatusMethodNotAllowed || f.header.Get("Allow") != "GET" {
			t.Errorf("%s /ui: %d, Allow %q; want 405, Allow GET", method, f.status, f.header.Get("Allow"))
		}
	}
	if f := fetchUI(t, "GET", base+"/ui?token=x"); f.status != http.StatusBadRequest {
		t.Errorf("GET /ui?token=x: %d, want 400 (the page takes no query)", f.status)
	}
}

// TestDashboardConnectsToTheStreamsOrigin: with the stream on another
// origin (the stream function's URL in AWS), the policy lets the page
// connect there and nowhere else.
func TestDashboardConnectsToTheStreamsOrigin(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{streamURL: "https://abc123.lambda-url.eu-west-1.on.aws/"})
	page := fetchUI(t, "GET", s.srv.URL+"/ui")
	checkDashboardHeaders(t, "GET /ui", page, "'self' https://abc123.lambda-url.eu-west-1.on.aws")
}

// TestDashboardLambdaAnswers: as API Gateway (payload 2.0) gets them from
// the api function, the dashboard's answers are text bodies, not base64,
// with their headers.
func TestDashboardLambdaAnswers(t *testing.T) {
	s := newStack(t, "bolt", stackOptions{})
	get := func(path string) events.APIGatewayV2HTTPResponse {
		ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RouteKey: "GET " + path, RawPath: path,
			Headers: map[string]string{"host": "abc.execute-api.eu-west-1.amazonaws.com", "x-forwarded-proto": "https"},
			RequestContext: events.APIGatewayV2HTTPRequestContext{Stage: "$default", DomainName: "abc.execute-api.eu-west-1.amazonaws.com",
				HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "GET", Path: path}}}
		resp, err := s.app.API.Handle(t.Context(), ev)
		must(t, err)
		return resp
	}
	page := get("/ui")
	if page.StatusCode != 200 || page.IsBase64Encoded || !strings.HasPrefix(page.Body, "<!doctype html>") {
		t.Fatalf("GET /ui: %d, base64 %v, body %.40q", page.StatusCode, page.IsBase64Encoded, page.Body)
	}
	refs := assetRef.FindAllStringSubmatch(page.Body, -1)
	if len(refs) < 2 {
		t.Fatalf("the page names %v", refs)
	}
	for _, r := range append([]events.APIGatewayV2HTTPResponse{page}, get(refs[0][1]), get(refs[1][1])) {
		var names []string
		for k := range r.Headers {
			names = append(names, k)
		}
		for _, want := range []string{"content-type", "content-security-policy", "x-content-type-options", "referrer-policy", "x-frame-options", "cache-control", "etag"} {
			if !slices.Contains(names, want) {
				t.Errorf("an answer lacks %s: %v", want, r.Headers)
			}
		}
		if r.IsBase64Encoded || r.Body == "" || len(r.MultiValueHeaders) > 0 {
			t.Errorf("answer typed %s: base64 %v, %d bytes", r.Headers["content-type"], r.IsBase64Encoded, len(r.Body))
		}
	}
}
