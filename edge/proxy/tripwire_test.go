package proxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/runfleet/runfleet/edge/audit"
	logredact "github.com/runfleet/runfleet/edge/internal/redact"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/secrets"
	"github.com/runfleet/runfleet/shared/egress"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/await"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/syncbuf"
)

const (
	// realP needs percent-encoding in a URL ('+', '/', '=').
	realP = "wJalr+XUtn/FEMI=K7MDENG/bPxRfiCY-do-not-leak"
	// realT is under redact.FindMinLen: read, redacted, never looked for.
	realT = "short-val1"
	// realN is in the secrets file for a key no run holds: never read.
	realN = "real-N-value-never-read-7777"
)

// tripRig is a proxy wired as edge serve wires it (the log redactor is the
// tripwire's index; the raw log and audit lines kept before it; metrics
// registered), egress open, an HTTPS upstream (h2 too) answering as api,
// other and third.example.test that records every byte it reads. run-a
// holds A (api, headers), B (other, headers, URL, body), P (api, headers
// and body) and T (api, headers); N is another key's, never granted.
type tripRig struct {
	*env
	up                *testUpstream
	proxyURL          *url.URL
	ph                map[string]string
	api, other, third string
	rawLogs, rawAudit *syncbuf.Buffer
	metrics           *prometheus.Registry

	mu  sync.Mutex
	got []tripSeen
}

// tripSeen is one request as the upstream read it: its path, its fields,
// every body byte it got as they came, and how its body ended.
type tripSeen struct {
	path   string
	header http.Header
	body   *syncbuf.Buffer
	err    error
}

func newTripRig(t *testing.T) *tripRig {
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, true, "api.example.test", "other.example.test", "third.example.test")
	r := &tripRig{up: up, rawLogs: &syncbuf.Buffer{}, rawAudit: &syncbuf.Buffer{}, metrics: prometheus.NewRegistry()}
	up.noRecord = true
	up.handler = r.record
	r.env = newEnv(t, envOptions{egress: "open", uca: uca, redactor: logredact.NewSet(0), rawLogs: r.rawLogs, rawAudit: r.rawAudit,
		metrics: r.metrics,
		pins:    map[string]string{"api.example.test": "127.0.0.1", "other.example.test": "127.0.0.1", "third.example.test": "127.0.0.1"},
		keys: fmt.Sprintf(`{"acme": {"keys": {
			"A": {"domains": ["api.example.test:%[1]d"], "in": ["header"]},
			"B": {"domains": ["other.example.test:%[1]d"], "in": ["header", "url", "body"], "placeholder": {"prefix": "pb_", "length": 40}},
			"P": {"domains": ["api.example.test:%[1]d"], "in": ["header", "body"]},
			"T": {"domains": ["api.example.test:%[1]d"], "in": ["header"]},
			"N": {"domains": ["api.example.test:%[1]d"], "in": ["header"]}}}}`, up.port),
		secrets: map[string]string{"acme/A": realA, "acme/B": realB, "acme/P": realP, "acme/T": realT, "acme/N": realN},
	})
	r.proxyURL, r.ph = r.task("run-a", runspec.Secret{ProjectID: "acme", Key: "A"}, runspec.Secret{ProjectID: "acme", Key: "B"},
		runspec.Secret{ProjectID: "acme", Key: "P"}, runspec.Secret{ProjectID: "acme", Key: "T"})
	r.api, r.other, r.third = "api.example.test:"+itoa(up.port), "other.example.test:"+itoa(up.port), "third.example.test:"+itoa(up.port)
	return r
}

// record keeps what the upstream read of a request, the body as it comes.
func (r *tripRig) record(w http.ResponseWriter, req *http.Request) {
	s := &tripSeen{path: req.URL.Path, header: req.Header.Clone(), body: &syncbuf.Buffer{}}
	r.mu.Lock()
	r.got = append(r.got, *s)
	i := len(r.got) - 1
	r.mu.Unlock()
	_, err := io.Copy(s.body, req.Body)
	r.mu.Lock()
	r.got[i].err = err
	r.mu.Unlock()
	fmt.Fprintf(w, "ok %d\n", len(s.body.String()))
}

