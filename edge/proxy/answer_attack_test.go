package proxy

import (
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
	"github.com/runfleet/runfleet/tests/kit/leakcheck"
)

// Issue 27's red team, as regression tests: a task, with real clients over
// HTTP/1.1 and HTTP/2 (and WebSocket), against upstreams its keys may reach
// that echo, quote, store and re-encode what they were sent. Whatever the
// upstream does, the task gets its placeholder or a scrubbed answer, never
// a real value in any form (leakcheck reads what it got as the task
// would), and the answer still arrives: its status and the rest of its
// body, so that no test passes by the proxy breaking everything.

// attackKey is one key of an attack rig: the name it reaches, the
// locations it may be put in, its placeholders' prefix (none: the default
// shape) and its real value.
type attackKey struct {
	key, host string
	in        []string
	prefix    string
	value     string
}

// real is the key's value as leakcheck looks for it: its secret part is
// what follows the placeholders' prefix when the value starts with it
// (sk_live_... keeps its sk_live_ public), else all of it.
func (k attackKey) real() leakcheck.Real {
	r := leakcheck.Real{Key: k.key, Value: k.value, Fragment: leakcheck.Bound}
	if k.prefix != "" && strings.HasPrefix(k.value, k.prefix) {
		r.Public = len(k.prefix)
	}
	return r
}

// tunnelHost is a name the rig's upstream answers as that no key reaches:
// under egress open the proxy tunnels it today.
const tunnelHost = "third.example.test"

// attackRig is one HTTPS upstream on loopback answering as every key's
// host and tunnelHost (all pinned to 127.0.0.1) with the test's handler,
// and one task holding every key, under egress open.
type attackRig struct {
	*fixture // env and proxyURL; its up is unused (see attackUpstream)
	up       *attackUpstream
	ph       map[string]string // placeholders, by key
}

// attackUpstream is the rig's HTTPS server. Unlike testUpstream it hands
// its handler the request body (kept in got as well), which an echoing or
// storing upstream needs; an Upgrade request goes to the handler as it
// came (not kept).
type attackUpstream struct {
	port int
	mu   sync.Mutex
	got  []seen
}

func (u *attackUpstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.got)
}

func newAttackRig(t *testing.T, handler http.HandlerFunc, keys ...attackKey) *attackRig {
	t.Helper()
	uca := edgetest.NewCA(t)
	names := []string{tunnelHost}
	pins := map[string]string{tunnelHost: "127.0.0.1"}
	for _, k := range keys {
		if !slices.Contains(names, k.host) {
			names = append(names, k.host)
		}
		pins[k.host] = "127.0.0.1"
	}
	up := &attackUpstream{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			up.mu.Lock()
			up.got = append(up.got, seen{Method: r.Method, Host: r.Host, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: body, Proto: r.Proto})
			up.mu.Unlock()
		}
		handler(w, r)
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{uca.Certificate(t, names...)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	up.port = srv.Listener.Addr().(*net.TCPAddr).Port

	policyKeys := map[string]any{}
	secretValues := map[string]string{}
	var declared []runspec.Secret
	var leakable []string
	for _, k := range keys {
		kp := map[string]any{"domains": []string{k.host + ":" + itoa(up.port)}, "in": k.in}
		if k.prefix != "" {
			kp["placeholder"] = map[string]any{"prefix": k.prefix, "length": 48}
		}
		policyKeys[k.key] = kp
		secretValues["acme/"+k.key] = k.value
		declared = append(declared, runspec.Secret{ProjectID: "acme", Key: k.key})
		leakable = append(leakable, k.value)
	}
	policy, err := json.Marshal(map[string]any{"acme": map[string]any{"keys": policyKeys}})
	must(t, err)
	e := newEnv(t, envOptions{egress: "open", uca: uca, pins: pins, keys: string(policy), secrets: secretValues})
	u, phs := e.task("run-attack", declared...)
	for _, ph := range phs {
		leakable = append(leakable, ph)
	}
	t.Cleanup(func() { e.assertNoLeak(leakable...) })
	return &attackRig{fixture: &fixture{env: e, proxyURL: u}, up: up, ph: phs}
}

// addr is host:port of the rig's upstream as host.
func (r *attackRig) addr(host string) string { return host + ":" + itoa(r.up.port) }

// do sends req with client, checks it was answered over the protocol the
// client speaks, and returns the response and its whole body.
func do(t *testing.T, client *http.Client, req *http.Request, h2 bool) (*http.Response, []byte) {
	t.Helper()
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", req.Method, req.URL.Path, err)
	}
	if want := map[bool]int{false: 1, true: 2}[h2]; res.ProtoMajor != want {
		t.Fatalf("%s %s: answered over HTTP/%d, want HTTP/%d", req.Method, req.URL.Path, res.ProtoMajor, want)
	}
	return res, body
}

