package placeholder

import (
	"bytes"
	"io"
	"net/http"
)

// Source gives a Scrubber the values to scrub: every real value the run's
// keys hold, whichever request, stream or connection carried it. Set may
// return a new *Set at any call (a value read or substituted since), and is
// called on the Scrubber's goroutine while other goroutines substitute, so
// it must be safe for that.
//
// The contract that keeps an echo from slipping through: a value is in the
// Set that Set returns before it is sent upstream.
type Source interface {
	Set() *Set
}

// Scrubber takes the real values out of what a task is sent through the
// proxy: many APIs echo a credential (an error message quoting the key, a
// debug endpoint returning the request, a 404 page quoting the path), and
// some keep it (a note, a gist, a request log) for any later request to
// fetch. Every value of the run (Source) is replaced by its placeholder in
// the answer's header fields (Header), its body (Whole, Stream), its
// WebSocket frames (Pass) and its trailers, in every form the Set knows
// (spellings: escaped, encoded, any case of a hex value), and so is any
// fragment of one (FragmentBytes).
//
// A value shorter than FragmentBytes is replaced wherever it appears whole,
// so a very short value garbles answers: values are expected to be real
// credentials.
//
// The Scrubber takes the Set again (Source) before each header, body or
// read it scrubs. A zero Scrubber is ready once Reset; it is for one
// goroutine at a time.
type Scrubber struct {
	src    Source
	set    *Set
	window int  // answerWindow of the longest spelling
	lines  bool // no spelling holds a '\n'

	ms     []Match  // Pass's scratch
	values []string // Pass's scratch
}

var _ rewriter = (*Scrubber)(nil)

// Reset readies sc for an answer to scrub of the values src holds.
func (sc *Scrubber) Reset(src Source) {
	*sc = Scrubber{src: src, ms: sc.ms[:0], values: sc.values[:0]}
	sc.refresh()
}

// Active reports whether sc has any value to scrub now.
func (sc *Scrubber) Active() bool {
	sc.refresh()
	return sc.set.Len() > 0
}

// refresh takes the run's values again when they changed.
func (sc *Scrubber) refresh() {
	s := sc.src.Set()
	if s == sc.set {
		return
	}
	sc.set = s
	sc.window = answerWindow(s.Longest())
	sc.lines = s == nil || s.lines
}

// minAnswerWindow is the least a streamed answer holds back.
const minAnswerWindow = 256

// answerWindow is how many trailing bytes a streamed answer holds back when
// the longest spelling of a value is longest bytes long: at least
// longest-1, so that an occurrence starting before the window lies whole
// in what was read, rounded up to a power of two no less than
// minAnswerWindow. A task can measure the window (how many echoed bytes
// stay behind), so it tells nothing of a spelling up to minAnswerWindow+1
// bytes long and of a longer one only the power of two its length lies
// under (the longest, \u00XX escapes, is six bytes a byte).
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

// Header replaces values in h's field names and values, in place, and
// returns how many it replaced.
func (sc *Scrubber) Header(h http.Header) int {
	sc.refresh()
	if sc.set.Len() == 0 {
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
func (sc *Scrubber) text(s string) (string, int) {
	sc.ms = findSecrets(sc.set, s, sc.ms)
	if len(sc.ms) == 0 {
		return s, 0
	}
	sc.values, _ = sc.replace(sc.ms, sc.values)
	out, n := splice(make([]byte, 0, len(s)+len(sc.ms)*64), s, sc.ms, sc.values)
	return string(out), n
}

// Whole replaces values in a body read whole and returns it and how many it
// replaced: b itself when there is none, a new slice otherwise (b is never
// written).
func (sc *Scrubber) Whole(b []byte) ([]byte, int) {
	ms := sc.find(b, nil)
	if len(ms) == 0 {
		return b, 0
	}
	values, _ := sc.replace(ms, nil)
	return splice(make([]byte, 0, len(b)+len(ms)*64), b, ms, values)
}

// Stream is src scrubbed as it is read, through the bounded window (see
// settled): a streamed answer body. The Scanner's buffers are pooled: its
// owner calls Release once done with it, and reads it on sc's goroutine.
func (sc *Scrubber) Stream(src io.Reader) *Scanner { return newPooledScanner(src, sc) }

// Pass is one step of a stream the caller frames itself (a WebSocket
// message, piece by piece): it appends to out the bytes of held that may
// reach the task now, scrubbed (all of them when final: the message ends
// with held), and returns out, how many of held's leading bytes it took
// and how many values it replaced. The rest of held waits for the next
// piece, appended to it. out must not overlap held.
func (sc *Scrubber) Pass(out, held []byte, final bool) (_ []byte, pos, n int) {
	limit := len(held)
	if !final {
		limit = sc.settled(held)
	}
	sc.ms = sc.find(held, sc.ms)
	sc.values, _ = sc.replace(sc.ms, sc.values)
	return release(out, held, limit, !final, sc.ms, sc.values)
}

// find reports every run of b to scrub, disjoint and by start.
func (sc *Scrubber) find(b []byte, out []Match) []Match {
	sc.refresh()
	return findSecrets(sc.set, b, out)
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
// the window's size (see answerWindow) and whether some value of the
// run holds a line break.
//
// Values are taken again first: bytes an upstream echoed are read only
// after the value in them was recorded, so the window covers every value b
// can hold part of.
func (sc *Scrubber) settled(b []byte) int {
	sc.refresh()
	n := max(len(b)-sc.window, 0)
	if sc.lines {
		if i := bytes.LastIndexByte(b[n:], '\n'); i >= 0 {
			n += i + 1
		}
	}
	return n
}

func (sc *Scrubber) replace(ms []Match, values []string) ([]string, error) {
	values = values[:0]
	for _, m := range ms {
		values = append(values, m.Owner.Placeholder)
	}
	return values, nil
}
