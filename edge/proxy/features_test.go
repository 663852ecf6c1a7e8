package proxy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/shared/runspec"
)

func TestBasicCredentialsAreDecodedSubstitutedAndReencoded(t *testing.T) {
	f := newFixture(t, "open")
	req := mustRequest(t, "https://"+f.api+"/basic", "")
	req.SetBasicAuth("user", f.phA)
	res, err := f.goClient(f.proxyURL, false).Do(req)
	must(t, err)
	res.Body.Close()
	got := f.up.requests()
	if res.StatusCode != 200 || len(got) != 1 {
		t.Fatalf("%d", res.StatusCode)
	}
	user, pass, ok := (&http.Request{Header: got[0].Header}).BasicAuth()
	if !ok || user != "user" || pass != realA {
		t.Fatalf("upstream Basic credentials: ok=%v user=%q real=%v", ok, user, pass == realA)
	}
}

// A streamed upload past the buffering limit with a Content-Length keeps
// its exact bytes, the placeholder replaced, and goes on without a length
// (its length changed).
func TestLargeSizedBodyIsStreamedAndSubstituted(t *testing.T) {
	f := newFixture(t, "open")
	body := strings.Repeat("0123456789", 20000) + f.phB + strings.Repeat("z", 5000)
	res, err := f.goClient(f.proxyURL, true).Post("https://"+f.other+"/big", "text/plain", strings.NewReader(body))
	must(t, err)
	res.Body.Close()
	got := f.up.requests()
	if res.StatusCode != 200 || len(got) != 1 || string(got[0].Body) != strings.Replace(body, f.phB, realB, 1) {
		t.Fatalf("%d, %d requests", res.StatusCode, len(got))
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/big" })
	if line["bytesIn"] != float64(len(body)) || line["action"] != "substituted" {
		t.Errorf("audit %v", line)
	}
}

// A streamed response (SSE) reaches the client event by event: the upstream
// sends its second event only after the client has read the first. The
// second echoes the request's real value split across two writes: the task
// gets its placeholder, the value's first part held back only until the
// rest arrives.
func TestStreamedResponsesAreNotBuffered(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newFixture(t, "open")
			ack := make(chan struct{})
			f.up.handler = func(w http.ResponseWriter, r *http.Request) {
				auth := r.Header.Get("Authorization")
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-ack:
				case <-time.After(10 * time.Second):
					return
				}
				io.WriteString(w, "data: "+auth[:15])
				w.(http.Flusher).Flush()
				io.WriteString(w, auth[15:]+"\n\n")
			}
			res, err := f.goClient(f.proxyURL, h2).Do(mustRequest(t, "https://"+f.api+"/events", "Bearer "+f.phA))
			must(t, err)
			defer res.Body.Close()
			br := bufio.NewReader(res.Body)
			line, err := br.ReadString('\n')
			if err != nil || line != "data: one\n" {
				t.Fatalf("first event: %q %v", line, err)
			}
			close(ack)
			rest, _ := io.ReadAll(br)
			if string(rest) != "\ndata: Bearer "+f.phA+"\n\n" {
				t.Fatalf("the second event is not the echo with the placeholder (%d bytes; holds the value: %v)", len(rest), strings.Contains(string(rest), realA))
			}
		})
	}
}

