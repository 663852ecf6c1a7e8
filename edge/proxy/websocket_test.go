package proxy

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/runspec"
	"github.com/runfleet/runfleet/tests/kit/edgetest"
)

// The frames of these tests are written and read by the helpers below,
// straight from RFC 6455 5.2, not by the proxy's own frame code, so a
// mistake there cannot hide itself.

type testFrame struct {
	fin     bool
	op      byte
	masked  bool
	payload []byte
}

// rawFrame encodes a frame; mask nil sends it unmasked. rsv sets reserved
// bits (for the malformed cases).
func rawFrame(fin bool, rsv, op byte, mask []byte, payload []byte) []byte {
	b0 := op | rsv<<4
	if fin {
		b0 |= 0x80
	}
	var m byte
	if mask != nil {
		m = 0x80
	}
	out := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		out = append(out, m|byte(n))
	case n < 1<<16:
		out = append(out, m|126, byte(n>>8), byte(n))
	default:
		out = append(out, m|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	if mask == nil {
		return append(out, payload...)
	}
	out = append(out, mask...)
	for i, c := range payload {
		out = append(out, c^mask[i%4])
	}
	return out
}

var testMask = []byte{0x37, 0xfa, 0x21, 0x3d}

func readTestFrame(br *bufio.Reader) (testFrame, error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return testFrame{}, err
	}
	f := testFrame{fin: h[0]&0x80 != 0, op: h[0] & 0x0f, masked: h[1]&0x80 != 0}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return f, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return f, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	var mask [4]byte
	if f.masked {
		if _, err := io.ReadFull(br, mask[:]); err != nil {
			return f, err
		}
	}
	f.payload = make([]byte, n)
	if _, err := io.ReadFull(br, f.payload); err != nil {
		return f, err
	}
	if f.masked {
		for i := range f.payload {
			f.payload[i] ^= mask[i%4]
		}
	}
	return f, nil
}

// closeCode is a close frame's code, 0 for none.
func (f testFrame) closeCode() int {
	if f.op != 0x8 || len(f.payload) < 2 {
		return 0
	}
	return int(binary.BigEndian.Uint16(f.payload))
}

// wsUpstream makes the fixture's upstream a WebSocket server that runs
// script on every upgraded connection (after the 101, with what the
// handshake request held). extraHeader goes into the 101.
type wsUpstream struct {
	mu         sync.Mutex
	handshakes []http.Header
	done       chan struct{}
}

func (f *fixture) wsUpstream(t *testing.T, extraHeader string, script func(r *http.Request, conn net.Conn, br *bufio.Reader)) *wsUpstream {
	u := &wsUpstream{done: make(chan struct{}, 4)}
	f.up.handler = func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.handshakes = append(u.handshakes, r.Header.Clone())
		u.mu.Unlock()
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer func() {
			conn.Close()
			u.done <- struct{}{}
		}()
		sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n%s\r\n",
			base64.StdEncoding.EncodeToString(sum[:]), extraHeader)
		script(r, conn, brw.Reader)
	}
	return u
}

// wantPolicyClose reads the task's next frame: a close with 1008 (policy
// violation), as a blocked message ends its connection.
func wantPolicyClose(t *testing.T, br *bufio.Reader) {
	t.Helper()
	fr, err := readTestFrame(br)
	must(t, err)
	if fr.closeCode() != 1008 {
		t.Fatalf("the task got op %x code %d, not a 1008 close", fr.op, fr.closeCode())
	}
}

// wsRecorder is a WebSocket upstream that records every frame it reads
// until its connection ends; what it recorded is read after wait.
func (f *fixture) wsRecorder(t *testing.T) (u *wsUpstream, got *[]testFrame, end *error) {
	got, end = new([]testFrame), new(error)
	u = f.wsUpstream(t, "", func(r *http.Request, conn net.Conn, br *bufio.Reader) {
		for {
			fr, err := readTestFrame(br)
			if err != nil {
				*end = err
				return
			}
			*got = append(*got, fr)
		}
	})
	return u, got, end
}

// wait waits for the upstream's script to end.
func (u *wsUpstream) wait(t *testing.T) {
	t.Helper()
	select {
	case <-u.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's WebSocket never ended")
	}
}

