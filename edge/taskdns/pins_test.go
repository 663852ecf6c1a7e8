package taskdns

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/runfleet/runfleet/tests/kit/await"
)

func newPins(t *testing.T, max int) *Pins {
	t.Helper()
	p, err := NewPins(netip.MustParsePrefix(DefaultPinRange), max)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPinsGiveEachNameItsOwnAddressInTheRange(t *testing.T) {
	p := newPins(t, 10)
	a, ok := p.Pin("api.example.test")
	if !ok || a != netip.MustParseAddr("198.18.0.1") {
		t.Fatalf("first pin = %v %v, want 198.18.0.1 (the network address is never handed out)", a, ok)
	}
	again, _ := p.Pin("api.example.test")
	if again != a {
		t.Fatalf("same name pinned at %v then %v", a, again)
	}
	b, ok := p.Pin("other.example.test")
	if !ok || b == a || !netip.MustParsePrefix(DefaultPinRange).Contains(b) {
		t.Fatalf("second name pinned at %v %v (first at %v)", b, ok, a)
	}
	for _, tc := range []struct {
		addr string
		name string
		ok   bool
	}{
		{"198.18.0.1", "api.example.test", true},
		{"::ffff:198.18.0.1", "api.example.test", true}, // a dual-stack socket's form
		{b.String(), "other.example.test", true},
		{"198.18.0.3", "", false},       // not handed out yet
		{"198.18.0.0", "", false},       // the network address
		{"198.17.255.255", "", false},   // below the range
		{"10.0.0.1", "", false},         // elsewhere
		{"2001:db8::c612:1", "", false}, // IPv6 that is not a mapped IPv4
	} {
		name, ok := p.Name(netip.MustParseAddr(tc.addr))
		if name != tc.name || ok != tc.ok {
			t.Errorf("Name(%s) = %q %v, want %q %v", tc.addr, name, ok, tc.name, tc.ok)
		}
	}
}

func TestPinsStopAtMaxAndNeverReuseAnAddress(t *testing.T) {
	p := newPins(t, 3)
	seen := map[netip.Addr]string{}
	for i := range 3 {
		name := fmt.Sprintf("n%d.example.test", i)
		a, ok := p.Pin(name)
		if !ok {
			t.Fatalf("pin %d refused below max", i)
		}
		if prev, dup := seen[a]; dup {
			t.Fatalf("%s got %v, already %s's", name, a, prev)
		}
		seen[a] = name
	}
	if a, ok := p.Pin("n3.example.test"); ok || a.IsValid() {
		t.Fatalf("pin past max = %v %v, want refused", a, ok)
	}
	if a, ok := p.Pin("n1.example.test"); !ok || seen[a] != "n1.example.test" {
		t.Fatalf("a name pinned before max is reached keeps its address: got %v %v", a, ok)
	}
	if p.Len() != 3 {
		t.Fatalf("Len = %d, want 3", p.Len())
	}
	for a, name := range seen {
		if got, ok := p.Name(a); !ok || got != name {
			t.Errorf("Name(%v) = %q %v, want %q", a, got, ok, name)
		}
	}
}

func TestPinsFillASmallRangeUpToItsBroadcastAddress(t *testing.T) {
	p, err := NewPins(netip.MustParsePrefix("192.0.2.0/30"), 2)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := p.Pin("a.example.test")
	b, _ := p.Pin("b.example.test")
	if a != netip.MustParseAddr("192.0.2.1") || b != netip.MustParseAddr("192.0.2.2") {
		t.Fatalf("pins %v %v, want 192.0.2.1 and .2 (never .0 or .3)", a, b)
	}
}

func TestNewPinsNamesWhatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		prefix netip.Prefix
		max    int
		want   string
	}{
		{netip.Prefix{}, 10, "not a prefix"},
		{netip.MustParsePrefix("fd00::/64"), 10, "not IPv4"},
		{netip.MustParsePrefix("198.18.1.0/15"), 10, "host bits"},
		{netip.MustParsePrefix("198.18.0.0/15"), 0, "not 0"},
		{netip.MustParsePrefix("198.18.0.0/15"), -1, "not -1"},
		{netip.MustParsePrefix("198.18.0.0/15"), 131071, "at most 131070 names"},
		{netip.MustParsePrefix("192.0.2.0/31"), 1, "at most 0 names"},
		{netip.MustParsePrefix("192.0.2.1/32"), 1, "at most 0 names"},
	} {
		_, err := NewPins(tc.prefix, tc.max)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewPins(%v, %d) = %v, want an error with %q", tc.prefix, tc.max, err, tc.want)
		}
	}
	if _, err := NewPins(netip.MustParsePrefix(DefaultPinRange), 131070); err != nil {
		t.Errorf("the whole default range less two: %v", err)
	}
}

func TestPinsOfOneNameFromManyGoroutinesAgree(t *testing.T) {
	p := newPins(t, 100)
	const goroutines = 64
	got := make([]netip.Addr, goroutines)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range goroutines {
		wg.Go(func() {
			<-start
			// Every other goroutine also pins a name of its own, so that
			// allocation and lookup interleave.
			if i%2 == 0 {
				p.Pin(fmt.Sprintf("own%d.example.test", i))
			}
			got[i], _ = p.Pin("shared.example.test")
			p.Name(got[i])
		})
	}
	close(start)
	await.Group(t, "the concurrent pinners", &wg)
	for i, a := range got {
		if !a.IsValid() || a != got[0] {
			t.Fatalf("goroutine %d got %v, goroutine 0 got %v", i, a, got[0])
		}
	}
	if name, _ := p.Name(got[0]); name != "shared.example.test" {
		t.Fatalf("Name(%v) = %q", got[0], name)
	}
	if p.Len() != goroutines/2+1 {
		t.Fatalf("Len = %d, want %d", p.Len(), goroutines/2+1)
	}
}
