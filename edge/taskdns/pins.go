package taskdns

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
)

// DefaultPinRange is the prefix pins come from unless edge is told
// otherwise: 198.18.0.0/15 is reserved for benchmarking (RFC 2544, RFC 6890),
// so it is never a real destination, and fake-IP proxies use it for this
// same purpose. A string, so that it cannot be changed at run time.
const DefaultPinRange = "198.18.0.0/15"

// DefaultMaxPins is a bound for one attempt's names: far above what a tool
// resolves in a run (tens to hundreds of names), and at most about a
// megabyte of names if a task queries random ones.
const DefaultMaxPins = 4096

// Pins maps names to addresses of one attempt's pin range and back. Safe for
// concurrent use.
//
// A pin is not a grant: it only says which name a task resolved to get an
// address, and whoever receives a connection to a pin applies the policy to
// that name at that moment (the policy may have changed since the answer).
// Pins does not canonicalise: the Server pins the netname.Canonical form.
type Pins struct {
	first uint32 // the address of names[0], as a number
	max   int

	mu     sync.Mutex
	byName map[string]uint32 // name -> its index in names
	names  []string          // names[i] is pinned at first+i; only appended to
}

// NewPins makes an empty table. prefix is an IPv4 prefix (DefaultPinRange
// parsed); its first and last addresses (network and broadcast) are never
// handed out, since some software treats them specially. max bounds how many
// names one attempt may pin (memory bound against a task querying random
// names) and must fit in the prefix. The error names what is wrong.
func NewPins(prefix netip.Prefix, max int) (*Pins, error) {
	switch {
	case !prefix.IsValid():
		return nil, fmt.Errorf("taskdns: pin range %v is not a prefix", prefix)
	case !prefix.Addr().Is4():
		return nil, fmt.Errorf("taskdns: pin range %v is not IPv4", prefix)
	case prefix.Masked() != prefix:
		return nil, fmt.Errorf("taskdns: pin range %v has host bits set (the prefix is %v)", prefix, prefix.Masked())
	}
	room := uint64(1)<<(32-prefix.Bits()) - 2
	if prefix.Bits() > 30 {
		room = 0
	}
	if max <= 0 || uint64(max) > room {
		return nil, fmt.Errorf("taskdns: at most %d names fit in pin range %v, so max must be 1 to %d, not %d", room, prefix, room, max)
	}
	return &Pins{
		first:  toUint(prefix.Addr()) + 1,
		max:    max,
		byName: make(map[string]uint32),
	}, nil
}

// Pin returns name's address, allocating the next free one on first use; ok
// is false once max names are pinned (a name pinned before still gets its
// address). The same name always gets the same address for the Pins' life;
// addresses are never reused.
func (p *Pins) Pin(name string) (addr netip.Addr, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, ok := p.byName[name]
	if !ok {
		if len(p.names) >= p.max {
			return netip.Addr{}, false
		}
		i = uint32(len(p.names))
		p.names = append(p.names, name)
		p.byName[name] = i
	}
	return fromUint(p.first + i), true
}

// Name returns the name pinned at addr (that exact address; IPv4 or
// IPv4-mapped IPv6, as a dual-stack socket reports it).
func (p *Pins) Name(addr netip.Addr) (string, bool) {
	addr = addr.Unmap()
	if !addr.Is4() {
		return "", false
	}
	v := toUint(addr)
	if v < p.first {
		return "", false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := uint64(v - p.first); i < uint64(len(p.names)) {
		return p.names[i], true
	}
	return "", false
}

// Len is how many names are pinned.
func (p *Pins) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.names)
}

func toUint(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func fromUint(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}
