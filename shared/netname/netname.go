// Package netname owns how runfleet names a place on the network: the
// canonical form of a DNS name, and a domain (a canonical name and a port),
// the place a secret may reach. Fleet checks a run's declared domains and
// edge compiles its policy, matches a CONNECT, an SNI and a task's DNS
// question with these same functions, so the two halves cannot disagree on
// what a name is.
//
// A canonical name is ASCII (punycode for an IDN), lower case, with no
// trailing dot, and is a fixed point of canonicalisation; an IP address in
// any spelling, a single label, a wildcard and a name whose last label is
// numeric are never names (DESIGN.md, section "The secrets proxy").
package netname

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// DefaultPort is the port a domain without one names: the proxy intercepts
// HTTPS.
const DefaultPort = 443

// idnaProfile maps a name the way a lookup would (lower case, width folding,
// IDNA 2008 with UTS 46 mapping) and checks label lengths, so two spellings of
// one name always compare equal after canonicalisation.
var idnaProfile = idna.New(
	idna.MapForLookup(),
	idna.BidiRule(),
	idna.VerifyDNSLength(true),
	idna.Transitional(false),
)

// Canonical returns the canonical form of a DNS name. It refuses what can
// never be a proxiable name: an IP address in any spelling, a single label,
// a wildcard, a name whose last label is numeric (some resolvers read
// "127.1" as an address).
func Canonical(name string) (string, error) {
	if name == "" {
		return "", errors.New("empty name")
	}
	if strings.ContainsAny(name, "*") {
		return "", errors.New("a wildcard is not allowed: list each name")
	}
	if strings.HasPrefix(name, "[") || isIP(name) {
		return "", errors.New("an IP address is not allowed: use a name")
	}
	if !utf8.ValidString(name) {
		return "", errors.New("not a valid DNS name: not UTF-8")
	}
	trimmed := strings.TrimSuffix(name, ".")
	ascii, err := idnaProfile.ToASCII(trimmed)
	if err != nil || ascii == "" {
		return "", errors.New("not a valid DNS name")
	}
	ascii = strings.ToLower(ascii)
	// Canonical means a fixed point: the form given back must map to itself
	// (its punycode labels decode and validate).
	if again, err := idnaProfile.ToASCII(ascii); err != nil || again != ascii {
		return "", errors.New("not a valid DNS name")
	}
	if isIP(ascii) {
		return "", errors.New("an IP address is not allowed: use a name")
	}
	labels := strings.Split(ascii, ".")
	if len(labels) < 2 {
		return "", errors.New("a single-label name is not allowed: use a fully qualified name")
	}
	for _, l := range labels {
		if l == "" {
			return "", errors.New("not a valid DNS name: empty label")
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return "", fmt.Errorf("not a valid DNS name: %q in a label", r)
			}
		}
	}
	if _, err := strconv.ParseUint(labels[len(labels)-1], 10, 64); err == nil {
		return "", errors.New("a name whose last label is numeric is not allowed")
	}
	return ascii, nil
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(strings.TrimSuffix(s, "."))
	return err == nil
}

// Domain is one place a key may reach: a canonical name and a port.
type Domain struct {
	Name string
	Port int
}

// String is "name" for port 443 and "name:port" otherwise, the form a
// policy and a run request write it in.
func (d Domain) String() string {
	if d.Port == DefaultPort {
		return d.Name
	}
	return d.Name + ":" + strconv.Itoa(d.Port)
}

// ParseDomain reads a domain as written, "name" (port 443) or "name:port".
func ParseDomain(s string) (Domain, error) {
	host, port := s, DefaultPort
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := ParsePort(s[i+1:])
		if err != nil {
			return Domain{}, err
		}
		host, port = s[:i], p
	}
	name, err := Canonical(host)
	if err != nil {
		return Domain{}, err
	}
	return Domain{Name: name, Port: port}, nil
}

// ParsePort accepts only a plain decimal port in 1..65535: no sign, no
// leading zero, so one port has one spelling.
func ParsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("invalid port %q", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("invalid port %q", s)
		}
	}
	p, _ := strconv.Atoi(s)
	if p < 1 || p > 65535 {
		return 0, fmt.Errorf("invalid port %q", s)
	}
	return p, nil
}
