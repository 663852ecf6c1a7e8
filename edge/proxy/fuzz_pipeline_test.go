package proxy

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// FuzzPipeline drives the request pipeline (the handler both HTTP/1.1 and
// HTTP/2 use) with fuzzed requests on an intercepted connection to a real
// loopback upstream. Invariants: a real value reaches the upstream only in a
// location its key allows, on a host its key may reach, and never reaches
// the client; no placeholder reaches a host its key may not reach, or
// another task's, in any part of the request (method included).
func FuzzPipeline(f *testing.F) {
	uca := edgetest.NewCA(f)
	up := startUpstream(f, uca, true, "api.example.test", "other.example.test")
	e := newEnv(f, envOptions{
		uca: uca, quiet: true,
		rand: rand.NewChaCha8([32]byte{1}),
		pins: map[string]string{"api.example.test": "127.0.0.1", "other.example.test": "127.0.0.1"},
		keys: fmt.Sprintf(`{"acme": {"keys": {
			"A": {"domains": ["api.example.test:%d"], "in": ["header"], "placeholder": {"prefix": "pa-", "length": 24}},
			"B": {"domains": ["other.example.test:%d"], "in": ["header", "url", "body"], "placeholder": {"prefix": "pb_", "length": 24}}}}}`, up.port, up.port),
		secrets: map[string]string{"acme/A": realA, "acme/B": realB},
	})
	_, phs := e.task("run-f", runspec.Secret{ProjectID: "acme", Key: "A"}, runspec.Secret{ProjectID: "acme", Key: "B"})
	_, other := e.task("run-g", runspec.Secret{ProjectID: "acme", Key: "A"})
	pa, pb, pg := phs["A"], phs["B"], other["A"]
	e.proxy.reg.mu.Lock()
	att := e.proxy.reg.tasks["run-f"].attempt
	e.proxy.reg.mu.Unlock()
	targets := []string{"api.example.test:" + itoa(up.port), "other.example.test:" + itoa(up.port)}

	f.Add(uint8(0), "GET", "/v1/x", "a=1", "Authorization", "Bearer "+pa, []byte(""))
	f.Add(uint8(1), "POST", "/v1/"+pb, "k="+pb, "X-Key", pb, []byte(`{"k":"`+pb+`"}`))
	f.Add(uint8(0), "POST", "/v1", "", "Authorization", "Basic "+b64("u:"+pa), []byte(pa))
	f.Add(uint8(1), "PUT", "/%70"+pb[1:], "", "X", pg, []byte(pb[:5]+pb[5:]))
	f.Add(uint8(0), "GET", "/", "q="+strings.Repeat("%", 3), "Cookie", "s="+pb, []byte(nil))
	f.Add(uint8(0), pb, "/", "", "", "", []byte(nil))
	f.Add(uint8(1), "GET", "/", "", strings.ToUpper(pa), "x", []byte(nil))

	f.Fuzz(func(t *testing.T, which uint8, method, path, query, hname, hvalue string, body []byte) {
		for _, s := range []string{method, path, query, hname, hvalue, string(body)} {
			if strings.Contains(s, realA) || strings.Contains(s, realB) {
				return
			}
		}
		target := targets[int(which)%2]
		tgt, err := policy.ParseAuthority(target, true)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest(method, "https://"+target+path+"?"+query, bytes.NewReader(body))
		if err != nil || req.URL.Host != target {
			return
		}
		if hname != "" {
			if !validHeaderField(hname, hvalue) {
				return
			}
			req.Header.Add(hname, hvalue)
		}
		req.RequestURI = req.URL.RequestURI()
		req.URL.Scheme, req.URL.Host = "", ""
		ci := newConnInfo(att, tgt, e.proxy.reg.index.Load())
		ci.sniOK = true
		req = req.WithContext(context.WithValue(req.Context(), connInfoKey{}, ci))
		before := len(up.requests())
		rec := httptest.NewRecorder()
		pipeline{e.proxy}.ServeHTTP(rec, req)

		client := fmt.Sprint(rec.Header()) + rec.Body.String()
		if strings.Contains(client, realA) || strings.Contains(client, realB) {
			t.Fatal("a real value reached the client")
		}
		for _, r := range up.requests()[before:] {
			headers := fmt.Sprint(r.Header) + r.Host
			rest := r.Method + " " + r.Path + "?" + r.RawQuery + string(r.Body)
			onAPI := strings.HasPrefix(r.Host, "api.")
			// Field names reach the upstream canonicalised: compared in any
			// case; the rest as it is.
			var names strings.Builder
			for k := range r.Header {
				names.WriteString(strings.ToLower(k) + "\n")
			}
			forwarded := func(ph string) bool {
				return strings.Contains(headers+rest, ph) || strings.Contains(names.String(), strings.ToLower(ph))
			}
			if onAPI && forwarded(pb) {
				t.Fatal("B's placeholder was forwarded to a host B may not reach")
			}
			if !onAPI && forwarded(pa) {
				t.Fatal("A's placeholder was forwarded to a host A may not reach")
			}
			if strings.Contains(headers+rest, realB) && onAPI {
				t.Fatal("B's value reached a host B may not reach")
			}
			if strings.Contains(headers+rest, realA) && !onAPI {
				t.Fatal("A's value reached a host A may not reach")
			}
			if strings.Contains(rest, realA) {
				t.Fatal("A's value went outside a header")
			}
			if forwarded(pg) {
				t.Fatal("another task's placeholder was forwarded")
			}
		}
	})
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func validHeaderField(name, value string) bool {
	h := http.Header{}
	h.Add(name, value)
	var b bytes.Buffer
	if h.Write(&b) != nil {
		return false
	}
	for _, c := range name {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", c) {
			return false
		}
	}
	return !strings.ContainsAny(value, "\r\n\x00")
}
