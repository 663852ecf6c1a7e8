// Package redact is edge's last line of defence against a real value in a
// log: a Set of the real values the secrets proxy has read since edge
// started, and a Writer that passes every Write through the Set before it
// reaches edge's log (stderr) or the audit file, replacing each held value
// with Mark. The proxy is built so that no value reaches a log at all
// (secrets.Value cannot print itself; errors never quote a substituted
// field); this catches what a future change gets wrong.
//
// Contract:
//
//   - Each Write (each Redact call) is redacted on its own: a value split
//     across two Writes is not found. edge's writers write whole lines in
//     one Write (slog's handlers one per record, the audit log one per
//     line), so a value anywhere in a line is always found.
//   - A value is found in the forms edge's encoders give it: as it is or
//     lower-cased (a host name is canonicalised to lower case), each also
//     JSON-escaped (slog's and encoding/json's HTML-safe escaping) and
//     Go-quoted (%q, strconv.Quote, strconv.QuoteToASCII), up to two
//     encodings deep (an error quoting it, logged as JSON); byte for byte
//     otherwise. A value transformed any other way (upper-cased, base64, a
//     hex dump, a cut) is not recognised.
//   - Every occurrence is replaced, overlapping ones merged into one Mark,
//     so no part of a value that was found remains.
//   - The Set is bounded: it holds the MaxValues distinct values added
//     most recently. Past the bound the oldest added is forgotten and
//     counted (Evicted); a value still in use is added again at its next
//     read, since the proxy reads a value per request. A value forgotten
//     and not read again is no longer redacted.
//   - A value is only known once read: one the proxy has never read since
//     start (a key no request used yet) is not redacted.
package redact

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/runfleet/runfleet/edge/secrets"
)

// Mark replaces every value found.
const Mark = "[redacted]"

// MaxValues bounds how many distinct values a Set holds (each costs its
// forms' bytes and a search per line): far more than the keys a host's
// policy grants, so eviction means churn (rotations) rather than use.
const MaxValues = 1024

// Set is the values to redact. Add and Redact are safe for concurrent use;
// Redact takes no lock (it reads an immutable snapshot).
type Set struct {
	max     int
	mu      sync.Mutex // serialises Add's copy-on-write
	snap    atomic.Pointer[snapshot]
	evicted atomic.Int64
}

// snapshot is one immutable state of the Set.
type snapshot struct {
	// known holds each value as it is: Add's fast path.
	known map[string]struct{}
	// order is the values by age, oldest first (eviction), with their
	// forms.
	order []entry
	// forms are every value's forms, the byte strings searched for:
	// those of 4 bytes or more found through their first 4 bytes (byPrefix,
	// with seen as its filter, one bit per hashed prefix), the shorter ones
	// (short) one by one.
	byPrefix map[uint32][][]byte
	seen     *[filterWords]uint64
	short    [][]byte
	// minLen is the shortest form of 4 bytes or more, and shift says how
	// far a window of minLen bytes may move on when its last two bytes hash
	// to a slot (Wu-Manber): by as much as no form's first minLen bytes
	// could hold them nearer its end, 0 where they end them, so only a
	// window that may start a form is looked at.
	minLen int
	shift  *[shiftSlots]uint8
}

// shiftSlots sizes the shift table: 4 KiB, one slot per hashed pair of
// bytes (colliding pairs share the smaller shift, which is always safe).
const shiftSlots = 1 << 12

// pairSlot hashes the two bytes that end a window to a shift slot.
func pairSlot(a, b byte) uint32 { return (uint32(a)<<8 | uint32(b)) * 0x9E3779B1 >> (32 - 12) }

// filterWords sizes the prefix filter: 64 Kibit (8 KiB), so a line without
// a value costs one bit test per byte.
const filterWords = 1 << 10

