package proxy

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2MaxFrameSize is the largest frame the intercepting front reads
// (SETTINGS_MAX_FRAME_SIZE): the protocol's initial value, which a task's
// client may use before it has the front's SETTINGS anyway. x/net/http2's
// default (1 MiB) lets one frame take that much of edge's memory, and a
// client that ignores the setting cannot tell it from the initial value
// (h2spec 4.2/3 sends 20 KB expecting FRAME_SIZE_ERROR).
const h2MaxFrameSize = 16 << 10

// h2MaxHeaderBytes is the intercepting front's http.Server.MaxHeaderBytes,
// from which x/net/http2 derives SETTINGS_MAX_HEADER_LIST_SIZE by adding
// 32 bytes for each of ten fields: so the list's bound is maxHeadBytes, as
// an HTTP/1.1 head's (in HTTP/2's measure: each field's name and value
// plus 32 bytes). Past it x/net answers 431 itself.
const h2MaxHeaderBytes = maxHeadBytes - 10*32

// h2Inbound is what x/net/http2's server reads of an intercepted HTTP/2
// connection: the task's bytes, frame by frame, with two corrections where
// x/net/http2 (v0.62.0, the newest there is; net/http's copy is the same
// code) departs from RFC 9113:
//
//   - It hangs up on a SETTINGS frame that names a parameter twice
//     (HasDuplicates, "not actually in the spec"); RFC 9113 6.5.3 has the
//     values processed in order, each replacing the last. Such a frame is
//     passed on with only the last value of each parameter, which is what
//     processing them in order leaves.
//   - It answers a request carrying a connection-specific field
//     (Connection, Keep-Alive, Proxy-Connection, Transfer-Encoding,
//     Upgrade) or a TE other than "trailers" with a 400 and a body, where
//     RFC 9113 8.2.2 makes it malformed: a stream error of type
//     PROTOCOL_ERROR (8.1.1). Header blocks are decoded here too (a mirror
//     of x/net's HPACK state, which depends only on the blocks), and such
//     a block gets one more field, literal and never indexed, whose
//     upper-case name x/net rejects with exactly that stream error; the
//     pipeline never sees the request.
//
// The same mirror tells the front of a request x/net refuses for its
// header list's size (overBound), which x/net answers without the
// pipeline, so that it is audited as HTTP/1.1's is.
//
// Every other byte passes untouched: a frame's header is read on its own,
// a DATA frame's payload straight into x/net's buffer. Only SETTINGS,
// HEADERS and CONTINUATION frames are read whole, within h2MaxFrameSize.
// Once the mirror fails to decode (x/net's decoder then fails the
// connection with COMPRESSION_ERROR), the rest passes unchecked.
type h2Inbound struct {
	net.Conn // the task's connection, TLS terminated
	tls      *tls.Conn
	hdr      [9]byte
	// out is what Read hands over next: a frame header, a frame read
	// whole, the preface.
	out []byte
	// pooled holds a frame read whole (header included), lent by
	// h2FramePool until Read has handed it over: an idle connection keeps
	// none.
	pooled *[]byte
	// passing counts the bytes of the current payload still to be read
	// straight from the connection.
	passing int
	err     error // the connection's, reported once out is drained

	dec     *hpack.Decoder // the mirror, made with the first header block
	inBlock bool           // a header block is open (no END_HEADERS yet)
	// malformed: the open block holds a field HTTP/2 forbids in a request;
	// te counts its TE fields.
	malformed bool
	te        int
	broken    bool // the mirror failed: the rest is passed unchecked

	// overBound, if set, is called (on x/net's reading goroutine) for a
	// request whose header list x/net refuses with a 431 as over
	// SETTINGS_MAX_HEADER_LIST_SIZE: x/net answers it itself, so the front
	// audits it from here. Its accounting is x/net's (readMetaFrame,
	// processHeaders), followed by the fields below.
	overBound func()
	maxStream uint32 // the highest stream a request opened
	// Of the open block: it opens a request (not trailers), the bytes
	// left in x/net's budgets for fields and for Trailer fields, whether a
	// field was invalid (x/net resets the stream instead) or past the
	// budget (truncated: the 431), and whether a regular field came.
	opening                  bool
	listLeft, trailerLeft    uint32
	invalid, truncated, regs bool
}