// A WebSocket handshake is processed like any request (its placeholder
// substituted), then the connection is relayed both ways.
func TestWebSocketIsRelayedAfterItsHandshake(t *testing.T) {
	f := newFixture(t, "open")
	var auth string
	ws := websocket.Server{Handler: func(c *websocket.Conn) {
		auth = c.Request().Header.Get("Authorization")
		var msg string
		for websocket.Message.Receive(c, &msg) == nil {
			websocket.Message.Send(c, "echo: "+msg)
		}
	}}
	f.up.handler = ws.ServeHTTP
	tc, _ := f.dialIntercepted(f.proxyURL, f.api, "api.example.test", "http/1.1")
	defer tc.Close()
	cfg, err := websocket.NewConfig("wss://"+f.api+"/ws", "https://"+f.api)
	must(t, err)
	cfg.Header = http.Header{"Authorization": {"Bearer " + f.phA}}
	conn, err := websocket.NewClient(cfg, tc)
	must(t, err)
	for _, m := range []string{"hello", "again"} {
		must(t, websocket.Message.Send(conn, m))
		var got string
		must(t, websocket.Message.Receive(conn, &got))
		if got != "echo: "+m {
			t.Fatalf("got %q", got)
		}
	}
	if auth != "Bearer "+realA {
		t.Fatal("the handshake reached the upstream without the real value")
	}
}

func TestPlaceholdersAreStableAcrossRestartsAndDroppedWithTheTask(t *testing.T) {
	dir := t.TempDir()
	opts := envOptions{dataDir: dir, keys: `{"acme": {"keys": {"A": {"domains": ["api.example.test"]}}}}`, secrets: map[string]string{}}
	e := newEnv(t, opts)
	_, first := e.task("run-r", runspec.Secret{ProjectID: "acme", Key: "A"})
	fi, err := os.Stat(filepath.Join(dir, "secrets-proxy", "placeholders", "run-r.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("placeholder file: %v %v", fi, err)
	}
	e.proxy.Close()
	e.authority.Close()
	// A crash between a write and its rename leaves a temp file: cleared at
	// the next start, never read as a task's placeholders.
	stale := filepath.Join(dir, "secrets-proxy", "placeholders", ".run-t.json.tmp-42")
	must(t, os.WriteFile(stale, []byte("{"), 0o600))

	// A new proxy on the same data dir: the same placeholder for the task,
	// and it is known (blocked as another task's) before it re-registers.
	e2 := newEnv(t, opts)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("a crash's temp file is still there: %v", err)
	}
	if ms := e2.proxy.reg.index.Load().FindString(first["A"], nil); len(ms) != 1 || ms[0].Owner.Task != "run-r" {
		t.Fatal("a persisted placeholder is not recognised after a restart")
	}
	_, again := e2.task("run-r", runspec.Secret{ProjectID: "acme", Key: "A"})
	if again["A"] != first["A"] {
		t.Fatal("the placeholder changed across a restart")
	}
	_, other := e2.task("run-s", runspec.Secret{ProjectID: "acme", Key: "A"})
	if other["A"] == first["A"] {
		t.Fatal("two tasks share a placeholder")
	}
	must(t, e2.proxy.Drop("run-r"))
	if _, err := os.Stat(filepath.Join(dir, "secrets-proxy", "placeholders", "run-r.json")); !os.IsNotExist(err) {
		t.Fatalf("dropped task's placeholders still on disk: %v", err)
	}
	if ms := e2.proxy.reg.index.Load().FindString(first["A"], nil); len(ms) != 0 {
		t.Fatal("a dropped task's placeholder is still recognised")
	}
	if _, err := e2.proxy.TaskKeys("run-r"); err == nil {
		t.Fatal("a dropped task is still registered")
	}
}

func TestRegisterRefusesKeysThePolicyDoesNotGrant(t *testing.T) {
	e := newEnv(t, envOptions{keys: `{"acme": {"keys": {"A": {"domains": ["api.example.test"]}}}}`, secrets: map[string]string{}})
	err := e.proxy.Register("run-n", e.declare(runspec.Secret{ProjectID: "acme", Key: "A"}, runspec.Secret{ProjectID: "acme", Key: "NOPE"}))
	if err == nil || !strings.Contains(err.Error(), "acme/NOPE") {
		t.Fatalf("err = %v", err)
	}
	if _, err := e.proxy.TaskKeys("run-n"); err == nil {
		t.Fatal("a refused task was registered")
	}
	must(t, e.proxy.Register("run-n", e.declare(runspec.Secret{ProjectID: "acme", Key: "A", Domains: []string{"API.example.test."}})))
	keys, err := e.proxy.ProxiedKeys("run-n")
	if err != nil || len(keys) != 1 || keys[0].Key != "A" || fmt.Sprint(keys[0].Domains) != "[api.example.test]" {
		t.Fatalf("%+v %v", keys, err)
	}
	u, err := e.proxy.StartAttempt("run-n")
	if err != nil || u.User.Username() != "run-n" || u.Host != e.listener.Addr().String() {
		t.Fatalf("%v %v", u, err)
	}
	if err := e.proxy.Ready(); err != nil {
		t.Fatalf("Ready = %v", err)
	}
}