func newRequest(t *testing.T, method, rawURL, body string) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, rawURL, rd)
	must(t, err)
	return req
}

// Re-encoded echo. The proxy decodes a task's Basic credentials, puts the
// value in and encodes them again; an upstream that echoes the
// Authorization it got (in its body, a field, and re-encoded URL-safe as a
// session token would be) hands back base64(user:value). With users of 1,
// 2 and 3 characters the value stands at each of the three base64
// alignments.
func TestAnswerAttackReencodedBasicEcho(t *testing.T) {
	key := attackKey{key: "BASIC", host: "basic.example.test", in: []string{"header"}, prefix: "bs_",
		value: "bs_" + randomText(11, alnum+"-_.", 37)}
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
				auth := req.Header.Get("Authorization")
				user, pass, _ := req.BasicAuth()
				w.Header().Set("X-Echo", auth)
				fmt.Fprintf(w, "you sent: %s\nsession: %s\nend\n", auth, base64.RawURLEncoding.EncodeToString([]byte(user+":"+pass)))
			}, key)
			client := r.goClient(r.proxyURL, h2)
			for _, user := range []string{"u", "us", "usr"} {
				req := newRequest(t, http.MethodGet, "https://"+r.addr(key.host)+"/me", "")
				req.SetBasicAuth(user, r.ph[key.key])
				res, body := do(t, client, req, h2)
				if res.StatusCode != http.StatusOK || !bytes.HasPrefix(body, []byte("you sent: Basic ")) ||
					!bytes.HasSuffix(body, []byte("\nend\n")) || !strings.HasPrefix(res.Header.Get("X-Echo"), "Basic ") {
					t.Errorf("user %q: the answer did not arrive whole: %d, %d bytes", user, res.StatusCode, len(body))
				}
				leakcheck.AssertClean(t, "user "+user, answerText(res, body), key.real())
			}
			got := r.up.requests()
			for _, g := range got {
				if _, pass, ok := (&http.Request{Header: g.Header}).BasicAuth(); !ok || pass != key.value {
					t.Fatal("the upstream did not get the real value in the Basic credentials: the attack tests nothing")
				}
			}
			if len(got) != 3 {
				t.Fatalf("the upstream got %d requests, want 3", len(got))
			}
		})
	}
}

