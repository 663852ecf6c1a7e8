package proxy

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawConn reads and writes an intercepted TCP connection's socket with raw
// system calls while the proxy is not busy, and with net.Conn's own calls
// when it is (Proxy.busy: more than one request in flight). Raw calls wait
// on the runtime's poller between them as net.Conn's do
// (syscall.RawConn), deadlines included; the socket is non-blocking, so a
// raw call never blocks.
//
// A call made net.Conn's way enters the scheduler's syscall state, which
// wakes the runtime's monitor thread (sysmon) whenever the process was
// idle, and lets it hand the processor to another thread when the kernel
// preempts this one mid-call (to run the peer a write woke). With one
// request at a time the process idles between every read and write, and
// that bookkeeping was a quarter of edge's CPU at one connection (177 ->
// 118 µs per request with raw calls). Under load the trade turns: a raw
// call the kernel preempts keeps its processor, and the goroutines queued
// on it, until the kernel runs the thread again (often a whole time slice
// given to the peer the write woke), where sysmon would have handed them to
// another thread; the task and the upstream, waiting on those stalled
// requests, go idle and wake up more often, at a cost per request of their
// own. Under make bench-proxy at 64 connections (2 cores), raw calls
// throughout had edge's p99 at 1.5-1.6x the relay's; net.Conn's calls under
// load brought it to 1.2x, and edge's requests/s from 0.81 to 0.86x the
// relay's (issue 27).
//
// Raw reads (and writes) are serialized, as the descriptor's own lock
// would: each way keeps the call in progress in the struct, for callbacks
// bound once (a closure made per call would be allocated).
type rawConn struct {
	net.Conn
	rc syscall.RawConn
	// busy reports whether net.Conn's calls are to be made instead of raw
	// ones; nil never.
	busy func() bool

	rmu, wmu        sync.Mutex
	rbuf, wbuf      []byte
	rn, wn          int
	rerr, werr      error
	readFn, writeFn func(fd uintptr) bool
}

// newRawConn wraps c when it is a TCP connection, and returns c as it is
// otherwise. busy (nil: never) is asked before each read and write.
func newRawConn(c net.Conn, busy func() bool) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	r := &rawConn{Conn: c, rc: rc, busy: busy}
	r.readFn, r.writeFn = r.readOnce, r.writeOnce
	return r
}

func (r *rawConn) Read(p []byte) (int, error) {
	if r.busy != nil && r.busy() {
		return r.Conn.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	r.rmu.Lock()
	r.rbuf, r.rn, r.rerr = p, 0, nil
	err := r.rc.Read(r.readFn)
	n, rerr := r.rn, r.rerr
	r.rbuf, r.rerr = nil, nil
	r.rmu.Unlock()
	if err == nil {
		err = rerr
	}
	if err != nil && err != io.EOF {
		err = r.opError("read", err)
	}
	return n, err
}

func (r *rawConn) readOnce(fd uintptr) bool {
	for {
		n, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&r.rbuf[0])), uintptr(len(r.rbuf)))
		switch errno {
		case 0:
			r.rn = int(n)
			if n == 0 {
				r.rerr = io.EOF
			}
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			r.rerr = errno
			return true
		}
	}
}

func (r *rawConn) Write(p []byte) (int, error) {
	if r.busy != nil && r.busy() {
		return r.Conn.Write(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	r.wmu.Lock()
	r.wbuf, r.wn, r.werr = p, 0, nil
	err := r.rc.Write(r.writeFn)
	n, werr := r.wn, r.werr
	r.wbuf, r.werr = nil, nil
	r.wmu.Unlock()
	if err == nil {
		err = werr
	}
	if err != nil {
		err = r.opError("write", err)
	}
	return n, err
}

func (r *rawConn) writeOnce(fd uintptr) bool {
	for r.wn < len(r.wbuf) {
		rest := r.wbuf[r.wn:]
		n, _, errno := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)))
		switch errno {
		case 0:
			r.wn += int(n)
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			r.werr = errno
			return true
		}
	}
	return true
}

// opError shapes an error as net.Conn's are: a *net.OpError around the
// poller's error (a deadline, a closed connection) or the system call's.
func (r *rawConn) opError(op string, err error) error {
	if errno, ok := err.(unix.Errno); ok {
		err = os.NewSyscallError(op, errno)
	}
	return &net.OpError{Op: op, Net: "tcp", Source: r.LocalAddr(), Addr: r.RemoteAddr(), Err: err}
}
