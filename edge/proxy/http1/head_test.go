package http1

import (
	"net/http"
	"net/url"
	"reflect"
	"testing"
)

// parseOriginForm reads a target exactly as url.ParseRequestURI does when
// it takes it, and leaves to it what it does not.
func TestParseOriginFormMatchesNetURL(t *testing.T) {
	for _, target := range []string{
		"/", "/x", "/v1/bench", "/a/b/c?q=1&r=2", "/a?", "/a??", "/a?b?", "/?", "//x", "///x", "/a:b@c;d=e,f+g$h&i~j._-",
		"/a%20b", "/a b", "/é", "/a#f", "/a?x#f", "/a?%zz", "/a!b", "/a'b", "/a(b)", "/a*b", "/a[b]", "/a\\b", "/a|b",
		"/a?\x7f", "/a?\x01", "/a\x01", "/a?é", "*", "", "a/b", "http://a.test/p", "https://a.test:8443/p?q",
	} {
		testOriginForm(t, target)
	}
}

func FuzzOriginForm(f *testing.F) {
	for _, s := range []string{"/", "/a?b", "/a%2Fb", "/a:b", "//a", "/a?", "/a??"} {
		f.Add(s)
	}
	f.Fuzz(testOriginForm)
}

func testOriginForm(t *testing.T, target string) {
	want, err := url.ParseRequestURI(target)
	var got url.URL
	if !parseOriginForm(target, &got) {
		if got != (url.URL{}) {
			t.Errorf("%q: not taken, but the URL was written", target)
		}
		return
	}
	if err != nil {
		t.Fatalf("%q: taken, but url.ParseRequestURI refuses it: %v", target, err)
	}
	if !reflect.DeepEqual(&got, want) {
		t.Fatalf("%q: %#v, url.ParseRequestURI's %#v", target, got, *want)
	}
}

// BenchmarkParseRequest: a client's kept-alive GET, its URL and field
// values in space the connection lends.
func BenchmarkParseRequest(b *testing.B) {
	const head = "GET /v1/bench?q=1 HTTP/1.1\r\nHost: api.example.test:8443\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Authorization: Bearer EBDKiK99hEBVsOxoXZ2mHFBVAy23usArHdPAf02IwKAexv2M\r\nAccept-Encoding: gzip\r\n\r\n"
	h := http.Header{}
	strs := make([]string, 8)
	var req http.Request
	var u url.URL
	b.ReportAllocs()
	for b.Loop() {
		clear(h)
		req = http.Request{}
		if ParseRequest(head, &req, &u, h, strs).Refused() {
			b.Fatal("refused")
		}
	}
}