// Escaped echo. A key allowed in the URL is put in the path (path-escaped)
// and the query (query-escaped); its value holds characters escaping
// changes. An upstream echoes its request target: in a 404 page (as sent,
// with its escapes in lower case, and decoded), in a redirect's Location,
// and in "bad request: GET /...".
func TestAnswerAttackEscapedEcho(t *testing.T) {
	key := attackKey{key: "URLKEY", host: "url.example.test", in: []string{"url"},
		value: "Zq/7+Kx=Lm 4&Rt/9+Wv=Np%2&Hs/5+Jc=Bd?e#Q"}
	handler := func(w http.ResponseWriter, req *http.Request) {
		target := req.RequestURI
		switch {
		case strings.HasPrefix(req.URL.Path, "/missing/"):
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, "404 page not found: %s\nnormalised: %s\npath: %s\nkey: %s\nend\n",
				target, lowerEscapes(target), req.URL.Path, req.URL.Query().Get("key"))
		case strings.HasPrefix(req.URL.Path, "/moved/"):
			w.Header().Set("Location", "https://"+req.Host+req.URL.EscapedPath()+"/?"+req.URL.RawQuery)
			w.Header().Set("Content-Location", lowerEscapes(target))
			w.WriteHeader(http.StatusFound)
			fmt.Fprintf(w, "moved: %s/\nend\n", target)
		default:
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, "bad request: %s %s %s\nend\n", req.Method, target, req.Proto)
		}
	}
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			r := newAttackRig(t, handler, key)
			client := r.goClient(r.proxyURL, h2)
			client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
			ph := r.ph[key.key]
			for _, c := range []struct {
				path   string
				status int
				start  string
			}{
				{"/missing/", http.StatusNotFound, "404 page not found: /missing/"},
				{"/moved/", http.StatusFound, "moved: /moved/"},
				{"/bad/", http.StatusBadRequest, "bad request: GET /bad/"},
			} {
				req := newRequest(t, http.MethodGet, "https://"+r.addr(key.host)+c.path+ph+"/info?key="+ph+"&page=2", "")
				res, body := do(t, client, req, h2)
				if res.StatusCode != c.status || !bytes.HasPrefix(body, []byte(c.start)) || !bytes.HasSuffix(body, []byte("\nend\n")) ||
					(c.status == http.StatusFound && res.Header.Get("Location") == "") {
					t.Errorf("%s: the answer did not arrive whole: %d, %d bytes", c.path, res.StatusCode, len(body))
				}
				leakcheck.AssertClean(t, c.path, answerText(res, body), key.real())
			}
			got := r.up.requests()
			if len(got) != 3 {
				t.Fatalf("the upstream got %d requests, want 3", len(got))
			}
			for _, g := range got {
				q, _ := url.ParseQuery(g.RawQuery)
				if !strings.Contains(g.Path, key.value) || q.Get("key") != key.value {
					t.Fatal("the upstream did not get the real value in the path and the query: the attack tests nothing")
				}
			}
		})
	}
}

