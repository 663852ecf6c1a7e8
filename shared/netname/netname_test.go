package netname

import (
	"strings"
	"testing"
)

func TestCanonical(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"api.example.com", "api.example.com", ""},
		{"API.Example.COM", "api.example.com", ""},
		{"api.example.com.", "api.example.com", ""},
		{"bücher.example", "xn--bcher-kva.example", ""},
		{"XN--BCHER-KVA.example", "xn--bcher-kva.example", ""},
		{"ＡＰＩ.example.com", "api.example.com", ""}, // full-width letters fold
		{"*.example.com", "", "wildcard"},
		{"example", "", "single-label"},
		{"localhost", "", "single-label"},
		{"127.0.0.1", "", "IP address"},
		{"[::1]", "", "IP address"},
		{"::1", "", "IP address"},
		{"１２７.０.０.１", "", "IP address"}, // full-width digits map to an IPv4 address
		{"127.1", "", "numeric"},
		{"0x7f.1", "", "numeric"},
		{"a..b", "", "not a valid"},
		{"a.example..", "", "not a valid"},
		{"", "", "empty"},
		{"under_score.example", "", "not a valid"},
		{"sp ace.example", "", "not a valid"},
	} {
		got, err := Canonical(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Canonical(%q) = %q, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Canonical(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
