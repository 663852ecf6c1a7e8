package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/edge/policy"
)

// Under proxy.egress "open", a run holding a key that may go in a url or
// body (run-a's B: a value an upstream may store, a gist or a note) has
// its connections to names no key of it reaches intercepted, their answers
// scrubbed, and refused when the proxy cannot read them; a run whose keys
// go in headers alone (run-h) keeps its tunnels. Issue 27 item 4. The
// fixture's one upstream answers as api, other and third.example.test.

// storeAndFetch makes the fixture's upstream a store: POST /store keeps
// the body it received, GET /fetch answers it, gzipped when the request
// accepts gzip (as servers do, whatever edge would prefer).
func storeAndFetch(f *fixture) {
	var mu sync.Mutex
	var stored []byte
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/store":
			got := f.up.requests() // the recorder read the body already
			mu.Lock()
			stored = got[len(got)-1].Body
			mu.Unlock()
			io.WriteString(w, "stored\n")
		case "/fetch":
			mu.Lock()
			defer mu.Unlock()
			if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
				w.Write(stored)
				return
			}
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			zw.Write(stored)
			zw.Close()
		default:
			http.NotFound(w, r)
		}
	}
}

// storeB has the task put B's placeholder in a body to other.example.test,
// where B may go: the upstream stores B's real value.
func storeB(t *testing.T, f *fixture, client *http.Client) {
	t.Helper()
	res, err := client.Post("https://"+f.other+"/store", "text/plain", strings.NewReader(f.phB))
	must(t, err)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	got := f.up.requests()
	if res.StatusCode != 200 || len(got) == 0 || string(got[len(got)-1].Body) != realB {
		t.Fatalf("storing through other: %d; the upstream did not store the real value", res.StatusCode)
	}
}

// identity is a GET asking for the answer uncompressed (Go's client asks
// for gzip otherwise, and the store answers gzipped when asked).
func identity(t *testing.T, rawURL string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	must(t, err)
	req.Header.Set("Accept-Encoding", "identity")
	return req
}

// verifiesAgainst reports whether cert is a valid leaf for name under the
// roots in rootsPEM.
func verifiesAgainst(t *testing.T, cert *x509.Certificate, rootsPEM []byte, name string) bool {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(rootsPEM) {
		t.Fatal("no root in the PEM")
	}
	_, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name})
	return err == nil
}

// fetchedScrubbed checks what the task read back from a name no key
// reaches: B's placeholder, never B's value. It fails with Errorf, so the
// test's other checks still run and report.
func fetchedScrubbed(t *testing.T, f *fixture, body string) {
	t.Helper()
	if strings.Contains(body, realB) || body != f.phB {
		t.Errorf("fetched through third.example.test: %d bytes that are not B's placeholder (hold B's real value: %v); "+
			"a value stored through a granted name must come back scrubbed through any other name",
			len(body), strings.Contains(body, realB))
	}
}

// (a) A run with a body key, explicit proxy: a name no key reaches is
// intercepted (the client sees edge's leaf, not the upstream's), the
// request reaches the upstream, and what the upstream stored of B's value
// comes back as B's placeholder. The leaf is issued for that handshake
// alone: afterwards the CA refuses the name again.
func TestEgressOpenBodyKeyRunIsInterceptedAndScrubbedElsewhere(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newFixture(t, policy.EgressOpen)
			storeAndFetch(f)
			client := f.goClient(f.proxyURL, h2)
			storeB(t, f, client)
			third := "third.example.test:" + itoa(f.up.port)
			res, err := client.Do(identity(t, "https://"+third+"/fetch"))
			must(t, err)
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("fetch: %d", res.StatusCode)
			}
			leaf := res.TLS.PeerCertificates[0]
			if !verifiesAgainst(t, leaf, f.authority.Bundle(), "third.example.test") || verifiesAgainst(t, leaf, f.uca.PEM, "third.example.test") {
				t.Error("the client did not see edge's leaf for third.example.test")
			}
			got := f.up.requests()
			if last := got[len(got)-1]; last.Path != "/fetch" || last.Host != third {
				t.Errorf("the upstream did not get the fetch: %s %s", last.Host, last.Path)
			}
			line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/fetch" })
			if line["action"] != "forwarded" || line["host"] != third || line["task"] != "run-a" || line["status"] != float64(200) {
				t.Errorf("audit %v", line)
			}
			if _, err := f.authority.GetCertificate(&tls.ClientHelloInfo{ServerName: "third.example.test"}); err == nil {
				t.Error("the CA still issues third.example.test's leaf once the handshake that needed it is over")
			}
			fetchedScrubbed(t, f, string(body))

			// Asked gzipped, which no scrubber can read: refused, or the
			// placeholder once decompressed, never the value.
			req, _ := http.NewRequest(http.MethodGet, "https://"+third+"/fetch", nil)
			req.Header.Set("Accept-Encoding", "gzip")
			res, err = client.Do(req)
			must(t, err)
			body, _ = io.ReadAll(res.Body)
			res.Body.Close()
			if res.Header.Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				must(t, err)
				body, _ = io.ReadAll(zr)
			}
			if res.StatusCode != http.StatusBadGateway {
				fetchedScrubbed(t, f, string(body))
			}
		})
	}
}