// Every decision kind, then a grep of the log and the audit files (rotated
// ones too): neither holds a value, a placeholder (in any case) or a proxy
// password; a placeholder in a path is redacted in the audit line, and so
// is one wherever a task (or any local user) chooses what is recorded: the
// CONNECT target, authenticated or not (a DNS label, lowercased when the
// name is made canonical), the CONNECT's method, a request's method, field
// names, the Host.
func TestAuditAndLogsNeverHoldAValueOrPlaceholder(t *testing.T) {
	f := newFixtureWith(t, envOptions{egress: "open", auditMaxBytes: 1500})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.uca.PEM)
	// run-a holds a body key, so its connection elsewhere is intercepted
	// to scrub and, trusting only the upstream's CA, refused; run-h holds
	// a header key alone, so its is tunnelled.
	headerOnlyURL, phH := f.headerOnlyTask()
	tunnelClient := func(proxyURL *url.URL) *http.Client {
		return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	steps := []func(){
		func() { f.get(t, "https://"+f.api+"/ok", http.Header{"Authorization": {"Bearer " + f.phA}}) },
		func() { f.get(t, "https://"+f.other+"/p/"+f.phB+"?k="+f.phB, nil) },
		func() { f.get(t, "https://"+f.other+"/x", http.Header{"Authorization": {"Bearer " + f.phA}}) },
		func() { f.get(t, "https://"+f.api+"/q?k="+f.phA, nil) },
		func() {
			for _, u := range []*url.URL{f.proxyURL, headerOnlyURL} {
				res, err := tunnelClient(u).Get("https://third.example.test:" + itoa(f.up.port) + "/t?k=" + f.phA + "&h=" + phH)
				if err == nil {
					res.Body.Close()
				}
			}
		},
		func() { c, _, _ := f.connect(f.proxyURL, "api.example.test:1"); c.Close() },
		func() {
			// A name of the task's choosing, intercepted to scrub (run-a
			// holds a body key) and refused: its reason names it.
			c, br, _ := f.connect(f.proxyURL, f.phA+".example.test:443")
			defer c.Close()
			roundTrip(t, c, br, "GET /plain HTTP/1.1\r\nHost: "+f.phA+".example.test\r\n\r\n")
		},
	}
	pw, _ := f.proxyURL.User.Password()
	front := func(auth bool, requestLine string) int {
		c, err := net.Dial("tcp", f.proxyURL.Host)
		must(t, err)
		defer c.Close()
		head := requestLine + "\r\nHost: x\r\n"
		if auth {
			head += "Proxy-Authorization: Basic " + b64("run-a:"+pw) + "\r\n"
		}
		io.WriteString(c, head+"\r\n")
		res, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		must(t, err)
		return res.StatusCode
	}
	intercepted := func(target, sni, raw string) int {
		tc, br := f.dialIntercepted(f.proxyURL, target, sni)
		defer tc.Close()
		res, _ := roundTrip(t, tc, br, raw)
		return res.StatusCode
	}
	steps = append(steps,
		func() { front(false, "CONNECT "+f.phA+".example.test:443 HTTP/1.1") },
		func() { front(true, "CONNECT "+f.phA+".example.test:443 HTTP/1.1") },
		func() { front(true, "CONNECT "+f.phA+" HTTP/1.1") },
		func() { front(true, "CONNECT a"+f.phB+"b:443 HTTP/1.1") },
		func() { front(true, "CONNECT api.example.test:"+f.phA+" HTTP/1.1") },
		func() { front(true, f.phA+" "+f.api+" HTTP/1.1") },
		func() { front(false, f.phB+" "+f.api+" HTTP/1.1") },
		func() { intercepted(f.other, "other.example.test", f.phB+" /m HTTP/1.1\r\nHost: "+f.other+"\r\n\r\n") },
		func() {
			intercepted(f.api, "api.example.test", "GET /hn HTTP/1.1\r\nHost: "+f.api+"\r\n"+f.phA+": x\r\n\r\n")
		},
		func() { intercepted(f.api, "api.example.test", "GET /h HTTP/1.1\r\nHost: "+f.phA+"\r\n\r\n") },
		func() {
			req := mustRequest(t, "https://"+f.api+"/h2name", "")
			req.Header[f.phA] = []string{"x"}
			if res, err := f.goClient(f.proxyURL, true).Do(req); err == nil {
				res.Body.Close()
			}
		},
	)
	for _, s := range steps {
		s()
	}
	delete(f.secrets, "acme/A")
	f.writeSecrets()
	f.get(t, "https://"+f.api+"/withheld", http.Header{"Authorization": {"Bearer " + f.phA}})
	// A line is written when its request or tunnel ends: a tunnel's only
	// once both of its sides closed, after the client's request returned.
	for _, want := range []string{"substituted", "blocked", "withheld", "tunnelled", "denied"} {
		f.waitAudit(func(m map[string]any) bool { return m["action"] == want })
	}
	f.waitAudit(func(m map[string]any) bool { return m["path"] == "/p/[placeholder]" })
	f.waitAudit(func(m map[string]any) bool {
		return m["host"] == "[placeholder].example.test:443" && m["status"] == float64(http.StatusProxyAuthRequired)
	})
	f.waitAudit(func(m map[string]any) bool { return m["method"] == "[placeholder]" && m["host"] == f.api })
	f.waitAudit(func(m map[string]any) bool {
		return m["reason"] == "plain HTTP to [placeholder].example.test:443; "+policy.StorableEgressRule
	})
	if rotated, _ := filepath.Glob(filepath.Join(f.auditDir, "*.jsonl.*")); len(rotated) == 0 {
		t.Error("the audit file never rotated: the rotated files went unchecked")
	}
	f.assertNoLeak(realA, realB, f.phA, f.phB, phH, pw)
}