// wsDial opens an intercepted connection to target and sends a WebSocket
// handshake with the given extra fields; it returns the connection, its
// reader and the proxy's answer.
func (f *fixture) wsDial(t *testing.T, target, sni, fields string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	tc, br := f.dialIntercepted(f.proxyURL, target, sni, "http/1.1")
	t.Cleanup(func() { tc.Close() })
	_ = tc.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(tc, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n%s\r\n", target, fields)
	res, err := http.ReadResponse(br, nil)
	must(t, err)
	return tc, br, res
}

// The finding: an upstream that returns the handshake's headers in
// frames (a text frame, the same split over two fragments, a ping) shows
// the task its placeholder, never the value.
func TestWebSocketUpstreamEchoingTheHandshakeIsScrubbed(t *testing.T) {
	f := newFixture(t, "open")
	up := f.wsUpstream(t, "", func(r *http.Request, conn net.Conn, br *bufio.Reader) {
		auth := []byte(r.Header.Get("Authorization"))
		conn.Write(rawFrame(true, 0, 0x1, nil, append([]byte("you sent: "), auth...)))
		// The value split inside itself, over two fragments of one message.
		cut := len("Bearer ") + 10
		conn.Write(rawFrame(false, 0, 0x1, nil, auth[:cut]))
		conn.Write(rawFrame(true, 0, 0x0, nil, auth[cut:]))
		conn.Write(rawFrame(true, 0, 0x9, nil, auth))
		conn.Write(rawFrame(true, 0, 0x8, nil, append([]byte{0x03, 0xe8}, auth...)))
		readTestFrame(br) // the task's close
	})
	tc, br, res := f.wsDial(t, f.other, "other.example.test", "Authorization: Bearer "+f.phB+"\r\n")
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %d", res.StatusCode)
	}
	var msgs [][]byte
	var cur []byte
	for {
		fr, err := readTestFrame(br)
		must(t, err)
		if fr.masked {
			t.Fatal("a frame to the task is masked")
		}
		if fr.op == 0x8 {
			if fr.closeCode() != 1000 || string(fr.payload[2:]) != "Bearer "+f.phB {
				t.Errorf("close: code %d, reason holds the placeholder: %v", fr.closeCode(), strings.Contains(string(fr.payload), f.phB))
			}
			break
		}
		if fr.op == 0x9 {
			msgs = append(msgs, append([]byte("ping:"), fr.payload...))
			continue
		}
		cur = append(cur, fr.payload...)
		if fr.fin {
			msgs, cur = append(msgs, cur), nil
		}
	}
	tc.Write(rawFrame(true, 0, 0x8, testMask, []byte{0x03, 0xe8}))
	want := []string{"you sent: Bearer " + f.phB, "Bearer " + f.phB, "ping:Bearer " + f.phB}
	if len(msgs) != len(want) {
		t.Fatalf("%d messages, want %d", len(msgs), len(want))
	}
	for i := range want {
		if string(msgs[i]) != want[i] {
			t.Errorf("message %d: %d bytes, holds the value: %v", i, len(msgs[i]), strings.Contains(string(msgs[i]), realB))
		}
	}
	up.wait(t)
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/ws" })
	if line["action"] != "substituted" || line["status"] != float64(101) || line["scrubbed"] != float64(4) {
		t.Errorf("the connection's audit line: %v", line)
	}
}

// An upstream control frame that scrubbing makes longer than 125 bytes
// reaches the task without its payload (a close keeps its code): never
// the value, never a malformed frame.
func TestWebSocketUpstreamControlFrameTooLongOnceScrubbed(t *testing.T) {
	f := newFixture(t, "open")
	up := f.wsUpstream(t, "", func(r *http.Request, conn net.Conn, br *bufio.Reader) {
		values := strings.Repeat(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), 4)
		conn.Write(rawFrame(true, 0, 0x9, nil, []byte(values)))
		conn.Write(rawFrame(true, 0, 0x8, nil, append([]byte{0x0f, 0xa0}, values...)))
		readTestFrame(br)
	})
	tc, br, res := f.wsDial(t, f.other, "other.example.test", "Authorization: Bearer "+f.phB+"\r\n")
	if res.StatusCode != http.StatusSwitchingProtocols || 4*len(f.phB) <= 125 || 4*len(realB) > 123 {
		t.Fatalf("handshake: %d (or the fixture's lengths no longer test this)", res.StatusCode)
	}
	ping, err := readTestFrame(br)
	must(t, err)
	closing, err := readTestFrame(br)
	must(t, err)
	if ping.op != 0x9 || len(ping.payload) != 0 || closing.closeCode() != 4000 || len(closing.payload) != 2 {
		t.Errorf("ping op %x with %d bytes, close code %d with %d bytes", ping.op, len(ping.payload), closing.closeCode(), len(closing.payload))
	}
	tc.Write(rawFrame(true, 0, 0x8, testMask, []byte{0x03, 0xe8}))
	up.wait(t)
}

