package policy

import (
	"net/netip"
	"testing"
)

func TestParseAuthority(t *testing.T) {
	for _, tc := range []struct {
		in          string
		requirePort bool
		want        Authority
		err         bool
	}{
		{"api.example.com:443", true, Authority{Name: "api.example.com", Port: 443}, false},
		{"API.example.com.:443", true, Authority{Name: "api.example.com", Port: 443}, false},
		{"api.example.com", true, Authority{}, true},
		{"api.example.com", false, Authority{Name: "api.example.com", Port: 443}, false},
		{"api.example.com:8443", false, Authority{Name: "api.example.com", Port: 8443}, false},
		{"api.example.com:0443", false, Authority{}, true},
		{"api.example.com:+443", false, Authority{}, true},
		{"api.example.com:", false, Authority{}, true},
		{"api.example.com:65536", false, Authority{}, true},
		{"[api.example.com]:443", true, Authority{}, true},
		{"[127.0.0.1]:443", true, Authority{}, true},
		{"[::1]:443", true, Authority{IP: netip.MustParseAddr("::1"), Port: 443}, false},
		{"[::1]", false, Authority{IP: netip.MustParseAddr("::1"), Port: 443}, false},
		{"::1:443", true, Authority{}, true},
		{"[::1]x:443", true, Authority{}, true},
		{"[fe80::1%eth0]:443", true, Authority{}, true},
		{"10.0.0.1:443", true, Authority{IP: netip.MustParseAddr("10.0.0.1"), Port: 443}, false},
		{"user@api.example.com:443", true, Authority{}, true},
		{"api.example.com:443:443", true, Authority{}, true},
	} {
		got, err := ParseAuthority(tc.in, tc.requirePort)
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("ParseAuthority(%q, %v) = %+v, %v; want %+v, error %v", tc.in, tc.requirePort, got, err, tc.want, tc.err)
		}
	}
}

// The host matcher: a CONNECT or Host names a key's domain only when its
// canonical form is exactly that domain.
func TestHostMatcher(t *testing.T) {
	allowed := []Granted{{Ref: KeyRef{"acme", "K"}, Domains: []Domain{{Name: "allowed.example", Port: 443}, {Name: "xn--bcher-kva.example", Port: 443}, {Name: "alt.example", Port: 8443}}, In: InHeader}}
	for _, tc := range []struct {
		target string
		want   ConnectAction
	}{
		{"allowed.example:443", Intercept},
		{"ALLOWED.Example:443", Intercept},
		{"allowed.example.:443", Intercept},
		{"bücher.example:443", Intercept},
		{"xn--bcher-kva.example:443", Intercept},
		{"alt.example:8443", Intercept},
		{"allowed.example.evil:443", Tunnel},
		{"evil-allowed.example:443", Tunnel},
		{"sub.allowed.example:443", Tunnel},
		{"аllowed.example:443", Tunnel}, // Cyrillic а: another name
		{"allowed.example:8443", Refuse},
		{"alt.example:443", Refuse},
	} {
		target, err := ParseAuthority(tc.target, true)
		if err != nil {
			t.Fatalf("%q: %v", tc.target, err)
		}
		got := DecideConnect(ConnectInput{Target: target, Granted: allowed, Egress: EgressOpen})
		if got.Action != tc.want {
			t.Errorf("CONNECT %q: %v (%s), want %v", tc.target, got.Action, got.Reason, tc.want)
		}
	}
}

func FuzzHostMatcher(f *testing.F) {
	for _, s := range []string{"allowed.example:443", "ALLOWED.example.:443", "[::1]:443", "allowed.example.evil:443", "xn--bcher-kva.example:443", "bücher.example:443", "a:1"} {
		f.Add(s)
	}
	allowed := Domain{Name: "allowed.example", Port: 443}
	granted := []Granted{{Ref: KeyRef{"p", "K"}, Domains: []Domain{allowed}, In: InHeader}}
	storable := []Granted{{Ref: KeyRef{"p", "K"}, Domains: []Domain{allowed}, In: InHeader | InBody}}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAuthority(s, true)
		if err != nil {
			return
		}
		// A parsed name is canonical: parsing its own form gives it back.
		again, err := ParseAuthority(a.String(), true)
		if err != nil || again != a {
			t.Fatalf("%q parsed to %+v, whose form %q parses to %+v, %v", s, a, a.String(), again, err)
		}
		d := DecideConnect(ConnectInput{Target: a, Granted: granted, Egress: EgressStrict})
		// Invariant: only the exact canonical domain is intercepted.
		if (d.Action == Intercept) != (a.Name == allowed.Name && a.Port == allowed.Port) {
			t.Fatalf("%q (%+v) decided %v", s, a, d.Action)
		}
		// Invariant: a task holding a key an upstream may store never
		// tunnels, and one holding header keys alone never intercepts
		// what no key reaches.
		if d := DecideConnect(ConnectInput{Target: a, Granted: storable, Egress: EgressOpen}); d.Action == Tunnel {
			t.Fatalf("%q (%+v) tunnelled for a task with a body key", s, a)
		}
		if d := DecideConnect(ConnectInput{Target: a, Granted: granted, Egress: EgressOpen}); d.Action == InterceptToScrub {
			t.Fatalf("%q (%+v) intercepted to scrub for a task with a header key", s, a)
		}
		dec := DecideSubstitution(SubstituteInput{Task: "t", Authority: a, Granted: granted,
			Occurrence: Occurrence{Owner: "t", Ref: KeyRef{"p", "K"}, Location: InHeader}})
		if dec.Allow != (a.Name == allowed.Name && a.Port == allowed.Port) {
			t.Fatalf("%q (%+v): substitution allowed=%v", s, a, dec.Allow)
		}
	})
}