func TestCheckGrantForAdmission(t *testing.T) {
	e := newEnv(t, envOptions{keys: `{"acme": {"keys": {"A": {"domains": ["api.example.test"]}}}}`, secrets: map[string]string{}})
	if err := e.proxy.CheckGrant(e.declare(runspec.Secret{ProjectID: "acme", Key: "A"})); err != nil {
		t.Fatal(err)
	}
	err := e.proxy.CheckGrant(e.declare(runspec.Secret{ProjectID: "acme", Key: "A", Domains: []string{"evil.example.test"}}))
	var ng *policy.NotGrantedError
	if !errors.As(err, &ng) || len(ng.Refused) != 1 || !strings.Contains(err.Error(), "evil.example.test") {
		t.Fatalf("err = %v", err)
	}
}

// The answer's framing survives the proxy: a chunked answer with a trailer,
// HEAD and 204 without a body, an interim 103 passed on, the upstream's
// hop-by-hop fields dropped, and an answer the upstream cuts short never
// reaching the task as a complete one.
func TestAnswersKeepTheirFraming(t *testing.T) {
	f := newFixture(t, "open")
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/chunked":
			w.Header().Set("Trailer", "X-Sum")
			w.Header().Set("Connection", "X-Hop")
			w.Header().Set("X-Hop", "hop-by-hop")
			w.Header().Set("Keep-Alive", "timeout=5")
			io.WriteString(w, "part one, ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part two")
			w.Header().Set("X-Sum", "42")
		case "/head":
			w.Header().Set("Content-Length", "1234")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/hints":
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, "final")
		case "/cut":
			conn, brw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
			brw.Flush()
			conn.Close()
		}
	}
	tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test", "http/1.1")
	defer tc.Close()
	get := func(method, path string) (*http.Response, string, error) {
		fmt.Fprintf(tc, "%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", method, path, f.api, f.phA)
		res, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return nil, "", err
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		return res, string(body), err
	}
	res, body, err := get("GET", "/chunked")
	if err != nil || body != "part one, part two" || res.Trailer.Get("X-Sum") != "42" {
		t.Fatalf("chunked: %q, trailer %v, %v", body, res.Trailer, err)
	}
	if res.Header.Get("X-Hop") != "" || res.Header.Get("Keep-Alive") != "" {
		t.Errorf("hop-by-hop fields passed on: %v", res.Header)
	}
	res, body, err = get("HEAD", "/head")
	if err != nil || res.StatusCode != 200 || body != "" || res.ContentLength != 1234 {
		t.Fatalf("HEAD: %v %q %v", res, body, err)
	}
	res, body, err = get("GET", "/empty")
	if err != nil || res.StatusCode != http.StatusNoContent || body != "" {
		t.Fatalf("204: %v %q %v", res, body, err)
	}
	fmt.Fprintf(tc, "GET /hints HTTP/1.1\r\nHost: %s\r\n\r\n", f.api)
	interim, err := http.ReadResponse(br, nil)
	if err != nil || interim.StatusCode != http.StatusEarlyHints || interim.Header.Get("Link") == "" {
		t.Fatalf("103: %v %v", interim, err)
	}
	res, err = http.ReadResponse(br, nil)
	must(t, err)
	if b, _ := io.ReadAll(res.Body); res.StatusCode != 200 || string(b) != "final" {
		t.Fatalf("after 103: %d %q", res.StatusCode, b)
	}
	// The same connection still serves; the cut answer never reaches the
	// task as a complete one: the connection ends before it does, or (read
	// whole to be scrubbed of the request's value) it is a 502.
	if res, body, err := get("GET", "/cut"); err == nil && (res.StatusCode != http.StatusBadGateway || strings.Contains(body, "only ten b")) {
		t.Fatalf("an answer cut short reached the task as a complete one: %d %q", res.StatusCode, body)
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/cut" })
	if line["action"] != "substituted" {
		t.Errorf("audit %v", line)
	}
}

// Stop cuts a request waiting on its upstream: the task's connection is
// closed at once and the upstream's connection is dropped, so the upstream
// sees the request go away; a request on HTTP/2 likewise.
func TestStopCutsARequestInFlight(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newFixture(t, "open")
			arrived, gone := make(chan struct{}), make(chan struct{})
			f.up.handler = func(w http.ResponseWriter, r *http.Request) {
				close(arrived)
				select {
				case <-r.Context().Done():
					close(gone)
				case <-time.After(10 * time.Second):
				}
			}
			errc := make(chan error, 1)
			req := mustRequest(t, "https://"+f.api+"/hang", "Bearer "+f.phA)
			go func() {
				res, err := f.goClient(f.proxyURL, h2).Do(req)
				if err == nil {
					_, err = io.ReadAll(res.Body)
					res.Body.Close()
				}
				errc <- err
			}()
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the request never reached the upstream")
			}
			f.proxy.Stop("run-a")
			select {
			case <-gone:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream's request was not cut when the task stopped")
			}
			select {
			case err := <-errc:
				if err == nil {
					t.Fatal("the task got an answer after it was stopped")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the task's request still hangs after stop")
			}
		})
	}
}