// Partial echo, then the scrubber as an oracle. An upstream quotes the
// credential it got cut short (all but its last character; its first 20
// characters): the task must not get 12 consecutive bytes of its secret
// part. Then the attack that confirms the rest: for each of the 62 letters
// and digits the last character can be, the task sends what it learned and
// the candidate to an echoing upstream (in the body, with no placeholder;
// and again with its placeholder in the request, which today arms the
// scrubber for the value). Every echo must be scrubbed alike: none of the
// 62 answers may differ from the others but by the candidate it echoes, so
// the attack learns nothing.
func TestAnswerAttackPartialEchoOracle(t *testing.T) {
	key := attackKey{key: "TOKEN", host: "oracle.example.test", in: []string{"header"}, prefix: "tok_",
		value: "tok_" + randomText(13, alnum, 36)}
	handler := func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/whoami":
			cred := strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
			if len(cred) < 21 {
				http.Error(w, "no key", http.StatusUnauthorized)
				return
			}
			w.Header().Set("X-Key-Hint", cred[:20])
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, "error: key %s is revoked\nhint: your key starts %s\nend\n", cred[:len(cred)-1], cred[:20])
		case "/echo":
			body, _ := io.ReadAll(req.Body)
			fmt.Fprintf(w, "you said: %s\nend\n", body)
		}
	}
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			r := newAttackRig(t, handler, key)
			client := r.goClient(r.proxyURL, h2)
			ph := r.ph[key.key]
			base := "https://" + r.addr(key.host)

			req := newRequest(t, http.MethodGet, base+"/whoami", "")
			req.Header.Set("Authorization", "Bearer "+ph)
			res, body := do(t, client, req, h2)
			before, rest, ok := strings.Cut(string(body), "error: key ")
			learned, _, ok2 := strings.Cut(rest, " is revoked\n")
			if res.StatusCode != http.StatusUnauthorized || before != "" || !ok || !ok2 || !bytes.HasSuffix(body, []byte("\nend\n")) {
				t.Fatalf("the quoting answer did not arrive whole: %d, %d bytes", res.StatusCode, len(body))
			}
			if g := r.up.requests(); len(g) != 1 || g[0].Header.Get("Authorization") != "Bearer "+key.value {
				t.Fatal("the upstream did not get the real value: the attack tests nothing")
			}
			leakcheck.AssertClean(t, "the quoted credential", answerText(res, body), key.real())
			// What the task learned, less its own placeholder, whole or
			// all but its last character at the end (worthless; and a
			// guess that completed it would be refused in a body, which
			// tells nothing of the value).
			learned = strings.TrimSuffix(strings.ReplaceAll(learned, ph, ""), ph[:len(ph)-1])

			for _, armed := range []bool{false, true} {
				kinds := map[string][]byte{} // answers told apart, and their candidates
				holding, first := 0, ""
				for i := range len(alnum) {
					guess := "guess=" + learned + alnum[i:i+1] + ";"
					req := newRequest(t, http.MethodPost, base+"/echo", guess)
					if armed {
						req.Header.Set("Authorization", "Bearer "+ph)
					}
					res, body := do(t, client, req, h2)
					if res.StatusCode != http.StatusOK || !bytes.HasPrefix(body, []byte("you said: ")) || !bytes.HasSuffix(body, []byte("\nend\n")) {
						t.Fatalf("armed=%v: an echo did not arrive whole: %d, %d bytes", armed, res.StatusCode, len(body))
					}
					if found := leakcheck.Find(answerText(res, body), key.real()); len(found) > 0 {
						if holding++; first == "" {
							first = strings.Join(found, "; ")
						}
					}
					// The answer as the attacker compares them: its echo
					// of this guess (if unchanged) made the same for all.
					h := res.Header.Clone()
					h.Del("Date")
					var kind bytes.Buffer
					fmt.Fprintf(&kind, "%d\n", res.StatusCode)
					h.Write(&kind)
					kind.Write(bytes.Replace(body, []byte(guess), []byte("<the guess>"), 1))
					kinds[kind.String()] = append(kinds[kind.String()], alnum[i])
				}
				if holding > 0 {
					t.Errorf("armed=%v: %d of the 62 echoes gave the task the real value, e.g. %s", armed, holding, first)
				}
				if len(kinds) != 1 {
					sizes := []int{}
					for _, cs := range kinds {
						sizes = append(sizes, len(cs))
					}
					slices.Sort(sizes)
					t.Errorf("armed=%v: the 62 guesses' echoes come back in %d kinds (of %v guesses): the scrubber tells candidates apart", armed, len(kinds), sizes)
				}
			}
		})
	}
}

// notesUpstream stores what is POSTed to /notes and returns the latest
// note to a GET of /notes/latest, under every name it answers as (as text
// and in JSON), and over a WebSocket to an Upgrade (the note as one message,
// then split inside itself over two fragments of another).
func notesUpstream(t *testing.T) (http.HandlerFunc, func() []string) {
	var mu sync.Mutex
	var notes []string
	latest := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(notes) == 0 {
			return ""
		}
		return notes[len(notes)-1]
	}
	handler := func(w http.ResponseWriter, req *http.Request) {
		switch {
		case req.Header.Get("Upgrade") == "websocket":
			serveNoteOverWebSocket(t, w, req, latest())
		case req.Method == http.MethodPost && req.URL.Path == "/notes":
			body, _ := io.ReadAll(req.Body)
			mu.Lock()
			notes = append(notes, string(body))
			n := len(notes)
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "stored note %d\n", n)
		case req.URL.Path == "/notes/latest":
			note := latest()
			doc, _ := json.Marshal(map[string]string{"note": note, "via": req.Host})
			fmt.Fprintf(w, "note: %s\n%s\nend\n", note, doc)
		default:
			http.NotFound(w, req)
		}
	}
	return handler, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(notes)
	}
}

