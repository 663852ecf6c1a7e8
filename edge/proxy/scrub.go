package proxy

import (
	"bytes"
	"net/http"
	"sort"
	"strings"

	"github.com/runfleet/runfleet/edge/secrets"
)

// scrubber takes the real values out of what an upstream answers to a
// request they were put into: many APIs echo a credential (an error message
// quoting the key, a debug endpoint returning the request), and the task
// must never see one. Each value substituted into this request is replaced
// by its placeholder wherever its bytes appear in the answer's header
// fields, its body (streamed through a bodyScanner) and its trailers.
//
// Only the value's literal bytes are found: an answer that encodes it
// (base64, percent- or JSON-escaping, a compressed body) is not recognised;
// forward asks for an uncoded body and refuses a coded one. A value is
// replaced wherever its bytes appear, so a very short value garbles
// answers: values are expected to be real credentials.
//
// A request's substitutions can grow while its answer streams (an upstream
// answering before a streamed request body has been read whole), so the
// scrubber takes the request's values again whenever their number
// changed: a value is recorded before it is sent, so it is known before an
// upstream can echo it.
type scrubber struct {
	st       *requestState
	pairs    []scrubPair
	pairsBuf [2]scrubPair
	seen     int // len(st.subs) when pairs was taken
	maxLen   int // the longest value
}

// scrubPair is one value and the placeholder the task sees for it.
type scrubPair struct {
	value       secrets.Value
	placeholder string
	valueBytes  []byte // value, revealed when a body is first searched
}

var _ rewriter = (*scrubber)(nil)

// reset readies sc for st's answer.
func (sc *scrubber) reset(st *requestState) {
	*sc = scrubber{st: st}
	sc.pairs = sc.pairsBuf[:0]
	sc.refresh()
}

// refresh takes the request's values again when more were substituted.
func (sc *scrubber) refresh() {
	st := sc.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.subs) == sc.seen {
		return
	}
	sc.seen = len(st.subs)
	sc.pairs, sc.maxLen = sc.pairs[:0], 0
	for _, s := range st.subs {
		if s.value.IsZero() {
			continue
		}
		sc.pairs = append(sc.pairs, scrubPair{value: s.value, placeholder: s.placeholder})
		sc.maxLen = max(sc.maxLen, s.value.Len())
	}
}

// header replaces values in h's field names and values, and returns how
// many it replaced.
func (sc *scrubber) header(h http.Header) int {
	sc.refresh()
	if len(sc.pairs) == 0 {
		return 0
	}
	n := 0
	for name, vs := range h {
		for i, v := range vs {
			if out, k := sc.text(v); k > 0 {
				vs[i] = out
				n += k
			}
		}
		if out, k := sc.text(name); k > 0 {
			delete(h, name)
			h[out] = vs
			n += k
		}
	}
	return n
}

// text replaces values in s; s itself when there is none.
func (sc *scrubber) text(s string) (string, int) {
	n := 0
	for _, p := range sc.pairs {
		if k := strings.Count(s, p.value.Reveal()); k > 0 {
			s = strings.ReplaceAll(s, p.value.Reveal(), p.placeholder)
			n += k
		}
	}
	return s, n
}

// whole replaces values in a body read whole; b itself when there is none.
func (sc *scrubber) whole(b []byte) ([]byte, int) {
	sc.refresh()
	ms := sc.find(b, nil)
	if len(ms) == 0 {
		return b, 0
	}
	values, _ := sc.replace(ms, nil)
	return splice(make([]byte, 0, len(b)+len(ms)*64), b, ms, values)
}

// find reports every occurrence of a value in b, by start; of two that
// start together the longer comes first (splice keeps it).
func (sc *scrubber) find(b []byte, out []match) []match {
	sc.refresh()
	out = out[:0]
	for k := range sc.pairs {
		p := &sc.pairs[k]
		if p.valueBytes == nil {
			p.valueBytes = []byte(p.value.Reveal())
		}
		for pos := 0; ; {
			i := bytes.Index(b[pos:], p.valueBytes)
			if i < 0 {
				break
			}
			start := pos + i
			out = append(out, match{start: start, end: start + len(p.valueBytes), owner: owner{placeholder: p.placeholder}})
			pos = start + len(p.valueBytes)
		}
	}
	if len(sc.pairs) > 1 && len(out) > 1 {
		sort.SliceStable(out, func(i, j int) bool {
			if out[i].start != out[j].start {
				return out[i].start < out[j].start
			}
			return out[i].end > out[j].end
		})
	}
	return out
}

// held is the longest tail of b that begins some value (at most the
// value's length less one): what more bytes could complete.
func (sc *scrubber) held(b []byte) int {
	hold := 0
	for _, p := range sc.pairs {
		v := p.value.Reveal()
		first := v[0]
		for i := max(len(b)-len(v)+1, 0); i < len(b)-hold; i++ {
			if b[i] == first && v[:len(b)-i] == string(b[i:]) {
				hold = len(b) - i
				break
			}
		}
	}
	return hold
}

func (sc *scrubber) replace(ms []match, values []string) ([]string, error) {
	values = values[:0]
	for _, m := range ms {
		values = append(values, m.owner.placeholder)
	}
	return values, nil
}
