package proxy

import (
	"encoding/binary"
	"io"
	"sort"
	"strings"

	"github.com/runfleet/runfleet/edge/policy"
)

// owner is whose a placeholder is: a task and the key it stands for, and
// the placeholder itself (what a scrubbed answer gets back in place of the
// key's value).
type owner struct {
	task        string
	ref         policy.KeyRef
	placeholder string
}

// anchorLen is the width of the window the scanner looks up at every byte:
// eight bytes of a placeholder's random part, read as one uint64. Every
// placeholder has at least policy.MinRandom random characters, so it has
// such a window.
const anchorLen = 8

// filterBits sizes the bitset that rejects almost every window before the
// map is consulted (2^20 bits = 128 KiB, shared by all scans).
const filterBits = 20

type indexEntry struct {
	placeholder string
	anchorOff   int // where the anchor starts inside the placeholder
	owner       owner
}

// index finds the known placeholders of every task in bytes. It is
// immutable; the registry swaps in a new one when placeholders change, and a
// request keeps the one it started with.
type index struct {
	byAnchor       map[uint64][]indexEntry
	filter         []uint64
	minLen, maxLen int
	// folded finds the same placeholders spelled in ASCII lower case, in
	// text that edge lowercases (a CONNECT's host name) or that is
	// case-insensitive (field names): see redacted. nil in folded itself.
	folded *index
}

// newIndex indexes every task's placeholders, by placeholder.
func newIndex(all map[string]owner) *index {
	exact := make(map[string]owner, len(all))
	lower := make(map[string]owner, len(all))
	for ph, o := range all {
		o.placeholder = ph
		exact[ph] = o
		lower[asciiLower(ph)] = o
	}
	ix := buildIndex(exact)
	ix.folded = buildIndex(lower)
	return ix
}

func buildIndex(all map[string]owner) *index {
	ix := &index{byAnchor: make(map[uint64][]indexEntry, len(all)), filter: make([]uint64, 1<<filterBits/64)}
	for ph, o := range all {
		off := randomStart(ph)
		if len(ph)-off < anchorLen {
			continue // cannot happen for a policy-shaped placeholder
		}
		w := binary.LittleEndian.Uint64([]byte(ph[off : off+anchorLen]))
		ix.byAnchor[w] = append(ix.byAnchor[w], indexEntry{ph, off, o})
		h := filterSlot(w)
		ix.filter[h>>6] |= 1 << (h & 63)
		ix.maxLen = max(ix.maxLen, len(ph))
		if ix.minLen == 0 || len(ph) < ix.minLen {
			ix.minLen = len(ph)
		}
	}
	return ix
}

// randomStart is where a placeholder's random letters and digits begin: past
// its prefix, whose last character is not alphanumeric (or which is empty).
// For a prefix ending in a letter or digit the anchor sits on the prefix's
// tail; that is still a fixed window of this placeholder, which is all the
// scanner needs.
func randomStart(ph string) int {
	for i := len(ph) - 1; i >= 0; i-- {
		if !isAlnum(ph[i]) {
			return i + 1
		}
	}
	return 0
}

func filterSlot(w uint64) uint64 { return (w * 0x9E3779B97F4A7C15) >> (64 - filterBits) }

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// placeholderByte is a byte that may occur in a placeholder: letters, digits
// and the prefix punctuation the policy allows.
func placeholderByte(c byte) bool { return isAlnum(c) || c == '-' || c == '_' || c == '.' }

type match struct {
	start, end int
	owner      owner
}

// find reports every occurrence of a known placeholder in b, by start.
func (ix *index) find(b []byte) []match { return findIn(ix, b, nil) }

// findIn appends every occurrence of a known placeholder in b to out, by
// start. It takes a string or bytes alike and allocates nothing when out has
// room, so scanning a request's header values and URL costs no allocation
// when they hold no placeholder (the common case, issue 4's benchmark).
func findIn[T ~string | ~[]byte](ix *index, b T, out []match) []match {
	out = out[:0]
	if ix == nil || len(b) < ix.minLen || len(ix.byAnchor) == 0 {
		return out
	}
	filter := ix.filter
	for i := 0; i+anchorLen <= len(b); i++ {
		win := b[i : i+anchorLen] // one bounds check, so the eight loads fold into one
		w := uint64(win[0]) | uint64(win[1])<<8 | uint64(win[2])<<16 | uint64(win[3])<<24 |
			uint64(win[4])<<32 | uint64(win[5])<<40 | uint64(win[6])<<48 | uint64(win[7])<<56
		h := filterSlot(w)
		if filter[h>>6]&(1<<(h&63)) == 0 {
			continue
		}
		for _, e := range ix.byAnchor[w] {
			start := i - e.anchorOff
			end := start + len(e.placeholder)
			if start >= 0 && end <= len(b) && string(b[start:end]) == e.placeholder {
				out = append(out, match{start, end, e.owner})
			}
		}
	}
	if len(out) > 1 {
		sort.SliceStable(out, func(i, j int) bool { return out[i].start < out[j].start })
	}
	return out
}