// seen is every request the upstream got at path.
func (r *tripRig) seen(path string) []tripSeen {
	return r.seenUnder(path, false)
}

// seenUnder is every request the upstream got at path, or under it when
// prefix is set.
func (r *tripRig) seenUnder(path string, prefix bool) []tripSeen {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []tripSeen
	for _, s := range r.got {
		if s.path == path || prefix && strings.HasPrefix(s.path, path) {
			out = append(out, s)
		}
	}
	return out
}

// wantCutBefore waits for the upstream to have seen the request under
// path cut short, and checks that it got no more of sent than the bytes
// before at, where the value starts.
func (r *tripRig) wantCutBefore(t *testing.T, path, sent string, at int) {
	t.Helper()
	await.Cond(t, 10*time.Second, "the upstream to see its request cut", func() bool {
		got := r.seenUnder(path, true)
		return len(got) == 1 && got[0].err != nil
	})
	got := r.seenUnder(path, true)[0].body.String()
	if len(got) > at || got != sent[:len(got)] {
		t.Errorf("%s: the upstream got %d bytes of the body, the value starting at %d", path, len(got), at)
	}
}

// valueForms are the ways a test here may spell v: a leak of any is one.
func valueForms(v string) []string {
	return []string{v, strings.ToLower(v), url.QueryEscape(v), url.PathEscape(v), base64.StdEncoding.EncodeToString([]byte(v))[:len(v)*4/3-2]}
}

// assertNoValueAnywhere: neither edge's log nor the audit, before their
// redactor or after it, holds any real value in any form a test here
// sent it.
func (r *tripRig) assertNoValueAnywhere(t *testing.T) {
	t.Helper()
	r.audit.Flush()
	files := r.auditFilesText()
	for _, v := range []string{realA, realB, realP} {
		for _, form := range valueForms(v) {
			for what, text := range map[string]string{"the raw log": r.rawLogs.String(), "the raw audit": r.rawAudit.String(),
				"the log": r.logs.String(), "the audit file": files} {
				if strings.Contains(text, form) {
					t.Errorf("%s holds a form of a real value (%d chars)", what, len(form))
				}
			}
		}
	}
}

func (r *tripRig) auditFilesText() string {
	files, _ := filepath.Glob(filepath.Join(r.auditDir, audit.FileName+"*"))
	var b strings.Builder
	for _, f := range files {
		text, err := os.ReadFile(f)
		must(r.t, err)
		b.Write(text)
	}
	return b.String()
}

