package placeholder

import (
	"bytes"
	"math/bits"
	"slices"
	"strings"

	"github.com/runfleet/runfleet/edge/secrets"
)

// Secret is one real value a run's answers are scrubbed of, and the
// placeholder that stands in its place.
type Secret struct {
	Value       secrets.Value
	Placeholder string
	// Public is how many of Value's leading bytes are no secret: the key's
	// placeholder prefix ("sk-ant-api03-") when the value begins with it,
	// which the task knows from its placeholder. A fragment is measured in
	// the bytes after it, so a task that knows the prefix cannot extend it
	// a guessed byte at a time (see FragmentBytes).
	Public int
}

// FragmentBytes is the fragment bound: any run of an answer that spells at
// least this many consecutive secret bytes of a value, in any of its forms,
// is scrubbed as the whole value is. An upstream that quotes a credential
// cut short hands the task at most FragmentBytes-1 of its bytes in a row,
// and the scrubber, which replaces a run exactly when it is a fragment,
// confirms a guessed byte only to a task that already holds
// FragmentBytes-1 secret bytes in a row. Twelve bytes of a credential's
// random part are some 70 bits, past guessing; a value with fewer secret
// bytes is scrubbed whole only.
const FragmentBytes = 12

// Runs are found by looking up gramLen bytes every gramStep bytes of an
// answer in an index of every gramLen-byte window of every spelling: a
// run of gramLen+gramStep-1 bytes always holds a looked-up window, so
// every fragment (at least FragmentBytes characters in any form) is found
// whatever its offset, at a lookup per gramStep bytes. A spelling shorter
// than that is searched for whole (Set.short).
const (
	gramLen  = 8
	gramStep = FragmentBytes - gramLen + 1
	foundRun = gramLen + gramStep - 1
)

// minSpelling: a form of a value spelt in fewer bytes than this (base64 of
// a two-byte value) is not searched for; the value as it is always is.
const minSpelling = 6

type needle struct {
	spelling
	owner      int32 // index in Set.placeholders
	secretFrom int   // the first secret byte of the value
}

type gramEntry struct {
	needle, off int32
	next        int32 // the next entry of the same gram, -1 at the end
}

// Set is every real value a run's answers are scrubbed of, in every form
// (spellings), indexed to find any fragment of any of them in one pass.
// It is immutable and safe for concurrent use; the proxy builds a new one
// when the run's values change. A nil *Set scrubs nothing.
type Set struct {
	placeholders []string
	needles      []needle
	short        []int32 // needles shorter than foundRun, searched for whole
	// slotKeys, slotFirst: an open-addressed table from a gram to its first
	// entry (+1; 0 is an empty slot). filter rejects most grams before it.
	slotKeys  []uint64
	slotFirst []int32
	slotShift uint
	entries   []gramEntry
	filter    []uint64
	filtShift uint
	longest   int  // the longest spelling
	lines     bool // no spelling holds a '\n'
}

// NewSet indexes every form of every secret with a value (a zero Value is
// skipped).
func NewSet(all []Secret) *Set {
	s := &Set{lines: true}
	grams := 0
	for _, sec := range all {
		v := sec.Value.Reveal()
		if v == "" {
			continue
		}
		owner := int32(len(s.placeholders))
		s.placeholders = append(s.placeholders, sec.Placeholder)
		public := min(max(sec.Public, 0), len(v))
		for i, sp := range spellings(v, public) {
			if i > 0 && len(sp.text) < minSpelling {
				continue
			}
			n := needle{spelling: sp, owner: owner, secretFrom: public}
			s.longest = max(s.longest, len(sp.text))
			s.lines = s.lines && bytes.IndexByte(sp.text, '\n') < 0
			if len(sp.text) < foundRun {
				s.short = append(s.short, int32(len(s.needles)))
			} else {
				grams += len(sp.text) - gramLen + 1
			}
			s.needles = append(s.needles, n)
		}
	}
	s.index(grams)
	return s
}

func (s *Set) index(grams int) {
	if grams == 0 {
		return
	}
	slotBits := max(bits.Len(uint(2*grams)), 4)
	s.slotKeys, s.slotFirst = make([]uint64, 1<<slotBits), make([]int32, 1<<slotBits)
	s.slotShift = uint(64 - slotBits)
	// About 32 filter bits a gram: one lookup in 30 or so goes on to the
	// table.
	filtBits := min(max(bits.Len(uint(32*grams)), 12), 24)
	s.filter = make([]uint64, 1<<filtBits/64)
	s.filtShift = uint(64 - filtBits)
	s.entries = make([]gramEntry, 0, grams)
	for ni := range s.needles {
		t := s.needles[ni].text
		if len(t) < foundRun {
			continue
		}
		for off := 0; off+gramLen <= len(t); off++ {
			w := load64(t[off:])
			h := w * 0x9E3779B97F4A7C15
			s.filter[h>>s.filtShift>>6] |= 1 << (h >> s.filtShift & 63)
			slot := h >> s.slotShift
			for s.slotFirst[slot] != 0 && s.slotKeys[slot] != w {
				slot = (slot + 1) & uint64(len(s.slotKeys)-1)
			}
			s.slotKeys[slot] = w
			s.entries = append(s.entries, gramEntry{needle: int32(ni), off: int32(off), next: s.slotFirst[slot] - 1})
			s.slotFirst[slot] = int32(len(s.entries))
		}
	}
}

