// Package redact is edge's last line of defence against a real value in a
// log, and the index of the secrets proxy's tripwire: a Set of the real
// values the secrets proxy has read since edge started, a Writer that
// passes every Write through the Set before it reaches edge's log (stderr)
// or the audit file, replacing each held value with Mark, and Find and
// Pending, which look for the same values in what a task sends. The proxy
// is built so that no value reaches a log at all (secrets.Value cannot
// print itself; errors never quote a substituted field); this catches what
// a future change gets wrong.
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
//     otherwise. A value of FindMinLen bytes or more is also found in the
//     forms a request carries it (requestForms): percent-encoded, and
//     inside base64 (standard or URL-safe) wherever it starts in the
//     encoded bytes. A value transformed any other way (upper-cased, a hex
//     dump, a cut) is not recognised.
//   - Every occurrence is replaced, overlapping ones merged into one Mark,
//     so no part of a value that was found remains (of a base64 form, the
//     one or two characters at its ends that also encode a neighbouring
//     byte may remain).
//   - Find and Pending look for the values of FindMinLen bytes or more
//     only, in all their forms: a shorter value (a port, a user name, a
//     word) would match ordinary text, and blocking a request is not a
//     redaction.
//   - The Set is bounded: it holds the MaxValues distinct values added
//     most recently. Past the bound the oldest added is forgotten and
//     counted (Evicted); a value still in use is added again at its next
//     read, since the proxy reads a value per request. A value forgotten
//     and not read again is no longer redacted nor found.
//   - A value is only known once read: one the proxy has never read since
//     start (a key no request used yet) is not redacted nor found.
package redact

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/url"
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

// FindMinLen is the shortest value Find and Pending look for, and given a
// request's forms: real credentials are longer (an AWS access key id has
// 20 characters, API tokens 30 and more), while a short value (a port, a
// user name, a word) would be found in ordinary requests.
const FindMinLen = 12

// Set is the values to redact. Add, Redact, Find and Pending are safe for
// concurrent use; all but Add take no lock (they read an immutable
// snapshot).
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
	// all finds every form of every value (Redact); found those of the
	// values of FindMinLen bytes or more (Find, Pending).
	all, found finder
}

// finder finds a set of forms in bytes. Forms of 4 bytes or more are found
// through their first 4 bytes (byPrefix, with seen as its filter, one bit
// per hashed prefix), the shorter ones (short) one by one.
type finder struct {
	byPrefix map[uint32][]form
	seen     *[filterWords]uint64
	short    [][]byte
	// minLen is the shortest form of 4 bytes or more, and shift says how
	// far a window of minLen bytes may move on when its last two bytes hash
	// to a slot (Wu-Manber): by as much as no form's first minLen bytes
	// could hold them nearer its end, 0 where they end them, so only a
	// window that may start a form is looked at.
	minLen int
	shift  *[shiftSlots]uint8
	// maxLen is the longest form; heads holds the first 1 to 3 bytes of
	// every form (Pending; found's alone).
	maxLen int
	heads  map[string]struct{}
}

// form is one form of a value: its bytes, and the value's place in
// snapshot.order.
type form struct {
	b     []byte
	entry int
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
	value secrets.Value
	forms [][]byte
}

// NewSet returns an empty Set holding at most max values; max <= 0 means
// MaxValues.
func NewSet(max int) *Set {
	if max <= 0 {
		max = MaxValues
	}
	s := &Set{max: max}
	s.snap.Store(&snapshot{known: map[string]struct{}{}, all: newFinder(nil, nil, false), found: newFinder(nil, nil, true)})
	return s
}

// Add makes v redacted (and found) from now on. The proxy calls it on
// every read of a value: a value already held costs one map lookup and no
// allocation. An empty value is ignored.
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
	order := append(slices.Clip(old.order), entry{raw, v, forms(raw)})
	if len(order) > s.max {
		order = order[len(order)-s.max:]
		s.evicted.Add(1)
	}
	next := &snapshot{known: make(map[string]struct{}, len(order)), order: order}
	for _, e := range order {
		next.known[e.raw] = struct{}{}
	}
	next.all = newFinder(order, func(entry) bool { return true }, false)
	next.found = newFinder(order, func(e entry) bool { return len(e.raw) >= FindMinLen }, true)
	s.snap.Store(next)
}

