package edgetest

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"testing"
)

// A leaf for a name and an IP serves TLS that a client trusting the CA
// alone verifies, by either.
func TestCALeavesVerifyByNameAndIP(t *testing.T) {
	ca := NewCA(t)
	srv := ca.TLSServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), "api.example.test", "127.0.0.1")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	for _, sni := range []string{"api.example.test", "127.0.0.1"} {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: sni}}}
		res, err := c.Get(srv.URL)
		if err != nil {
			t.Fatalf("%s: %v", sni, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != "ok" {
			t.Fatalf("%s: %q", sni, b)
		}
	}
}