func newH2Inbound(c *tls.Conn) *h2Inbound {
	return &h2Inbound{Conn: c, tls: c, passing: len(http2.ClientPreface)}
}

// ConnectionState is how x/net learns the connection's TLS state (r.TLS,
// and its refusal of weak TLS).
func (c *h2Inbound) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

func (c *h2Inbound) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.passing > 0 {
			n, err := c.Conn.Read(p[:min(len(p), c.passing)])
			c.passing -= n
			return n, err
		}
		if c.err != nil {
			return 0, c.err
		}
		c.next()
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	if len(c.out) == 0 && c.pooled != nil {
		h2FramePool.Put(c.pooled)
		c.pooled = nil
	}
	return n, nil
}

// h2FramePool lends frames read whole their buffers: room for the largest
// frame read and the CONTINUATION a malformed block gets.
var h2FramePool = sync.Pool{New: func() any {
	b := make([]byte, 0, 9+h2MaxFrameSize+9+len(malformedField))
	return &b
}}

// next reads the next frame's header, and the whole frame when it is one
// to check, and readies what x/net gets of it.
func (c *h2Inbound) next() {
	n, err := io.ReadFull(c.Conn, c.hdr[:])
	if err != nil {
		c.out, c.err = c.hdr[:n], err
		return
	}
	length := int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
	typ, flags := http2.FrameType(c.hdr[3]), http2.Flags(c.hdr[4])
	check := !c.broken && length <= h2MaxFrameSize &&
		(typ == http2.FrameSettings && flags&http2.FlagSettingsAck == 0 || typ == http2.FrameHeaders || typ == http2.FrameContinuation)
	if c.inBlock && typ != http2.FrameContinuation {
		check = false // x/net fails the connection (RFC 9113 6.10)
	}
	if !check {
		// Past a frame the mirror did not decode, its state is unknown.
		c.broken = c.broken || typ == http2.FrameHeaders || typ == http2.FrameContinuation
		c.out, c.passing = c.hdr[:], length
		return
	}
	c.pooled = h2FramePool.Get().(*[]byte)
	f := (*c.pooled)[:9+length]
	copy(f, c.hdr[:])
	if n, err := io.ReadFull(c.Conn, f[9:]); err != nil {
		c.out, c.err = f[:9+n], err
		return
	}
	switch typ {
	case http2.FrameSettings:
		c.out = dedupSettings(f)
	default:
		c.out = c.headerBlock(f, typ, flags)
	}
}

// dedupSettings keeps, of each parameter a SETTINGS frame names, only its
// last value. A frame that is malformed, or holds a value x/net refuses
// (a connection error whichever value it meets), is left as it is.
func dedupSettings(f []byte) []byte {
	payload := f[9:]
	if len(payload)%6 != 0 || binary.BigEndian.Uint32(f[5:9])&(1<<31-1) != 0 {
		return f
	}
	n := len(payload) / 6
	setting := func(i int) http2.Setting {
		return http2.Setting{ID: http2.SettingID(binary.BigEndian.Uint16(payload[i*6:])), Val: binary.BigEndian.Uint32(payload[i*6+2:])}
	}
	dups := false
	for i := 0; i < n; i++ {
		if setting(i).Valid() != nil {
			return f
		}
		for j := i + 1; j < n; j++ {
			dups = dups || setting(j).ID == setting(i).ID
		}
	}
	if !dups {
		return f
	}
	kept := 0
	for i := 0; i < n; i++ {
		s, last := setting(i), true
		for j := i + 1; j < n && last; j++ {
			last = setting(j).ID != s.ID
		}
		if last {
			copy(payload[kept*6:], payload[i*6:i*6+6])
			kept++
		}
	}
	f = f[:9+kept*6]
	f[0], f[1], f[2] = 0, byte(kept*6>>8), byte(kept*6)
	return f
}

// malformedField is a literal field without indexing (RFC 7541 6.2.2:
// never in the dynamic table, so both decoders keep their state) named
// "X", which x/net refuses in a header block (names are lower case in
// HTTP/2) with a stream PROTOCOL_ERROR.
var malformedField = []byte{0x00, 0x01, 'X', 0x00}

