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
	seen     int  // len(st.subs) when pairs was taken
	window   int  // answerWindow of the longest value
	lines    bool // no value holds a '\n'
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
	sc.pairs, sc.lines = sc.pairs[:0], true
	longest := 0
	for _, s := range st.subs {
		if s.value.IsZero() {
			continue
		}
		sc.pairs = append(sc.pairs, scrubPair{value: s.value, placeholder: s.placeholder})
		longest = max(longest, s.value.Len())
		sc.lines = sc.lines && strings.IndexByte(s.value.Reveal(), '\n') < 0
	}
	sc.window = answerWindow(longest)
}

// minAnswerWindow is the least a streamed answer holds back.
const minAnswerWindow = 256

// answerWindow is how many trailing bytes a streamed answer holds back when
// the longest value is longest bytes long: at least longest-1, so that an
// occurrence starting before the window lies whole in what was read,
// rounded up to a power of two no less than minAnswerWindow. A task can
// measure the window (how many echoed bytes stay behind), so it tells
// nothing of a value up to minAnswerWindow+1 bytes long and of a longer
// one only the power of two its length lies under.
func answerWindow(longest int) int {
	if longest == 0 {
		return 0
	}
	w := minAnswerWindow
	for w < longest-1 {
		w *= 2
	}
	return w
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

// settled is how much of b, the answer's bytes not yet passed on, may
// reach the task now: all but the window, and, when no value holds a line
// break (none can span one then), every line b completes, so that
// server-sent events, NDJSON and other line-framed streams stay
// interactive: an event goes on as soon as its blank line comes. It
// depends on b's length and its line breaks alone, never on whether b's
// tail could begin a value: with an upstream that echoes what the task
// sends, holding back only a possible start of a value told the task, by
// when its echo came back, whether what it sent was a prefix of the value,
// and so the value a character at a time. What it does reveal:
// the window's size (see answerWindow) and whether some value in this
// request holds a line break.
//
// Values are taken again first: bytes an upstream echoed are read only
// after the value in them was recorded, so the window covers every value b
// can hold part of.
func (sc *scrubber) settled(b []byte) int {
	sc.refresh()
	n := max(len(b)-sc.window, 0)
	if sc.lines {
		if i := bytes.LastIndexByte(b[n:], '\n'); i >= 0 {
			n += i + 1
		}
	}
	return n
}

func (sc *scrubber) replace(ms []match, values []string) ([]string, error) {
	values = values[:0]
	for _, m := range ms {
		values = append(values, m.owner.placeholder)
	}
	return values, nil
}
