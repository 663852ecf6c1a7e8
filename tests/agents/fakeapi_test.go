//go:build e2eagents

package agents

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeCA signs the fake APIs' certificates; edge's proxy trusts it through
// proxy.upstream.extraRootsFile, as it would a vendor's public CA.
type fakeCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newFakeCA(t *testing.T) *fakeCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "runfleet e2e-agents fake API CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	cert, err := x509.ParseCertificate(der)
	must(t, err)
	return &fakeCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (c *fakeCA) leaf(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	must(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// fakeRequest is what a fake API keeps of a request: never a credential.
type fakeRequest struct {
	Method, Path string
	// Authorized: the request bore the real value; Keyless: it bore no
	// key at all.
	Authorized, Keyless bool
	Status              int
}

func (r fakeRequest) String() string {
	key := "another key"
	switch {
	case r.Authorized:
		key = "the real value"
	case r.Keyless:
		key = "no key"
	}
	return fmt.Sprintf("%s %s with %s -> %d", r.Method, r.Path, key, r.Status)
}

// fakeAPI is a vendor's API as an HTTPS server on a loopback address of
// its own, port 443 (edge's proxy pins the vendor's name to that address
// and dials the CONNECT's port). It answers only requests that bear the
// real value of the key (compared in constant time, never logged or
// echoed): the proof that the proxy substituted the placeholder. Every
// answer waits until Release, so a test can read the task's environment
// while the agent waits for the model.
type fakeAPI struct {
	name string
	// credential extracts the API key from a request, as the vendor reads it.
	credential func(*http.Request) string
	// route answers an authorized request.
	route  func(w http.ResponseWriter, r *http.Request, body []byte)
	secret []byte
	srv    *http.Server

	release     chan struct{}
	releaseOnce sync.Once
	first       chan struct{}
	firstOnce   sync.Once

	mu       sync.Mutex
	requests []fakeRequest
}

// startFakeAPI serves name's API on ip:443 with a certificate from ca.
func startFakeAPI(t *testing.T, ca *fakeCA, name, ip, secret string, credential func(*http.Request) string,
	route func(http.ResponseWriter, *http.Request, []byte)) *fakeAPI {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "443"))
	must(t, err)
	f := &fakeAPI{name: name, credential: credential, route: route, secret: []byte(secret),
		release: make(chan struct{}), first: make(chan struct{})}
	f.srv = &http.Server{
		Handler:           http.HandlerFunc(f.serve),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{ca.leaf(t, name)}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go f.srv.ServeTLS(ln, "", "")
	t.Cleanup(func() {
		f.Release()
		f.srv.Close()
	})
	return f
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	f.firstOnce.Do(func() { close(f.first) })
	<-f.release
	body, _ := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	credential := f.credential(r)
	authorized := subtle.ConstantTimeCompare([]byte(credential), f.secret) == 1
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	if authorized {
		f.route(rec, r, body)
	} else {
		rec.WriteHeader(http.StatusUnauthorized)
		io.WriteString(rec, `{"error": "the credential is not the real value: the proxy did not substitute it"}`)
	}
	f.mu.Lock()
	f.requests = append(f.requests, fakeRequest{Method: r.Method, Path: r.URL.Path, Authorized: authorized, Keyless: credential == "", Status: rec.status})
	f.mu.Unlock()
}

// Requests is every request answered so far.
func (f *fakeAPI) Requests() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeRequest(nil), f.requests...)
}

// First is closed when the first request arrives (it then waits for Release).
func (f *fakeAPI) First() <-chan struct{} { return f.first }

// Release lets every request, held or to come, be answered.
func (f *fakeAPI) Release() { f.releaseOnce.Do(func() { close(f.release) }) }

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Flush() { s.ResponseWriter.(http.Flusher).Flush() }

// Unwrap lets http.ResponseController reach the connection (to hijack it).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// writeSSE writes Server-Sent Events, each named by its "type" field as
// both vendors' streams do, and flushes.
func writeSSE(w http.ResponseWriter, events ...map[string]any) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	for _, ev := range events {
		data, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev["type"], data)
	}
	w.(http.Flusher).Flush()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// anthropicCredential: the Messages API takes the key in x-api-key (an
// OAuth token would come as a bearer).
func anthropicCredential(r *http.Request) string {
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return k
	}
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// anthropicMessages is the Messages API (POST /v1/messages) answering
// answer to every request: streamed as Claude Code asks for it
// (message_start, a text block, message_delta, message_stop), or as one
// JSON message. Anything else is the API's 404.
func anthropicMessages(answer string) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
			writeJSON(w, http.StatusNotFound, map[string]any{"type": "error",
				"error": map[string]any{"type": "not_found_error", "message": "Not found"}})
			return
		}
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		json.Unmarshal(body, &req)
		usage := map[string]any{"input_tokens": 12, "output_tokens": 9, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
		message := map[string]any{"id": "msg_fake01", "type": "message", "role": "assistant", "model": req.Model,
			"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": usage}
		if !req.Stream {
			message["content"] = []any{map[string]any{"type": "text", "text": answer}}
			message["stop_reason"] = "end_turn"
			writeJSON(w, http.StatusOK, message)
			return
		}
		writeSSE(w,
			map[string]any{"type": "message_start", "message": message},
			map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}},
			map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": answer}},
			map[string]any{"type": "content_block_stop", "index": 0},
			map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil},
				"usage": map[string]any{"output_tokens": 9}},
			map[string]any{"type": "message_stop"},
		)
	}
}

