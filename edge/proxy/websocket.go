package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/runfleet/runfleet/edge/audit"
	"github.com/runfleet/runfleet/edge/policy"
	"github.com/runfleet/runfleet/edge/proxy/placeholder"
)

// WebSockets on intercepted connections (RFC 6455). After a 101 the proxy
// does not relay bytes as they are: it parses the frames both ways, so the
// promise that holds for requests and answers holds for messages too.
//
//   - Task to upstream: a message is collected whole (its fragments joined,
//     up to wsMaxPayload), scanned for placeholders like a request body
//     (policy.InBody) and substituted where the key allows it; a placeholder
//     that may not go there, or a real value the proxy holds (tripwire.go),
//     blocks the message: nothing of it goes upstream,
//     the task gets a close frame (1008) and the upstream connection is
//     closed. Collecting it whole finds a placeholder split across
//     fragments and keeps a blocked message's first fragments from leaving
//     before the block is known; the message leaves as one frame (RFC 6455
//     5.4 lets an intermediary change the fragmentation of a message
//     without extensions), re-masked with a fresh mask from Config.Rand.
//   - Upstream to task: every frame's payload is scrubbed of every value
//     substituted so far on the connection (the handshake's and every
//     message's), through the answers' scrubber and its hold-back rule:
//     bytes held at a fragment's end wait for the next fragment of the same
//     message, and a message's last fragment flushes them. Frames keep
//     their boundaries (an upstream's streamed fragments stay interactive).
//   - Control frames (close, ping, pong) are complete in one frame of at
//     most 125 bytes. From the task, a placeholder in one is substituted
//     if the result still fits 125 bytes, else the frame is blocked like a
//     message; from the upstream, a payload that scrubbing makes longer than
//     125 bytes is dropped (a close keeps its code), so the task never gets
//     a value and never a malformed frame.
//   - No extension is negotiated (a compressed payload cannot be scanned):
//     Sec-WebSocket-Extensions is dropped from the handshake, and a 101 that
//     still names one is refused like a compressed answer (502, blocked).
//     A reserved bit set is therefore always a protocol error.
//   - Any other Upgrade protocol (h2c...) is refused before it reaches the
//     upstream (501): bytes the proxy cannot parse may carry a value.
//
// Audit: each blocked message is a line of its own (action blocked, the
// key). Substituted messages get none (a chatty socket would flood the
// log): the handshake's line, recorded when the connection ends, names
// every key put in over the connection, and its "scrubbed" counts values
// taken out of the handshake's answer and of the upstream's frames.

// wsMaxPayload bounds a frame's payload and a task's message, whole: a
// frame is read whole to be re-framed with its new length, and a task's
// message is collected whole before any of it leaves. 1 MiB is the default
// message limit of common clients (Python's websockets max_size); a peer
// past it gets 1009 (message too big). The proxy holds at most a message
// and a frame per connection.
const wsMaxPayload = 1 << 20

// wsCloseWait is how long the other direction may take to finish the
// closing handshake once one has passed a close frame.
const wsCloseWait = 10 * time.Second

// Opcodes (RFC 6455 5.2).
const (
	wsContinuation = 0x0
	wsText         = 0x1
	wsBinary       = 0x2
	wsClose        = 0x8
	wsPing         = 0x9
	wsPong         = 0xa
)

// Close codes (RFC 6455 7.4.1; 1014 from the IANA registry).
const (
	wsCodeProtocol   = 1002
	wsCodePolicy     = 1008
	wsCodeTooBig     = 1009
	wsCodeInternal   = 1011
	wsCodeBadGateway = 1014
)

const wsMaxControl = 125

// isWebSocket reports whether an Upgrade names RFC 6455's protocol.
func isWebSocket(proto string) bool { return strings.EqualFold(proto, "websocket") }

// prepareUpgrade readies an intercepted request that asks for an upgrade:
// anything but a WebSocket is refused, and a WebSocket's extensions
// (permessage-deflate) are not offered, so its frames stay scannable.
func prepareUpgrade(r *http.Request, proto string) *refusal {
	if !isWebSocket(proto) {
		return refuseUpgrade()
	}
	delete(r.Header, "Sec-Websocket-Extensions")
	return nil
}

// wsFrame is one parsed frame, its payload unmasked.
type wsFrame struct {
	fin     bool
	opcode  byte
	payload []byte
}

func (f wsFrame) control() bool { return f.opcode >= wsClose }

// wsError is a frame stream that breaks RFC 6455 or the proxy's bounds:
// the connection is closed with code. reason is static (it goes into a
// close frame and the log).
type wsError struct {
	code   uint16
	reason string
}

func (e *wsError) Error() string { return "websocket: " + e.reason }

