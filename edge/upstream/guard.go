package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrRefused marks a dial the guard refused: every address the name resolved
// to is internal (or the proxy's own). errors.Is(err, ErrRefused).
var ErrRefused = errors.New("upstream: address refused")

// RefusedError says which address was refused and why.
type RefusedError struct {
	Host    string
	Addr    netip.AddrPort
	Verdict AddressVerdict
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("upstream: %s resolves to %s: %s", e.Host, e.Addr, e.Verdict.Reason)
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// GuardConfig configures a Guard.
type GuardConfig struct {
	// Resolver resolves names. Required.
	Resolver Resolver
	// AllowPrivate: internal ranges let through (upstream.allowPrivate).
	AllowPrivate []netip.Prefix
	// Own are the proxy's and the host API's listen addresses, refused always.
	Own []netip.AddrPort
	// LocalAddrs returns this host's interface addresses; nil means the
	// system's.
	LocalAddrs func() []netip.Addr
	// Dial connects to the exact address chosen; nil means a net.Dialer with
	// a 10s timeout.
	Dial DialFunc
}

// Validate reports a missing resolver.
func (c *GuardConfig) Validate() error {
	if c.Resolver == nil {
		return errors.New("upstream guard: Resolver is required")
	}
	return nil
}

// Guard dials upstreams: it resolves a name, classifies each address, and
// dials exactly an address it allowed. Safe for concurrent use.
type Guard struct {
	cfg GuardConfig
}

// NewGuard checks cfg and fills its defaults.
func NewGuard(cfg GuardConfig) (*Guard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.LocalAddrs == nil {
		cfg.LocalAddrs = InterfaceAddrs
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	return &Guard{cfg: cfg}, nil
}

// DialContext is the guarded dial for "tcp" to "host:port". An IP literal
// is classified as it is; a name is resolved first. It returns a
// *RefusedError when no address is allowed.
func (g *Guard) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("upstream: dialing %q: %w", address, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("upstream: dialing %q: bad port", address)
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		addrs, err = g.cfg.Resolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("upstream: resolving %s: %w", host, err)
		}
	}
	local := g.cfg.LocalAddrs()
	var refused *RefusedError
	var dialErr error
	for _, ip := range addrs {
		target := netip.AddrPortFrom(ip, uint16(port))
		v := ClassifyAddress(AddressInput{Addr: target, AllowPrivate: g.cfg.AllowPrivate, Own: g.cfg.Own, Local: local})
		if !v.Allowed {
			if refused == nil {
				refused = &RefusedError{Host: host, Addr: target, Verdict: v}
			}
			continue
		}
		conn, err := g.cfg.Dial(ctx, "tcp", target.String())
		if err == nil {
			return conn, nil
		}
		dialErr = err
	}
	if dialErr != nil {
		return nil, fmt.Errorf("upstream: dialing %s: %w", host, dialErr)
	}
	if refused != nil {
		return nil, refused
	}
	return nil, fmt.Errorf("upstream: resolving %s: no addresses", host)
}

// ParseAllowPrivate reads upstream.allowPrivate.
func ParseAllowPrivate(cidrs []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("upstream.allowPrivate: %q is not a CIDR", c)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Resolver kinds (proxy.upstream.resolver): what answers the names no pin
// covers.
const (
	// ResolverUplink: the machine's uplink DNS servers, never a stub on
	// this host nor the hosts file (UplinkResolver).
	ResolverUplink = "uplink"
	// ResolverSystem: Go's own resolver, as the system configures it
	// (net.DefaultResolver).
	ResolverSystem = "system"
	// DefaultResolver is the kind NewResolver takes for "".
	DefaultResolver = ResolverUplink
)

// NewResolver builds the resolver proxy.upstream.resolver (kind) and
// proxy.upstream.resolve (pins: name to IP) describe: the pins first, then
// the kind's resolver. Pinned names are canonicalised by the caller's
// config (they are matched as written, lower case, without a trailing dot).
func NewResolver(kind string, pins map[string]string, uplink *UplinkResolver) (Resolver, error) {
	if kind == "" {
		kind = DefaultResolver
	}
	var next Resolver
	switch kind {
	case ResolverUplink:
		if uplink == nil {
			uplink = &UplinkResolver{}
		}
		next = uplink
	case ResolverSystem:
		next = net.DefaultResolver
	default:
		return nil, fmt.Errorf("upstream.resolver: %q is not %q or %q", kind, ResolverUplink, ResolverSystem)
	}
	if len(pins) == 0 {
		return next, nil
	}
	pinned := make(map[string]netip.Addr, len(pins))
	for name, addr := range pins {
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return nil, fmt.Errorf("upstream.resolve: %q maps to %q, which is not an IP address", name, addr)
		}
		pinned[strings.ToLower(strings.TrimSuffix(name, "."))] = ip
	}
	return &PinnedResolver{Pins: pinned, Next: next}, nil
}

// ClientTLSConfig is the upstream TLS configuration: always verified,
// against the system roots plus the PEM certificates of extraRootsFile.
func ClientTLSConfig(extraRootsFile string) (*tls.Config, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if extraRootsFile != "" {
		pem, err := os.ReadFile(extraRootsFile)
		if err != nil {
			return nil, fmt.Errorf("upstream.extraRootsFile: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("upstream.extraRootsFile %s: no PEM certificate in it", extraRootsFile)
		}
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
