package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"
)

// The relay carries a client's HTTPS request, bytes unchanged, to a real TLS
// upstream it verifies, over several keep-alive requests and fresh
// connections, and the client sees a leaf of the relay's CA for the CONNECT
// host.
func TestRelayCarriesRequestsToTheUpstream(t *testing.T) {
	var gotAuth []string
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = append(gotAuth, r.Header.Get("Authorization")) // one client at a time
		io.WriteString(w, "hello "+r.URL.Path)
	}))
	up.EnableHTTP2 = false
	up.StartTLS()
	defer up.Close()
	upRoots := x509.NewCertPool()
	upRoots.AddCert(up.Certificate())

	// httptest's certificate names example.com; the relay pins it to the upstream's loopback IP.
	r, err := newRelay(upRoots, map[string]string{"example.com": "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go r.serve(ln)

	relayRoots := x509.NewCertPool()
	relayRoots.AddCert(r.ca)
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	target := "https://example.com:" + port + "/x"
	for _, keepAlive := range []bool{true, false} {
		tr := &http.Transport{
			Proxy:             http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword("u", "p"), Host: ln.Addr().String()}),
			TLSClientConfig:   &tls.Config{RootCAs: relayRoots},
			DisableKeepAlives: !keepAlive,
		}
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		for range 3 {
			req, _ := http.NewRequest(http.MethodGet, target, nil)
			req.Header.Set("Authorization", "Bearer real-secret")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("keepAlive=%v: %v", keepAlive, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(body) != "hello /x" {
				t.Fatalf("keepAlive=%v: got %d %q, want 200 %q", keepAlive, resp.StatusCode, body, "hello /x")
			}
			if cs := resp.TLS; cs == nil || cs.PeerCertificates[0].Issuer.CommonName != "tlsrelay CA" {
				t.Fatalf("keepAlive=%v: client's peer certificate is not the relay's leaf", keepAlive)
			}
		}
		tr.CloseIdleConnections()
	}
	for i, a := range gotAuth {
		if a != "Bearer real-secret" {
			t.Errorf("request %d: upstream saw Authorization %q, want it unchanged", i, a)
		}
	}
	if len(gotAuth) != 6 {
		t.Errorf("upstream saw %d requests, want 6", len(gotAuth))
	}
}

// A CONNECT to a name that is neither pinned nor a loopback IP is never dialed.
func TestRelayRefusesNonLoopbackUpstream(t *testing.T) {
	r, err := newRelay(x509.NewCertPool(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := r.dialUpstream("192.0.2.1", "443"); err == nil {
		c.Close()
		t.Fatal("dialed 192.0.2.1, want a refusal")
	}
	if _, err := parseResolve("api.example.test=192.0.2.1"); err == nil {
		t.Fatal("parseResolve accepted a non-loopback pin")
	}
}
