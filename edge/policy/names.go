package policy

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"

	"github.com/runfleet/runfleet/shared/netname"
)

// Domain is one place a key may reach: a canonical name and a port. It is
// the run request's own (netname), so a domain Fleet accepted in a dispatch
// is the domain the policy compares.
type Domain = netname.Domain

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
	if a.Port == netname.DefaultPort {
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
	name, err := netname.Canonical(host)
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
		return netname.DefaultPort, nil
	}
	return netname.ParsePort(text)
}

// SameAuthority reports whether two authorities name the same place.
func SameAuthority(a, b Authority) bool {
	return a.Name == b.Name && a.IP == b.IP && a.Port == b.Port
}