// alertCounts scrapes edge_egress_alerts_total by kind.
func (r *tripRig) alertCounts(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := r.metrics.Gather()
	must(t, err)
	got := map[string]float64{}
	for _, fam := range families {
		if fam.GetName() == "edge_egress_alerts_total" {
			for _, m := range fam.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return got
}

// do sends one request through the proxy with a Go client over proto
// ("http/1.1" or "h2") and returns the answer's status and body.
func (r *tripRig) do(t *testing.T, proto string, req *http.Request) (int, string) {
	t.Helper()
	res, err := r.goClient(r.proxyURL, proto == "h2").Do(req)
	must(t, err)
	defer res.Body.Close()
	if want := map[string]int{"h2": 2, "http/1.1": 1}[proto]; res.ProtoMajor != want {
		t.Fatalf("%s asked, %s spoken", proto, res.Proto)
	}
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func tripRequest(t *testing.T, method, rawURL string, body io.Reader, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, rawURL, body)
	must(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// A placeholder issued to another run, and one of this run's toward a
// domain its key does not reach (one of another key's, or a name open
// egress intercepts only to scrub), are blocked as ever and now alerted,
// on HTTP/1.1 and HTTP/2; a placeholder refused for its place alone, and
// one substituted, raise none. The metric counts each kind.
func TestTripwireAlertsOnPlaceholdersThatEscape(t *testing.T) {
	r := newTripRig(t)
	_, other := r.task("run-b", runspec.Secret{ProjectID: "acme", Key: "A"})
	for _, proto := range []string{"http/1.1", "h2"} {
		for _, c := range []struct {
			name, target, path, header, alert, reason string
		}{
			{"another run's placeholder", r.api, "/foreign", "Bearer " + other["A"], egress.AlertForeignPlaceholder, "a placeholder of another task"},
			{"toward another key's domain", r.other, "/ungranted", "Bearer " + r.ph["A"], egress.AlertUngrantedDomain, "key acme/A may not reach other.example.test"},
			{"toward a name intercepted to scrub", r.third, "/scrub-only", "Bearer " + r.ph["A"], egress.AlertUngrantedDomain, "key acme/A may not reach third.example.test"},
		} {
			path := "/" + proto + c.path
			status, body := r.do(t, proto, tripRequest(t, "GET", "https://"+c.target+path, nil, "Authorization", c.header))
			if status != http.StatusForbidden || !strings.Contains(body, c.reason) {
				t.Fatalf("%s, %s: %d %q", proto, c.name, status, body)
			}
			if len(r.seen(path)) != 0 {
				t.Errorf("%s, %s: the upstream got the request", proto, c.name)
			}
			line := r.waitAudit(func(m map[string]any) bool { return m["path"] == path })
			if line["action"] != "blocked" || line["alert"] != c.alert || fmt.Sprint(line["keys"]) != "[acme/A]" {
				t.Errorf("%s, %s: audit %v", proto, c.name, line)
			}
		}
		// Refused for its place alone (A goes in headers, toward api): no
		// alert; substituted: none either.
		path := "/" + proto + "/in-the-query"
		if status, _ := r.do(t, proto, tripRequest(t, "GET", "https://"+r.api+path+"?k="+r.ph["A"], nil)); status != http.StatusForbidden {
			t.Fatalf("%s: a placeholder in the query: %d", proto, status)
		}
		if line := r.waitAudit(func(m map[string]any) bool { return m["path"] == path }); line["action"] != "blocked" || line["alert"] != nil {
			t.Errorf("%s: a placeholder out of its place: audit %v", proto, line)
		}
		path = "/" + proto + "/substituted"
		if status, _ := r.do(t, proto, tripRequest(t, "GET", "https://"+r.api+path, nil, "Authorization", "Bearer "+r.ph["A"])); status != 200 {
			t.Fatalf("%s: substituted: %d", proto, status)
		}
		if line := r.waitAudit(func(m map[string]any) bool { return m["path"] == path }); line["action"] != "substituted" || line["alert"] != nil {
			t.Errorf("%s: substituted: audit %v", proto, line)
		}
	}
	want := map[string]float64{egress.AlertForeignPlaceholder: 2, egress.AlertUngrantedDomain: 4, egress.AlertRealValue: 0}
	if got := r.alertCounts(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("edge_egress_alerts_total = %v, want %v", got, want)
	}
	r.assertNoLeak(realA, realB, realP, r.ph["A"], other["A"])
}

// tripCase is one way a task sends a real value (key's): to
// /<proto>/<id>/<rest>.
type tripCase struct {
	name, method, id, rest string
	header                 []string
	body                   string
	// sized sends the body with its length (read whole when it fits the
	// body buffer); unsized streams it.
	sized bool
	// streamed: the body streams (unsized, or past the body buffer), so
	// its head has gone before the value is met.
	streamed bool
	key      string
}

// A real value the proxy holds, pasted by the task anywhere in a request,
// in any form a request carries it, is refused 403 real_value_from_task
// with an alert, on HTTP/1.1 and HTTP/2, from the run's very first
// request (every request reads its run's values before the tripwire
// looks): the upstream gets no request at all, the answer, the log and
// the audit no value. The audit names the key whose value it was.
func TestTripwireBlocksARealValueFromTheTask(t *testing.T) {
	r := newTripRig(t)
	jsonBody, _ := json.Marshal(map[string]string{"token": realP})
	b64Body, _ := json.Marshal(map[string]string{"path": ".env", "content": base64.StdEncoding.EncodeToString([]byte("API_KEY=" + realP + "\n"))})
	cases := []tripCase{
		{name: "header", method: "GET", id: "header", header: []string{"X-Api-Key", realP}, key: "acme/P"},
		{name: "header name", method: "GET", id: "header-name", header: []string{realA, "1"}, key: "acme/A"},
		{name: "query, percent-encoded", method: "GET", id: "query", rest: "?token=" + url.QueryEscape(realP) + "&a=1", key: "acme/P"},
		{name: "query, as it is", method: "GET", id: "query-raw", rest: "?token=" + realA, key: "acme/A"},
		{name: "path", method: "GET", id: "path", rest: url.PathEscape(realP), key: "acme/P"},
		{name: "Basic credentials", method: "GET", id: "basic", header: []string{"Authorization", basic("ci", realP)}, key: "acme/P"},
		{name: "buffered JSON body", method: "POST", id: "body", body: string(jsonBody), sized: true, key: "acme/P"},
		{name: "buffered form body", method: "POST", id: "form", body: url.Values{"token": {realP}}.Encode(), sized: true, key: "acme/P"},
		{name: "base64 in a JSON body", method: "PUT", id: "contents", body: string(b64Body), sized: true, key: "acme/P"},
		{name: "chunked body", method: "POST", id: "chunked", body: "k=" + realA, streamed: true, key: "acme/A"},
		{name: "sized body past the buffer", method: "POST", id: "large", body: strings.Repeat("lorem ipsum; ", 6000) + realP, sized: true, streamed: true, key: "acme/P"},
	}
	for _, proto := range []string{"http/1.1", "h2"} {
		for _, c := range cases {
			under := "/" + proto + "/" + c.id + "/"
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
				if !c.sized {
					body = io.MultiReader(body) // no length: chunked on HTTP/1.1
				}
			}
			status, answer := r.do(t, proto, tripRequest(t, c.method, "https://"+r.api+under+c.rest, body, c.header...))
			if status != http.StatusForbidden || answer != "runfleet edge: real_value_from_task\n" {
				t.Errorf("%s, %s: %d %q", proto, c.name, status, answer)
			}
			if c.streamed {
				// The head went before the body was read: the upstream
				// gets a body cut before the value, its connection cut.
				r.wantCutBefore(t, under, c.body, strings.Index(c.body, map[string]string{"acme/A": realA, "acme/P": realP}[c.key]))
			} else if got := r.seenUnder(under, true); len(got) != 0 {
				t.Errorf("%s, %s: the upstream got %d requests", proto, c.name, len(got))
			}
			line := r.waitAudit(func(m map[string]any) bool { return strings.HasPrefix(fmt.Sprint(m["path"]), under) })
			if line["action"] != "blocked" || line["reason"] != "real_value_from_task" || line["alert"] != egress.AlertRealValue ||
				line["status"] != float64(403) || fmt.Sprint(line["keys"]) != "["+c.key+"]" {
				t.Errorf("%s, %s: audit %v", proto, c.name, line)
			}
		}
	}
	if got := r.alertCounts(t); got[egress.AlertRealValue] != float64(2*len(cases)) {
		t.Errorf("edge_egress_alerts_total = %v, want %d real values", got, 2*len(cases))
	}
	r.assertNoValueAnywhere(t)
}

// A value split across a streamed body's reads, HTTP/1.1 chunks or HTTP/2
// DATA frames, the first part sent and passed on before the rest is even
// written: the proxy holds back what may begin a value, so the upstream
// gets the body up to the value's first byte and not one byte of it; the
// stream is cut and the task refused.
func TestTripwireBlocksAValueSplitAcrossAStreamedBody(t *testing.T) {
	r := newTripRig(t)
	before := strings.Repeat("lorem ipsum dolor; ", 4000) // past the body buffer: streamed
	cut := 11
	for _, proto := range []string{"http/1.1", "h2"} {
		path := "/" + proto + "/split"
		pr, pw := io.Pipe()
		done := make(chan struct{})
		var status int
		var answer string
		go func() {
			defer close(done)
			res, err := r.goClient(r.proxyURL, proto == "h2").Do(tripRequest(t, "POST", "https://"+r.api+path, pr))
			if err != nil {
				answer = err.Error()
				return
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			status, answer = res.StatusCode, string(b)
		}()
		io.WriteString(pw, before+realP[:cut])
		// Everything before the value reaches the upstream; the value's
		// first bytes wait for what follows them.
		await.Cond(t, 10*time.Second, "the body before the value to reach the upstream", func() bool {
			got := r.seen(path)
			return len(got) == 1 && len(got[0].body.String()) >= len(before)
		})
		if got := r.seen(path)[0].body.String(); got != before {
			t.Fatalf("%s: the upstream got %d bytes, want the %d before the value", proto, len(got), len(before))
		}
		io.WriteString(pw, realP[cut:]+" and more")
		pw.Close()
		await.Recv(t, "the task's answer", done)
		if status != http.StatusForbidden || answer != "runfleet edge: real_value_from_task\n" {
			t.Errorf("%s: %d %q", proto, status, answer)
		}
		r.wantCutBefore(t, path, before+realP, len(before))
		line := r.waitAudit(func(m map[string]any) bool { return m["path"] == path })
		if line["action"] != "blocked" || line["reason"] != "real_value_from_task" || line["alert"] != egress.AlertRealValue || fmt.Sprint(line["keys"]) != "[acme/P]" {
			t.Errorf("%s: audit %v", proto, line)
		}
	}
	r.assertNoValueAnywhere(t)
}

// A value the proxy never read (a key no run holds), one too short to look
// for, one a byte off, and the run's own placeholders are no alarm: the
// requests go on, as they would without the tripwire.
func TestTripwireDoesNotFlagWhatItDoesNotHold(t *testing.T) {
	r := newTripRig(t)
	near := realP[:10] + "X" + realP[11:]
	for _, proto := range []string{"http/1.1", "h2"} {
		for _, c := range []struct {
			name, path, header, body string
		}{
			{"a value never read", "/never-read", "Bearer " + realN, ""},
			{"a value under the length looked for", "/short", "Bearer " + realT, "t=" + realT},
			{"a value a byte off", "/near", near, "k=" + url.QueryEscape(near)},
			{"the run's placeholder, substituted", "/placeholder", "Bearer " + r.ph["P"], `{"k":"` + r.ph["P"] + `"}`},
			{"a 64 KiB body", "/big", "Bearer " + r.ph["A"], string(tripwireBenchBody())},
		} {
			path := "/" + proto + c.path
			var body io.Reader
			method := "GET"
			if c.body != "" {
				body, method = strings.NewReader(c.body), "POST"
			}
			status, answer := r.do(t, proto, tripRequest(t, method, "https://"+r.api+path, body, "Authorization", c.header))
			if status != 200 || len(r.seen(path)) != 1 {
				t.Errorf("%s, %s: %d %q, the upstream got %d requests", proto, c.name, status, answer, len(r.seen(path)))
			}
		}
	}
	if r.seen("/h2/placeholder")[0].header.Get("Authorization") != "Bearer "+realP {
		t.Error("the placeholder was not substituted")
	}
	for _, line := range r.auditLines() {
		if line["alert"] != nil {
			t.Errorf("an alert: %v", line)
		}
	}
	if got := r.alertCounts(t); got[egress.AlertRealValue] != 0 {
		t.Errorf("edge_egress_alerts_total = %v", got)
	}
}

// A connection whose target holds a real value (a name to resolve, a
// server name to send), asked for with a CONNECT or redirected from a pin
// the task resolved, is refused before anything is resolved, and
// alerted; its audit line holds the value in no form.
func TestTripwireRefusesARealValueInAConnectionTarget(t *testing.T) {
	r := newTripRig(t)
	// A request reads the run's values (a CONNECT alone reads none).
	if status, _ := r.do(t, "http/1.1", tripRequest(t, "GET", "https://"+r.api+"/first", nil, "Authorization", "Bearer "+r.ph["A"])); status != 200 {
		t.Fatalf("first request: %d", status)
	}
	target := strings.ToLower(realA) + ".example.test:443"
	c, _, status := r.connect(r.proxyURL, target)
	c.Close()
	if status != http.StatusForbidden {
		t.Fatalf("CONNECT: %d", status)
	}
	line := r.waitAudit(func(m map[string]any) bool { return m["method"] == "CONNECT" && m["action"] == "blocked" })
	if line["reason"] != "real_value_from_task" || line["alert"] != egress.AlertRealValue || fmt.Sprint(line["keys"]) != "[acme/A]" {
		t.Errorf("audit %v", line)
	}
	// Transparently: the task resolves the name (its DNS answers a pin,
	// resolving nothing) and connects to the pin.
	tn := r.network("run-a")
	c = tn.mustDial(authorityOf(tn.pin(strings.ToLower(realA)+".example.test"), 443))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the redirected connection was served")
	}
	line = r.waitAudit(func(m map[string]any) bool { return viaTransparent(m) && m["action"] == "blocked" })
	if line["reason"] != "real_value_from_task" || line["alert"] != egress.AlertRealValue || fmt.Sprint(line["keys"]) != "[acme/A]" {
		t.Errorf("transparent: audit %v", line)
	}
	for _, name := range r.resolver.lookups() {
		if strings.Contains(name, strings.ToLower(realA)) {
			t.Error("the name holding the value was resolved")
		}
	}
	if got := r.alertCounts(t); got[egress.AlertRealValue] != 2 {
		t.Errorf("edge_egress_alerts_total = %v", got)
	}
	r.assertNoValueAnywhere(t)
}

// A WebSocket message from the task holding a real value is blocked as a
// message with a placeholder that may not go is: the task gets a 1008
// close, the upstream not one byte of the message, and the block its
// audit line, alerted.
func TestTripwireBlocksARealValueInAWebSocketMessage(t *testing.T) {
	r := newTripRig(t)
	f := &fixture{env: r.env, up: r.up, proxyURL: r.proxyURL, phA: r.ph["A"], phB: r.ph["B"], api: r.api, other: r.other}
	up, recorded, _ := f.wsRecorder(t)
	conn, br, res := f.wsDial(t, r.api, "api.example.test", "Authorization: Bearer "+r.ph["A"]+"\r\n")
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %d", res.StatusCode)
	}
	conn.Write(rawFrame(true, 0, 0x1, testMask, []byte("hello")))
	// The value split over two fragments of one message.
	msg := `{"token":"` + realP + `"}`
	conn.Write(rawFrame(false, 0, 0x1, testMask, []byte(msg[:15])))
	conn.Write(rawFrame(true, 0, 0x0, testMask, []byte(msg[15:])))
	wantPolicyClose(t, br)
	up.wait(t)
	if got := *recorded; len(got) != 1 || string(got[0].payload) != "hello" {
		t.Errorf("the upstream got %d frames, want the first message alone", len(got))
	}
	line := r.waitAudit(func(m map[string]any) bool { return m["action"] == "blocked" && m["path"] == "/ws" })
	if line["reason"] != "websocket message real_value_from_task" || line["alert"] != egress.AlertRealValue || fmt.Sprint(line["keys"]) != "[acme/P]" {
		t.Errorf("audit %v", line)
	}
	if got := r.alertCounts(t); got[egress.AlertRealValue] != 1 {
		t.Errorf("edge_egress_alerts_total = %v", got)
	}
	r.assertNoValueAnywhere(t)
}

// placeholderAlert classifies a refused placeholder by whose it is and
// where it goes.
func TestPlaceholderAlert(t *testing.T) {
	a := policy.KeyRef{Project: "acme", Key: "A"}
	b := policy.KeyRef{Project: "acme", Key: "B"}
	api := policy.Domain{Name: "api.example.test", Port: 443}
	granted := []policy.Granted{{Ref: a, Domains: []policy.Domain{api}, In: policy.InHeader}}
	for _, c := range []struct {
		name, owner string
		ref         policy.KeyRef
		target      policy.Authority
		want        string
	}{
		{"another run's, toward its key's domain", "run-b", a, policy.Authority{Name: "api.example.test", Port: 443}, egress.AlertForeignPlaceholder},
		{"another run's, anywhere", "run-b", b, policy.Authority{Name: "evil.test", Port: 443}, egress.AlertForeignPlaceholder},
		{"this run's, another domain", "run-a", a, policy.Authority{Name: "evil.test", Port: 443}, egress.AlertUngrantedDomain},
		{"this run's, another port", "run-a", a, policy.Authority{Name: "api.example.test", Port: 8443}, egress.AlertUngrantedDomain},
		{"this run's, its domain (refused for its place)", "run-a", a, policy.Authority{Name: "api.example.test", Port: 443}, ""},
		{"this run's, a key no longer granted", "run-a", b, policy.Authority{Name: "evil.test", Port: 443}, ""},
	} {
		if got := placeholderAlert("run-a", c.owner, c.ref, granted, c.target); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// A tripReader passes a clean stream on whole and unchanged however it is
// cut into reads, and stops one holding a value, wherever it is cut,
// before any byte of the value has gone on.
func TestTripReaderHoldsBackAValueSplitAnywhere(t *testing.T) {
	values := logredact.NewSet(0)
	values.Add(secrets.NewValue(realP))
	stop := errors.New("stopped")
	text := strings.Repeat("lorem ipsum dolor; ", 10)
	for _, c := range []struct {
		stream string
		at     int // where the value starts, -1 for none
	}{
		{text, -1},
		{text + realP + text, len(text)},
		{realP + text, 0},
		{text + url.QueryEscape(realP), len(text)},
	} {
		for cut := 0; cut <= len(c.stream); cut++ {
			var found int
			tr := &tripReader{src: &pieces{c.stream[:cut], c.stream[cut:]}, values: values,
				found: func(v secrets.Value) error { found++; return stop }}
			var out bytes.Buffer
			_, err := io.Copy(&out, tr)
			switch {
			case c.at < 0 && (err != nil || out.String() != c.stream):
				t.Fatalf("clean stream cut at %d: %v, %d of %d bytes", cut, err, out.Len(), len(c.stream))
			case c.at >= 0 && (!errors.Is(err, stop) || found != 1):
				t.Fatalf("value at %d, cut at %d: %v, found %d times", c.at, cut, err, found)
			case c.at >= 0 && (out.Len() > c.at || out.String() != c.stream[:out.Len()]):
				t.Fatalf("value at %d, cut at %d: %d bytes went on", c.at, cut, out.Len())
			}
		}
	}
}

// pieces reads its strings one per Read.
type pieces []string

func (p *pieces) Read(b []byte) (int, error) {
	for len(*p) > 0 && (*p)[0] == "" {
		*p = (*p)[1:]
	}
	if len(*p) == 0 {
		return 0, io.EOF
	}
	n := copy(b, (*p)[0])
	(*p)[0] = (*p)[0][n:]
	return n, nil
}

// A request the proxy re-signs for an aws key (its signature the task's,
// with the key's placeholders) is scanned as any other: a real value in
// its body, read whole to check its hash or streamed unsigned, is
// refused in the shape its AWS service answers errors, and the upstream
// gets none of the value.
func TestTripwireBlocksARealValueInAnAWSRequestBody(t *testing.T) {
	uca := edgetest.NewCA(t)
	up := startUpstream(t, uca, false, ddbHost, s3Host, apiHost)
	r := &tripRig{up: up, rawLogs: &syncbuf.Buffer{}, rawAudit: &syncbuf.Buffer{}, metrics: prometheus.NewRegistry()}
	up.noRecord = true
	up.handler = r.record
	r.env = newEnv(t, envOptions{uca: uca, redactor: logredact.NewSet(0), rawLogs: r.rawLogs, rawAudit: r.rawAudit, metrics: r.metrics,
		pins: map[string]string{ddbHost: "127.0.0.1", s3Host: "127.0.0.1", apiHost: "127.0.0.1"},
		keys: fmt.Sprintf(`{"acme": {"keys": {
			"DEPLOY": {"kind": "aws", "domains": ["%[1]s:%[4]d", "%[2]s:%[4]d"], "aws": {"regions": ["us-east-1"], "services": ["s3", "dynamodb"]}},
			"P": {"domains": ["%[3]s:%[4]d"], "in": ["header"]}}}}`, ddbHost, s3Host, apiHost, up.port),
		secrets: map[string]string{"acme/DEPLOY": staticAWSValue, "acme/P": realP},
	})
	u, _ := r.task("run-aws", runspec.Secret{ProjectID: "acme", Key: "DEPLOY"}, runspec.Secret{ProjectID: "acme", Key: "P"})
	keys, err := r.proxy.TaskKeys("run-aws")
	must(t, err)
	vars := map[string]string{}
	for _, k := range keys {
		vars[k.Var] = k.Placeholder
	}
	creds := aws.Credentials{AccessKeyID: vars["AWS_ACCESS_KEY_ID"], SecretAccessKey: vars["AWS_SECRET_ACCESS_KEY"]}
	client := r.goClient(u, false)
	send := func(req *http.Request) (int, string) {
		res, err := client.Do(req)
		must(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	ddb := fmt.Sprintf("https://%s:%d/", ddbHost, up.port)
	item, _ := json.Marshal(map[string]any{"TableName": "t", "Item": map[string]any{"token": map[string]string{"S": realP}}})
	status, body := send(signed(t, creds, "POST", ddb, item, literalNoHeader, "dynamodb", "us-east-1", time.Now(),
		http.Header{"Content-Type": {"application/x-amz-json-1.0"}, "X-Amz-Target": {"DynamoDB_20120810.PutItem"}}))
	if code, msg := awsErrorOf(t, body); status != http.StatusForbidden || code != "AccessDenied" || msg != "runfleet edge: real_value_from_task" {
		t.Errorf("PutItem: %d %s %q", status, code, msg)
	}
	if got := r.seen("/"); len(got) != 0 {
		t.Errorf("the upstream got %d requests", len(got))
	}
	before := strings.Repeat("artifact bytes; ", 6000)
	object := before + realP + "\n"
	s3URL := fmt.Sprintf("https://%s:%d/bucket/leak.txt", s3Host, up.port)
	status, body = send(signed(t, creds, "PUT", s3URL, []byte(object), "UNSIGNED-PAYLOAD", "s3", "us-east-1", time.Now(), nil))
	if code, msg := awsErrorOf(t, body); status != http.StatusForbidden || code != "AccessDenied" || msg != "runfleet edge: real_value_from_task" {
		t.Errorf("PutObject: %d %s %q", status, code, msg)
	}
	r.wantCutBefore(t, "/bucket/leak.txt", object, len(before))
	for _, path := range []string{"/", "/bucket/leak.txt"} {
		line := r.waitAudit(func(m map[string]any) bool { return m["path"] == path && m["action"] == "blocked" })
		if line["reason"] != "real_value_from_task" || line["alert"] != egress.AlertRealValue || fmt.Sprint(line["keys"]) != "[acme/P]" {
			t.Errorf("%s: audit %v", path, line)
		}
	}
	r.assertNoValueAnywhere(t)
}
