// Package upstream owns how the secrets proxy reaches real servers: names are
// resolved by the configured resolver (never the hosts file for "uplink"),
// every address is classified before it is dialled and the very address that
// was classified is the one dialled, and upstream TLS is verified against the
// system roots plus the configured extra roots.
package upstream

import (
	"net/netip"
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

type namedPrefix struct {
	prefix netip.Prefix
	class  string
}

// internal lists every range the proxy never reaches unless allowPrivate
// says so. IPv4-mapped IPv6 addresses are unmapped before the check.
var internal = func() []namedPrefix {
	var out []namedPrefix
	add := func(class string, prefixes ...string) {
		for _, p := range prefixes {
			out = append(out, namedPrefix{netip.MustParsePrefix(p), class})
		}
	}
	add("metadata", "169.254.169.254/32", "fd00:ec2::254/128")
	add("unspecified", "0.0.0.0/8", "::/128")
	add("loopback", "127.0.0.0/8", "::1/128")
	add("private", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
	add("link-local", "169.254.0.0/16", "fe80::/10")
	add("cgnat", "100.64.0.0/10")
	add("reserved", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4", "100::/64", "2001:db8::/32", "fec0::/10")
	add("multicast", "224.0.0.0/4", "ff00::/8")
	add("unique-local", "fc00::/7")
	add("ipv4-compatible", "::/96")
	add("nat64", "64:ff9b::/96", "64:ff9b:1::/48")
	add("6to4", "2002::/16")
	add("teredo", "2001::/32")
	return out
}()

// ClassifyAddress decides whether the proxy may dial an address: never one
// of its own listeners, never an internal range unless allowPrivate covers
// it, and any other address.
func ClassifyAddress(in AddressInput) AddressVerdict {
	ip := in.Addr.Addr().WithZone("")
	unmapped := ip.Unmap()
	if isOwn(unmapped, in.Addr.Port(), in) {
		return AddressVerdict{false, "own", "the proxy's or the host API's own address"}
	}
	class := "public"
	for _, np := range internal {
		if np.prefix.Contains(unmapped) {
			class = np.class
			break
		}
	}
	if class == "public" {
		return AddressVerdict{true, class, "a public address"}
	}
	for _, p := range in.AllowPrivate {
		if p.Contains(unmapped) || p.Contains(ip) {
			return AddressVerdict{true, class, "a " + class + " address in upstream.allowPrivate " + p.String()}
		}
	}
	return AddressVerdict{false, class, "a " + class + " address, not in upstream.allowPrivate"}
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