// asciiLower lowercases ASCII letters only, so every byte keeps its place.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return string(appendASCIILower(make([]byte, 0, len(s)), s))
		}
	}
	return s
}

func appendASCIILower(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

// findFolded is findIn for text in any case: every known placeholder,
// whatever the case of its letters.
func findFolded(ix *index, s string, out []match) []match {
	out = out[:0]
	if ix == nil || ix.folded == nil || len(s) < ix.minLen {
		return out
	}
	var small [256]byte
	return findIn(ix.folded, appendASCIILower(small[:0], s), out)
}

// redactedMark stands for a placeholder in what edge records.
const redactedMark = "[placeholder]"

// redacted is s with every known placeholder of any task, in any case,
// replaced by redactedMark: what the audit line and the log may hold of
// text a task chose (a CONNECT's target and method, a request's method).
func redacted(ix *index, s string) string {
	return replaceMatches(s, findFolded(ix, s, nil))
}

// replaceMatches replaces each match in s (by start) with redactedMark.
func replaceMatches(s string, ms []match) string {
	if len(ms) == 0 {
		return s
	}
	var b strings.Builder
	pos := 0
	for _, m := range ms {
		if m.start < pos {
			continue
		}
		b.WriteString(s[pos:m.start])
		b.WriteString(redactedMark)
		pos = m.end
	}
	b.WriteString(s[pos:])
	return b.String()
}

// substituter decides one occurrence found at loc and returns the bytes to
// put in its place, or an error that stops the scan: the pipeline's returns
// errRefused, its refusal (blocked, withheld, over a bound, or a fault)
// kept in the request's state. It is bound to one request.
type substituter func(o owner, loc policy.Location) (string, error)

// decide asks sub about every occurrence in ms, overlapping ones included,
// before anything is replaced, so one blocked occurrence blocks the whole
// request. values receives the replacements, by match.
func decide(ms []match, loc policy.Location, sub substituter, values []string) ([]string, error) {
	values = values[:0]
	for _, m := range ms {
		v, err := sub(m.owner, loc)
		if err != nil {
			return nil, err
		}
		values = append(values, v)
	}
	return values, nil
}

// splice appends b to out with the decided occurrences replaced, skipping
// one that overlaps one already replaced; n counts the replacements.
func splice[T ~string | ~[]byte](out []byte, b T, ms []match, values []string) (_ []byte, n int) {
	pos := 0
	for i, m := range ms {
		if m.start < pos {
			continue
		}
		out = append(out, b[pos:m.start]...)
		out = append(out, values[i]...)
		pos = m.end
		n++
	}
	return append(out, b[pos:]...), n
}

// rewrite replaces every placeholder in b as decided. It returns b itself
// when nothing was found, and how many occurrences were replaced.
func (ix *index) rewrite(b []byte, loc policy.Location, sub substituter) ([]byte, int, error) {
	ms := ix.find(b)
	if len(ms) == 0 {
		return b, 0, nil
	}
	values, err := decide(ms, loc, sub, nil)
	if err != nil {
		return nil, 0, err
	}
	out, n := splice(make([]byte, 0, len(b)+64), b, ms, values)
	return out, n, nil
}

// rewriteString is rewrite for a string, with the caller's scratch for the
// matches: a string without a placeholder comes back as it is, with no
// allocation.
func (ix *index) rewriteString(s string, loc policy.Location, sub substituter, scratch *[]match) (string, int, error) {
	ms := findIn(ix, s, *scratch)
	*scratch = ms
	if len(ms) == 0 {
		return s, 0, nil
	}
	var small [4]string
	values, err := decide(ms, loc, sub, small[:0])
	if err != nil {
		return "", 0, err
	}
	size := len(s)
	for i, m := range ms {
		size += len(values[i]) - (m.end - m.start)
	}
	var b strings.Builder
	b.Grow(max(size, 0))
	pos, n := 0, 0
	for i, m := range ms {
		if m.start < pos {
			continue // overlaps one already replaced
		}
		b.WriteString(s[pos:m.start])
		b.WriteString(values[i])
		pos = m.end
		n++
	}
	b.WriteString(s[pos:])
	return b.String(), n, nil
}

// bodyChunk is how much of a body is read at a time.
const bodyChunk = 32 << 10

// rewriter is what a bodyScanner looks for in a stream and what it puts in
// its place: placeholders in a request body (placeholderRewriter), real
// values in an answer (scrubber).
type rewriter interface {
	// find appends every occurrence in b to out, by start.
	find(b []byte, out []match) []match
	// settled is how many of b's leading bytes the scanner may pass on
	// now, b being all it has read and not yet passed on: every occurrence
	// that starts before that point must lie whole in b. The scanner
	// replaces each, passing on one that reaches past the point whole, and
	// holds the rest of b back until more bytes come or the stream ends
	// (then everything goes, scanned). For an answer the point is what the
	// task observes, by when bytes reach it: it must not depend on whether
	// b partially matches a value (scrubber.settled).
	settled(b []byte) int
	// replace decides every occurrence in ms, filling values by match, or
	// returns the error that stops the stream.
	replace(ms []match, values []string) ([]string, error)
}

// placeholderRewriter finds known placeholders in a request body and
// replaces each as the request's substituter decides.
type placeholderRewriter struct {
	ix  *index
	sub substituter
}

func (r placeholderRewriter) find(b []byte, out []match) []match { return findIn(r.ix, b, out) }

// settled: all but the trailing run of bytes a placeholder may hold, up to
// the longest placeholder less one. What this reveals is the task's own:
// its placeholders are no secret to it.
func (r placeholderRewriter) settled(b []byte) int {
	hold := 0
	for hold < len(b) && hold < r.ix.maxLen-1 && placeholderByte(b[len(b)-1-hold]) {
		hold++
	}
	return len(b) - hold
}

func (r placeholderRewriter) replace(ms []match, values []string) ([]string, error) {
	return decide(ms, policy.InBody, r.sub, values)
}

// bodyScanner streams a body through a rewriter with a bounded window: it
// holds back only the trailing bytes its rewriter has not settled (for
// placeholders a run that could begin one, at most the longest less one;
// for an answer a fixed window, lines excepted: scrubber.settled), so an
// occurrence split across reads is still found, memory stays bounded and
// a stream is not delayed more than that.
type bodyScanner struct {
	src io.Reader
	rw  rewriter
	buf []byte // unscanned bytes, the held-back tail first
	out []byte // scanned bytes ready for Read, the rest of outBuf
	// outBuf is where scan writes out, reused once out is drained.
	outBuf []byte
	err    error // from src, reported once buf and out are drained
	fail   error // a decision that stops the stream
	n      int   // occurrences replaced
	read   int64 // bytes read from src

	ms     []match  // scratch for find
	values []string // scratch for replace
	// pooled holds buffers lent by copyBufferPool (release returns them).
	pooled [2]*[]byte
}

func newBodyScanner(src io.Reader, ix *index, sub substituter) *bodyScanner {
	return &bodyScanner{src: src, rw: placeholderRewriter{ix: ix, sub: sub}}
}

// newPooledScanner is a bodyScanner whose window and output lie in buffers
// from copyBufferPool; its owner calls release once done reading it.
func newPooledScanner(src io.Reader, rw rewriter) *bodyScanner {
	s := &bodyScanner{src: src, rw: rw}
	s.pooled[0], s.pooled[1] = copyBufferPool.Get().(*[]byte), copyBufferPool.Get().(*[]byte)
	s.buf, s.outBuf = (*s.pooled[0])[:0], (*s.pooled[1])[:0]
	return s
}

// release returns pooled buffers; the scanner is not read again.
func (s *bodyScanner) release() {
	for i, b := range s.pooled {
		if b != nil {
			copyBufferPool.Put(b)
			s.pooled[i] = nil
		}
	}
	s.buf, s.out, s.outBuf = nil, nil, nil
}

func (s *bodyScanner) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.fail != nil {
			return 0, s.fail
		}
		if s.err != nil && len(s.buf) == 0 {
			return 0, s.err
		}
		if s.err == nil {
			s.fill()
		}
		s.scan()
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *bodyScanner) fill() {
	if cap(s.buf)-len(s.buf) < bodyChunk/2 {
		grown := make([]byte, len(s.buf), len(s.buf)+bodyChunk)
		copy(grown, s.buf)
		s.buf = grown
	}
	n, err := s.src.Read(s.buf[len(s.buf):cap(s.buf)])
	s.buf = s.buf[:len(s.buf)+n]
	s.read += int64(n)
	if err != nil {
		s.err = err
	}
}

