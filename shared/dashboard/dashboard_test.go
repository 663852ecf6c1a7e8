package dashboard

import (
	"net/http"
	"strings"
	"testing"
)

// TestAssetsAreNamedByContent: every embedded asset is served under its
// content's name, which the page names, and under no other.
func TestAssetsAreNamedByContent(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	page := s.Page("")
	if len(s.assets) < 2 {
		t.Fatalf("assets %v, want the script and the style sheet", s.assets)
	}
	for name, f := range s.assets {
		if !strings.Contains(string(page.Body), `"/ui/`+name+`"`) || !strings.Contains(name, strings.Trim(f.etag, `"`)) {
			t.Errorf("asset %s (etag %s) is not named by the page by its content", name, f.etag)
		}
	}
	for _, plain := range []string{"app.js", "app.css", "index.html", ""} {
		if _, ok := s.Asset(plain, ""); ok {
			t.Errorf("%q is served: only names by content are", plain)
		}
	}
}

// TestIfNoneMatch follows RFC 9110's weak comparison.
func TestIfNoneMatch(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	tag := s.Page("").Headers["etag"]
	for header, want := range map[string]int{
		"":                     http.StatusOK,
		tag:                    http.StatusNotModified,
		"W/" + tag:             http.StatusNotModified,
		`"other", ` + tag:      http.StatusNotModified,
		"*":                    http.StatusNotModified,
		`"other"`:              http.StatusOK,
		strings.Trim(tag, `"`): http.StatusOK, // unquoted: not a tag
	} {
		a := s.Page(header)
		if a.Status != want || (want == http.StatusNotModified) != (len(a.Body) == 0 && a.ContentType == "") {
			t.Errorf("If-None-Match %q: %d (%d bytes, type %q), want %d", header, a.Status, len(a.Body), a.ContentType, want)
		}
	}
}

// TestStreamOrigin: the policy names the stream's origin, not its path,
// and a StreamURL that is not a URL is refused.
func TestStreamOrigin(t *testing.T) {
	s, err := New(Config{StreamURL: "https://s.lambda-url.eu-west-1.on.aws/x/"})
	if err != nil {
		t.Fatal(err)
	}
	if csp := s.Page("").Headers["content-security-policy"]; !strings.Contains(csp, "connect-src 'self' https://s.lambda-url.eu-west-1.on.aws;") {
		t.Errorf("policy %q", csp)
	}
	for _, bad := range []string{"s.lambda-url.eu-west-1.on.aws", "ftp://x", "https://"} {
		if _, err := New(Config{StreamURL: bad}); err == nil {
			t.Errorf("StreamURL %q accepted", bad)
		}
	}
}