func load64[T ~string | ~[]byte](b T) uint64 {
	win := b[:gramLen]
	return uint64(win[0]) | uint64(win[1])<<8 | uint64(win[2])<<16 | uint64(win[3])<<24 |
		uint64(win[4])<<32 | uint64(win[5])<<40 | uint64(win[6])<<48 | uint64(win[7])<<56
}

// Len is how many values s scrubs.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.placeholders)
}

// Longest is the length of the longest form of a value s scrubs: a stream
// that holds back that many bytes less one holds every occurrence that
// may still grow.
func (s *Set) Longest() int {
	if s == nil {
		return 0
	}
	return s.longest
}

// findSecrets appends to out[:0] every run of b that s scrubs: a form of a value
// whole, or a fragment of one (FragmentBytes); runs that overlap are
// merged, so the matches it returns are disjoint and by start.
func findSecrets[T ~string | ~[]byte](s *Set, b T, out []Match) []Match {
	out = out[:0]
	if s == nil || len(s.needles) == 0 {
		return out
	}
	if len(s.filter) > 0 {
		out = findRuns(s, b, out)
	}
	for _, ni := range s.short {
		n := &s.needles[ni]
		for pos := 0; ; {
			i := indexOf(b[pos:], n.text)
			if i < 0 {
				break
			}
			start := pos + i
			out = append(out, Match{Start: start, End: start + len(n.text), Owner: Owner{Placeholder: s.placeholders[n.owner]}})
			pos = start + 1
		}
	}
	return mergeRuns(out)
}

func indexOf[T ~string | ~[]byte](b T, sep []byte) int {
	switch b := any(b).(type) {
	case string:
		return strings.Index(b, string(sep))
	case []byte:
		return bytes.Index(b, sep)
	}
	return -1
}

// findRuns looks a gram up every gramStep bytes; each one found is
// extended both ways along the spelling it belongs to, and kept when the
// run is that spelling whole or spells a fragment.
func findRuns[T ~string | ~[]byte](s *Set, b T, out []Match) []Match {
	// lastNeedle, lastShift, lastEnd: the run found last, so that the
	// lookups inside it do not extend it again.
	lastNeedle, lastShift, lastEnd := int32(-1), 0, 0
	mask := uint64(len(s.slotKeys) - 1)
	for i := 0; i+gramLen <= len(b); i += gramStep {
		w := load64(b[i:])
		h := w * 0x9E3779B97F4A7C15
		if s.filter[h>>s.filtShift>>6]&(1<<(h>>s.filtShift&63)) == 0 {
			continue
		}
		slot := h >> s.slotShift
		for s.slotFirst[slot] != 0 && s.slotKeys[slot] != w {
			slot = (slot + 1) & mask
		}
		for e := s.slotFirst[slot] - 1; e >= 0; e = s.entries[e].next {
			ent := s.entries[e]
			if ent.needle == lastNeedle && i-int(ent.off) == lastShift && i+gramLen <= lastEnd {
				continue
			}
			n := &s.needles[ent.needle]
			t := n.text
			// b[l:r] is t[a:z].
			l, a := i, int(ent.off)
			for l > 0 && a > 0 && b[l-1] == t[a-1] {
				l--
				a--
			}
			r, z := i+gramLen, int(ent.off)+gramLen
			for r < len(b) && z < len(t) && b[r] == t[z] {
				r++
				z++
			}
			whole := a == 0 && z == len(t)
			if !whole && n.covered(a, z, n.secretFrom) < FragmentBytes {
				continue
			}
			lastNeedle, lastShift, lastEnd = ent.needle, l-a, r
			out = append(out, Match{Start: l, End: r, Owner: Owner{Placeholder: s.placeholders[n.owner]}})
		}
	}
	return out
}

// mergeRuns sorts ms by start and merges the runs that overlap, each merged
// run keeping the placeholder of its first run (the longest of those that
// start first).
func mergeRuns(ms []Match) []Match {
	if len(ms) < 2 {
		return ms
	}
	slices.SortFunc(ms, func(x, y Match) int {
		if x.Start != y.Start {
			return x.Start - y.Start
		}
		return y.End - x.End
	})
	k := 0
	for _, m := range ms[1:] {
		if m.Start < ms[k].End {
			ms[k].End = max(ms[k].End, m.End)
			continue
		}
		k++
		ms[k] = m
	}
	return ms[:k+1]
}
