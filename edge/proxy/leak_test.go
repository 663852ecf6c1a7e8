package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/runfleet/runfleet/edge/audit"
	logredact "github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

// A task that sends its placeholder in an Upgrade the proxy refuses (a
// byte no protocol name holds) must not get the real value into edge's log:
// the header is substituted before the upgrade is checked, and the refusal
// once quoted it.
func TestLeakInvalidUpgradeDoesNotLogTheValue(t *testing.T) {
	for _, junk := range []string{"x\t", "\x80"} {
		f := newFixture(t, "open")
		tc, br := f.dialIntercepted(f.proxyURL, f.api, "api.example.test")
		res, body := roundTrip(t, tc, br, "GET /up HTTP/1.1\r\nHost: "+f.api+"\r\nConnection: Upgrade\r\nUpgrade: "+junk+f.phA+"\r\n\r\n")
		tc.Close()
		if res.StatusCode < 400 || strings.Contains(body, realA) {
			t.Fatalf("%q: %d %q", junk, res.StatusCode, body)
		}
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: status %d, want 400", junk, res.StatusCode)
		}
		f.assertNoLeak(realA, f.phA)
	}
}

const (
	realC = "real-C-value-do-not-leak-3333"
	realD = "real-D-value-do-not-leak-4444"
	// realE cannot go in a header (the proxy refuses it, a fault): its
	// first line is what must never be seen.
	realE     = "real-E-value-do-not-leak-5555\r\nX-Injected: 1"
	realEHead = "real-E-value-do-not-leak-5555"
)

// leakRig is a proxy with a key for each way a request can end: A
// (headers, api), B (headers, URL, body, other), C (a port where nothing
// listens: unreachable), D (a name that resolves to an address the guard
// refuses), E (a value that cannot go in a header: a fault), W (no value:
// withheld); egress strict, so a CONNECT elsewhere is refused. It is wired
// as edge serve wires its log and audit: the redactor learns every value
// read and filters both; raw keeps the lines before the filter.
type leakRig struct {
	*env
	up                        *testUpstream
	proxyURL                  *url.URL
	ph                        map[string]string
	api, other, dead, private string
	rawLogs, rawAudit         *syncbuf.Buffer
	// tn is run-a's task network (the transparent front), served anew
	// for each attempt.
	tn     *taskNet
	hung   chan struct{}
	values []string // every real value (E: its first line)
}

func newLeakRig(t *testing.T) *leakRig {
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, false, "api.example.test", "other.example.test", "private.example.test")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	deadPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &leakRig{up: up, rawLogs: &syncbuf.Buffer{}, rawAudit: &syncbuf.Buffer{}, hung: make(chan struct{}, 4),
		values: []string{realA, realB, realC, realD, realEHead}}
	o := envOptions{egress: "strict", uca: uca, redactor: logredact.NewSet(0), rawLogs: r.rawLogs, rawAudit: r.rawAudit,
		pins: map[string]string{"api.example.test": "127.0.0.1", "other.example.test": "127.0.0.1",
			"dead.example.test": "127.0.0.1", "private.example.test": "10.255.255.1"}}
	o.keys = fmt.Sprintf(`{"acme": {"keys": {
		"A": {"domains": ["api.example.test:%[1]d"], "in": ["header"]},
		"B": {"domains": ["other.example.test:%[1]d"], "in": ["header", "url", "body"], "placeholder": {"prefix": "pb_", "length": 40}},
		"C": {"domains": ["dead.example.test:%[2]d"], "in": ["header", "url", "body"]},
		"D": {"domains": ["private.example.test:%[1]d"], "in": ["header"]},
		"E": {"domains": ["api.example.test:%[1]d"], "in": ["header"]},
		"W": {"domains": ["api.example.test:%[1]d"], "in": ["header"]}}}}`, up.port, deadPort)
	o.secrets = map[string]string{"acme/A": realA, "acme/B": realB, "acme/C": realC, "acme/D": realD, "acme/E": realE}
	r.env = newEnv(t, o)
	var declared []runspec.Secret
	for _, k := range []string{"A", "B", "C", "D", "E", "W"} {
		declared = append(declared, runspec.Secret{ProjectID: "acme", Key: k})
	}
	r.proxyURL, r.ph = r.task("run-a", declared...)
	r.api, r.other = "api.example.test:"+itoa(up.port), "other.example.test:"+itoa(up.port)
	r.dead, r.private = "dead.example.test:"+itoa(deadPort), "private.example.test:"+itoa(up.port)
	up.handler = r.upstream
	return r
}