// wsReader reads the frames of one direction strictly: reserved bits (no
// extension is ever negotiated), unknown opcodes, a mask where there must
// be none or none where there must be one, a fragmented or long control
// frame, a length not in its shortest form, a continuation with no message
// or a new message inside one, and a payload past wsMaxPayload are all
// errors.
type wsReader struct {
	r *bufio.Reader
	// masked: frames from a client, which must be masked (RFC 6455 5.1);
	// a server's must not be.
	masked bool
	inMsg  bool
	buf    []byte
	head   [8]byte
}

// next reads the next frame; its payload is valid until the next call.
func (rd *wsReader) next() (wsFrame, error) {
	h := rd.head[:2]
	if _, err := io.ReadFull(rd.r, h); err != nil {
		return wsFrame{}, err
	}
	f := wsFrame{fin: h[0]&0x80 != 0, opcode: h[0] & 0x0f}
	if h[0]&0x70 != 0 {
		return wsFrame{}, &wsError{wsCodeProtocol, "reserved bits set without an extension"}
	}
	switch f.opcode {
	case wsContinuation:
		if !rd.inMsg {
			return wsFrame{}, &wsError{wsCodeProtocol, "continuation frame outside a message"}
		}
	case wsText, wsBinary:
		if rd.inMsg {
			return wsFrame{}, &wsError{wsCodeProtocol, "new message inside a fragmented one"}
		}
	case wsClose, wsPing, wsPong:
	default:
		return wsFrame{}, &wsError{wsCodeProtocol, "unknown opcode"}
	}
	if masked := h[1]&0x80 != 0; masked != rd.masked {
		if rd.masked {
			return wsFrame{}, &wsError{wsCodeProtocol, "unmasked frame from the client"}
		}
		return wsFrame{}, &wsError{wsCodeProtocol, "masked frame from the server"}
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(rd.r, rd.head[:2]); err != nil {
			return wsFrame{}, err
		}
		if n = uint64(binary.BigEndian.Uint16(rd.head[:2])); n < 126 {
			return wsFrame{}, &wsError{wsCodeProtocol, "payload length not in its shortest form"}
		}
	case 127:
		if _, err := io.ReadFull(rd.r, rd.head[:8]); err != nil {
			return wsFrame{}, err
		}
		n = binary.BigEndian.Uint64(rd.head[:8])
		switch {
		case n>>63 != 0:
			return wsFrame{}, &wsError{wsCodeProtocol, "payload length with its top bit set"}
		case n <= 0xffff:
			return wsFrame{}, &wsError{wsCodeProtocol, "payload length not in its shortest form"}
		}
	}
	if f.control() && (!f.fin || n > wsMaxControl) {
		return wsFrame{}, &wsError{wsCodeProtocol, "control frame fragmented or longer than 125 bytes"}
	}
	if n > wsMaxPayload {
		return wsFrame{}, &wsError{wsCodeTooBig, "frame larger than the proxy's limit"}
	}
	var mask [4]byte
	if rd.masked {
		if _, err := io.ReadFull(rd.r, mask[:]); err != nil {
			return wsFrame{}, err
		}
	}
	if uint64(cap(rd.buf)) < n {
		rd.buf = make([]byte, n)
	}
	f.payload = rd.buf[:n]
	if _, err := io.ReadFull(rd.r, f.payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return wsFrame{}, err
	}
	if rd.masked {
		maskBytes(mask, f.payload)
	}
	if f.opcode == wsClose && n == 1 {
		return wsFrame{}, &wsError{wsCodeProtocol, "close frame with a one-byte payload"}
	}
	if !f.control() {
		rd.inMsg = !f.fin
	}
	// A large buffer is not kept past its frame: a connection holds at
	// most one large payload per direction at a time.
	if cap(rd.buf) > bodyChunk {
		rd.buf = nil
	}
	return f, nil
}

func maskBytes(mask [4]byte, b []byte) {
	for i := range b {
		b[i] ^= mask[i&3]
	}
}

// appendFrame appends f to out, masked with mask when masked.
func appendFrame(out []byte, f wsFrame, masked bool, mask [4]byte) []byte {
	b0 := f.opcode
	if f.fin {
		b0 |= 0x80
	}
	var m byte
	if masked {
		m = 0x80
	}
	n := len(f.payload)
	switch {
	case n < 126:
		out = append(out, b0, m|byte(n))
	case n <= 0xffff:
		out = append(out, b0, m|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, b0, m|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	if !masked {
		return append(out, f.payload...)
	}
	out = append(out, mask[:]...)
	start := len(out)
	out = append(out, f.payload...)
	maskBytes(mask, out[start:])
	return out
}

// closePayload is a close frame's payload: the code and a static reason.
func closePayload(code uint16, reason string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, code), reason...)
}

