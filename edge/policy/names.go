package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// DefaultPort is the port a domain without one names: the proxy intercepts HTTPS.
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

// CanonicalName returns the canonical form of a DNS name: ASCII (punycode for
// an IDN), lower case, without a trailing dot. It refuses what can never be a
// proxiable name: an IP address in any spelling, a single label, a wildcard,
// a name whose last label is numeric (some resolvers read "127.1" as an
// address).
func CanonicalName(name string) (string, error) {
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

// String is "name" for port 443 and "name:port" otherwise, the form the
// policy is written in.
func (d Domain) String() string {
	if d.Port == DefaultPort {
		return d.Name
	}
	return d.Name + ":" + strconv.Itoa(d.Port)
}

// ParseDomain reads a policy domain, "name" (port 443) or "name:port".
func ParseDomain(s string) (Domain, error) {
	host, port := s, DefaultPort
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := parsePort(s[i+1:])
		if err != nil {
			return Domain{}, err
		}
		host, port = s[:i], p
	}
	name, err := CanonicalName(host)
	if err != nil {
		return Domain{}, err
	}
	return Domain{Name: name, Port: port}, nil
}

// parsePort accepts only a plain decimal port in 1..65535: no sign, no
// leading zero, so one port has one spelling.
func parsePort(s string) (int, error) {
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

// Authority is where a request says it goes: a canonical name or an IP
// literal, and a port. Exactly one of Name and IP is set.
type Authority struct {
	Name string
	IP   netip.Addr
	Port int
}

// Domain is the authority as a policy domain; ok is false for an IP literal,
// which no policy names.
func (a Authority) Domain() (Domain, bool) {
	if a.Name == "" {
		return Domain{}, false
	}
	return Domain{Name: a.Name, Port: a.Port}, true
}

// Host is the name or the IP as it is dialled (IPv6 without brackets).
func (a Authority) Host() string {
	if a.Name != "" {
		return a.Name
	}
	return a.IP.String()
}

// String is host:port, brackets around IPv6, the form of a CONNECT target.
func (a Authority) String() string {
	if a.Name != "" {
		return a.Name + ":" + strconv.Itoa(a.Port)
	}
	return netip.AddrPortFrom(a.IP, uint16(a.Port)).String()
}

// HostHeader is the authority as an HTTPS Host header: the port only when it
// is not 443.
func (a Authority) HostHeader() string {
	if a.Port == DefaultPort {
		if a.Name != "" {
			return a.Name
		}
		if a.IP.Is6() {
			return "[" + a.IP.String() + "]"
		}
		return a.IP.String()
	}
	return a.String()
}

// ParseAuthority reads a CONNECT target or a Host header. requirePort is true
// for a CONNECT (authority-form always carries a port); otherwise a missing
// port means 443. Brackets are accepted only around an IPv6 literal, and a
// name must be canonicalisable; anything else is an error.
func ParseAuthority(s string, requirePort bool) (Authority, error) {
	if s == "" {
		return Authority{}, errors.New("empty authority")
	}
	host, portText, hasPort := s, "", false
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return Authority{}, errors.New("unclosed bracket")
		}
		host = s[1:end]
		rest := s[end+1:]
		switch {
		case rest == "":
		case strings.HasPrefix(rest, ":"):
			portText, hasPort = rest[1:], true
		default:
			return Authority{}, errors.New("text after the bracketed address")
		}
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return Authority{}, errors.New("brackets hold only an IPv6 address")
		}
		port, err := authorityPort(portText, hasPort, requirePort)
		if err != nil {
			return Authority{}, err
		}
		return Authority{IP: ip, Port: port}, nil
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host, portText, hasPort = s[:i], s[i+1:], true
		if strings.Contains(host, ":") {
			return Authority{}, errors.New("an IPv6 address must be in brackets")
		}
	}
	port, err := authorityPort(portText, hasPort, requirePort)
	if err != nil {
		return Authority{}, err
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !ip.Is4() {
			return Authority{}, errors.New("an IPv6 address must be in brackets")
		}
		return Authority{IP: ip, Port: port}, nil
	}
	name, err := CanonicalName(host)
	if err != nil {
		return Authority{}, err
	}
	return Authority{Name: name, Port: port}, nil
}

func authorityPort(text string, present, required bool) (int, error) {
	if !present {
		if required {
			return 0, errors.New("missing port")
		}
		return DefaultPort, nil
	}
	return parsePort(text)
}

// SameAuthority reports whether two authorities name the same place.
func SameAuthority(a, b Authority) bool {
	return a.Name == b.Name && a.IP == b.IP && a.Port == b.Port
}
