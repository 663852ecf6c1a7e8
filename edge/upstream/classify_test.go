package upstream

import (
	"net/netip"
	"testing"
)

func TestClassifyAddress(t *testing.T) {
	loop := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	own := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:7071"), netip.MustParseAddrPort("0.0.0.0:7070")}
	local := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("93.184.216.40")}
	for _, tc := range []struct {
		addr    string
		allow   []netip.Prefix
		allowed bool
		class   string
	}{
		{"93.184.216.34:443", nil, true, "public"},
		{"[2606:2800:220:1::1]:443", nil, true, "public"},
		{"127.0.0.1:443", nil, false, "loopback"},
		{"127.0.0.1:443", loop, true, "loopback"},
		{"[::ffff:127.0.0.1]:443", nil, false, "loopback"},
		{"[::ffff:127.0.0.1]:443", loop, true, "loopback"},
		{"[::1]:443", loop, false, "loopback"},
		{"10.1.2.3:443", nil, false, "private"},
		{"[::ffff:10.1.2.3]:443", nil, false, "private"},
		{"172.16.0.1:443", nil, false, "private"},
		{"192.168.1.1:443", nil, false, "private"},
		{"169.254.169.254:80", nil, false, "metadata"},
		{"[::ffff:169.254.169.254]:80", nil, false, "metadata"},
		{"[::ffff:a9fe:a9fe]:80", nil, false, "metadata"},
		{"169.254.1.1:443", nil, false, "link-local"},
		{"[fe80::1]:443", nil, false, "link-local"},
		{"100.64.0.1:443", nil, false, "cgnat"},
		{"[fd12::1]:443", nil, false, "unique-local"},
		{"[64:ff9b::7f00:1]:443", loop, false, "nat64"},
		{"[2002:7f00:1::1]:443", nil, false, "6to4"},
		{"[2001:0:4136:e378::1]:443", nil, false, "teredo"},
		{"[::7f00:1]:443", nil, false, "ipv4-compatible"},
		{"0.0.0.0:443", nil, false, "unspecified"},
		{"[::]:443", nil, false, "unspecified"},
		{"224.0.0.1:443", nil, false, "multicast"},
		{"255.255.255.255:443", nil, false, "reserved"},
		// The proxy itself and the host API: refused even inside allowPrivate.
		{"127.0.0.1:7071", loop, false, "own"},
		{"[::ffff:127.0.0.1]:7071", loop, false, "own"},
		{"127.0.0.1:7070", loop, false, "own"}, // API listens on 0.0.0.0
		{"192.0.2.10:7070", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, false, "own"},
		{"127.0.0.2:7071", loop, true, "loopback"},
		// A public address of this host's own: any service bound to every
		// address answers there as on loopback.
		{"93.184.216.40:5432", nil, false, "host"},
		{"[::ffff:93.184.216.40]:5432", nil, false, "host"},
		{"93.184.216.40:5432", []netip.Prefix{netip.MustParsePrefix("93.184.216.40/32")}, true, "host"},
		{"93.184.216.41:5432", nil, true, "public"},
	} {
		v := ClassifyAddress(AddressInput{Addr: netip.MustParseAddrPort(tc.addr), AllowPrivate: tc.allow, Own: own, Local: local})
		if v.Allowed != tc.allowed || v.Class != tc.class {
			t.Errorf("%s (allow %v): %+v, want allowed=%v class=%s", tc.addr, tc.allow, v, tc.allowed, tc.class)
		}
	}
}