// wsSide is one end of the relay: where its frames are written, under a
// lock (both directions may write to it: a close on a failure), and
// whether a close frame has already gone to it (nothing follows one).
type wsSide struct {
	conn   net.Conn
	masked bool // frames to it are masked: it is the upstream (a server)
	mu     sync.Mutex
	closed bool
	out    []byte
	n      int64 // payload bytes written
}

// wsRelay carries one upgraded connection between a task and an upstream.
type wsRelay struct {
	p     *Proxy
	st    *requestState
	task  wsSide
	up    wsSide
	taskR *bufio.Reader
	upR   *bufio.Reader
	// scrub takes the run's values out of what the upstream sends; only
	// the upstream-to-task direction reads frames through it.
	scrub *placeholder.Scrubber
	// in counts the payload bytes of the task's frames.
	in int64
}

// write sends f to s unless a close has gone to s already. A mask comes
// fresh from Config.Rand for every frame to the upstream.
func (r *wsRelay) write(s *wsSide, f wsFrame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return net.ErrClosed
	}
	var mask [4]byte
	if s.masked {
		if _, err := io.ReadFull(r.p.cfg.Rand, mask[:]); err != nil {
			return err
		}
	}
	s.out = appendFrame(s.out[:0], f, s.masked, mask)
	if cap(s.out) > bodyChunk {
		defer func() { s.out = nil }()
	}
	s.closed = f.opcode == wsClose
	s.n += int64(len(f.payload))
	_, err := s.conn.Write(s.out)
	return err
}

// fail sends s a close frame with code (unless one went already), best
// effort: the connection is torn down next.
func (r *wsRelay) fail(s *wsSide, code uint16, reason string) {
	_ = r.write(s, wsFrame{fin: true, opcode: wsClose, payload: closePayload(code, reason)})
}

// relayWebSocket carries frames both ways until both have passed a close
// frame, either side fails, or the task's request is cancelled. Both
// directions have ended when it returns.
func (p *Proxy) relayWebSocket(st *requestState, conn net.Conn, taskR *bufio.Reader, uc *upConn) {
	r := &wsRelay{p: p, st: st, taskR: taskR, upR: uc.br, scrub: &st.scrub}
	r.task.conn = conn
	r.up.conn, r.up.masked = uc.conn, true
	r.scrub.Reset(st)
	teardown := sync.OnceFunc(func() {
		conn.Close()
		uc.conn.Close()
	})
	// The request's context ended (its attempt stopped): both close.
	stop := context.AfterFunc(st.ctx, teardown)
	defer stop()
	errc := make(chan error, 2)
	go func() { errc <- r.taskToUpstream() }()
	go func() { errc <- r.upstreamToTask() }()
	if err := <-errc; err != nil {
		teardown()
	} else {
		// One direction passed a close: the other has a while to answer it.
		deadline := time.Now().Add(wsCloseWait)
		conn.SetReadDeadline(deadline)
		uc.conn.SetReadDeadline(deadline)
	}
	<-errc
	teardown()
	st.entry.BytesIn += r.in
	st.out.n += r.task.n
}

// taskToUpstream passes the task's frames on, each message scanned whole.
// It returns nil once it has passed a close frame.
func (r *wsRelay) taskToUpstream() error {
	rd := wsReader{r: r.taskR, masked: true}
	var msg []byte
	var op byte
	for {
		f, err := rd.next()
		if err != nil {
			var we *wsError
			if errors.As(err, &we) {
				r.fail(&r.task, we.code, we.reason)
			}
			return err
		}
		r.in += int64(len(f.payload))
		if f.control() {
			payload := f.payload
			if f.opcode == wsClose && len(payload) > 2 {
				// The code is binary; only the reason may hold text.
				reason, err := r.substitute(payload[2:])
				if err != nil {
					return r.block(r.st.refusal(err))
				}
				payload = append(payload[:2:2], reason...)
			} else if f.opcode != wsClose {
				if payload, err = r.substitute(payload); err != nil {
					return r.block(r.st.refusal(err))
				}
			}
			if len(payload) > wsMaxControl {
				return r.block(refuseBlocked("a placeholder in a WebSocket control frame whose value does not fit 125 bytes", policy.KeyRef{}))
			}
			f.payload = payload
			if err := r.write(&r.up, f); err != nil {
				return err
			}
			if f.opcode == wsClose {
				return nil
			}
			continue
		}
		if f.opcode != wsContinuation {
			op = f.opcode
		}
		if len(msg)+len(f.payload) > wsMaxPayload {
			r.fail(&r.task, wsCodeTooBig, "message larger than the proxy's limit")
			return &wsError{wsCodeTooBig, "message larger than the proxy's limit"}
		}
		msg = append(msg, f.payload...)
		if !f.fin {
			continue
		}
		out, err := r.substitute(msg)
		if err != nil {
			return r.block(r.st.refusal(err))
		}
		if err := r.write(&r.up, wsFrame{fin: true, opcode: op, payload: out}); err != nil {
			return err
		}
		if msg = msg[:0]; cap(msg) > bodyChunk {
			msg = nil
		}
	}
}