// A task's ping whose placeholder is allowed but whose value does not fit
// a control frame is blocked like a message: nothing of it goes upstream.
func TestWebSocketTaskControlFrameTooLongOnceSubstituted(t *testing.T) {
	uca := edgetest.NewCA(t)
	upstream := startUpstream(t, uca, false, "api.example.test")
	long := strings.Repeat("v", 120)
	e := newEnv(t, envOptions{uca: uca, pins: map[string]string{"api.example.test": "127.0.0.1"},
		keys:    fmt.Sprintf(`{"acme": {"keys": {"L": {"domains": ["api.example.test:%d"], "in": ["header", "body"]}}}}`, upstream.port),
		secrets: map[string]string{"acme/L": long}})
	u, phs := e.task("run-l", runspec.Secret{ProjectID: "acme", Key: "L"})
	f := &fixture{env: e, up: upstream, proxyURL: u, api: "api.example.test:" + itoa(upstream.port)}
	up, recorded, _ := f.wsRecorder(t)
	conn, br, res := f.wsDial(t, f.api, "api.example.test", "")
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %d", res.StatusCode)
	}
	conn.Write(rawFrame(true, 0, 0x1, testMask, []byte("fits: "+phs["L"])))
	conn.Write(rawFrame(true, 0, 0x9, testMask, []byte("0123456789"+phs["L"]))) // 130 bytes substituted
	wantPolicyClose(t, br)
	up.wait(t)
	got := *recorded
	if len(got) != 1 || string(got[0].payload) != "fits: "+long {
		t.Errorf("the upstream got %d frames, want only the message with the value", len(got))
	}
	line := e.waitAudit(func(m map[string]any) bool { return m["action"] == "blocked" })
	if !strings.Contains(fmt.Sprint(line["reason"]), "does not fit 125 bytes") {
		t.Errorf("audit: %v", line)
	}
	e.assertNoLeak(long, phs["L"])
}

// A placeholder in a task's message, split across its fragments, reaches
// the upstream as the value when the key allows the body toward the host;
// the upstream's echo comes back with the placeholder; a ping likewise.
// Extensions the task offers are not passed on.
func TestWebSocketTaskMessagesAreSubstituted(t *testing.T) {
	f := newFixture(t, "open")
	var got []testFrame
	up := f.wsUpstream(t, "", func(r *http.Request, conn net.Conn, br *bufio.Reader) {
		for {
			fr, err := readTestFrame(br)
			if err != nil {
				return
			}
			got = append(got, fr)
			switch fr.op {
			case 0x1:
				conn.Write(rawFrame(true, 0, 0x1, nil, append([]byte("echo: "), fr.payload...)))
			case 0x9:
				conn.Write(rawFrame(true, 0, 0xa, nil, fr.payload))
			case 0x8:
				conn.Write(rawFrame(true, 0, 0x8, nil, fr.payload))
				return
			}
		}
	})
	tc, br, res := f.wsDial(t, f.other, "other.example.test", "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n")
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %d", res.StatusCode)
	}
	msg := `{"key":"` + f.phB + `"}`
	cut := len(`{"key":"`) + 12
	tc.Write(rawFrame(false, 0, 0x1, testMask, []byte(msg[:cut])))
	tc.Write(rawFrame(true, 0, 0x9, testMask, []byte("between")))
	tc.Write(rawFrame(true, 0, 0x0, testMask, []byte(msg[cut:])))
	pong, err := readTestFrame(br)
	must(t, err)
	echo, err := readTestFrame(br)
	must(t, err)
	if pong.op != 0xa || string(pong.payload) != "between" {
		t.Errorf("pong: op %x %q", pong.op, pong.payload)
	}
	if echo.op != 0x1 || !echo.fin || string(echo.payload) != "echo: "+msg {
		t.Errorf("echo: op %x, holds the value: %v", echo.op, strings.Contains(string(echo.payload), realB))
	}
	tc.Write(rawFrame(true, 0, 0x9, testMask, []byte(f.phB)))
	pong, err = readTestFrame(br)
	must(t, err)
	if pong.op != 0xa || string(pong.payload) != f.phB {
		t.Errorf("pong of a ping with the placeholder: op %x, holds the value: %v", pong.op, strings.Contains(string(pong.payload), realB))
	}
	tc.Write(rawFrame(true, 0, 0x8, testMask, []byte{0x03, 0xe8}))
	closing, err := readTestFrame(br)
	must(t, err)
	if closing.closeCode() != 1000 {
		t.Errorf("close code %d", closing.closeCode())
	}
	up.wait(t)
	if len(got) != 4 || !got[1].fin || got[1].op != 0x1 || string(got[1].payload) != `{"key":"`+realB+`"}` ||
		!got[0].masked || string(got[2].payload) != realB {
		t.Errorf("the upstream got %d frames, not the ping, the message whole with the value, a ping with the value, the close", len(got))
	}
	if h := up.handshakes[0]; h.Get("Sec-WebSocket-Extensions") != "" {
		t.Errorf("the task's extension offer reached the upstream: %q", h.Get("Sec-WebSocket-Extensions"))
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/ws" })
	if line["action"] != "substituted" || fmt.Sprint(line["keys"]) != "[acme/B]" || line["scrubbed"] != float64(2) {
		t.Errorf("the connection's audit line: %v", line)
	}
}