// serveNoteOverWebSocket answers an Upgrade with a 101 and sends note over
// the WebSocket (frames written as websocket_test.go's are), then a close,
// and waits for the task's.
func serveNoteOverWebSocket(t *testing.T, w http.ResponseWriter, req *http.Request, note string) {
	conn, brw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	sum := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(sum[:]))
	msg := []byte("note: " + note)
	conn.Write(rawFrame(true, 0, 0x1, nil, msg))
	cut := len(msg) / 2
	conn.Write(rawFrame(false, 0, 0x1, nil, msg[:cut]))
	conn.Write(rawFrame(true, 0, 0x0, nil, msg[cut:]))
	conn.Write(rawFrame(true, 0, 0x8, nil, []byte{0x03, 0xe8}))
	readTestFrame(brw.Reader) // the task's close
}

// Store, then fetch. A key allowed in the body is put into a note an
// upstream stores; a later request that carries no placeholder fetches it
// back: on the same HTTP/1.1 connection or another HTTP/2 stream of the
// same connection, on another connection, through another granted domain
// of the task (another key's, answered by the same service), and through a
// name no key reaches, which egress open tunnels today (there the proxy
// may refuse instead: then the task gets nothing, which is fine).
func TestAnswerAttackStoreThenFetch(t *testing.T) {
	note := attackKey{key: "NOTE", host: "notes.example.test", in: []string{"body"}, prefix: "nt_",
		value: "nt_" + randomText(21, alnum+"-_.~", 37)}
	feed := attackKey{key: "FEED", host: "feed.example.test", in: []string{"header"}, value: randomText(22, alnum, 40)}
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			handler, stored := notesUpstream(t)
			r := newAttackRig(t, handler, note, feed)
			notes := r.addr(note.host)
			post := "remember: " + r.ph[note.key] + "\n"
			fetched := func(t *testing.T, res *http.Response, body []byte) {
				t.Helper()
				if res.StatusCode != http.StatusOK || !bytes.HasPrefix(body, []byte("note: remember: ")) || !bytes.HasSuffix(body, []byte("\nend\n")) {
					t.Errorf("the fetch did not arrive whole: %d, %d bytes", res.StatusCode, len(body))
				}
				leakcheck.AssertClean(t, "the fetched note", answerText(res, body), note.real())
			}

			// The store, and the fetch on the same connection.
			var sameConn func(t *testing.T)
			if !h2 {
				tc, br := r.dialIntercepted(r.proxyURL, notes, note.host, "http/1.1")
				t.Cleanup(func() { tc.Close() })
				_ = tc.SetDeadline(time.Now().Add(20 * time.Second))
				res, body := roundTrip(t, tc, br, fmt.Sprintf("POST /notes HTTP/1.1\r\nHost: %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", notes, len(post), post))
				if res.StatusCode != http.StatusCreated {
					t.Fatalf("the store: %d %q", res.StatusCode, body)
				}
				sameConn = func(t *testing.T) {
					res, body := roundTrip(t, tc, br, "GET /notes/latest HTTP/1.1\r\nHost: "+notes+"\r\n\r\n")
					fetched(t, res, []byte(body))
				}
			} else {
				client := r.goClient(r.proxyURL, true)
				res, body := do(t, client, newRequest(t, http.MethodPost, "https://"+notes+"/notes", post), true)
				if res.StatusCode != http.StatusCreated {
					t.Fatalf("the store: %d %q", res.StatusCode, body)
				}
				sameConn = func(t *testing.T) {
					var reused atomic.Bool
					trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused.Store(i.Reused) }}
					req := newRequest(t, http.MethodGet, "https://"+notes+"/notes/latest", "")
					req = req.WithContext(httptrace.WithClientTrace(context.Background(), trace))
					res, body := do(t, client, req, true)
					if !reused.Load() {
						t.Error("the fetch went on another connection, not another stream")
					}
					fetched(t, res, body)
				}
			}
			if s := stored(); len(s) != 1 || !strings.Contains(s[0], note.value) {
				t.Fatal("the upstream did not store the real value: the attack tests nothing")
			}

			t.Run("same connection", sameConn)
			t.Run("another connection", func(t *testing.T) {
				res, body := do(t, r.goClient(r.proxyURL, h2), newRequest(t, http.MethodGet, "https://"+notes+"/notes/latest", ""), h2)
				fetched(t, res, body)
			})
			t.Run("another granted domain", func(t *testing.T) {
				res, body := do(t, r.goClient(r.proxyURL, h2), newRequest(t, http.MethodGet, "https://"+r.addr(feed.host)+"/notes/latest", ""), h2)
				fetched(t, res, body)
			})
			t.Run("a name no key reaches", func(t *testing.T) {
				// A task's client trusts the proxy's CA and the public
				// roots (here the upstream's test CA).
				pool := x509.NewCertPool()
				pool.AppendCertsFromPEM(r.authority.Bundle())
				pool.AppendCertsFromPEM(r.uca.PEM)
				client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
					Proxy: http.ProxyURL(r.proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: h2,
				}}
				res, err := client.Get("https://" + r.addr(tunnelHost) + "/notes/latest")
				if err != nil {
					t.Logf("refused: %v", err)
					return
				}
				body, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil {
					t.Logf("cut short: %v", err)
				}
				leakcheck.AssertClean(t, "the note fetched through "+tunnelHost, answerText(res, body), note.real())
			})
		})
	}
}