// substitute puts values in for the placeholders in b as a body's are
// decided (policy.InBody toward this authority); b itself when it holds
// none. The index is the one in force now, as for a new request, and a
// message counts as a request for maxSubstitutions: its count starts from
// zero, so a long-lived socket is bounded per message, not over its life.
// A real value the proxy holds blocks the message (tripwire.go).
func (r *wsRelay) substitute(b []byte) ([]byte, error) {
	if refused := r.st.tripWhole(b); refused != nil {
		r.st.mu.Lock()
		defer r.st.mu.Unlock()
		return nil, r.st.refuseLocked(refused)
	}
	r.st.mu.Lock()
	r.st.substituted = 0
	r.st.mu.Unlock()
	out, _, err := r.p.reg.index.Load().Rewrite(b, policy.InBody, r.st.substitute)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// block ends the connection over a message that may not go upstream: the
// task gets a close frame (1008 policy violation; 1011 for a fault of
// ours), the upstream's connection is closed with nothing of the message
// sent, and the block gets an audit line of its own.
func (r *wsRelay) block(refused *refusal) error {
	st := r.st
	code := uint16(wsCodePolicy)
	if refused.isFault() {
		code = wsCodeInternal
	}
	r.up.mu.Lock()
	r.up.closed = true
	r.up.mu.Unlock()
	// The close first: closing the upstream ends the relay, the task's
	// connection with it.
	r.fail(&r.task, code, "runfleet edge: message blocked")
	r.up.conn.Close()
	// The failure is this message's, not the handshake's: the handshake's
	// line (recorded at the connection's end) keeps its own action.
	st.mu.Lock()
	st.refused = nil
	st.mu.Unlock()
	r.p.logFault(refused, st.runID(), st.ci.logHost)
	e := audit.Entry{
		TS: r.p.cfg.Clock.Now(), Task: st.runID(), Action: refused.action, Reason: "websocket message " + refused.reason,
		Host: st.ci.logHost, Method: st.entry.Method, Path: st.entry.Path, Via: st.ci.via, Rule: refused.rule,
	}
	r.p.alerted(&e, refused)
	if refused.key != (policy.KeyRef{}) {
		e.Keys = []string{refused.key.String()}
	}
	r.p.cfg.Audit.Record(e)
	return errRefused
}

// upstreamToTask passes the upstream's frames on, scrubbed. It returns nil
// once it has passed a close frame.
func (r *wsRelay) upstreamToTask() error {
	rd := wsReader{r: r.upR}
	var held, out []byte
	for {
		f, err := rd.next()
		if err != nil {
			var we *wsError
			if errors.As(err, &we) {
				// The upstream broke the protocol: it hears why, the task
				// that its gateway failed.
				r.fail(&r.up, we.code, we.reason)
				r.fail(&r.task, wsCodeBadGateway, "runfleet edge: bad frame from the upstream")
			}
			return err
		}
		if f.control() {
			f.payload = r.scrubControl(f)
			if err := r.write(&r.task, f); err != nil {
				return err
			}
			if f.opcode == wsClose {
				return nil
			}
			continue
		}
		// As a streamed answer: replace up to what more bytes of this
		// message could not change; a message's end releases all.
		held = append(held, f.payload...)
		var pos, n int
		out, pos, n = r.scrub.Pass(out[:0], held, f.fin)
		r.st.scrubbed += n
		held = held[:copy(held, held[pos:])]
		f.payload = out
		if err := r.write(&r.task, f); err != nil {
			return err
		}
		if f.fin && cap(held) > bodyChunk {
			held, out = nil, nil
		}
	}
}

// scrubControl is an upstream control frame's payload scrubbed; a payload
// that no longer fits a control frame is dropped (a close keeps its code).
func (r *wsRelay) scrubControl(f wsFrame) []byte {
	text, code := f.payload, []byte(nil)
	if f.opcode == wsClose && len(text) >= 2 {
		code, text = text[:2], text[2:]
	}
	out, n := r.scrub.Whole(text)
	r.st.scrubbed += n
	if len(code)+len(out) > wsMaxControl {
		out = nil
	}
	return append(code[:len(code):len(code)], out...)
}