// (b) A run whose keys go in headers alone keeps its tunnels: the client
// speaks TLS with the upstream itself and sees its certificate; nothing is
// intercepted, so the CA never issues a leaf for the name.
func TestEgressOpenHeaderOnlyRunStillTunnels(t *testing.T) {
	f := newFixture(t, policy.EgressOpen)
	proxyURL, phA := f.headerOnlyTask()
	third := "third.example.test:" + itoa(f.up.port)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.uca.PEM)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}}}
	res, err := client.Do(mustRequest(t, "https://"+third+"/t", "Bearer "+phA))
	must(t, err)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	client.CloseIdleConnections() // the tunnel's line is written when it closes
	if res.StatusCode != 200 || !verifiesAgainst(t, res.TLS.PeerCertificates[0], f.uca.PEM, "third.example.test") {
		t.Fatalf("%d; the client did not see the upstream's own certificate", res.StatusCode)
	}
	got := f.up.requests()
	if len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+phA {
		t.Fatal("the upstream did not get the request untouched")
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["action"] == "tunnelled" && m["host"] == third })
	if line["task"] != "run-h" || line["status"] != float64(200) {
		t.Errorf("audit %v", line)
	}
	// An IP address is tunnelled too.
	c, _, status := f.connect(proxyURL, "127.0.0.1:"+itoa(f.up.port))
	c.Close()
	if status != http.StatusOK {
		t.Errorf("CONNECT to an IP address for a header-only run: %d", status)
	}
}

// (c) For a run with a body key, what is not TLS does not leave by a name
// no key reaches: plain HTTP after the CONNECT is answered 403 with the
// reason, other bytes (an SSH banner) close the connection, and a client
// that says nothing (a protocol whose server speaks first) is closed at
// the handshake timeout; each is audited as denied, nothing is resolved
// or sent upstream.
func TestEgressOpenNonTLSIsRefusedForABodyKeyRun(t *testing.T) {
	f := newFixture(t, policy.EgressOpen)
	third := "third.example.test:" + itoa(f.up.port)
	before := len(f.resolver.lookups())

	c, br, status := f.connect(f.proxyURL, third)
	defer c.Close()
	if status != http.StatusOK {
		t.Fatalf("CONNECT: %d", status)
	}
	res, body := roundTrip(t, c, br, "GET /plain HTTP/1.1\r\nHost: "+third+"\r\n\r\n")
	reason := "plain HTTP to " + third + "; " + policy.StorableEgressRule
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, reason) {
		t.Fatalf("plain HTTP: %d %q", res.StatusCode, body)
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/plain" })
	if line["action"] != "denied" || line["status"] != float64(http.StatusForbidden) || line["reason"] != reason ||
		line["host"] != third || line["method"] != "GET" || line["task"] != "run-a" {
		t.Errorf("audit %v", line)
	}

	c2, br2, status := f.connect(f.proxyURL, third)
	defer c2.Close()
	if status != http.StatusOK {
		t.Fatalf("CONNECT: %d", status)
	}
	io.WriteString(c2, "SSH-2.0-OpenSSH_9.6\r\n")
	closedUnanswered(t, &replayConn{Conn: c2, r: br2})
	line = f.waitAudit(func(m map[string]any) bool {
		return m["host"] == third && m["reason"] == "neither TLS nor HTTP to "+third+"; "+policy.StorableEgressRule
	})
	if line["action"] != "denied" || line["status"] != float64(http.StatusForbidden) || line["method"] != "CONNECT" {
		t.Errorf("audit %v", line)
	}
	if len(f.up.requests()) != 0 || len(f.resolver.lookups()) != before {
		t.Fatal("what was refused was resolved or reached the upstream")
	}

	// A client that sends nothing: closed at the handshake timeout (short
	// here, in an env of its own).
	g := newFixtureWith(t, envOptions{egress: policy.EgressOpen, handshakeTimeout: time.Second})
	third = "third.example.test:" + itoa(g.up.port)
	c3, br3, status := g.connect(g.proxyURL, third)
	defer c3.Close()
	if status != http.StatusOK {
		t.Fatalf("CONNECT: %d", status)
	}
	closedUnanswered(t, &replayConn{Conn: c3, r: br3})
	line = g.waitAudit(func(m map[string]any) bool { return m["host"] == third && m["action"] == "denied" })
	if want := "nothing was sent to " + third + " within the handshake timeout, so it is not TLS; " + policy.StorableEgressRule; line["reason"] != want {
		t.Errorf("audit %v", line)
	}
}

