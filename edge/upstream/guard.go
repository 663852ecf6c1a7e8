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

	"github.com/runfleet/runfleet/edge/config"
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

// NewResolver builds the resolver upstream.resolver and upstream.resolve
// describe: the pins first, then "uplink" or "system". Pinned names are
// canonicalised by the caller's config (they are matched as written, lower
// case, without a trailing dot).
func NewResolver(c config.Upstream, uplink *UplinkResolver) (Resolver, error) {
	var next Resolver
	switch c.Resolver {
	case config.ResolverUplink, "":
		if uplink == nil {
			uplink = &UplinkResolver{}
		}
		next = uplink
	case config.ResolverSystem:
		next = net.DefaultResolver
	default:
		return nil, fmt.Errorf("upstream.resolver: %q is not %q or %q", c.Resolver, config.ResolverUplink, config.ResolverSystem)
	}
	if len(c.Resolve) == 0 {
		return next, nil
	}
	pins := make(map[string]netip.Addr, len(c.Resolve))
	for name, addr := range c.Resolve {
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return nil, fmt.Errorf("upstream.resolve: %q maps to %q, which is not an IP address", name, addr)
		}
		pins[strings.ToLower(strings.TrimSuffix(name, "."))] = ip
	}
	return &PinnedResolver{Pins: pins, Next: next}, nil
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
