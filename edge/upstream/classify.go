// Package upstream owns how the secrets proxy reaches real servers: names are
// resolved by the configured resolver (never the hosts file for "uplink"),
// every address is classified before it is dialled and the very address that
// was classified is the one dialled, and upstream TLS is verified against the
// system roots plus the configured extra roots.
package upstream

import (
	"net/netip"
	"slices"
	"strings"
)

// AddressInput is everything the address classification looks at.
type AddressInput struct {
	// Addr is the address about to be dialled.
	Addr netip.AddrPort
	// AllowPrivate lists prefixes let through although internal
	// (upstream.allowPrivate). Never applies to Own.
	AllowPrivate []netip.Prefix
	// Own are the proxy's and the host API's listen addresses; an
	// unspecified IP there stands for every address in Local.
	Own []netip.AddrPort
	// Local are this host's interface addresses.
	Local []netip.Addr
}

// AddressVerdict is the classification with a human reason.
type AddressVerdict struct {
	Allowed bool
	// Class names the range the address falls in ("public" when none).
	Class  string
	Reason string
}

// internalClass names the internal range ip falls in, "" for none: every
// range the proxy never reaches unless allowPrivate says so, by class, the
// first match winning. IPv4-mapped IPv6 addresses are unmapped before the
// check. The ranges are text in the function, not a table built at start:
// a few dozen prefixes parse in about a microsecond, next to a dial.
func internalClass(ip netip.Addr) string {
	ranges := [...]struct{ class, prefixes string }{
		{"metadata", "169.254.169.254/32 fd00:ec2::254/128"},
		{"unspecified", "0.0.0.0/8 ::/128"},
		{"loopback", "127.0.0.0/8 ::1/128"},
		{"private", "10.0.0.0/8 172.16.0.0/12 192.168.0.0/16"},
		{"link-local", "169.254.0.0/16 fe80::/10"},
		{"cgnat", "100.64.0.0/10"},
		{"reserved", "192.0.0.0/24 192.0.2.0/24 198.18.0.0/15 198.51.100.0/24 203.0.113.0/24 240.0.0.0/4 100::/64 2001:db8::/32 fec0::/10"},
		{"multicast", "224.0.0.0/4 ff00::/8"},
		{"unique-local", "fc00::/7"},
		{"ipv4-compatible", "::/96"},
		{"nat64", "64:ff9b::/96 64:ff9b:1::/48"},
		{"6to4", "2002::/16"},
		{"teredo", "2001::/32"},
	}
	for _, r := range ranges {
		for _, p := range strings.Fields(r.prefixes) {
			if netip.MustParsePrefix(p).Contains(ip) {
				return r.class
			}
		}
	}
	return ""
}

// ClassifyAddress decides whether the proxy may dial an address: never one
// of its own listeners, never an internal range or one of this host's own
// interface addresses (a service bound to every address would answer a
// task there as on loopback) unless allowPrivate covers it, and any other
// address.
func ClassifyAddress(in AddressInput) AddressVerdict {
	ip := in.Addr.Addr().WithZone("")
	unmapped := ip.Unmap()
	if isOwn(unmapped, in.Addr.Port(), in) {
		return AddressVerdict{false, "own", "the proxy's or the host API's own address"}
	}
	class := internalClass(unmapped)
	if class == "" && slices.ContainsFunc(in.Local, func(l netip.Addr) bool { return l.WithZone("").Unmap() == unmapped }) {
		class = "host"
	}
	if class == "" {
		return AddressVerdict{true, "public", "a public address"}
	}
	what := "a " + class + " address"
	if class == "host" {
		what = "an address of this host's own"
	}
	for _, p := range in.AllowPrivate {
		if p.Contains(unmapped) || p.Contains(ip) {
			return AddressVerdict{true, class, what + " in upstream.allowPrivate " + p.String()}
		}
	}
	return AddressVerdict{false, class, what + ", not in upstream.allowPrivate"}
}

func isOwn(ip netip.Addr, port uint16, in AddressInput) bool {
	for _, own := range in.Own {
		if own.Port() != port {
			continue
		}
		oip := own.Addr().Unmap()
		if oip == ip {
			return true
		}
		if oip.IsUnspecified() {
			if ip.IsLoopback() || ip.IsUnspecified() {
				return true
			}
			for _, l := range in.Local {
				if l.Unmap() == ip {
					return true
				}
			}
		}
	}
	return false
}
