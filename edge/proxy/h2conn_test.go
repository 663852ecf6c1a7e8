package proxy

import (
	"bytes"
	"io"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// A SETTINGS frame naming a parameter twice reaches x/net with the last
// value of each, in the order of their last occurrence; one without
// duplicates, or with a value x/net refuses, is passed as it is.
func TestDedupSettingsKeepsTheLastValueOfEach(t *testing.T) {
	frame := func(stream uint32, settings ...http2.Setting) []byte {
		var payload, b bytes.Buffer
		must(t, http2.NewFramer(&payload, nil).WriteSettings(settings...))
		must(t, http2.NewFramer(&b, nil).WriteRawFrame(http2.FrameSettings, 0, stream, payload.Bytes()[9:]))
		return b.Bytes()
	}
	window, push, size := http2.SettingInitialWindowSize, http2.SettingEnablePush, http2.SettingMaxFrameSize
	for _, c := range []struct {
		name     string
		in, want []byte
	}{
		{"two window sizes", frame(0, http2.Setting{ID: window, Val: 100}, http2.Setting{ID: window, Val: 1}),
			frame(0, http2.Setting{ID: window, Val: 1})},
		{"interleaved", frame(0, http2.Setting{ID: window, Val: 100}, http2.Setting{ID: push, Val: 0}, http2.Setting{ID: window, Val: 7}, http2.Setting{ID: push, Val: 1}),
			frame(0, http2.Setting{ID: window, Val: 7}, http2.Setting{ID: push, Val: 1})},
		{"no duplicate", frame(0, http2.Setting{ID: window, Val: 100}, http2.Setting{ID: push, Val: 0}),
			frame(0, http2.Setting{ID: window, Val: 100}, http2.Setting{ID: push, Val: 0})},
		{"an invalid value", frame(0, http2.Setting{ID: size, Val: 1}, http2.Setting{ID: size, Val: 16384}),
			frame(0, http2.Setting{ID: size, Val: 1}, http2.Setting{ID: size, Val: 16384})},
		{"on a stream", frame(1, http2.Setting{ID: window, Val: 1}, http2.Setting{ID: window, Val: 2}),
			frame(1, http2.Setting{ID: window, Val: 1}, http2.Setting{ID: window, Val: 2})},
	} {
		if got := dedupSettings(append([]byte(nil), c.in...)); !bytes.Equal(got, c.want) {
			t.Errorf("%s: % x, want % x", c.name, got, c.want)
		}
	}
}

// FuzzH2Inbound: whatever a task sends, h2Inbound hands x/net whole frames
// (each header's length matching what follows it), ending on a frame's
// boundary exactly when the task's bytes did, however they are read.
func FuzzH2Inbound(f *testing.F) {
	block := func(fields ...string) []byte {
		var b bytes.Buffer
		enc := hpack.NewEncoder(&b)
		for i := 0; i+1 < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return b.Bytes()
	}
	frames := func(write func(fr *http2.Framer)) []byte {
		var b bytes.Buffer
		write(http2.NewFramer(&b, nil))
		return b.Bytes()
	}
	req := block(":method", "GET", ":scheme", "https", ":authority", "api.example.test", ":path", "/")
	f.Add(frames(func(fr *http2.Framer) {
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: req, EndHeaders: true, EndStream: true})
	}), uint8(7))
	f.Add(frames(func(fr *http2.Framer) {
		bad := append(append([]byte(nil), req...), block("connection", "close", "te", "gzip")...)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: bad[:10], PadLength: 3, Priority: http2.PriorityParam{Weight: 4}})
		fr.WriteContinuation(1, true, bad[10:])
		fr.WriteData(1, true, []byte("body"))
	}), uint8(1))
	f.Add(frames(func(fr *http2.Framer) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: req, EndHeaders: false})
		fr.WritePing(false, [8]byte{})
		fr.WriteRawFrame(http2.FrameSettings, 0, 0, []byte{0, 4, 0, 0})
	}), uint8(63))

	f.Fuzz(func(t *testing.T, frames []byte, chunk uint8) {
		in := append([]byte(http2.ClientPreface), frames...)
		c := &h2Inbound{Conn: readConn{r: bytes.NewReader(in)}, passing: len(http2.ClientPreface)}
		var out []byte
		buf := make([]byte, int(chunk)%64+1)
		for {
			n, err := c.Read(buf)
			out = append(out, buf[:n]...)
			if err != nil {
				break
			}
			if len(out) > 2*len(in)+1024 {
				t.Fatalf("%d bytes out of %d in", len(out), len(in))
			}
		}
		if !bytes.HasPrefix(out, []byte(http2.ClientPreface)) {
			t.Fatal("the preface was not passed first")
		}
		if whole(in) != whole(out) {
			t.Fatalf("input ends on a frame boundary: %v; output: %v", whole(in), whole(out))
		}
	})
}

// whole reports whether b, past the preface, is a sequence of whole frames.
func whole(b []byte) bool {
	b = b[len(http2.ClientPreface):]
	for len(b) >= 9 {
		n := 9 + (int(b[0])<<16 | int(b[1])<<8 | int(b[2]))
		if n > len(b) {
			return false
		}
		b = b[n:]
	}
	return len(b) == 0
}

// readConn is a connection that only reads.
type readConn struct {
	net.Conn
	r io.Reader
}

func (c readConn) Read(p []byte) (int, error) { return c.r.Read(p) }