func prefixOf(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// filterBit hashes a prefix to one of the filter's bits.
func filterBit(p uint32) uint32 { return (p * 0x9E3779B1) >> 16 }

type entry struct {
	raw   string
	forms [][]byte
}

// NewSet returns an empty Set holding at most max values; max <= 0 means
// MaxValues.
func NewSet(max int) *Set {
	if max <= 0 {
		max = MaxValues
	}
	s := &Set{max: max}
	s.snap.Store(&snapshot{known: map[string]struct{}{}, seen: new([filterWords]uint64)})
	return s
}

// Add makes v redacted from now on. The proxy calls it on every read of a
// value: a value already held costs one map lookup and no allocation. An
// empty value is ignored.
func (s *Set) Add(v secrets.Value) {
	raw := v.Reveal()
	if raw == "" {
		return
	}
	if _, ok := s.snap.Load().known[raw]; ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.snap.Load()
	if _, ok := old.known[raw]; ok {
		return
	}
	order := append(slices.Clip(old.order), entry{raw, forms(raw)})
	if len(order) > s.max {
		order = order[len(order)-s.max:]
		s.evicted.Add(1)
	}
	next := &snapshot{known: make(map[string]struct{}, len(order)), order: order,
		byPrefix: map[uint32][][]byte{}, seen: new([filterWords]uint64)}
	for _, e := range order {
		next.known[e.raw] = struct{}{}
		for _, f := range e.forms {
			if len(f) < 4 {
				next.short = append(next.short, f)
				continue
			}
			p := prefixOf(f)
			next.byPrefix[p] = append(next.byPrefix[p], f)
			bit := filterBit(p)
			next.seen[bit/64] |= 1 << (bit % 64)
			if next.minLen == 0 || len(f) < next.minLen {
				next.minLen = len(f)
			}
		}
	}
	next.shift = shiftTable(next.byPrefix, next.minLen)
	s.snap.Store(next)
}

// shiftTable is the shift table for windows of m bytes over forms (all of
// m bytes or more): a pair of bytes ending at index j of a form's first m
// bytes allows a shift of m-1-j at most; a pair no form's first m bytes
// hold, m-1 (capped to fit a byte: a smaller shift is always safe).
func shiftTable(forms map[uint32][][]byte, m int) *[shiftSlots]uint8 {
	t := new([shiftSlots]uint8)
	for i := range t {
		t[i] = uint8(min(m-1, 255))
	}
	for _, fs := range forms {
		for _, f := range fs {
			for j := 1; j < m; j++ {
				if h := pairSlot(f[j-1], f[j]); int(t[h]) > m-1-j {
					t[h] = uint8(m - 1 - j)
				}
			}
		}
	}
	return t
}

// Len is how many values the Set holds.
func (s *Set) Len() int { return len(s.snap.Load().order) }

// Evicted counts the values forgotten past the bound since the Set was
// made.
func (s *Set) Evicted() int64 { return s.evicted.Load() }

// forms are the ways edge's encoders write raw: as it is and lower-cased,
// each JSON-escaped without and with HTML escaping, Go-quoted (also
// ASCII-only), and each of those encoded once more (an error quoting a
// value with %q, logged as JSON); each without its quotes, each once.
func forms(raw string) [][]byte {
	out := [][]byte{[]byte(raw)}
	add := func(f []byte) {
		if len(f) > 0 && !slices.ContainsFunc(out, func(g []byte) bool { return bytes.Equal(f, g) }) {
			out = append(out, f)
		}
	}
	add([]byte(strings.ToLower(raw)))
	for range 2 {
		for _, f := range slices.Clone(out) {
			for _, enc := range encoders {
				add(enc(string(f)))
			}
		}
	}
	return out
}

// encoders are the escapings edge's writers apply to a string, each
// returning it without the quotes it adds.
var encoders = []func(string) []byte{
	func(s string) []byte { return jsonString(s, false) },
	func(s string) []byte { return jsonString(s, true) },
	func(s string) []byte { return unquote([]byte(strconv.Quote(s))) },
	func(s string) []byte { return unquote([]byte(strconv.QuoteToASCII(s))) },
}

func jsonString(s string, html bool) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(html)
	if enc.Encode(s) != nil {
		return nil
	}
	return unquote(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
}

func unquote(q []byte) []byte {
	if len(q) >= 2 {
		q = q[1 : len(q)-1]
	}
	return bytes.Clone(q)
}

// Redact returns line with every held value replaced by Mark: line itself
// (no allocation) when it holds none, else a new slice.
func (s *Set) Redact(line []byte) []byte {
	snap := s.snap.Load()
	var spans [][2]int
	for _, f := range snap.short {
		spans = appendAll(spans, line, f)
	}
	if m := snap.minLen; m > 0 {
		// i is the last byte of a window of m bytes that may start a form
		// (snapshot.shift); most windows move on by nearly m bytes at once.
		for i := m - 1; i < len(line); {
			if d := snap.shift[pairSlot(line[i-1], line[i])]; d > 0 {
				i += int(d)
				continue
			}
			start := i - m + 1
			i++
			p := prefixOf(line[start:])
			bit := filterBit(p)
			if snap.seen[bit/64]&(1<<(bit%64)) == 0 {
				continue
			}
			for _, f := range snap.byPrefix[p] {
				if bytes.HasPrefix(line[start:], f) {
					spans = append(spans, [2]int{start, start + len(f)})
				}
			}
		}
	}
	if len(spans) == 0 {
		return line
	}
	slices.SortFunc(spans, func(a, b [2]int) int { return a[0] - b[0] })
	out := make([]byte, 0, len(line))
	pos := 0
	for i := 0; i < len(spans); {
		start, end := spans[i][0], spans[i][1]
		for i++; i < len(spans) && spans[i][0] < end; i++ {
			end = max(end, spans[i][1])
		}
		out = append(out, line[pos:start]...)
		out = append(out, Mark...)
		pos = end
	}
	return append(out, line[pos:]...)
}

// appendAll appends every occurrence of f in line, overlapping ones too.
func appendAll(spans [][2]int, line, f []byte) [][2]int {
	for pos := 0; pos+len(f) <= len(line); {
		i := bytes.Index(line[pos:], f)
		if i < 0 {
			break
		}
		spans = append(spans, [2]int{pos + i, pos + i + len(f)})
		pos += i + 1
	}
	return spans
}

// Writer returns an io.Writer that writes each Write, redacted, to w.
func (s *Set) Writer(w io.Writer) io.Writer { return writer{s, w} }

type writer struct {
	s *Set
	w io.Writer
}

// Write reports len(b) written when the redacted bytes were written whole:
// the caller's bytes are consumed, whatever the redaction made of them.
func (w writer) Write(b []byte) (int, error) {
	if _, err := w.w.Write(w.s.Redact(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}
