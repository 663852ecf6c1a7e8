package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"time"
)

// roundTripper speaks HTTP/1.1 to upstreams over verified TLS, on the
// handler's own goroutine: a request without a body is written and its
// response read right there, with no hand-off to connection goroutines as
// in http.Transport, which is where a proxy's per-request latency goes.
// Connections are pooled per authority and checked for a close before
// reuse; a request without a body that fails on a reused connection is
// retried once on a new one.
type roundTripper struct {
	dial        func(ctx context.Context, network, address string) (net.Conn, error)
	tls         *tls.Config
	maxIdle     int
	idleTimeout time.Duration
	handshake   time.Duration

	mu   sync.Mutex
	idle map[string][]*upConn
}

var _ http.RoundTripper = (*roundTripper)(nil)

type upConn struct {
	key  string
	conn *tls.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time
}

func newRoundTripper(dial func(ctx context.Context, network, address string) (net.Conn, error), cfg *tls.Config, idleTimeout time.Duration) *roundTripper {
	c := cfg.Clone()
	c.NextProtos = []string{"http/1.1"}
	return &roundTripper{dial: dial, tls: c, maxIdle: 64, idleTimeout: idleTimeout, handshake: 10 * time.Second, idle: map[string][]*upConn{}}
}

func hostPort(u string) string {
	if _, _, err := net.SplitHostPort(u); err == nil {
		return u
	}
	return net.JoinHostPort(u, "443")
}

func (rt *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	key := hostPort(req.URL.Host)
	hasBody := req.Body != nil && req.Body != http.NoBody
	for try := 0; ; try++ {
		uc, reused, err := rt.get(req.Context(), key, req.URL.Hostname(), hasBody)
		if err != nil {
			return nil, err
		}
		res, err := rt.exchange(req, uc, hasBody)
		if err == nil {
			return res, nil
		}
		if !reused || hasBody || try > 0 || req.Context().Err() != nil {
			return nil, err
		}
	}
}

// get takes a pooled connection, or dials a new one. For a request with a
// body, which cannot be retried, a pooled connection is first checked to be
// still open; a request without one is retried instead, sparing the check.
func (rt *roundTripper) get(ctx context.Context, key, serverName string, check bool) (*upConn, bool, error) {
	for {
		rt.mu.Lock()
		list := rt.idle[key]
		var uc *upConn
		if n := len(list); n > 0 {
			uc = list[n-1]
			rt.idle[key] = list[:n-1]
		}
		rt.mu.Unlock()
		if uc == nil {
			break
		}
		if time.Since(uc.used) < rt.idleTimeout && (!check || uc.stillOpen()) {
			return uc, true, nil
		}
		uc.conn.Close()
	}
	raw, err := rt.dial(ctx, "tcp", key)
	if err != nil {
		return nil, false, err
	}
	cfg := rt.tls.Clone()
	cfg.ServerName = serverName
	tc := tls.Client(raw, cfg)
	hctx, cancel := context.WithTimeout(ctx, rt.handshake)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, false, err
	}
	return &upConn{key: key, conn: tc, br: bufio.NewReaderSize(tc, 4096), bw: bufio.NewWriterSize(tc, 4096)}, false, nil
}

// stillOpen: a pooled connection the server closed (or wrote to unasked)
// is not reused. A zero-wait read tells without blocking.
func (uc *upConn) stillOpen() bool {
	if uc.br.Buffered() > 0 {
		return false
	}
	_ = uc.conn.NetConn().SetReadDeadline(time.Now())
	_, err := uc.br.Peek(1)
	_ = uc.conn.NetConn().SetReadDeadline(time.Time{})
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (rt *roundTripper) put(uc *upConn) {
	uc.used = time.Now()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.idle[uc.key]) >= rt.maxIdle {
		uc.conn.Close()
		return
	}
	rt.idle[uc.key] = append(rt.idle[uc.key], uc)
}

// CloseIdleConnections closes every pooled connection.
func (rt *roundTripper) CloseIdleConnections() {
	rt.mu.Lock()
	idle := rt.idle
	rt.idle = map[string][]*upConn{}
	rt.mu.Unlock()
	for _, list := range idle {
		for _, uc := range list {
			uc.conn.Close()
		}
	}
}

// exchange writes req and reads its response head. A body is written on its
// own goroutine, so an upstream that answers early is read at once.
func (rt *roundTripper) exchange(req *http.Request, uc *upConn, hasBody bool) (*http.Response, error) {
	ctx := req.Context()
	stop := context.AfterFunc(ctx, func() { _ = uc.conn.NetConn().SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, error) {
		stop()
		uc.conn.Close()
		return nil, err
	}
	var wrote chan error
	if hasBody {
		wrote = make(chan error, 1)
		go func() {
			err := req.Write(uc.bw)
			if err == nil {
				err = uc.bw.Flush()
			}
			if err != nil {
				// Unblock the reader: the request is incomplete. The socket
				// itself is closed, without a TLS close_notify, which an
				// upstream could take for a clean end of a body cut short
				// (a blocked placeholder) and answer.
				uc.conn.NetConn().Close()
			}
			wrote <- err
		}()
	} else {
		if err := req.Write(uc.bw); err != nil {
			return fail(err)
		}
		if err := uc.bw.Flush(); err != nil {
			return fail(err)
		}
	}
	trace := httptrace.ContextClientTrace(ctx)
	for {
		res, err := http.ReadResponse(uc.br, req)
		if err != nil {
			if wrote != nil {
				if werr := <-wrote; werr != nil {
					err = werr
				}
			}
			return fail(err)
		}
		if res.StatusCode >= 100 && res.StatusCode < 200 && res.StatusCode != http.StatusSwitchingProtocols {
			if trace != nil && trace.Got1xxResponse != nil {
				if err := trace.Got1xxResponse(res.StatusCode, textproto.MIMEHeader(res.Header)); err != nil {
					return fail(err)
				}
			}
			continue
		}
		if res.StatusCode == http.StatusSwitchingProtocols {
			stop()
			res.Body = &upgradedConn{Reader: uc.br, Conn: uc.conn}
			return res, nil
		}
		res.Body = &upBody{rc: res.Body, uc: uc, rt: rt, stop: stop, wrote: wrote, reusable: !res.Close && !req.Close}
		return res, nil
	}
}

// upgradedConn is a 101's body: the connection itself, both ways.
type upgradedConn struct {
	io.Reader
	Conn net.Conn
}

func (u *upgradedConn) Write(p []byte) (int, error) { return u.Conn.Write(p) }
func (u *upgradedConn) Close() error                { return u.Conn.Close() }

// upBody returns the connection to the pool once the response is read to
// its end and the request was written whole; otherwise it closes it.
type upBody struct {
	rc       io.ReadCloser
	uc       *upConn
	rt       *roundTripper
	stop     func() bool
	wrote    chan error
	reusable bool
	done     bool
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.finish(true)
	}
	return n, err
}

func (b *upBody) Close() error {
	b.finish(false)
	return nil
}

func (b *upBody) finish(atEOF bool) {
	if b.done {
		return
	}
	b.done = true
	stopped := b.stop()
	reuse := atEOF && b.reusable && stopped
	if b.wrote != nil {
		select {
		case err := <-b.wrote:
			reuse = reuse && err == nil
		default:
			// Still writing a body the upstream no longer reads.
			reuse = false
			b.uc.conn.Close()
			<-b.wrote
		}
	}
	if reuse {
		b.rt.put(b.uc)
		return
	}
	b.uc.conn.Close()
}
