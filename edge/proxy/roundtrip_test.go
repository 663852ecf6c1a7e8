package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/proxy/http1"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// A request's answer body, read to its end, returns the upstream connection
// to the pool; another request may take the connection before the first
// one's owner closes its body. That late Close must leave the second
// exchange alone (it once closed the connection under it: the body lived
// in the connection, shared by both).
func TestALateCloseOfAFinishedBodyLeavesTheNextExchangeAlone(t *testing.T) {
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, false, "api.example.test")
	addr := up.srv.Listener.Addr().String()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(uca.PEM)
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	rt := newRoundTripper(dial, &tls.Config{RootCAs: pool}, time.Minute)
	defer rt.CloseIdleConnections()
	exchange := func(path string, b *upBody) (*upConn, *upBody) {
		t.Helper()
		uc, _, err := rt.get(context.Background(), addr, "api.example.test", false)
		must(t, err)
		req, _ := http.NewRequest(http.MethodGet, "https://api.example.test"+path, nil)
		res, err := uc.roundTrip(newCancelWatch(context.Background()), &outbound{RequestHead: http1.RequestHead{Req: req, Host: "api.example.test"}})
		must(t, err)
		return uc, uc.openBody(res, req.Method, b)
	}
	var first, second upBody
	uc1, body1 := exchange("/one", &first)
	if b, err := io.ReadAll(body1); err != nil || !strings.Contains(string(b), "hello from upstream") {
		t.Fatalf("first answer: %q %v", b, err)
	}
	uc2, body2 := exchange("/two", &second)
	if uc2 != uc1 {
		t.Fatal("the second exchange did not reuse the pooled connection")
	}
	body1.Close()
	if b, err := io.ReadAll(body2); err != nil || !strings.Contains(string(b), "hello from upstream") {
		t.Fatalf("the second answer after the first body's late Close: %q %v", b, err)
	}
}