// upstream answers by path: a compressed answer, a switch to another or an
// invalid protocol than the one asked (naming the one asked, as the task's
// header reached it: with its value), a connection dropped unanswered, an
// answer that never comes; else an echo of the request.
func (r *leakRig) upstream(w http.ResponseWriter, req *http.Request) {
	raw := func(head string) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		io.WriteString(c, head)
		c.Close()
	}
	switch p := req.URL.Path; {
	case strings.HasPrefix(p, "/gzip"):
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		fmt.Fprintf(gz, "%v", req.Header)
		gz.Close()
	case strings.HasPrefix(p, "/upgrade-other"):
		raw("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other-" + req.Header.Get("Sec-Websocket-Protocol") + "\r\n\r\n")
	case strings.HasPrefix(p, "/upgrade-invalid"):
		raw("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: \x80" + req.Header.Get("Sec-Websocket-Protocol") + "\r\n\r\n")
	case strings.HasPrefix(p, "/drop"):
		raw("")
	case strings.HasPrefix(p, "/hang"):
		r.hung <- struct{}{}
		<-req.Context().Done()
	default:
		fmt.Fprintf(w, "%s %s %v", req.Method, req.URL, req.Header)
	}
}

// front sends raw to the proxy's own listener and returns the status and
// everything the task got.
func (r *leakRig) front(t *testing.T, raw string) (int, string) {
	c, err := net.Dial("tcp", r.proxyURL.Host)
	must(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, raw)
	got, _ := io.ReadAll(c)
	return statusOf(got), string(got)
}

// h1 sends raw on an intercepted connection to target (TLS with sni) and
// returns the status and everything the task got until the proxy closed
// the connection (a refusal closes it; "Connection: close" for the rest).
func (r *leakRig) h1(t *testing.T, target, sni, raw string) (int, string) {
	return r.sendH1(target, sni, raw)()
}

// sendH1 is h1 in two steps: it sends (failing the test, so on the test's
// goroutine) and returns the read of the answer, which touches no
// testing.T and may run on another goroutine.
func (r *leakRig) sendH1(target, sni, raw string) (read func() (int, string)) {
	tc, br := r.dialIntercepted(r.proxyURL, target, sni, "http/1.1")
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(tc, raw)
	return func() (int, string) {
		defer tc.Close()
		got, _ := io.ReadAll(br)
		return statusOf(got), string(got)
	}
}

func statusOf(got []byte) int {
	if res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil); err == nil {
		return res.StatusCode
	}
	return 0
}

// transparent sends raw on a connection the task opened to api's pin (its
// task network redirects it to the proxy), as h1 does.
func (r *leakRig) transparent(t *testing.T, raw string) (int, string) {
	if r.tn == nil {
		r.tn = r.network("run-a")
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.authority.Bundle())
	tc := r.tn.tlsDial(authorityOf(r.tn.pin("api.example.test"), r.up.port),
		&tls.Config{RootCAs: pool, ServerName: "api.example.test", NextProtos: []string{"http/1.1"}})
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(tc, raw)
	got, _ := io.ReadAll(tc)
	return statusOf(got), string(got)
}

// h2 sends one request as raw HTTP/2 frames (any field, any byte: no
// client's checks in the way) on an intercepted connection to target and
// returns the status and every field and data byte the task got on the
// stream, until it ended or was reset.
func (r *leakRig) h2(t *testing.T, target string, fields [][2]string, body string) (int, string) {
	return r.sendH2(t, target, fields, body)()
}

