package placeholder

import (
	"encoding/binary"
	"sort"
	"strings"
)

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
	owner       Owner
}

// Index finds the known placeholders of every task in bytes. It is
// immutable and safe for concurrent use: the proxy builds a new one when
// placeholders change, and a request keeps the one it started with. A nil
// *Index knows no placeholder.
type Index struct {
	byAnchor       map[uint64][]indexEntry
	filter         []uint64
	minLen, maxLen int
	// folded finds the same placeholders spelled in ASCII lower case, in
	// text that edge lowercases (a CONNECT's host name) or that is
	// case-insensitive (field names): see FindFolded. nil in folded itself.
	folded *Index
}

// NewIndex indexes every placeholder in all, a map from placeholder to its
// owner (whose Placeholder field it sets). Placeholders are expected to have
// a policy-shaped random part (policy.MinRandom letters and digits at
// least); one too short to anchor is not indexed.
func NewIndex(all map[string]Owner) *Index {
	exact := make(map[string]Owner, len(all))
	lower := make(map[string]Owner, len(all))
	for ph, o := range all {
		o.Placeholder = ph
		exact[ph] = o
		lower[asciiLower(ph)] = o
	}
	ix := buildIndex(exact)
	ix.folded = buildIndex(lower)
	return ix
}

func buildIndex(all map[string]Owner) *Index {
	ix := &Index{byAnchor: make(map[uint64][]indexEntry, len(all)), filter: make([]uint64, 1<<filterBits/64)}
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

// Match is one occurrence found in a text: its bytes [Start, End) and
// whose placeholder (or, from a Scrubber, whose value) it is.
type Match struct {
	Start, End int
	Owner      Owner
}

// Find reports every occurrence of a known placeholder in b, by start,
// overlapping ones included. It appends to out[:0] (out's contents are
// dropped, its room reused) and allocates nothing when out has room, so a
// caller that keeps its scratch scans text without a placeholder for free.
func (ix *Index) Find(b []byte, out []Match) []Match { return findIn(ix, b, out) }

// FindString is Find for a string: a request's header values and URL are
// scanned without a copy, and without an allocation when they hold no
// placeholder (the common case: BenchmarkFind/header-miss).
func (ix *Index) FindString(s string, out []Match) []Match { return findIn(ix, s, out) }

// findIn is Find and FindString: one loop for strings and bytes alike.
func findIn[T ~string | ~[]byte](ix *Index, b T, out []Match) []Match {
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
				out = append(out, Match{start, end, e.owner})
			}
		}
	}
	if len(out) > 1 {
		sort.SliceStable(out, func(i, j int) bool { return out[i].Start < out[j].Start })
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

// FindFolded is FindString for text in any case (a field name, a method):
// every known placeholder, whatever the case of its letters. It allocates
// nothing for text up to 256 bytes when out has room.
func (ix *Index) FindFolded(s string, out []Match) []Match {
	out = out[:0]
	if ix == nil || ix.folded == nil || len(s) < ix.minLen {
		return out
	}
	var small [256]byte
	return findIn(ix.folded, appendASCIILower(small[:0], s), out)
}

// RedactedMark stands for a placeholder in what edge records.
const RedactedMark = "[placeholder]"

// Redacted is s with every known placeholder of any task, in any case,
// replaced by RedactedMark: what the audit line and the log may hold of
// text a task chose (a CONNECT's target and method, a request's method).
func (ix *Index) Redacted(s string) string {
	return replaceMatches(s, ix.FindFolded(s, nil))
}

// RedactedExact is Redacted for text whose case matters (a URL's path):
// only placeholders spelt as minted are replaced. scratch holds the
// matches, so text without a placeholder costs no allocation.
func (ix *Index) RedactedExact(s string, scratch *[]Match) string {
	ms := findIn(ix, s, *scratch)
	*scratch = ms
	return replaceMatches(s, ms)
}

// replaceMatches replaces each match in s (by start) with RedactedMark.
func replaceMatches(s string, ms []Match) string {
	if len(ms) == 0 {
		return s
	}
	var b strings.Builder
	pos := 0
	for _, m := range ms {
		if m.Start < pos {
			continue
		}
		b.WriteString(s[pos:m.Start])
		b.WriteString(RedactedMark)
		pos = m.End
	}
	b.WriteString(s[pos:])
	return b.String()
}