// (d) For a run with a body key, a client that does not accept edge's leaf
// for a name no key reaches (it pins the upstream's certificate: its roots
// are the upstream's CA alone) fails, the refusal is audited with the
// reason, and nothing reaches the upstream. An IP address, which has no
// name to intercept, is refused at the CONNECT.
func TestEgressOpenClientRefusingEdgesLeafIsRefusedAndAudited(t *testing.T) {
	f := newFixture(t, policy.EgressOpen)
	third := "third.example.test:" + itoa(f.up.port)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.uca.PEM)
	pinning := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(f.proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if res, err := pinning.Get("https://" + third + "/pinned"); err == nil {
		res.Body.Close()
		t.Fatalf("a client trusting only the upstream's CA got %d through a name no key reaches", res.StatusCode)
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["host"] == third && m["action"] == "denied" })
	reason := fmt.Sprint(line["reason"])
	if !strings.HasPrefix(reason, "the TLS handshake with the task for "+third+" failed (") ||
		!strings.Contains(reason, "its client may pin its certificate or not trust edge's CA; "+policy.StorableEgressRule) ||
		line["status"] != float64(http.StatusForbidden) || line["task"] != "run-a" || line["method"] != "CONNECT" {
		t.Errorf("audit %v", line)
	}

	ip := "127.0.0.1:" + itoa(f.up.port)
	c, _, status := f.connect(f.proxyURL, ip)
	c.Close()
	if status != http.StatusForbidden {
		t.Fatalf("CONNECT to an IP address for a run with a body key: %d", status)
	}
	line = f.waitAudit(func(m map[string]any) bool { return m["host"] == ip })
	if want := "no key of this task reaches " + ip + " and an IP address cannot be intercepted; " + policy.StorableEgressRule; line["action"] != "denied" || line["reason"] != want {
		t.Errorf("audit %v", line)
	}
	if len(f.up.requests()) != 0 {
		t.Fatal("a refused connection reached the upstream")
	}
}

