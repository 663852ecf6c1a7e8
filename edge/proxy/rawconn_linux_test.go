package proxy

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"golang.org/x/net/nettest"
)

// rawConn keeps every promise of net.Conn that the proxy and TLS rely on:
// x/net's conformance suite (reads and writes both ways, deadlines that
// time out as net.Error, past and future, a Close that unblocks a pending
// Read or Write, concurrent use) on two loopback TCP ends, each wrapped:
// with raw system calls only, net.Conn's only (busy), and the two mixed on
// the same connection, as the proxy's load comes and goes.
func TestRawConnIsANetConn(t *testing.T) {
	var calls atomic.Int64
	for name, busy := range map[string]func() bool{
		"raw":   nil,
		"busy":  func() bool { return true },
		"mixed": func() bool { return calls.Add(1)%3 == 0 },
	} {
		t.Run(name, func(t *testing.T) { testRawConn(t, busy) })
	}
}

func testRawConn(t *testing.T, busy func() bool) {
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
		c1, c2 = newRawConn(d, busy), newRawConn(a, busy)
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