// sendH2 is h2 in two steps, as sendH1.
func (r *leakRig) sendH2(t *testing.T, target string, fields [][2]string, body string) (read func() (int, string)) {
	tc, br := r.dialIntercepted(r.proxyURL, target, strings.Split(target, ":")[0], "h2")
	if tc.ConnectionState().NegotiatedProtocol != "h2" {
		tc.Close()
		t.Fatal("h2 not negotiated")
	}
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(tc, http2.ClientPreface)
	fr := http2.NewFramer(tc, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	must(t, fr.WriteSettings())
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range fields {
		must(t, enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
	}
	must(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: body == ""}))
	if body != "" {
		must(t, fr.WriteData(1, true, []byte(body)))
	}
	return func() (int, string) {
		defer tc.Close()
		return readH2(fr)
	}
}

// readH2 reads the answer on stream 1, until it ended or was reset.
func readH2(fr *http2.Framer) (int, string) {
	status, got := 0, ""
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return status, got
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if s, err := strconv.Atoi(f.PseudoValue("status")); err == nil && status == 0 {
				status = s
			}
			for _, hf := range f.Fields {
				got += hf.Name + ": " + hf.Value + "\n"
			}
			if f.StreamEnded() {
				return status, got
			}
		case *http2.DataFrame:
			got += string(f.Data())
			if f.StreamEnded() {
				return status, got
			}
		case *http2.RSTStreamFrame:
			return status, got
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		}
		// A GOAWAY (NO_ERROR: a refusal ends the connection) may come
		// before the refused stream's answer: read on.
	}
}

func basic(user, pass string) string { return "Basic " + b64(user+":"+pass) }