// Store, then fetch over a WebSocket: the upstream sends the stored note
// as WebSocket messages (whole, and split inside itself over two
// fragments), to a connection whose handshake and messages carried no
// placeholder, through the key's own domain and through another granted
// domain.
func TestAnswerAttackStoreThenFetchOverWebSocket(t *testing.T) {
	note := attackKey{key: "NOTE", host: "notes.example.test", in: []string{"body"}, prefix: "nt_",
		value: "nt_" + randomText(23, alnum+"-_.~", 37)}
	feed := attackKey{key: "FEED", host: "feed.example.test", in: []string{"header"}, value: randomText(24, alnum, 40)}
	handler, stored := notesUpstream(t)
	r := newAttackRig(t, handler, note, feed)
	res, body := do(t, r.goClient(r.proxyURL, false), newRequest(t, http.MethodPost, "https://"+r.addr(note.host)+"/notes", "remember: "+r.ph[note.key]), false)
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("the store: %d %q", res.StatusCode, body)
	}
	if s := stored(); len(s) != 1 || !strings.Contains(s[0], note.value) {
		t.Fatal("the upstream did not store the real value: the attack tests nothing")
	}
	for _, host := range []string{note.host, feed.host} {
		t.Run(host, func(t *testing.T) {
			tc, br, res := r.wsDial(t, r.addr(host), host, "")
			if res.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("handshake: %d", res.StatusCode)
			}
			var msgs [][]byte
			var cur []byte
			closed := 0
			for closed == 0 {
				fr, err := readTestFrame(br)
				if err != nil {
					t.Fatalf("reading the upstream's messages: %v", err)
				}
				switch fr.op {
				case 0x8:
					closed = fr.closeCode()
				case 0x1, 0x0:
					if cur = append(cur, fr.payload...); fr.fin {
						msgs, cur = append(msgs, cur), nil
					}
				}
			}
			tc.Write(rawFrame(true, 0, 0x8, testMask, []byte{0x03, 0xe8}))
			if len(msgs) != 2 || closed != 1000 {
				t.Fatalf("%d messages and a close %d, want 2 and 1000", len(msgs), closed)
			}
			for i, m := range msgs {
				if !bytes.HasPrefix(m, []byte("note: remember: ")) {
					t.Errorf("message %d did not arrive whole (%d bytes)", i, len(m))
				}
				leakcheck.AssertClean(t, fmt.Sprintf("message %d", i), m, note.real())
			}
		})
	}
}