// scan moves every byte of buf that cannot be part of an unfinished
// occurrence to out, replaced as decided.
func (s *bodyScanner) scan() {
	limit := len(s.buf)
	if s.err == nil {
		limit = s.rw.settled(s.buf)
	}
	ms := s.rw.find(s.buf, s.ms)
	s.ms = ms
	// Decide every complete occurrence, even one in the held-back tail: a
	// block must stop the body before any of it goes on.
	values, err := s.rw.replace(ms, s.values)
	if err != nil {
		s.fail = err
		s.out = nil
		return
	}
	s.values = values
	out, pos, n := release(s.outBuf[:0], s.buf, limit, ms, values)
	s.n += n
	s.out, s.outBuf = out, out
	rest := copy(s.buf, s.buf[pos:])
	s.buf = s.buf[:rest]
}

// release appends to out the bytes of buf before limit with the decided
// occurrences that start there replaced (values by match; one reaching past
// limit goes whole, one overlapping a replaced one is skipped), and returns
// where in buf it stopped and how many it replaced. The rest of buf, from
// pos, waits for more bytes.
func release(out, buf []byte, limit int, ms []match, values []string) (_ []byte, pos, n int) {
	for i, m := range ms {
		if m.start >= limit {
			break // decided; replaced when its turn comes
		}
		if m.start < pos {
			continue
		}
		out = append(out, buf[pos:m.start]...)
		out = append(out, values[i]...)
		pos = m.end
		n++
	}
	if pos < limit {
		out = append(out, buf[pos:limit]...)
		pos = limit
	}
	return out, pos, n
}
