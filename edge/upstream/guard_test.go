package upstream

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
)

type countingResolver struct {
	calls atomic.Int32
	addrs []netip.Addr
}

func (c *countingResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	c.calls.Add(1)
	return c.addrs, nil
}

func TestGuardDialsExactlyTheAllowedAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	var dialled []string
	res := &countingResolver{addrs: []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("127.0.0.1")}}
	g, err := NewGuard(GuardConfig{
		Resolver:     res,
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		LocalAddrs:   func() []netip.Addr { return nil },
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			dialled = append(dialled, address)
			return (&net.Dialer{}).DialContext(ctx, network, address)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := g.DialContext(context.Background(), "tcp", net.JoinHostPort("api.example.test", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if len(dialled) != 1 || dialled[0] != "127.0.0.1:"+strconv.Itoa(port) {
		t.Errorf("dialled %v", dialled)
	}

	// Every address internal: refused with the reason, nothing dialled.
	dialled = nil
	res.addrs = []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::ffff:169.254.169.254")}
	_, err = g.DialContext(context.Background(), "tcp", "api.example.test:443")
	var refused *RefusedError
	if !errors.Is(err, ErrRefused) || !errors.As(err, &refused) || refused.Verdict.Class != "private" || len(dialled) != 0 {
		t.Errorf("err = %v, dialled %v", err, dialled)
	}
}
