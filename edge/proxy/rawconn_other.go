//go:build !linux

package proxy

import "net"

// newRawConn is Linux's (rawconn_linux.go); elsewhere connections are used
// as they are.
func newRawConn(c net.Conn, _ func() bool) net.Conn { return c }
