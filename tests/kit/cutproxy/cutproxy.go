// Package cutproxy is a TCP relay on loopback that a test puts between a
// client and a server to break their connections on cue: Cut closes every
// connection it relays at that moment, as a dropped network would, and
// Hold keeps new ones waiting (accepted, nothing relayed) until Release. It
// counts the connections it accepted, so a test can wait for a client's
// reconnection.
package cutproxy

import (
	"io"
	"net"
	"sync"
)

// Proxy relays each connection it accepts on its address to the target.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	conns    map[net.Conn]struct{} // both ends of every relayed connection
	accepted int
	held     chan struct{} // closed: not holding
	closed   bool
	wg       sync.WaitGroup
}

// Start listens on a free loopback port and relays to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, held: make(chan struct{})}
	close(p.held)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted is how many connections the proxy has accepted so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Cut closes every connection the proxy relays now (both sides); later ones
// are relayed as before (or held, after Hold).
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Hold makes connections accepted from now on wait, relaying nothing, until
// Release.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.held:
		p.held = make(chan struct{})
	default:
	}
}

// Release lets the held connections (and later ones) through.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.held:
	default:
		close(p.held)
	}
}

// Close stops accepting, closes every connection and waits for the relays
// to end.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Release()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepted++
		held := p.held
		p.track(c)
		p.wg.Add(1)
		p.mu.Unlock()
		go p.relay(c, held)
	}
}

// track adds c to the connections Cut closes (p.mu held); a closed proxy
// closes it at once.
func (p *Proxy) track(c net.Conn) {
	if p.closed {
		c.Close()
		return
	}
	p.conns[c] = struct{}{}
}

func (p *Proxy) relay(client net.Conn, held <-chan struct{}) {
	defer p.wg.Done()
	defer p.forget(client)
	<-held
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.track(server)
	p.mu.Unlock()
	defer p.forget(server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		// Either side's end ends both: a half-closed relay would let a
		// cut connection linger.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
}

func (p *Proxy) forget(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}
