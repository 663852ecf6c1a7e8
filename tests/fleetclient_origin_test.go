package tests

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/runfleet/runfleet/shared/fleetclient"
)

// tokenCatcher is a server on another origin that records the
// Authorization headers it is sent: where a leaked token would land.
type tokenCatcher struct {
	*httptest.Server
	mu   sync.Mutex
	auth []string
}

func newTokenCatcher(t *testing.T) *tokenCatcher {
	c := &tokenCatcher{}
	c.Server = httptest.NewServer(c.handler())
	t.Cleanup(c.Close)
	return c
}

// newTLSTokenCatcher is a tokenCatcher over https.
func newTLSTokenCatcher(t *testing.T) *tokenCatcher {
	c := &tokenCatcher{}
	c.Server = httptest.NewTLSServer(c.handler())
	t.Cleanup(c.Close)
	return c
}

func (c *tokenCatcher) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.auth = append(c.auth, r.Header.Get("Authorization"))
		c.mu.Unlock()
		http.Error(w, "nothing here", http.StatusNotFound)
	})
}

// sawToken reports whether any request carried token.
func (c *tokenCatcher) sawToken(token string) (requests int, leaked bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.auth {
		if strings.Contains(a, token) {
			leaked = true
		}
	}
	return len(c.auth), leaked
}

// A run's links.stream on an origin that is neither the API's nor the
// stream's the caller configured (a misconfigured or compromised API's
// RUNFLEET_STREAM_URL) must not be sent the caller's token.
func TestClientSendsNoTokenToAStreamOnAnotherOrigin(t *testing.T) {
	evil := newTokenCatcher(t)
	s := newStack(t, "bolt", stackOptions{streamURL: evil.URL})
	_, alice, id, _ := s.aliceRun(t)
	c, _ := newTestClient(t, s, alice, nil)
	run, err := c.Run(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(run.Run.Links.Stream, evil.URL) {
		t.Fatalf("links.stream = %q, want it on %s", run.Run.Links.Stream, evil.URL)
	}
	_, err = c.Follow(context.Background(), run.Run.Links.Stream, fleetclient.FollowOptions{MaxFailures: 1},
		func(fleetclient.StreamEvent) error { return nil })
	if n, leaked := evil.sawToken(alice); leaked {
		t.Fatalf("the token reached the stream's foreign origin (%d requests)", n)
	}
	if err == nil || !strings.Contains(err.Error(), "StreamURL") {
		t.Fatalf("Follow = %v, want an error naming the stream origin to configure", err)
	}
	if strings.Contains(err.Error(), alice) {
		t.Fatal("the error holds the token")
	}

	// Configured as the stream's origin, it is trusted with the token.
	trusted, err := fleetclient.New(fleetclient.Options{BaseURL: s.srv.URL, StreamURL: evil.URL, Token: alice,
		HTTPClient: s.srv.Client(), Wait: (&waits{}).wait, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	trusted.Follow(context.Background(), run.Run.Links.Stream, fleetclient.FollowOptions{MaxFailures: 1},
		func(fleetclient.StreamEvent) error { return nil })
	if _, leaked := evil.sawToken(alice); !leaked {
		t.Fatal("the configured stream origin was not sent the token")
	}
}

// A redirect to another origin (here the same host name on another port,
// which net/http's own rule still counts as the same domain) must not
// carry the token, from an API call or from the stream.
func TestClientSendsNoTokenAcrossARedirect(t *testing.T) {
	evil := newTokenCatcher(t)
	s := newStack(t, "bolt", stackOptions{})
	_, alice, id, _ := s.aliceRun(t)
	target, _ := url.Parse(s.srv.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fleet/hosts" || strings.HasSuffix(r.URL.Path, "/stream") {
			http.Redirect(w, r, evil.URL+r.URL.Path, http.StatusTemporaryRedirect)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	if strings.Split(strings.TrimPrefix(front.URL, "http://"), ":")[0] != strings.Split(strings.TrimPrefix(evil.URL, "http://"), ":")[0] {
		t.Fatalf("want both servers on one host name: %s, %s", front.URL, evil.URL)
	}
	c, err := fleetclient.New(fleetclient.Options{BaseURL: front.URL, Token: alice, Wait: (&waits{}).wait, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Hosts(context.Background()); err == nil {
		t.Fatal("Hosts through a redirect to a page that is not the API's answered no error")
	}
	c.Follow(context.Background(), front.URL+"/fleet/runs/"+url.PathEscape(id)+"/stream", fleetclient.FollowOptions{MaxFailures: 1},
		func(fleetclient.StreamEvent) error { return nil })
	n, leaked := evil.sawToken(alice)
	if n < 2 {
		t.Fatalf("the redirects were not followed to the other origin (%d requests): the test proves nothing", n)
	}
	if leaked {
		t.Fatalf("a redirect carried the token to another origin (%d requests)", n)
	}
}

// From an https API, a stream on another https origin (the stream
// function's URL in AWS) is followed with the token unconfigured; a stream
// in plain http is not, whatever its host.
func TestClientFollowsAnHTTPSStreamFromAnHTTPSAPI(t *testing.T) {
	api, stream, plain := newTLSTokenCatcher(t), newTLSTokenCatcher(t), newTokenCatcher(t)
	const token = "rft_the-callers-token"
	// httptest's TLS servers share one certificate: api's client trusts
	// the stream's too.
	c, err := fleetclient.New(fleetclient.Options{BaseURL: api.URL, Token: token, HTTPClient: api.Client(), Wait: (&waits{}).wait, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	follow := func(base string) error {
		_, err := c.Follow(context.Background(), base+"/fleet/runs/fr-x/stream", fleetclient.FollowOptions{MaxFailures: 1},
			func(fleetclient.StreamEvent) error { return nil })
		return err
	}
	if err := follow(stream.URL); err == nil {
		t.Fatal("a stream answering 404 was followed without an error")
	}
	if n, leaked := stream.sawToken(token); n == 0 || !leaked {
		t.Fatalf("the https stream got %d requests, token %v; want it followed with the token", n, leaked)
	}
	var refused *fleetclient.StreamOriginError
	if err := follow(plain.URL); !errors.As(err, &refused) {
		t.Fatalf("a plain-http stream from an https API: %v; want a StreamOriginError", err)
	}
	if n, _ := plain.sawToken(token); n != 0 {
		t.Fatalf("the plain-http stream got %d requests", n)
	}
}