// openAICredential: the OpenAI API takes the key as a bearer token.
func openAICredential(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// openAIResponses is the Responses API answering answer as one assistant
// message, on both transports Codex speaks: a WebSocket on GET
// /v1/responses (its first choice; each response.create message gets the
// response's events as text messages) and POST /v1/responses streaming SSE
// (its fallback). The events are those Codex reads: response.created,
// response.output_item.done with the message, response.completed with the
// usage; a response.create with "generate": false (a warm-up) gets no
// output item. Anything else is the API's 404.
func openAIResponses(answer string) func(http.ResponseWriter, *http.Request, []byte) {
	events := func(n int, generate bool) []map[string]any {
		id := fmt.Sprintf("resp_fake%02d", n)
		evs := []map[string]any{{"type": "response.created", "response": map[string]any{"id": id}}}
		if generate {
			evs = append(evs, map[string]any{"type": "response.output_item.done", "item": map[string]any{
				"type": "message", "role": "assistant", "id": fmt.Sprintf("msg_fake%02d", n),
				"content": []any{map[string]any{"type": "output_text", "text": answer}}}})
		}
		return append(evs, map[string]any{"type": "response.completed", "response": map[string]any{"id": id, "usage": map[string]any{
			"input_tokens": 12, "input_tokens_details": nil, "output_tokens": 9, "output_tokens_details": nil, "total_tokens": 21}}})
	}
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		switch {
		case r.URL.Path != "/v1/responses":
		case r.Method == http.MethodPost:
			writeSSE(w, events(1, true)...)
			return
		case r.Method == http.MethodGet && strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
			serveWebSocket(w, r, func(msg []byte) [][]byte {
				var req struct {
					Type     string `json:"type"`
					Generate *bool  `json:"generate"`
				}
				if json.Unmarshal(msg, &req) != nil || req.Type != "response.create" {
					return nil // response.processed and the like need no answer
				}
				var out [][]byte
				for _, ev := range events(2, req.Generate == nil || *req.Generate) {
					b, _ := json.Marshal(ev)
					out = append(out, b)
				}
				return out
			})
			return
		}
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{
			"message": "Invalid URL (" + r.Method + " " + r.URL.Path + ")", "type": "invalid_request_error", "code": nil}})
	}
}

// serveWebSocket accepts a WebSocket (RFC 6455; no extension negotiated)
// and answers each text message the client sends with the text messages
// answer returns, until the client closes.
func serveWebSocket(w http.ResponseWriter, r *http.Request, answer func([]byte) [][]byte) {
	key := r.Header.Get("Sec-WebSocket-Key")
	if key == "" {
		http.Error(w, "not a WebSocket handshake", http.StatusBadRequest)
		return
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer conn.Close()
	if s, ok := w.(*statusRecorder); ok {
		s.status = http.StatusSwitchingProtocols
	}
	fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(sum[:]))
	rw.Flush()
	var message []byte
	for {
		fin, opcode, payload, err := readFrame(rw.Reader)
		if err != nil {
			return
		}
		switch opcode {
		case 0x0, 0x1, 0x2: // continuation, text, binary
			message = append(message, payload...)
			if !fin {
				continue
			}
			for _, out := range answer(message) {
				writeFrame(rw.Writer, 0x1, out)
			}
			message = nil
		case 0x8: // close: echo it
			writeFrame(rw.Writer, 0x8, payload)
			rw.Flush()
			return
		case 0x9: // ping
			writeFrame(rw.Writer, 0xA, payload)
		}
		if rw.Flush() != nil {
			return
		}
	}
}

// readFrame reads one client frame, unmasking its payload.
func readFrame(r *bufio.Reader) (fin bool, opcode byte, payload []byte, err error) {
	var head [2]byte
	if _, err = io.ReadFull(r, head[:]); err != nil {
		return
	}
	fin, opcode = head[0]&0x80 != 0, head[0]&0x0F
	n := uint64(head[1] & 0x7F)
	switch n {
	case 126:
		var b [2]byte
		_, err = io.ReadFull(r, b[:])
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		_, err = io.ReadFull(r, b[:])
		n = binary.BigEndian.Uint64(b[:])
	}
	if err != nil {
		return
	}
	if n > 16<<20 {
		return false, 0, nil, fmt.Errorf("a frame of %d bytes", n)
	}
	var mask [4]byte
	masked := head[1]&0x80 != 0
	if masked {
		if _, err = io.ReadFull(r, mask[:]); err != nil {
			return
		}
	}
	payload = make([]byte, n)
	if _, err = io.ReadFull(r, payload); err != nil {
		return
	}
	if masked {
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
	}
	return
}

// writeFrame writes one unfragmented, unmasked server frame.
func writeFrame(w *bufio.Writer, opcode byte, payload []byte) {
	w.WriteByte(0x80 | opcode)
	switch n := len(payload); {
	case n < 126:
		w.WriteByte(byte(n))
	case n <= 0xFFFF:
		w.WriteByte(126)
		binary.Write(w, binary.BigEndian, uint16(n))
	default:
		w.WriteByte(127)
		binary.Write(w, binary.BigEndian, uint64(n))
	}
	w.Write(payload)
}