// A placeholder whose key may not go in a body toward this host blocks
// its message: nothing of it reaches the upstream, the task gets 1008,
// the upstream's connection is closed, and the block has its audit line.
// Split across fragments, or in a control frame, alike.
func TestWebSocketMessageWithABlockedPlaceholder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		frames func(ph string) [][]byte
	}{
		{"one frame", func(ph string) [][]byte {
			return [][]byte{rawFrame(true, 0, 0x1, testMask, []byte("k="+ph))}
		}},
		{"split", func(ph string) [][]byte {
			return [][]byte{rawFrame(false, 0, 0x2, testMask, []byte("k="+ph[:9])), rawFrame(true, 0, 0x0, testMask, []byte(ph[9:]))}
		}},
		{"ping", func(ph string) [][]byte {
			return [][]byte{rawFrame(true, 0, 0x9, testMask, []byte(ph))}
		}},
		{"close reason", func(ph string) [][]byte {
			return [][]byte{rawFrame(true, 0, 0x8, testMask, append([]byte{0x03, 0xe8}, ph...))}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "open")
			up, recorded, end := f.wsRecorder(t)
			// A may go to api in a header (the handshake), not in a body.
			conn, br, res := f.wsDial(t, f.api, "api.example.test", "Authorization: Bearer "+f.phA+"\r\n")
			if res.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("handshake: %d", res.StatusCode)
			}
			conn.Write(rawFrame(true, 0, 0x1, testMask, []byte("hello")))
			for _, b := range tc.frames(f.phA) {
				conn.Write(b)
			}
			wantPolicyClose(t, br)
			up.wait(t)
			got := *recorded
			if len(got) != 1 || string(got[0].payload) != "hello" || *end == nil {
				t.Errorf("the upstream got %d frames (want only the first message), then %v", len(got), *end)
			}
			line := f.waitAudit(func(m map[string]any) bool { return m["action"] == "blocked" })
			if fmt.Sprint(line["keys"]) != "[acme/A]" || !strings.HasPrefix(fmt.Sprint(line["reason"]), "websocket message blocked") || line["path"] != "/ws" {
				t.Errorf("audit: %v", line)
			}
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := readTestFrame(br); err == nil {
				t.Error("the task's connection carried on after the block")
			}
			hs := f.waitAudit(func(m map[string]any) bool { return m["status"] == float64(101) })
			if hs["action"] != "substituted" || fmt.Sprint(hs["keys"]) != "[acme/A]" {
				t.Errorf("the handshake's line: %v", hs)
			}
		})
	}
}