// Every way the proxy refuses a request, or a request ends badly, on both
// fronts and both protocols, with a placeholder (then with its real value)
// in every place a task can put one: no log line, no audit line and
// nothing the task gets holds a real value, nor a log or audit line a
// placeholder.
//
// With placeholders the proxy itself must keep values out: the lines are
// checked before the last-line redactor. With real values (a task that
// learned one) the task's own text is what is logged, and the redactor is
// what keeps it out: the lines are checked after it.
func TestNoValueInAnyLogOnEveryRefusal(t *testing.T) {
	r := newLeakRig(t)
	pw, _ := r.proxyURL.User.Password()
	auth := "Proxy-Authorization: " + basic("run-a", pw) + "\r\n"

	type step struct {
		name string
		want int // the status with placeholders; 0: any (the connection cut)
		do   func(tok func(key string) string) (int, string)
	}
	h1 := func(target, sni, raw string) (int, string) { return r.h1(t, target, sni, raw) }
	get := func(host, rest string) string { return "GET " + rest + " HTTP/1.1\r\nHost: " + host + "\r\n" }
	steps := []step{
		// The proxy's own front: credentials, method, bad request, refused target.
		{"credentials: none, value in the target", 407, func(tok func(string) string) (int, string) {
			return r.front(t, "CONNECT "+tok("A")+".example.test:443 HTTP/1.1\r\nHost: x\r\n\r\n")
		}},
		{"credentials: value as the password", 407, func(tok func(string) string) (int, string) {
			return r.front(t, "CONNECT "+r.api+" HTTP/1.1\r\nProxy-Authorization: "+basic("run-a", tok("A"))+"\r\n\r\n")
		}},
		{"credentials: value as the user", 407, func(tok func(string) string) (int, string) {
			return r.front(t, "CONNECT "+r.api+" HTTP/1.1\r\nProxy-Authorization: "+basic(tok("A"), pw)+"\r\n\r\n")
		}},
		{"method: not CONNECT, value in the URL", 405, func(tok func(string) string) (int, string) {
			return r.front(t, "GET https://"+r.api+"/"+tok("A")+"?k="+tok("B")+" HTTP/1.1\r\nHost: "+r.api+"\r\n"+auth+"\r\n")
		}},
		{"method: the value", 405, func(tok func(string) string) (int, string) {
			return r.front(t, tok("A")+" "+r.api+" HTTP/1.1\r\nHost: "+r.api+"\r\n"+auth+"\r\n")
		}},
		{"bad request: value as the port", 400, func(tok func(string) string) (int, string) {
			return r.front(t, "CONNECT api.example.test:"+tok("A")+" HTTP/1.1\r\nHost: x\r\n"+auth+"\r\n")
		}},
		{"bad request: value as the target", 400, func(tok func(string) string) (int, string) {
			return r.front(t, "CONNECT "+tok("A")+" HTTP/1.1\r\nHost: x\r\n"+auth+"\r\n")
		}},
		{"refused target: value in the name", 403, func(tok func(string) string) (int, string) {
			return r.front(t, "CONNECT "+tok("A")+".example.test:443 HTTP/1.1\r\nHost: x\r\n"+tok("B")+": "+tok("A")+"\r\n"+auth+"\r\n")
		}},
		{"refused target: another port", 403, func(tok func(string) string) (int, string) {
			return r.front(t, "CONNECT api.example.test:1 HTTP/1.1\r\nHost: "+tok("A")+"\r\n"+auth+"\r\n")
		}},

		// HTTP/1.1 on an intercepted connection.
		{"misdirected: Host", 421, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(tok("A")+".example.test", "/")+"Authorization: Bearer "+tok("A")+"\r\n\r\n")
		}},
		{"misdirected: absolute URL", 421, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "https://"+tok("A")+".example.test/"+tok("A"))+"\r\n")
		}},
		{"misdirected: SNI", 421, func(tok func(string) string) (int, string) {
			return h1(r.api, strings.ToLower(tok("A"))+".example.test", get(r.api, "/"+tok("A"))+"Authorization: Bearer "+tok("A")+"\r\n\r\n")
		}},
		{"CONNECT inside (an authority-form URL: misdirected)", 421, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", "CONNECT "+r.api+" HTTP/1.1\r\nHost: "+r.api+"\r\nX-K: "+tok("A")+"\r\n\r\n")
		}},
		{"blocked: method", 403, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", tok("A")+" / HTTP/1.1\r\nHost: "+r.api+"\r\nConnection: close\r\n\r\n")
		}},
		{"blocked: header name", 403, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/")+tok("A")+": x\r\nConnection: close\r\n\r\n")
		}},
		{"blocked: path", 403, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/p/"+tok("A"))+"Connection: close\r\n\r\n")
		}},
		{"blocked: query", 403, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/q?k="+tok("A"))+"Connection: close\r\n\r\n")
		}},
		{"blocked: body", 403, func(tok func(string) string) (int, string) {
			body := "k=" + tok("A")
			return h1(r.api, "api.example.test", "POST /b HTTP/1.1\r\nHost: "+r.api+"\r\nConnection: close\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
		}},
		{"blocked: Basic credentials of another host's key", 403, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/")+"Authorization: "+basic("u", tok("B"))+"\r\nConnection: close\r\n\r\n")
		}},
		{"blocked: another host's key in a header", 403, func(tok func(string) string) (int, string) {
			return h1(r.other, "other.example.test", get(r.other, "/")+"Authorization: Bearer "+tok("A")+"\r\nConnection: close\r\n\r\n")
		}},
		{"withheld", 403, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/w")+"Authorization: Bearer "+tok("W")+"\r\nX-A: "+tok("A")+"\r\nConnection: close\r\n\r\n")
		}},
		{"fault: a value that cannot go in a header", 500, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/f")+"Authorization: Bearer "+tok("E")+"\r\nConnection: close\r\n\r\n")
		}},
		{"unscannable: a compressed answer", 502, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/gzip")+"Authorization: Bearer "+tok("A")+"\r\nConnection: close\r\n\r\n")
		}},
		{"upstream refused: a private address", 403, func(tok func(string) string) (int, string) {
			return h1(r.private, "private.example.test", get(r.private, "/")+"Authorization: Bearer "+tok("D")+"\r\nConnection: close\r\n\r\n")
		}},
		{"unreachable: nothing listens", 502, func(tok func(string) string) (int, string) {
			body := "k=" + tok("C")
			return h1(r.dead, "dead.example.test", "POST /"+tok("C")+"?k="+tok("C")+" HTTP/1.1\r\nHost: "+r.dead+"\r\nAuthorization: Bearer "+tok("C")+"\r\nConnection: close\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
		}},
		{"unreachable: the upstream drops the connection", 502, func(tok func(string) string) (int, string) {
			body := "k=" + tok("B")
			return h1(r.other, "other.example.test", "POST /drop/"+tok("B")+"?k="+tok("B")+" HTTP/1.1\r\nHost: "+r.other+"\r\nAuthorization: "+basic("u", tok("B"))+"\r\nConnection: close\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
		}},
		{"invalid upgrade from the task: a tab", 400, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/u")+"Connection: Upgrade, close\r\nUpgrade: x\t"+tok("A")+"\r\n\r\n")
		}},
		{"invalid upgrade from the task: a high byte", 400, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/u")+"Connection: Upgrade, close\r\nUpgrade: \x80"+tok("A")+"\r\n\r\n")
		}},
		{"upgrade to a protocol other than websocket", 501, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/upgrade-other")+"Connection: Upgrade, close\r\nUpgrade: "+tok("A")+"\r\n\r\n")
		}},
		{"upgrade: the upstream switches to another protocol", 502, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/upgrade-other")+"Connection: Upgrade, close\r\nUpgrade: websocket\r\nSec-WebSocket-Protocol: "+tok("A")+"\r\n\r\n")
		}},
		{"upgrade: the upstream switches to an invalid protocol", 502, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", get(r.api, "/upgrade-invalid")+"Connection: Upgrade, close\r\nUpgrade: websocket\r\nSec-WebSocket-Protocol: "+tok("A")+"\r\n\r\n")
		}},
	}
	// The HTTP/1.1 reader's refusals of a malformed head.
	malformed := 0
	for _, c := range []struct {
		name string
		want int
		head func(tok func(string) string) string
	}{
		{"folded line", 400, func(tok func(string) string) string {
			return get(r.api, "/") + "Authorization: Bearer " + tok("A") + "\r\n " + tok("A") + "\r\n\r\n"
		}},
		{"no colon", 400, func(tok func(string) string) string { return get(r.api, "/") + tok("A") + "\r\n\r\n" }},
		{"bad version", 400, func(tok func(string) string) string {
			return "GET /" + tok("A") + " HTTP/" + tok("A") + "\r\nHost: " + r.api + "\r\n\r\n"
		}},
		{"bad target", 400, func(tok func(string) string) string {
			return "GET " + tok("A") + " HTTP/1.1\r\nHost: " + r.api + "\r\n\r\n"
		}},
		{"bad request line", 400, func(tok func(string) string) string { return tok("A") + "\r\n\r\n" }},
		{"bad Content-Length", 400, func(tok func(string) string) string {
			return get(r.api, "/") + "Content-Length: " + tok("A") + "\r\n\r\n"
		}},
		{"two Content-Lengths", 400, func(tok func(string) string) string {
			return get(r.api, "/"+tok("A")) + "Content-Length: 1\r\nContent-Length: 2\r\n\r\nx"
		}},
		{"Transfer-Encoding and Content-Length", 400, func(tok func(string) string) string {
			return get(r.api, "/"+tok("A")) + "Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n"
		}},
		{"a coding other than chunked", 501, func(tok func(string) string) string {
			return get(r.api, "/") + "Transfer-Encoding: " + strings.ToLower(tok("A")) + "\r\n\r\n"
		}},
		{"two Hosts", 400, func(tok func(string) string) string {
			return get(r.api, "/") + "Host: " + tok("A") + "\r\n\r\n"
		}},
		{"head too large", 431, func(tok func(string) string) string {
			return get(r.api, "/") + "Authorization: Bearer " + strings.Repeat(tok("A"), 70<<10/len(tok("A"))) + "\r\n\r\n"
		}},
	} {
		malformed++
		steps = append(steps, step{"malformed head: " + c.name, c.want, func(tok func(string) string) (int, string) {
			return h1(r.api, "api.example.test", c.head(tok))
		}})
	}
	// HTTP/2 on an intercepted connection, fields and bytes as a task may
	// send them.
	h2 := func(target string, method, path string, extra [][2]string, body string) (int, string) {
		authority := target
		fields := [][2]string{{":method", method}, {":scheme", "https"}, {":authority", authority}, {":path", path}}
		return r.h2(t, target, append(fields, extra...), body)
	}
	bearer := func(v string) [][2]string { return [][2]string{{"authorization", "Bearer " + v}} }
	steps = append(steps,
		step{"h2 misdirected: :authority", 421, func(tok func(string) string) (int, string) {
			return r.h2(t, r.api, [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", tok("A") + ".example.test"}, {":path", "/" + tok("A")}, {"authorization", "Bearer " + tok("A")}}, "")
		}},
		step{"h2 CONNECT (an authority: misdirected)", 421, func(tok func(string) string) (int, string) {
			return r.h2(t, r.api, [][2]string{{":method", "CONNECT"}, {":authority", r.api}, {"x-k", tok("A")}}, "")
		}},
		step{"h2 bad request: malformed method", 400, func(tok func(string) string) (int, string) {
			return h2(r.api, "G(T", "/"+tok("A"), bearer(tok("A")), "")
		}},
		step{"h2 blocked: method", 403, func(tok func(string) string) (int, string) { return h2(r.api, tok("A"), "/", nil, "") }},
		step{"h2 blocked: header name", 403, func(tok func(string) string) (int, string) {
			return h2(r.api, "GET", "/", [][2]string{{strings.ToLower(tok("A")), "x"}}, "")
		}},
		step{"h2 blocked: path and query", 403, func(tok func(string) string) (int, string) {
			return h2(r.api, "GET", "/p/"+tok("A")+"?k="+tok("A"), nil, "")
		}},
		step{"h2 blocked: body", 403, func(tok func(string) string) (int, string) {
			return h2(r.api, "POST", "/b", [][2]string{{"content-length", itoa(len(tok("A")))}}, tok("A"))
		}},
		step{"h2 blocked: Basic credentials", 403, func(tok func(string) string) (int, string) {
			return h2(r.api, "GET", "/", [][2]string{{"authorization", basic("u", tok("B"))}}, "")
		}},
		step{"h2 withheld", 403, func(tok func(string) string) (int, string) {
			return h2(r.api, "GET", "/w", append(bearer(tok("W")), [2]string{"x-a", tok("A")}), "")
		}},
		step{"h2 fault", 500, func(tok func(string) string) (int, string) { return h2(r.api, "GET", "/f", bearer(tok("E")), "") }},
		step{"h2 unscannable", 502, func(tok func(string) string) (int, string) {
			return h2(r.api, "GET", "/gzip", bearer(tok("A")), "")
		}},
		step{"h2 upstream refused", 403, func(tok func(string) string) (int, string) {
			return h2(r.private, "GET", "/", bearer(tok("D")), "")
		}},
		step{"h2 unreachable: nothing listens", 502, func(tok func(string) string) (int, string) {
			return h2(r.dead, "POST", "/"+tok("C")+"?k="+tok("C"), bearer(tok("C")), "k="+tok("C"))
		}},
		step{"h2 unreachable: dropped", 502, func(tok func(string) string) (int, string) {
			return h2(r.other, "POST", "/drop/"+tok("B")+"?k="+tok("B"), bearer(tok("B")), "k="+tok("B"))
		}},
		step{"h2 upgrade field", 0, func(tok func(string) string) (int, string) {
			return h2(r.api, "GET", "/u", [][2]string{{"upgrade", "\x80" + tok("A")}}, "")
		}},
	)

	// The transparent front: a connection the task's network redirected.
	tr := func(raw string) (int, string) { return r.transparent(t, raw) }
	steps = append(steps,
		step{"transparent misdirected: Host", 421, func(tok func(string) string) (int, string) {
			return tr(get(tok("A")+".example.test", "/") + "Authorization: Bearer " + tok("A") + "\r\n\r\n")
		}},
		step{"transparent blocked: header name", 403, func(tok func(string) string) (int, string) {
			return tr(get(r.api, "/") + tok("A") + ": x\r\nConnection: close\r\n\r\n")
		}},
		step{"transparent withheld", 403, func(tok func(string) string) (int, string) {
			return tr(get(r.api, "/w") + "Authorization: Bearer " + tok("W") + "\r\nX-A: " + tok("A") + "\r\nConnection: close\r\n\r\n")
		}},
		step{"transparent invalid upgrade", 400, func(tok func(string) string) (int, string) {
			return tr(get(r.api, "/u") + "Connection: Upgrade, close\r\nUpgrade: \x80" + tok("A") + "\r\n\r\n")
		}},
		step{"transparent upgrade: the upstream switches to another protocol", 502, func(tok func(string) string) (int, string) {
			return tr(get(r.api, "/upgrade-other") + "Connection: Upgrade, close\r\nUpgrade: websocket\r\nSec-WebSocket-Protocol: " + tok("A") + "\r\n\r\n")
		}},
	)

	// cancelled: the task stops while the upstream has its request; a new
	// attempt (a new password, a new task network) serves what follows.
	cancelled := func(tok func(string) string, h2 bool) {
		t.Helper()
		// Sent here (a failure fails the test); only the read, which
		// waits for the proxy to stop, runs on its own goroutine.
		var read func() (int, string)
		if h2 {
			read = r.sendH2(t, r.other, [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", r.other}, {":path", "/hang/" + tok("B")}, {"authorization", "Bearer " + tok("B")}}, "")
		} else {
			read = r.sendH1(r.other, "other.example.test", get(r.other, "/hang/"+tok("B"))+"Authorization: Bearer "+tok("B")+"\r\n\r\n")
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			read()
		}()
		select {
		case <-r.hung:
		case <-time.After(10 * time.Second):
			t.Fatal("the request never reached the upstream")
		}
		r.proxy.Stop("run-a")
		await.Recv(t, "the request cut by Stop to end", done)
		r.waitAudit(func(m map[string]any) bool {
			return strings.HasPrefix(fmt.Sprint(m["path"]), "/hang/") && m["status"] == float64(http.StatusBadGateway)
		})
		u, err := r.proxy.StartAttempt("run-a")
		must(t, err)
		r.proxyURL, r.tn = u, nil
		pw, _ = u.User.Password()
		auth = "Proxy-Authorization: " + basic("run-a", pw) + "\r\n"
	}

	var placeholders []string
	for _, p := range r.ph {
		placeholders = append(placeholders, p)
	}
	byPlaceholder := func(k string) string { return r.ph[k] }
	byValue := func(k string) string {
		if k == "W" {
			return "real-W-value-never-read-6666" // no value: the task cannot know one
		}
		if k == "E" {
			return realEHead
		}
		return map[string]string{"A": realA, "B": realB, "C": realC, "D": realD}[k]
	}

	// With placeholders, checked before the redactor: the proxy's own
	// construction keeps every value out.
	for _, s := range steps {
		status, got := s.do(byPlaceholder)
		if s.want != 0 && status != s.want {
			t.Errorf("%s: status %d, want %d: %q", s.name, status, s.want, got)
		}
		for _, v := range r.values {
			if strings.Contains(got, v) {
				t.Errorf("%s: the task got a real value (%d chars)", s.name, len(v))
			}
		}
	}
	cancelled(byPlaceholder, false)
	cancelled(byPlaceholder, true)
	for _, want := range []string{"blocked", "withheld", "denied", "substituted"} {
		r.waitAudit(func(m map[string]any) bool { return m["action"] == want })
	}
	r.audit.Flush()
	checkText := func(what, text string, values []string) {
		t.Helper()
		lower := strings.ToLower(text)
		for _, v := range values {
			if strings.Contains(lower, strings.ToLower(v)) {
				for _, line := range strings.Split(text, "\n") {
					if strings.Contains(strings.ToLower(line), strings.ToLower(v)) {
						t.Errorf("%s holds a value or placeholder (%d chars): %.300s", what, len(v), strings.ReplaceAll(line, v, "<LEAK>"))
					}
				}
			}
		}
	}
	checkText("the log, before the redactor", r.rawLogs.String(), append(placeholders, r.values...))
	checkText("the audit, before the redactor", r.rawAudit.String(), append(placeholders, r.values...))
	// One line per step and cancellation, but for the malformed heads,
	// which the HTTP/1.1 reader refuses before there is a request to audit.
	if n, want := strings.Count(r.rawAudit.String(), "\n"), len(steps)-malformed; n < want {
		t.Errorf("%d audit lines, want at least %d", n, want)
	}
	if !strings.Contains(r.rawLogs.String(), "secrets proxy request failed") {
		t.Error("no request failure was logged: the log went unchecked")
	}
	// Every refusal's line says why, a request that was substituted
	// before its exchange failed included.
	for _, line := range strings.Split(strings.TrimSpace(r.rawAudit.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("audit line: %v", err)
		}
		if status, _ := m["status"].(float64); status >= 400 && m["reason"] == nil {
			t.Errorf("a %v refusal's audit line (%v) has no reason", status, m["action"])
		}
	}

	// With the real values: what the task sent is what is logged, and the
	// redactor, which learned each value the proxy read above, takes it
	// out.
	for _, s := range steps {
		s.do(byValue)
	}
	// A request holding a real value never reaches an upstream to be cut
	// there: the tripwire refuses it first (tripwire.go).
	if status, got := r.h1(t, r.other, "other.example.test", get(r.other, "/hang/"+realB)+"Authorization: Bearer "+realB+"\r\n\r\n"); status != http.StatusForbidden || strings.Contains(got, realB) {
		t.Errorf("a real value toward an upstream that hangs: %d, the answer holds it: %v", status, strings.Contains(got, realB))
	}
	r.audit.Flush()
	if !strings.Contains(r.rawAudit.String(), realA) {
		t.Error("no task-sent value reached the audit before the redactor: the redactor went untested")
	}
	// E's value holds a line break: the task can send only part of it,
	// which is not the value, so not redacted.
	learned := []string{realA, realB, realC, realD}
	checkText("the log, after the redactor", r.logs.String(), append(placeholders, learned...))
	checkText("the audit file", r.auditFiles(), append(placeholders, learned...))
	checkText("the log, before the redactor", r.rawLogs.String(), placeholders)
	checkText("the audit, before the redactor", r.rawAudit.String(), placeholders)
}

// auditFiles is the text of every audit file, rotated ones too.
func (r *leakRig) auditFiles() string {
	r.audit.Flush()
	files, _ := filepath.Glob(filepath.Join(r.auditDir, audit.FileName+"*"))
	var b strings.Builder
	for _, f := range files {
		text, err := os.ReadFile(f)
		must(r.t, err)
		b.Write(text)
	}
	return b.String()
}

// TestRequestFailuresDoNotFloodTheLog: a task sending request after
// request to an upstream where nothing listens gets its 502 each time and
// the audit a line each time, while edge's log says it once (the rest are
// counted for a summary a minute on).
func TestRequestFailuresDoNotFloodTheLog(t *testing.T) {
	r := newLeakRig(t)
	const tries = 20
	for i := range tries {
		req := "GET /try-" + itoa(i) + " HTTP/1.1\r\nHost: " + r.dead + "\r\nAuthorization: Bearer " + r.ph["C"] + "\r\nConnection: close\r\n\r\n"
		if status, _ := r.h1(t, r.dead, "dead.example.test", req); status != http.StatusBadGateway {
			t.Fatalf("try %d: %d, want 502", i, status)
		}
	}
	failed := 0
	for _, line := range r.auditLines() {
		if line["status"] == float64(http.StatusBadGateway) {
			failed++
		}
	}
	if failed != tries {
		t.Errorf("%d audit lines of a 502, want one per try (%d)", failed, tries)
	}
	if n := strings.Count(r.rawLogs.String(), "secrets proxy request failed"); n != 1 {
		t.Errorf("the log says %d times that a request failed, want once:\n%s", n, r.rawLogs.String())
	}
}