// headerBlock runs a HEADERS or CONTINUATION frame's fragment through the
// mirror. The frame that ends a malformed block loses its END_HEADERS, and
// a CONTINUATION carrying malformedField follows it.
func (c *h2Inbound) headerBlock(f []byte, typ http2.FrameType, flags http2.Flags) []byte {
	frag := f[9:]
	if typ == http2.FrameHeaders {
		if flags&http2.FlagHeadersPadded != 0 {
			if len(frag) == 0 || int(frag[0]) >= len(frag) {
				c.broken = true
				return f
			}
			frag = frag[1 : len(frag)-int(frag[0])]
		}
		if flags&http2.FlagHeadersPriority != 0 {
			if len(frag) < 5 {
				c.broken = true
				return f
			}
			frag = frag[5:]
		}
		c.inBlock, c.malformed, c.te = true, false, 0
		stream := binary.BigEndian.Uint32(f[5:9]) & (1<<31 - 1)
		c.opening = stream > c.maxStream
		c.maxStream = max(c.maxStream, stream)
		c.listLeft, c.trailerLeft = maxHeadBytes, maxHeadBytes
		c.invalid, c.truncated, c.regs = false, false, false
	} else if !c.inBlock {
		c.broken = true // x/net fails the connection
		return f
	}
	if c.dec == nil {
		// x/net's decoder: the initial table size, which its SETTINGS
		// leave as it is; strings bounded as its own (MaxHeaderBytes).
		c.dec = hpack.NewDecoder(4096, c.field)
		c.dec.SetMaxStringLength(2 * maxHeadBytes)
	}
	if len(frag) > 2*int(c.listLeft+c.trailerLeft) || c.invalid && typ == http2.FrameContinuation {
		c.opening = false // x/net fails the connection, answering nothing
	}
	if _, err := c.dec.Write(frag); err != nil {
		c.broken = true
		return f
	}
	if flags&http2.FlagHeadersEndHeaders == 0 { // the same bit in CONTINUATION
		return f
	}
	c.inBlock = false
	if err := c.dec.Close(); err != nil {
		c.broken = true
		return f
	}
	if c.opening && c.truncated && !c.invalid && c.overBound != nil {
		c.overBound()
	}
	if !c.malformed && c.te <= 1 {
		return f
	}
	f[4] &^= byte(http2.FlagHeadersEndHeaders)
	stream := f[5:9]
	f = append(f, 0, 0, byte(len(malformedField)), byte(http2.FrameContinuation), byte(http2.FlagContinuationEndHeaders))
	f = append(f, stream...)
	return append(f, malformedField...)
}

// field notes a field RFC 9113 8.2.2 forbids in a request, as x/net's
// checkValidHTTP2RequestHeaders does, and counts the header list as x/net
// does (which stops at the first invalid field, or at the budget).
func (c *h2Inbound) field(hf hpack.HeaderField) {
	if !c.invalid && !c.truncated {
		pseudo := strings.HasPrefix(hf.Name, ":")
		c.invalid = !httpguts.ValidHeaderFieldValue(hf.Value) || pseudo && c.regs || !pseudo && !wireFieldName(hf.Name)
		c.regs = c.regs || !pseudo
		left, size := &c.listLeft, hf.Size()
		if hf.Name == "trailer" {
			n := uint32(strings.Count(hf.Value, ",") + 1)
			left, size = &c.trailerLeft, uint32(len(hf.Value))-n+1+n*hpack.HeaderField{}.Size()
		}
		switch {
		case c.invalid:
		case size > *left:
			c.truncated, c.listLeft, c.trailerLeft = true, 0, 0
		default:
			*left -= size
		}
	}
	switch hf.Name {
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
		c.malformed = true
	case "te":
		c.te++
		c.malformed = c.malformed || hf.Value != "trailers" && hf.Value != ""
	}
}

// wireFieldName is x/net's validWireHeaderFieldName: a token, in lower
// case.
func wireFieldName(name string) bool {
	if !httpguts.ValidHeaderFieldName(name) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if 'A' <= name[i] && name[i] <= 'Z' {
			return false
		}
	}
	return true
}