// A 101 that names an extension anyway (permessage-deflate) is refused:
// its frames could not be scanned.
func TestWebSocketExtensionInTheAnswerIsRefused(t *testing.T) {
	f := newFixture(t, "open")
	up := f.wsUpstream(t, "Sec-WebSocket-Extensions: permessage-deflate\r\n", func(r *http.Request, conn net.Conn, br *bufio.Reader) {
		conn.Write(rawFrame(true, 0, 0x1, nil, []byte(r.Header.Get("Authorization"))))
		readTestFrame(br)
	})
	_, _, res := f.wsDial(t, f.other, "other.example.test", "Authorization: Bearer "+f.phB+"\r\nSec-WebSocket-Extensions: permessage-deflate\r\n")
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", res.StatusCode)
	}
	up.wait(t)
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/ws" })
	if line["action"] != "blocked" || line["status"] != float64(502) {
		t.Errorf("audit: %v", line)
	}
}

// An upgrade to anything but a WebSocket is refused before it reaches the
// upstream.
func TestOtherUpgradesAreRefused(t *testing.T) {
	f := newFixture(t, "open")
	tc, br := f.dialIntercepted(f.proxyURL, f.other, "other.example.test", "http/1.1")
	defer tc.Close()
	res, body := roundTrip(t, tc, br, "GET /h2c HTTP/1.1\r\nHost: "+f.other+"\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
	if res.StatusCode != http.StatusNotImplemented || !strings.Contains(body, "only websocket") {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	if len(f.up.requests()) != 0 {
		t.Error("the upgrade reached the upstream")
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["path"] == "/h2c" })
	if line["action"] != "blocked" || line["status"] != float64(501) {
		t.Errorf("audit: %v", line)
	}
}

// A frame stream that breaks RFC 6455 closes the connection with the code
// the RFC names: the task's frames (1002, or 1009 past the limit), the
// upstream's (the upstream gets 1002, the task 1014).
func TestWebSocketMalformedFrames(t *testing.T) {
	big := make([]byte, 8)
	binary.BigEndian.PutUint64(big, wsMaxPayload+1)
	for _, tc := range []struct {
		name     string
		fromTask bool
		frame    []byte
		taskCode int
		upCode   int
	}{
		{"task: unmasked", true, rawFrame(true, 0, 0x1, nil, []byte("hi")), 1002, 0},
		{"task: reserved bit", true, rawFrame(true, 4, 0x1, testMask, []byte("hi")), 1002, 0},
		{"task: opcode 3", true, rawFrame(true, 0, 0x3, testMask, []byte("hi")), 1002, 0},
		{"task: long ping", true, rawFrame(true, 0, 0x9, testMask, make([]byte, 126)), 1002, 0},
		{"task: fragmented ping", true, rawFrame(false, 0, 0x9, testMask, []byte("hi")), 1002, 0},
		{"task: lone continuation", true, rawFrame(true, 0, 0x0, testMask, []byte("hi")), 1002, 0},
		{"task: long length form", true, append([]byte{0x81, 0x80 | 126, 0, 5}, append(testMask, "hello"...)...), 1002, 0},
		{"task: over the limit", true, append(append([]byte{0x82, 0x80 | 127}, big...), testMask...), 1009, 0},
		{"upstream: masked", false, rawFrame(true, 0, 0x1, testMask, []byte("hi")), 1014, 1002},
		{"upstream: reserved bit", false, rawFrame(true, 2, 0x1, nil, []byte("hi")), 1014, 1002},
		{"upstream: opcode 11", false, rawFrame(true, 0, 0xb, nil, nil), 1014, 1002},
		{"upstream: new message inside one", false, append(rawFrame(false, 0, 0x1, nil, []byte("a")), rawFrame(true, 0, 0x1, nil, []byte("b"))...), 1014, 1002},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "open")
			var got []testFrame
			up := f.wsUpstream(t, "", func(r *http.Request, conn net.Conn, br *bufio.Reader) {
				if !tc.fromTask {
					conn.Write(tc.frame)
				}
				for {
					fr, err := readTestFrame(br)
					if err != nil {
						return
					}
					got = append(got, fr)
				}
			})
			conn, br, res := f.wsDial(t, f.other, "other.example.test", "")
			if res.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("handshake: %d", res.StatusCode)
			}
			if tc.fromTask {
				conn.Write(tc.frame)
			}
			var last testFrame
			for {
				fr, err := readTestFrame(br)
				if err != nil {
					break
				}
				last = fr
			}
			if last.closeCode() != tc.taskCode {
				t.Errorf("the task's last frame: op %x code %d, want code %d", last.op, last.closeCode(), tc.taskCode)
			}
			up.wait(t)
			var upCode int
			for _, fr := range got {
				if fr.op != 0x8 {
					t.Errorf("the upstream got a frame of op %x", fr.op)
				}
				upCode = fr.closeCode()
			}
			if upCode != tc.upCode {
				t.Errorf("the upstream got close code %d, want %d", upCode, tc.upCode)
			}
		})
	}
}

