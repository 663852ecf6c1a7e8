package proxy

import (
	"errors"
	"net"
	"testing"

	"golang.org/x/net/nettest"
)

// rawConn keeps every promise of net.Conn that the proxy and TLS rely on:
// x/net's conformance suite (reads and writes both ways, deadlines that
// time out as net.Error, past and future, a Close that unblocks a pending
// Read or Write, concurrent use) on two loopback TCP ends, each wrapped.
func TestRawConnIsANetConn(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			accepted <- c
		}()
		d, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return nil, nil, nil, err
		}
		a := <-accepted
		if a == nil {
			d.Close()
			return nil, nil, nil, net.ErrClosed
		}
		c1, c2 = newRawConn(d), newRawConn(a)
		if _, ok := c1.(*rawConn); !ok {
			// An error, not t.Fatal: nettest calls this on its subtests'
			// goroutines, and fails the subtest with it.
			c1.Close()
			c2.Close()
			return nil, nil, nil, errors.New("a TCP connection was not wrapped")
		}
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}