// newFinder indexes the forms of the entries of order that keep accepts,
// with their heads when asked (Pending).
func newFinder(order []entry, keep func(entry) bool, heads bool) finder {
	f := finder{byPrefix: map[uint32][]form{}, seen: new([filterWords]uint64)}
	if heads {
		f.heads = map[string]struct{}{}
	}
	for i, e := range order {
		if !keep(e) {
			continue
		}
		for _, b := range e.forms {
			f.maxLen = max(f.maxLen, len(b))
			if len(b) < 4 {
				f.short = append(f.short, b)
				continue
			}
			if heads {
				for n := 1; n < 4; n++ {
					f.heads[string(b[:n])] = struct{}{}
				}
			}
			p := prefixOf(b)
			f.byPrefix[p] = append(f.byPrefix[p], form{b, i})
			bit := filterBit(p)
			f.seen[bit/64] |= 1 << (bit % 64)
			if f.minLen == 0 || len(b) < f.minLen {
				f.minLen = len(b)
			}
		}
	}
	f.shift = shiftTable(f.byPrefix, f.minLen)
	return f
}

// shiftTable is the shift table for windows of m bytes over forms (all of
// m bytes or more): a pair of bytes ending at index j of a form's first m
// bytes allows a shift of m-1-j at most; a pair no form's first m bytes
// hold, m-1 (capped to fit a byte: a smaller shift is always safe).
func shiftTable(forms map[uint32][]form, m int) *[shiftSlots]uint8 {
	t := new([shiftSlots]uint8)
	for i := range t {
		t[i] = uint8(min(m-1, 255))
	}
	for _, fs := range forms {
		for _, f := range fs {
			for j := 1; j < m; j++ {
				if h := pairSlot(f.b[j-1], f.b[j]); int(t[h]) > m-1-j {
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
// value with %q, logged as JSON); each without its quotes, each once. A
// value of FindMinLen bytes or more adds its requestForms.
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
	if len(raw) >= FindMinLen {
		for _, f := range requestForms(raw) {
			add(f)
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

// requestForms are the encodings a request gives a value that its log
// forms miss: percent-encoded as a query or form field (url.QueryEscape)
// and as a path segment (url.PathEscape), the upper-case hex every common
// encoder writes; and base64, standard and URL-safe, in each of the three
// alignments the value may start at in the encoded bytes (Basic
// credentials "user:value", a JSON field holding a file's content), each
// the characters that encode the value's bytes alone (base64Core).
func requestForms(raw string) [][]byte {
	out := [][]byte{[]byte(url.QueryEscape(raw)), []byte(url.PathEscape(raw))}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for k := range 3 {
			out = append(out, base64Core(enc, raw, k))
		}
	}
	return out
}

// base64Core is the characters of the base64 of k bytes, raw, and more
// bytes, that raw's bytes alone decide, whatever the other bytes are: those
// whose six bits lie inside raw's, from bit 8k to bit 8(k+len(raw)).
func base64Core(enc *base64.Encoding, raw string, k int) []byte {
	b := enc.AppendEncode(nil, append(make([]byte, k), raw...))
	return b[(4*k+2)/3 : 4*(k+len(raw))/3]
}

// Redact returns line with every held value replaced by Mark: line itself
// (no allocation) when it holds none, else a new slice.
func (s *Set) Redact(line []byte) []byte {
	f := &s.snap.Load().all
	var spans [][2]int
	for _, b := range f.short {
		spans = appendAll(spans, line, b)
	}
	if m := f.minLen; m > 0 {
		// i is the last byte of a window of m bytes that may start a form
		// (finder.shift); most windows move on by nearly m bytes at once.
		for i := m - 1; i < len(line); {
			if d := f.skip(line, i); d > 0 {
				i += d
				continue
			}
			start := i - m + 1
			i++
			for _, fm := range f.candidates(line, start) {
				if bytes.HasPrefix(line[start:], fm.b) {
					spans = append(spans, [2]int{start, start + len(fm.b)})
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

// skip is how far the window of minLen bytes ending at b[i] may move on
// (finder.shift): 0 when it may start a form.
func (f *finder) skip(b []byte, i int) int { return int(f.shift[pairSlot(b[i-1], b[i])]) }

// candidates are the forms of 4 bytes or more that b[start:] may begin
// with: those of its first 4 bytes, nil for almost every start (the
// filter).
func (f *finder) candidates(b []byte, start int) []form {
	p := prefixOf(b[start:])
	if bit := filterBit(p); f.seen[bit/64]&(1<<(bit%64)) == 0 {
		return nil
	}
	return f.byPrefix[p]
}

// first returns a form b holds, nil when it holds none. It moves two
// windows at once, over b's two halves: each window's next place waits on
// the shift its bytes read, so one window alone leaves the processor
// waiting on each step, and two independent ones nearly halve the time
// (BenchmarkFind64KiB). The first half's windows are those that start
// before the middle, their forms read past it.
func (f *finder) first(b []byte) *form {
	m := f.minLen
	if m == 0 {
		return nil
	}
	half := len(b) / 2
	i, j, endI := m-1, half+m-1, min(half+m-1, len(b))
	for i < endI && j < len(b) {
		di, dj := f.skip(b, i), f.skip(b, j)
		if di == 0 {
			if fm := f.at(b, i-m+1); fm != nil {
				return fm
			}
			di = 1
		}
		if dj == 0 {
			if fm := f.at(b, j-m+1); fm != nil {
				return fm
			}
			dj = 1
		}
		i, j = i+di, j+dj
	}
	if fm := f.lane(b, i, endI); fm != nil {
		return fm
	}
	return f.lane(b, j, len(b))
}

// lane is first for the windows that end from b[i] to before b[end].
func (f *finder) lane(b []byte, i, end int) *form {
	for i < end {
		d := f.skip(b, i)
		if d == 0 {
			if fm := f.at(b, i-f.minLen+1); fm != nil {
				return fm
			}
			d = 1
		}
		i += d
	}
	return nil
}

// at returns a form that starts at b[start], nil when none does.
func (f *finder) at(b []byte, start int) *form {
	fs := f.candidates(b, start)
	for i := range fs {
		if bytes.HasPrefix(b[start:], fs[i].b) {
			return &fs[i]
		}
	}
	return nil
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

// Find reports the first value of FindMinLen bytes or more that b holds
// in any of its forms (a request's included), and whether b holds one:
// the secrets proxy's tripwire looks for them in what a task sends. It
// allocates nothing when b holds none.
func (s *Set) Find(b []byte) (secrets.Value, bool) {
	snap := s.snap.Load()
	fm := snap.found.first(b)
	if fm == nil {
		return secrets.Value{}, false
	}
	return snap.order[fm.entry].value, true
}

// Pending is how many of b's last bytes may begin a form Find looks for:
// the longest end of b that the form would continue, shorter than the
// form. A stream passed on as it is found clean holds those bytes back
// until more come, so that a value split across reads is found whole
// before any of it goes (the text at hand being clean, no form starts
// earlier and reaches past its end).
func (s *Set) Pending(b []byte) int {
	f := &s.snap.Load().found
	for n := min(len(b), f.maxLen-1); n > 0; n-- {
		end := b[len(b)-n:]
		if n < 4 {
			if _, ok := f.heads[string(end)]; ok {
				return n
			}
			continue
		}
		for _, fm := range f.candidates(end, 0) {
			if len(fm.b) > n && bytes.HasPrefix(fm.b, end) {
				return n
			}
		}
	}
	return 0
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