// (e) The transparent front decides the same: for a run with a body key,
// a name no key reaches (through its pin) is intercepted and what was
// stored comes back scrubbed; plain HTTP is answered 403, other bytes and a
// client refusing edge's leaf are closed, an IP address is refused, each
// audited via transparent. (A header-only run's tunnel through its pin:
// TestTransparentTunnelsANonGrantedNameWithEgressOpen.)
func TestEgressOpenTransparentFrontDecidesTheSame(t *testing.T) {
	f := newFixture(t, policy.EgressOpen)
	storeAndFetch(f)
	tn := f.network("run-a")
	tn.pin("other.example.test")
	third := "third.example.test:" + itoa(f.up.port)
	dst := authorityOf(tn.pin("third.example.test"), f.up.port)

	t.Run("intercepted and scrubbed", func(t *testing.T) {
		client := tn.client(f.authority.Bundle(), false)
		storeB(t, f, client)
		res, err := client.Do(identity(t, "https://"+third+"/fetch"))
		must(t, err)
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !verifiesAgainst(t, res.TLS.PeerCertificates[0], f.authority.Bundle(), "third.example.test") {
			t.Fatalf("fetch: %d, or not edge's leaf", res.StatusCode)
		}
		line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/fetch" })
		if line["action"] != "forwarded" || !viaTransparent(line) || line["host"] != third {
			t.Errorf("audit %v", line)
		}
		fetchedScrubbed(t, f, string(body))
	})

	t.Run("plain HTTP", func(t *testing.T) {
		c := tn.mustDial(dst)
		res, body := roundTrip(t, c, bufio.NewReader(c), "GET /plain-t HTTP/1.1\r\nHost: "+third+"\r\n\r\n")
		reason := "plain HTTP to " + third + "; " + policy.StorableEgressRule
		if res.StatusCode != http.StatusForbidden || !strings.Contains(body, reason) {
			t.Fatalf("%d %q", res.StatusCode, body)
		}
		line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/plain-t" })
		if line["action"] != "denied" || !viaTransparent(line) || line["reason"] != reason || line["host"] != third {
			t.Errorf("audit %v", line)
		}
	})

	t.Run("not HTTP", func(t *testing.T) {
		c := tn.mustDial(dst)
		io.WriteString(c, "SSH-2.0-OpenSSH_9.6\r\n")
		closedUnanswered(t, c)
		line := f.waitAudit(func(m map[string]any) bool {
			return viaTransparent(m) && m["reason"] == "neither TLS nor HTTP to "+third+"; "+policy.StorableEgressRule
		})
		if line["action"] != "denied" || line["host"] != third {
			t.Errorf("audit %v", line)
		}
	})

	t.Run("pinning client", func(t *testing.T) {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(f.uca.PEM)
		tc := tls.Client(tn.mustDial(dst), &tls.Config{RootCAs: pool, ServerName: "third.example.test"})
		if err := tc.Handshake(); err == nil {
			t.Fatal("a client trusting only the upstream's CA completed the handshake")
		}
		tc.Close()
		line := f.waitAudit(func(m map[string]any) bool {
			return viaTransparent(m) && strings.HasPrefix(fmt.Sprint(m["reason"]), "the TLS handshake with the task for "+third)
		})
		if line["action"] != "denied" || line["host"] != third || !strings.HasSuffix(fmt.Sprint(line["reason"]), policy.StorableEgressRule) {
			t.Errorf("audit %v", line)
		}
	})

	t.Run("IP address", func(t *testing.T) {
		ip := netip.MustParseAddrPort("203.0.113.7:443")
		closedUnanswered(t, tn.mustDial(ip))
		line := f.waitAudit(func(m map[string]any) bool { return viaTransparent(m) && m["host"] == ip.String() })
		if want := "no key of this task reaches " + ip.String() + " and an IP address cannot be intercepted; " + policy.StorableEgressRule; line["action"] != "denied" || line["reason"] != want {
			t.Errorf("audit %v", line)
		}
	})

	// Nothing refused reached the upstream: it saw the store and the fetch.
	for _, r := range f.up.requests() {
		if r.Path != "/store" && r.Path != "/fetch" {
			t.Errorf("the upstream got %s", r.Path)
		}
	}
}

// A tunnel still open when its attempt ends is closed by EndAttempt, and
// Settle returns only once its handler recorded it: the run's egress
// ledger, sealed after Settle as the attempt ends, holds the tunnel
// rather than gaining it after the seal.
func TestSettleWaitsForAnEndedAttemptsTunnelToBeRecorded(t *testing.T) {
	f := newFixture(t, policy.EgressOpen)
	proxyURL, _ := f.headerOnlyTask()
	third := "third.example.test:" + itoa(f.up.port)
	c, _, status := f.connect(proxyURL, third)
	defer c.Close()
	if status != http.StatusOK {
		t.Fatalf("CONNECT: %d", status)
	}
	f.proxy.EndAttempt("run-h")
	f.proxy.Settle("run-h")
	for _, line := range f.auditLines() {
		if line["action"] == "tunnelled" && line["host"] == third && line["task"] == "run-h" {
			return
		}
	}
	t.Fatal("Settle returned before the ended attempt's tunnel was recorded")
}