// FuzzWebSocketFrameReader: whatever the bytes, the reader returns frames
// within its bounds, and a frame it accepts encodes back to what it reads
// again the same.
func FuzzWebSocketFrameReader(f *testing.F) {
	f.Add(true, rawFrame(true, 0, 0x1, testMask, []byte("hello")))
	f.Add(false, rawFrame(true, 0, 0x2, nil, make([]byte, 300)))
	f.Add(false, append(rawFrame(false, 0, 0x1, nil, []byte("a")), rawFrame(true, 0, 0x0, nil, []byte("b"))...))
	f.Add(true, append(rawFrame(false, 0, 0x1, testMask, []byte("a")), append(rawFrame(true, 0, 0x9, testMask, nil), rawFrame(true, 0, 0x0, testMask, []byte("b"))...)...))
	f.Add(true, rawFrame(true, 0, 0x8, testMask, []byte{0x03, 0xe8, 'b', 'y', 'e'}))
	f.Add(false, rawFrame(true, 0, 0x1, nil, make([]byte, 70000)))
	f.Add(true, []byte{0x81, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0})
	f.Add(true, []byte{0x81, 0xfe, 0, 5, 1, 2, 3, 4, 'h', 'e', 'l', 'l', 'o'})
	f.Add(false, []byte{0xc1, 0x01, 'x'})
	f.Fuzz(func(t *testing.T, masked bool, data []byte) {
		rd := wsReader{r: bufio.NewReader(strings.NewReader(string(data))), masked: masked}
		for {
			inMsg := rd.inMsg
			fr, err := rd.next()
			if err != nil {
				return
			}
			if len(fr.payload) > wsMaxPayload || fr.control() && (!fr.fin || len(fr.payload) > wsMaxControl) {
				t.Fatalf("accepted a frame out of bounds: op %x fin %v len %d", fr.opcode, fr.fin, len(fr.payload))
			}
			again := wsReader{r: bufio.NewReader(strings.NewReader(string(appendFrame(nil, fr, masked, [4]byte{1, 2, 3, 4})))), masked: masked, inMsg: inMsg}
			back, err := again.next()
			if err != nil || back.fin != fr.fin || back.opcode != fr.opcode || string(back.payload) != string(fr.payload) {
				t.Fatalf("re-encoded frame reads back differently: %v", err)
			}
		}
	})
}

// The cap on substitutions per request holds per WebSocket message: a
// message with more placeholders than maxSubstitutions is blocked, while
// messages each within it go on however many the socket carries.
func TestWebSocketSubstitutionsAreBoundedPerMessage(t *testing.T) {
	f := newFixture(t, "open")
	up, recorded, _ := f.wsRecorder(t)
	conn, br, res := f.wsDial(t, f.other, "other.example.test", "")
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %d", res.StatusCode)
	}
	within := strings.Repeat(f.phB+" ", maxSubstitutions)
	for range 3 {
		conn.Write(rawFrame(true, 0, 0x1, testMask, []byte(within)))
	}
	conn.Write(rawFrame(true, 0, 0x1, testMask, []byte(within+f.phB)))
	wantPolicyClose(t, br)
	up.wait(t)
	got := *recorded
	if len(got) != 3 || strings.Count(string(got[2].payload), realB) != maxSubstitutions {
		t.Errorf("the upstream got %d frames, not the three messages within the cap, substituted", len(got))
	}
	line := f.waitAudit(func(m map[string]any) bool { return m["action"] == "blocked" })
	if !strings.Contains(fmt.Sprint(line["reason"]), reasonTooManySubstitutions) {
		t.Errorf("audit: %v", line)
	}
}