// formLines is how the upstream of TestAnswerAttackEveryFormAcrossBoundaries
// writes the value v (named name) in every form of issue 27, each on a
// line of its own with a label, inside the text an upstream would have
// around it (so base64 stands at each alignment of its stream), and three
// fragments of it (20 bytes: literal, base64, hex). It is written apart
// from leakcheck.Forms on purpose: the same code writing and checking
// could hide a mistake.
func formLines(name, v string) [][2]string {
	pre := "~~"
	var lines [][2]string
	add := func(label, text string) { lines = append(lines, [2]string{name + " " + label, text}) }
	add("literal", v)
	for p := range 3 {
		stream := []byte(pre[:p] + v + "!")
		add(fmt.Sprintf("base64/%d", p), base64.StdEncoding.EncodeToString(stream))
		add(fmt.Sprintf("base64url/%d", p), base64.URLEncoding.EncodeToString(stream))
		add(fmt.Sprintf("base64url-raw/%d", p), base64.RawURLEncoding.EncodeToString(stream))
	}
	add("basic", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:"+v)))
	add("hex", hex.EncodeToString([]byte(v)))
	add("HEX", strings.ToUpper(hex.EncodeToString([]byte(v))))
	var upper, lower, uLower, uUpper strings.Builder
	for _, c := range []byte(v) {
		fmt.Fprintf(&upper, "%%%02X", c)
		fmt.Fprintf(&lower, "%%%02x", c)
		fmt.Fprintf(&uLower, `\u%04x`, c)
		fmt.Fprintf(&uUpper, `\u%04X`, c)
	}
	add("percent", upper.String())
	add("percent-lower", lower.String())
	add("query", url.QueryEscape(v))
	add("form", url.Values{"v": {v}}.Encode())
	add("path", url.PathEscape(v))
	doc, _ := json.Marshal(map[string]string{"v": v})
	add("json", string(doc))
	var raw bytes.Buffer
	enc := json.NewEncoder(&raw)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(map[string]string{"v": v})
	add("json-raw", strings.TrimSpace(raw.String()))
	add(`\u00xx`, `"`+uLower.String()+`"`)
	add(`\u00XX`, `"`+uUpper.String()+`"`)
	if strings.Trim(v, "0123456789abcdefABCDEF") == "" {
		add("upper", strings.ToUpper(v))
		add("lower", strings.ToLower(v))
	}
	if len(v) >= 30 {
		add("fragment", v[3:23])
		add("fragment-base64", base64.StdEncoding.EncodeToString([]byte(v[5:25])))
		add("fragment-hex", hex.EncodeToString([]byte(v[10:30])))
	}
	return lines
}

// byteFlusher writes one byte at a time, each flushed: one chunk per byte
// (the proxy reads its upstreams over HTTP/1.1).
type byteFlusher struct {
	w  io.Writer
	rc *http.ResponseController
}

func (b byteFlusher) Write(p []byte) (int, error) {
	for i := range p {
		if _, err := b.w.Write(p[i : i+1]); err != nil {
			return i, err
		}
		if err := b.rc.Flush(); err != nil {
			return i, err
		}
	}
	return len(p), nil
}

// Every form echoed across chunk and frame boundaries. A task puts two
// values into a body (one of 40 characters drawn with quotes, slashes,
// escapes, spaces and a tab among them; one hex-like); the upstream writes
// each in every form of issue 27 one byte per chunk (the proxy reads its
// upstreams over HTTP/1.1: a chunked answer of one-byte chunks), and the
// task reads the answer over HTTP/1.1 (chunked) and HTTP/2 (DATA frames).
// The task never gets a form, nor a 12-byte run of one, and every line
// still arrives.
func TestAnswerAttackEveryFormAcrossBoundaries(t *testing.T) {
	special := attackKey{key: "SPECIAL", host: "forms.example.test", in: []string{"body"},
		value: randomText(31, alnum+`/+=&% "\<>'?#{}:;,`+"\t", 36) + `"/\ `}
	hexKey := attackKey{key: "HEXKEY", host: "forms.example.test", in: []string{"body"}, value: randomText(32, "0123456789abcdef", 40)}
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			var mu sync.Mutex
			var received [][]string
			handler := func(w http.ResponseWriter, req *http.Request) {
				body, _ := io.ReadAll(req.Body)
				parts := strings.Split(string(body), "\n")
				if len(parts) < 4 {
					http.Error(w, "want name\\nvalue\\nname\\nvalue", http.StatusBadRequest)
					return
				}
				mu.Lock()
				received = append(received, parts)
				mu.Unlock()
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusOK)
				rc := http.NewResponseController(w)
				out := byteFlusher{w, rc}
				for _, nv := range [][2]string{{parts[0], parts[1]}, {parts[2], parts[3]}} {
					for _, l := range formLines(nv[0], nv[1]) {
						fmt.Fprintf(out, "%s: %s\n", l[0], l[1])
					}
				}
				io.WriteString(out, "end\n")
			}
			r := newAttackRig(t, handler, special, hexKey)
			post := "SPECIAL\n" + r.ph[special.key] + "\nHEXKEY\n" + r.ph[hexKey.key] + "\n"
			res, body := do(t, r.goClient(r.proxyURL, h2), newRequest(t, http.MethodPost, "https://"+r.addr(special.host)+"/forms", post), h2)
			mu.Lock()
			got := slices.Clone(received)
			mu.Unlock()
			if len(got) != 1 || got[0][1] != special.value || got[0][3] != hexKey.value {
				t.Fatal("the upstream did not get the real values: the attack tests nothing")
			}
			if res.StatusCode != http.StatusOK || !bytes.HasSuffix(body, []byte("\nend\n")) {
				t.Errorf("the answer did not arrive whole: %d, %d bytes", res.StatusCode, len(body))
			}
			lines := map[string]string{}
			for _, l := range strings.Split(string(body), "\n") {
				label, text, _ := strings.Cut(l, ": ")
				lines[label] = text
			}
			for _, k := range []attackKey{special, hexKey} {
				written := formLines(k.key, k.value)
				var leaked []string
				example := ""
				for _, l := range written {
					text, ok := lines[l[0]]
					if !ok {
						t.Errorf("the line %q did not arrive", l[0])
						continue
					}
					if found := leakcheck.Find([]byte(text), k.real()); len(found) > 0 {
						leaked = append(leaked, strings.TrimPrefix(l[0], k.key+" "))
						if example == "" {
							example = l[0] + ": " + strings.Join(found, "; ")
						}
					}
				}
				if len(leaked) > 0 {
					t.Errorf("%s: %d of the %d forms written reached the task: %s (e.g. %s)", k.key, len(leaked), len(written), strings.Join(leaked, ", "), example)
					continue
				}
				leakcheck.AssertClean(t, "the whole answer", answerText(res, body), k.real())
			}
		})
	}
}

// answerText is what a task's client received: the status line, the
// fields, the body and the trailers, as one text to search.
func answerText(res *http.Response, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s\n", res.Proto, res.Status)
	res.Header.Write(&b)
	b.Write(body)
	res.Trailer.Write(&b)
	return b.Bytes()
}

// randomText draws n characters of alphabet from a fixed seed: the values
// are the same on every run, so a failure can be reproduced.
func randomText(seed uint64, alphabet string, n int) string {
	r := rand.New(rand.NewPCG(seed, 27))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

var escapeHex = regexp.MustCompile(`%[0-9A-F]{2}`)

// lowerEscapes writes the %XX escapes of s in lower case, as an upstream
// that normalises a request target does.
func lowerEscapes(s string) string { return escapeHex.ReplaceAllStringFunc(s, strings.ToLower) }
